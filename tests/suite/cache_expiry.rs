//! The local replay cache (`CachedStore`) against the record's expiry: an
//! entry expires before the store's record, so the cache never replays an
//! outcome the store no longer holds. Once the store's record expired and
//! another payload claimed the key (another process, talking to the store
//! directly), a retry of the first payload gets the store's answer
//! (`KeyReused`), never the expired outcome from memory.

use crate::common;
use crate::local_cache::{charge, SCOPE};

use std::sync::atomic::{AtomicUsize, Ordering};
use std::time::Duration;

use async_trait::async_trait;
use common::Runs;
use idem::record::{Begin, Claim, ClaimToken, Outcome, OutcomeKind, Record};
use idem::store::BeginRequest;
use idem::{CachedStore, Error, Fingerprint, Key, Policy, Scope, Store};

/// A real store whose next `lose` completions land in the store but whose
/// answers are lost on the way back (the caller sees a store error): the
/// engine sends the same completion again, as it is designed to.
struct LostReplies<S> {
    inner: S,
    lose: AtomicUsize,
}

#[async_trait]
impl<S: Store> Store for LostReplies<S> {
    async fn begin(&self, request: &BeginRequest<'_>) -> Result<Begin, Error> {
        self.inner.begin(request).await
    }
    async fn peek(&self, request: &BeginRequest<'_>) -> Result<Option<Begin>, Error> {
        self.inner.peek(request).await
    }
    async fn renew(&self, claim: &Claim) -> Result<(), Error> {
        self.inner.renew(claim).await
    }
    async fn complete(&self, claim: &Claim, outcome: &Outcome) -> Result<(), Error> {
        let done = self.inner.complete(claim, outcome).await;
        let lose = self
            .lose
            .fetch_update(Ordering::SeqCst, Ordering::SeqCst, |n| n.checked_sub(1))
            .is_ok();
        if lose && done.is_ok() {
            return Err(Error::store("injected: the completion's reply was lost"));
        }
        done
    }
    async fn release(&self, claim: &Claim) -> Result<(), Error> {
        self.inner.release(claim).await
    }
    async fn get(&self, scope: &Scope, key: &Key) -> Result<Option<Record>, Error> {
        self.inner.get(scope, key).await
    }
    async fn forget(&self, scope: &Scope, key: &Key) -> Result<bool, Error> {
        self.inner.forget(scope, key).await
    }
    async fn purge_expired(&self, batch: usize) -> Result<u64, Error> {
        self.inner.purge_expired(batch).await
    }
}

/// Another process claims `key` with another payload, straight on the
/// store, as soon as the store lets it (the record expired). Polls without
/// sleeping, so that the claim lands as close to the store's expiry as a
/// round trip allows.
async fn other_payload_claims_when_expired<S: Store + ?Sized>(store: &S, key: &str) -> Claim {
    let scope = Scope::new(SCOPE);
    let key = Key::new(key).unwrap();
    let other = Fingerprint::of_bytes(b"cache_expiry: another payload");
    loop {
        let request = BeginRequest {
            scope: &scope,
            key: &key,
            fingerprint: &other,
            token: ClaimToken::new(),
            lease: Duration::from_secs(30),
            ttl: Duration::from_secs(600),
        };
        match store.begin(&request).await.unwrap() {
            Begin::Claimed(claim) => return claim,
            Begin::KeyReused => tokio::task::yield_now().await,
            other => panic!("unexpected answer while the first record lives: {other:?}"),
        }
    }
}

common::backends!(memory, sqlite_file, postgres, mysql, redis => {
    /// A completion sent again after its reply was lost: the Redis store
    /// answers it done without starting the record's TTL again (the SQL
    /// stores and memory start it again), so the entry is dated from the
    /// claim's first completion. Dated from the last one, it replayed the
    /// expired outcome on Redis while another payload held the key.
    ///
    /// A claims k (payload 5), its completion lands at T1 (the record
    /// expires at T1 + ttl) and three replies are lost; the engine sends
    /// it again until T2 ~ T1 + 140 ms. At T1 + ttl, B claims k with
    /// payload 6. A's retry of payload 5 gets `KeyReused`.
    #[tokio::test]
    async fn a_completion_sent_again_does_not_outlive_the_record_in_the_cache() {
        let (inner, _guard) = backend::store(4).await;
        let store = CachedStore::new(
            LostReplies { inner, lose: AtomicUsize::new(3) },
            100,
        )
        .unwrap();
        let runs = Runs::default();
        let policy = Policy::new().ttl(Duration::from_millis(1500));
        assert_eq!(charge(&store, "k", 5, policy, &runs).await.unwrap(), 1);
        assert_eq!(store.inner().lose.load(Ordering::SeqCst), 0, "no reply was lost");
        assert_eq!(store.cached(), 1, "the outcome was not cached");

        // Another process: the key is free at the store once the record
        // expired; it claims it for another payload and keeps it.
        let _held = other_payload_claims_when_expired(&store.inner().inner, "k").await;
        // Past any millisecond rounding of the record's expiry (see
        // `a_cache_entry_never_outlives_the_record_by_a_rounding`): what is
        // left is the gap between the completion's first landing and the
        // one sent again (some 140 ms: three lost replies, 20+40+80 ms).
        tokio::time::sleep(Duration::from_millis(20)).await;

        // A retry of the first payload, in the caching process.
        let retry = charge(&store, "k", 5, policy, &runs).await;
        assert!(
            matches!(retry, Err(Error::KeyReused)),
            "the store holds the key for another payload (the first record \
             expired), but the cache replayed the expired outcome: {retry:?}"
        );
        assert_eq!(runs.count(), 1);
    }
});

// The window is under a millisecond: memory and Redis, whose clocks are
// read in process or by a script, hit it on most keys; PostgreSQL and
// MySQL, a round trip away, rarely or never.
mod rounding {
    use super::*;

    common::backends!(memory, redis => {
        /// The store's expiry is its clock rounded to whole milliseconds
        /// (memory, MySQL and Redis floor it; PostgreSQL and SQLite round
        /// it) plus the TTL, up to 1 ms before `t_sent + ttl`: within that
        /// window another payload could claim the key while the cache
        /// replayed the expired outcome, on most of 40 keys, before the
        /// entry kept a margin. Tried on 40 keys, since the window is the
        /// sub-millisecond part of the completion's instant.
        #[tokio::test]
        async fn a_cache_entry_never_outlives_the_record_by_a_rounding() {
            let (inner, _guard) = backend::store(4).await;
            let store = CachedStore::new(inner, 100).unwrap();
            let runs = Runs::default();
            let policy = Policy::new().ttl(Duration::from_millis(40));
            let mut replayed = Vec::new();
            for attempt in 0..40 {
                let key = format!("k{attempt}");
                let first = charge(&store, &key, 5, policy, &runs).await.unwrap();
                let _held = other_payload_claims_when_expired(store.inner(), &key).await;
                let retry = charge(&store, &key, 5, policy, &runs).await;
                match retry {
                    Err(Error::KeyReused) => {}
                    Ok(n) if n == first => replayed.push(key),
                    other => panic!("unexpected answer: {other:?}"),
                }
            }
            assert!(
                replayed.is_empty(),
                "the cache replayed an outcome whose record had expired (and whose \
                 key another payload held) for {} of 40 keys: {replayed:?}",
                replayed.len()
            );
        }
    });
}

mod takeover {
    use super::*;

    common::backends!(memory, sqlite_file, postgres, mysql, redis => {
        /// A zombie's completion through the cache, after another process
        /// took its lapsed lease over and completed, is refused and caches
        /// nothing: the cache then replays the new owner's outcome, not the
        /// zombie's.
        ///
        /// Interleaving: A claims k through the cache (lease 150 ms) and
        /// stalls; the lease lapses; B (straight on the store) takes k over
        /// (fence + 1) and completes "B"; A's completion "A" arrives at the
        /// cache -> LeaseLost, nothing cached; a retry through the cache gets
        /// "B".
        #[tokio::test]
        async fn a_zombie_completion_after_a_takeover_is_not_cached() {
            let (inner, _guard) = backend::store(4).await;
            let store = CachedStore::new(inner, 100).unwrap();
            let scope = Scope::new(SCOPE);
            let key = Key::new("zombie").unwrap();
            let fp = Fingerprint::of_bytes(b"cache_expiry: the payload");
            let request = || BeginRequest {
                scope: &scope,
                key: &key,
                fingerprint: &fp,
                token: ClaimToken::new(),
                lease: Duration::from_millis(150),
                ttl: Duration::from_secs(600),
            };
            let outcome = |body: &[u8]| Outcome { kind: OutcomeKind::Ok, body: body.to_vec() };
            let a = match store.begin(&request()).await.unwrap() {
                Begin::Claimed(claim) => claim,
                other => panic!("expected a claim, got {other:?}"),
            };
            let b = loop {
                match store.inner().begin(&request()).await.unwrap() {
                    Begin::Claimed(claim) => break claim,
                    Begin::InProgress { .. } => tokio::time::sleep(Duration::from_millis(20)).await,
                    other => panic!("unexpected answer: {other:?}"),
                }
            };
            assert!(b.fence > a.fence, "{} !> {}", b.fence, a.fence);
            store.inner().complete(&b, &outcome(b"B")).await.unwrap();
            let zombie = store.complete(&a, &outcome(b"A")).await;
            assert!(matches!(zombie, Err(Error::LeaseLost)), "{zombie:?}");
            assert_eq!(store.cached(), 0, "the zombie's outcome was cached");
            match store.begin(&request()).await.unwrap() {
                Begin::Replay(replayed) => assert_eq!(replayed, outcome(b"B")),
                other => panic!("expected B's outcome, got {other:?}"),
            }
        }
    });
}
