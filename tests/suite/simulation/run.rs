//! Runs a [`History`]: its attempts as tasks of one current-thread
//! runtime (on the paused clock for the memory store), each through its
//! caller's fate, then a final clean call once the store has recovered,
//! and reports what every caller got and what the downstream saw.

use crate::common::journal_of;
use std::future::Future;
use std::pin::Pin;
use std::sync::atomic::Ordering;
use std::sync::Arc;
use std::task::{Context, Poll};
use std::time::Duration;

use idem::record::State;
use idem::steps::{Failed, Step, StepKey};
use idem::{Call, Error, Key, Policy, Scope, Store};
use tokio::time::Instant;

use super::downstream::{Effect, Gateway};
use super::faults::{Faulty, Plan, ATTEMPT};
use super::history::{Attempt, Backend, Fate, History, Mode, OutboxPlan, StepPolicy, MAX_OUTCOME};
use super::outbox::{Row as OutboxRow, Seen, Side};

pub const SCOPE: &str = "simulation.pay";
pub const OP_KEY: &str = "order-1";
pub const PAYLOAD: u64 = 500;
/// The final call's index among the attempts, as the gateway tags it.
pub const FINAL: usize = usize::MAX;

/// The body's error.
#[derive(Debug)]
pub enum SimError {
    Idem(Error),
    /// The step's client gave up on the downstream.
    Timeout,
    /// The body failed after its step, on purpose.
    Body,
    /// The downstream declined the step's call: nothing happened.
    Declined,
}

impl From<Error> for SimError {
    fn from(err: Error) -> Self {
        SimError::Idem(err)
    }
}

fn sql(err: sqlx::Error) -> SimError {
    SimError::Idem(Error::store(err))
}

/// What a caller got.
#[derive(Clone, Debug)]
pub enum Answer {
    Ok(String),
    Err(String, ErrorClass),
    /// The caller dropped the call before its answer.
    Dropped,
    /// No answer within the simulation's horizon: the caller waits for
    /// ever.
    Hung,
}

/// The kinds of error answers the checker tells apart.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum ErrorClass {
    InProgress,
    OutcomeUnknown,
    Unrecorded,
    Store,
    LeaseLost,
    Timeout,
    Body,
    Declined,
    /// `KeyReused`, `StepMismatch`, `Config`, `Serialization`...: an answer
    /// that no history of one payload should get.
    Other,
}

fn answer(result: Result<String, SimError>) -> Answer {
    let class = match &result {
        Ok(value) => return Answer::Ok(value.clone()),
        Err(SimError::Timeout) => ErrorClass::Timeout,
        Err(SimError::Body) => ErrorClass::Body,
        Err(SimError::Declined) => ErrorClass::Declined,
        Err(SimError::Idem(err)) => match err {
            Error::InProgress { .. } => ErrorClass::InProgress,
            Error::OutcomeUnknown { .. } => ErrorClass::OutcomeUnknown,
            Error::Unrecorded(_) => ErrorClass::Unrecorded,
            Error::Store(_) => ErrorClass::Store,
            Error::LeaseLost => ErrorClass::LeaseLost,
            _ => ErrorClass::Other,
        },
    };
    Answer::Err(format!("{:?}", result.unwrap_err()), class)
}

/// One attempt as it went.
#[derive(Clone, Debug)]
pub struct Run {
    /// When it called and when it had its answer, from the history's
    /// start.
    pub start: Duration,
    pub end: Duration,
    pub fate: Fate,
    pub answer: Answer,
    /// Whether one of its claims was applied when nothing of the
    /// operation was live in the store (no live record, no live journal
    /// entry): it began a new operation. `None`: not looked (SQLite).
    pub free: Option<bool>,
    /// When its body first started, from the history's start: just after
    /// its claim. `None`: its body never ran (a replay, a refusal).
    pub body: Option<Duration>,
}

thread_local! {
    /// When each attempt's body started, for the history running on this
    /// thread (each runs on a current-thread runtime of its own).
    static BODIES: std::cell::RefCell<Vec<(usize, Instant)>> = Default::default();
}

/// Notes that attempt `index`'s body starts now.
fn body_starts(index: usize) {
    BODIES.with(|b| b.borrow_mut().push((index, Instant::now())));
}

/// When attempt `index`'s body first started, from `start`.
fn body_started(index: usize, start: Instant) -> Option<Duration> {
    BODIES.with(|b| {
        b.borrow()
            .iter()
            .find(|(i, _)| *i == index)
            .map(|(_, at)| at.duration_since(start))
    })
}

/// Everything the checker reads.
#[derive(Debug)]
pub struct Observed {
    /// The attempts', in the history's order, then the final call's.
    pub runs: Vec<Run>,
    /// The effects: the gateway's, or the rows the operation committed.
    pub effects: Vec<Effect>,
    /// Whether the record is still in progress after the final call.
    pub stuck: bool,
    /// How many records and journal entries the store holds at the end
    /// (`None`: not counted on this backend).
    pub records: Option<usize>,
    pub journal: Option<usize>,
    /// How many store operations a fault struck.
    pub struck: usize,
    /// The outbox's part, when the history has one.
    pub outbox: Option<Seen>,
}

/// How long any caller may take before it counts as waiting for ever.
fn horizon(h: &History) -> Duration {
    match h.backend {
        Backend::Memory => Duration::from_secs(600),
        _ => Duration::from_secs(30),
    }
}

/// The effect's id as the body's value: the charge, padded over
/// `max_outcome` when the history wants a large outcome.
pub fn render(id: u64, large: bool) -> String {
    let mut value = format!("ch_{id}");
    if large {
        value.push_str(&".".repeat(2 * MAX_OUTCOME));
    }
    value
}

fn call(h: &History, wait: Option<Duration>) -> Call {
    let mut policy = Policy::new()
        .lease(h.lease())
        .ttl(Duration::from_millis(h.ttl_ms));
    policy = match wait {
        Some(wait) => policy.wait(wait),
        None if h.wait_ms == 0 => policy.fail_fast(),
        None => policy.wait(Duration::from_millis(h.wait_ms)),
    };
    Call::new(SCOPE, OP_KEY, &PAYLOAD)
        .with_policy(policy)
        .max_outcome(MAX_OUTCOME)
}

/// Drops the inner future as it is about to be polled for the
/// `polls`-th time.
struct DropAtPoll<F: Future> {
    inner: Option<Pin<Box<F>>>,
    left: u32,
}

impl<F: Future> Future for DropAtPoll<F> {
    type Output = Option<F::Output>;

    fn poll(mut self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<Self::Output> {
        if self.left == 0 {
            self.inner = None;
            return Poll::Ready(None);
        }
        self.left -= 1;
        let inner = self.inner.as_mut().expect("polled after its end");
        inner.as_mut().poll(cx).map(Some)
    }
}

/// Awaits `call` as its caller's fate says (a step's timeout is the
/// body's business, not the caller's).
async fn with_fate(
    h: &History,
    fate: Fate,
    call: impl Future<Output = Result<String, SimError>>,
) -> Answer {
    let ended = match fate {
        Fate::DroppedAfter { ms } => tokio::time::timeout(Duration::from_millis(ms), call)
            .await
            .ok(),
        Fate::DroppedAtPoll { polls } => {
            DropAtPoll {
                inner: Some(Box::pin(call)),
                left: polls,
            }
            .await
        }
        Fate::Finishes | Fate::StepTimesOut { .. } => {
            match tokio::time::timeout(horizon(h), call).await {
                Ok(result) => Some(result),
                Err(_) => return Answer::Hung,
            }
        }
    };
    ended.map_or(Answer::Dropped, answer)
}

/// A request to the gateway with `key`, given up after the fate's step
/// timeout.
async fn send(
    gateway: &Arc<Gateway>,
    key: &str,
    index: usize,
    attempt: &Attempt,
) -> Result<u64, SimError> {
    if attempt.declined {
        return Err(SimError::Declined);
    }
    match attempt.fate {
        Fate::StepTimesOut { ms } => {
            tokio::time::timeout(Duration::from_millis(ms), gateway.charge(key, index))
                .await
                .map_err(|_| SimError::Timeout)
        }
        _ => Ok(gateway.charge(key, index).await),
    }
}

/// The body's charge through the gateway, as a step of the history's
/// policy (or without a step).
async fn charge(
    h: &History,
    gateway: &Arc<Gateway>,
    index: usize,
    attempt: &Attempt,
) -> Result<u64, SimError> {
    // A declined call failed cleanly; any other error may hide an effect.
    let sent = |key: StepKey| async move {
        send(gateway, key.as_str(), index, attempt)
            .await
            .map_err(|err| match err {
                SimError::Declined => Failed::Cleanly(err),
                err => Failed::InDoubt(err),
            })
    };
    match h.policy {
        StepPolicy::NoSteps => send(gateway, OP_KEY, index, attempt).await,
        StepPolicy::Rerun => Step::new("charge").try_run(sent).await,
        StepPolicy::Reconcile => {
            let step = Step::new("charge").reconcile(|key: StepKey| async move {
                Ok::<_, SimError>(gateway.ask(key.as_str()))
            });
            // The step's default settle window is the operation's lease. A
            // downstream that may commit later says so, as the docs of
            // `Step::settle` ask: its commit delay, and a little room.
            let step = if h.downstream.commit_after_ms >= h.lease_ms {
                step.settle(Duration::from_millis(h.downstream.commit_after_ms + 10))
            } else {
                step
            };
            step.try_run(sent).await
        }
        StepPolicy::Refuse => Step::new("charge").refuse().try_run(sent).await,
        StepPolicy::Atomic => unreachable!("an atomic phase charges with a row"),
    }
}

/// Record mode's body with an outbox, after its work: its messages for
/// the charge on a transaction of its own, committed, or rolled back when
/// the body fails (`true`).
type Announce<'a> =
    Box<dyn FnOnce(u64, bool) -> Pin<Box<dyn Future<Output = Result<(), SimError>> + 'a>> + 'a>;

/// The rest of the body after its charge: its work, its messages (record
/// mode with an outbox), then its failure or its value.
async fn finish(
    h: &History,
    attempt: &Attempt,
    id: u64,
    announce: Option<Announce<'_>>,
) -> Result<String, SimError> {
    tokio::time::sleep(Duration::from_millis(h.work_ms)).await;
    if let Some(announce) = announce {
        announce(id, attempt.body_fails).await?;
    }
    if attempt.body_fails {
        return Err(SimError::Body);
    }
    Ok(render(id, h.large_outcome))
}

/// An atomic phase's charge (SQL backends), made when the body comes to
/// it.
type Atomic<'a> = Pin<Box<dyn Future<Output = Result<u64, SimError>> + 'a>>;

/// One attempt in record mode, on any store; `atomic` is the body's
/// charge when the history's policy is an atomic phase, `announce` its
/// messages when it publishes them after its work.
#[allow(clippy::too_many_arguments)]
async fn record_attempt<S: Store + ?Sized>(
    store: &S,
    atomic: Option<Atomic<'_>>,
    announce: Option<Announce<'_>>,
    gateway: &Arc<Gateway>,
    h: &History,
    index: usize,
    attempt: &Attempt,
    wait: Option<Duration>,
) -> Result<String, SimError> {
    idem::run(store, call(h, wait), async {
        body_starts(index);
        let id = match (h.policy, atomic) {
            (StepPolicy::Atomic, Some(atomic)) => atomic.await?,
            _ => charge(h, gateway, index, attempt).await?,
        };
        finish(h, attempt, id, announce).await
    })
    .await
}

/// An atomic phase on a transaction of the store's pool: the charge's row
/// commits with the step's journal entry (and the body's messages, with
/// an outbox).
async fn atomic_charge<D: SimSql>(
    store: &D::Store,
    side: Option<&Side<D>>,
    index: usize,
) -> Result<u64, SimError> {
    let mut tx = D::pool(store).begin().await.map_err(sql)?;
    let id = Step::new("charge")
        .in_transaction(store, &mut *tx, |conn, key| {
            charge_row::<D>(conn, side, key, index)
        })
        .await;
    let settle = |committed| {
        if let Some(side) = side {
            side.settle(index, committed);
        }
    };
    let id = match id {
        Ok(id) => id,
        Err(err) => {
            let _ = tx.rollback().await;
            settle(Some(false));
            return Err(err);
        }
    };
    tx.commit().await.map_err(sql)?;
    settle(Some(true));
    Ok(id)
}

/// An atomic phase's work on the caller's transaction: the charge's row,
/// then the body's messages beside it.
async fn charge_row<'c, D: SimSql>(
    conn: &'c mut D::Connection,
    side: Option<&Side<D>>,
    key: StepKey,
    index: usize,
) -> (Result<u64, SimError>, &'c mut D::Connection) {
    let id = D::insert_charge(&mut *conn, key.as_str(), index).await;
    let id = match (id, side) {
        (Ok(id), Some(side)) => side.publish(&mut *conn, index, id).await.map(|()| id),
        (id, _) => id,
    };
    (id, conn)
}

/// Runs a history on a current-thread runtime of its own, its clock
/// paused when `paused` (the memory store).
fn on_runtime(paused: bool, history: impl Future<Output = Observed>) -> Observed {
    let mut runtime = tokio::runtime::Builder::new_current_thread();
    runtime.enable_all().start_paused(paused);
    let runtime = runtime.build().expect("a runtime");
    let local = tokio::task::LocalSet::new();
    runtime.block_on(local.run_until(history))
}

/// The memory store's histories: on a current-thread runtime whose clock
/// is paused, so that leases, ttls, waits and delays pass in no time and
/// the run depends on the seed alone.
pub fn run_memory(h: &History) -> Observed {
    on_runtime(
        true,
        record_history(h, idem::MemoryStore::new(), None, |store| Some(store.len())),
    )
}

/// The Redis histories: on keys of their own, in real time.
#[cfg(feature = "redis")]
pub fn run_redis(h: &History) -> Observed {
    on_runtime(false, async {
        let (store, _guard) = crate::common::backend::redis::store(1).await;
        record_history(h, store, None, |_| None).await
    })
}

/// The Redis failover's histories: on a primary and a replica of their
/// own, the store waiting for the replica after every write a decision
/// reads, failed over at the history's failover.
#[cfg(feature = "redis")]
pub fn run_redis_failover(h: &History) -> Observed {
    on_runtime(false, async {
        let pair = super::failover::Pair::start().await;
        let store = pair.store_on_primary().await;
        record_history(h, store, Some(pair), |_| None).await
    })
}

/// A record-mode history on `inner` (under the history's faults, failed
/// over by `failing` if given); `records` counts the records it holds at
/// the end, where the store can tell.
async fn record_history<S: Store + 'static>(
    h: &History,
    inner: S,
    failing: Option<Arc<dyn super::faults::Failing>>,
    records: impl Fn(&S) -> Option<usize>,
) -> Observed {
    let start = Instant::now();
    let plan = Plan::new(h, start, failing);
    let store = Arc::new(Faulty {
        inner,
        plan: plan.clone(),
    });
    let gateway = Gateway::new(h.downstream);
    let one = |index: usize, attempt: Attempt, wait: Option<Duration>| {
        let (store, gateway, h) = (store.clone(), gateway.clone(), h.clone());
        async move { record_attempt(&*store, None, None, &gateway, &h, index, &attempt, wait).await }
    };
    let runs = calls(h, start, &plan, one).await;
    // Read past the faults (and a store without a background, which keeps
    // no journal of its own to show): the store as it stands.
    let (stuck, journal) = leftovers(store.current()).await;
    Observed {
        runs,
        effects: gateway.effects(),
        stuck,
        records: records(&store.inner),
        journal: Some(journal),
        struck: plan.struck.load(Ordering::SeqCst),
        outbox: None,
    }
}

/// Whether the operation's record is still in progress, and how many
/// journal entries it has.
async fn leftovers(store: &dyn Store) -> (bool, usize) {
    let (scope, key) = (Scope::new(SCOPE), Key::new(OP_KEY).unwrap());
    let record = store.get(&scope, &key).await.expect("read the record");
    let journal = journal_of(&store)
        .steps(&scope, &key)
        .await
        .expect("the journal");
    (
        record.is_some_and(|r| r.state == State::InProgress),
        journal.len(),
    )
}

/// The attempts of `h` through `one` (see [`attempts`]), then, once the
/// store has recovered, the final clean call; then late commits land.
async fn calls<F, Fut>(h: &History, start: Instant, plan: &Arc<Plan>, one: F) -> Vec<Run>
where
    F: Fn(usize, Attempt, Option<Duration>) -> Fut,
    Fut: Future<Output = Result<String, SimError>> + 'static,
{
    BODIES.with(|b| b.borrow_mut().clear());
    let mut runs = attempts(h, start, plan, &one).await;
    quiet(h, start, plan).await;
    let final_call = Attempt {
        at_ms: 0,
        fate: Fate::Finishes,
        body_fails: false,
        declined: false,
    };
    let wait = match h.backend {
        Backend::Memory => Duration::from_secs(5),
        _ => Duration::from_secs(2),
    };
    let begun = start.elapsed();
    let answer = ATTEMPT
        .scope(
            FINAL,
            with_fate(h, Fate::Finishes, one(FINAL, final_call, Some(wait))),
        )
        .await;
    runs.push(Run {
        start: begun,
        end: start.elapsed(),
        fate: Fate::Finishes,
        answer,
        free: plan
            .probe
            .then(|| plan.fresh.lock().unwrap().contains(&FINAL)),
        body: body_started(FINAL, start),
    });
    tokio::time::sleep(Duration::from_millis(h.downstream.commit_after_ms + 1)).await;
    runs
}

/// Runs every attempt of `h` as a task of its own, from its start time,
/// through its fate; `attempt(index, attempt, wait)` is its call.
async fn attempts<F, Fut>(h: &History, start: Instant, plan: &Arc<Plan>, attempt: F) -> Vec<Run>
where
    F: Fn(usize, Attempt, Option<Duration>) -> Fut,
    Fut: Future<Output = Result<String, SimError>> + 'static,
{
    let tasks: Vec<_> = h
        .attempts
        .iter()
        .enumerate()
        .map(|(index, a)| {
            let call = attempt(index, a.clone(), None);
            let (h, fate, at) = (h.clone(), a.fate, Duration::from_millis(a.at_ms));
            let plan = plan.clone();
            tokio::task::spawn_local(async move {
                tokio::time::sleep_until(start + at).await;
                let begun = start.elapsed();
                let answer = ATTEMPT.scope(index, with_fate(&h, fate, call)).await;
                let free = plan
                    .probe
                    .then(|| plan.fresh.lock().unwrap().contains(&index));
                Run {
                    start: begun,
                    end: start.elapsed(),
                    fate,
                    answer,
                    free,
                    body: body_started(index, start),
                }
            })
        })
        .collect();
    let mut runs = Vec::with_capacity(tasks.len() + 1);
    for task in tasks {
        runs.push(task.await.expect("an attempt's task"));
    }
    runs
}

/// Waits until the store has recovered and every lease a fault or a
/// stopped background left behind has passed, then calms the store (and
/// ends a failover's window).
async fn quiet(h: &History, start: Instant, plan: &Plan) {
    tokio::time::sleep_until(start + Duration::from_millis(h.outages_end_ms())).await;
    let settle = match h.backend {
        // A background save pauses at most 1 s between attempts.
        Backend::Memory => Duration::from_millis(2_500),
        _ => Duration::from_millis(300),
    };
    tokio::time::sleep(
        2 * h.lease() + settle + Duration::from_millis(h.downstream.commit_after_ms),
    )
    .await;
    plan.recover();
}

/// A payment row: entity mode's token and value.
#[derive(Debug, Clone, PartialEq, sqlx::FromRow, idem::Entity)]
#[idem(table = "sim_payments")]
pub struct SimPayment {
    #[idem(generated)]
    pub id: i64,
    #[idem(token)]
    pub token: String,
    pub charge: String,
}

/// A SQL backend of the simulation: its store, in a database of the
/// history's own beside the simulation's tables (`sim_payments`, entity
/// mode's rows; `sim_charges`, the rows an atomic phase or a
/// transactional body commits), and what differs in its SQL.
pub trait SimSql: idem::entity::EntityDatabase {
    type Store: Store + idem::store::TransactionalStore<Self::Connection> + Clone + 'static;

    /// A fresh store with the simulation's tables, and what removes them
    /// when dropped.
    async fn store() -> (Self::Store, Box<dyn std::any::Any>);

    fn pool(store: &Self::Store) -> &sqlx::Pool<Self>;

    /// A charge's row, on the caller's connection: its id.
    async fn insert_charge(
        conn: &mut Self::Connection,
        key: &str,
        index: usize,
    ) -> Result<u64, SimError>;

    /// The charges' rows as effects, and how many payment rows there are.
    async fn rows(pool: &sqlx::Pool<Self>) -> (Vec<Effect>, usize);

    /// The outbox of `store`, for a history's `plan`.
    fn side(store: &Self::Store, plan: OutboxPlan, start: Instant) -> Arc<Side<Self>>;

    /// The rows of the outbox table `table`, in order.
    async fn outbox_rows(pool: &sqlx::Pool<Self>, table: &str) -> Vec<OutboxRow>;

    /// `idem::entity::run` of a payment.
    async fn entity<Fut>(
        pool: &sqlx::Pool<Self>,
        call: Call,
        body: Fut,
    ) -> Result<SimPayment, SimError>
    where
        Fut: Future<Output = Result<SimPayment, SimError>>;
}

macro_rules! sim_sql {
    ($feature:literal, $db:ty, $tables:expr, $param:expr, outbox: $outbox:expr, fresh: $fresh:expr) => {
        #[cfg(feature = $feature)]
        impl SimSql for $db {
            type Store = idem::store::SqlStore<$db>;

            async fn store() -> (Self::Store, Box<dyn std::any::Any>) {
                let (store, keep): (Self::Store, Box<dyn std::any::Any>) = $fresh.await;
                sqlx::raw_sql($tables)
                    .execute(store.pool())
                    .await
                    .expect("the simulation's tables");
                (store, keep)
            }

            fn pool(store: &Self::Store) -> &sqlx::Pool<Self> {
                store.pool()
            }

            async fn insert_charge(
                conn: &mut Self::Connection,
                key: &str,
                index: usize,
            ) -> Result<u64, SimError> {
                let p = $param;
                // `RETURNING`: SQLite, PostgreSQL, MariaDB 10.5+.
                let id: i64 = sqlx::query_scalar(&format!(
                    "INSERT INTO sim_charges (step_key, attempt) VALUES ({}, {}) RETURNING id",
                    p(1),
                    p(2)
                ))
                .bind(key)
                .bind(index as i64)
                .fetch_one(&mut *conn)
                .await
                .map_err(sql)?;
                Ok(id as u64)
            }

            async fn rows(pool: &sqlx::Pool<Self>) -> (Vec<Effect>, usize) {
                let rows: Vec<(i64, String, i64)> =
                    sqlx::query_as("SELECT id, step_key, attempt FROM sim_charges ORDER BY id")
                        .fetch_all(pool)
                        .await
                        .expect("the charges");
                let payments: i64 = sqlx::query_scalar("SELECT COUNT(*) FROM sim_payments")
                    .fetch_one(pool)
                    .await
                    .expect("the payments");
                let effects = rows
                    .into_iter()
                    .map(|(id, key, attempt)| Effect {
                        id: id as u64,
                        key,
                        attempt: attempt as usize,
                    })
                    .collect();
                (effects, payments as usize)
            }

            fn side(store: &Self::Store, plan: OutboxPlan, start: Instant) -> Arc<Side<Self>> {
                Side::new(store, plan, start)
            }

            async fn outbox_rows(pool: &sqlx::Pool<Self>, table: &str) -> Vec<OutboxRow> {
                let rows: Vec<(i64, String, String, String, Option<i64>)> =
                    sqlx::query_as(&$outbox.replace("{table}", table))
                        .fetch_all(pool)
                        .await
                        .expect("the outbox's rows");
                rows.into_iter()
                    .map(|(seq, id, topic, payload, relayed_at)| OutboxRow {
                        seq,
                        id,
                        topic,
                        payload,
                        relayed: relayed_at.is_some(),
                    })
                    .collect()
            }

            async fn entity<Fut>(
                pool: &sqlx::Pool<Self>,
                call: Call,
                body: Fut,
            ) -> Result<SimPayment, SimError>
            where
                Fut: Future<Output = Result<SimPayment, SimError>>,
            {
                idem::entity::run(pool, call, body).await
            }
        }
    };
}

sim_sql!("sqlite", sqlx::Sqlite, "
    CREATE TABLE sim_payments (
        id INTEGER PRIMARY KEY AUTOINCREMENT,
        token TEXT NOT NULL UNIQUE,
        charge TEXT NOT NULL
    );
    CREATE TABLE sim_charges (
        id INTEGER PRIMARY KEY AUTOINCREMENT,
        step_key TEXT NOT NULL,
        attempt INTEGER NOT NULL
    );
", |n| format!("?{n}"), outbox: "SELECT seq, message_id, topic, CAST(payload AS TEXT), relayed_at
    FROM \"{table}\" ORDER BY seq",
fresh: async {
    let (store, guard) = crate::common::backend::sqlite_file::store(8).await;
    (store, Box::new(guard) as Box<dyn std::any::Any>)
});

sim_sql!("postgres", sqlx::Postgres, "
    CREATE TABLE sim_payments (
        id BIGINT GENERATED ALWAYS AS IDENTITY PRIMARY KEY,
        token TEXT NOT NULL UNIQUE,
        charge TEXT NOT NULL
    );
    CREATE TABLE sim_charges (
        id BIGINT GENERATED ALWAYS AS IDENTITY PRIMARY KEY,
        step_key TEXT NOT NULL,
        attempt BIGINT NOT NULL
    );
", |n| format!("${n}"), outbox: "SELECT seq, message_id, topic, convert_from(payload, 'UTF8'),
    relayed_at FROM \"{table}\" ORDER BY seq",
fresh: async {
    server_store(crate::common::backend::postgres::namespace("sim").await).await
});

// The default, case-insensitive collation: sqlx 0.8 does not decode a
// `_bin` column into a `String`.
sim_sql!("mysql", sqlx::MySql, "
    CREATE TABLE sim_payments (
        id BIGINT AUTO_INCREMENT PRIMARY KEY,
        token VARCHAR(255) CHARACTER SET ascii NOT NULL UNIQUE,
        charge TEXT NOT NULL
    ) ENGINE = InnoDB;
    CREATE TABLE sim_charges (
        id BIGINT AUTO_INCREMENT PRIMARY KEY,
        step_key VARCHAR(255) NOT NULL,
        attempt BIGINT NOT NULL
    ) ENGINE = InnoDB;
", |_| "?".to_owned(), outbox: "SELECT seq, CAST(message_id AS CHAR), CAST(topic AS CHAR),
    CAST(payload AS CHAR), relayed_at FROM `{table}` ORDER BY seq",
fresh: async {
    server_store(crate::common::backend::mysql::namespace("sim").await).await
});

/// A store in `ns`, a schema or a database of the history's own (entity
/// mode's claims go to a table of the pool's database), migrated; the
/// namespace is dropped with what this answers beside the store.
#[cfg(any(feature = "postgres", feature = "mysql"))]
async fn server_store<D>(
    ns: crate::common::namespace::Namespace,
) -> (idem::store::SqlStore<D>, Box<dyn std::any::Any>)
where
    D: idem::store::Backend,
{
    let pool = sqlx::pool::PoolOptions::<D>::new()
        .max_connections(8)
        .acquire_timeout(Duration::from_secs(60))
        .connect(ns.url())
        .await
        .unwrap_or_else(|err| panic!("connect to {}: {err}", ns.name()));
    let store = idem::store::SqlStore::<D>::new(pool);
    store.migrate().await.expect("migrate the store");
    (store, Box::new(ns))
}

/// The histories of a SQL backend, in real time: record mode (faults and
/// atomic phases), transactional mode and entity mode.
pub fn run_sql<D: SimSql>(h: &History) -> Observed {
    on_runtime(false, sql_history::<D>(h))
}

async fn sql_history<D: SimSql>(h: &History) -> Observed {
    let (sql, keep) = D::store().await;
    let start = Instant::now();
    let plan = Plan::new(h, start, None);
    let store = Arc::new(Faulty {
        inner: sql.clone(),
        plan: plan.clone(),
    });
    let gateway = Gateway::new(h.downstream);
    let side = h
        .outbox
        .as_ref()
        .map(|plan| D::side(&sql, plan.clone(), start));
    // The relays run beside the attempts (and the final call).
    let relays: Vec<_> = side
        .iter()
        .flat_map(|side| {
            let plan = h.outbox.as_ref().expect("an outbox plan");
            plan.relays
                .iter()
                .enumerate()
                .map(|(who, relay)| tokio::task::spawn_local(side.clone().relay(who, *relay)))
        })
        .collect();
    let one = |index: usize, attempt: Attempt, wait: Option<Duration>| {
        let (store, sql, gateway, h) = (store.clone(), sql.clone(), gateway.clone(), h.clone());
        let side = side.clone();
        async move {
            let (gateway, attempt, side) = (&gateway, &attempt, side.as_deref());
            match h.mode {
                Mode::Record => {
                    let atomic = (h.policy == StepPolicy::Atomic)
                        .then(|| Box::pin(atomic_charge::<D>(&sql, side, index)) as Atomic<'_>);
                    let announce = side.filter(|_| atomic.is_none()).map(|side| {
                        Box::new(move |id, fails| {
                            Box::pin(side.announce(index, id, fails))
                                as Pin<Box<dyn Future<Output = _>>>
                        }) as Announce<'_>
                    });
                    record_attempt(&*store, atomic, announce, gateway, &h, index, attempt, wait)
                        .await
                }
                Mode::Transactional => {
                    transactional_attempt::<D>(&sql, side, gateway, &h, index, attempt, wait).await
                }
                Mode::Entity => {
                    entity_attempt::<D>(&sql, side, gateway, &h, index, attempt, wait).await
                }
            }
        }
    };
    let runs = calls(h, start, &plan, one).await;
    let (stuck, journal) = leftovers(&sql).await;
    let mut effects = gateway.effects();
    let (rows, payments) = D::rows(D::pool(&sql)).await;
    effects.extend(rows);
    let outbox = match side {
        Some(side) => {
            side.stop();
            for relay in relays {
                relay.await.expect("a relay's task");
            }
            let waiting = side.drain().await;
            let rows = D::outbox_rows(D::pool(&sql), side.outbox.table()).await;
            let log = side.log.lock().unwrap().clone();
            Some(Seen {
                messages: h.outbox.as_ref().expect("an outbox plan").messages,
                log,
                rows,
                waiting,
            })
        }
        None => None,
    };
    D::pool(&sql).close().await;
    drop(keep);
    Observed {
        runs,
        effects,
        // Entity mode keeps its claims elsewhere, transactional mode its
        // journal nowhere.
        stuck: h.mode != Mode::Entity && stuck,
        records: (h.mode == Mode::Entity).then_some(payments),
        journal: (h.mode == Mode::Record).then_some(journal),
        struck: plan.struck.load(Ordering::SeqCst),
        outbox,
    }
}

/// One attempt in transactional mode: the claim, the body's rows and the
/// completion on one transaction, committed after an `Ok`.
async fn transactional_attempt<D: SimSql>(
    store: &D::Store,
    side: Option<&Side<D>>,
    gateway: &Arc<Gateway>,
    h: &History,
    index: usize,
    attempt: &Attempt,
    wait: Option<Duration>,
) -> Result<String, SimError> {
    let mut tx = D::pool(store).begin().await.map_err(sql)?;
    let result = idem::run_in_transaction(store, &mut *tx, call(h, wait), |conn| async move {
        body_starts(index);
        let id = match h.policy {
            // The effect is a row, committed with the record.
            StepPolicy::NoSteps => D::insert_charge(&mut *conn, OP_KEY, index).await,
            StepPolicy::Atomic => {
                Step::new("charge")
                    .in_transaction(store, &mut *conn, |conn, key| {
                        charge_row::<D>(conn, side, key, index)
                    })
                    .await
            }
            _ => charge(h, gateway, index, attempt).await,
        };
        // The messages, on the claim's transaction (an atomic phase wrote
        // them beside its row).
        let id = match (id, side) {
            (Ok(id), Some(side)) if h.policy != StepPolicy::Atomic => {
                side.publish(&mut *conn, index, id).await.map(|()| id)
            }
            (id, _) => id,
        };
        let result = match id {
            Ok(id) => finish(h, attempt, id, None).await,
            Err(err) => Err(err),
        };
        (result, conn)
    })
    .await;
    let settle = |committed| {
        if let Some(side) = side {
            side.settle(index, committed);
        }
    };
    match result {
        Ok(value) => {
            tx.commit().await.map_err(sql)?;
            settle(Some(true));
            Ok(value)
        }
        Err(err) => {
            let _ = tx.rollback().await;
            settle(Some(false));
            Err(err)
        }
    }
}

/// One attempt in entity mode: the row is the outcome.
async fn entity_attempt<D: SimSql>(
    store: &D::Store,
    side: Option<&Side<D>>,
    gateway: &Arc<Gateway>,
    h: &History,
    index: usize,
    attempt: &Attempt,
    wait: Option<Duration>,
) -> Result<String, SimError> {
    let payment = D::entity(D::pool(store), call(h, wait), async {
        body_starts(index);
        let id = charge(h, gateway, index, attempt).await?;
        // Held for the transaction that inserts the row.
        if let Some(side) = side {
            side.enqueue(index, id)?;
        }
        let value = finish(h, attempt, id, None).await?;
        Ok::<_, SimError>(SimPayment {
            id: 0,
            token: OP_KEY.to_owned(),
            charge: value,
        })
    })
    .await;
    if let Some(side) = side {
        match &payment {
            Ok(payment) => side.settle_entity(index, &payment.charge),
            // The body's own failure: its messages were never written.
            Err(SimError::Body | SimError::Timeout | SimError::Declined) => {
                side.settle(index, Some(false))
            }
            Err(SimError::Idem(_)) => {}
        }
    }
    Ok(payment?.charge)
}
