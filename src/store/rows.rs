//! The contract of a call whose outcome is rows of the caller's own
//! tables (entity mode: the row holding the token *is* the stored
//! result), and the completion of its claim inside the transaction that
//! writes them.
//!
//! The engine owns the flow ([`run_within`](crate::engine::run_within)):
//! it looks for the rows, claims the key in a records store, runs the
//! body under the claim's lease, and hands the value to [`Rows::write`],
//! which writes it and completes the claim in one transaction, telling
//! the engine through [`Completion`] how far that got. Transactional mode
//! completes a claim on the caller's transaction the same way, through
//! [`TransactionalStore::complete_on`](crate::store::TransactionalStore::complete_on).

// Without the SQL stores, only the completion's state is used (by the
// renewals, which never see one).
#![cfg_attr(not(feature = "_sql"), allow(dead_code))]

use std::any::Any;
use std::future::Future;
use std::sync::Mutex;

use idem_core::error::Error;
use idem_core::fingerprint::Fingerprint;
use idem_core::key::{Key, Scope};
use idem_core::record::{Claim, ClaimToken, Outcome, OutcomeKind};
use tokio::time::Instant;

use super::Store;

/// The call that rows answer: their token is its key, and their request
/// hash, where they keep one, its payload's fingerprint.
pub(crate) struct Asked {
    /// The operation's scope (what metrics and the steps' keys name).
    pub(crate) scope: Scope,
    pub(crate) key: Key,
    pub(crate) fingerprint: Fingerprint,
    /// When the call began.
    pub(crate) started: Instant,
}

/// Where a call's value is stored as rows, found by the key alone.
pub(crate) trait Rows<T> {
    /// The records store holding the claims on the rows' tokens.
    type Claims: Store;

    /// The claims' store, made when a call first needs to claim (a call
    /// answered by its row never does).
    fn claims(&self) -> impl Future<Output = Result<Self::Claims, Error>>;

    /// The scope the claims are made under: one per table, whatever the
    /// operation, so that two operations writing one table exclude each
    /// other as the token's UNIQUE constraint does.
    fn claims_scope(&self) -> Scope;

    /// The row holding `key`, if any.
    fn find(&self, key: &Key) -> impl Future<Output = Result<Option<T>, Error>>;

    /// Whether `found`, a row holding the call's key, answers the call:
    /// [`Error::KeyReused`] when its request hash says another payload
    /// made it.
    fn answers(&self, found: &T, asked: &Asked) -> Result<(), Error>;

    /// Writes the body's `value`, and completes the claim through
    /// `completion` in the same transaction (on `claims`' database), with the `held` rows the
    /// body enqueued for it (outbox messages); answers the row as stored.
    /// A row found holding the token meanwhile is answered instead, under
    /// the rule of [`answers`](Rows::answers).
    fn write(
        &self,
        claims: &Self::Claims,
        value: T,
        asked: &Asked,
        completion: &Completion<'_>,
        held: Vec<Box<dyn Any + Send + Sync>>,
    ) -> impl Future<Output = Result<T, Error>>;
}

/// A claim's completion in the transaction that writes its rows, as far
/// as it got: the engine reads it to know whether the claim is settled,
/// and its renewals to tell a completion landing from a takeover.
pub(crate) struct Completion<'c> {
    claim: &'c Claim,
    state: Mutex<State>,
}

/// How far a claim's completion with its rows got.
#[derive(Clone, Copy, Default, PartialEq, Eq)]
enum State {
    /// Not written (or its transaction did not commit).
    #[default]
    None,
    /// Written, uncommitted, in a transaction that holds the claim's
    /// record: until it ends no one else can take the claim over.
    Writing(ClaimToken),
    /// Committed with the rows.
    Committed(ClaimToken),
}

impl<'c> Completion<'c> {
    pub(crate) fn new(claim: &'c Claim) -> Self {
        Completion {
            claim,
            state: Mutex::default(),
        }
    }

    /// The claim to complete.
    pub(crate) fn claim(&self) -> &'c Claim {
        self.claim
    }

    /// The outcome a claim completed with its rows stores: nothing but the
    /// fact (the rows are the result).
    pub(crate) fn outcome() -> Outcome {
        Outcome {
            kind: OutcomeKind::Ok,
            body: Vec::new(),
        }
    }

    fn state(&self) -> std::sync::MutexGuard<'_, State> {
        self.state.lock().unwrap_or_else(|e| e.into_inner())
    }

    /// The completion is written, uncommitted, in a transaction that holds
    /// the claim's record: a renewal that waited for it and then finds the
    /// claim no longer in progress finds it completed.
    pub(crate) fn writing(&self) {
        *self.state() = State::Writing(self.claim.token);
    }

    /// The transaction of [`writing`](Self::writing) did not commit.
    pub(crate) fn not_written(&self) {
        *self.state() = State::None;
    }

    /// The completion committed with the rows.
    pub(crate) fn committed(&self) {
        *self.state() = State::Committed(self.claim.token);
    }

    /// Whether the completion committed with the rows.
    pub(crate) fn is_committed(&self) -> bool {
        *self.state() == State::Committed(self.claim.token)
    }

    /// Whether the completion was written with the rows, committed or
    /// about to be.
    pub(crate) fn is_written(&self) -> bool {
        matches!(*self.state(),
            State::Writing(token) | State::Committed(token) if token == self.claim.token)
    }
}
