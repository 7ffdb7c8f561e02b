//! `Result<Tracked<T>, E>` tells the caller of an `#[idempotent]` fn a
//! replay from a first run: the value the body produced is not replayed,
//! one answered from a record is (after a wait for a concurrent first call
//! too). A `Tracked<T>` is stored as `T`, so records written under
//! `Result<T, E>` are read under `Result<Tracked<T>, E>`.

use std::sync::atomic::{AtomicU32, Ordering};
use std::sync::Arc;

use idem::{idempotent, run, Call, Error, MemoryStore, Tracked};
use serde::{Deserialize, Serialize};
use tokio::sync::Notify;

#[derive(Clone, Debug, PartialEq, Serialize, Deserialize)]
struct Receipt {
    amount: u64,
}

static RUNS: AtomicU32 = AtomicU32::new(0);

#[idempotent(key = key, store = store, scope = "payments.charge")]
async fn charge(store: &MemoryStore, key: &str, amount: u64) -> Result<Tracked<Receipt>, Error> {
    RUNS.fetch_add(1, Ordering::SeqCst);
    Ok(Receipt { amount }.into())
}

/// The same operation, as it was before its callers needed to know.
#[idempotent(key = key, store = store, scope = "payments.charge")]
async fn charge_untracked(store: &MemoryStore, key: &str, amount: u64) -> Result<Receipt, Error> {
    Ok(Receipt { amount })
}

#[tokio::test]
async fn the_first_run_is_not_replayed_and_the_retry_is() {
    let store = MemoryStore::new();
    let first = charge(&store, "t-1", 500).await.unwrap();
    assert!(!first.is_replayed());
    let retry = charge(&store, "t-1", 500).await.unwrap();
    assert!(retry.is_replayed());
    assert_eq!(retry.value(), first.value());
    assert_ne!(retry, first, "equality compares the flag too");
    assert_eq!(retry.into_value(), Receipt { amount: 500 });
}

#[tokio::test]
async fn records_are_shared_with_the_untracked_signature() {
    let store = MemoryStore::new();
    let before = charge_untracked(&store, "t-2", 700).await.unwrap();
    let after = charge(&store, "t-2", 700).await.unwrap();
    assert!(after.is_replayed());
    assert_eq!(after.value(), &before);

    let tracked = charge(&store, "t-3", 900).await.unwrap();
    assert!(!tracked.is_replayed());
    assert_eq!(
        charge_untracked(&store, "t-3", 900).await.unwrap(),
        *tracked.value()
    );
}

#[tokio::test]
async fn a_duplicate_that_waited_for_the_first_call_is_replayed() {
    let store = Arc::new(MemoryStore::new());
    let started = Arc::new(Notify::new());
    let finish = Arc::new(Notify::new());
    let body = {
        let (started, finish) = (started.clone(), finish.clone());
        async move {
            started.notify_one();
            finish.notified().await;
            Ok::<_, Error>(Tracked::new(1_u32))
        }
    };
    let first = tokio::spawn({
        let store = store.clone();
        async move { run(&*store, Call::new("jobs.import", "w-1", &()), body).await }
    });
    started.notified().await;
    let second = tokio::spawn({
        let store = store.clone();
        async move {
            run(&*store, Call::new("jobs.import", "w-1", &()), async {
                Ok::<_, Error>(Tracked::new(2_u32))
            })
            .await
        }
    });
    tokio::task::yield_now().await;
    finish.notify_one();
    let first = first.await.unwrap().unwrap();
    let second = second.await.unwrap().unwrap();
    assert!(!first.is_replayed());
    assert!(second.is_replayed());
    assert_eq!(second.into_value(), 1, "the first call's value");
}

#[test]
fn serialized_as_the_value_alone_and_deserialized_as_replayed() {
    let fresh = Tracked::new(Receipt { amount: 5 });
    let json = serde_json::to_string(&fresh).unwrap();
    assert_eq!(json, r#"{"amount":5}"#);
    let back: Tracked<Receipt> = serde_json::from_str(&json).unwrap();
    assert!(back.is_replayed());
    assert_eq!(back.value(), fresh.value());
}
