//! The store conformance suite, for anyone who writes a [`Store`].
//!
//! Every store built into this crate passes the same cases: the
//! contract's own (`idem_core::testing`, each transition called straight
//! on the store), and these, through the engine: claim and replay, payload mismatch, a duplicate in progress, lease takeover with
//! fencing, release, ttl expiry, purge, a dropped caller, scoping, a
//! storm of concurrent calls, and the step journal of durable steps (see
//! the functions below). A store of your own
//! is done when it passes them too, on the real backend.
//!
//! Each case is a plain `async fn` that takes a fresh store and panics
//! when the store breaks the contract. [`store_conformance!`](crate::store_conformance)
//! turns them into tests: one `#[test]` per case, each on a store of its
//! own, run on a multi-thread tokio runtime of 4 workers (as
//! `#[tokio::test(flavor = "multi_thread", worker_threads = 4)]` would).
//! Call a case yourself to run it in a harness of your own.
//!
//! Every case works on keys that no other case, process or run uses, so
//! that stores on one database (one table, even) can run the cases in
//! parallel and again and again. The cases sleep for a few hundred
//! milliseconds where leases and ttls must lapse; the slowest takes about
//! a second.
//!
//! ```
//! // tests/store_conformance.rs of a crate with a store of its own; the
//! // memory store stands in for it here.
//! use idem::MemoryStore as MyStore;
//!
//! // A future yielding the store, and a guard dropped when the case ends
//! // (a temporary directory, a table to drop; `()` for none).
//! idem::store_conformance!(my_store, async { (MyStore::new(), ()) });
//! # fn main() {}
//! ```
//!
//! Enabled by the `testing` feature, which is meant for dev-dependencies:
//!
//! ```toml
//! [dev-dependencies]
//! idem = { version = "0.1", features = ["testing"] }
//! ```

mod steps;
mod support;

// The contract's own cases, which call the store's transitions straight,
// and the runner of every case.
pub use self::steps::{
    a_clean_failure_takes_the_start_back, a_journal_of_another_payload_is_refused,
    a_step_completion_sent_again_is_accepted, a_step_journal_is_fenced,
    forget_and_purge_clear_the_journal, steps_called_in_another_order_are_refused,
    steps_in_doubt_follow_their_policy, steps_replay_after_a_failed_attempt,
    storm_runs_each_step_once,
};
pub use idem_core::testing::{
    a_claim_is_granted_once, a_claim_sent_again_is_granted_again, a_completed_key_replays,
    a_completion_sent_again_is_accepted, a_lapsed_lease_is_taken_over_and_fenced,
    a_release_frees_the_key, an_expired_record_frees_the_key, another_payload_is_refused,
    forget_frees_the_key_and_fences_its_owner, purge_deletes_only_what_expired, run_case,
    the_journal_replays_and_fences,
};

use std::collections::HashMap;
use std::sync::Arc;
use std::time::{Duration, Instant};

use serde::Serialize;
use tokio::sync::{oneshot, Barrier};

use self::support::{
    call, charge, claim_directly, fresh_key, pay, pay_slowly, Receipt, Runs, TestError,
};
use crate::engine::{run, Call};
use crate::policy::Policy;
use crate::store::Store;
use idem_core::error::Error;
use idem_core::fingerprint::Fingerprint;
use idem_core::key::{Key, Scope};
use idem_core::record::{Outcome, OutcomeKind, State};

/// Emits the [store conformance suite](crate::testing) for one store: a
/// module named `$backend` with one `#[test]` per case.
///
/// `$make` is a future yielding `(store, guard)`: the store under test, and
/// whatever keeps its resources alive (a temporary directory, a guard that
/// drops the store's table), dropped when the case ends; `()` for nothing.
/// It is evaluated afresh for every case, in the new module, which sees the
/// items of the module around it. Each test builds a multi-thread tokio
/// runtime of 4 workers and runs the case on it, so the crate needs no
/// tokio of its own.
///
/// The step cases need a step journal ([`Store::journal`]), and fail on a
/// store that answers none: a wrapper that forgets to forward it would
/// run durable steps unjournaled. A store that keeps no journal on purpose
/// says so, `store_conformance!(name, make, journal = false)`, and the
/// step cases are left out.
///
/// ```
/// use idem::MemoryStore;
///
/// // `memory::execute_once_then_replay`, `memory::storm_runs_each_key_once`, ...
/// idem::store_conformance!(memory, async { (MemoryStore::new(), ()) });
/// # fn main() {}
/// ```
#[macro_export]
#[cfg_attr(docsrs, doc(cfg(feature = "testing")))]
macro_rules! store_conformance {
    ($backend:ident, $make:expr $(,)?) => {
        $crate::store_conformance!($backend, $make, journal = true);
    };
    ($backend:ident, $make:expr, journal = true $(,)?) => {
        mod $backend {
            #[allow(unused_imports)]
            use super::*;

            $crate::store_conformance!(@records $make);
            $crate::store_conformance!(@cases $make;
                steps_replay_after_a_failed_attempt,
                steps_in_doubt_follow_their_policy,
                a_step_journal_is_fenced,
                a_clean_failure_takes_the_start_back,
                a_step_completion_sent_again_is_accepted,
                steps_called_in_another_order_are_refused,
                a_journal_of_another_payload_is_refused,
                forget_and_purge_clear_the_journal,
                storm_runs_each_step_once,
            );
        }
    };
    ($backend:ident, $make:expr, journal = false $(,)?) => {
        mod $backend {
            #[allow(unused_imports)]
            use super::*;

            $crate::store_conformance!(@records $make);
        }
    };
    // The cases every store passes, a journal or not.
    (@records $make:expr) => {
        $crate::store_conformance!(@cases $make;
            execute_once_then_replay,
            fingerprint_ignores_field_order,
            key_reused_with_other_payload,
            in_progress_duplicate_waits_then_replays,
            fail_fast_reports_in_progress,
            transient_error_released_then_retried,
            replayable_error_replayed,
            ttl_expiry_frees_the_key,
            purge_removes_only_expired,
            lease_takeover_fences_the_old_owner,
            zombie_completion_after_release_is_refused,
            purged_claim_cannot_touch_the_next_one,
            live_owner_keeps_its_claim,
            ttl_shorter_than_lease_keeps_the_claim,
            dropped_caller_hands_the_key_back,
            unbounded_wait_is_accepted,
            scopes_do_not_collide,
            invalid_keys_rejected,
            forget_frees_the_key,
            forgotten_owner_is_fenced_out,
            storm_runs_each_key_once,
            a_claim_is_granted_once,
            a_claim_sent_again_is_granted_again,
            a_completed_key_replays,
            another_payload_is_refused,
            a_lapsed_lease_is_taken_over_and_fenced,
            a_release_frees_the_key,
            a_completion_sent_again_is_accepted,
            an_expired_record_frees_the_key,
            purge_deletes_only_what_expired,
            forget_frees_the_key_and_fences_its_owner,
            the_journal_replays_and_fences,
        );
    };
    (@cases $make:expr; $($case:ident),* $(,)?) => {$(
        #[test]
        fn $case() {
            $crate::testing::run_case(async {
                let (store, _guard) = $make.await;
                $crate::testing::$case(store).await;
            });
        }
    )*};
}

/// The first call with a key runs the body and stores its result; every
/// later call with the key and the same payload gets that result back
/// without running the body. The record is completed, with fence 1.
pub async fn execute_once_then_replay<S: Store>(store: S) {
    let key = fresh_key("once");
    let runs = Runs::default();
    let first = pay(&store, &key, &charge(100), Policy::new(), &runs)
        .await
        .unwrap();
    for _ in 0..3 {
        let again = pay(&store, &key, &charge(100), Policy::new(), &runs)
            .await
            .unwrap();
        assert_eq!(again, first);
    }
    assert_eq!(runs.count(), 1);
    let record = store
        .get(&Scope::new("payments.charge"), &Key::new(key).unwrap())
        .await
        .unwrap()
        .expect("the record is stored");
    assert_eq!(record.state, State::Completed);
    assert_eq!(record.fence, 1);
    assert!(record.outcome.is_some());
}

/// The payload's fingerprint is that of its canonical JSON: the same value
/// built with members in another order replays, another value is
/// [`Error::KeyReused`].
pub async fn fingerprint_ignores_field_order<S: Store>(store: S) {
    #[derive(Serialize)]
    struct AmountFirst {
        amount: u64,
        currency: &'static str,
        meta: HashMap<&'static str, u32>,
    }
    #[derive(Serialize)]
    struct CurrencyFirst {
        currency: &'static str,
        meta: Vec<(&'static str, u32)>,
        amount: u64,
    }
    let key = fresh_key("order");
    let runs = Runs::default();
    let a = AmountFirst {
        amount: 5,
        currency: "EUR",
        meta: HashMap::from([("z", 1), ("a", 2), ("m", 3)]),
    };
    // The same JSON object, built with members in another order.
    let b_json =
        serde_json::json!({"meta": {"m": 3, "z": 1, "a": 2}, "currency": "EUR", "amount": 5});
    let op = |payload: Call| {
        let runs = runs.clone();
        let store = &store;
        async move {
            run(
                store,
                payload,
                async move { Ok::<_, TestError>(runs.next()) },
            )
            .await
        }
    };
    let first = op(Call::new("op.order", key.as_str(), &a)).await.unwrap();
    let second = op(Call::new("op.order", key.as_str(), &b_json))
        .await
        .unwrap();
    assert_eq!((first, second, runs.count()), (1, 1, 1));
    // A different value is a different payload.
    let c = CurrencyFirst {
        currency: "EUR",
        meta: vec![("m", 3)],
        amount: 5,
    };
    let err = op(Call::new("op.order", key.as_str(), &c))
        .await
        .unwrap_err();
    assert!(matches!(err.idem(), Some(Error::KeyReused)), "{err:?}");
}

/// A key sent again with another payload is [`Error::KeyReused`], without
/// running the body; the original payload still replays.
pub async fn key_reused_with_other_payload<S: Store>(store: S) {
    let key = fresh_key("reuse");
    let runs = Runs::default();
    pay(&store, &key, &charge(100), Policy::new(), &runs)
        .await
        .unwrap();
    let err = pay(&store, &key, &charge(999), Policy::new(), &runs)
        .await
        .unwrap_err();
    assert!(matches!(err.idem(), Some(Error::KeyReused)), "{err:?}");
    assert_eq!(runs.count(), 1, "the body must not run for a reused key");
    // The original still replays.
    let again = pay(&store, &key, &charge(100), Policy::new(), &runs)
        .await
        .unwrap();
    assert_eq!(again.amount, 100);
    assert_eq!(runs.count(), 1);
}

/// A duplicate that arrives while the first call runs waits (the policy
/// allows 10 s), is woken promptly when the first call completes, and gets
/// its result; the body ran once.
pub async fn in_progress_duplicate_waits_then_replays<S: Store>(store: S) {
    let key = fresh_key("wait");
    let runs = Runs::default();
    let (started_tx, started_rx) = oneshot::channel();
    let (finish_tx, finish_rx) = oneshot::channel::<()>();
    let payload = charge(7);
    let policy = Policy::new().wait(Duration::from_secs(10));
    let first = async {
        run(&store, call("op.wait", &key, &payload, policy), async {
            let n = runs.next();
            started_tx.send(()).unwrap();
            finish_rx.await.unwrap();
            Ok::<_, TestError>(Receipt { run: n, amount: 7 })
        })
        .await
    };
    let second = async {
        started_rx.await.unwrap();
        let finishing = async {
            // Let the duplicate find the key in progress, then finish.
            tokio::time::sleep(Duration::from_millis(150)).await;
            finish_tx.send(()).unwrap();
            Instant::now()
        };
        let duplicate = async {
            let r = run(&store, call("op.wait", &key, &payload, policy), async {
                Ok::<_, TestError>(Receipt {
                    run: runs.next(),
                    amount: 0,
                })
            })
            .await;
            (r, Instant::now())
        };
        let (finished_at, (r, returned_at)) = tokio::join!(finishing, duplicate);
        (r, returned_at.saturating_duration_since(finished_at))
    };
    let (first, (second, lag)) = tokio::join!(first, second);
    assert_eq!(first.unwrap(), second.unwrap());
    assert_eq!(runs.count(), 1);
    // Woken promptly, not after a long fixed sleep.
    assert!(
        lag < Duration::from_secs(1),
        "the waiter returned {lag:?} after completion"
    );
}

/// A duplicate that may not wait is told [`Error::InProgress`], with a
/// non-zero `retry_after`, while the first call runs.
pub async fn fail_fast_reports_in_progress<S: Store>(store: S) {
    let key = fresh_key("fast");
    let runs = Runs::default();
    let (started_tx, started_rx) = oneshot::channel();
    let (finish_tx, finish_rx) = oneshot::channel::<()>();
    let payload = charge(3);
    let first = run(
        &store,
        call("payments.charge", &key, &payload, Policy::new()),
        async {
            started_tx.send(()).unwrap();
            finish_rx.await.unwrap();
            Ok::<_, TestError>(Receipt {
                run: runs.next(),
                amount: 3,
            })
        },
    );
    let second = async {
        started_rx.await.unwrap();
        let r = pay(&store, &key, &payload, Policy::new().fail_fast(), &runs).await;
        finish_tx.send(()).unwrap();
        r
    };
    let (first, second) = tokio::join!(first, second);
    first.unwrap();
    let err = second.unwrap_err();
    assert!(
        matches!(err.idem(), Some(Error::InProgress { retry_after }) if !retry_after.is_zero()),
        "{err:?}"
    );
    assert_eq!(runs.count(), 1);
}

/// A body error that is not replayable releases the key (no record is
/// left): the retry runs the body again, and its result is then replayed.
pub async fn transient_error_released_then_retried<S: Store>(store: S) {
    let key = fresh_key("transient");
    let runs = Runs::default();
    let payload = charge(50);
    let attempt = |fail: bool| {
        let runs = runs.clone();
        run(
            &store,
            call("op.transient", &key, &payload, Policy::new()),
            async move {
                let n = runs.next();
                if fail {
                    Err(TestError::Transient)
                } else {
                    Ok(Receipt { run: n, amount: 50 })
                }
            },
        )
    };
    assert_eq!(attempt(true).await.unwrap_err(), TestError::Transient);
    assert!(store
        .get(
            &Scope::new("op.transient"),
            &Key::new(key.as_str()).unwrap()
        )
        .await
        .unwrap()
        .is_none());
    let ok = attempt(false).await.unwrap();
    assert_eq!(ok.run, 2);
    assert_eq!(attempt(false).await.unwrap(), ok);
    assert_eq!(runs.count(), 2);
}

/// A body error marked replayable (through
/// [`Call::replaying`](crate::engine::Call::replaying)) is stored and
/// replayed like a result: the body ran once.
pub async fn replayable_error_replayed<S: Store>(store: S) {
    let key = fresh_key("declined");
    let runs = Runs::default();
    let payload = charge(10);
    let attempt = || {
        let runs = runs.clone();
        crate::engine::run(
            &store,
            call("op.declined", &key, &payload, Policy::new())
                .replaying(|e: &TestError| matches!(e, TestError::Declined(_))),
            async move {
                runs.next();
                Err::<Receipt, _>(TestError::Declined("card declined".into()))
            },
        )
    };
    for _ in 0..3 {
        assert_eq!(
            attempt().await.unwrap_err(),
            TestError::Declined("card declined".into())
        );
    }
    assert_eq!(runs.count(), 1);
}

/// Once its ttl has passed, a record no longer counts: the key runs again,
/// even with another payload.
pub async fn ttl_expiry_frees_the_key<S: Store>(store: S) {
    let key = fresh_key("ttl");
    let runs = Runs::default();
    let policy = Policy::new().ttl(Duration::from_millis(300));
    let first = pay(&store, &key, &charge(1), policy, &runs).await.unwrap();
    assert_eq!(
        pay(&store, &key, &charge(1), policy, &runs).await.unwrap(),
        first
    );
    tokio::time::sleep(Duration::from_millis(400)).await;
    // Free again: runs, even with another payload.
    let second = pay(&store, &key, &charge(2), policy, &runs).await.unwrap();
    assert_eq!((second.run, second.amount), (2, 2));
    assert_eq!(runs.count(), 2);
}

/// [`Store::purge_expired`] deletes the expired records, in batches, and
/// keeps the live ones; a second purge finds nothing. A store whose
/// database deletes expired records itself
/// ([`Capabilities::deletes_expired_itself`](crate::store::Capabilities::deletes_expired_itself)) purges nothing, and its expired
/// records are gone all the same.
pub async fn purge_removes_only_expired<S: Store>(store: S) {
    let runs = Runs::default();
    let short = Policy::new().ttl(Duration::from_millis(200));
    let short_keys: Vec<_> = (0..7).map(|_| fresh_key("purge-short")).collect();
    let long_keys: Vec<_> = (0..4).map(|_| fresh_key("purge-long")).collect();
    for k in &short_keys {
        pay(&store, k, &charge(1), short, &runs).await.unwrap();
    }
    for k in &long_keys {
        pay(&store, k, &charge(1), Policy::new(), &runs)
            .await
            .unwrap();
    }
    tokio::time::sleep(Duration::from_millis(300)).await;
    // Batches of 3: several statements. Other cases may share the database
    // and leave expired records too, so count ours.
    let purged = store.purge_expired(3).await.unwrap();
    assert_purged(&store, purged, short_keys.len());
    let scope = Scope::new("payments.charge");
    for k in &short_keys {
        assert!(store
            .get(&scope, &Key::new(k.as_str()).unwrap())
            .await
            .unwrap()
            .is_none());
    }
    for k in &long_keys {
        assert!(store
            .get(&scope, &Key::new(k.as_str()).unwrap())
            .await
            .unwrap()
            .is_some());
    }
    assert_eq!(store.purge_expired(3).await.unwrap(), 0);
}

/// An owner that stops renewing (a crashed or stopped process: here a
/// claim taken straight from the store, which nobody renews) is taken over
/// once its lease lapses. While the new owner still runs, everything the
/// old one presents (renewal, completion, release) is refused, and after a
/// release and a claim with another payload the old claim is refused too:
/// the claim's token, not the fence, identifies it.
pub async fn lease_takeover_fences_the_old_owner<S: Store>(store: S) {
    let key = fresh_key("lease");
    let (scope, k) = (
        Scope::new("payments.charge"),
        Key::new(key.as_str()).unwrap(),
    );
    let runs = Runs::default();
    let payload = charge(9);
    let fingerprint = Fingerprint::of(&payload).unwrap();
    let zombie = claim_directly(
        &store,
        &scope,
        &k,
        &fingerprint,
        Duration::from_millis(200),
        Duration::from_secs(60),
    )
    .await;
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
    let (started_tx, started_rx) = oneshot::channel();
    let (resume_tx, resume_rx) = oneshot::channel::<()>();
    let successor = run(
        &store,
        call("payments.charge", &key, &payload, policy),
        async {
            let n = runs.next();
            started_tx.send(()).unwrap();
            resume_rx.await.unwrap();
            Ok::<_, TestError>(Receipt { run: n, amount: 9 })
        },
    );
    let zombie_writes = async {
        started_rx.await.unwrap();
        // The successor runs: the zombie's writes all bounce.
        let lost = |r: Result<(), Error>| matches!(r, Err(Error::LeaseLost));
        assert!(
            lost(store.renew(&zombie).await),
            "a stale renewal was accepted"
        );
        assert!(
            lost(store.complete(&zombie, &late).await),
            "a stale completion was accepted"
        );
        assert!(
            lost(store.release(&zombie).await),
            "a stale release was accepted"
        );
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
    let (scope, k) = (
        Scope::new("payments.charge"),
        Key::new(key.as_str()).unwrap(),
    );
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
    let (started_tx, started_rx) = oneshot::channel();
    let (resume_tx, resume_rx) = oneshot::channel::<()>();
    let policy = Policy::new().fail_fast();
    let c = run(
        &store,
        call("payments.charge", &key, &c_payload, policy),
        async {
            let n = runs.next();
            started_tx.send(()).unwrap();
            resume_rx.await.unwrap();
            Ok::<_, TestError>(Receipt { run: n, amount: 2 })
        },
    );
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
        let lost = |r: Result<(), Error>| matches!(r, Err(Error::LeaseLost));
        assert!(
            lost(store.complete(&a_claim, &late).await),
            "A's completion landed on C's record"
        );
        assert!(lost(store.renew(&a_claim).await), "A renewed C's claim");
        assert!(lost(store.release(&a_claim).await), "A deleted C's claim");
        resume_tx.send(()).unwrap();
    };
    let (c_result, ()) = tokio::join!(c, zombie);
    let c_result = c_result.unwrap();
    assert_eq!(c_result, Receipt { run: 1, amount: 2 });
    let replay = pay(&store, &key, &c_payload, policy, &runs).await.unwrap();
    assert_eq!(replay, c_result, "C's retry replays C's outcome");
    assert_eq!(runs.count(), 1);
}

/// [`Store::forget`] deletes a completed record, so the next call runs
/// again; forgetting a key without a record answers `false`.
pub async fn forget_frees_the_key<S: Store>(store: S) {
    let key = fresh_key("forget");
    let runs = Runs::default();
    let policy = Policy::new();
    let first = pay(&store, &key, &charge(5), policy, &runs).await.unwrap();
    assert_eq!(
        pay(&store, &key, &charge(5), policy, &runs).await.unwrap(),
        first
    );
    let (scope, k) = (
        Scope::new("payments.charge"),
        Key::new(key.as_str()).unwrap(),
    );
    assert!(
        store.forget(&scope, &k).await.unwrap(),
        "there was a record"
    );
    assert!(store.get(&scope, &k).await.unwrap().is_none());
    let again = pay(&store, &key, &charge(5), policy, &runs).await.unwrap();
    assert_eq!(again.run, 2, "a forgotten key runs again");
    let never = Key::new(fresh_key("never").as_str()).unwrap();
    assert!(!store.forget(&scope, &never).await.unwrap());
}

/// A claim forgotten while its owner runs: the key is claimed again at
/// once, and the old owner's completion, renewal and release are refused.
pub async fn forgotten_owner_is_fenced_out<S: Store>(store: S) {
    let key = fresh_key("forgotten");
    let (scope, k) = (
        Scope::new("payments.charge"),
        Key::new(key.as_str()).unwrap(),
    );
    let fingerprint = Fingerprint::of(&charge(1)).unwrap();
    let (lease, ttl) = (Duration::from_secs(30), Duration::from_secs(60));
    let stuck = claim_directly(&store, &scope, &k, &fingerprint, lease, ttl).await;
    assert!(store.forget(&scope, &k).await.unwrap());
    let next = claim_directly(&store, &scope, &k, &fingerprint, lease, ttl).await;
    let outcome = Outcome {
        kind: OutcomeKind::Ok,
        body: b"{\"run\":1,\"amount\":1}".to_vec(),
    };
    let lost = |r: Result<(), Error>| matches!(r, Err(Error::LeaseLost));
    assert!(
        lost(store.complete(&stuck, &outcome).await),
        "the forgotten owner completed"
    );
    assert!(
        lost(store.renew(&stuck).await),
        "the forgotten owner renewed"
    );
    assert!(
        lost(store.release(&stuck).await),
        "the forgotten owner released"
    );
    store.complete(&next, &outcome).await.unwrap();
}

/// That `purged` records (and entries) are at least the `expired` ones a
/// case left, or none on a store that leaves expiry to its database.
pub(crate) fn assert_purged<S: Store + ?Sized>(store: &S, purged: u64, expired: usize) {
    if store.capabilities().deletes_expired_itself {
        assert_eq!(
            purged, 0,
            "a store that deletes expired records itself purged some"
        );
    } else {
        assert!(
            purged >= expired as u64,
            "purged {purged}, expected at least {expired}"
        );
    }
}

/// After a record expired and was purged, a new claim (fence 1 again)
/// refuses everything the purged claim presents.
pub async fn purged_claim_cannot_touch_the_next_one<S: Store>(store: S) {
    let key = fresh_key("purged");
    let (scope, k) = (
        Scope::new("payments.charge"),
        Key::new(key.as_str()).unwrap(),
    );
    let fingerprint = Fingerprint::of(&charge(1)).unwrap();
    let short = Duration::from_millis(100);
    let old_claim = claim_directly(&store, &scope, &k, &fingerprint, short, short).await;
    tokio::time::sleep(Duration::from_millis(200)).await;
    let purged = store.purge_expired(100).await.unwrap();
    assert_purged(&store, purged, 1);
    assert!(store.get(&scope, &k).await.unwrap().is_none());
    let new_claim = claim_directly(
        &store,
        &scope,
        &k,
        &fingerprint,
        Duration::from_secs(30),
        Duration::from_secs(60),
    )
    .await;
    assert_eq!(new_claim.fence, old_claim.fence);
    let late = Outcome {
        kind: OutcomeKind::Ok,
        body: b"1".to_vec(),
    };
    assert!(matches!(
        store.complete(&old_claim, &late).await,
        Err(Error::LeaseLost)
    ));
    assert!(matches!(
        store.renew(&old_claim).await,
        Err(Error::LeaseLost)
    ));
    assert!(matches!(
        store.release(&old_claim).await,
        Err(Error::LeaseLost)
    ));
    let record = store.get(&scope, &k).await.unwrap().unwrap();
    assert_eq!(record.state, State::InProgress);
    assert_eq!(record.token, Some(new_claim.token));
}

/// A live owner keeps its claim: a body that runs three times its lease is
/// never taken over, because the engine renews the lease while it runs.
pub async fn live_owner_keeps_its_claim<S: Store>(store: S) {
    let key = fresh_key("renewed");
    let runs = Runs::default();
    let payload = charge(5);
    let lease = Duration::from_millis(200);
    let policy = Policy::new().lease(lease).fail_fast();
    let slow = run(
        &store,
        call("payments.charge", &key, &payload, policy),
        async {
            let n = runs.next();
            tokio::time::sleep(lease * 3).await;
            Ok::<_, TestError>(Receipt { run: n, amount: 5 })
        },
    );
    let duplicates = async {
        let mut refused = 0;
        let started = Instant::now();
        while started.elapsed() < lease * 3 - Duration::from_millis(50) {
            tokio::time::sleep(Duration::from_millis(40)).await;
            match pay(&store, &key, &payload, policy, &runs).await {
                Err(e) if matches!(e.idem(), Some(Error::InProgress { .. })) => refused += 1,
                Ok(receipt) if receipt.run == 1 => break, // the owner finished
                other => panic!("a duplicate got {other:?} while the owner ran"),
            }
        }
        refused
    };
    let (first, refused) = tokio::join!(slow, duplicates);
    assert!(refused > 0, "no duplicate looked while the owner ran");
    assert_eq!(first.unwrap().run, 1);
    assert_eq!(runs.count(), 1, "a live owner was taken over");
}

/// A ttl shorter than the lease never lets an in-progress record expire
/// under its live claim: another payload is refused, not run.
pub async fn ttl_shorter_than_lease_keeps_the_claim<S: Store>(store: S) {
    let key = fresh_key("shortttl");
    let runs = Runs::default();
    let policy = Policy::new()
        .ttl(Duration::from_millis(100))
        .lease(Duration::from_secs(5))
        .fail_fast();
    let first_payload = charge(1);
    let slow = pay_slowly(
        &store,
        &key,
        &first_payload,
        policy,
        &runs,
        Duration::from_millis(400),
    );
    let other = async {
        tokio::time::sleep(Duration::from_millis(250)).await;
        pay(&store, &key, &charge(2), policy, &runs).await
    };
    let (first, other) = tokio::join!(slow, other);
    assert_eq!(first.unwrap().run, 1);
    let err = other.unwrap_err();
    assert!(matches!(err.idem(), Some(Error::KeyReused)), "{err:?}");
    assert_eq!(runs.count(), 1);
}

/// A caller dropped while its body runs (a client gone, a timeout) hands
/// its claim back at once: the retry runs without waiting for the lease.
pub async fn dropped_caller_hands_the_key_back<S: Store>(store: S) {
    let key = fresh_key("dropped");
    let runs = Runs::default();
    let policy = Policy::new().lease(Duration::from_secs(30)).fail_fast();
    let payload = charge(3);
    let gone = tokio::time::timeout(
        Duration::from_millis(100),
        pay_slowly(
            &store,
            &key,
            &payload,
            policy,
            &runs,
            Duration::from_secs(60),
        ),
    )
    .await;
    assert!(gone.is_err(), "the slow body finished");
    // Well within the 30 s lease, a retry claims the key.
    let started = Instant::now();
    let retried = loop {
        match pay(&store, &key, &charge(3), policy, &runs).await {
            Err(e) if matches!(e.idem(), Some(Error::InProgress { .. })) => {
                assert!(
                    started.elapsed() < Duration::from_secs(10),
                    "the claim was never handed back"
                );
                tokio::time::sleep(Duration::from_millis(20)).await;
            }
            other => break other.unwrap(),
        }
    };
    assert_eq!(retried.run, 2);
    assert_eq!(runs.count(), 2);
}

/// A bound on waiting too long to represent as an instant (`Duration::MAX`)
/// means no bound; it never panics.
pub async fn unbounded_wait_is_accepted<S: Store>(store: S) {
    let key = fresh_key("maxwait");
    let runs = Runs::default();
    let policy = Policy::new().wait(Duration::MAX);
    let first = pay(&store, &key, &charge(4), policy, &runs).await.unwrap();
    let again = pay(&store, &key, &charge(4), policy, &runs).await.unwrap();
    assert_eq!(first, again);
    assert_eq!(runs.count(), 1);
}

/// One key in different scopes, and in one scope with different
/// principals, names different records.
pub async fn scopes_do_not_collide<S: Store>(store: S) {
    let key = fresh_key("scoped");
    let runs = Runs::default();
    let payload = charge(1);
    let scopes = [
        Scope::new("orders.create"),
        Scope::new("refunds.create"),
        Scope::new("orders.create").with_principal("tenant-a"),
        Scope::new("orders.create").with_principal("tenant-b"),
    ];
    let mut results = Vec::new();
    for scope in &scopes {
        for _ in 0..2 {
            let r = run(&store, Call::new(scope, key.as_str(), &payload), async {
                Ok::<_, TestError>(runs.next())
            })
            .await
            .unwrap();
            results.push(r);
        }
    }
    assert_eq!(results, vec![1, 1, 2, 2, 3, 3, 4, 4]);
}

/// Empty, too long and non-visible-ASCII keys are [`Error::InvalidKey`],
/// before the body could run.
pub async fn invalid_keys_rejected<S: Store>(store: S) {
    let runs = Runs::default();
    let too_long = "k".repeat(256);
    for bad in ["", "has space", "tab\t", "naïve", too_long.as_str()] {
        let err = pay(&store, bad, &charge(1), Policy::new(), &runs)
            .await
            .unwrap_err();
        assert!(
            matches!(err.idem(), Some(Error::InvalidKey(_))),
            "{bad:?}: {err:?}"
        );
    }
    assert_eq!(runs.count(), 0);
}

/// 200 concurrent calls over 20 keys, on tasks of their own: one body run
/// per key, and every caller of a key gets that run's result.
pub async fn storm_runs_each_key_once<S: Store + Clone + 'static>(store: S) {
    const CALLS: usize = 200;
    const KEYS: usize = 20;
    let prefix = fresh_key("storm");
    let runs = Runs::default();
    let barrier = Arc::new(Barrier::new(CALLS));
    let mut tasks = Vec::new();
    for i in 0..CALLS {
        let (store, runs, barrier) = (store.clone(), runs.clone(), barrier.clone());
        let key = format!("{prefix}-{}", i % KEYS);
        tasks.push(tokio::spawn(async move {
            barrier.wait().await;
            let policy = Policy::new().wait(Duration::from_secs(30));
            let r = run(&store, call("op.storm", &key, &charge(1), policy), async {
                let n = runs.next();
                tokio::task::yield_now().await;
                Ok::<_, TestError>(Receipt { run: n, amount: 1 })
            })
            .await;
            (key, r)
        }));
    }
    let mut by_key: HashMap<String, Vec<Receipt>> = HashMap::new();
    for task in tasks {
        let (key, r) = task.await.unwrap();
        by_key.entry(key).or_default().push(r.unwrap());
    }
    assert_eq!(runs.count(), KEYS, "exactly one body run per key");
    assert_eq!(by_key.len(), KEYS);
    for receipts in by_key.values() {
        assert_eq!(receipts.len(), CALLS / KEYS);
        assert!(receipts.iter().all(|r| r == &receipts[0]), "{receipts:?}");
    }
}
