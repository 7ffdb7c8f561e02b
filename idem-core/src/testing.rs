//! The contract conformance suite, for anyone who writes a [`Store`]:
//! each record transition, and each step transition where the store keeps
//! a [`Journal`], called straight on the store and checked against the
//! contract (atomic claims, fencing by token, answers sent again, expiry,
//! purge, forget).
//!
//! Each case is a plain `async fn` that takes a fresh store and panics
//! when the store breaks the contract. [`contract_conformance!`](crate::contract_conformance)
//! turns them into tests: one `#[test]` per case, each on a store of its
//! own, run on a multi-thread tokio runtime of 4 workers. The `idem`
//! crate's own suite (`idem::store_conformance!`, feature `testing`) runs
//! these cases too, and the engine's calls through the store besides.
//!
//! Every case works on keys that no other case, process or run uses, so
//! that stores on one database can run the cases in parallel and again.
//!
//! ```text
//! // tests/contract.rs of a crate with a store of its own: a future
//! // yielding the store, and a guard dropped when the case ends (a
//! // temporary directory, a table to drop; `()` for none).
//! idem_core::contract_conformance!(my_store, async { (MyStore::new(), ()) });
//! ```
//!
//! `idem-core/tests/user_store.rs` is such a crate's test, whole.

use std::future::Future;
use std::sync::atomic::{AtomicUsize, Ordering};
use std::sync::Arc;
use std::time::Duration;

use crate::error::Error;
use crate::fingerprint::Fingerprint;
use crate::journal::{StepBegin, StepRequest, StepRun};
use crate::key::{Key, Scope};
use crate::record::{Begin, BeginRequest, Claim, ClaimToken, Outcome, OutcomeKind, State};
use crate::store::{Journal, Store};

/// Emits the contract conformance suite for one store: a module named
/// `$name` with one `#[test]` per case. `$make` is a future yielding
/// `(store, guard)`, evaluated afresh for every case.
#[macro_export]
macro_rules! contract_conformance {
    ($name:ident, $make:expr $(,)?) => {
        mod $name {
            #[allow(unused_imports)]
            use super::*;

            $crate::contract_conformance!(@cases $make;
                a_claim_is_granted_once,
                a_claim_sent_again_is_granted_again,
                a_completed_key_replays,
                another_payload_is_refused,
                a_lapsed_lease_is_taken_over_and_fenced,
                a_release_frees_the_key,
                a_completion_sent_again_is_accepted,
                an_expired_record_frees_the_key,
                purge_deletes_only_what_expired,
                forget_frees_the_key_and_fences_its_owner,
                the_journal_replays_and_fences,
            );
        }
    };
    (@cases $make:expr; $($case:ident),* $(,)?) => {$(
        #[test]
        fn $case() {
            $crate::testing::run_case(async {
                let (store, _guard) = $make.await;
                $crate::testing::$case(store).await;
            });
        }
    )*};
}

/// Runs one case as `#[tokio::test(flavor = "multi_thread",
/// worker_threads = 4)]` would, so that a crate of tests needs no tokio
/// of its own.
pub fn run_case<F: Future<Output = ()>>(case: F) {
    tokio::runtime::Builder::new_multi_thread()
        .worker_threads(4)
        .enable_all()
        .build()
        .expect("a tokio runtime for the conformance case")
        .block_on(case)
}

/// A key no other case, process or run uses.
fn fresh(tag: &str) -> (Scope, Key) {
    static N: AtomicUsize = AtomicUsize::new(0);
    let nanos = std::time::SystemTime::now()
        .duration_since(std::time::UNIX_EPOCH)
        .map(|d| d.as_nanos())
        .unwrap_or(0);
    let key = format!(
        "{tag}-{}-{nanos}-{}",
        std::process::id(),
        N.fetch_add(1, Ordering::Relaxed)
    );
    (Scope::new("contract"), Key::new(key).expect("a valid key"))
}

fn fingerprint(payload: &str) -> Fingerprint {
    Fingerprint::of(&payload).expect("a fingerprint")
}

fn request<'a>(
    scope: &'a Scope,
    key: &'a Key,
    fingerprint: &'a Fingerprint,
    lease: Duration,
    ttl: Duration,
) -> BeginRequest<'a> {
    BeginRequest {
        scope,
        key,
        fingerprint,
        token: ClaimToken::new(),
        lease,
        ttl,
    }
}

const LONG: Duration = Duration::from_secs(60);

fn outcome(body: &str) -> Outcome {
    Outcome {
        kind: OutcomeKind::Ok,
        body: body.as_bytes().to_vec(),
    }
}

async fn claimed<S: Store + ?Sized>(store: &S, request: &BeginRequest<'_>) -> Claim {
    match store.begin(request).await.expect("the claim") {
        Begin::Claimed(claim) => claim,
        other => panic!("a free key was not claimed: {other:?}"),
    }
}

fn lost<T: std::fmt::Debug>(result: Result<T, Error>) -> bool {
    matches!(result, Err(Error::LeaseLost))
}

/// Of 16 concurrent claims on one free key, each with its own token,
/// exactly one is granted; the others find it in progress.
pub async fn a_claim_is_granted_once<S: Store + 'static>(store: S) {
    let store = Arc::new(store);
    let (scope, key) = fresh("once");
    let fp = fingerprint("charge 100");
    let barrier = Arc::new(tokio::sync::Barrier::new(16));
    let tasks: Vec<_> = (0..16)
        .map(|_| {
            let (store, barrier) = (store.clone(), barrier.clone());
            let (scope, key, fp) = (scope.clone(), key.clone(), fp);
            tokio::spawn(async move {
                barrier.wait().await;
                store.begin(&request(&scope, &key, &fp, LONG, LONG)).await
            })
        })
        .collect();
    let mut granted = 0;
    for task in tasks {
        match task.await.expect("the task").expect("the claim") {
            Begin::Claimed(claim) => {
                assert_eq!(claim.fence, 1, "a fresh record has fence 1");
                granted += 1;
            }
            Begin::InProgress { .. } => {}
            other => panic!("a concurrent claim answered {other:?}"),
        }
    }
    assert_eq!(granted, 1, "{granted} of 16 concurrent claims were granted");
    let record = store.get(&scope, &key).await.unwrap().expect("the record");
    assert_eq!(record.state, State::InProgress);
}

/// A claim sent again with its token, its first answer lost, is granted
/// again while it stands; a claim with another token is not.
pub async fn a_claim_sent_again_is_granted_again<S: Store>(store: S) {
    let (scope, key) = fresh("again");
    let fp = fingerprint("charge 100");
    let first = request(&scope, &key, &fp, LONG, LONG);
    let claim = claimed(&store, &first).await;
    let again = claimed(&store, &first).await;
    assert_eq!(again.token, claim.token);
    let other = request(&scope, &key, &fp, LONG, LONG);
    assert!(matches!(
        store.begin(&other).await.unwrap(),
        Begin::InProgress { .. }
    ));
    assert!(matches!(
        store.peek(&other).await.unwrap(),
        None | Some(Begin::InProgress { .. })
    ));
}

/// Once completed, the key answers its outcome to the same payload, by a
/// claim and by a look.
pub async fn a_completed_key_replays<S: Store>(store: S) {
    let (scope, key) = fresh("replay");
    let fp = fingerprint("charge 100");
    let claim = claimed(&store, &request(&scope, &key, &fp, LONG, LONG)).await;
    store.complete(&claim, &outcome("receipt")).await.unwrap();
    let later = request(&scope, &key, &fp, LONG, LONG);
    assert_eq!(
        store.begin(&later).await.unwrap(),
        Begin::Replay(outcome("receipt"))
    );
    if let Some(answer) = store.peek(&later).await.unwrap() {
        assert_eq!(answer, Begin::Replay(outcome("receipt")));
    }
    let record = store.get(&scope, &key).await.unwrap().expect("the record");
    assert_eq!(record.state, State::Completed);
    assert_eq!(record.outcome, Some(outcome("receipt")));
}

/// A key claimed or completed with one payload refuses another.
pub async fn another_payload_is_refused<S: Store>(store: S) {
    let (scope, key) = fresh("reused");
    let (fp, other) = (fingerprint("charge 100"), fingerprint("charge 999"));
    let claim = claimed(&store, &request(&scope, &key, &fp, LONG, LONG)).await;
    let reused = request(&scope, &key, &other, LONG, LONG);
    assert_eq!(store.begin(&reused).await.unwrap(), Begin::KeyReused);
    store.complete(&claim, &outcome("receipt")).await.unwrap();
    assert_eq!(store.begin(&reused).await.unwrap(), Begin::KeyReused);
}

/// A lapsed lease is taken over with the next fence, and the old owner's
/// renewal, completion and release are refused.
pub async fn a_lapsed_lease_is_taken_over_and_fenced<S: Store>(store: S) {
    let (scope, key) = fresh("takeover");
    let fp = fingerprint("charge 100");
    let short = Duration::from_millis(150);
    let old = claimed(&store, &request(&scope, &key, &fp, short, LONG)).await;
    tokio::time::sleep(Duration::from_millis(400)).await;
    let new = claimed(&store, &request(&scope, &key, &fp, LONG, LONG)).await;
    assert_eq!(new.fence, old.fence + 1, "a takeover adds one to the fence");
    assert!(lost(store.renew(&old).await), "the old owner renewed");
    assert!(
        lost(store.complete(&old, &outcome("old")).await),
        "the old owner completed"
    );
    assert!(lost(store.release(&old).await), "the old owner released");
    store.renew(&new).await.unwrap();
    store.complete(&new, &outcome("new")).await.unwrap();
    let again = request(&scope, &key, &fp, LONG, LONG);
    assert_eq!(
        store.begin(&again).await.unwrap(),
        Begin::Replay(outcome("new"))
    );
}

/// A release deletes the claim: the next caller claims afresh, and the
/// released owner can neither renew nor complete.
pub async fn a_release_frees_the_key<S: Store>(store: S) {
    let (scope, key) = fresh("release");
    let fp = fingerprint("charge 100");
    let first = claimed(&store, &request(&scope, &key, &fp, LONG, LONG)).await;
    store.release(&first).await.unwrap();
    assert!(lost(store.renew(&first).await), "a released claim renewed");
    let second = claimed(&store, &request(&scope, &key, &fp, LONG, LONG)).await;
    assert!(
        lost(store.complete(&first, &outcome("zombie")).await),
        "a released claim completed"
    );
    store.complete(&second, &outcome("receipt")).await.unwrap();
}

/// A completion sent again after its answer was lost is accepted with the
/// same outcome, and refused with another.
pub async fn a_completion_sent_again_is_accepted<S: Store>(store: S) {
    let (scope, key) = fresh("complete-again");
    let fp = fingerprint("charge 100");
    let claim = claimed(&store, &request(&scope, &key, &fp, LONG, LONG)).await;
    store.complete(&claim, &outcome("receipt")).await.unwrap();
    store.complete(&claim, &outcome("receipt")).await.unwrap();
    assert!(lost(store.complete(&claim, &outcome("other")).await));
}

/// A completed record whose ttl ran out frees its key.
pub async fn an_expired_record_frees_the_key<S: Store>(store: S) {
    let (scope, key) = fresh("ttl");
    let fp = fingerprint("charge 100");
    let short = Duration::from_millis(200);
    let claim = claimed(&store, &request(&scope, &key, &fp, LONG, short)).await;
    store.complete(&claim, &outcome("receipt")).await.unwrap();
    tokio::time::sleep(Duration::from_millis(500)).await;
    let next = claimed(&store, &request(&scope, &key, &fp, LONG, LONG)).await;
    assert_ne!(next.token, claim.token);
}

/// A purge deletes expired records, and keeps live ones.
pub async fn purge_deletes_only_what_expired<S: Store>(store: S) {
    let (scope, gone) = fresh("purge-gone");
    let (_, kept) = fresh("purge-kept");
    let fp = fingerprint("charge 100");
    let short = Duration::from_millis(150);
    let expiring = claimed(&store, &request(&scope, &gone, &fp, LONG, short)).await;
    store.complete(&expiring, &outcome("old")).await.unwrap();
    let live = claimed(&store, &request(&scope, &kept, &fp, LONG, LONG)).await;
    store.complete(&live, &outcome("new")).await.unwrap();
    tokio::time::sleep(Duration::from_millis(400)).await;
    let purged = store.purge_expired(100).await.unwrap();
    if !store.capabilities().deletes_expired_itself {
        assert!(purged >= 1, "the expired record was not purged");
        assert!(store.get(&scope, &gone).await.unwrap().is_none());
    }
    let record = store
        .get(&scope, &kept)
        .await
        .unwrap()
        .expect("the live record");
    assert_eq!(record.outcome, Some(outcome("new")));
}

/// `forget` deletes the record whatever its state: the key is free, and
/// the forgotten owner is fenced out.
pub async fn forget_frees_the_key_and_fences_its_owner<S: Store>(store: S) {
    let (scope, key) = fresh("forget");
    let fp = fingerprint("charge 100");
    let owner = claimed(&store, &request(&scope, &key, &fp, LONG, LONG)).await;
    assert!(store.forget(&scope, &key).await.unwrap());
    assert!(store.get(&scope, &key).await.unwrap().is_none());
    assert!(!store.forget(&scope, &key).await.unwrap());
    let next = claimed(&store, &request(&scope, &key, &fp, LONG, LONG)).await;
    assert!(
        lost(store.renew(&owner).await),
        "the forgotten owner renewed"
    );
    assert!(
        lost(store.complete(&owner, &outcome("zombie")).await),
        "the forgotten owner completed"
    );
    store.complete(&next, &outcome("receipt")).await.unwrap();
}

/// Where the store keeps a journal: a step begun runs, its output is
/// replayed to the next attempt of the operation, a completion sent again
/// is accepted, and an attempt that lost the key writes nothing.
pub async fn the_journal_replays_and_fences<S: Store>(store: S) {
    let Some(journal) = store.journal() else {
        return;
    };
    let (scope, key) = fresh("journal");
    let fp = fingerprint("charge 100");
    let step_fp = fingerprint("step charge");
    let short = Duration::from_millis(150);
    let first = claimed(&store, &request(&scope, &key, &fp, short, LONG)).await;
    let step = StepRequest {
        claim: &first,
        seq: 0,
        name: "charge",
        fingerprint: &step_fp,
        ttl: LONG,
        adopt: false,
        settle: Duration::ZERO,
    };
    assert_eq!(
        journal.begin_step(&step).await.unwrap(),
        StepBegin::Run(StepRun::Fresh)
    );
    journal.complete_step(&step, b"\"ch_1\"").await.unwrap();
    journal.complete_step(&step, b"\"ch_1\"").await.unwrap();
    // The attempt dies; the next one takes the key over and replays.
    tokio::time::sleep(Duration::from_millis(400)).await;
    let second = claimed(&store, &request(&scope, &key, &fp, LONG, LONG)).await;
    let replayed = StepRequest {
        claim: &second,
        ..step
    };
    assert_eq!(
        journal.begin_step(&replayed).await.unwrap(),
        StepBegin::Replay(b"\"ch_1\"".to_vec())
    );
    // `step` is still the first attempt's.
    let next = StepRequest {
        seq: 1,
        name: "email",
        ..step
    };
    assert!(
        lost(journal.begin_step(&next).await),
        "an attempt that lost the key began a step"
    );
    let entries = journal.steps(&scope, &key).await.unwrap();
    assert_eq!(entries.len(), 1, "the fenced-out step left an entry");
    journal_is_kept(journal, &scope, &key).await;
}

async fn journal_is_kept(journal: &dyn Journal, scope: &Scope, key: &Key) {
    journal.keep_steps(scope, key, LONG).await.unwrap();
    assert_eq!(journal.steps(scope, key).await.unwrap().len(), 1);
}
