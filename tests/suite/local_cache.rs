//! The local replay cache (`CachedStore`): it replays from memory only
//! what the store would replay, and never an expired record, another
//! payload's outcome, or an outcome that a later claim replaced.

use crate::common;

use std::sync::atomic::{AtomicUsize, Ordering};
use std::sync::Arc;
use std::time::Duration;

use async_trait::async_trait;
use common::Runs;
use idem::record::{Begin, Claim, Outcome, Record};
use idem::store::BeginRequest;
use idem::{run, CachedStore, Call, Error, Key, MemoryStore, Policy, Scope, Store};
use tokio::sync::{oneshot, Mutex};

pub(crate) const SCOPE: &str = "local_cache.charge";

/// One charge of `amount` under `key`: the body counts its run and
/// answers its number.
pub(crate) async fn charge(
    store: &dyn Store,
    key: &str,
    amount: u32,
    policy: Policy,
    runs: &Runs,
) -> Result<usize, Error> {
    run(
        store,
        Call::new(SCOPE, key, &amount).with_policy(policy),
        async { Ok(runs.next()) },
    )
    .await
}

/// A real store that counts the claims reaching it, and can hold a
/// completion's answer (after the store wrote it) until told to go on.
struct Watched<S> {
    inner: S,
    begins: AtomicUsize,
    /// The next completion fails before reaching the store.
    fail_completion: std::sync::atomic::AtomicBool,
    hold_completion: Mutex<Option<(oneshot::Sender<()>, oneshot::Receiver<()>)>>,
}

impl<S> Watched<S> {
    fn new(inner: S) -> Self {
        Watched {
            inner,
            begins: AtomicUsize::new(0),
            fail_completion: Default::default(),
            hold_completion: Mutex::new(None),
        }
    }
}

#[async_trait]
impl<S: Store> Store for Watched<S> {
    async fn begin(&self, request: &BeginRequest<'_>) -> Result<Begin, Error> {
        self.begins.fetch_add(1, Ordering::SeqCst);
        self.inner.begin(request).await
    }
    async fn peek(&self, request: &BeginRequest<'_>) -> Result<Option<Begin>, Error> {
        self.inner.peek(request).await
    }
    async fn renew(&self, claim: &Claim) -> Result<(), Error> {
        self.inner.renew(claim).await
    }
    async fn complete(&self, claim: &Claim, outcome: &Outcome) -> Result<(), Error> {
        if self.fail_completion.swap(false, Ordering::SeqCst) {
            return Err(Error::store("injected: the completion failed"));
        }
        let completed = self.inner.complete(claim, outcome).await;
        if let Some((written, go_on)) = self.hold_completion.lock().await.take() {
            let _ = written.send(());
            let _ = go_on.await;
        }
        completed
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

fn cached<S: Store>(inner: S) -> CachedStore<Watched<S>> {
    CachedStore::new(Watched::new(inner), 100).unwrap()
}

fn begins<S>(store: &CachedStore<Watched<S>>) -> usize {
    store.inner().begins.load(Ordering::SeqCst)
}

common::backends!(memory, sqlite_file, postgres, mysql => {
    /// A retry of a call this process completed is answered from memory:
    /// the store sees no second claim, and the answer is the first one.
    #[tokio::test]
    async fn a_replay_is_answered_from_memory() {
        let (inner, _guard) = backend::store(4).await;
        let store = cached(inner);
        let runs = Runs::default();
        let policy = Policy::new();
        assert_eq!(charge(&store, "k", 5, policy, &runs).await.unwrap(), 1);
        assert_eq!(begins(&store), 1);
        for _ in 0..3 {
            assert_eq!(charge(&store, "k", 5, policy, &runs).await.unwrap(), 1);
        }
        assert_eq!((runs.count(), begins(&store)), (1, 1));
        assert_eq!(store.cached(), 1);
    }

    /// An entry expires no later than the record: once the TTL is over,
    /// the call runs again, as the store says.
    #[tokio::test]
    async fn an_expired_record_is_not_replayed() {
        let (inner, _guard) = backend::store(4).await;
        let store = cached(inner);
        let runs = Runs::default();
        let policy = Policy::new().ttl(Duration::from_millis(400));
        assert_eq!(charge(&store, "k", 5, policy, &runs).await.unwrap(), 1);
        assert_eq!(charge(&store, "k", 5, policy, &runs).await.unwrap(), 1);
        tokio::time::sleep(Duration::from_millis(600)).await;
        assert_eq!(charge(&store, "k", 5, policy, &runs).await.unwrap(), 2);
    }

    /// The same key with another payload is the store's to answer: key
    /// reused, not the cached outcome.
    #[tokio::test]
    async fn another_payload_is_not_replayed() {
        let (inner, _guard) = backend::store(4).await;
        let store = cached(inner);
        let runs = Runs::default();
        let policy = Policy::new();
        assert_eq!(charge(&store, "k", 5, policy, &runs).await.unwrap(), 1);
        let other = charge(&store, "k", 6, policy, &runs).await;
        assert!(matches!(other, Err(Error::KeyReused)), "{other:?}");
        assert_eq!((runs.count(), begins(&store)), (1, 2));
    }

    /// A forgotten key runs again, and the new outcome is the one replayed
    /// after it.
    #[tokio::test]
    async fn a_forgotten_outcome_is_not_replayed() {
        let (inner, _guard) = backend::store(4).await;
        let store = cached(inner);
        let runs = Runs::default();
        let policy = Policy::new();
        assert_eq!(charge(&store, "k", 5, policy, &runs).await.unwrap(), 1);
        let key = Key::new("k").unwrap();
        assert!(store.forget(&Scope::new(SCOPE), &key).await.unwrap());
        assert_eq!(store.cached(), 0);
        assert_eq!(charge(&store, "k", 5, policy, &runs).await.unwrap(), 2);
        assert_eq!(charge(&store, "k", 5, policy, &runs).await.unwrap(), 2);
        assert_eq!(runs.count(), 2);
    }
});

/// The interleaving that would break a naive cache: the completion is
/// written to the store, the key is forgotten and claimed again while the
/// completion's answer is still on its way, and only then would the old
/// outcome be cached. It is not: the next call runs, and gets its own.
#[tokio::test]
async fn a_forget_overtaking_a_completion_leaves_nothing_cached() {
    let store = Arc::new(cached(MemoryStore::new()));
    let runs = Runs::default();
    let (written_tx, written) = oneshot::channel();
    let (go_on, go_on_rx) = oneshot::channel();
    *store.inner().hold_completion.lock().await = Some((written_tx, go_on_rx));
    let first = {
        let (store, runs) = (store.clone(), runs.clone());
        tokio::spawn(async move { charge(&*store, "k", 5, Policy::new(), &runs).await })
    };
    written.await.unwrap();
    let key = Key::new("k").unwrap();
    assert!(store.forget(&Scope::new(SCOPE), &key).await.unwrap());
    go_on.send(()).unwrap();
    assert_eq!(first.await.unwrap().unwrap(), 1);
    assert_eq!(store.cached(), 0, "the forgotten outcome was cached");
    assert_eq!(
        charge(&*store, "k", 5, Policy::new(), &runs).await.unwrap(),
        2
    );
}

/// A completion that failed and was sent again still caches its outcome.
#[tokio::test]
async fn a_completion_sent_again_is_cached() {
    let store = cached(MemoryStore::new());
    store.inner().fail_completion.store(true, Ordering::SeqCst);
    let runs = Runs::default();
    assert_eq!(
        charge(&store, "k", 5, Policy::new(), &runs).await.unwrap(),
        1
    );
    assert!(
        !store.inner().fail_completion.load(Ordering::SeqCst),
        "no completion failed"
    );
    assert_eq!(store.cached(), 1);
    assert_eq!(
        charge(&store, "k", 5, Policy::new(), &runs).await.unwrap(),
        1
    );
    assert_eq!((runs.count(), begins(&store)), (1, 1));
}

/// A capacity of 0 is refused with a typed error.
#[test]
fn a_cache_of_nothing_is_refused() {
    let refused = CachedStore::new(MemoryStore::new(), 0);
    assert!(matches!(refused, Err(Error::Config(_))), "{refused:?}");
}
