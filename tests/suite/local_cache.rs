//! The local replay cache (`CachedStore`): it replays from memory only
//! what the store would replay, and never an expired record, another
//! payload's outcome, or an outcome that a later claim replaced; and a
//! caller dropped in front of it hands its claim back through the cache,
//! its durable steps kept.

use crate::common;

use std::sync::atomic::{AtomicUsize, Ordering};
use std::sync::Arc;
use std::time::Duration;

use async_trait::async_trait;
use common::{journal_of, Runs};
use idem::journal::StepState;
use idem::record::{Begin, Claim, Outcome, Record};
use idem::steps::step;
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

/// A checkout through a cached store: one durable step, `charge`, whose
/// output is the number of its run; then the body waits `then` and
/// answers the charge.
async fn checkout<S: Store>(
    store: &CachedStore<S>,
    key: &str,
    charges: &AtomicUsize,
    then: Duration,
) -> Result<usize, Error> {
    let policy = Policy::new()
        .lease(Duration::from_secs(30))
        .wait(Duration::from_secs(10));
    run(
        store,
        Call::new("local_cache.checkout", key, &12u32).with_policy(policy),
        async move {
            let charged: usize = step("charge", |_key| async move {
                Ok::<_, Error>(charges.fetch_add(1, Ordering::SeqCst) + 1)
            })
            .await?;
            tokio::time::sleep(then).await;
            Ok(charged)
        },
    )
    .await
}

/// The journal of `key`'s checkout, as (seq, name, state).
async fn checkout_steps<S: Store>(
    store: &CachedStore<S>,
    key: &str,
) -> Vec<(u32, String, StepState)> {
    journal_of(store)
        .steps(&Scope::new("local_cache.checkout"), &Key::new(key).unwrap())
        .await
        .unwrap()
        .into_iter()
        .map(|entry| (entry.seq, entry.name, entry.state))
        .collect()
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

    /// A caller dropped while its body runs, after its durable step was
    /// journaled: the cache's background handle hands its claim back at
    /// once (well within the 30 s lease), and the retry replays the
    /// step's output (that of its first run) instead of running it
    /// again. The retry's outcome is then cached and replayed.
    #[tokio::test(flavor = "multi_thread", worker_threads = 2)]
    async fn a_dropped_caller_hands_back_and_its_step_replays() {
        let (inner, _guard) = backend::store(4).await;
        let store = CachedStore::new(inner, 100).unwrap();
        let key = common::fresh("dropped");
        let charges = AtomicUsize::new(0);
        // Boxed, so that dropping it drops the call.
        let mut slow = Box::pin(checkout(&store, &key, &charges, Duration::from_secs(60)));
        let journaled = tokio::time::timeout(Duration::from_secs(10), async {
            loop {
                tokio::select! {
                    ended = &mut slow => panic!("the slow body finished: {ended:?}"),
                    _ = tokio::time::sleep(Duration::from_millis(10)) => {}
                }
                let steps = checkout_steps(&store, &key).await;
                if steps == [(0, "charge".to_owned(), StepState::Completed)] {
                    return;
                }
            }
        })
        .await;
        assert!(journaled.is_ok(), "the step was never journaled");
        assert_eq!(charges.load(Ordering::SeqCst), 1);
        assert_eq!(store.cached(), 0);

        // The caller goes away; its claim is handed back.
        let dropped_at = tokio::time::Instant::now();
        drop(slow);
        let scope = Scope::new("local_cache.checkout");
        let record_key = Key::new(key.as_str()).unwrap();
        while store.get(&scope, &record_key).await.unwrap().is_some() {
            assert!(
                dropped_at.elapsed() < Duration::from_secs(10),
                "the dropped caller's claim was never handed back"
            );
            tokio::time::sleep(Duration::from_millis(10)).await;
        }

        // The retry replays the step: the charge of the first run.
        let retried = checkout(&store, &key, &charges, Duration::ZERO).await;
        assert_eq!(retried.unwrap(), 1);
        assert_eq!(charges.load(Ordering::SeqCst), 1, "the step ran again");
        assert_eq!(
            checkout_steps(&store, &key).await,
            [(0, "charge".to_owned(), StepState::Completed)]
        );
        assert_eq!(store.cached(), 1);
        let replayed = checkout(&store, &key, &charges, Duration::ZERO).await;
        assert_eq!(replayed.unwrap(), 1);
        assert_eq!(charges.load(Ordering::SeqCst), 1);
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
