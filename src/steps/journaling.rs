//! The journal writes around a step's call: beginning its entry and
//! journaling its output (sent again when their answer was lost), on a
//! task of their own for a step that is rerun when in doubt, awaited
//! before the operation ends; and taking back the start of a step whose
//! call failed cleanly.

use std::future::Future;
use std::sync::Arc;
use std::time::Duration;

use crate::store::{journal_of, Store};
use idem_core::error::Error;
use idem_core::journal::{StepBegin, StepRequest};

use super::counters::counted;
use super::operation::{flush_journal, lock, Current, Operation, OPERATION};

/// How often a journal write whose answer was lost is sent again.
const JOURNAL_ATTEMPTS: u32 = 3;

// Here rather than beside the state: running a body under an operation
// ends with the writes below.
impl Operation {
    /// Runs `body` under this operation: its steps are this operation's.
    /// The body's result is handed back once its steps' journal writes
    /// have landed (or given up), so the outcome is stored, or the claim
    /// released for a retry, with the journal complete.
    pub(crate) fn scope<F: Future>(self, body: F) -> impl Future<Output = F::Output> {
        OPERATION.scope(self, flushed(body))
    }
}

/// `body`, then the journal writes its steps left on their way.
async fn flushed<F: Future>(body: F) -> F::Output {
    let output = body.await;
    flush_journal().await;
    take_back().await;
    output
}

/// Begins a step, sending the request again when its answer was lost
/// (the store recognizes the attempt's own entry).
pub(super) async fn begin(
    journal: &dyn Store,
    request: &StepRequest<'_>,
) -> Result<StepBegin, Error> {
    let mut attempt = 1;
    loop {
        match journal_of(journal)?.begin_step(request).await {
            Err(Error::Store(err)) if attempt < JOURNAL_ATTEMPTS => {
                tracing::warn!(error = %err, step = request.name, "beginning a step failed; trying again");
                tokio::time::sleep(Duration::from_millis(10 * u64::from(attempt))).await;
                attempt += 1;
            }
            other => return other,
        }
    }
}

/// Journals a step's output. The step ran, so its effect happened: when
/// the store keeps failing, the output is returned all the same, and the
/// step will be in doubt at the next attempt; an attempt that lost its
/// claim is told so ([`Error::LeaseLost`]).
pub(super) async fn journal_output(
    journal: &dyn Store,
    current: &Current,
    request: &StepRequest<'_>,
    bytes: &[u8],
) -> Result<(), Error> {
    let mut attempt = 1;
    loop {
        match journal_of(journal)?.complete_step(request, bytes).await {
            Ok(()) => return Ok(()),
            Err(Error::Store(err)) if attempt < JOURNAL_ATTEMPTS => {
                tracing::warn!(error = %err, step = request.name, "journaling a step failed; trying again");
                tokio::time::sleep(Duration::from_millis(10 * u64::from(attempt))).await;
                attempt += 1;
            }
            Err(Error::Store(err)) => {
                tracing::error!(
                    error = %err,
                    step = request.name,
                    step_key = %current.key,
                    "journaling a step failed: its output is used, and the step will be in doubt \
                     at the next attempt"
                );
                return Ok(());
            }
            Err(err) => return Err(err),
        }
    }
}

/// Journals a step's output on a task of its own, awaited before the
/// operation ends ([`flushed`]). Should the process die first, the step is
/// in doubt for the next attempt and runs again with the same key, as a
/// step that is rerun when in doubt may.
pub(super) async fn journal_behind(
    journal: Arc<dyn Store>,
    current: Box<Current>,
    name: &'static str,
    bytes: Vec<u8>,
) {
    behind(async move {
        let request = current.request(name);
        if let Err(err) = journal_output(&*journal, &current, &request, &bytes).await {
            tracing::warn!(
                error = %err,
                step = name,
                step_key = %current.key,
                "journaling a step's output failed: the step will be in doubt at the next attempt"
            );
        }
    })
    .await;
}

/// Marks the start of a step whose call failed cleanly to be taken back
/// when the body ends ([`take_back`]), when no earlier attempt's call may
/// be pending under its key (`fresh`). Otherwise the step stays in doubt
/// for the next attempt, which is safe.
pub(super) fn take_back_later(current: &Current, name: &'static str, fresh: bool) {
    if !fresh {
        tracing::debug!(
            step = name,
            step_key = %current.key,
            "the step's call failed cleanly, but an earlier attempt's call under its key \
             may have landed: the step stays in doubt"
        );
        return;
    }
    let _ = OPERATION.try_with(|operation| {
        lock(&operation.0.progress).take_back = Some((current.clone(), name));
    });
}

/// Takes back the start of the body's last step, when its call failed
/// cleanly and no step began after it: the next attempt runs it as never
/// started. Not sooner: a body that goes on past the failure (to a
/// fallback) may have effects in later steps, and a next attempt that ran
/// the failed step afresh could take another path than this one. Should
/// the store fail, or the body be dropped first, the step stays in doubt.
async fn take_back() {
    let Ok(Some((current, name))) =
        OPERATION.try_with(|operation| lock(&operation.0.progress).take_back.take())
    else {
        return;
    };
    let Some(store) = current.journal.clone() else {
        return;
    };
    let Some(journal) = store.journal() else {
        return;
    };
    match journal.undo_step(&current.request(name)).await {
        Ok(true) => counted(name, "failed_cleanly", &current),
        Ok(false) => tracing::debug!(
            step = name,
            step_key = %current.key,
            "a cleanly failed step's start was not taken back (the store keeps it, or a \
             later attempt took it over): it stays in doubt"
        ),
        Err(err) => tracing::info!(
            error = %err,
            step = name,
            step_key = %current.key,
            "taking back a cleanly failed step's start failed: it will be in doubt at the next \
             attempt"
        ),
    }
}

/// Runs a journal write on a task of its own, which the operation awaits
/// before it ends and a dropped caller's claim waits for before it is
/// handed back; outside an operation, here.
pub(super) async fn behind(write: impl Future<Output = ()> + Send + 'static) {
    match OPERATION.try_with(Operation::clone) {
        Ok(operation) => operation.push(tokio::spawn(write)),
        Err(_) => write.await,
    }
}

/// Whether the step's place held no journal entry when this attempt first
/// looked (the journal is read once per attempt, at its first step).
pub(super) async fn unjournaled(journal: &dyn Store, current: &Current) -> Result<bool, Error> {
    let seq = current.seq;
    let known = OPERATION
        .try_with(|operation| {
            let progress = lock(&operation.0.progress);
            progress.journaled.as_ref().map(|seqs| !seqs.contains(&seq))
        })
        .ok()
        .flatten();
    if let Some(absent) = known {
        return Ok(absent);
    }
    let entries = journal_of(journal)?
        .steps(&current.claim.scope, &current.claim.key)
        .await?;
    let seqs: Vec<u32> = entries.iter().map(|entry| entry.seq).collect();
    let absent = !seqs.contains(&seq);
    let _ = OPERATION.try_with(|operation| {
        lock(&operation.0.progress).journaled.get_or_insert(seqs);
    });
    Ok(absent)
}
