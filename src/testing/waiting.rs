//! The conformance cases of duplicates that arrive while a call runs:
//! they wait and replay, or are told the key is in progress; a live
//! owner keeps its claim, a dropped caller hands it back, and a storm of
//! calls runs each key once.

use std::collections::HashMap;
use std::sync::Arc;
use std::time::{Duration, Instant};

use tokio::sync::Barrier;

use super::support::{
    call, charge, fresh_key, pay, pay_held, pay_slowly, Receipt, Runs, TestError,
};
use crate::engine::run;
use crate::policy::Policy;
use crate::store::Store;
use idem_core::error::Error;

/// A duplicate that arrives while the first call runs waits (the policy
/// allows 10 s), is woken promptly when the first call completes, and gets
/// its result; the body ran once.
pub async fn in_progress_duplicate_waits_then_replays<S: Store>(store: S) {
    let key = fresh_key("wait");
    let runs = Runs::default();
    let payload = charge(7);
    let policy = Policy::new().wait(Duration::from_secs(10));
    let (first, started_rx, finish_tx) = pay_held(&store, "op.wait", &key, &payload, policy, &runs);
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
    let payload = charge(3);
    let (first, started_rx, finish_tx) = pay_held(
        &store,
        "payments.charge",
        &key,
        &payload,
        Policy::new(),
        &runs,
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
