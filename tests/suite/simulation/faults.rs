//! The store under a history's fault plan: every method of `idem::Store`
//! is forwarded, and the ones a call's decisions go through (claim, look,
//! renewal, completion, release, step start, step completion, journal
//! upkeep) meet the plan's faults and outages. With a [`Failing`] pair
//! of servers, the plan fails the primary over at the history's
//! [`Failover`](super::history::Failover), and the store talks to the
//! promoted replica from then on.

use crate::common::journal_of;
use idem::store::{Capabilities, Detach, Immediate, Journal, Wake};
use std::collections::HashMap;
use std::future::Future;
use std::pin::Pin;
use std::sync::atomic::{AtomicBool, AtomicUsize, Ordering};
use std::sync::{Arc, Mutex, OnceLock};
use std::time::Duration;

use async_trait::async_trait;
use idem::journal::{StepAt, StepBegin, StepRecord, StepRequest, StepResolution};
use idem::record::{Begin, Claim, Outcome, Record};
use idem::store::BeginRequest;
use idem::{Error, Key, Scope, Store};
use tokio::time::Instant;

use super::history::{FaultKind, History, Op, MAX_OUTCOME};

tokio::task_local! {
    /// The attempt whose task calls the store.
    pub static ATTEMPT: usize;
}

/// A primary and its replica that a plan fails over.
pub trait Failing: Send + Sync {
    /// Promotes the replica: the primary's later writes reach no replica.
    fn promote(&self) -> Pin<Box<dyn Future<Output = ()> + Send + '_>>;
    /// Kills the old primary, and answers the store on the promoted
    /// replica (keyed as the store on the primary was).
    fn kill_primary(&self) -> Arc<dyn Store>;
}

/// The fault plan and what it has done so far; shared by a store and its
/// detached handles.
pub struct Plan {
    history: History,
    start: Instant,
    seen: Mutex<HashMap<Op, u32>>,
    failing: Option<Arc<dyn Failing>>,
    /// When the replica was promoted.
    promoted: Mutex<Option<Instant>>,
    /// The store on the promoted replica, once the old primary is killed.
    after: OnceLock<Arc<dyn Store>>,
    /// Faults stop (the store recovers) once this is set.
    pub calm: AtomicBool,
    /// How many operations a fault or an outage struck.
    pub struck: AtomicUsize,
    /// The attempts that claimed the key when nothing of the operation
    /// was live in the store: each began a new operation.
    pub fresh: Mutex<Vec<usize>>,
    /// Whether [`fresh`](Self::fresh) is looked for (a store that answers
    /// at once, in memory): elsewhere the look would only send requests
    /// it drops.
    pub probe: bool,
}

/// What happens to one operation.
enum Action {
    Pass,
    /// The failover begins: the replica is promoted first.
    Promote,
    Strike(FaultKind),
    Down,
}

impl Plan {
    /// The plan of `history`, which fails `failing` over (when given) at
    /// its failover.
    pub fn new(history: &History, start: Instant, failing: Option<Arc<dyn Failing>>) -> Arc<Plan> {
        Arc::new(Plan {
            history: history.clone(),
            start,
            seen: Mutex::default(),
            failing,
            promoted: Mutex::default(),
            after: OnceLock::new(),
            calm: AtomicBool::new(false),
            struck: AtomicUsize::new(0),
            fresh: Mutex::default(),
            probe: history.backend == super::history::Backend::Memory,
        })
    }

    fn down(&self, op: Op) -> bool {
        let now = self.start.elapsed().as_millis() as u64;
        self.history
            .outages
            .iter()
            .any(|o| o.op == op && (o.from_ms..o.from_ms + o.len_ms).contains(&now))
    }

    /// Whether the `nth` operation `op` begins the failover.
    fn fails_over(&self, op: Op, nth: u32) -> bool {
        self.failing.is_some()
            && self.promoted.lock().unwrap().is_none()
            && self
                .history
                .failover
                .is_some_and(|f| f.op == op && f.nth == nth)
    }

    /// The store on the promoted replica once the failover's window has
    /// passed (or the store has recovered): the old primary is killed the
    /// first time this finds the window over.
    fn promoted_store(&self) -> Option<&Arc<dyn Store>> {
        if let Some(after) = self.after.get() {
            return Some(after);
        }
        let failing = self.failing.as_ref()?;
        let window = Duration::from_millis(self.history.failover?.window_ms);
        let promoted = (*self.promoted.lock().unwrap())?;
        if promoted.elapsed() < window && !self.calm.load(Ordering::SeqCst) {
            return None;
        }
        Some(self.after.get_or_init(|| failing.kill_primary()))
    }

    /// The store has recovered: faults stop, and a failover's window
    /// ends (the old primary is killed if it was not).
    pub fn recover(&self) {
        self.calm.store(true, Ordering::SeqCst);
        let _ = self.promoted_store();
    }

    /// Whether the next `op` would meet a fault, without counting it.
    fn would_strike(&self, op: Op) -> bool {
        if self.calm.load(Ordering::SeqCst) {
            return false;
        }
        let nth = self.seen.lock().unwrap().get(&op).copied().unwrap_or(0);
        self.fails_over(op, nth)
            || self.down(op)
            || self
                .history
                .faults
                .iter()
                .any(|f| f.op == op && f.nth == nth)
    }

    /// Counts one `op` and decides what it meets.
    fn action(&self, op: Op) -> Action {
        let nth = {
            let mut seen = self.seen.lock().unwrap();
            let n = seen.entry(op).or_insert(0);
            *n += 1;
            *n - 1
        };
        if self.calm.load(Ordering::SeqCst) {
            return Action::Pass;
        }
        if self.fails_over(op, nth) {
            self.struck.fetch_add(1, Ordering::SeqCst);
            return Action::Promote;
        }
        if self.down(op) {
            self.struck.fetch_add(1, Ordering::SeqCst);
            return Action::Down;
        }
        match self
            .history
            .faults
            .iter()
            .find(|f| f.op == op && f.nth == nth)
        {
            Some(f) => {
                self.struck.fetch_add(1, Ordering::SeqCst);
                Action::Strike(f.kind)
            }
            None => Action::Pass,
        }
    }

    /// Runs `operation` (a future, so nothing is sent unless it is
    /// awaited) through what the plan has for `op`.
    async fn through<T>(
        &self,
        op: Op,
        operation: impl Future<Output = Result<T, Error>>,
    ) -> Result<T, Error> {
        let injected = |what: &str| Error::store(format!("injected fault: {what} on {op:?}"));
        match self.action(op) {
            Action::Pass => operation.await,
            Action::Promote => {
                // `operation` is the old primary's: it reaches no replica.
                let failing = self.failing.as_ref().expect("a pair to fail over");
                failing.promote().await;
                *self.promoted.lock().unwrap() = Some(Instant::now());
                operation.await
            }
            Action::Down => Err(injected("outage")),
            Action::Strike(FaultKind::Fail) => Err(injected("fail")),
            Action::Strike(FaultKind::LoseReply) => {
                let _ = operation.await;
                Err(injected("reply lost"))
            }
            Action::Strike(FaultKind::DelayPastLease) => {
                tokio::time::sleep(self.history.lease() + Duration::from_millis(10)).await;
                operation.await
            }
            Action::Strike(FaultKind::ConnectionDies { applied }) => {
                tokio::time::sleep(Duration::from_millis(5)).await;
                if applied {
                    let _ = operation.await;
                }
                Err(injected("connection died"))
            }
        }
    }
}

/// `inner` under `plan`.
pub struct Faulty<S> {
    pub inner: S,
    pub plan: Arc<Plan>,
}

impl<S: Store> Faulty<S> {
    /// The store the next operation goes to: `inner`, or after a
    /// failover, the store on the promoted replica.
    pub fn current(&self) -> &dyn Store {
        match self.plan.promoted_store() {
            Some(after) => &**after,
            None => &self.inner,
        }
    }

    /// Notes the calling attempt as beginning a new operation when nothing
    /// of it is live in the store (its expired record and journal
    /// entries purged, an operator's housekeeping that changes no
    /// answer), just before its claim is applied. Only where the store
    /// answers at once (in memory).
    fn note_fresh(&self, request: &BeginRequest<'_>) {
        use futures::FutureExt;
        let Ok(attempt) = ATTEMPT.try_with(|a| *a) else {
            return;
        };
        if !self.plan.probe {
            return;
        }
        let looked = async {
            self.current().purge_expired(100).await?;
            let record = self.current().get(request.scope, request.key).await?;
            let steps = journal_of(&self.current())
                .steps(request.scope, request.key)
                .await?;
            Ok::<_, Error>(record.is_none() && steps.is_empty())
        };
        if let Some(Ok(true)) = looked.now_or_never() {
            self.plan.fresh.lock().unwrap().push(attempt);
        }
    }

    /// `begin` on `store` (chosen as it is sent), its freshness noted as
    /// it is applied.
    async fn begin_noted(
        &self,
        store: &dyn Store,
        request: &BeginRequest<'_>,
    ) -> Result<Begin, Error> {
        self.note_fresh(request);
        store.begin(request).await
    }

    /// An outcome the store cannot hold, refused as a passing failure (a
    /// Redis `proto-max-bulk-len` error reads as one), when the history
    /// gives the store a size limit.
    fn too_large(&self, outcome: &Outcome) -> Option<Error> {
        (self.plan.history.size_limit && outcome.body.len() > MAX_OUTCOME).then(|| {
            Error::store(format!(
                "injected size limit: an outcome of {} bytes is over {MAX_OUTCOME}",
                outcome.body.len()
            ))
        })
    }
}

#[async_trait]
impl<S: Store> Store for Faulty<S> {
    async fn begin(&self, request: &BeginRequest<'_>) -> Result<Begin, Error> {
        self.plan
            .through(Op::Begin, self.begin_noted(self.current(), request))
            .await
    }
    async fn peek(&self, request: &BeginRequest<'_>) -> Result<Option<Begin>, Error> {
        self.plan
            .through(Op::Peek, self.current().peek(request))
            .await
    }
    async fn renew(&self, claim: &Claim) -> Result<(), Error> {
        self.plan
            .through(Op::Renew, self.current().renew(claim))
            .await
    }
    async fn complete(&self, claim: &Claim, outcome: &Outcome) -> Result<(), Error> {
        if let Some(err) = self.too_large(outcome) {
            return Err(err);
        }
        self.plan
            .through(Op::Complete, self.current().complete(claim, outcome))
            .await
    }
    async fn release(&self, claim: &Claim) -> Result<(), Error> {
        self.plan
            .through(Op::Release, self.current().release(claim))
            .await
    }
    async fn get(&self, scope: &Scope, key: &Key) -> Result<Option<Record>, Error> {
        self.current().get(scope, key).await
    }
    async fn forget(&self, scope: &Scope, key: &Key) -> Result<bool, Error> {
        self.current().forget(scope, key).await
    }
    async fn purge_expired(&self, batch: usize) -> Result<u64, Error> {
        self.current().purge_expired(batch).await
    }
    /// A store without a background (the history's `detach`) keeps no
    /// journal either: steps journal through the background handle, and
    /// the engine refuses them on a store that keeps a journal it cannot
    /// reach. Its steps run unjournaled, as in transactional mode.
    fn journal(&self) -> Option<&dyn Journal> {
        self.plan.history.detach.then_some(self as &dyn Journal)
    }
    fn capabilities(&self) -> Capabilities<'_> {
        let mut offered = Capabilities::default()
            .with_wake(self)
            .with_immediate(self)
            .with_detach(self);
        offered.deletes_expired_itself = self.current().capabilities().deletes_expired_itself;
        offered
    }
}

#[async_trait]
impl<S: Store> Journal for Faulty<S> {
    async fn begin_step(&self, step: &StepRequest<'_>) -> Result<StepBegin, Error> {
        self.plan
            .through(Op::BeginStep, journal_of(&self.current()).begin_step(step))
            .await
    }
    async fn complete_step(&self, step: &StepRequest<'_>, output: &[u8]) -> Result<(), Error> {
        self.plan
            .through(
                Op::CompleteStep,
                journal_of(&self.current()).complete_step(step, output),
            )
            .await
    }
    async fn undo_step(&self, step: &StepRequest<'_>) -> Result<bool, Error> {
        self.plan
            .through(Op::UndoStep, journal_of(&self.current()).undo_step(step))
            .await
    }
    async fn steps(&self, scope: &Scope, key: &Key) -> Result<Vec<StepRecord>, Error> {
        journal_of(&self.current()).steps(scope, key).await
    }
    async fn keep_steps(&self, scope: &Scope, key: &Key, ttl: Duration) -> Result<(), Error> {
        self.plan
            .through(
                Op::KeepSteps,
                journal_of(&self.current()).keep_steps(scope, key, ttl),
            )
            .await
    }
    async fn resolve_step(&self, step: &StepAt<'_>, to: &StepResolution) -> Result<bool, Error> {
        journal_of(&self.current()).resolve_step(step, to).await
    }
    fn writes_beside(&self) -> bool {
        journal_of(&self.current()).writes_beside()
    }
}

#[async_trait]
impl<S: Store> Wake for Faulty<S> {
    async fn wait_for_change(
        &self,
        scope: &Scope,
        key: &Key,
        timeout: Duration,
    ) -> Result<(), Error> {
        self.current()
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
        self.current()
            .capabilities()
            .waker()
            .wait_for_outcome(request, timeout)
            .await
    }
    fn wakes_across_processes(&self) -> bool {
        self.current()
            .capabilities()
            .waker()
            .wakes_across_processes()
    }
}

impl<S: Store> Immediate for Faulty<S> {
    fn begin_now(&self, request: &BeginRequest<'_>) -> Option<Result<Begin, Error>> {
        // A claim that a fault would strike goes through `begin`, where
        // the fault is; otherwise the store's own fast path, counted.
        if self.plan.would_strike(Op::Begin) {
            return None;
        }
        self.note_fresh(request);
        let answer = self
            .current()
            .capabilities()
            .immediate?
            .begin_now(request)?;
        let _ = self.plan.action(Op::Begin);
        Some(answer)
    }
    fn complete_now(&self, claim: &Claim, outcome: &Outcome) -> Option<Result<(), Error>> {
        if self.plan.would_strike(Op::Complete) || self.too_large(outcome).is_some() {
            return None;
        }
        let answer = self
            .current()
            .capabilities()
            .immediate?
            .complete_now(claim, outcome)?;
        let _ = self.plan.action(Op::Complete);
        Some(answer)
    }
}

impl<S: Store> Detach for Faulty<S> {
    /// The same store and plan in the background, when the history gives
    /// the store a background at all.
    fn detach(&self) -> Option<Arc<dyn Store>> {
        if !self.plan.history.detach {
            return None;
        }
        Some(Arc::new(Faulty {
            inner: self.inner.capabilities().detached()?,
            plan: self.plan.clone(),
        }))
    }
}
