//! A live operation's step journal lives as long as the operation: its
//! entries are kept each time its lease is renewed, so that neither the
//! attempt that takes over after a crash nor an operator's purge finds
//! them expired while the operation still runs; and forgetting a key while
//! a duplicate waits on it never hands one request another's outcome.

use crate::common;
use crate::common::journal_of;
use idem::store::{Capabilities, Detach, Journal};

use std::sync::atomic::{AtomicBool, AtomicUsize, Ordering};
use std::sync::Arc;
use std::time::Duration;

use async_trait::async_trait;
use idem::journal::{StepAt, StepBegin, StepRecord, StepRequest, StepResolution, StepState};
use idem::record::{Begin, Claim, Outcome, Record};
use idem::steps::Step;
use idem::store::BeginRequest;
use idem::{run, Call, Error, Key, Policy, Scope, Store};

/// A store handle of a process that can be killed: once `dead`, every
/// call on it hangs for ever (a SIGKILLed or SIGSTOPped process sends
/// nothing more), its detached handles too (nothing is handed back for a
/// dropped caller: the claim is left to its lease, as after a crash).
struct Killable<S> {
    inner: S,
    dead: Arc<AtomicBool>,
}

impl<S> Killable<S> {
    async fn alive(&self) {
        if self.dead.load(Ordering::SeqCst) {
            std::future::pending::<()>().await;
        }
    }
}

#[async_trait]
impl<S: Store> Store for Killable<S> {
    async fn begin(&self, request: &BeginRequest<'_>) -> Result<Begin, Error> {
        self.alive().await;
        self.inner.begin(request).await
    }
    async fn peek(&self, request: &BeginRequest<'_>) -> Result<Option<Begin>, Error> {
        self.alive().await;
        self.inner.peek(request).await
    }
    async fn renew(&self, claim: &Claim) -> Result<(), Error> {
        self.alive().await;
        self.inner.renew(claim).await
    }
    async fn complete(&self, claim: &Claim, outcome: &Outcome) -> Result<(), Error> {
        self.alive().await;
        self.inner.complete(claim, outcome).await
    }
    async fn release(&self, claim: &Claim) -> Result<(), Error> {
        self.alive().await;
        self.inner.release(claim).await
    }
    async fn get(&self, scope: &Scope, key: &Key) -> Result<Option<Record>, Error> {
        self.alive().await;
        self.inner.get(scope, key).await
    }
    async fn forget(&self, scope: &Scope, key: &Key) -> Result<bool, Error> {
        self.alive().await;
        self.inner.forget(scope, key).await
    }
    async fn purge_expired(&self, batch: usize) -> Result<u64, Error> {
        self.alive().await;
        self.inner.purge_expired(batch).await
    }
    fn journal(&self) -> Option<&dyn Journal> {
        Some(self)
    }
    fn capabilities(&self) -> Capabilities<'_> {
        Capabilities::default().with_detach(self)
    }
}

#[async_trait]
impl<S: Store> Journal for Killable<S> {
    async fn begin_step(&self, step: &StepRequest<'_>) -> Result<StepBegin, Error> {
        self.alive().await;
        journal_of(&self.inner).begin_step(step).await
    }
    async fn complete_step(&self, step: &StepRequest<'_>, output: &[u8]) -> Result<(), Error> {
        self.alive().await;
        journal_of(&self.inner).complete_step(step, output).await
    }
    async fn undo_step(&self, step: &StepRequest<'_>) -> Result<bool, Error> {
        self.alive().await;
        journal_of(&self.inner).undo_step(step).await
    }
    async fn steps(&self, scope: &Scope, key: &Key) -> Result<Vec<StepRecord>, Error> {
        self.alive().await;
        journal_of(&self.inner).steps(scope, key).await
    }
    async fn keep_steps(&self, scope: &Scope, key: &Key, ttl: Duration) -> Result<(), Error> {
        self.alive().await;
        journal_of(&self.inner).keep_steps(scope, key, ttl).await
    }
    async fn resolve_step(&self, step: &StepAt<'_>, to: &StepResolution) -> Result<bool, Error> {
        self.alive().await;
        journal_of(&self.inner).resolve_step(step, to).await
    }
    fn writes_beside(&self) -> bool {
        journal_of(&self.inner).writes_beside()
    }
}

impl<S: Store> Detach for Killable<S> {
    /// The same dying process: what it hands back or saves in the
    /// background goes nowhere once it is dead.
    fn detach(&self) -> Option<Arc<dyn Store>> {
        Some(Arc::new(Killable {
            inner: self.inner.capabilities().detached()?,
            dead: self.dead.clone(),
        }))
    }
}

const SCOPE: &str = "live_journals.pay";
/// The lease and the ttl of the operation: equal, so that "the ttl is
/// shorter than the lease" plays no part.
const LEASE: Duration = Duration::from_millis(600);
const TTL: Duration = Duration::from_millis(600);
/// A ttl longer than the lease, so that an attempt taking over after a
/// crash comes within a ttl of its owner's last renewal.
const LONG_TTL: Duration = Duration::from_millis(1200);
/// A ttl shorter than the live owner's body (so an entry that is not kept
/// expires before the owner dies), and long enough that the attempt
/// taking over, a lease and 300 ms after the owner died, comes well within
/// a ttl of the owner's last renewal, however late a loaded machine ran it.
const OUTLIVING_TTL: Duration = Duration::from_millis(1800);

/// A downstream that neither dedupes by key nor can be asked: the reason
/// its step refuses when in doubt. Counts its charges.
#[derive(Default)]
struct Gateway {
    charges: AtomicUsize,
}

/// One attempt of the payment: a refusing step "charge", then `work`
/// more of the body (the rest of the operation: a slow call, a report),
/// during which the lease is renewed.
async fn pay<S: Store + ?Sized>(
    store: &S,
    key: &str,
    gateway: &Gateway,
    work: Duration,
    ttl: Duration,
) -> Result<String, Error> {
    let call = Call::new(SCOPE, key, &500u64).with_policy(
        Policy::new()
            .lease(LEASE)
            .ttl(ttl)
            .wait(Duration::from_secs(5)),
    );
    run(store, call, async move {
        let charge = Step::new("charge")
            .refuse()
            .run(|_key| async move {
                let n = gateway.charges.fetch_add(1, Ordering::SeqCst) + 1;
                Ok::<_, Error>(format!("ch_{n}"))
            })
            .await?;
        tokio::time::sleep(work).await;
        Ok(charge)
    })
    .await
}

/// A journal entry is kept `max(ttl, lease)` from its last write, and was
/// not kept any longer while its operation ran on: once the body of a
/// live, renewed owner had run longer than that after a step, the step
/// was no longer journaled, and the attempt taking over after a crash
/// ran it again, though it refuses when in doubt ("no second effect,
/// ever").
///
/// 1. A claims (lease 600 ms, ttl 1.8 s), runs its refusing step "charge"
///    (charge 1, journaled `completed`), then works on for 3 s, its lease
///    renewed every 200 ms (a live owner).
/// 2. At 2.4 s A's process dies (its store handle hangs; nothing is
///    handed back): an entry written at the charge and never kept would
///    have expired by then.
/// 3. Once A's lease lapsed (at about 3.3 s), within a ttl of its last
///    renewal, the retry B takes the key over.
///
/// Expected (the guide's steps chapter, src/_guide/steps.md): B replays `ch_1`, the gateway
/// charged once.
async fn journal_outlives_live_owner<S: Store>(store: S) {
    let store = Arc::new(store);
    let key = common::fresh("journal-expiry");
    let gateway = Arc::new(Gateway::default());
    let dead = Arc::new(AtomicBool::new(false));
    let a_store = Killable {
        inner: store.clone(),
        dead: dead.clone(),
    };
    {
        let a = pay(
            &a_store,
            &key,
            &gateway,
            Duration::from_millis(3000),
            OUTLIVING_TTL,
        );
        tokio::pin!(a);
        tokio::select! {
            result = &mut a => panic!("A ended before it was killed: {result:?}"),
            _ = tokio::time::sleep(Duration::from_millis(2400)) => {}
        }
        // The record is A's and live: its lease was renewed all along.
        let record = store
            .get(&Scope::new(SCOPE), &Key::new(key.as_str()).unwrap())
            .await
            .unwrap()
            .expect("A's record is there");
        assert_eq!(record.state, idem::record::State::InProgress);
        dead.store(true, Ordering::SeqCst);
    }
    assert_eq!(gateway.charges.load(Ordering::SeqCst), 1);
    // A's lease lapses (at most a lease after its last renewal).
    tokio::time::sleep(LEASE + Duration::from_millis(300)).await;
    let b = pay(&*store, &key, &gateway, Duration::ZERO, OUTLIVING_TTL).await;
    assert_eq!(
        gateway.charges.load(Ordering::SeqCst),
        1,
        "the takeover after A's crash charged again (B answered {b:?}): the completed, \
         refusing step's journal entry expired while A still held the operation"
    );
    assert_eq!(b.unwrap(), "ch_1");
}

/// A claim joins its operation's journal: the record it writes must not
/// outlive the steps. A takeover used to give the record a fresh ttl and
/// leave the journal to its own, a ttl from its last write; so when the
/// attempt that took over died before its first renewal, the next one
/// took its record over after the journal had expired, and ran the
/// completed step again.
///
/// 1. A claims (lease 600 ms, ttl 1.2 s), its refusing step charges
///    (`completed`), and A's process dies at once.
/// 2. Once A's lease lapsed (750 ms), B takes over, replays the step, and
///    dies 100 ms later, before its first renewal.
/// 3. Once B's lease lapsed (about 1.45 s after A's charge: past the
///    journal's own expiry, within B's record's ttl), C takes over.
///
/// Expected: C replays `ch_1`; the gateway charged once.
async fn takeover_keeps_journal<S: Store>(store: S) {
    let store = Arc::new(store);
    let key = common::fresh("journal-takeover");
    let gateway = Arc::new(Gateway::default());
    let dies = |dead: &Arc<AtomicBool>| Killable {
        inner: store.clone(),
        dead: dead.clone(),
    };
    let (a_dead, b_dead) = (Arc::default(), Arc::default());
    let (a_store, b_store) = (dies(&a_dead), dies(&b_dead));
    let long = Duration::from_secs(30);
    let a = pay(&a_store, &key, &gateway, long, LONG_TTL);
    tokio::pin!(a);
    // The charge is journaled `completed`.
    let (scope, k) = (Scope::new(SCOPE), Key::new(key.as_str()).unwrap());
    let charged = async {
        loop {
            let steps = journal_of(&store).steps(&scope, &k).await.unwrap();
            if steps.iter().any(|s| s.state == StepState::Completed) {
                break;
            }
            tokio::time::sleep(Duration::from_millis(2)).await;
        }
    };
    tokio::select! {
        result = &mut a => panic!("A ended before it was killed: {result:?}"),
        _ = charged => a_dead.store(true, Ordering::SeqCst),
    }
    tokio::time::sleep(LEASE + Duration::from_millis(150)).await;
    let b = pay(&b_store, &key, &gateway, long, LONG_TTL);
    tokio::pin!(b);
    tokio::select! {
        result = &mut b => panic!("B ended before it was killed: {result:?}"),
        _ = tokio::time::sleep(Duration::from_millis(100)) => b_dead.store(true, Ordering::SeqCst),
    }
    tokio::time::sleep(LEASE).await;
    let c = pay(&*store, &key, &gateway, Duration::ZERO, LONG_TTL).await;
    assert_eq!(
        gateway.charges.load(Ordering::SeqCst),
        1,
        "C took B's record over and charged again (C answered {c:?}): B's takeover gave its \
         record a new ttl, and the journal expired under it"
    );
    assert_eq!(c.unwrap(), "ch_1");
}

/// The same seen from the operator's side: `purge_expired` deleted the
/// journal of an operation in progress whose owner was alive and
/// renewing, as expired housekeeping.
///
/// A runs its step (journaled), then works on for 1.5 s. At 1 s (past
/// `max(ttl, lease)` since the step's write, with A's lease renewed and
/// its record live) the operator's timer runs `purge_expired`.
/// Expected: the live operation's journal is kept (`Journal::steps` still
/// lists the completed step).
async fn purge_keeps_live_journal<S: Store>(store: S) {
    let key = common::fresh("purge-live");
    let (scope, k) = (Scope::new(SCOPE), Key::new(key.as_str()).unwrap());
    let gateway = Gateway::default();
    let a = pay(&store, &key, &gateway, Duration::from_millis(1500), TTL);
    tokio::pin!(a);
    tokio::select! {
        result = &mut a => panic!("A ended early: {result:?}"),
        _ = tokio::time::sleep(Duration::from_millis(1000)) => {}
    }
    let record = store.get(&scope, &k).await.unwrap().expect("A's record");
    assert_eq!(record.state, idem::record::State::InProgress);
    let purged = store.purge_expired(100).await.unwrap();
    let steps = journal_of(&store).steps(&scope, &k).await.unwrap();
    let record = store.get(&scope, &k).await.unwrap().expect("A's record");
    assert_eq!(
        record.state,
        idem::record::State::InProgress,
        "A still holds the key"
    );
    assert!(
        steps.iter().any(|s| s.name == "charge"),
        "after purge_expired ({purged} deleted; Redis expires keys itself), the journal of an \
         operation in progress whose owner is alive is gone: {steps:?}"
    );
    assert_eq!(a.await.unwrap(), "ch_1");
}

/// An operator forgets a key while its
/// owner A runs and a duplicate D of A's payload waits on it in the same
/// process; another request C, with another payload, then claims the
/// freed key and completes before A does. D may run the body itself (the
/// documented cost of forgetting a key in progress) or be told the key
/// was reused, but is never answered with C's outcome, and A's late
/// completion is refused, not stored over C's.
async fn forget_while_waiting<S: Store>(store: S) {
    let key = common::fresh("forget-wait");
    let (scope, k) = (
        Scope::new("live_journals.forget"),
        Key::new(key.as_str()).unwrap(),
    );
    let call = |payload: u32| {
        Call::new("live_journals.forget", key.as_str(), &payload).with_policy(
            Policy::new()
                .lease(Duration::from_secs(5))
                .wait(Duration::from_secs(10)),
        )
    };
    let started = Arc::new(tokio::sync::Notify::new());
    // D starts once A holds the key (else D could claim first, and A
    // replay D's outcome).
    let a_holds = Arc::new(tokio::sync::Notify::new());
    let finish = Arc::new(tokio::sync::Notify::new());
    let a = run(&store, call(1), {
        let (started, a_holds, finish) = (started.clone(), a_holds.clone(), finish.clone());
        async move {
            started.notify_one();
            a_holds.notify_one();
            finish.notified().await;
            Ok::<_, Error>("A".to_owned())
        }
    });
    let d = async {
        a_holds.notified().await;
        run(&store, call(1), async { Ok::<_, Error>("D".to_owned()) }).await
    };
    let operator = async {
        started.notified().await;
        // D is waiting on A by now.
        tokio::time::sleep(Duration::from_millis(300)).await;
        assert!(
            store.forget(&scope, &k).await.unwrap(),
            "A's record was there"
        );
        let c = run(&store, call(2), async { Ok::<_, Error>("C".to_owned()) }).await;
        tokio::time::sleep(Duration::from_millis(300)).await;
        finish.notify_one();
        c
    };
    let (a, d, c) = tokio::join!(a, d, operator);
    assert_eq!(a.unwrap(), "A", "A's caller gets its own value");
    assert!(
        !matches!(&d, Ok(v) if v == "C"),
        "D (payload 1) was answered with C's outcome (payload 2): {d:?}"
    );
    let record = store.get(&scope, &k).await.unwrap().expect("a record");
    match &c {
        Ok(v) => {
            assert_eq!(v, "C");
            assert_eq!(record.outcome.unwrap().body, br#""C""#.to_vec());
        }
        Err(e) => assert!(matches!(e, Error::KeyReused), "C: {e:?}"),
    }
}

common::backends!(memory, sqlite_file, postgres, mysql, redis => {
    #[tokio::test(flavor = "multi_thread", worker_threads = 2)]
    async fn a_live_operations_journal_outlives_its_ttl() {
        let (store, _guard) = backend::store(8).await;
        super::journal_outlives_live_owner(store).await;
    }

    #[tokio::test(flavor = "multi_thread", worker_threads = 2)]
    async fn a_takeover_keeps_the_journal_as_long_as_its_record() {
        let (store, _guard) = backend::store(8).await;
        super::takeover_keeps_journal(store).await;
    }

    #[tokio::test(flavor = "multi_thread", worker_threads = 2)]
    async fn purge_keeps_a_live_operations_journal() {
        let (store, _guard) = backend::store(8).await;
        super::purge_keeps_live_journal(store).await;
    }

    #[tokio::test(flavor = "multi_thread", worker_threads = 2)]
    async fn forget_while_a_duplicate_waits_never_crosses_payloads() {
        let (store, _guard) = backend::store(8).await;
        super::forget_while_waiting(store).await;
    }
});
