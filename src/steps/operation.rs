//! The operation a body runs under, as its steps see it: a task-local
//! handle on its state (its claim, where it journals, and where this
//! attempt is among its steps), the step being run (`Current`), and the
//! journal writes still on their way.

use std::sync::{Arc, Mutex};
use std::time::Duration;

use crate::store::Store;
use idem_core::error::Error;
use idem_core::fingerprint::Fingerprint;
use idem_core::journal::StepRequest;
use idem_core::key::Scope;
use idem_core::record::Claim;

use super::step_key::{check_name, StepKey};

tokio::task_local! {
    pub(super) static OPERATION: Operation;
}

/// What an operation's durable steps derive their keys from, and how
/// their journal entries are checked and kept. The journal itself is the
/// claim's: every entry is written, read and kept under the claim's scope
/// and key (see `Operation::new`), the one place that chooses it.
#[derive(Clone, Debug)]
pub(crate) struct StepsAs {
    /// Derives the steps' keys (entity mode: the operation's, not its
    /// per-table claim's).
    pub(crate) scope: Scope,
    /// The payload's: a journal of another payload is refused.
    pub(crate) fingerprint: Fingerprint,
    /// How long journal entries are kept after their last write.
    pub(crate) ttl: Duration,
}

/// The operation a body runs under, as its steps see it: one handle on
/// its state, so that the task-local moves a pointer, not the state, in
/// and out each time the body is polled: every poll of every body pays
/// for that move, whether the body takes a step or not.
/// Cloning shares it: the engine keeps a clone to wait for the journal
/// writes before a dropped caller's claim is handed back.
#[derive(Clone)]
pub(crate) struct Operation(pub(super) Arc<State>);

pub(super) struct State {
    /// Where steps are journaled; `None` in transactional mode.
    journal: Option<Arc<dyn Store>>,
    /// The store keeps a journal, but offers no handle to write it from
    /// ([`Detach`](crate::store::Detach)): steps are refused rather than
    /// run unjournaled, which would run them again at a retry.
    unreachable_journal: bool,
    /// The claim that fences the journal.
    pub(super) claim: Claim,
    /// The operation's scope (for the keys), payload and journal ttl.
    pub(super) steps: StepsAs,
    /// Where this attempt is among its steps. Only the operation's own
    /// task takes it, between awaits.
    pub(super) progress: Mutex<Progress>,
    /// Journal writes still on their way, awaited before the body's
    /// result is handed to the engine (`flushed`), and before a dropped
    /// caller's claim is handed back.
    pending: Mutex<Vec<tokio::task::JoinHandle<()>>>,
    /// The outbox messages of this attempt: (entity mode) those held
    /// until the entity's transaction writes them.
    #[cfg(feature = "_sql")]
    pub(super) messages: Mutex<Messages>,
}

/// An attempt's outbox messages (see [`crate::outbox`]).
#[cfg(feature = "_sql")]
#[derive(Default)]
pub(super) struct Messages {
    /// Entity mode: the messages to write with the entity, in order;
    /// `None` in the other modes, where a message is written on the
    /// body's own transaction.
    pub(super) held: Option<Vec<Box<dyn std::any::Any + Send + Sync>>>,
}

#[derive(Default)]
pub(super) struct Progress {
    /// The next step's place.
    next: u32,
    /// How many steps of each name were called so far.
    names: Vec<(&'static str, u32)>,
    /// The places that held a journal entry when this attempt first
    /// looked (`None`: not looked yet). Only this attempt adds entries
    /// while it holds the claim, so a place absent then is absent until
    /// this attempt writes it.
    pub(super) journaled: Option<Vec<u32>>,
    /// The last step, if its call failed cleanly and this attempt began
    /// it afresh: its start is taken back when the body ends, unless
    /// another step begins first (`take_back_later`).
    pub(super) take_back: Option<(Current, &'static str)>,
}

/// Locks `mutex`, whose holders only read or assign plain values: a panic
/// while it was held left nothing half-written.
pub(super) fn lock<T>(mutex: &Mutex<T>) -> std::sync::MutexGuard<'_, T> {
    mutex.lock().unwrap_or_else(|e| e.into_inner())
}

impl Operation {
    /// The operation of `claim`, journaling in `journal` (`None`: steps
    /// run with their keys, unjournaled).
    pub(crate) fn new(journal: Option<Arc<dyn Store>>, claim: Claim, steps: StepsAs) -> Self {
        Self::with(journal, false, claim, steps)
    }

    /// The operation of `claim` on `store`, journaling through the store's
    /// background handle ([`Detach`](crate::store::Detach)). A store that
    /// keeps a journal and offers no such handle (a wrapper that forgot
    /// to) cannot journal: its steps fail with [`Error::Config`].
    pub(crate) fn on<S: Store + ?Sized>(store: &S, claim: Claim, steps: StepsAs) -> Self {
        let journal = store.capabilities().detached();
        let unreachable_journal = journal.is_none() && store.journal().is_some();
        Self::with(journal, unreachable_journal, claim, steps)
    }

    fn with(
        journal: Option<Arc<dyn Store>>,
        unreachable_journal: bool,
        claim: Claim,
        steps: StepsAs,
    ) -> Self {
        Operation(Arc::new(State {
            journal,
            unreachable_journal,
            claim,
            steps,
            progress: Mutex::default(),
            pending: Mutex::default(),
            #[cfg(feature = "_sql")]
            messages: Mutex::default(),
        }))
    }

    /// The next step, named `name`.
    fn next_step(&self, name: &'static str) -> Result<Current, Error> {
        if self.0.unreachable_journal {
            return Err(Error::Config(format!(
                "step {name:?} cannot be journaled: the store keeps a journal but offers no \
                 background handle to write it from; a store (or a wrapper around one) that \
                 keeps a journal offers `Capabilities::with_detach`"
            )));
        }
        let state = &*self.0;
        let (seq, occurrence) = {
            let mut progress = lock(&state.progress);
            if let Some((earlier, earlier_name)) = progress.take_back.take() {
                // The body went on past a cleanly failed step: a later
                // attempt that ran that step afresh could take another
                // path than this one took, past steps this one may have
                // had effects in. Its start stays: in doubt.
                tracing::debug!(
                    step = earlier_name,
                    step_key = %earlier.key,
                    "a step failed cleanly and the body went on: it stays in doubt"
                );
            }
            let seq = progress.next;
            progress.next += 1;
            let occurrence = match progress.names.iter_mut().find(|(n, _)| *n == name) {
                Some((_, count)) => {
                    *count += 1;
                    *count - 1
                }
                None => {
                    progress.names.push((name, 1));
                    0
                }
            };
            (seq, occurrence)
        };
        Ok(Current {
            journal: state.journal.clone(),
            claim: state.claim.clone(),
            fingerprint: state.steps.fingerprint,
            ttl: state.steps.ttl,
            seq,
            key: StepKey::derive(&state.steps.scope, &state.claim.key, name, occurrence),
        })
    }

    pub(super) fn push(&self, write: tokio::task::JoinHandle<()>) {
        lock(&self.0.pending).push(write);
    }

    /// Whether journal writes may still be on their way.
    fn writing(&self) -> bool {
        !lock(&self.0.pending).is_empty()
    }

    /// Waits for every journal write on its way.
    ///
    /// Dropped while it waits (the body's own flush, whose caller went
    /// away), it puts the writes that have not landed back where the
    /// engine's guard finds them: the guard then waits for them in turn
    /// before it hands the claim back, as it would have had the body been
    /// dropped before its flush began.
    pub(crate) async fn flush(&self) {
        loop {
            let pending = std::mem::take(&mut *lock(&self.0.pending));
            if pending.is_empty() {
                return;
            }
            let mut awaiting = Awaiting {
                operation: self,
                writes: pending.into(),
            };
            while let Some(write) = awaiting.writes.front_mut() {
                // A write that panicked journaled nothing: the step is in
                // doubt for the next attempt, which reruns it.
                let _ = write.await;
                awaiting.writes.pop_front();
            }
        }
    }
}

/// Journal writes taken out of an operation's list to be awaited, the
/// first one of them being awaited: whatever is left of them when this is
/// dropped goes back to the list.
struct Awaiting<'a> {
    operation: &'a Operation,
    writes: std::collections::VecDeque<tokio::task::JoinHandle<()>>,
}

impl Drop for Awaiting<'_> {
    fn drop(&mut self) {
        if !self.writes.is_empty() {
            lock(&self.operation.0.pending).extend(self.writes.drain(..));
        }
    }
}

/// A step being run, with what it needs across its awaits.
#[derive(Clone)]
pub(super) struct Current {
    pub(super) journal: Option<Arc<dyn Store>>,
    pub(super) claim: Claim,
    pub(super) fingerprint: Fingerprint,
    pub(super) ttl: Duration,
    pub(super) seq: u32,
    pub(super) key: StepKey,
}

impl Current {
    /// The journal request for this step, named `name`.
    pub(super) fn request<'a>(&'a self, name: &'a str) -> StepRequest<'a> {
        StepRequest {
            claim: &self.claim,
            seq: self.seq,
            name,
            fingerprint: &self.fingerprint,
            ttl: self.ttl,
            adopt: false,
            settle: Duration::ZERO,
        }
    }
}

/// The operation's next step, named `name`.
pub(super) fn current(name: &'static str) -> Result<Current, Error> {
    check_name(name)?;
    OPERATION
        .try_with(|operation| operation.next_step(name))
        .map_err(|_| {
            Error::Config(format!(
                "step {:?} was called outside an idempotent operation (or from a task the \
                     operation spawned): steps run inside the body of #[idempotent] or run()",
                name
            ))
        })?
}

/// Waits for the journal writes of the operation this task's body runs
/// under: what `flushed` does after the body, for a body that completes
/// its own claim.
pub(crate) async fn flush_journal() {
    // Most bodies take no step: they clone nothing and wait for nothing.
    let writing = OPERATION
        .try_with(|operation| operation.writing().then(|| operation.clone()))
        .ok()
        .flatten();
    if let Some(operation) = writing {
        operation.flush().await;
    }
}
