//! Storing an outcome patiently: fenced by the claim's token, tried again
//! while the store fails, the lease renewed all along. A caller waits for
//! it at most [`SAVE_IN_LINE`], then gets its value while the storing goes
//! on in the background (see the module documentation's "Outcomes that
//! must not be lost").

use std::time::Duration;
use tokio::time::Instant;

use crate::metrics;
use crate::store::Store;
use idem_core::error::Error;
use idem_core::record::{Claim, Outcome};

use super::lease::{keep_renewed, Renewing};
use super::outcome::refused;
use super::timeout::within;

/// How long a caller waits for its outcome to be stored while the store
/// fails, before it gets its value and the storing goes on in the
/// background.
const SAVE_IN_LINE: Duration = Duration::from_secs(2);
/// The longest pause between two attempts to store an outcome.
pub(super) const MAX_SAVE_PAUSE: Duration = Duration::from_secs(1);

/// What became of an outcome.
pub(super) enum Saved {
    Stored,
    /// Another caller took the key over: the outcome cannot be stored.
    Lost,
    /// The store kept failing for as long as the caller may wait.
    NotYet,
}

/// How long [`save`] tries before it gives the caller its value.
pub(super) enum SaveFor {
    /// The caller waits up to [`SAVE_IN_LINE`], whatever the store, then
    /// gets its value; the rest is done in the background when the store
    /// can be detached.
    Caller,
    /// In the background, until the outcome lands or the claim is lost.
    Background,
}

/// Stores the outcome, fenced by the claim's token, trying again while
/// the store fails, and renewing the lease all along: the key is this
/// caller's until its outcome lands, however long a completion takes or
/// however often it fails. A completion whose answer was lost is accepted
/// when sent again, so a retry never mistakes its own earlier success for
/// a lost lease.
pub(super) async fn save<S: Store + ?Sized>(
    store: &S,
    claim: &Claim,
    outcome: &Outcome,
    patience: SaveFor,
) -> Saved {
    match complete_now(store, claim, outcome) {
        // Stored at once: a store in memory.
        Some(Ok(())) => Saved::Stored,
        Some(Err(Error::LeaseLost)) => lease_lost(claim),
        // The rest (waiting on the store, timers, retries, renewals) on
        // the heap, so that a call stored at once neither carries nor
        // copies it.
        first => {
            Box::pin(async {
                let saving = save_patiently(store, claim, outcome, patience, first);
                let renewals = keep_renewed(store, claim, Renewing::Save);
                tokio::select! {
                    biased;
                    saved = saving => saved,
                    never = renewals => match never {},
                }
            })
            .await
        }
    }
}

/// [`Store::complete`] done at once by a store that can
/// ([`Immediate`](crate::store::Immediate)).
fn complete_now<S: Store + ?Sized>(
    store: &S,
    claim: &Claim,
    outcome: &Outcome,
) -> Option<Result<(), Error>> {
    store.capabilities().immediate?.complete_now(claim, outcome)
}

/// [`save`] for a store that does not complete at once, or failed to at
/// once (`first`, that attempt's answer, taken as the loop's first).
async fn save_patiently<S: Store + ?Sized>(
    store: &S,
    claim: &Claim,
    outcome: &Outcome,
    patience: SaveFor,
    mut first: Option<Result<(), Error>>,
) -> Saved {
    // Read at the first completion sent.
    let mut started = None;
    let mut pause = Duration::from_millis(20);
    // What is stored instead of an outcome the store can never hold.
    let mut unrecorded = None;
    loop {
        let outcome = unrecorded.as_ref().unwrap_or(outcome);
        let completed = match first.take().or_else(|| complete_now(store, claim, outcome)) {
            // Done (or failed) at once: a store in memory.
            Some(done) => done,
            None => {
                // A completion can block (a lock held on the record, a
                // stalled connection): a waiting caller gives it only what
                // is left of its time in line, then hands the work to the
                // background. Sending the same outcome again later is
                // accepted, so a completion cut short while it was landing
                // does no harm.
                let attempt = store.complete(claim, outcome);
                let left = SAVE_IN_LINE.saturating_sub(since(&mut started));
                match patience {
                    SaveFor::Caller if !left.is_zero() => {
                        within(left, attempt).await.unwrap_or_else(|| {
                            Err(Error::store(
                                "storing the outcome took longer than the caller waits",
                            ))
                        })
                    }
                    SaveFor::Caller => return not_yet(store, None),
                    SaveFor::Background => attempt.await,
                }
            }
        };
        match completed {
            Ok(()) => return Saved::Stored,
            Err(Error::LeaseLost) => return lease_lost(claim),
            // The same outcome would be refused again for ever: the key
            // answers `Unrecorded` instead, sent at once.
            Err(Error::Unrecorded(reason)) if unrecorded.is_none() => {
                unrecorded = Some(refused(&reason));
            }
            Err(err) => {
                metrics::store_retried(&claim.scope);
                let mut nap = pause;
                if let SaveFor::Caller = patience {
                    let left = SAVE_IN_LINE.saturating_sub(since(&mut started));
                    if left.is_zero() {
                        return not_yet(store, Some(&err));
                    }
                    // The caller's wait ends on time, not a pause later.
                    nap = nap.min(left);
                }
                tracing::warn!(error = %err, "storing the outcome failed; trying again");
                // The lease is renewed alongside ([`save`]) meanwhile.
                tokio::time::sleep(nap).await;
                pause = (pause * 2).min(MAX_SAVE_PAUSE);
            }
        }
    }
}

/// A caller's wait for its outcome to be stored is over
/// ([`SAVE_IN_LINE`]): it gets its value now. A store that can work in
/// the background ([`Detach`](crate::store::Detach)) goes on storing it there (the
/// call's guard hands it on); one that cannot leaves the key claimed, no
/// longer renewed, until its lease runs out.
fn not_yet<S: Store + ?Sized>(store: &S, err: Option<&Error>) -> Saved {
    let error = err.map(tracing::field::display);
    if store.capabilities().detached().is_some() {
        tracing::warn!(
            error,
            "the outcome is not stored yet; returning the value and storing it in the background"
        );
    } else {
        tracing::error!(
            error,
            "the outcome is not stored yet and this store cannot store it in the background; \
             returning the value: the key stays claimed until its lease runs out, then a retry \
             runs the operation again"
        );
    }
    Saved::NotYet
}

/// The time since `started`, which is now if it was not set.
fn since(started: &mut Option<Instant>) -> Duration {
    started.get_or_insert_with(Instant::now).elapsed()
}

/// A completion refused because another caller took the key over,
/// traced and counted.
pub(super) fn lease_lost(claim: &Claim) -> Saved {
    tracing::warn!(
        decision = "lease lost",
        fence = claim.fence,
        "the outcome was not stored: another caller took the key over"
    );
    metrics::lease_lost(&claim.scope);
    Saved::Lost
}

#[cfg(test)]
mod tests {
    use tokio::time::Instant;

    use super::super::call::Call;
    use super::{save, SaveFor, Saved};
    use crate::store::{MemoryStore, Store};
    use idem_core::record::{Begin, Claim, Outcome, OutcomeKind};

    #[tokio::test]
    async fn an_outcome_is_stored_for_its_claim_and_refused_for_another() {
        let store = MemoryStore::new();
        let call = || Call::new("tests.save", "k-1", &1).check(Instant::now());
        let (first, _) = call().unwrap();
        let Begin::Claimed(claim) = store.begin(&first.request()).await.unwrap() else {
            panic!("the key is free");
        };
        // A claim that was never granted: the same key, another token.
        let (other, _) = call().unwrap();
        let stranger = Claim::granted(&other.request(), claim.fence);
        let outcome = Outcome {
            kind: OutcomeKind::Ok,
            body: b"7".to_vec(),
        };
        let refused = save(&store, &stranger, &outcome, SaveFor::Caller).await;
        assert!(matches!(refused, Saved::Lost));
        let saved = save(&store, &claim, &outcome, SaveFor::Caller).await;
        assert!(matches!(saved, Saved::Stored));
        match store.begin(&other.request()).await.unwrap() {
            Begin::Replay(replayed) => assert_eq!(replayed, outcome),
            other => panic!("expected a replay, got {other:?}"),
        }
    }
}
