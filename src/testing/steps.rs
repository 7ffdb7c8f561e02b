//! The conformance cases of the step journal ([`crate::steps`]).

use std::collections::HashMap;
use std::sync::atomic::{AtomicUsize, Ordering};
use std::sync::{Arc, Mutex};
use std::time::Duration;

use tokio::sync::Barrier;

use super::support::{call, charge, claim_directly, fresh_key, stopped_owner, Charge, TestError};
use crate::engine::run;
use crate::policy::Policy;
use crate::steps::{self, step, Step, StepKey};
use crate::store::{Journal, Store};
use idem_core::error::Error;
use idem_core::fingerprint::Fingerprint;
use idem_core::journal::{StepBegin, StepRequest, StepRun, StepState};
use idem_core::key::{Key, Scope};
use idem_core::record::Claim;

const SCOPE: &str = "payments.checkout";

/// Counts each step's calls, and the keys they were given.
#[derive(Clone, Default)]
struct Downstream {
    calls: Arc<Mutex<Vec<(String, StepKey)>>>,
}

impl Downstream {
    /// A downstream call named `what`, with `key`: answers `what:<amount>`.
    fn call(&self, what: &str, key: &StepKey, amount: u64) -> String {
        self.calls
            .lock()
            .unwrap()
            .push((what.to_owned(), key.clone()));
        format!("{what}:{amount}")
    }

    fn count(&self, what: &str) -> usize {
        self.calls
            .lock()
            .unwrap()
            .iter()
            .filter(|(w, _)| w == what)
            .count()
    }

    fn keys(&self, what: &str) -> Vec<StepKey> {
        self.calls
            .lock()
            .unwrap()
            .iter()
            .filter(|(w, _)| w == what)
            .map(|(_, k)| k.clone())
            .collect()
    }
}

/// The journal of a store under test: these cases run on stores that
/// keep one.
fn journal<S: Store + ?Sized>(store: &S) -> &dyn Journal {
    store.journal().expect(
        "this store keeps no step journal, which durable steps need (a wrapper must \
             forward `journal()`); a store without one says so: \
             `store_conformance!(name, make, journal = false)`",
    )
}

/// The request of step `seq`, `name`, of the attempt of `claim` on the
/// payload of `fingerprint`: kept 60 s, and a start in doubt is not
/// adopted.
fn step_request<'a>(
    claim: &'a Claim,
    seq: u32,
    name: &'a str,
    fingerprint: &'a Fingerprint,
) -> StepRequest<'a> {
    StepRequest {
        claim,
        seq,
        name,
        fingerprint,
        ttl: Duration::from_secs(60),
        adopt: false,
        settle: Duration::ZERO,
    }
}

/// A checkout of two steps (charge, then email), failing after both when
/// `fail` says so.
async fn checkout<S: Store + ?Sized>(
    store: &S,
    key: &str,
    payload: &Charge,
    downstream: &Downstream,
    fail: bool,
) -> Result<(String, String), TestError> {
    let amount = payload.amount;
    let policy = Policy::new().wait(Duration::from_secs(10));
    run(store, call(SCOPE, key, payload, policy), async {
        let charged: String = step("charge", |key| async move {
            Ok::<_, TestError>(downstream.call("charge", &key, amount))
        })
        .await?;
        let emailed: String = step("email", |key| async move {
            Ok::<_, TestError>(downstream.call("email", &key, amount))
        })
        .await?;
        if fail {
            return Err(TestError::Transient);
        }
        Ok((charged, emailed))
    })
    .await
}

/// A fresh key (`tag`) whose first checkout of `payload` failed after
/// both its steps completed, and the downstream that counted their calls.
async fn failed_once<S: Store + ?Sized>(
    store: &S,
    tag: &str,
    payload: &Charge,
) -> (String, Downstream) {
    let key = fresh_key(tag);
    let downstream = Downstream::default();
    let first = checkout(store, &key, payload, &downstream, true).await;
    assert_eq!(first, Err(TestError::Transient));
    (key, downstream)
}

/// An attempt whose body fails after its steps completed is released; the
/// retry runs the body again, and each step replays its journaled output
/// instead of running: each downstream call happens once. The journal
/// lists both steps, completed.
pub async fn steps_replay_after_a_failed_attempt<S: Store>(store: S) {
    let payload = charge(7);
    let (key, downstream) = failed_once(&store, "steps-replay", &payload).await;
    let second = checkout(&store, &key, &payload, &downstream, false)
        .await
        .unwrap();
    assert_eq!(second, ("charge:7".to_owned(), "email:7".to_owned()));
    assert_eq!(
        (downstream.count("charge"), downstream.count("email")),
        (1, 1)
    );
    let third = checkout(&store, &key, &payload, &downstream, false)
        .await
        .unwrap();
    assert_eq!(third, second);
    let journal = journal(&store)
        .steps(&Scope::new(SCOPE), &Key::new(key.as_str()).unwrap())
        .await
        .unwrap();
    let listed: Vec<_> = journal
        .iter()
        .map(|e| (e.seq, e.name.as_str(), e.state))
        .collect();
    assert_eq!(
        listed,
        [
            (0, "charge", StepState::Completed),
            (1, "email", StepState::Completed)
        ]
    );
}

/// A step that an attempt started and never journaled (its call failed,
/// as a lost answer does) is in doubt at the next attempt, which does what
/// the step's policy says: rerun (the default) calls the downstream again
/// with the same key; refuse fails with `OutcomeUnknown` at every attempt
/// until an operator resolves the step, with an output (replayed) or by
/// allowing a rerun; reconcile asks, and journals the answer, or runs
/// the step when the downstream saw nothing.
pub async fn steps_in_doubt_follow_their_policy<S: Store>(store: S) {
    let policy = Policy::new().wait(Duration::from_secs(10));
    let payload = charge(3);
    let calls = Arc::new(AtomicUsize::new(0));
    let keys = Arc::new(Mutex::new(Vec::<StepKey>::new()));
    // One attempt: the charge step under `kind`, whose call fails (its
    // answer lost) when `lose` says so.
    let attempt = |key: String, kind: &'static str, lose: bool, reconciled: Option<u64>| {
        let (store, calls, keys, payload) = (&store, calls.clone(), keys.clone(), &payload);
        async move {
            run(store, call(SCOPE, &key, payload, policy), async move {
                let charge = |step_key: StepKey| async move {
                    keys.lock().unwrap().push(step_key);
                    calls.fetch_add(1, Ordering::SeqCst);
                    if lose {
                        return Err(TestError::Declined("the answer was lost".into()));
                    }
                    Ok::<_, TestError>(30)
                };
                let reconcile = move |_: StepKey| async move { Ok(reconciled) };
                let charged: u64 = match kind {
                    "rerun" => step("charge", charge).await?,
                    "refuse" => Step::new("charge").refuse().run(charge).await?,
                    // This downstream performs a call before it answers, or
                    // never: nothing is left in flight to wait for.
                    _ => {
                        Step::new("charge")
                            .reconcile(reconcile)
                            .settle(Duration::ZERO)
                            .run(charge)
                            .await?
                    }
                };
                Ok::<_, TestError>(charged)
            })
            .await
        }
    };
    let calls_now = || calls.load(Ordering::SeqCst);
    let lost = |r: Result<u64, TestError>| matches!(r, Err(TestError::Declined(_)));

    // Rerun: the same key again.
    let key = fresh_key("doubt-rerun");
    assert!(lost(attempt(key.clone(), "rerun", true, None).await));
    assert_eq!(
        attempt(key.clone(), "rerun", false, None).await.unwrap(),
        30
    );
    assert_eq!(calls_now(), 2);
    {
        let keys = keys.lock().unwrap();
        assert_eq!(keys[0], keys[1], "the rerun used another key");
    }

    // Refuse, until an operator resolves it with the charge it made.
    let key = fresh_key("doubt-refuse");
    assert!(lost(attempt(key.clone(), "refuse", true, None).await));
    for _ in 0..2 {
        let refused = attempt(key.clone(), "refuse", false, None)
            .await
            .unwrap_err();
        assert!(
            matches!(refused.idem(), Some(Error::OutcomeUnknown { seq: 0, step, .. }) if step == "charge"),
            "{refused:?}"
        );
    }
    assert_eq!(calls_now(), 3, "a refused step ran");
    let (scope, k) = (Scope::new(SCOPE), Key::new(key.as_str()).unwrap());
    let entries = journal(&store).steps(&scope, &k).await.unwrap();
    assert_eq!(entries[0].state, StepState::Started);
    assert!(!steps::resolve(&store, &scope, &k, 0, "refund", Some(&1))
        .await
        .unwrap());
    assert!(steps::resolve(&store, &scope, &k, 0, "charge", Some(&31))
        .await
        .unwrap());
    assert_eq!(
        attempt(key.clone(), "refuse", false, None).await.unwrap(),
        31
    );
    assert_eq!(calls_now(), 3, "a resolved step ran");
    // Completed: nothing left to resolve.
    assert!(
        !steps::resolve(&store, &scope, &k, 0, "charge", None::<&u64>)
            .await
            .unwrap()
    );

    // Refuse, until an operator allows a rerun.
    let key = fresh_key("doubt-allow");
    assert!(lost(attempt(key.clone(), "refuse", true, None).await));
    let k = Key::new(key.as_str()).unwrap();
    assert!(
        steps::resolve(&store, &scope, &k, 0, "charge", None::<&u64>)
            .await
            .unwrap()
    );
    assert_eq!(
        attempt(key.clone(), "refuse", false, None).await.unwrap(),
        30
    );
    assert_eq!(calls_now(), 5);

    // Reconcile: the downstream says it charged 32; nothing runs.
    let key = fresh_key("doubt-reconcile");
    assert!(lost(attempt(key.clone(), "reconcile", true, None).await));
    assert_eq!(
        attempt(key.clone(), "reconcile", false, Some(32))
            .await
            .unwrap(),
        32
    );
    assert_eq!(calls_now(), 6);
    // Journaled: replayed without asking again.
    assert_eq!(
        attempt(key.clone(), "reconcile", false, None)
            .await
            .unwrap(),
        32
    );
    assert_eq!(calls_now(), 6);

    // Reconcile: the downstream saw nothing, so the step runs.
    let key = fresh_key("doubt-reconcile-none");
    assert!(lost(attempt(key.clone(), "reconcile", true, None).await));
    assert_eq!(
        attempt(key.clone(), "reconcile", false, None)
            .await
            .unwrap(),
        30
    );
    assert_eq!(calls_now(), 8);
}

/// The journal is fenced by the operation's claim. An owner that stopped
/// (a claim taken straight from the store, never renewed) started a step;
/// once a successor took the key over, the stopped owner can neither
/// journal that step's output nor begin another, and the successor finds
/// the step in doubt and reruns it with the same key.
pub async fn a_step_journal_is_fenced<S: Store>(store: S) {
    let key = fresh_key("steps-fence");
    let payload = charge(5);
    let (scope, k) = (Scope::new(SCOPE), Key::new(key.as_str()).unwrap());
    let fingerprint = Fingerprint::of(&payload).unwrap();
    let zombie = stopped_owner(&store, &scope, &k, &fingerprint).await;
    let request = |seq, name| step_request(&zombie, seq, name, &fingerprint);
    // The start, then the same start sent again (its answer lost): still
    // this attempt's.
    for run in [StepRun::Fresh, StepRun::Again] {
        let charge = request(0, "charge");
        let begun = journal(&store).begin_step(&charge).await;
        assert_eq!(begun.unwrap(), StepBegin::Run(run));
    }
    tokio::time::sleep(Duration::from_millis(300)).await;
    let policy = Policy::new().lease(Duration::from_secs(5));
    let keys = Arc::new(Mutex::new(Vec::new()));
    let result = run(&store, call(SCOPE, &key, &payload, policy), async {
        // The successor holds the key: the zombie's writes bounce.
        let lost = |r: Result<(), Error>| matches!(r, Err(Error::LeaseLost));
        assert!(lost(
            journal(&store)
                .complete_step(&request(0, "charge"), b"1")
                .await
        ));
        assert!(matches!(
            journal(&store).begin_step(&request(1, "email")).await,
            Err(Error::LeaseLost)
        ));
        let charged: u64 = step("charge", |key| {
            keys.lock().unwrap().push(key);
            async { Ok::<_, TestError>(50) }
        })
        .await?;
        Ok::<_, TestError>(charged)
    })
    .await;
    assert_eq!(result.unwrap(), 50);
    assert_eq!(
        keys.lock().unwrap()[0],
        StepKey::derive(&scope, &k, "charge", 0)
    );
    let entries = journal(&store).steps(&scope, &k).await.unwrap();
    assert_eq!(entries.len(), 1);
    assert_eq!(entries[0].output.as_deref(), Some(&b"50"[..]));
}

/// A downstream call, counted in `calls`: declined cleanly (nothing
/// charged), or charging `amount`.
async fn declining(
    calls: &AtomicUsize,
    declined: bool,
    amount: u64,
) -> Result<u64, steps::Failed<TestError>> {
    calls.fetch_add(1, Ordering::SeqCst);
    if declined {
        return Err(steps::Failed::Cleanly(TestError::Declined(
            "503, nothing was charged".into(),
        )));
    }
    Ok(amount)
}

/// A step whose call failed cleanly (`Failed::Cleanly`) takes its start
/// back ([`Journal::undo_step`](crate::store::Journal::undo_step)): the next attempt runs it as never
/// started, even under `refuse`, and no entry is left in doubt. The undo
/// touches only an entry started under the undoing claim: not one a
/// successor took over and completed, nor one of another name.
pub async fn a_clean_failure_takes_the_start_back<S: Store>(store: S) {
    let key = fresh_key("steps-clean");
    let payload = charge(9);
    let (scope, k) = (Scope::new(SCOPE), Key::new(key.as_str()).unwrap());
    let policy = Policy::new().wait(Duration::from_secs(10));
    let calls = AtomicUsize::new(0);
    let attempt = |declined: bool| {
        let calls = &calls;
        run(&store, call(SCOPE, &key, &payload, policy), async move {
            let charged: u64 = Step::new("charge")
                .refuse()
                .try_run(|_| declining(calls, declined, 41))
                .await?;
            Ok::<_, TestError>(charged)
        })
    };
    assert!(matches!(attempt(true).await, Err(TestError::Declined(_))));
    assert_eq!(
        journal(&store).steps(&scope, &k).await.unwrap(),
        [],
        "a cleanly failed step left its entry"
    );
    assert_eq!(attempt(false).await.unwrap(), 41);
    assert_eq!(calls.load(Ordering::SeqCst), 2);
    assert_eq!(attempt(false).await.unwrap(), 41, "not replayed");
    assert_eq!(calls.load(Ordering::SeqCst), 2);

    // Under `reconcile`, with its default settle window (the lease): the
    // next attempt neither waits for the window nor asks the downstream.
    let key = fresh_key("steps-clean-reconcile");
    let asked = AtomicUsize::new(0);
    let attempt = |declined: bool| {
        let (calls, asked) = (&calls, &asked);
        run(&store, call(SCOPE, &key, &payload, policy), async move {
            let charged: u64 = Step::new("charge")
                .reconcile(|_| async move {
                    asked.fetch_add(1, Ordering::SeqCst);
                    Ok::<_, TestError>(None)
                })
                .try_run(|_| declining(calls, declined, 43))
                .await?;
            Ok::<_, TestError>(charged)
        })
    };
    assert!(matches!(attempt(true).await, Err(TestError::Declined(_))));
    assert_eq!(attempt(false).await.unwrap(), 43);
    assert_eq!(calls.load(Ordering::SeqCst), 4);
    assert_eq!(
        asked.load(Ordering::SeqCst),
        0,
        "reconciled a clean failure"
    );

    // A stopped owner's undo, sent after a successor took the key over
    // and completed the step, changes nothing.
    let key = fresh_key("steps-clean-late");
    let (scope, k) = (Scope::new(SCOPE), Key::new(key.as_str()).unwrap());
    let fingerprint = Fingerprint::of(&payload).unwrap();
    let zombie = stopped_owner(&store, &scope, &k, &fingerprint).await;
    let request = |name| step_request(&zombie, 0, name, &fingerprint);
    assert_eq!(
        journal(&store)
            .begin_step(&request("charge"))
            .await
            .unwrap(),
        StepBegin::Run(StepRun::Fresh)
    );
    assert!(!journal(&store).undo_step(&request("refund")).await.unwrap());
    tokio::time::sleep(Duration::from_millis(300)).await;
    let charged = run(&store, call(SCOPE, &key, &payload, policy), async {
        let charged: u64 = step("charge", |_| async { Ok::<_, TestError>(42) }).await?;
        // The stopped owner's call answers now, declined, and it takes
        // its start back: the successor adopted the entry.
        assert!(!journal(&store).undo_step(&request("charge")).await.unwrap());
        Ok::<_, TestError>(charged)
    })
    .await;
    assert_eq!(charged.unwrap(), 42);
    assert!(!journal(&store).undo_step(&request("charge")).await.unwrap());
    let entries = journal(&store).steps(&scope, &k).await.unwrap();
    assert_eq!(entries.len(), 1);
    assert_eq!(entries[0].state, StepState::Completed);
    assert_eq!(entries[0].output.as_deref(), Some(&b"42"[..]));
}

/// A journal entry's completion sent again (its answer lost) is accepted;
/// another output for a completed step is not; a completion without an
/// entry journals one.
pub async fn a_step_completion_sent_again_is_accepted<S: Store>(store: S) {
    let key = fresh_key("steps-again");
    let (scope, k) = (Scope::new(SCOPE), Key::new(key.as_str()).unwrap());
    let fingerprint = Fingerprint::of(&charge(1)).unwrap();
    let (lease, ttl) = (Duration::from_secs(10), Duration::from_secs(60));
    let claim = claim_directly(&store, &scope, &k, &fingerprint, lease, ttl).await;
    let request = step_request(&claim, 0, "charge", &fingerprint);
    journal(&store).begin_step(&request).await.unwrap();
    journal(&store)
        .complete_step(&request, b"\"ch_1\"")
        .await
        .unwrap();
    journal(&store)
        .complete_step(&request, b"\"ch_1\"")
        .await
        .unwrap();
    assert!(journal(&store)
        .complete_step(&request, b"\"ch_2\"")
        .await
        .is_err());
    assert_eq!(
        journal(&store).begin_step(&request).await.unwrap(),
        StepBegin::Replay(b"\"ch_1\"".to_vec())
    );
    // A step whose entry was never started (that write failed while it
    // ran) is journaled by its completion all the same.
    let never_started = StepRequest {
        seq: 1,
        name: "email",
        ..request
    };
    journal(&store)
        .complete_step(&never_started, b"\"sent\"")
        .await
        .unwrap();
    assert_eq!(
        journal(&store).begin_step(&never_started).await.unwrap(),
        StepBegin::Replay(b"\"sent\"".to_vec())
    );
}

/// An attempt that calls its steps in another order than the journal
/// (or under other names) is refused with `StepMismatch`, before the
/// mismatched step runs.
pub async fn steps_called_in_another_order_are_refused<S: Store>(store: S) {
    let payload = charge(4);
    let (key, downstream) = failed_once(&store, "steps-order", &payload).await;
    let policy = Policy::new();
    let downstream = &downstream;
    let swapped: Result<String, TestError> =
        run(&store, call(SCOPE, &key, &payload, policy), async {
            let emailed: String = step("email", |key| async move {
                Ok::<_, TestError>(downstream.call("email", &key, 4))
            })
            .await?;
            Ok(emailed)
        })
        .await;
    let err = swapped.unwrap_err();
    assert!(
        matches!(err.idem(), Some(Error::StepMismatch { seq: 0, journaled, called })
            if journaled == "charge" && called == "email"),
        "{err:?}"
    );
    assert_eq!(downstream.count("email"), 1);
}

/// A retry under the same key with another payload, after an attempt that
/// journaled steps and was released, is refused at its first step with
/// `KeyReused`: the journal is that payload's.
pub async fn a_journal_of_another_payload_is_refused<S: Store>(store: S) {
    let key = fresh_key("steps-payload");
    let downstream = Downstream::default();
    let first = checkout(&store, &key, &charge(4), &downstream, true).await;
    assert_eq!(first, Err(TestError::Transient));
    let other = checkout(&store, &key, &charge(5), &downstream, false).await;
    assert!(
        matches!(other.as_ref().unwrap_err().idem(), Some(Error::KeyReused)),
        "{other:?}"
    );
    assert_eq!(downstream.count("charge"), 1);
}

/// Forgetting an operation deletes its journal: the next call runs every
/// step again. Purging deletes expired entries.
pub async fn forget_and_purge_clear_the_journal<S: Store>(store: S) {
    let key = fresh_key("steps-forget");
    let downstream = Downstream::default();
    let payload = charge(2);
    checkout(&store, &key, &payload, &downstream, false)
        .await
        .unwrap();
    let (scope, k) = (Scope::new(SCOPE), Key::new(key.as_str()).unwrap());
    assert_eq!(journal(&store).steps(&scope, &k).await.unwrap().len(), 2);
    assert!(store.forget(&scope, &k).await.unwrap());
    assert!(journal(&store).steps(&scope, &k).await.unwrap().is_empty());
    checkout(&store, &key, &payload, &downstream, false)
        .await
        .unwrap();
    assert_eq!(downstream.count("charge"), 2);
    // The same key again, the same downstream key.
    let keys = downstream.keys("charge");
    assert_eq!(keys[0], keys[1]);

    // Entries kept 150 ms (the ttl; at least the lease): purged once
    // expired.
    let key = fresh_key("steps-purge");
    let policy = Policy::new()
        .ttl(Duration::from_millis(150))
        .lease(Duration::from_millis(90));
    run(&store, call(SCOPE, &key, &payload, policy), async {
        step("charge", |_| async { Ok::<_, TestError>(1) }).await
    })
    .await
    .unwrap();
    let k = Key::new(key.as_str()).unwrap();
    assert_eq!(journal(&store).steps(&scope, &k).await.unwrap().len(), 1);
    tokio::time::sleep(Duration::from_millis(250)).await;
    let purged = store.purge_expired(100).await.unwrap();
    super::support::assert_purged(&store, purged, 2);
    assert!(journal(&store).steps(&scope, &k).await.unwrap().is_empty());
}

/// Many calls over a few keys at once, each attempt's body failing once
/// after its steps: each step's downstream call happens once per key, and
/// every caller gets the same answer.
pub async fn storm_runs_each_step_once<S: Store + Clone + 'static>(store: S) {
    const CALLS: usize = 60;
    const KEYS: usize = 6;
    let prefix = fresh_key("steps-storm");
    let downstream = Downstream::default();
    let failed = Arc::new(Mutex::new(HashMap::<String, bool>::new()));
    let barrier = Arc::new(Barrier::new(CALLS));
    let mut tasks = Vec::new();
    for i in 0..CALLS {
        let (store, downstream, failed, barrier) = (
            store.clone(),
            downstream.clone(),
            failed.clone(),
            barrier.clone(),
        );
        let key = format!("{prefix}-{}", i % KEYS);
        tasks.push(tokio::spawn(async move {
            barrier.wait().await;
            loop {
                // The first attempt of each key fails after its steps.
                let fail = !failed.lock().unwrap().contains_key(&key);
                let result = checkout(&store, &key, &charge(1), &downstream, fail).await;
                if fail && result == Err(TestError::Transient) {
                    failed.lock().unwrap().insert(key.clone(), true);
                }
                match result {
                    Ok(answer) => return (key, answer),
                    Err(TestError::Transient) => continue,
                    Err(other) => panic!("{other:?}"),
                }
            }
        }));
    }
    let mut by_key: HashMap<String, Vec<(String, String)>> = HashMap::new();
    for task in tasks {
        let (key, answer) = task.await.unwrap();
        by_key.entry(key).or_default().push(answer);
    }
    assert_eq!(downstream.count("charge"), KEYS, "one charge per key");
    assert_eq!(downstream.count("email"), KEYS, "one email per key");
    for answers in by_key.values() {
        assert!(answers.iter().all(|a| a == &answers[0]), "{answers:?}");
    }
}
