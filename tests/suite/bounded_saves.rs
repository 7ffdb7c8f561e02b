//! A caller never waits for ever for its outcome to be stored.
//!
//! A store of the user's own that cannot work in the background
//! (no `Detach`, the default) and whose completions
//! keep failing: the caller gets its value (the body ran, its effect
//! happened) within the documented wait, the key stays claimed (its
//! outcome is not stored, and nothing runs the body again while the lease
//! holds), and a duplicate meanwhile is told the call is in progress.

use idem::store::{Capabilities, Wake};
use std::sync::atomic::{AtomicUsize, Ordering};
use std::sync::Arc;
use std::time::{Duration, Instant};

use async_trait::async_trait;
use idem::record::{Begin, Claim, Outcome, Record};
use idem::store::BeginRequest;
use idem::{run, Call, Error, Key, MemoryStore, Policy, Scope, Store};

/// A store of one's own, on records in memory, without `detach`: every
/// completion fails as an unreachable server's would.
struct FailingCompletions {
    records: MemoryStore,
    completions: AtomicUsize,
}

#[async_trait]
impl Store for FailingCompletions {
    async fn begin(&self, request: &BeginRequest<'_>) -> Result<Begin, Error> {
        self.records.begin(request).await
    }
    async fn peek(&self, request: &BeginRequest<'_>) -> Result<Option<Begin>, Error> {
        self.records.peek(request).await
    }
    async fn renew(&self, claim: &Claim) -> Result<(), Error> {
        self.records.renew(claim).await
    }
    async fn complete(&self, _claim: &Claim, _outcome: &Outcome) -> Result<(), Error> {
        self.completions.fetch_add(1, Ordering::SeqCst);
        Err(Error::store("connection refused"))
    }
    async fn release(&self, claim: &Claim) -> Result<(), Error> {
        self.records.release(claim).await
    }
    async fn get(&self, scope: &Scope, key: &Key) -> Result<Option<Record>, Error> {
        self.records.get(scope, key).await
    }
    async fn forget(&self, scope: &Scope, key: &Key) -> Result<bool, Error> {
        self.records.forget(scope, key).await
    }
    async fn purge_expired(&self, batch: usize) -> Result<u64, Error> {
        self.records.purge_expired(batch).await
    }
}

#[tokio::test]
async fn a_caller_gets_its_value_when_completions_keep_failing() {
    let store = Arc::new(FailingCompletions {
        records: MemoryStore::new(),
        completions: AtomicUsize::new(0),
    });
    let runs = AtomicUsize::new(0);
    let call = || {
        Call::new("bounded_saves.charge", "k1", &500).with_policy(
            Policy::new()
                .lease(Duration::from_secs(30))
                .wait(Duration::ZERO),
        )
    };
    let started = Instant::now();
    let first = tokio::time::timeout(
        Duration::from_secs(20),
        run(&*store, call(), async {
            runs.fetch_add(1, Ordering::SeqCst);
            Ok::<_, Error>("ch_1".to_owned())
        }),
    )
    .await
    .expect("the caller was kept waiting for a completion that keeps failing");
    let waited = started.elapsed();
    assert_eq!(first.unwrap(), "ch_1", "the effect happened: the value");
    assert!(
        waited < Duration::from_secs(5),
        "the documented wait is about two seconds; it took {waited:?}"
    );
    assert!(store.completions.load(Ordering::SeqCst) >= 2, "tried again");
    // Not stored, so the key stays claimed while its lease holds: a
    // duplicate does not run the body again.
    let record = store
        .get(
            &Scope::new("bounded_saves.charge"),
            &Key::new("k1").unwrap(),
        )
        .await
        .unwrap()
        .expect("the claim stays");
    assert_eq!(record.state, idem::record::State::InProgress);
    let duplicate = run(&*store, call(), async {
        runs.fetch_add(1, Ordering::SeqCst);
        Ok::<_, Error>("ch_2".to_owned())
    })
    .await;
    assert!(
        matches!(duplicate, Err(Error::InProgress { .. })),
        "{duplicate:?}"
    );
    assert_eq!(runs.load(Ordering::SeqCst), 1);
}

/// A store of one's own, without `detach`, whose server first refuses
/// completions (each refusal takes [`REFUSAL_TAKES`]) and then, from
/// [`HANGS_FROM`] after its first completion, stops answering them at
/// all, as a connection that is cut without a reset.
struct RefusesThenHangs {
    records: MemoryStore,
    first: std::sync::Mutex<Option<Instant>>,
}

/// How long a refused completion takes.
const REFUSAL_TAKES: Duration = Duration::from_millis(50);
/// When, after the first completion, completions stop being answered.
const HANGS_FROM: Duration = Duration::from_millis(1900);

#[async_trait]
impl Store for RefusesThenHangs {
    async fn begin(&self, request: &BeginRequest<'_>) -> Result<Begin, Error> {
        self.records.begin(request).await
    }
    async fn peek(&self, request: &BeginRequest<'_>) -> Result<Option<Begin>, Error> {
        self.records.peek(request).await
    }
    async fn renew(&self, claim: &Claim) -> Result<(), Error> {
        self.records.renew(claim).await
    }
    async fn complete(&self, _claim: &Claim, _outcome: &Outcome) -> Result<(), Error> {
        let first = *self.first.lock().unwrap().get_or_insert_with(Instant::now);
        if first.elapsed() >= HANGS_FROM {
            std::future::pending::<()>().await;
        }
        tokio::time::sleep(REFUSAL_TAKES).await;
        Err(Error::store("connection refused"))
    }
    async fn release(&self, claim: &Claim) -> Result<(), Error> {
        self.records.release(claim).await
    }
    async fn get(&self, scope: &Scope, key: &Key) -> Result<Option<Record>, Error> {
        self.records.get(scope, key).await
    }
    async fn forget(&self, scope: &Scope, key: &Key) -> Result<bool, Error> {
        self.records.forget(scope, key).await
    }
    async fn purge_expired(&self, batch: usize) -> Result<u64, Error> {
        self.records.purge_expired(batch).await
    }
}

/// The caller's wait is two seconds, whatever the store does meanwhile:
/// the pause between two tries is cut short at the end of the wait (not
/// taken whole, up to a second past it), and no completion is sent once
/// the wait is over (one sent then would keep the caller as long as the
/// store does not answer: here, for ever).
#[tokio::test]
async fn the_wait_ends_on_time_when_the_store_stops_answering() {
    let store = RefusesThenHangs {
        records: MemoryStore::new(),
        first: std::sync::Mutex::new(None),
    };
    let call = Call::new("bounded_saves.hangs", "k1", &500).with_policy(
        Policy::new()
            .lease(Duration::from_secs(30))
            .wait(Duration::ZERO),
    );
    let started = Instant::now();
    let first = tokio::time::timeout(
        Duration::from_secs(20),
        run(&store, call, async { Ok::<_, Error>("ch_1".to_owned()) }),
    )
    .await
    .expect("the caller was kept waiting on a completion sent after its wait was over");
    let waited = started.elapsed();
    assert_eq!(first.unwrap(), "ch_1");
    assert!(
        waited < Duration::from_millis(2400),
        "the documented wait is two seconds; it took {waited:?}"
    );
}

/// A store whose reads stop being answered once a claim found the key in
/// progress, as a primary killed in a failover while a duplicate waits on
/// it (found by `simulation::redis_failover`, seed 24: a wait of 221 ms
/// took 9.4 s).
struct SilentOnceWaiting {
    records: MemoryStore,
    silent: std::sync::atomic::AtomicBool,
}

impl SilentOnceWaiting {
    async fn answers(&self) {
        if self.silent.load(Ordering::SeqCst) {
            std::future::pending::<()>().await;
        }
    }
}

#[async_trait]
impl Store for SilentOnceWaiting {
    async fn begin(&self, request: &BeginRequest<'_>) -> Result<Begin, Error> {
        let answer = self.records.begin(request).await;
        if matches!(answer, Ok(Begin::InProgress { .. })) {
            self.silent.store(true, Ordering::SeqCst);
        }
        answer
    }
    async fn peek(&self, request: &BeginRequest<'_>) -> Result<Option<Begin>, Error> {
        self.answers().await;
        self.records.peek(request).await
    }
    async fn renew(&self, claim: &Claim) -> Result<(), Error> {
        self.records.renew(claim).await
    }
    async fn complete(&self, claim: &Claim, outcome: &Outcome) -> Result<(), Error> {
        self.records.complete(claim, outcome).await
    }
    async fn release(&self, claim: &Claim) -> Result<(), Error> {
        self.records.release(claim).await
    }
    async fn get(&self, scope: &Scope, key: &Key) -> Result<Option<Record>, Error> {
        self.records.get(scope, key).await
    }
    async fn forget(&self, scope: &Scope, key: &Key) -> Result<bool, Error> {
        self.records.forget(scope, key).await
    }
    async fn purge_expired(&self, batch: usize) -> Result<u64, Error> {
        self.records.purge_expired(batch).await
    }
    fn capabilities(&self) -> Capabilities<'_> {
        Capabilities::default().with_wake(self)
    }
}

#[async_trait]
impl Wake for SilentOnceWaiting {
    async fn wait_for_change(
        &self,
        scope: &Scope,
        key: &Key,
        timeout: Duration,
    ) -> Result<(), Error> {
        self.answers().await;
        self.records
            .capabilities()
            .waker()
            .wait_for_change(scope, key, timeout)
            .await
    }
}

/// A duplicate that waits (300 ms) on a store that stops answering its
/// reads is told `InProgress` when its wait is over, not kept for as long
/// as the store is silent.
#[tokio::test]
async fn a_waiting_duplicate_keeps_its_bound_when_the_store_goes_silent() {
    let store = Arc::new(SilentOnceWaiting {
        records: MemoryStore::new(),
        silent: Default::default(),
    });
    let call = |wait| {
        Call::new("bounded_saves.silent", "k1", &500)
            .with_policy(Policy::new().lease(Duration::from_secs(30)).wait(wait))
    };
    let holding = Arc::new(tokio::sync::Notify::new());
    let release = Arc::new(tokio::sync::Notify::new());
    let owner = {
        let (store, holding, release) = (store.clone(), holding.clone(), release.clone());
        tokio::spawn(async move {
            run(&*store, call(Duration::ZERO), async move {
                holding.notify_one();
                release.notified().await;
                Ok::<_, Error>("ch_1".to_owned())
            })
            .await
        })
    };
    holding.notified().await;
    let started = Instant::now();
    let duplicate = tokio::time::timeout(
        Duration::from_secs(10),
        run(&*store, call(Duration::from_millis(300)), async {
            Ok::<_, Error>("ch_2".to_owned())
        }),
    )
    .await
    .expect("the duplicate was kept waiting on a store that does not answer");
    let waited = started.elapsed();
    assert!(
        matches!(duplicate, Err(Error::InProgress { .. })),
        "{duplicate:?}"
    );
    assert!(waited < Duration::from_millis(1000), "waited {waited:?}");
    store.silent.store(false, Ordering::SeqCst);
    release.notify_one();
    assert_eq!(owner.await.unwrap().unwrap(), "ch_1");
}
