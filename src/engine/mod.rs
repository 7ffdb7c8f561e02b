//! The flow behind `#[idempotent]`: find by key, or execute and save.
//!
//! Two entry points share the flow: [`run`] on the store's own connections,
//! and [`run_in_transaction`] on the caller's transaction. Each takes a
//! store, a [`Call`] (scope, key, fingerprint, policy, and which outcomes
//! are stored) and the operation's body, and:
//!
//! 1. asks the store to [`begin`](Store::begin) (one atomic claim);
//! 2. on a replay, decodes the stored outcome and returns it: the body is
//!    dropped without ever being polled;
//! 3. on a claim, runs the body; an `Ok` value is serialized and stored
//!    (fenced [`complete`](Store::complete)), an error is released so that a
//!    retry runs again, unless the call was built with
//!    [`replaying`](Call::replaying) and the error is replayable; a result
//!    to store that its codec cannot encode is answered to this caller as
//!    it is, and every later call gets [`Error::Unrecorded`] (the body
//!    ran: it is not run again);
//! 4. on a key reused with another payload: [`Error::KeyReused`];
//! 5. on a call in progress: waits for it (woken by the store when it can,
//!    polling with a capped backoff otherwise) up to the policy's bound,
//!    then [`Error::InProgress`]; or fails at once under `fail_fast`.
//!
//! ## Leases, tokens and time
//!
//! Every call draws a random [`ClaimToken`](crate::record::ClaimToken)
//! before it claims. The claim writes it with the record, and every later
//! write of the call (renewing the lease, storing the outcome, releasing
//! the key) names it: whatever
//! happened in between (a takeover, a release, an expiry, a purge that let
//! the fence start again), nothing an earlier claim presents is accepted
//! against a later one. A claim or a completion whose answer was lost is
//! sent again with the same token and recognized as the caller's own.
//!
//! While the body runs, the lease is renewed every third of it, so a body
//! slower than its lease is never taken over while its process lives. A
//! crashed or stopped owner stops renewing and is taken over about one
//! lease after its last renewal. Leases and expiry are decided with the
//! database's clock; this process's clock only measures its own waiting.
//!
//! ## Outcomes that must not be lost
//!
//! Once the body has run, its effect has happened: the caller gets the
//! body's value, whatever happens to the record. Storing the outcome is
//! tried again (renewing the lease meanwhile) while the store fails. A
//! caller waits for that at most two seconds, whatever the store: then it
//! gets its value, and the storing goes on in the background until it
//! lands or another caller took the key over (only possible after an
//! outage longer than the lease). A duplicate arriving meanwhile waits,
//! then replays. A store of your own that cannot work in the background
//! (without [`Detach`](crate::store::Detach)) leaves the key claimed, no longer
//! renewed, once its caller has its value: after the lease a retry runs
//! the operation again (its durable steps replay what they journaled).
//!
//! ## Cancellation
//!
//! A caller may be dropped at any `.await` (a client went away, a timeout
//! fired, a task was aborted):
//!
//! - during the claim: the claim, if it landed, is handed back by its
//!   token, so nothing blocks a retry until the lease;
//! - while the body runs: the body cannot run any more (it is dropped with
//!   the caller), so the claim is handed back at once and the retry runs
//!   without waiting for the lease;
//! - after the body returned, while its outcome is stored: the outcome is
//!   stored in the background.
//!
//! Handing back and storing in the background run on a task of their own
//! ([`Detach`](crate::store::Detach) gives them the store), logged and counted as
//! `idem_abandoned_total{what}`. A re-run after a drop is safe for the
//! database's rows, not by itself for calls to other systems: pass the key
//! on to them. To let a body always run to completion, call the idempotent
//! function from a task of its own (`tokio::spawn`), which outlives the
//! caller.
//!
//! ## Transactional mode
//!
//! [`run_in_transaction`] writes the claim and the completion on the
//! caller's open transaction ([`TransactionalStore`](crate::store::TransactionalStore)) and lends that
//! connection to the body, so the business rows and the record commit or
//! roll back together; the caller commits. A concurrent duplicate blocks on
//! the UNIQUE index until the first transaction ends, then replays (or runs,
//! if the first rolled back). A duplicate of a call in progress elsewhere
//! waits with plain reads and claims only once the key looks free; should
//! that claim find the key in progress after all, it fails at once with
//! [`Error::InProgress`] rather than wait while its transaction may hold a
//! lock the owner needs. A body error deletes the claim on the same
//! connection, so a transaction committed anyway does not leave the key in
//! progress; the body's own writes are the transaction's, kept if it
//! commits, so roll it back on an error (as dropping a sqlx `Transaction`
//! does when the error goes up with `?`). When storing the outcome fails,
//! the error is returned: the transaction is to be rolled back, and the
//! business rows with it. On a connection outside a transaction, where
//! every statement commits at once, the claim is seen by all as soon as
//! it is written, and is kept as in record mode: its lease renewed
//! through the store while the body runs, its outcome stored through the
//! store should the connection fail to.
//!
//! ## What a call says
//!
//! What is stored, and what a call whose key is missing does, are the
//! call's to say, in either mode: see [`Call`], its outcome policy
//! ([`OutcomePolicy`]), and [`MissingKey`].
//!
//! Every call runs in a `tracing` span named `idem` and emits one event per
//! decision; counters go through the `metrics` facade (see [`crate::metrics`]).

// The rooms of the engine, from the top down: each imports only rooms
// below it, and none imports this file.
//
// - `within`: a call whose outcome is rows of the caller's tables, its
//   claim completed in the transaction that writes them (entity mode);
// - `transactional`: `run_in_transaction`, and its record statements on
//   the caller's connection;
// - `claim`: the claim or the replay, waiting out a duplicate in progress;
// - `guard`: what a dropped caller holds, handed on from a task of its own;
// - `save`: the outcome stored patiently, the lease renewed meanwhile;
// - `lease`: the lease renewed while the body runs;
// - `call`: the public `Call` builder and its options, checked before a
//   call runs (`Checked`);
// - `outcome`: codecs and outcome policies, and the outcome a result is
//   stored as;
// - `pooled`: the record statements as the flow sends them (`Records`), on
//   the store's pool, where a claim whose answer was lost is sent again;
// - `timeout`: a bound on an answer that costs no timer when it comes at
//   once.
//
// `run` and `execute`, record mode's flow, stay here: they are the flow
// that the module documentation describes, and the rooms serve it.
mod call;
mod claim;
mod guard;
mod lease;
mod outcome;
mod pooled;
mod save;
mod timeout;
mod transactional;
#[cfg(feature = "_sql")]
pub(crate) mod within;

pub use call::{Call, MissingKey};
pub use outcome::{Codec, Json, OkOnly, OutcomePolicy, Replaying};
pub use transactional::run_in_transaction;

use std::future::Future;
use tokio::time::Instant;

use tracing::Instrument;

use crate::steps::Operation;
use crate::store::Store;
use idem_core::error::Error;
use idem_core::record::Claim;

use call::Checked;
use claim::claimed;
use guard::Guard;
use lease::renewing;
use outcome::recorded;
use pooled::{release, Pooled};
use save::{save, SaveFor, Saved};

/// Runs `body` at most once per `(scope, key)` and replays its outcome to
/// every later call: by default its `Ok` value, while an error is released
/// (a retry runs again); the call's outcome policy may store replayable
/// errors too, or store the value with another codec ([`Call`]). See the
/// [module documentation](self).
///
/// The call is checked, and the time it may wait for a duplicate
/// ([`Policy::wait_bound`](crate::Policy::wait_bound)) starts, when `run` is called; nothing else
/// happens until the future is polled. `run` is a plain function that returns one
/// future, rather than an `async fn` wrapping the instrumented one: each
/// layer of future is moved (copied whole) as it is built and awaited,
/// a cost a replay from a store in memory would feel.
pub fn run<'s, S, T, E, Fut, O>(
    store: &'s S,
    call: Call<O>,
    body: Fut,
) -> impl Future<Output = Result<T, E>> + 's
where
    S: Store + ?Sized,
    E: From<Error> + 's,
    T: 's,
    Fut: Future<Output = Result<T, E>> + 's,
    O: OutcomePolicy<T, E> + 's,
{
    // Read in place by the future below: moving them out of its captures
    // would make it larger.
    let unprotected = call.unprotected();
    let checked = match unprotected {
        true => Err(Error::MissingKey),
        false => call.check(Instant::now()),
    };
    let span = match &checked {
        Ok((call, _)) => call.span(),
        Err(_) => tracing::Span::none(),
    };
    async move {
        if unprotected {
            return body.await;
        }
        let (call, outcomes) = match checked {
            Ok(ref checked) => (&checked.0, &checked.1),
            Err(err) => return Err(err.into()),
        };
        let request = call.request();
        // From here on, a dropped caller hands back whatever it holds.
        let mut guard = Guard::new(store, &request);
        let mut records = Pooled::waking(store);
        let claim = match claimed(&mut records, call, &request, outcomes, &mut guard).await {
            Ok(claim) => claim,
            Err(answer) => return answer,
        };
        // The execution is a future of its own, on the heap: the state it
        // keeps while the body runs and its outcome is stored is most of a
        // call's, and a replay, which never gets here, would otherwise
        // carry (and copy, as the call's future is moved) all of it.
        // The guard and the claim stay here, lent to it: an `async fn`'s
        // future holds what it owns twice (as argument and as local).
        Box::pin(execute(
            store,
            call,
            outcomes,
            &mut guard,
            &mut records,
            &claim,
            body,
        ))
        .await
    }
    .instrument(span)
}

/// [`run`] once the claim is won: runs the body (renewing the lease),
/// then stores its outcome or releases the key.
async fn execute<'s, S, T, E, Fut, O>(
    store: &'s S,
    call: &Checked,
    outcomes: &O,
    guard: &mut Guard<'s, '_, S>,
    records: &mut Pooled<'s, S>,
    claim: &Claim,
    body: Fut,
) -> Result<T, E>
where
    S: Store + ?Sized,
    E: From<Error>,
    Fut: Future<Output = Result<T, E>>,
    O: OutcomePolicy<T, E>,
{
    // The body's durable steps journal through an owned handle on the
    // store, fenced by this claim; a dropped caller's claim is handed
    // back once their writes on the way have landed.
    guard.running(claim.clone());
    let operation = Operation::on(store, claim.clone(), call.steps_as());
    guard.journal_first(operation.clone());
    let body = std::pin::pin!(operation.scope(body));
    let result = renewing(store, claim, Some(call), None, body).await;
    let stored = match outcomes.encode(&result) {
        Some(encoded) => recorded(encoded, call.max_outcome),
        // Nothing to store: release the key. Should that fail, the
        // guard hands it back in the background as it drops.
        None => {
            if release(records, claim).await {
                guard.disarm();
            }
            return result;
        }
    };
    let stored = guard.saving(stored);
    match save(store, claim, stored, SaveFor::Caller).await {
        // Still not stored: the guard keeps trying in the background
        // (when it can) as it drops. The caller gets its value now.
        Saved::NotYet => {}
        Saved::Stored | Saved::Lost => guard.disarm(),
    }
    result
}
