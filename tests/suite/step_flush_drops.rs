//! A caller dropped while its durable steps' journal writes are on their
//! way: the claim is handed back only after they land, wherever the drop
//! finds the operation. The engine's guard keeps a handle on the
//! operation and, as the caller drops, waits for the writes before it
//! hands the claim back; the body itself waits for them after it returns
//! (`flushed` in src/steps.rs), and a drop during that wait must leave
//! them to the guard rather than take them along.
//!
//! The store is `MemoryStore` behind a wrapper whose step completions take
//! a while (a store across a network), so that a journal write behind the
//! body is still on its way when the caller is dropped. Each test counts
//! the downstream effect of a step that is rerun when in doubt and asserts
//! it happened once.

use crate::common::journal_of;
use idem::store::{Capabilities, Detach, Journal};
use std::sync::atomic::{AtomicUsize, Ordering};
use std::sync::Arc;
use std::time::Duration;

use async_trait::async_trait;
use idem::journal::{StepAt, StepBegin, StepRecord, StepRequest, StepResolution};
use idem::record::{Begin, Claim, Outcome, Record};
use idem::steps::step;
use idem::store::BeginRequest;
use idem::{run, Call, Error, Key, MemoryStore, Policy, Scope, Store};

/// How long a step completion takes to land.
const WRITE: Duration = Duration::from_millis(300);

/// `MemoryStore`, whose `complete_step` takes [`WRITE`].
#[derive(Clone, Default)]
struct SlowJournal(MemoryStore);

#[async_trait]
impl Store for SlowJournal {
    async fn begin(&self, request: &BeginRequest<'_>) -> Result<Begin, Error> {
        self.0.begin(request).await
    }
    async fn peek(&self, request: &BeginRequest<'_>) -> Result<Option<Begin>, Error> {
        self.0.peek(request).await
    }
    async fn renew(&self, claim: &Claim) -> Result<(), Error> {
        self.0.renew(claim).await
    }
    async fn complete(&self, claim: &Claim, outcome: &Outcome) -> Result<(), Error> {
        self.0.complete(claim, outcome).await
    }
    async fn release(&self, claim: &Claim) -> Result<(), Error> {
        self.0.release(claim).await
    }
    async fn get(&self, scope: &Scope, key: &Key) -> Result<Option<Record>, Error> {
        self.0.get(scope, key).await
    }
    async fn forget(&self, scope: &Scope, key: &Key) -> Result<bool, Error> {
        self.0.forget(scope, key).await
    }
    async fn purge_expired(&self, batch: usize) -> Result<u64, Error> {
        self.0.purge_expired(batch).await
    }
    fn journal(&self) -> Option<&dyn Journal> {
        Some(self)
    }
    fn capabilities(&self) -> Capabilities<'_> {
        Capabilities::default().with_detach(self)
    }
}

#[async_trait]
impl Journal for SlowJournal {
    async fn begin_step(&self, step: &StepRequest<'_>) -> Result<StepBegin, Error> {
        journal_of(&self.0).begin_step(step).await
    }
    async fn complete_step(&self, step: &StepRequest<'_>, output: &[u8]) -> Result<(), Error> {
        tokio::time::sleep(WRITE).await;
        journal_of(&self.0).complete_step(step, output).await
    }
    async fn undo_step(&self, step: &StepRequest<'_>) -> Result<bool, Error> {
        journal_of(&self.0).undo_step(step).await
    }
    async fn steps(&self, scope: &Scope, key: &Key) -> Result<Vec<StepRecord>, Error> {
        journal_of(&self.0).steps(scope, key).await
    }
    async fn resolve_step(&self, step: &StepAt<'_>, to: &StepResolution) -> Result<bool, Error> {
        journal_of(&self.0).resolve_step(step, to).await
    }
    fn writes_beside(&self) -> bool {
        true
    }
    async fn keep_steps(
        &self,
        scope: &Scope,
        key: &Key,
        ttl: std::time::Duration,
    ) -> Result<(), Error> {
        journal_of(&self.0).keep_steps(scope, key, ttl).await
    }
}

impl Detach for SlowJournal {
    fn detach(&self) -> Option<Arc<dyn Store>> {
        Some(Arc::new(self.clone()))
    }
}

const SCOPE: &str = "flush_drops.pay";

/// One step, rerun when in doubt (the default), whose effect is counted;
/// then `after` (a pause in the body, or nothing).
async fn pay(
    store: &SlowJournal,
    key: &str,
    effects: &AtomicUsize,
    after: Duration,
) -> Result<u32, Error> {
    run(
        store,
        Call::new(SCOPE, key, &1u32).with_policy(Policy::new().lease(Duration::from_secs(30))),
        async move {
            let charged: u32 = step("charge", |_key| async move {
                effects.fetch_add(1, Ordering::SeqCst);
                Ok::<_, Error>(7)
            })
            .await?;
            if !after.is_zero() {
                tokio::time::sleep(after).await;
            }
            Ok(charged)
        },
    )
    .await
}

/// Waits until the dropped caller's claim was handed back (the record is
/// gone), then until any write of the dropped attempt has landed or been
/// refused.
async fn handed_back(store: &SlowJournal, key: &str) {
    let (scope, key) = (Scope::new(SCOPE), Key::new(key).unwrap());
    tokio::time::timeout(Duration::from_secs(5), async {
        while store.get(&scope, &key).await.unwrap().is_some() {
            tokio::time::sleep(Duration::from_millis(5)).await;
        }
    })
    .await
    .expect("the dropped caller's claim was never handed back");
    tokio::time::sleep(WRITE * 2).await;
}

/// Control: the caller is dropped while the body waits after its step,
/// its output write on its way. The guard's flush awaits that write
/// before the claim is handed back, so the retry replays the step.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn dropped_while_the_body_waits_after_a_step() {
    let store = SlowJournal::default();
    let effects = AtomicUsize::new(0);
    let dropped = tokio::time::timeout(
        Duration::from_millis(100),
        pay(&store, "k-body", &effects, Duration::from_secs(10)),
    )
    .await;
    assert!(dropped.is_err(), "the body was to be cut off: {dropped:?}");
    handed_back(&store, "k-body").await;
    let again = pay(&store, "k-body", &effects, Duration::ZERO).await;
    assert_eq!(again.unwrap(), 7);
    assert_eq!(effects.load(Ordering::SeqCst), 1, "the step ran again");
}

/// The body has returned and waits for its step's output write
/// (`Operation::flush`), which it took out of the operation's list. The
/// caller is dropped there. Were the write dropped with that wait, the
/// guard would find the list empty and hand the claim back at once,
/// before the step's output lands (it then lands no more: fenced out by
/// the released claim), and the retry would find the step in doubt and
/// run it again.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn dropped_while_the_body_flushes_its_journal_writes() {
    let store = SlowJournal::default();
    let effects = AtomicUsize::new(0);
    let dropped = tokio::time::timeout(
        Duration::from_millis(100),
        pay(&store, "k-flush", &effects, Duration::ZERO),
    )
    .await;
    assert!(dropped.is_err(), "the flush was to be cut off: {dropped:?}");
    assert_eq!(effects.load(Ordering::SeqCst), 1);
    handed_back(&store, "k-flush").await;
    let again = pay(&store, "k-flush", &effects, Duration::ZERO).await;
    assert_eq!(again.unwrap(), 7);
    assert_eq!(
        effects.load(Ordering::SeqCst),
        1,
        "the claim was handed back before the step's journal write landed: the step ran again"
    );
}

/// A dropped caller's claim must not be handed back before its journal
/// write on the way lands: the same as above, raced at many drop points
/// (every 40 ms across the write), each on its own key.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn dropped_at_many_points_across_the_write() {
    let store = SlowJournal::default();
    let mut twice = Vec::new();
    for at in (10..=290).step_by(40) {
        let key = format!("k-at-{at}");
        let effects = AtomicUsize::new(0);
        let _ = tokio::time::timeout(
            Duration::from_millis(at),
            pay(&store, &key, &effects, Duration::ZERO),
        )
        .await;
        handed_back(&store, &key).await;
        pay(&store, &key, &effects, Duration::ZERO).await.unwrap();
        if effects.load(Ordering::SeqCst) != 1 {
            twice.push(at);
        }
    }
    assert!(
        twice.is_empty(),
        "dropped at these ms, the step ran twice: {twice:?}"
    );
}

/// A step called from a task the body spawned does not see the
/// operation: refused, and its function is not called.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_step_in_a_task_the_body_spawned_is_refused() {
    let store = SlowJournal::default();
    let effects = Arc::new(AtomicUsize::new(0));
    let inner = effects.clone();
    let result = run(&store, Call::new(SCOPE, "k-spawned", &1u32), async move {
        let refused = tokio::spawn(async move {
            step("charge", |_key| async move {
                inner.fetch_add(1, Ordering::SeqCst);
                Ok::<u32, Error>(7)
            })
            .await
        })
        .await
        .unwrap();
        Ok::<_, Error>(refused)
    })
    .await
    .unwrap();
    assert!(
        matches!(&result, Err(Error::Config(message)) if message.contains("spawned")),
        "{result:?}"
    );
    assert_eq!(effects.load(Ordering::SeqCst), 0);
}
