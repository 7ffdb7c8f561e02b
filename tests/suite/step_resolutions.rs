//! An operator's resolution of a step in doubt against the attempts it
//! lets run: it settles only a step whose starting attempt is gone, so a
//! resolution sent again never lands on the step a later attempt runs.

use crate::common;
use crate::common::journal_of;

use std::future::Future;
use std::sync::atomic::{AtomicUsize, Ordering};
use std::sync::Arc;
use std::time::Duration;

use idem::steps::{self, Step};
use idem::{run, Call, Error, Key, Policy, Scope, Store};
use tokio::sync::Notify;

/// A downstream that neither dedupes by key nor can be asked (why the
/// step refuses when in doubt): counts its charges.
#[derive(Default)]
struct Gateway {
    charges: AtomicUsize,
}

/// One attempt of the payment: its one step refuses when in doubt. When
/// `hang` is given, the charge happens, `hang` is notified, and the call
/// never answers (its answer is lost: the caller is then dropped).
fn attempt<'s, S: Store>(
    store: &'s S,
    key: &str,
    gateway: Arc<Gateway>,
    hang: Option<Arc<Notify>>,
) -> impl Future<Output = Result<String, Error>> + 's {
    let call = Call::new("step_resolutions.pay", key, &500u64)
        .with_policy(Policy::new().wait(Duration::from_secs(5)));
    run(store, call, async move {
        Step::new("charge")
            .refuse()
            .run(|_key| async move {
                let n = gateway.charges.fetch_add(1, Ordering::SeqCst) + 1;
                if let Some(hang) = hang {
                    hang.notify_one();
                    std::future::pending::<()>().await;
                }
                Ok::<_, Error>(format!("ch_{n}"))
            })
            .await
    })
}

/// Runs an attempt until its charge happened, then (with `meanwhile`
/// done while it is mid-step and holds the claim) drops it, as a dropped
/// caller or a lost process would.
async fn charge_then_drop<S: Store, F: Future<Output = ()>>(
    store: &S,
    key: &str,
    gateway: &Arc<Gateway>,
    meanwhile: F,
) {
    let hang = Arc::new(Notify::new());
    let mut attempt = Box::pin(attempt(store, key, gateway.clone(), Some(hang.clone())));
    tokio::select! {
        result = &mut attempt => panic!("the hanging attempt ended: {result:?}"),
        _ = hang.notified() => {}
    }
    meanwhile.await;
    drop(attempt);
}

/// `steps::resolve` acted on a step that a live attempt was running, not
/// only on one in doubt, so a retried (or duplicated) "allow a rerun"
/// landed on the entry of the rerun it allowed (every store):
///
/// 1. A charges (charge 1) and is lost mid-step: entry `started(A)`.
/// 2. B finds the step in doubt: `OutcomeUnknown` (refuse).
/// 3. The operator finds no charge 1 at the gateway and allows a rerun:
///    `resolve(.., None)` -> true, entry `rerun_allowed`.
/// 4. C runs the step (`Allowed`), entry `started(C)`, charges (charge 2)
///    and, while it is mid-step and holds the claim, the operator's tool
///    sends the same resolution again (its first answer was lost, or a
///    second operator clicks): it lands (true), entry `rerun_allowed`.
/// 5. C is lost before it journals.
/// 6. D: C's charge is in doubt and the step refuses, so D gets
///    `OutcomeUnknown` and the gateway is not called; before, D ran the
///    step again without any operator having looked at C's charge:
///    charge 3. The second resolution now answers `false`.
async fn resolve_lands_on_a_live_rerun<S: Store>(store: S) {
    let key = common::fresh("resolve-live");
    let (scope, k) = (
        Scope::new("step_resolutions.pay"),
        Key::new(key.as_str()).unwrap(),
    );
    let gateway = Arc::new(Gateway::default());

    // 1. A.
    charge_then_drop(&store, &key, &gateway, async {}).await;
    // 2. B (waits for A's claim to be handed back, then is refused).
    match attempt(&store, &key, gateway.clone(), None).await {
        Err(Error::OutcomeUnknown { .. }) => {}
        other => panic!("B: expected OutcomeUnknown, got {other:?}"),
    }
    assert_eq!(gateway.charges.load(Ordering::SeqCst), 1);
    // 3. The operator allows a rerun.
    assert!(
        steps::resolve(&store, &scope, &k, 0, "charge", None::<&String>)
            .await
            .unwrap()
    );
    // 4.-5. C charges; the same resolution is sent again while C is
    // mid-step; C is lost.
    let again = charge_then_drop(&store, &key, &gateway, async {
        let landed = steps::resolve(&store, &scope, &k, 0, "charge", None::<&String>)
            .await
            .unwrap();
        println!("the repeated resolution while C runs the step: landed = {landed}");
    });
    again.await;
    assert_eq!(gateway.charges.load(Ordering::SeqCst), 2);
    // 6. D.
    let d = attempt(&store, &key, gateway.clone(), None).await;
    assert!(
        matches!(d, Err(Error::OutcomeUnknown { .. })),
        "D: C's charge is in doubt and the step refuses, yet D got {d:?} after charging the \
         gateway {} times (C's started entry was turned into rerun_allowed by a resolution \
         meant for A's)",
        gateway.charges.load(Ordering::SeqCst)
    );
    assert_eq!(gateway.charges.load(Ordering::SeqCst), 2, "charged again");
}

/// A step whose starting attempt is gone is in doubt, and an operator
/// may settle it, also while another attempt holds the operation: the
/// attempt that took the key over did not start the step (its start is
/// not the one in doubt), so holding the key does not make the step run.
async fn resolve_while_another_attempt_holds_the_key<S: Store>(store: S) {
    use idem::journal::{StepAt, StepRequest, StepResolution};
    use idem::record::{Begin, ClaimToken};
    use idem::store::BeginRequest;
    use idem::Fingerprint;

    let key = common::fresh("resolve-held");
    let (scope, key) = (Scope::new("step_resolutions.held"), Key::new(key).unwrap());
    let fingerprint = Fingerprint::of_bytes(b"payload");
    let claim = |lease| {
        let (store, scope, key, fingerprint) = (&store, &scope, &key, &fingerprint);
        async move {
            let request = BeginRequest {
                scope,
                key,
                fingerprint,
                token: ClaimToken::new(),
                lease,
                ttl: Duration::from_secs(60),
            };
            match store.begin(&request).await {
                Ok(Begin::Claimed(claim)) => claim,
                other => panic!("a claim: {other:?}"),
            }
        }
    };
    let gone = claim(Duration::from_millis(200)).await;
    let step = StepRequest {
        claim: &gone,
        seq: 0,
        name: "charge",
        fingerprint: &fingerprint,
        ttl: Duration::from_secs(60),
        adopt: false,
        settle: Duration::ZERO,
    };
    journal_of(&store).begin_step(&step).await.unwrap();
    tokio::time::sleep(Duration::from_millis(300)).await;
    // The next attempt holds the key, with a live lease.
    let _holder = claim(Duration::from_secs(30)).await;
    assert!(
        journal_of(&store)
            .resolve_step(
                &StepAt {
                    scope: &scope,
                    key: &key,
                    seq: 0,
                    name: "charge"
                },
                &StepResolution::Rerun
            )
            .await
            .unwrap(),
        "the step of an attempt that is gone was not settled while another attempt holds the key"
    );
}

common::backends!(memory, sqlite_file, postgres, mysql, redis => {
    #[tokio::test(flavor = "multi_thread", worker_threads = 2)]
    async fn a_step_in_doubt_is_settled_while_another_attempt_holds_the_key() {
        let (store, _guard) = backend::store(8).await;
        super::resolve_while_another_attempt_holds_the_key(store).await;
    }

    #[tokio::test(flavor = "multi_thread", worker_threads = 2)]
    async fn a_resolution_lands_on_the_live_rerun_it_allowed() {
        let (store, _guard) = backend::store(8).await;
        super::resolve_lands_on_a_live_rerun(store).await;
    }
});
