//! A live owner's lease holds while it still works on the call, whatever
//! one slow or failing statement does, so that a waiting duplicate
//! replays the owner's outcome instead of running the body again: the
//! lease is renewed while the outcome is on its way to the store (slow,
//! or failing again and again), and a renewal that stalls does not stop
//! the next. Each case ran the body twice on every store before.

use crate::common;
use idem::store::{Capabilities, Detach, Wake};

use std::sync::atomic::{AtomicUsize, Ordering};
use std::sync::Arc;
use std::time::Duration;

use async_trait::async_trait;
use common::Runs;
use idem::record::{Begin, Claim, Outcome, Record};
use idem::store::BeginRequest;
use idem::{run, Call, Error, Key, Policy, Scope, Store};
use tokio::sync::oneshot;

const SCOPE: &str = "lease_upkeep.charge";
const LEASE: Duration = Duration::from_millis(300);

/// What the wrapped store does wrong, once set up.
#[derive(Clone, Copy, Debug, Default)]
struct Fault {
    /// The first `complete_fails` completions fail at once (a transient
    /// error: a deadlock victim, a serialization failure, a reset
    /// connection), before reaching the store. Renewals work.
    complete_fails: usize,
    /// The first completion is delayed this long on its way to the store
    /// (a slow or stalled connection), then lands. Renewals work.
    complete_stall: Option<Duration>,
    /// The first renewal is delayed this long on its way to the store (a
    /// stalled connection), then is sent. Other renewals work.
    renew_stall: Option<Duration>,
}

/// A real store with one statement misbehaving as `fault` says. Clones
/// share the fault.
#[derive(Clone)]
struct Slow<S> {
    inner: S,
    fault: Fault,
    completes: Arc<AtomicUsize>,
    renews: Arc<AtomicUsize>,
}

impl<S> Slow<S> {
    fn new(inner: S, fault: Fault) -> Self {
        Slow {
            inner,
            fault,
            completes: Arc::default(),
            renews: Arc::default(),
        }
    }
}

#[async_trait]
impl<S: Store + Clone + 'static> Store for Slow<S> {
    async fn begin(&self, request: &BeginRequest<'_>) -> Result<Begin, Error> {
        self.inner.begin(request).await
    }
    async fn peek(&self, request: &BeginRequest<'_>) -> Result<Option<Begin>, Error> {
        self.inner.peek(request).await
    }
    async fn renew(&self, claim: &Claim) -> Result<(), Error> {
        let n = self.renews.fetch_add(1, Ordering::SeqCst);
        if let (0, Some(stall)) = (n, self.fault.renew_stall) {
            tokio::time::sleep(stall).await;
        }
        self.inner.renew(claim).await
    }
    async fn complete(&self, claim: &Claim, outcome: &Outcome) -> Result<(), Error> {
        let n = self.completes.fetch_add(1, Ordering::SeqCst);
        if n < self.fault.complete_fails {
            return Err(Error::store("injected: the completion failed (transient)"));
        }
        if let (0, Some(stall)) = (n, self.fault.complete_stall) {
            tokio::time::sleep(stall).await;
        }
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
    fn capabilities(&self) -> Capabilities<'_> {
        Capabilities::default().with_wake(self).with_detach(self)
    }
}

#[async_trait]
impl<S: Store + Clone + 'static> Wake for Slow<S> {
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
    fn wakes_across_processes(&self) -> bool {
        self.inner.capabilities().waker().wakes_across_processes()
    }
}

impl<S: Store + Clone + 'static> Detach for Slow<S> {
    fn detach(&self) -> Option<Arc<dyn Store>> {
        Some(Arc::new(self.clone()))
    }
}

/// A (on the faulty store) claims and runs a body that takes `body`; B
/// (same key and payload, on the plain store, as another process) arrives
/// as A's body starts and waits up to 20 s. Expected: A's body runs once,
/// A gets its value and B replays it.
async fn owner_keeps_its_claim<S>(store: S, fault: Fault, body: Duration)
where
    S: Store + Clone + 'static,
{
    let b_store = store.clone();
    let a_store = Slow::new(store, fault);
    let policy = Policy::new().lease(LEASE).wait(Duration::from_secs(20));
    let runs = Runs::default();
    let (started, started_rx) = oneshot::channel::<()>();
    let a = {
        let runs = runs.clone();
        tokio::spawn(async move {
            run(
                &a_store,
                Call::new(SCOPE, "k", &5u32).with_policy(policy),
                async move {
                    let n = runs.next();
                    let _ = started.send(());
                    tokio::time::sleep(body).await;
                    Ok::<_, Error>(n)
                },
            )
            .await
        })
    };
    started_rx.await.expect("A's body starts");
    let b = run(
        &b_store,
        Call::new(SCOPE, "k", &5u32).with_policy(policy),
        async { Ok::<_, Error>(runs.next()) },
    )
    .await;
    let a = a.await.unwrap();
    assert_eq!(
        runs.count(),
        1,
        "the body ran {} times (A: {a:?}, B: {b:?})",
        runs.count()
    );
    assert_eq!(a.as_ref().ok(), Some(&1), "A gets its own run: {a:?}");
    assert_eq!(b.as_ref().ok(), Some(&1), "B replays A's outcome: {b:?}");
}

common::backends!(memory, sqlite_file, postgres, mysql, redis => {
    /// Interleaving: A's body returns; every completion A sends
    /// fails at once (8 in a row, transient), every renewal succeeds.
    /// Before, `save_patiently` renewed only after each pause, and the
    /// pause doubles up to `MAX_SAVE_PAUSE` (1 s) whatever the lease: after
    /// the 640 ms pause, A's 300 ms lease had lapsed for 340 ms though no
    /// renewal failed; B took the key over and ran the body a second time.
    #[tokio::test(flavor = "multi_thread", worker_threads = 4)]
    async fn failing_completions_do_not_let_a_live_lease_lapse() {
        let (store, _guard) = backend::store(8).await;
        let fault = Fault { complete_fails: 8, ..Fault::default() };
        owner_keeps_its_claim(store, fault, Duration::from_millis(50)).await;
    }

    /// Interleaving: A's body returns; its first completion is
    /// slow on its way (900 ms, three leases, well inside `SAVE_IN_LINE`)
    /// and then lands. Before, nothing renewed A's lease while the
    /// completion was in flight (`renewing` stopped with the body), so the
    /// lease lapsed and B took the key over and ran the body again.
    #[tokio::test(flavor = "multi_thread", worker_threads = 4)]
    async fn a_slow_completion_does_not_let_a_live_lease_lapse() {
        let (store, _guard) = backend::store(8).await;
        let fault = Fault { complete_stall: Some(LEASE * 3), ..Fault::default() };
        owner_keeps_its_claim(store, fault, Duration::from_millis(50)).await;
    }

    /// Interleaving: A's body runs for four leases; its first
    /// renewal (a third of a lease in) stalls on its connection for three
    /// leases. Before, `keep_renewed` awaited that one renewal unbounded
    /// and sent no other, so A's lease lapsed while its body still ran and
    /// B ran the body concurrently (with a connection that never answers,
    /// a half-open TCP connection, for any lease).
    #[tokio::test(flavor = "multi_thread", worker_threads = 4)]
    async fn a_stalled_renewal_does_not_let_a_live_lease_lapse() {
        let (store, _guard) = backend::store(8).await;
        let fault = Fault { renew_stall: Some(LEASE * 3), ..Fault::default() };
        owner_keeps_its_claim(store, fault, LEASE * 4).await;
    }
});

/// A lease or a ttl so long that no deadline can be computed from it
/// (`Duration::MAX`) is refused as a configuration error before anything
/// runs, instead of overflowing (a panic in the task that hands a dropped
/// caller's claim back); a century is accepted, and a dropped caller's
/// claim under it is handed back so that the next call runs.
#[tokio::test]
async fn spans_no_deadline_fits_are_refused() {
    let store = idem::MemoryStore::new();
    let century = Duration::from_secs(100 * 365 * 86_400);
    for policy in [
        Policy::new().lease(Duration::MAX),
        Policy::new().ttl(Duration::MAX),
        Policy::new().lease(century + Duration::from_secs(86_400)),
    ] {
        let runs = AtomicUsize::new(0);
        let call = Call::new("lease_upkeep.bounds", "k-max", &1).with_policy(policy);
        let result = run(&store, call, async {
            runs.fetch_add(1, Ordering::SeqCst);
            Ok::<_, Error>(1)
        })
        .await;
        assert!(
            matches!(&result, Err(Error::Config(m)) if m.contains("at most")),
            "{result:?}"
        );
        assert_eq!(runs.load(Ordering::SeqCst), 0);
    }
    let long = || Policy::new().lease(century).ttl(century);
    let dropped = run(
        &store,
        Call::new("lease_upkeep.bounds", "k-century", &1).with_policy(long()),
        std::future::pending::<Result<u8, Error>>(),
    );
    assert!(tokio::time::timeout(Duration::from_millis(20), dropped)
        .await
        .is_err());
    let next = run(
        &store,
        Call::new("lease_upkeep.bounds", "k-century", &1).with_policy(long()),
        async { Ok::<_, Error>(2) },
    );
    assert_eq!(
        tokio::time::timeout(Duration::from_secs(5), next)
            .await
            .unwrap()
            .unwrap(),
        2
    );
}
