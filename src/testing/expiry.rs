//! The conformance cases of a record's end: its ttl frees the key,
//! purges delete only what expired, and `forget` frees the key at once.

use std::time::Duration;

use super::support::{assert_purged, charge, fresh_key, pay, payment, Runs};
use crate::policy::Policy;
use crate::store::Store;

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
    for (keys, kept) in [(&short_keys, false), (&long_keys, true)] {
        for key in keys {
            let (scope, k) = payment(key);
            let record = store.get(&scope, &k).await.unwrap();
            assert_eq!(record.is_some(), kept, "{key}");
        }
    }
    assert_eq!(store.purge_expired(3).await.unwrap(), 0);
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
    let (scope, k) = payment(&key);
    assert!(
        store.forget(&scope, &k).await.unwrap(),
        "there was a record"
    );
    assert!(store.get(&scope, &k).await.unwrap().is_none());
    let again = pay(&store, &key, &charge(5), policy, &runs).await.unwrap();
    assert_eq!(again.run, 2, "a forgotten key runs again");
    let (_, never) = payment(&fresh_key("never"));
    assert!(!store.forget(&scope, &never).await.unwrap());
}
