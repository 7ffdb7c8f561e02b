//! An operator's settlement of a step in doubt: with the output its
//! effect had, or allowing a rerun.

use serde::Serialize;

use crate::store::{journal_of, Store};
use idem_core::error::Error;
use idem_core::journal::{StepAt, StepResolution};
use idem_core::key::{Key, Scope};

use super::counters::in_doubt;

/// Settles step `seq` (named `name`) of the operation `(scope, key)`,
/// started and without an outcome: with the `output` its effect had
/// (replayed by the next attempt), or `None` to let the next attempt run
/// it again with the same key. Returns whether there was such a step;
/// [`Journal::steps`](crate::store::Journal::steps) lists an operation's journal.
///
/// Only a step in doubt is settled: one whose starting attempt no longer
/// holds the operation (the attempt is gone, its lease lapsed, or another
/// took over). While it holds it, the step is running, and this returns
/// `false`; so a resolution sent again, or a second operator's, never
/// lands on the step a later attempt is running after the first one.
pub async fn resolve<S, T>(
    store: &S,
    scope: &Scope,
    key: &Key,
    seq: u32,
    name: &str,
    output: Option<&T>,
) -> Result<bool, Error>
where
    S: Store + ?Sized,
    T: Serialize,
{
    let (resolution, label) = match output {
        Some(output) => (
            StepResolution::Completed(idem_core::canonical::to_vec(output)?),
            "operator_completed",
        ),
        None => (StepResolution::Rerun, "operator_rerun"),
    };
    let resolved = journal_of(store)?
        .resolve_step(
            &StepAt {
                scope,
                key,
                seq,
                name,
            },
            &resolution,
        )
        .await?;
    if resolved {
        tracing::info!(%scope, %key, seq, step = name, resolution = label, "step resolved by an operator");
        in_doubt(scope, name.to_owned(), label);
    }
    Ok(resolved)
}
