//! A step's call still in flight when its attempt ends is never taken for
//! "nothing happened".
//!
//! The downstream can be asked by key, does not dedupe, and commits each
//! charge 200 ms after the request reached it, whatever its client does
//! meanwhile (a payment network that has the request). The attempt ends
//! at 50 ms: its caller is dropped (a timeout), or the step's own client
//! times out and returns an error. A retry comes at once, and again after
//! every `InProgress` as its `retry_after` says, as a client obeying
//! `Retry-After` does.
//!
//! Expected, on every store: one charge, and the retry's answer is that
//! charge. Before the settle window, a `reconcile` step asked the
//! downstream at once, was told "nothing" (the charge had not landed
//! yet), and charged again.

use crate::common;

use std::sync::{Arc, Mutex};
use std::time::Duration;

use idem::steps::{Step, StepKey};
use idem::{run, Call, Error, Policy, Store};

/// Commits a request this long after it arrives.
const COMMITS_AFTER: Duration = Duration::from_millis(200);
/// When the first attempt ends.
const ATTEMPT_ENDS: Duration = Duration::from_millis(50);

#[derive(Default)]
struct LateGateway {
    /// The committed charges, by step key.
    charges: Mutex<Vec<String>>,
}

impl LateGateway {
    /// Sends a charge: it commits after [`COMMITS_AFTER`] whatever becomes
    /// of the caller; the caller's answer comes when it commits.
    async fn charge(self: &Arc<Self>, key: &StepKey) -> Result<String, Error> {
        let (gateway, key) = (self.clone(), key.to_string());
        let committed = tokio::spawn(async move {
            tokio::time::sleep(COMMITS_AFTER).await;
            gateway.charges.lock().unwrap().push(key.clone());
            format!("ch_{}", &key[..8])
        });
        Ok(committed.await.expect("the commit"))
    }

    fn lookup(&self, key: &StepKey) -> Option<String> {
        let charges = self.charges.lock().unwrap();
        charges
            .iter()
            .find(|k| k.as_str() == key.as_str())
            .map(|k| format!("ch_{}", &k[..8]))
    }

    fn count(&self) -> usize {
        self.charges.lock().unwrap().len()
    }
}

/// How the first attempt ends at [`ATTEMPT_ENDS`].
#[derive(Clone, Copy, Debug)]
enum Fate {
    /// Its caller drops it.
    Dropped,
    /// The step's client times out: the step returns an error.
    StepTimesOut,
}

/// One attempt: a reconciling step whose client gives up after `timeout`
/// (`None`: never), settled after `settle` (`None`: the default).
async fn pay<S: Store>(
    store: &S,
    key: &str,
    gateway: &Arc<LateGateway>,
    timeout: Option<Duration>,
    settle: Option<Duration>,
) -> Result<String, Error> {
    let call = Call::new("step_in_flight.pay", key, &500).with_policy(
        Policy::new()
            .lease(Duration::from_millis(600))
            .wait(Duration::ZERO),
    );
    run(store, call, async move {
        let mut step =
            Step::new("charge").reconcile(|key: StepKey| async move { Ok(gateway.lookup(&key)) });
        if let Some(settle) = settle {
            step = step.settle(settle);
        }
        step.run(|key| async move {
            match timeout {
                Some(limit) => tokio::time::timeout(limit, gateway.charge(&key))
                    .await
                    .unwrap_or_else(|_| Err(Error::store("the gateway did not answer in time"))),
                None => gateway.charge(&key).await,
            }
        })
        .await
    })
    .await
}

async fn charged_once<S: Store>(store: S, fate: Fate, settle: Option<Duration>) {
    let key = common::fresh("in-flight");
    let gateway = Arc::new(LateGateway::default());
    match fate {
        Fate::Dropped => {
            let first =
                tokio::time::timeout(ATTEMPT_ENDS, pay(&store, &key, &gateway, None, settle)).await;
            assert!(
                first.is_err(),
                "the first attempt was to be dropped: {first:?}"
            );
        }
        Fate::StepTimesOut => {
            let first = pay(&store, &key, &gateway, Some(ATTEMPT_ENDS), settle).await;
            assert!(matches!(first, Err(Error::Store(_))), "{first:?}");
        }
    }
    // Retries at once, then as `retry_after` says.
    let mut answers = Vec::new();
    let answer = loop {
        let retry = pay(&store, &key, &gateway, None, settle).await;
        match retry {
            Err(Error::InProgress { retry_after }) if answers.len() < 20 => {
                // The step's window (at most the lease, 600 ms), or the
                // engine's hint while the dropped caller's claim is on its
                // way back.
                assert!(
                    retry_after <= Duration::from_secs(1),
                    "retry_after says {retry_after:?}"
                );
                answers.push(retry_after);
                tokio::time::sleep(retry_after.max(Duration::from_millis(10))).await;
            }
            other => break other,
        }
    };
    // The charge landed whatever happened: let any second one land too.
    tokio::time::sleep(COMMITS_AFTER * 2).await;
    assert_eq!(
        gateway.count(),
        1,
        "charged {} times ({fate:?}, settle {settle:?}); the retry answered {answer:?} after \
         {answers:?}",
        gateway.count()
    );
    let charge = answer.unwrap();
    assert!(charge.starts_with("ch_"), "{charge}");
    assert_eq!(
        pay(&store, &key, &gateway, None, settle).await.unwrap(),
        charge
    );
}

/// A downstream that dedupes by key, but answers a request that arrives
/// while the same key's first one is still in flight with an error (as a
/// payment API answers a concurrent duplicate 409): the case a `rerun`
/// step's settle window is for.
#[derive(Default)]
struct DedupingGateway {
    /// Committed charges, by step key.
    committed: Mutex<Vec<String>>,
    /// Keys whose first request has arrived.
    arrived: Mutex<Vec<String>>,
    /// Requests that arrived while their key's first one was in flight.
    concurrent: Mutex<usize>,
}

impl DedupingGateway {
    async fn charge(self: &Arc<Self>, key: &StepKey) -> Result<String, Error> {
        let key = key.to_string();
        let charge = format!("ch_{}", &key[..8]);
        if self.committed.lock().unwrap().contains(&key) {
            return Ok(charge);
        }
        if self.arrived.lock().unwrap().contains(&key) {
            *self.concurrent.lock().unwrap() += 1;
            return Err(Error::store("a request with this key is in progress"));
        }
        self.arrived.lock().unwrap().push(key.clone());
        let gateway = self.clone();
        let committed = tokio::spawn(async move {
            tokio::time::sleep(RERUN_COMMITS_AFTER).await;
            gateway.committed.lock().unwrap().push(key);
        });
        committed.await.expect("the commit");
        Ok(charge)
    }
}

/// How long [`DedupingGateway`] takes to commit: longer than the
/// engine's hint while a dropped caller's claim is on its way back (up to
/// a second), so that a retry let through too early reaches it in flight
/// on every store.
const RERUN_COMMITS_AFTER: Duration = Duration::from_millis(1500);

/// One attempt: a `rerun` step settled after `settle`.
async fn pay_rerun<S: Store>(
    store: &S,
    key: &str,
    gateway: &Arc<DedupingGateway>,
    settle: Duration,
) -> Result<String, Error> {
    let call = Call::new("step_in_flight.pay_rerun", key, &500).with_policy(
        Policy::new()
            .lease(Duration::from_millis(600))
            .wait(Duration::ZERO),
    );
    run(store, call, async move {
        Step::new("charge")
            .settle(settle)
            .run(|key| async move { gateway.charge(&key).await })
            .await
    })
    .await
}

/// A `rerun` step with a settle window: the caller of the first attempt
/// is dropped while its charge is in flight, and a retry comes at once.
/// The retry waits the window out (`InProgress`), then runs the step
/// again and gets the one charge: no request ever reaches the downstream
/// while the first is in flight.
async fn rerun_waits_its_window<S: Store>(store: S) {
    let key = common::fresh("rerun-in-flight");
    let gateway = Arc::new(DedupingGateway::default());
    let settle = Duration::from_millis(2000);
    let first = tokio::time::timeout(ATTEMPT_ENDS, pay_rerun(&store, &key, &gateway, settle)).await;
    assert!(first.is_err(), "the first attempt was to be dropped");
    let mut answers = Vec::new();
    let answer = loop {
        match pay_rerun(&store, &key, &gateway, settle).await {
            Err(Error::InProgress { retry_after }) if answers.len() < 20 => {
                answers.push(retry_after);
                tokio::time::sleep(retry_after.max(Duration::from_millis(10))).await;
            }
            other => break other,
        }
    };
    assert_eq!(
        *gateway.concurrent.lock().unwrap(),
        0,
        "a request reached the downstream while the first was in flight; the retry answered \
         {answer:?} after {answers:?}"
    );
    let charge = answer.unwrap();
    assert!(charge.starts_with("ch_"), "{charge}");
    assert_eq!(gateway.committed.lock().unwrap().len(), 1);
}

common::backends!(memory, sqlite_file, postgres, mysql, redis, redis_cluster => {
    #[tokio::test(flavor = "multi_thread", worker_threads = 2)]
    async fn a_rerun_step_waits_its_settle_window() {
        let (store, _guard) = backend::store(8).await;
        super::rerun_waits_its_window(store).await;
    }

    #[tokio::test(flavor = "multi_thread", worker_threads = 2)]
    async fn a_dropped_callers_charge_is_not_sent_again() {
        let (store, _guard) = backend::store(8).await;
        super::charged_once(store, super::Fate::Dropped, Some(Duration::from_millis(300))).await;
    }

    #[tokio::test(flavor = "multi_thread", worker_threads = 2)]
    async fn a_timed_out_steps_charge_is_not_sent_again() {
        let (store, _guard) = backend::store(8).await;
        super::charged_once(store, super::Fate::StepTimesOut, Some(Duration::from_millis(300)))
            .await;
    }

    /// Without a settle window of its own, a reconcile step waits the
    /// operation's lease.
    #[tokio::test(flavor = "multi_thread", worker_threads = 2)]
    async fn by_default_a_reconcile_step_waits_a_lease() {
        let (store, _guard) = backend::store(8).await;
        super::charged_once(store, super::Fate::StepTimesOut, None).await;
    }
});
