//! Everything before a step's own call: its place, its journal entry, and
//! what the journal's answer decides (replay, run, run again, reconcile,
//! refuse, or wait for an earlier call to settle); the entry is written
//! through the store, or on the caller's transaction ([`StartOn`]).

use std::sync::Arc;
use std::time::Duration;

use serde::de::DeserializeOwned;
use serde::Serialize;

use crate::store::{Store, TransactionalStore};
use idem_core::error::Error;
use idem_core::journal::{StepBegin, StepRequest, StepRun};

use super::builder::{InDoubt, Reconcile, Step};
use super::counters::{counted, in_doubt};
use super::journaling::{begin, journal_output, unjournaled};
use super::operation::{current, Current};

impl<R> Step<R> {
    /// Everything before the step's own call: its place, its journal
    /// entry, and what to do when it is in doubt.
    pub(super) async fn start<T, E, J: StartOn>(
        self,
        beside: bool,
        on: &mut J,
    ) -> Result<Started<T>, E>
    where
        T: Serialize + DeserializeOwned,
        E: From<Error>,
        R: Reconcile<T, E>,
    {
        let Step {
            name,
            in_doubt: policy,
            reconcile,
            settle,
        } = self;
        let current = current(name)?;
        let Some(journal) = current.journal.clone() else {
            // Transactional mode: nothing outlives the caller's
            // transaction to journal in.
            if policy != InDoubt::Rerun {
                return Err(Error::Config(format!(
                    "step {name:?} asks to {} when in doubt, which needs a journal that outlives \
                     the attempt: run the operation in record or entity mode (not transactional), \
                     on a store that has a background handle (`Detach`)",
                    if policy == InDoubt::Refuse {
                        "refuse"
                    } else {
                        "reconcile"
                    }
                ))
                .into());
            }
            return Ok(Started::Run(Box::new(current), false));
        };
        if beside
            && policy == InDoubt::Rerun
            && journal.journal().is_some_and(|j| j.writes_beside())
            && unjournaled(&*journal, &current).await?
        {
            // Met for the first time, and rerun if in doubt: its entry is
            // written while its call runs, off the call's path.
            return Ok(Started::Beside {
                current: Box::new(current),
                journal,
            });
        }
        let mut request = current.request(name);
        request.adopt = policy == InDoubt::Rerun;
        request.settle = match policy {
            InDoubt::Rerun => settle.unwrap_or(Duration::ZERO),
            InDoubt::Reconcile => settle.unwrap_or(current.claim.lease),
            InDoubt::Refuse => Duration::ZERO,
        };
        let run = match on.begin(&*journal, &request).await? {
            StepBegin::Run(run) => run,
            StepBegin::Replay(bytes) => {
                counted(name, "replayed", &current);
                return Ok(Started::Done(decode(&bytes)?));
            }
            StepBegin::KeyReused => return Err(Error::KeyReused.into()),
            StepBegin::Mismatch { journaled } => {
                return Err(Error::StepMismatch {
                    seq: current.seq,
                    journaled,
                    called: name.to_owned(),
                }
                .into())
            }
            StepBegin::InFlight { retry_after } => {
                tracing::info!(
                    step = name,
                    seq = current.seq,
                    step_key = %current.key,
                    ?retry_after,
                    "step in doubt, and an earlier attempt's call may still land: try again later"
                );
                in_doubt(&current.claim.scope, name, "in_flight");
                return Err(Error::InProgress { retry_after }.into());
            }
            StepBegin::InDoubt { since } if policy == InDoubt::Refuse => {
                tracing::error!(
                    step = name,
                    seq = current.seq,
                    step_key = %current.key,
                    started_at = since,
                    "step in doubt: an earlier attempt started it and journaled no outcome; \
                     refusing until an operator resolves it"
                );
                in_doubt(&current.claim.scope, name, "refused");
                return Err(Error::OutcomeUnknown {
                    step: name.to_owned(),
                    seq: current.seq,
                    step_key: current.key.0,
                }
                .into());
            }
            StepBegin::InDoubt { .. } => {
                tracing::warn!(
                    step = name,
                    seq = current.seq,
                    step_key = %current.key,
                    "step in doubt: asking the downstream what happened"
                );
                if let Some(output) = reconcile.ask(current.key.clone()).await? {
                    let bytes = idem_core::canonical::to_vec(&output).map_err(Error::from)?;
                    on.complete(&*journal, &current, &request, &bytes).await?;
                    in_doubt(&current.claim.scope, name, "reconciled");
                    return Ok(Started::Done(output));
                }
                request.adopt = true;
                match on.begin(&*journal, &request).await? {
                    StepBegin::Run(_) => {
                        in_doubt(&current.claim.scope, name, "reconciled_none");
                        StepRun::Fresh
                    }
                    StepBegin::Replay(bytes) => return Ok(Started::Done(decode(&bytes)?)),
                    other => return Err(changed(name, &other).into()),
                }
            }
        };
        // Whether nothing of an earlier attempt's call can be pending under
        // the step's key: a clean failure of this attempt's call may then
        // take the start back.
        let fresh = matches!(run, StepRun::Fresh | StepRun::Allowed);
        match run {
            StepRun::Adopted => {
                tracing::warn!(
                    step = name,
                    seq = current.seq,
                    step_key = %current.key,
                    "step in doubt: running it again with the same key"
                );
                in_doubt(&current.claim.scope, name, "rerun");
            }
            StepRun::Allowed => in_doubt(&current.claim.scope, name, "allowed"),
            StepRun::Fresh | StepRun::Again => {}
        }
        Ok(Started::Run(Box::new(current), fresh))
    }
}

/// Where the journal writes before a step's own call go.
pub(super) trait StartOn {
    /// Begins the step.
    async fn begin(
        &mut self,
        journal: &dyn Store,
        request: &StepRequest<'_>,
    ) -> Result<StepBegin, Error>;
    /// Journals the output a reconciliation found.
    async fn complete(
        &mut self,
        journal: &dyn Store,
        current: &Current,
        request: &StepRequest<'_>,
        bytes: &[u8],
    ) -> Result<(), Error>;
}

/// Through the store's own connections.
pub(super) struct ThroughStore;

impl StartOn for ThroughStore {
    async fn begin(
        &mut self,
        journal: &dyn Store,
        request: &StepRequest<'_>,
    ) -> Result<StepBegin, Error> {
        begin(journal, request).await
    }
    async fn complete(
        &mut self,
        journal: &dyn Store,
        current: &Current,
        request: &StepRequest<'_>,
        bytes: &[u8],
    ) -> Result<(), Error> {
        journal_output(journal, current, request, bytes).await
    }
}

/// On the caller's connection where the store says so
/// ([`TransactionalStore::journals_on`]); through the store otherwise.
pub(super) struct OnConnection<'a, S: ?Sized, C: ?Sized> {
    pub(super) store: &'a S,
    pub(super) conn: &'a mut C,
    /// Whether the journal writes go on the connection.
    pub(super) on_conn: bool,
}

impl<S, C> StartOn for OnConnection<'_, S, C>
where
    S: TransactionalStore<C> + ?Sized,
    C: Send + ?Sized,
{
    async fn begin(
        &mut self,
        journal: &dyn Store,
        request: &StepRequest<'_>,
    ) -> Result<StepBegin, Error> {
        if self.on_conn {
            // No retry here: a failed statement may have aborted the
            // caller's transaction, which is the caller's to roll back.
            return self.store.begin_step_on(self.conn, request).await;
        }
        begin(journal, request).await
    }
    async fn complete(
        &mut self,
        journal: &dyn Store,
        current: &Current,
        request: &StepRequest<'_>,
        bytes: &[u8],
    ) -> Result<(), Error> {
        if self.on_conn {
            return self.store.complete_step_on(self.conn, request, bytes).await;
        }
        journal_output(journal, current, request, bytes).await
    }
}

/// The journal answered a step otherwise than its own earlier answer
/// allows: another writer changed it meanwhile (an operator's resolution).
pub(super) fn changed(name: &str, answer: &StepBegin) -> Error {
    Error::store(format!(
        "step {name:?}: its journal entry changed while the step ran ({answer:?})"
    ))
}

/// Where a step stands before its own call.
pub(super) enum Started<T> {
    /// Its output is known (journaled, or reconciled).
    Done(T),
    /// It has no entry, and is rerun when in doubt: run it while its
    /// entry is started, then journal its output.
    Beside {
        current: Box<Current>,
        journal: Arc<dyn Store>,
    },
    /// Run it, then journal its output (when there is a journal); `true`
    /// when no earlier attempt's call may be pending under its key (it
    /// was never started, or was settled as not having happened), so
    /// that a clean failure takes its start back.
    Run(Box<Current>, bool),
}

/// A journaled output.
fn decode<T: DeserializeOwned>(bytes: &[u8]) -> Result<T, Error> {
    Ok(serde_json::from_slice(bytes)?)
}
