//! What the conformance cases share: the operation under test (a charge
//! and its receipt), its error type, a counter of body runs, fresh keys,
//! and a claim taken straight from the store.

use std::future::Future;
use std::sync::atomic::{AtomicUsize, Ordering};
use std::sync::Arc;
use std::time::Duration;

use serde::{Deserialize, Serialize};
use tokio::sync::oneshot;

use crate::engine::{run, Call};
use crate::policy::Policy;
use crate::store::{BeginRequest, Store};
use idem_core::error::Error;
use idem_core::fingerprint::Fingerprint;
use idem_core::key::{Key, Scope};
use idem_core::record::{now_millis, Begin, Claim, ClaimToken, Outcome};

/// The error type of the operations under test.
#[derive(Debug, Serialize, Deserialize, PartialEq)]
pub(super) enum TestError {
    #[serde(skip)]
    Idem(IdemError),
    Transient,
    Declined(String),
}

/// `Error` is not `PartialEq`; the cases compare it by variant.
#[derive(Debug)]
pub(super) struct IdemError(pub(super) Error);

impl PartialEq for IdemError {
    fn eq(&self, other: &Self) -> bool {
        std::mem::discriminant(&self.0) == std::mem::discriminant(&other.0)
    }
}

impl From<Error> for TestError {
    fn from(e: Error) -> Self {
        TestError::Idem(IdemError(e))
    }
}

impl TestError {
    /// The library's error, if this is one.
    pub(super) fn idem(&self) -> Option<&Error> {
        match self {
            TestError::Idem(IdemError(e)) => Some(e),
            _ => None,
        }
    }
}

/// A key no other case, process or run uses, so that cases may share a
/// database.
pub(super) fn fresh_key(tag: &str) -> String {
    static N: AtomicUsize = AtomicUsize::new(0);
    format!(
        "{tag}-{}-{}-{}",
        std::process::id(),
        now_millis(),
        N.fetch_add(1, Ordering::Relaxed)
    )
}

/// The payload of the operation under test.
#[derive(Serialize, Deserialize, Clone, Debug, PartialEq)]
pub(super) struct Charge {
    pub(super) amount: u64,
    pub(super) currency: String,
}

/// The result of the operation under test: which run made it.
#[derive(Serialize, Deserialize, Clone, Debug, PartialEq)]
pub(super) struct Receipt {
    pub(super) run: usize,
    pub(super) amount: u64,
}

pub(super) fn charge(amount: u64) -> Charge {
    Charge {
        amount,
        currency: "EUR".into(),
    }
}

pub(super) fn call(scope: &str, key: &str, payload: &Charge, policy: Policy) -> Call {
    Call::new(scope, key, payload).with_policy(policy)
}

/// Counts body runs and numbers them, so every result is distinguishable.
#[derive(Clone, Default)]
pub(super) struct Runs(Arc<AtomicUsize>);

impl Runs {
    pub(super) fn next(&self) -> usize {
        self.0.fetch_add(1, Ordering::SeqCst) + 1
    }

    pub(super) fn count(&self) -> usize {
        self.0.load(Ordering::SeqCst)
    }
}

/// The scope and the key a payment under `key` is recorded at.
pub(super) fn payment(key: &str) -> (Scope, Key) {
    (Scope::new("payments.charge"), Key::new(key).unwrap())
}

/// Charges `payload` under `key` in the scope `payments.charge`.
pub(super) async fn pay<S: Store + ?Sized>(
    store: &S,
    key: &str,
    payload: &Charge,
    policy: Policy,
    runs: &Runs,
) -> Result<Receipt, TestError> {
    pay_slowly(store, key, payload, policy, runs, Duration::ZERO).await
}

/// [`pay`] with a body that takes `pause`.
pub(super) async fn pay_slowly<S: Store + ?Sized>(
    store: &S,
    key: &str,
    payload: &Charge,
    policy: Policy,
    runs: &Runs,
    pause: Duration,
) -> Result<Receipt, TestError> {
    let amount = payload.amount;
    run(
        store,
        call("payments.charge", key, payload, policy),
        async {
            let n = runs.next();
            if !pause.is_zero() {
                tokio::time::sleep(pause).await;
            }
            Ok(Receipt { run: n, amount })
        },
    )
    .await
}

/// A claim taken straight from the store, with a fresh token: an owner
/// that never renews (a crashed or stopped process).
pub(super) async fn claim_directly<S: Store>(
    store: &S,
    scope: &Scope,
    key: &Key,
    fingerprint: &Fingerprint,
    lease: Duration,
    ttl: Duration,
) -> Claim {
    let request = BeginRequest {
        scope,
        key,
        fingerprint,
        token: ClaimToken::new(),
        lease,
        ttl,
    };
    match store.begin(&request).await.unwrap() {
        Begin::Claimed(claim) => claim,
        other => panic!("not claimed: {other:?}"),
    }
}

/// That `purged` records (and entries) are at least the `expired` ones a
/// case left, or none on a store that leaves expiry to its database.
pub(super) fn assert_purged<S: Store + ?Sized>(store: &S, purged: u64, expired: usize) {
    if store.capabilities().deletes_expired_itself {
        assert_eq!(
            purged, 0,
            "a store that deletes expired records itself purged some"
        );
    } else {
        assert!(
            purged >= expired as u64,
            "purged {purged}, expected at least {expired}"
        );
    }
}

/// An owner that stopped: a claim of `fingerprint` taken straight from
/// the store ([`claim_directly`]), its lease of 200 ms never renewed, its
/// ttl 60 s.
pub(super) async fn stopped_owner<S: Store>(
    store: &S,
    scope: &Scope,
    key: &Key,
    fingerprint: &Fingerprint,
) -> Claim {
    let (lease, ttl) = (Duration::from_millis(200), Duration::from_secs(60));
    claim_directly(store, scope, key, fingerprint, lease, ttl).await
}

/// [`pay`] in `scope`, with a body held until it is let go: answers the
/// call, the receiver told when the body runs, and the sender that lets
/// it finish.
pub(super) fn pay_held<'a, S: Store + ?Sized>(
    store: &'a S,
    scope: &'a str,
    key: &'a str,
    payload: &'a Charge,
    policy: Policy,
    runs: &'a Runs,
) -> (
    impl Future<Output = Result<Receipt, TestError>> + 'a,
    oneshot::Receiver<()>,
    oneshot::Sender<()>,
) {
    let (started_tx, started_rx) = oneshot::channel();
    let (finish_tx, finish_rx) = oneshot::channel::<()>();
    let amount = payload.amount;
    let held = run(store, call(scope, key, payload, policy), async move {
        let n = runs.next();
        started_tx.send(()).unwrap();
        finish_rx.await.unwrap();
        Ok(Receipt { run: n, amount })
    });
    (held, started_rx, finish_tx)
}

/// That every write a claim that is not the record's any more presents
/// (its completion with `outcome`, a renewal, a release) is refused with
/// [`Error::LeaseLost`]; `who` names its owner.
pub(super) async fn assert_fenced_out<S: Store + ?Sized>(
    store: &S,
    claim: &Claim,
    outcome: &Outcome,
    who: &str,
) {
    let lost = |r: Result<(), Error>| matches!(r, Err(Error::LeaseLost));
    let completed = store.complete(claim, outcome).await;
    assert!(lost(completed), "{who}'s completion was accepted");
    let renewed = store.renew(claim).await;
    assert!(lost(renewed), "{who}'s renewal was accepted");
    let released = store.release(claim).await;
    assert!(lost(released), "{who}'s release was accepted");
}
