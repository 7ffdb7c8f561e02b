//! A store that wraps another, and the optional parts it offers
//! (`Store::capabilities`): the rule for wrapper authors, shown on a
//! wrapper that counts its own transitions in front of `MemoryStore`.
//!
//! The engine calls a store's `Immediate` (`begin_now`, `complete_now`)
//! instead of its `begin` and `complete`, and does the work that outlives
//! a caller (journaling durable steps, handing a dropped caller's claim
//! back) through its `Detach` handle. So:
//!
//! - a wrapper that passes the inner store's capabilities on whole is
//!   bypassed: claims, completions, the journal and the hand-back all go
//!   straight to the inner store, and the wrapper sees only what has no
//!   fast path (a release after a failed body);
//! - a wrapper that offers what it implements itself (here the inner
//!   store's `Wake`, which it does not change, and a `Detach` handle that
//!   is the wrapper again, over the inner store's handle) sees every
//!   transition;
//! - a wrapper that offers nothing stays correct for its records, but
//!   cannot journal steps: without a background handle, its steps are
//!   refused with a configuration error (run unjournaled, a retry would
//!   run them again).
//!
//! Each test runs the same calls and asserts, phase by phase, which of
//! them reached the wrapper; a change in how the engine uses the parts a
//! store offers shows up here.

use std::sync::atomic::{AtomicUsize, Ordering};
use std::sync::Arc;
use std::time::Duration;

use async_trait::async_trait;
use idem::journal::{StepAt, StepBegin, StepRecord, StepRequest, StepResolution};
use idem::record::{Begin, Claim, Outcome, Record, State};
use idem::steps::step;
use idem::store::{BeginRequest, Capabilities, Detach, Journal};
use idem::{run, Call, Error, Key, MemoryStore, Policy, Scope, Store};

use crate::common::journal_of;

const SCOPE: &str = "wrapper_capabilities.pay";

/// How long a dropped caller's claim may take to be handed back: a task
/// spawned as the caller drops, on a busy machine.
const HAND_BACK: Duration = Duration::from_secs(5);

/// What a [`Counting`] wrapper offers the engine.
#[derive(Clone, Copy, Debug)]
enum Offers {
    /// The inner store's capabilities, whole: the hazard.
    Inner,
    /// The inner store's `Wake`, and a `Detach` of its own: the rule.
    OwnDetach,
    /// Nothing (the defaults).
    Nothing,
}

/// The transitions that reached a [`Counting`] wrapper (or a handle it
/// detached), in all or in one phase.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
struct Tally {
    begins: usize,
    completes: usize,
    releases: usize,
    step_begins: usize,
    step_completes: usize,
}

impl std::ops::Sub for Tally {
    type Output = Tally;
    fn sub(self, earlier: Tally) -> Tally {
        Tally {
            begins: self.begins - earlier.begins,
            completes: self.completes - earlier.completes,
            releases: self.releases - earlier.releases,
            step_begins: self.step_begins - earlier.step_begins,
            step_completes: self.step_completes - earlier.step_completes,
        }
    }
}

#[derive(Debug, Default)]
struct Counts {
    begins: AtomicUsize,
    completes: AtomicUsize,
    releases: AtomicUsize,
    step_begins: AtomicUsize,
    step_completes: AtomicUsize,
}

impl Counts {
    fn tally(&self) -> Tally {
        Tally {
            begins: self.begins.load(Ordering::SeqCst),
            completes: self.completes.load(Ordering::SeqCst),
            releases: self.releases.load(Ordering::SeqCst),
            step_begins: self.step_begins.load(Ordering::SeqCst),
            step_completes: self.step_completes.load(Ordering::SeqCst),
        }
    }
}

fn count(counter: &AtomicUsize) {
    counter.fetch_add(1, Ordering::SeqCst);
}

/// A wrapper that counts the claims, completions, releases and step
/// transitions sent to it, forwards everything to `inner`, and offers
/// the engine what `offers` says. The handle it detaches counts into the
/// same [`Counts`].
struct Counting<S> {
    inner: S,
    counts: Arc<Counts>,
    offers: Offers,
}

impl Counting<MemoryStore> {
    fn new(offers: Offers) -> Self {
        Counting {
            inner: MemoryStore::new(),
            counts: Arc::default(),
            offers,
        }
    }
}

#[async_trait]
impl<S: Store + 'static> Store for Counting<S> {
    async fn begin(&self, request: &BeginRequest<'_>) -> Result<Begin, Error> {
        count(&self.counts.begins);
        self.inner.begin(request).await
    }
    async fn peek(&self, request: &BeginRequest<'_>) -> Result<Option<Begin>, Error> {
        self.inner.peek(request).await
    }
    async fn renew(&self, claim: &Claim) -> Result<(), Error> {
        self.inner.renew(claim).await
    }
    async fn complete(&self, claim: &Claim, outcome: &Outcome) -> Result<(), Error> {
        count(&self.counts.completes);
        self.inner.complete(claim, outcome).await
    }
    async fn release(&self, claim: &Claim) -> Result<(), Error> {
        count(&self.counts.releases);
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
    fn journal(&self) -> Option<&dyn Journal> {
        self.inner.journal().map(|_| self as &dyn Journal)
    }
    fn capabilities(&self) -> Capabilities<'_> {
        match self.offers {
            Offers::Inner => self.inner.capabilities(),
            Offers::OwnDetach => {
                let offered = Capabilities::default().with_detach(self);
                match self.inner.capabilities().wake {
                    Some(wake) => offered.with_wake(wake),
                    None => offered,
                }
            }
            Offers::Nothing => Capabilities::default(),
        }
    }
}

#[async_trait]
impl<S: Store + 'static> Journal for Counting<S> {
    async fn begin_step(&self, step: &StepRequest<'_>) -> Result<StepBegin, Error> {
        count(&self.counts.step_begins);
        journal_of(&self.inner).begin_step(step).await
    }
    async fn complete_step(&self, step: &StepRequest<'_>, output: &[u8]) -> Result<(), Error> {
        count(&self.counts.step_completes);
        journal_of(&self.inner).complete_step(step, output).await
    }
    async fn undo_step(&self, step: &StepRequest<'_>) -> Result<bool, Error> {
        journal_of(&self.inner).undo_step(step).await
    }
    async fn steps(&self, scope: &Scope, key: &Key) -> Result<Vec<StepRecord>, Error> {
        journal_of(&self.inner).steps(scope, key).await
    }
    async fn keep_steps(&self, scope: &Scope, key: &Key, ttl: Duration) -> Result<(), Error> {
        journal_of(&self.inner).keep_steps(scope, key, ttl).await
    }
    async fn resolve_step(&self, step: &StepAt<'_>, to: &StepResolution) -> Result<bool, Error> {
        journal_of(&self.inner).resolve_step(step, to).await
    }
    fn writes_beside(&self) -> bool {
        journal_of(&self.inner).writes_beside()
    }
}

impl<S: Store + 'static> Detach for Counting<S> {
    /// The wrapper again, over the inner store's own handle, counting
    /// into the same counts.
    fn detach(&self) -> Option<Arc<dyn Store>> {
        let inner = self.inner.capabilities().detached()?;
        Some(Arc::new(Counting {
            inner,
            counts: self.counts.clone(),
            offers: self.offers,
        }))
    }
}

/// A body error that is not stored: the key is released.
#[derive(Debug)]
enum Failed {
    Transient,
    // Read through `Debug`, in a failed assertion's message.
    #[allow(dead_code)]
    Idem(Error),
}

impl From<Error> for Failed {
    fn from(err: Error) -> Self {
        Failed::Idem(err)
    }
}

/// How the body of [`pay`] ends.
#[derive(Clone, Copy)]
enum Body {
    Succeeds,
    Fails,
    Hangs,
}

/// A payment of one durable step, `charge`, whose runs `charges` counts;
/// then the body ends as `body` says.
async fn pay(
    store: &Counting<MemoryStore>,
    key: &str,
    charges: &AtomicUsize,
    body: Body,
) -> Result<u32, Failed> {
    let policy = Policy::new()
        .lease(Duration::from_secs(30))
        .wait(Duration::from_secs(5));
    run(
        store,
        Call::new(SCOPE, key, &9u32).with_policy(policy),
        async move {
            let charged: u32 = step("charge", |_key| async move {
                count(charges);
                Ok::<_, Failed>(9)
            })
            .await?;
            match body {
                Body::Succeeds => Ok(charged),
                Body::Fails => Err(Failed::Transient),
                Body::Hangs => {
                    tokio::time::sleep(Duration::from_secs(60)).await;
                    Ok(charged)
                }
            }
        },
    )
    .await
}

async fn record(store: &Counting<MemoryStore>, key: &str) -> Option<Record> {
    store
        .get(&Scope::new(SCOPE), &Key::new(key).unwrap())
        .await
        .unwrap()
}

/// Waits until the record of `key` is gone (a dropped caller's claim was
/// handed back), for at most `patience`: whether it went.
async fn handed_back(store: &Counting<MemoryStore>, key: &str, patience: Duration) -> bool {
    tokio::time::timeout(patience, async {
        while record(store, key).await.is_some() {
            tokio::time::sleep(Duration::from_millis(5)).await;
        }
    })
    .await
    .is_ok()
}

/// What each phase of [`calls`] sent to the wrapper, and how many times
/// the step ran in all.
#[derive(Debug, PartialEq, Eq)]
struct Phases {
    /// A first call: its step runs, then its body succeeds.
    first: Tally,
    /// The same call again: replayed.
    replay: Tally,
    /// A call whose body fails after its step: released.
    failure: Tally,
    /// Its retry, which succeeds.
    retry: Tally,
    /// A call dropped while its body runs after its step, until its
    /// claim is handed back (or for the patience given, when it is not).
    dropped: Tally,
    /// Whether the dropped caller's claim was handed back.
    handed_back: bool,
    /// The step's runs, by key: `done`, `failed`, `dropped`.
    charges: [usize; 3],
}

/// Runs the calls of [`Phases`] on a fresh wrapper offering `offers`,
/// and the retry of the dropped call once its claim is free, waiting
/// `patience` for the hand-back.
async fn calls(offers: Offers, patience: Duration) -> Phases {
    let store = Counting::new(offers);
    let charges: [AtomicUsize; 3] = Default::default();
    let mut seen = Tally::default();
    let mut phase = || {
        let now = store.counts.tally();
        let delta = now - seen;
        seen = now;
        delta
    };

    assert_eq!(
        pay(&store, "done", &charges[0], Body::Succeeds)
            .await
            .unwrap(),
        9
    );
    let first = phase();
    assert_eq!(
        pay(&store, "done", &charges[0], Body::Succeeds)
            .await
            .unwrap(),
        9
    );
    let replay = phase();

    let failed = pay(&store, "failed", &charges[1], Body::Fails).await;
    assert!(matches!(failed, Err(Failed::Transient)), "{failed:?}");
    assert!(record(&store, "failed").await.is_none(), "not released");
    let failure = phase();
    assert_eq!(
        pay(&store, "failed", &charges[1], Body::Succeeds)
            .await
            .unwrap(),
        9
    );
    let retry = phase();

    let cut = tokio::time::timeout(
        Duration::from_millis(200),
        pay(&store, "dropped", &charges[2], Body::Hangs),
    )
    .await;
    assert!(cut.is_err(), "the hanging body finished: {cut:?}");
    let handed_back = handed_back(&store, "dropped", patience).await;
    if !handed_back {
        let left = record(&store, "dropped").await.expect("a record");
        assert_eq!(left.state, State::InProgress);
    }
    let dropped = phase();
    if handed_back {
        assert_eq!(
            pay(&store, "dropped", &charges[2], Body::Succeeds)
                .await
                .unwrap(),
            9
        );
    }

    Phases {
        first,
        replay,
        failure,
        retry,
        dropped,
        handed_back,
        charges: charges.map(|c| c.load(Ordering::SeqCst)),
    }
}

/// A [`Tally`] of claims, completions, releases, step begins and step
/// completions, in that order.
const fn tally(
    begins: usize,
    completes: usize,
    releases: usize,
    step_begins: usize,
    step_completes: usize,
) -> Tally {
    Tally {
        begins,
        completes,
        releases,
        step_begins,
        step_completes,
    }
}

/// The hazard: passing the inner store's capabilities on whole, the
/// wrapper is bypassed. The engine claims and completes through
/// `MemoryStore`'s `Immediate`, journals the step and hands the dropped
/// caller's claim back through its `Detach` handle; the wrapper sees one
/// transition in all, the release after the failed body, which has no
/// fast path. The records and the journal are right all the same (the
/// inner store did the work): each step ran once.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_wrapper_passing_on_the_inner_capabilities_is_bypassed() {
    let phases = calls(Offers::Inner, HAND_BACK).await;
    assert_eq!(
        phases,
        Phases {
            first: tally(0, 0, 0, 0, 0),
            replay: tally(0, 0, 0, 0, 0),
            failure: tally(0, 0, 1, 0, 0),
            retry: tally(0, 0, 0, 0, 0),
            dropped: tally(0, 0, 0, 0, 0),
            handed_back: true,
            charges: [1, 1, 1],
        }
    );
}

/// The rule: a wrapper offers what it implements itself. Offering the
/// inner store's `Wake` (waking changes nothing it does) and a `Detach`
/// handle of its own, every claim, completion and release reaches it,
/// the background ones too (the step journaled beside the body, the
/// dropped caller's claim handed back), and each step ran once.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_wrapper_offering_its_own_detach_sees_every_transition() {
    let phases = calls(Offers::OwnDetach, HAND_BACK).await;
    assert_eq!(
        phases,
        Phases {
            first: tally(1, 1, 0, 1, 1),
            replay: tally(1, 0, 0, 0, 0),
            failure: tally(1, 0, 1, 1, 1),
            retry: tally(1, 1, 0, 1, 0),
            dropped: tally(1, 0, 1, 1, 1),
            handed_back: true,
            charges: [1, 1, 1],
        }
    );
}

/// A wrapper that offers nothing sees every transition of its records,
/// but has no background handle, which durable steps journal through.
/// Its steps are refused with a configuration error naming the fix
/// (running them unjournaled would run them again at a retry): the step's
/// call never runs, the key is released, and a call without steps goes
/// through the wrapper as usual.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_wrapper_offering_nothing_has_its_steps_refused() {
    let store = Counting::new(Offers::Nothing);
    let charges = AtomicUsize::new(0);
    let key = crate::common::fresh("wrapper-nothing");
    let err = pay(&store, &key, &charges, Body::Succeeds)
        .await
        .unwrap_err();
    match &err {
        Failed::Idem(Error::Config(message)) => assert!(
            message.contains("with_detach") && message.contains("charge"),
            "{message}"
        ),
        other => panic!("expected a configuration error, got {other:?}"),
    }
    assert_eq!(charges.load(Ordering::SeqCst), 0, "the step's call ran");
    assert_eq!(store.counts.tally(), tally(1, 0, 1, 0, 0));
    assert!(
        record(&store, &key).await.is_none(),
        "the key was not released"
    );

    // A call without steps is the wrapper's as usual.
    let policy = Policy::new().lease(Duration::from_secs(30));
    let plain = || async { Ok::<_, Error>(7u32) };
    let call = || Call::new(SCOPE, key.as_str(), &1u32).with_policy(policy);
    assert_eq!(run(&store, call(), plain()).await.unwrap(), 7);
    assert_eq!(run(&store, call(), plain()).await.unwrap(), 7);
    assert_eq!(store.counts.tally(), tally(3, 1, 1, 0, 0));
}
