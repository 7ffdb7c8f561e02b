//! A waiting duplicate is never handed the outcome of a request with
//! another payload.
//!
//! A duplicate's claim finds the key held by claim T1 (its own payload);
//! it then waits (`Wake::wait_for_outcome`), and its look says which
//! claim holds the key now. If T1 was released meanwhile and a request
//! with another payload claimed the key (T2), T2's completion is not the
//! waiter's answer: a read of the record says `KeyReused`, and so must
//! the waiter. The look takes a claim of another payload for no holder
//! (the waiter reads the record), on every store.

use crate::common;
use idem::store::{Capabilities, Wake};

use std::sync::Arc;
use std::time::Duration;

use async_trait::async_trait;
use idem::record::{Begin, Claim, ClaimToken, Outcome, OutcomeKind, Record};
use idem::store::BeginRequest;
use idem::{run, Call, Error, Fingerprint, Key, Policy, Scope, Store};
use tokio::sync::{oneshot, Mutex};

const SCOPE: &str = "waiter_payloads.charge";

/// A body's error, or the library's.
#[derive(Debug)]
enum Fail {
    Idem(Error),
    Body,
}

impl From<Error> for Fail {
    fn from(err: Error) -> Self {
        Fail::Idem(err)
    }
}

fn request<'a>(scope: &'a Scope, key: &'a Key, fingerprint: &'a Fingerprint) -> BeginRequest<'a> {
    BeginRequest {
        scope,
        key,
        fingerprint,
        token: ClaimToken::new(),
        lease: Duration::from_secs(30),
        ttl: Duration::from_secs(600),
    }
}

fn claimed(answer: Begin) -> Claim {
    match answer {
        Begin::Claimed(claim) => claim,
        other => panic!("expected a claim, got {other:?}"),
    }
}

/// The store-level interleaving, step by step: what `wait_out` does for a
/// duplicate (its claim found the key in progress, then it waits).
async fn waiter_handed_other_payloads_outcome<S: Store + 'static>(store: S) {
    let store = Arc::new(store);
    let scope = Scope::new(SCOPE);
    let key = Key::new("k-store").unwrap();
    let (fp_a, fp_b) = (Fingerprint::of(&1).unwrap(), Fingerprint::of(&2).unwrap());

    // T1 (payload A) holds the key.
    let t1 = claimed(store.begin(&request(&scope, &key, &fp_a)).await.unwrap());
    // The duplicate W (payload A) finds it in progress.
    let w = request(&scope, &key, &fp_a);
    let w_token = w.token;
    let answer = store.begin(&w).await.unwrap();
    assert!(matches!(answer, Begin::InProgress { .. }), "{answer:?}");
    // Before W starts to wait: T1 is released, and T2 (payload B)
    // claims the free key.
    store.release(&t1).await.unwrap();
    let t2 = claimed(store.begin(&request(&scope, &key, &fp_b)).await.unwrap());

    // W waits, as `wait_out` does right after its claim.
    let waiter = {
        let (store, scope, key, fp_a) = (store.clone(), scope.clone(), key.clone(), fp_a);
        tokio::spawn(async move {
            let w = BeginRequest {
                token: w_token,
                ..request(&scope, &key, &fp_a)
            };
            store
                .capabilities()
                .waker()
                .wait_for_outcome(&w, Duration::from_secs(10))
                .await
        })
    };
    tokio::time::sleep(Duration::from_millis(100)).await;
    let outcome_b = Outcome {
        kind: OutcomeKind::Ok,
        body: b"\"payload B's outcome\"".to_vec(),
    };
    store.complete(&t2, &outcome_b).await.unwrap();
    let handed = tokio::time::timeout(Duration::from_secs(15), waiter)
        .await
        .expect("the waiter returned")
        .unwrap()
        .unwrap();
    // What a read of the record answers W now.
    let read = store.peek(&request(&scope, &key, &fp_a)).await.unwrap();
    assert!(matches!(read, Some(Begin::KeyReused)), "{read:?}");
    assert!(
        !matches!(handed, Some(Begin::Replay(_))),
        "a waiter with payload A was handed payload B's outcome: {handed:?}"
    );
}

/// A real store whose `wait_for_outcome` pauses on entry, once the
/// duplicate's pause reached the longest poll, until the test says go: the
/// duplicate descheduled between its last read (`InProgress`, its own
/// payload) and its wait.
struct PausedWait<S> {
    inner: S,
    pause: Mutex<Option<(oneshot::Sender<()>, oneshot::Receiver<()>)>>,
}

#[async_trait]
impl<S: Store> Store for PausedWait<S> {
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
        Capabilities::default().with_wake(self)
    }
}

#[async_trait]
impl<S: Store> Wake for PausedWait<S> {
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
    async fn wait_for_outcome(
        &self,
        request: &BeginRequest<'_>,
        timeout: Duration,
    ) -> Result<Option<Begin>, Error> {
        // The duplicate has waited a while: its pause is the longest poll.
        let paused = if timeout >= Duration::from_millis(20) {
            self.pause.lock().await.take()
        } else {
            None
        };
        if let Some((entered, go_on)) = paused {
            let _ = entered.send(());
            let _ = go_on.await;
        }
        self.inner
            .capabilities()
            .waker()
            .wait_for_outcome(request, timeout)
            .await
    }
    fn wakes_across_processes(&self) -> bool {
        self.inner.capabilities().waker().wakes_across_processes()
    }
}

/// The same through the engine: a duplicate of payload 1 must get
/// `KeyReused` (or run, or its own payload's value), never the value of
/// payload 2's body.
async fn engine_duplicate_gets_other_payloads_value<S: Store + 'static>(inner: S) {
    let (entered_tx, entered_rx) = oneshot::channel();
    let (go_tx, go_rx) = oneshot::channel();
    let store = Arc::new(PausedWait {
        inner,
        pause: Mutex::new(Some((entered_tx, go_rx))),
    });
    let policy = Policy::new().wait(Duration::from_secs(20));
    let key = "k-engine";

    // Caller A1 (payload 1) runs and holds the key until told to fail.
    let (a_started_tx, a_started_rx) = oneshot::channel::<()>();
    let (a_fail_tx, a_fail_rx) = oneshot::channel::<()>();
    let a1 = {
        let store = store.clone();
        tokio::spawn(async move {
            run(
                &*store,
                Call::new(SCOPE, key, &1u32).with_policy(policy),
                async move {
                    let _ = a_started_tx.send(());
                    let _ = a_fail_rx.await;
                    Err::<String, _>(Fail::Body)
                },
            )
            .await
        })
    };
    a_started_rx.await.unwrap();

    // The duplicate W (payload 1) finds the key in progress.
    let w = {
        let store = store.clone();
        tokio::spawn(async move {
            run(
                &*store,
                Call::new(SCOPE, key, &1u32).with_policy(policy),
                async { Ok::<_, Fail>("W's own body ran".to_owned()) },
            )
            .await
        })
    };
    entered_rx.await.unwrap();

    // A1 fails (its claim is released); B (payload 2) claims the key.
    a_fail_tx.send(()).unwrap();
    assert!(a1.await.unwrap().is_err());
    let (b_started_tx, b_started_rx) = oneshot::channel::<()>();
    let (b_go_tx, b_go_rx) = oneshot::channel::<()>();
    let b = {
        let store = store.clone();
        tokio::spawn(async move {
            run(
                &*store,
                Call::new(SCOPE, key, &2u32).with_policy(policy),
                async move {
                    let _ = b_started_tx.send(());
                    let _ = b_go_rx.await;
                    Ok::<_, Fail>("payload 2's value".to_owned())
                },
            )
            .await
        })
    };
    b_started_rx.await.unwrap();
    // W goes on to wait, then B completes within W's pause (the longest
    // poll, 25 ms; 500 ms where the store wakes across processes).
    go_tx.send(()).unwrap();
    tokio::time::sleep(Duration::from_millis(3)).await;
    b_go_tx.send(()).unwrap();
    assert_eq!(b.await.unwrap().unwrap(), "payload 2's value");
    let got = tokio::time::timeout(Duration::from_secs(30), w)
        .await
        .expect("W returned")
        .unwrap();
    match got {
        Err(Fail::Idem(Error::KeyReused)) => {}
        Ok(value) if value == "payload 2's value" => {
            panic!("a duplicate with payload 1 was answered payload 2's value")
        }
        other => panic!("expected KeyReused, got {other:?}"),
    }
}

common::backends!(memory, sqlite_file, postgres, mysql, redis => {
    #[tokio::test(flavor = "multi_thread", worker_threads = 2)]
    async fn a_waiter_is_not_handed_another_payloads_outcome() {
        let (store, _guard) = backend::store(8).await;
        waiter_handed_other_payloads_outcome(store).await;
    }

    #[tokio::test(flavor = "multi_thread", worker_threads = 2)]
    async fn a_waiting_duplicate_gets_key_reused_not_another_payloads_value() {
        let (store, _guard) = backend::store(8).await;
        engine_duplicate_gets_other_payloads_value(store).await;
    }
});
