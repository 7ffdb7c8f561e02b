//! A claim granted late must not run its body on a lapsed lease: a store
//! writes a claim's lease from its clock when the statement runs, so a
//! claim answered long after it was sent (it waited behind a caller's open
//! transaction, or its answer was lost and it was sent again) can come back
//! with little of its lease left, or none, and a duplicate could take the
//! key over while the body runs. The engine renews such a claim, fenced by
//! its token, before the body runs.

use crate::common;

use std::sync::atomic::{AtomicUsize, Ordering};
use std::sync::Arc;
use std::time::{Duration, Instant};

use async_trait::async_trait;
use common::Runs;
use idem::record::{Begin, Claim, Outcome, Record};
use idem::store::BeginRequest;
use idem::{run, Call, Error, Key, Policy, Scope, Store};
use tokio::sync::oneshot;

const SCOPE: &str = "late_claims.charge";
const LEASE: Duration = Duration::from_millis(300);

/// A real store whose first claim lands but whose answer is lost: the
/// caller hears a store error only after `late` (a response timeout longer
/// than the lease), as over a cut network.
struct LateLostClaim<S> {
    inner: S,
    lose: AtomicUsize,
    late: Duration,
}

#[async_trait]
impl<S: Store> Store for LateLostClaim<S> {
    async fn begin(&self, request: &BeginRequest<'_>) -> Result<Begin, Error> {
        let answer = self.inner.begin(request).await;
        let lose = self
            .lose
            .fetch_update(Ordering::SeqCst, Ordering::SeqCst, |n| n.checked_sub(1))
            .is_ok();
        if lose && matches!(answer, Ok(Begin::Claimed(_))) {
            tokio::time::sleep(self.late).await;
            return Err(Error::store("injected: the claim's reply was lost"));
        }
        answer
    }
    async fn peek(&self, request: &BeginRequest<'_>) -> Result<Option<Begin>, Error> {
        self.inner.peek(request).await
    }
    async fn renew(&self, claim: &Claim) -> Result<(), Error> {
        self.inner.renew(claim).await
    }
    async fn complete(&self, claim: &Claim, outcome: &Outcome) -> Result<(), Error> {
        self.inner.complete(claim, outcome).await
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

/// Interleaving:
/// 1. A claims (token T, lease 300 ms); the script writes the record, the
///    reply is lost and A hears so after 400 ms (the lease has lapsed).
/// 2. A's engine sends the claim again with T: the store answers
///    `Claimed` (its own token) with the lapsed lease its first landing
///    wrote (every store: the claim is not written again).
/// 3. Before, A's body started (its first renewal due a third of a lease
///    later), and B, same key and payload, took the lapsed lease over
///    (fence 2) and ran the body too. The engine now renews a claim
///    granted late before its body runs.
///
/// Expected: while A's body runs, A holds the key; B is answered
/// `InProgress` and the body runs once.
async fn a_claim_sent_again_after_its_lease_lapsed_is_not_taken_over<S>(store: S)
where
    S: Store + Clone + 'static,
{
    let b_store = store.clone();
    let a_store = Arc::new(LateLostClaim {
        inner: store,
        lose: AtomicUsize::new(1),
        late: LEASE + Duration::from_millis(100),
    });
    let runs = Runs::default();
    let (started, started_rx) = oneshot::channel::<()>();
    let (finish, finish_rx) = oneshot::channel::<()>();
    let a = {
        let (store, runs) = (a_store.clone(), runs.clone());
        tokio::spawn(async move {
            run(
                &*store,
                Call::new(SCOPE, "k", &5u32).with_policy(Policy::new().lease(LEASE)),
                async move {
                    let n = runs.next();
                    let _ = started.send(());
                    let _ = finish_rx.await;
                    Ok::<_, Error>(n)
                },
            )
            .await
        })
    };
    started_rx.await.expect("A's body starts");
    let b = run(
        &b_store,
        Call::new(SCOPE, "k", &5u32).with_policy(Policy::new().lease(LEASE).fail_fast()),
        async { Ok::<_, Error>(runs.next()) },
    )
    .await;
    let _ = finish.send(());
    let a = a.await.unwrap();
    assert_eq!(a.as_ref().ok(), Some(&1), "A gets its own run: {a:?}");
    assert!(
        matches!(b, Err(Error::InProgress { .. })),
        "B must find the key held by A's running body, got {b:?}"
    );
    assert_eq!(runs.count(), 1, "the body ran {} times", runs.count());
}

common::backends!(memory, sqlite_file, postgres, mysql, redis, redis_cluster => {
    #[tokio::test(flavor = "multi_thread", worker_threads = 4)]
    async fn a_claim_answered_after_its_lease_is_renewed_first() {
        let (store, _guard) = backend::store(4).await;
        a_claim_sent_again_after_its_lease_lapsed_is_not_taken_over(store).await;
    }
});

mod waited {
    use super::*;

    common::backends!(sqlite_file, postgres, mysql => {
        use idem::{run, Call, Error, Fingerprint, Key, Policy, Scope, Store};
        use idem::record::{Begin, ClaimToken};
        use idem::store::BeginRequest;

        /// A (transactional mode) holds an uncommitted claim on the key for
        /// three leases, then rolls back; B (record mode, pool) blocked on the
        /// row meanwhile and claims once A is gone; C (another store on the
        /// same records, as another process) arrives right after B's body
        /// started. C waits for B and replays its outcome; the body runs once.
        /// PostgreSQL and MariaDB stamp B's lease with their clock as read
        /// before the wait, so B was granted a lapsed lease and C took it over
        /// before the engine renewed claims granted late. SQLite reads its
        /// clock once it holds the write lock.
        #[tokio::test(flavor = "multi_thread", worker_threads = 4)]
        async fn claim_that_waited_behind_a_transaction_gets_a_live_lease() {
            let (store, guard) = backend::store(8).await;
            let other = backend::store_at(&backend::location(&store, &guard), 8).await;
            const SCOPE: &str = "late_claims.waited";
            const KEY: &str = "k-waited";
            let lease = Duration::from_millis(900);
            let policy = Policy::new().lease(lease).wait(Duration::from_secs(20));
            let runs = common::Runs::default();

            // A: an open transaction whose claim holds the row.
            let mut tx = store.pool().begin().await.unwrap();
            let (scope, key) = (Scope::new(SCOPE), Key::new(KEY).unwrap());
            let fingerprint = Fingerprint::of(&"another payload").unwrap();
            let a = BeginRequest {
                scope: &scope,
                key: &key,
                fingerprint: &fingerprint,
                token: ClaimToken::new(),
                lease: Duration::from_secs(60),
                ttl: Duration::from_secs(3600),
            };
            let claimed = store.begin_on(&mut *tx, &a).await.unwrap();
            assert!(matches!(claimed, Begin::Claimed(_)), "{claimed:?}");

            // B: a record-mode call on the pool, blocked on A's row.
            let b = {
                let (store, runs) = (store.clone(), runs.clone());
                tokio::spawn(async move {
                    run(
                        &store,
                        Call::new(SCOPE, KEY, &1).with_policy(policy),
                        async {
                            let n = runs.next();
                            tokio::time::sleep(Duration::from_millis(1_500)).await;
                            Ok::<_, Error>(n)
                        },
                    )
                    .await
                })
            };
            tokio::time::sleep(lease * 3).await;
            assert!(!b.is_finished(), "B must wait for A's transaction");
            assert_eq!(runs.count(), 0);
            tx.rollback().await.unwrap();

            // B claims and starts its body.
            let started = Instant::now();
            while runs.count() == 0 {
                assert!(started.elapsed() < Duration::from_secs(10), "B never ran");
                tokio::time::sleep(Duration::from_millis(1)).await;
            }
            let seen = store.get(&scope, &key).await.unwrap().expect("B's record");

            // C: a duplicate on another store, while B's body runs.
            let c = run(
                &other,
                Call::new(SCOPE, KEY, &1).with_policy(policy),
                async { Ok::<_, Error>(runs.next()) },
            )
            .await;
            let b = b.await.unwrap();
            assert_eq!(
                runs.count(),
                1,
                "the body ran twice: B's record right after its claim was {seen:?} \
                 (B: {b:?}, C: {c:?})"
            );
            assert_eq!(b.unwrap(), c.unwrap());
        }
    });
}
