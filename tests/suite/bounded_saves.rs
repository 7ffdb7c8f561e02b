//! A caller never waits for ever for its outcome to be stored.
//!
//! A store of the user's own that cannot work in the background
//! (`Store::detach` answers `None`, the default) and whose completions
//! keep failing: the caller gets its value (the body ran, its effect
//! happened) within the documented wait, the key stays claimed (its
//! outcome is not stored, and nothing runs the body again while the lease
//! holds), and a duplicate meanwhile is told the call is in progress.

use std::sync::atomic::{AtomicUsize, Ordering};
use std::sync::Arc;
use std::time::{Duration, Instant};

use async_trait::async_trait;
use idem::{
    run, Begin, BeginRequest, Call, Claim, Error, Key, MemoryStore, Outcome, Policy, Record, Scope,
    Store,
};

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
    assert_eq!(record.state, idem::State::InProgress);
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
