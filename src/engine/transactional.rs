//! Transactional mode: [`run_in_transaction`], whose claim and completion
//! are written on the caller's open transaction ([`OnConnection`]), and
//! the end of a call whose claim committed at once, on a connection
//! outside a transaction (see the module documentation's "Transactional
//! mode").

use std::future::Future;
use std::time::Duration;
use tokio::time::Instant;

use tracing::Instrument;

use crate::steps::Operation;
use crate::store::{BeginRequest, TransactionalStore};
use idem_core::error::Error;
use idem_core::record::{Begin, Claim, Outcome};

use super::call::Call;
use super::claim::claimed;
use super::guard::Guard;
use super::lease::renewing;
use super::outcome::{recorded, refused, OutcomePolicy};
use super::pooled::{release, Records, MAX_POLL};
use super::save::{lease_lost, save, SaveFor, Saved};

/// Transactional mode: like [`run`](super::run), but the claim and the completion are
/// written on `conn`, the caller's open transaction. The body borrows the
/// connection to write its own rows, and hands it back with its result:
/// `|conn| async move { let r = ...; (r, conn) }`. The call's outcome
/// policy applies as in [`run`](super::run). The caller commits; see the
/// [module documentation](super#transactional-mode).
///
/// On a connection outside a transaction (one that no `begin` of sqlx's
/// opened: [`TransactionalStore::in_transaction`]), each statement commits
/// as it runs, the claim too, so that everyone sees it: its lease is then
/// renewed through the store while the body runs, as in [`run`](super::run), and an
/// outcome that the connection fails to store is stored through the
/// store.
pub async fn run_in_transaction<'c, S, C, T, E, F, Fut, O>(
    store: &S,
    conn: &'c mut C,
    call: Call<O>,
    body: F,
) -> Result<T, E>
where
    S: TransactionalStore<C> + ?Sized,
    C: Send + ?Sized,
    E: From<Error>,
    F: FnOnce(&'c mut C) -> Fut,
    Fut: Future<Output = (Result<T, E>, &'c mut C)>,
    O: OutcomePolicy<T, E>,
{
    if call.unprotected() {
        return body(conn).await.0;
    }
    // Outside a transaction each statement commits as it runs, the claim
    // too: everyone sees it (see below).
    let hidden = store.in_transaction(conn);
    let (call, outcomes) = call.check(Instant::now())?;
    let span = call.span();
    async move {
        let request = call.request();
        let mut guard = Guard::new(store, &request);
        let mut records = OnConnection {
            store,
            conn,
            locked: false,
        };
        let claim = match claimed(&mut records, &call, &request, &outcomes, &mut guard).await {
            Ok(claim) => claim,
            Err(answer) => return answer,
        };
        guard.running(claim.clone());
        // Nothing outlives the caller's transaction to journal steps in:
        // they run with their keys, unjournaled.
        let operation = Operation::new(None, claim.clone(), call.steps_as());
        if !hidden {
            // A claim committed at once: it needs what a claim gets in
            // record mode, its lease renewed while the body runs (on the
            // store's pool), its outcome saved however long the store
            // fails, a dropped caller's claim handed back.
            let body = std::pin::pin!(operation.scope(body(records.conn)));
            // Its steps are not journaled: nothing to keep but the lease.
            let (result, conn) = renewing(store, &claim, None, None, body).await;
            let records = OnConnection {
                store,
                conn,
                locked: false,
            };
            return settle_committed(
                store,
                records,
                &mut guard,
                &claim,
                &outcomes,
                call.max_outcome,
                result,
            )
            .await;
        }
        // The claim is written in the caller's open transaction: nobody
        // else sees it, and a competing claim waits for the transaction to
        // end, so the lease needs no renewal.
        let (result, conn) = operation.scope(body(records.conn)).await;
        // Whatever happens next happens on the caller's transaction: if it
        // fails, the caller's transaction fails with it and rolls back.
        guard.disarm();
        let mut records = OnConnection {
            store,
            conn,
            locked: false,
        };
        match outcomes.encode(&result) {
            Some(encoded) => match complete_or_refuse(&mut records, &claim, recorded(encoded, call.max_outcome)).await {
                Ok(()) => {}
                Err(err) => {
                    tracing::error!(
                        error = %err,
                        "storing the outcome in the transaction failed; roll the transaction back"
                    );
                    return Err(err.into());
                }
            },
            None => {
                // On the caller's transaction: if this fails, so does the
                // transaction, and the claim rolls back with it.
                release(&mut records, &claim).await;
            }
        }
        result
    }
    .instrument(span)
    .await
}

/// The end of a call in transactional mode whose claim committed at once
/// (on a connection outside a transaction): the outcome is stored (or the
/// key released) on the caller's connection, which needs no connection of
/// the store's pool (a pool of one may have lent it to the caller); should
/// that fail, as record mode does it, through the store, the guard handing
/// on what is left should the caller be dropped.
async fn settle_committed<S, C, T, E, O>(
    store: &S,
    mut records: OnConnection<'_, '_, S, C>,
    guard: &mut Guard<'_, '_, S>,
    claim: &Claim,
    outcomes: &O,
    max_outcome: usize,
    result: Result<T, E>,
) -> Result<T, E>
where
    S: TransactionalStore<C> + ?Sized,
    C: Send + ?Sized,
    E: From<Error>,
    O: OutcomePolicy<T, E>,
{
    let Some(encoded) = outcomes.encode(&result) else {
        // Should that fail, the guard hands the key back through the
        // store in the background as it drops, as in record mode: the
        // caller may hold the pool's only connection.
        if release(&mut records, claim).await {
            guard.disarm();
        }
        return result;
    };
    let outcome = recorded(encoded, max_outcome);
    match complete_or_refuse(&mut records, claim, outcome.clone()).await {
        Ok(()) => guard.disarm(),
        Err(Error::LeaseLost) => {
            lease_lost(claim);
            guard.disarm();
        }
        Err(err) => {
            tracing::warn!(error = %err, "storing the outcome on the connection failed; storing it through the store");
            let outcome = guard.saving(outcome);
            match save(store, claim, outcome, SaveFor::Caller).await {
                Saved::NotYet => {}
                Saved::Stored | Saved::Lost => guard.disarm(),
            }
        }
    }
    result
}

/// Completes `claim` with `outcome`, or, should the store refuse it as one
/// it can never hold, with the outcome that answers
/// [`Error::Unrecorded`].
async fn complete_or_refuse<R: Records>(
    records: &mut R,
    claim: &Claim,
    outcome: Outcome,
) -> Result<(), Error> {
    match records.complete(claim, &outcome).await {
        Err(Error::Unrecorded(reason)) => records.complete(claim, &refused(&reason)).await,
        done => done,
    }
}

struct OnConnection<'s, 'c, S: ?Sized, C: ?Sized> {
    store: &'s S,
    conn: &'c mut C,
    /// A claim attempt on `conn` found the key in progress: it may have
    /// left a lock in the caller's transaction.
    locked: bool,
}

impl<S, C> Records for OnConnection<'_, '_, S, C>
where
    S: TransactionalStore<C> + ?Sized,
    C: Send + ?Sized,
{
    async fn begin(&mut self, request: &BeginRequest<'_>) -> Result<Begin, Error> {
        if self.store.claim_locks_only_its_own() {
            // A duplicate's claim attempt locks nothing: claim at once.
            return self.store.begin_on(self.conn, request).await;
        }
        // Look first with a plain read: a duplicate of a finished or
        // running call is answered without a claim attempt, so it takes no
        // lock in the caller's transaction.
        if let Some(answer) = self.store.peek_in(self.conn, request).await? {
            return Ok(answer);
        }
        let answer = self.store.begin_on(self.conn, request).await?;
        self.locked = matches!(answer, Begin::InProgress { .. });
        Ok(answer)
    }
    async fn peek(&mut self, request: &BeginRequest<'_>) -> Result<Option<Begin>, Error> {
        self.store.peek_in(self.conn, request).await
    }
    async fn complete(&mut self, claim: &Claim, outcome: &Outcome) -> Result<(), Error> {
        self.store.complete_on(self.conn, claim, outcome).await
    }
    async fn release(&mut self, claim: &Claim) -> Result<(), Error> {
        self.store.release_on(self.conn, claim).await
    }
    async fn wait_for_change(
        &mut self,
        _request: &BeginRequest<'_>,
        timeout: Duration,
    ) -> Result<Option<Begin>, Error> {
        // Polls: a wake-up through the store would take a second connection
        // while the caller's transaction holds one, and pools run dry.
        tokio::time::sleep(timeout).await;
        Ok(None)
    }
    fn max_poll(&self) -> Duration {
        MAX_POLL
    }
    fn may_wait(&self) -> bool {
        !self.locked
    }
}
