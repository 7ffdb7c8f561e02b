//! The steps' counters: what became of each step, and of each step found
//! in doubt.

use idem_core::key::Scope;

use super::operation::Current;

/// The name of the steps counter (`decision`: `ran`, `replayed`,
/// `failed_cleanly` (its call failed with no effect, and its start was
/// taken back)).
pub const STEPS: &str = "idem_steps_total";
/// The name of the in-doubt steps counter (`resolution`: `rerun`,
/// `reconciled`, `reconciled_none` (reconcile found nothing and the step
/// ran), `in_flight` (an earlier attempt's call may still land: the
/// attempt was told to come back), `refused`, `allowed` (an operator allowed a rerun),
/// `operator_completed`, `operator_rerun`).
pub const STEPS_IN_DOUBT: &str = "idem_steps_in_doubt_total";

pub(super) fn counted(name: &'static str, decision: &'static str, current: &Current) {
    tracing::debug!(step = name, seq = current.seq, decision, "step");
    metrics::counter!(
        STEPS,
        "operation" => current.claim.scope.metric_label().to_owned(),
        "step" => name,
        "decision" => decision
    )
    .increment(1);
}

/// Counts a step in doubt of `scope`'s operation, by `resolution`.
pub(super) fn in_doubt(
    scope: &Scope,
    step: impl Into<metrics::SharedString>,
    resolution: &'static str,
) {
    metrics::counter!(
        STEPS_IN_DOUBT,
        "operation" => scope.metric_label().to_owned(),
        "step" => step.into(),
        "resolution" => resolution
    )
    .increment(1);
}
