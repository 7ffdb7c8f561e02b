//! The fault matrix: every store operation of the flow (claim, look,
//! renewal, completion, release) fails, loses its reply or stalls once,
//! in turn, on every store, while two clients retry one key as real
//! clients do (again on any retryable error, until they get an answer).
//!
//! For every point it asserts:
//!
//! - the body's effect happens once: at most one run returned `Ok` (a run
//!   that failed on purpose, to exercise the release, had no effect);
//! - every client whose own body ran gets that body's value, and every
//!   other client gets the same value replayed;
//! - no client gets another payload's outcome;
//! - no key stays blocked much longer than one lease after the fault.
//!
//! The faults are transient (each strikes once, and a stall is shorter
//! than the time left on the lease), which is what "exactly once" can
//! promise: an outage longer than the lease lets the claim lapse.

use crate::common;
use idem::store::{Capabilities, Detach, Wake};

use std::sync::atomic::{AtomicUsize, Ordering};
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant, SystemTime, UNIX_EPOCH};

use async_trait::async_trait;
use idem::record::{Begin, Claim, Outcome, Record};
use idem::store::BeginRequest;
use idem::{run, Call, Error, Key, Policy, Scope, Store};
use serde::{Deserialize, Serialize};

/// Which store operation a fault strikes.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
enum Point {
    Begin,
    Peek,
    Renew,
    Complete,
    Release,
}

/// What the fault does.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
enum Kind {
    /// The operation fails before it reaches the store.
    Fail,
    /// The operation takes effect, and its reply is lost.
    LoseReply,
    /// The operation stalls, then takes effect.
    Stall,
    /// The operation takes effect, and its reply stalls.
    StallReply,
    /// The operation never answers (a lock that is never given up).
    Hang,
}

const POINTS: [Point; 5] = [
    Point::Begin,
    Point::Peek,
    Point::Renew,
    Point::Complete,
    Point::Release,
];
const KINDS: [Kind; 3] = [Kind::Fail, Kind::LoseReply, Kind::Stall];

const LEASE: Duration = Duration::from_millis(600);
/// Shorter than what is left of the lease after a renewal period.
const STALL: Duration = Duration::from_millis(250);
const BODY: Duration = Duration::from_millis(450);

/// A store whose `point` misbehaves once, as `kind` says. Clones share
/// the fault, so it strikes once in all.
#[derive(Clone)]
struct Faulty<S> {
    inner: S,
    point: Point,
    kind: Kind,
    struck: Arc<AtomicUsize>,
    detachable: bool,
}

impl<S> Faulty<S> {
    fn new(inner: S, point: Point, kind: Kind) -> Self {
        Faulty {
            inner,
            point,
            kind,
            struck: Arc::default(),
            detachable: false,
        }
    }

    /// Lets the engine hand work to the background through this store.
    fn detachable(mut self) -> Self {
        self.detachable = true;
        self
    }

    fn injected(&self) -> Error {
        Error::store(format!("injected fault: {:?} {:?}", self.kind, self.point))
    }

    /// Runs `op` through the fault, if `at` is the point and it has not
    /// struck yet.
    async fn through<T>(
        &self,
        at: Point,
        op: impl std::future::Future<Output = Result<T, Error>>,
    ) -> Result<T, Error> {
        if at != self.point || self.struck.fetch_add(1, Ordering::SeqCst) > 0 {
            return op.await;
        }
        match self.kind {
            Kind::Fail => Err(self.injected()),
            Kind::LoseReply => {
                let _ = op.await;
                Err(self.injected())
            }
            Kind::Stall => {
                tokio::time::sleep(STALL).await;
                op.await
            }
            Kind::StallReply => {
                let reply = op.await;
                tokio::time::sleep(STALL).await;
                reply
            }
            Kind::Hang => {
                tokio::time::sleep(Duration::from_secs(3600)).await;
                op.await
            }
        }
    }

    fn struck(&self) -> bool {
        self.struck.load(Ordering::SeqCst) > 0
    }
}

#[async_trait]
impl<S: Store + Clone + 'static> Store for Faulty<S> {
    async fn begin(&self, request: &BeginRequest<'_>) -> Result<Begin, Error> {
        self.through(Point::Begin, self.inner.begin(request)).await
    }
    async fn peek(&self, request: &BeginRequest<'_>) -> Result<Option<Begin>, Error> {
        self.through(Point::Peek, self.inner.peek(request)).await
    }
    async fn renew(&self, claim: &Claim) -> Result<(), Error> {
        self.through(Point::Renew, self.inner.renew(claim)).await
    }
    async fn complete(&self, claim: &Claim, outcome: &Outcome) -> Result<(), Error> {
        self.through(Point::Complete, self.inner.complete(claim, outcome))
            .await
    }
    async fn release(&self, claim: &Claim) -> Result<(), Error> {
        self.through(Point::Release, self.inner.release(claim))
            .await
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
    fn capabilities(&self) -> Capabilities<'_> {
        Capabilities::default().with_wake(self).with_detach(self)
    }
}

#[async_trait]
impl<S: Store + Clone + 'static> Wake for Faulty<S> {
    async fn wait_for_change(
        &self,
        scope: &Scope,
        key: &Key,
        timeout: Duration,
    ) -> Result<(), Error> {
        self.inner
            .capabilities()
            .waker()
            .wait_for_change(scope, key, timeout)
            .await
    }
}

impl<S: Store + Clone + 'static> Detach for Faulty<S> {
    fn detach(&self) -> Option<Arc<dyn Store>> {
        self.detachable
            .then(|| Arc::new(self.clone()) as Arc<dyn Store>)
    }
}

/// The same faults on the caller's connection, in transactional mode
/// (there is no renewal there: the claim is uncommitted, and a competing
/// claim waits for the transaction).
#[async_trait]
impl<C, S> idem::store::TransactionalStore<C> for Faulty<S>
where
    C: Send + ?Sized,
    S: idem::store::TransactionalStore<C> + Clone + 'static,
{
    async fn peek_in(
        &self,
        conn: &mut C,
        request: &BeginRequest<'_>,
    ) -> Result<Option<Begin>, Error> {
        self.through(Point::Peek, self.inner.peek_in(conn, request))
            .await
    }
    async fn begin_on(&self, conn: &mut C, request: &BeginRequest<'_>) -> Result<Begin, Error> {
        self.through(Point::Begin, self.inner.begin_on(conn, request))
            .await
    }
    async fn complete_on(
        &self,
        conn: &mut C,
        claim: &Claim,
        outcome: &Outcome,
    ) -> Result<(), Error> {
        self.through(
            Point::Complete,
            self.inner.complete_on(conn, claim, outcome),
        )
        .await
    }
    async fn release_on(&self, conn: &mut C, claim: &Claim) -> Result<(), Error> {
        self.through(Point::Release, self.inner.release_on(conn, claim))
            .await
    }
    fn in_transaction(&self, conn: &mut C) -> bool {
        self.inner.in_transaction(conn)
    }
}

#[derive(Debug, Serialize, Deserialize)]
enum TestError {
    Idem(String, bool),
    /// The body's first run fails on purpose, so the release is exercised.
    Transient,
}

impl From<Error> for TestError {
    fn from(e: Error) -> Self {
        TestError::Idem(e.to_string(), e.is_retryable())
    }
}

/// What the two clients saw.
#[derive(Default)]
struct Seen {
    ok_runs: Vec<u64>,
    answers: Vec<u64>,
}

/// One point of the matrix on one store: two clients, one key.
async fn one_point<S: Store + Clone + 'static>(store: S, point: Point, kind: Kind, tag: &str) {
    let store = Arc::new(Faulty::new(store, point, kind));
    let key = format!(
        "fault-{tag}-{point:?}-{kind:?}-{}-{}",
        std::process::id(),
        SystemTime::now()
            .duration_since(UNIX_EPOCH)
            .unwrap()
            .as_millis()
    );
    let runs = Arc::new(AtomicUsize::new(0));
    let seen = Arc::new(Mutex::new(Seen::default()));
    // The release is only on the path of a body that fails.
    let fail_first = point == Point::Release;
    let started = Instant::now();
    let client = |delay: Duration, payload: u64| {
        let (store, runs, seen, key) = (store.clone(), runs.clone(), seen.clone(), key.clone());
        async move {
            tokio::time::sleep(delay).await;
            let policy = Policy::new().lease(LEASE).wait(Duration::from_secs(10));
            loop {
                let result = run(
                    &*store,
                    Call::new("faults.charge", key.as_str(), &payload).with_policy(policy),
                    async {
                        let n = runs.fetch_add(1, Ordering::SeqCst) as u64 + 1;
                        tokio::time::sleep(BODY).await;
                        if fail_first && n == 1 {
                            return Err(TestError::Transient);
                        }
                        seen.lock().unwrap().ok_runs.push(n * 1000 + payload);
                        Ok::<_, TestError>(n * 1000 + payload)
                    },
                )
                .await;
                match result {
                    Ok(value) => {
                        seen.lock().unwrap().answers.push(value);
                        return;
                    }
                    Err(TestError::Transient) | Err(TestError::Idem(_, true)) => {
                        assert!(
                            started.elapsed() < LEASE * 4 + BODY * 3 + STALL * 2,
                            "{point:?} {kind:?}: the key stayed blocked"
                        );
                        tokio::time::sleep(Duration::from_millis(30)).await;
                    }
                    Err(err) => panic!("{point:?} {kind:?}: not retryable: {err:?}"),
                }
            }
        }
    };
    tokio::join!(
        client(Duration::ZERO, 7),
        client(Duration::from_millis(50), 7)
    );
    assert!(store.struck(), "{point:?} {kind:?}: the fault never struck");
    let seen = seen.lock().unwrap();
    assert_eq!(
        seen.ok_runs.len(),
        1,
        "{point:?} {kind:?}: the effect happened {} times",
        seen.ok_runs.len()
    );
    let value = seen.ok_runs[0];
    assert_eq!(value % 1000, 7, "another payload's outcome");
    assert!(
        seen.answers.iter().all(|a| *a == value),
        "{point:?} {kind:?}: answers {:?}, the run's value {value}",
        seen.answers
    );
    assert_eq!(seen.answers.len(), 2);
}

/// Every point of the matrix on stores made by `make`.
async fn matrix<S, F>(tag: &str, make: impl Fn() -> F)
where
    S: Store + Clone + 'static,
    F: std::future::Future<Output = S>,
{
    let mut points = Vec::new();
    for point in POINTS {
        for kind in KINDS {
            points.push(one_point(make().await, point, kind, tag));
        }
    }
    // All points at once: each on a key of its own.
    futures::future::join_all(points).await;
    dropped_after_the_body_returned_still_stores(make().await, tag).await;
    dropped_during_the_claim_blocks_nothing(make().await, tag).await;
    hung_completion_answers_the_caller(make().await, tag).await;
}

fn fresh(tag: &str, what: &str) -> String {
    format!(
        "{what}-{tag}-{}-{}",
        std::process::id(),
        SystemTime::now()
            .duration_since(UNIX_EPOCH)
            .unwrap()
            .as_millis()
    )
}

/// A caller dropped after its body returned, while the outcome is being
/// stored (the completion stalls): the outcome is still stored, and the
/// retry replays it.
async fn dropped_after_the_body_returned_still_stores<S: Store + Clone + 'static>(
    store: S,
    tag: &str,
) {
    let store = Faulty::new(store, Point::Complete, Kind::Stall).detachable();
    let key = fresh(tag, "dropped-saving");
    let runs = AtomicUsize::new(0);
    let call = || Call::new("faults.charge", key.as_str(), &1).with_policy(Policy::new());
    let first = tokio::time::timeout(
        Duration::from_millis(100),
        run(&store, call(), async {
            Ok::<_, Error>(runs.fetch_add(1, Ordering::SeqCst) as u64 + 1)
        }),
    )
    .await;
    assert!(
        first.is_err(),
        "{tag}: the caller was not dropped while saving"
    );
    let retry = run(&store, call(), async {
        Ok::<_, Error>(runs.fetch_add(1, Ordering::SeqCst) as u64 + 1)
    })
    .await;
    assert_eq!(
        retry.unwrap(),
        1,
        "{tag}: the retry replays the dropped caller's outcome"
    );
    assert_eq!(runs.load(Ordering::SeqCst), 1);
}

/// The completion never answers: the caller still gets its value once its
/// time in line is up, and the outcome is stored in the background, so a
/// retry replays it: the body ran once.
async fn hung_completion_answers_the_caller<S: Store + Clone + 'static>(store: S, tag: &str) {
    let store = Faulty::new(store, Point::Complete, Kind::Hang).detachable();
    let key = fresh(tag, "hung-saving");
    let runs = AtomicUsize::new(0);
    let policy = Policy::new().wait(Duration::from_secs(20));
    let call = || Call::new("faults.charge", key.as_str(), &1).with_policy(policy);
    let charge = || async { Ok::<_, Error>(runs.fetch_add(1, Ordering::SeqCst) as u64 + 1) };
    let first = tokio::time::timeout(Duration::from_secs(20), run(&store, call(), charge())).await;
    let first = first.unwrap_or_else(|_| panic!("{tag}: a hung completion kept the caller"));
    assert_eq!(first.unwrap(), 1, "{tag}: the caller gets its body's value");
    assert!(store.struck());
    let retry = run(&store, call(), charge()).await;
    assert_eq!(
        retry.unwrap(),
        1,
        "{tag}: the retry replays the stored outcome"
    );
    assert_eq!(runs.load(Ordering::SeqCst), 1);
}

/// A caller dropped while the answer to its claim is on the way (the claim
/// landed): the claim is handed back, so a retry runs long before the
/// 30 s lease.
async fn dropped_during_the_claim_blocks_nothing<S: Store + Clone + 'static>(store: S, tag: &str) {
    let store = Faulty::new(store, Point::Begin, Kind::StallReply).detachable();
    let key = fresh(tag, "dropped-claiming");
    let runs = AtomicUsize::new(0);
    let policy = Policy::new().lease(Duration::from_secs(30)).fail_fast();
    let call = || Call::new("faults.charge", key.as_str(), &1).with_policy(policy);
    let first = tokio::time::timeout(
        Duration::from_millis(100),
        run(&store, call(), async {
            Ok::<_, Error>(runs.fetch_add(1, Ordering::SeqCst) as u64 + 1)
        }),
    )
    .await;
    assert!(
        first.is_err(),
        "{tag}: the caller was not dropped while claiming"
    );
    assert!(store.struck());
    let started = Instant::now();
    let retried = loop {
        match run(&store, call(), async {
            Ok::<_, Error>(runs.fetch_add(1, Ordering::SeqCst) as u64 + 1)
        })
        .await
        {
            Err(Error::InProgress { .. }) => {
                assert!(
                    started.elapsed() < Duration::from_secs(5),
                    "{tag}: the dropped claim was never handed back"
                );
                tokio::time::sleep(Duration::from_millis(20)).await;
            }
            other => break other.unwrap(),
        }
    };
    assert_eq!(retried, 1, "the dropped caller's body never ran");
}

common::backends!(memory, sqlite_file, postgres, mysql, redis, redis_cluster => {
    #[tokio::test(flavor = "multi_thread", worker_threads = 2)]
    async fn every_fault_point() {
        let (store, _guard) = backend::store(20).await;
        matrix(backend::NAME, || async { store.clone() }).await;
    }

    backend::if_sql! {
        /// The transactional matrix: every point of the flow that runs on the
        /// caller's connection (look, claim, completion, release) and every
        /// fault kind; two clients per point retry in transactions of their
        /// own. The body writes its business row in the caller's transaction,
        /// so the effect is that row: exactly one is committed per key, and
        /// every client's answer is its value.
        #[tokio::test(flavor = "multi_thread", worker_threads = 2)]
        async fn every_transactional_fault_point() {
            transactional_fault_points(false).await;
        }

        /// The same matrix on pooled connections outside a transaction,
        /// where each statement, the claim's and the body's row's, commits
        /// at once: an outcome the connection failed to store is stored
        /// through the store, and the body runs once all the same. (A
        /// failing first run fails before it writes: its row would commit.)
        #[tokio::test(flavor = "multi_thread", worker_threads = 2)]
        async fn every_fault_point_on_a_plain_connection() {
            transactional_fault_points(true).await;
        }

        async fn transactional_fault_points(plain: bool) {
            let (store, mut guard) = backend::store(40).await;
            let pool = store.pool().clone();
            let rows = guard.table("faultrows");
            sqlx::raw_sql(&format!(
                "CREATE TABLE {rows} (run_key VARCHAR(255) NOT NULL, value BIGINT NOT NULL)"
            ))
            .execute(&pool)
            .await
            .unwrap();
            let (first, second) = (backend::param(1), backend::param(2));
            let insert = format!("INSERT INTO {rows} (run_key, value) VALUES ({first}, {second})");
            let select = format!("SELECT value FROM {rows} WHERE run_key = {first}");
            let mut points = Vec::new();
            for point in [Point::Begin, Point::Peek, Point::Complete, Point::Release] {
                for kind in KINDS {
                    // Outside a transaction, a claim whose answer was lost
                    // committed: the caller hands it back through the store.
                    let faulty = Faulty::new(store.clone(), point, kind);
                    let store = Arc::new(if plain { faulty.detachable() } else { faulty });
                    let (pool, insert) = (pool.clone(), insert.clone());
                    let key = format!("tx-{point:?}-{kind:?}-{plain}-{}", std::process::id());
                    let runs = Arc::new(AtomicUsize::new(0));
                    let fail_first = point == Point::Release;
                    let started = Instant::now();
                    let (check_pool, check_key, select) = (pool.clone(), key.clone(), select.clone());
                    let client = move |delay: Duration| {
                        let (store, pool, insert, key, runs) = (
                            store.clone(),
                            pool.clone(),
                            insert.clone(),
                            key.clone(),
                            runs.clone(),
                        );
                        async move {
                            tokio::time::sleep(delay).await;
                            loop {
                                assert!(
                                    started.elapsed() < Duration::from_secs(20),
                                    "{point:?} {kind:?}: the key stayed blocked"
                                );
                                let (mut tx, mut held) = match plain {
                                    false => (Some(pool.begin().await.unwrap()), None),
                                    true => (None, Some(pool.acquire().await.unwrap())),
                                };
                                let conn: &mut <backend::Database as sqlx::Database>::Connection =
                                    match (&mut tx, &mut held) {
                                        (Some(tx), _) => tx,
                                        (_, Some(held)) => held,
                                        _ => unreachable!(),
                                    };
                                let (insert, key2) = (insert.clone(), key.clone());
                                let runs = runs.clone();
                                let result = idem::run_in_transaction(
                                    &*store,
                                    conn,
                                    Call::new("faults.tx", key.as_str(), &7)
                                        .with_policy(Policy::new().wait(Duration::from_secs(10))),
                                    |conn| async move {
                                        let n = runs.fetch_add(1, Ordering::SeqCst) as i64 + 1;
                                        let value = n * 1000 + 7;
                                        if plain && fail_first && n == 1 {
                                            return (Err(TestError::Transient), conn);
                                        }
                                        let written = sqlx::query(&insert)
                                            .bind(&key2)
                                            .bind(value)
                                            .execute(&mut *conn)
                                            .await;
                                        let result = match written {
                                            Err(err) => Err(TestError::from(Error::store(err))),
                                            Ok(_) if fail_first && n == 1 => Err(TestError::Transient),
                                            Ok(_) => Ok(value),
                                        };
                                        (result, conn)
                                    },
                                )
                                .await;
                                match result {
                                    Ok(value) => match tx.map(|tx| tx.commit()) {
                                        None => return value,
                                        Some(commit) => match commit.await {
                                            Ok(()) => return value,
                                            Err(_) => continue,
                                        },
                                    },
                                    Err(TestError::Transient) | Err(TestError::Idem(_, true)) => {
                                        if let Some(tx) = tx {
                                            let _ = tx.rollback().await;
                                        }
                                        tokio::time::sleep(Duration::from_millis(30)).await;
                                    }
                                    Err(err) => {
                                        panic!("{point:?} {kind:?}: not retryable: {err:?}")
                                    }
                                }
                            }
                        }
                    };
                    points.push(async move {
                        let (a, b) =
                            tokio::join!(client(Duration::ZERO), client(Duration::from_millis(50)));
                        let stored: Vec<i64> = sqlx::query_scalar(&select)
                            .bind(&check_key)
                            .fetch_all(&check_pool)
                            .await
                            .unwrap();
                        assert_eq!(stored.len(), 1, "{point:?} {kind:?}: rows {stored:?}");
                        assert_eq!((a, b), (stored[0], stored[0]), "{point:?} {kind:?}");
                    });
                }
            }
            futures::future::join_all(points).await;
        }
    }
});
