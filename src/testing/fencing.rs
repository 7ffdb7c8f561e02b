//! The conformance cases of owners that stopped: once their claim is
//! taken over, released, forgotten or purged, everything they present
//! (renewal, completion, release) is refused.

use std::time::Duration;

use super::support::{
    assert_fenced_out, assert_purged, charge, claim_directly, fresh_key, pay, pay_held, payment,
    stopped_owner, Receipt, Runs,
};
use crate::policy::Policy;
use crate::store::Store;
use idem_core::error::Error;
use idem_core::fingerprint::Fingerprint;
use idem_core::record::{Outcome, OutcomeKind, State};

/// An owner that stops renewing (a crashed or stopped process: here a
/// claim taken straight from the store, which nobody renews) is taken over
/// once its lease lapses. While the new owner still runs, everything the
/// old one presents (renewal, completion, release) is refused, and after a
/// release and a claim with another payload the old claim is refused too:
/// the claim's token, not the fence, identifies it.
pub async fn lease_takeover_fences_the_old_owner<S: Store>(store: S) {
    let key = fresh_key("lease");
    let (scope, k) = payment(&key);
    let runs = Runs::default();
    let payload = charge(9);
    let fingerprint = Fingerprint::of(&payload).unwrap();
    let zombie = stopped_owner(&store, &scope, &k, &fingerprint).await;
    let policy = Policy::new().lease(Duration::from_secs(5)).fail_fast();
    // While the lease holds: in progress.
    let err = pay(&store, &key, &payload, policy, &runs)
        .await
        .unwrap_err();
    assert!(
        matches!(err.idem(), Some(Error::InProgress { .. })),
        "{err:?}"
    );
    tokio::time::sleep(Duration::from_millis(300)).await;

    let late = Outcome {
        kind: OutcomeKind::Ok,
        body: b"{\"run\":0,\"amount\":9}".to_vec(),
    };
    let (successor, started_rx, resume_tx) =
        pay_held(&store, "payments.charge", &key, &payload, policy, &runs);
    let zombie_writes = async {
        started_rx.await.unwrap();
        // The successor runs: the zombie's writes all bounce.
        assert_fenced_out(&store, &zombie, &late, "the stopped owner").await;
        let record = store.get(&scope, &k).await.unwrap().unwrap();
        assert_eq!((record.state, record.fence), (State::InProgress, 2));
        resume_tx.send(()).unwrap();
    };
    let (taken, ()) = tokio::join!(successor, zombie_writes);
    let taken = taken.unwrap();
    assert_eq!(taken.run, 1);
    // The successor's outcome stands.
    let replay = pay(&store, &key, &payload, policy, &runs).await.unwrap();
    assert_eq!(replay, taken);
    assert_eq!(runs.count(), 1);
}

/// The sequence that made fences repeat: A claims and stalls past its
/// lease; B takes over, fails and releases (the row is deleted); C claims
/// with another payload, and its fence starts again at 1. A's late
/// completion, release and renewal must all be refused while C runs, and
/// C's retry must replay C's outcome, never A's.
pub async fn zombie_completion_after_release_is_refused<S: Store>(store: S) {
    let key = fresh_key("zombie");
    let (scope, k) = payment(&key);
    let (a_payload, c_payload) = (charge(1), charge(2));
    let a_fingerprint = Fingerprint::of(&a_payload).unwrap();
    let (lease, ttl) = (Duration::from_millis(150), Duration::from_secs(60));
    let a_claim = claim_directly(&store, &scope, &k, &a_fingerprint, lease, ttl).await;
    assert_eq!(a_claim.fence, 1);
    tokio::time::sleep(Duration::from_millis(250)).await;
    // B takes over (fence 2), fails, releases: the row is gone.
    let b_claim = claim_directly(&store, &scope, &k, &a_fingerprint, lease, ttl).await;
    assert_eq!(b_claim.fence, 2);
    store.release(&b_claim).await.unwrap();
    // C claims with another payload: fence 1 again, another token.
    let runs = Runs::default();
    let policy = Policy::new().fail_fast();
    let (c, started_rx, resume_tx) =
        pay_held(&store, "payments.charge", &key, &c_payload, policy, &runs);
    let zombie = async {
        started_rx.await.unwrap();
        let record = store.get(&scope, &k).await.unwrap().unwrap();
        assert_eq!(
            record.fence, a_claim.fence,
            "the fence repeats after a release"
        );
        let late = Outcome {
            kind: OutcomeKind::Ok,
            body: b"{\"run\":99,\"amount\":1}".to_vec(),
        };
        // None of A's writes lands on C's record.
        assert_fenced_out(&store, &a_claim, &late, "A").await;
        resume_tx.send(()).unwrap();
    };
    let (c_result, ()) = tokio::join!(c, zombie);
    let c_result = c_result.unwrap();
    assert_eq!(c_result, Receipt { run: 1, amount: 2 });
    let replay = pay(&store, &key, &c_payload, policy, &runs).await.unwrap();
    assert_eq!(replay, c_result, "C's retry replays C's outcome");
    assert_eq!(runs.count(), 1);
}

/// A claim forgotten while its owner runs: the key is claimed again at
/// once, and the old owner's completion, renewal and release are refused.
pub async fn forgotten_owner_is_fenced_out<S: Store>(store: S) {
    let key = fresh_key("forgotten");
    let (scope, k) = payment(&key);
    let fingerprint = Fingerprint::of(&charge(1)).unwrap();
    let (lease, ttl) = (Duration::from_secs(30), Duration::from_secs(60));
    let stuck = claim_directly(&store, &scope, &k, &fingerprint, lease, ttl).await;
    assert!(store.forget(&scope, &k).await.unwrap());
    let next = claim_directly(&store, &scope, &k, &fingerprint, lease, ttl).await;
    let outcome = Outcome {
        kind: OutcomeKind::Ok,
        body: b"{\"run\":1,\"amount\":1}".to_vec(),
    };
    assert_fenced_out(&store, &stuck, &outcome, "the forgotten owner").await;
    store.complete(&next, &outcome).await.unwrap();
}

/// After a record expired and was purged, a new claim (fence 1 again)
/// refuses everything the purged claim presents.
pub async fn purged_claim_cannot_touch_the_next_one<S: Store>(store: S) {
    let key = fresh_key("purged");
    let (scope, k) = payment(&key);
    let fingerprint = Fingerprint::of(&charge(1)).unwrap();
    let short = Duration::from_millis(100);
    let old_claim = claim_directly(&store, &scope, &k, &fingerprint, short, short).await;
    tokio::time::sleep(Duration::from_millis(200)).await;
    let purged = store.purge_expired(100).await.unwrap();
    assert_purged(&store, purged, 1);
    assert!(store.get(&scope, &k).await.unwrap().is_none());
    let (lease, ttl) = (Duration::from_secs(30), Duration::from_secs(60));
    let new_claim = claim_directly(&store, &scope, &k, &fingerprint, lease, ttl).await;
    assert_eq!(new_claim.fence, old_claim.fence);
    let late = Outcome {
        kind: OutcomeKind::Ok,
        body: b"1".to_vec(),
    };
    assert_fenced_out(&store, &old_claim, &late, "the purged owner").await;
    let record = store.get(&scope, &k).await.unwrap().unwrap();
    assert_eq!(record.state, State::InProgress);
    assert_eq!(record.token, Some(new_claim.token));
}
