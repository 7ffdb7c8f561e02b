//! What a seed generates: one [`History`] of one operation key, drawn by
//! proptest (so that a failing history shrinks to a smaller one).

use std::time::Duration;

use proptest::prelude::*;

/// Where the records live.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Backend {
    /// `MemoryStore`, on tokio's paused clock.
    Memory,
    /// `SqliteStore` on a file of its own, in real time.
    Sqlite,
    /// `PostgresStore` on tables of its own (entity mode: a schema of its
    /// own), in real time.
    Postgres,
    /// `MySqlStore` on MariaDB, on tables of its own (entity mode: a
    /// database of its own), in real time.
    MySql,
    /// `RedisStore` on the single Redis, under a prefix of its own, in
    /// real time.
    Redis,
    /// `RedisStore` with `wait_for_replicas` on a primary and a replica
    /// of the history's own, with a [`Failover`] at a drawn point.
    RedisFailover,
}

impl Backend {
    /// A SQL database: transactional and entity modes, atomic phases.
    pub fn sql(self) -> bool {
        matches!(self, Backend::Sqlite | Backend::Postgres | Backend::MySql)
    }

    /// A database server (its own clock), where entity mode's and
    /// transactional mode's histories are biased towards bodies that
    /// outlive the ttl.
    pub fn server(self) -> bool {
        matches!(self, Backend::Postgres | Backend::MySql)
    }
}

/// How the operation holds its key.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Mode {
    /// `idem::run`: a record in the store's table.
    Record,
    /// `idem::run_in_transaction` on a sqlx transaction (SQL backends).
    Transactional,
    /// `idem::entity::run`: the row carries the token (SQL backends).
    Entity,
}

/// The body's durable step, if any, and what it does in doubt.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum StepPolicy {
    /// The body calls the downstream itself, without a step.
    NoSteps,
    /// `Step::new(..)`: rerun with the same key in doubt.
    Rerun,
    /// `Step::new(..).reconcile(ask)`: ask the downstream by key.
    Reconcile,
    /// `Step::new(..).refuse()`: `OutcomeUnknown` in doubt.
    Refuse,
    /// `Step::in_transaction`: the effect is a row, committed with the
    /// step's journal entry (SQL backends).
    Atomic,
}

/// The system the step calls.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct Downstream {
    /// A second request with a key already committed gets the first
    /// effect back (Stripe's `Idempotency-Key`).
    pub dedupes: bool,
    /// It can be asked by key what became of a request.
    pub askable: bool,
    /// 0: the effect is committed as the request arrives. Otherwise it is
    /// committed this many ms later by a task of the downstream's own,
    /// whatever the client does meanwhile (it timed out, it was dropped).
    pub commit_after_ms: u64,
}

/// How an attempt ends, from its caller's side.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Fate {
    /// The caller waits for the answer.
    Finishes,
    /// The caller drops the call's future this long after calling (a
    /// client timeout).
    DroppedAfter { ms: u64 },
    /// The caller drops the call's future as it is about to poll it for
    /// the `polls`-th time (a drop at one of its await points).
    DroppedAtPoll { polls: u32 },
    /// The step's own client gives up on the downstream after this long
    /// and returns an error, while the downstream may still commit.
    StepTimesOut { ms: u64 },
}

impl Fate {
    /// Whether the attempt may end while its downstream call is in flight.
    pub fn ends_early(self) -> bool {
        self != Fate::Finishes
    }
}

/// One caller's call.
#[derive(Clone, Debug)]
pub struct Attempt {
    /// When it calls, from the start of the history.
    pub at_ms: u64,
    pub fate: Fate,
    /// The body fails after its step (and its work): the key is released.
    pub body_fails: bool,
    /// The downstream declines the step's call: no effect, and the step
    /// says it failed cleanly (`Failed::Cleanly`); the body fails.
    pub declined: bool,
}

/// A store operation that a fault can strike.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
pub enum Op {
    Begin,
    Peek,
    Renew,
    Complete,
    Release,
    BeginStep,
    CompleteStep,
    KeepSteps,
    UndoStep,
}

pub const OPS: [Op; 9] = [
    Op::Begin,
    Op::Peek,
    Op::Renew,
    Op::Complete,
    Op::Release,
    Op::BeginStep,
    Op::CompleteStep,
    Op::KeepSteps,
    Op::UndoStep,
];

/// What a fault does to the operation it strikes.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum FaultKind {
    /// Fails before it reaches the store.
    Fail,
    /// Reaches the store, and its reply is lost.
    LoseReply,
    /// Reaches the store only after a lease and a bit: a stalled
    /// connection.
    DelayPastLease,
    /// The connection dies after a moment, the operation applied or not.
    ConnectionDies { applied: bool },
}

/// The `nth` (from 0) operation `op` of the history meets `kind`.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct Fault {
    pub op: Op,
    pub nth: u32,
    pub kind: FaultKind,
}

/// Every operation `op` fails (not applied) from `from_ms` for `len_ms`.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct Outage {
    pub op: Op,
    pub from_ms: u64,
    pub len_ms: u64,
}

/// A replication failover (Redis): as the `nth` (from 0) operation `op`
/// is about to be sent, the replica is promoted (`REPLICAOF NO ONE`); the
/// store goes on talking to the old primary for `window_ms`, whose writes
/// of that time no replica gets, then the old primary is killed (SIGKILL)
/// and the store talks to the promoted replica. What the old primary had
/// alone is lost, as in a failover.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct Failover {
    pub op: Op,
    pub nth: u32,
    pub window_ms: u64,
}

/// What the body publishes through the outbox, in the transaction of its
/// effect (SQL backends). Each message names the charge it announces.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Messages {
    /// One message.
    One,
    /// Two, on two topics.
    TwoTopics,
    /// Two on one topic, with different payloads.
    TwoPayloads,
    /// One message published twice: one message, written once.
    SameTwice,
}

/// How a relay ends its `nth` lease (the others mark what they
/// delivered).
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum RelayFate {
    /// It marks what it delivered.
    Marks,
    /// It delivers the first `delivered` messages of its lease and dies:
    /// nothing is marked or given back, the rows wait for its lease to
    /// pass.
    Dies { delivered: usize },
    /// It delivers its lease and gives it back (`Outbox::release`), as
    /// after a produce whose acknowledgement it did not get.
    Releases,
    /// It delivers its lease and marks it only after the lease passed (a
    /// broker that answers late).
    Slow,
    /// The broker refuses its lease for good: it parks the rows (delivers
    /// none), and an operator unparks them `pause_ms` later.
    Parks { pause_ms: u64 },
}

/// One relay: from `at_ms` for `for_ms`, it leases at most `batch`
/// messages, delivers them to the consumer and marks them, and looks
/// again after `pause_ms`; its `nth` (from 1) lease that holds messages
/// ends as `fate` says. After each lease it purges when `purges`.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct Relay {
    pub at_ms: u64,
    pub for_ms: u64,
    pub batch: usize,
    pub pause_ms: u64,
    pub nth: u32,
    pub purges: bool,
    pub fate: RelayFate,
}

/// The outbox's part of a history (SQL backends): what every body
/// publishes, the relays' lease, and the relays, which run beside the
/// attempts and one another.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct OutboxPlan {
    pub messages: Messages,
    pub lease_ms: u64,
    pub relays: Vec<Relay>,
}

/// One operation key's history.
#[derive(Clone, Debug)]
pub struct History {
    pub backend: Backend,
    pub mode: Mode,
    pub policy: StepPolicy,
    pub downstream: Downstream,
    pub lease_ms: u64,
    pub ttl_ms: u64,
    /// How long a duplicate waits for a call in progress (0: `fail_fast`).
    pub wait_ms: u64,
    /// How long the body works after its step, its lease renewed.
    pub work_ms: u64,
    /// The body's value is longer than the call's `max_outcome`.
    pub large_outcome: bool,
    /// The store refuses an outcome over `max_outcome` with an error
    /// that is not `Unrecorded` (as Redis's `proto-max-bulk-len` does).
    pub size_limit: bool,
    /// The store can work in the background (`Detach`).
    pub detach: bool,
    pub attempts: Vec<Attempt>,
    pub faults: Vec<Fault>,
    pub outages: Vec<Outage>,
    pub failover: Option<Failover>,
    /// The outbox: bodies publish, relays relay (SQL backends).
    pub outbox: Option<OutboxPlan>,
}

/// The call's `max_outcome` in every history.
pub const MAX_OUTCOME: usize = 256;
/// A ttl that no history outlives.
pub const LONG_TTL_MS: u64 = 3_600_000;

impl History {
    pub fn lease(&self) -> Duration {
        Duration::from_millis(self.lease_ms)
    }

    /// The latest instant, from the start, at which an outage ends.
    pub fn outages_end_ms(&self) -> u64 {
        self.outages
            .iter()
            .map(|o| o.from_ms + o.len_ms)
            .max()
            .unwrap_or(0)
    }

    /// Whether a store fault may strike.
    pub fn faulty(&self) -> bool {
        !self.faults.is_empty()
            || !self.outages.is_empty()
            || self.size_limit
            || self.failover.is_some()
    }

    /// The spans (from, length) in which `op` may not reach the store
    /// that later decisions read: its outages, and for the writes that do
    /// not wait for a replica (renewals, the journal's keeping) a
    /// failover's window, from the last renewal a replica may have had
    /// (a third of a lease before the promotion).
    pub fn unreplicated(&self, op: Op) -> Vec<u64> {
        let outages = self.outages.iter().filter(|o| o.op == op).map(|o| o.len_ms);
        let failover = self
            .failover
            .filter(|_| matches!(op, Op::Renew | Op::KeepSteps))
            .map(|f| f.window_ms + self.lease_ms / 3 + 1);
        outages.chain(failover).collect()
    }
}

/// The time scales of a backend: the paused clock makes long spans free on
/// memory; SQLite runs in real time.
struct Scale {
    lease: std::ops::RangeInclusive<u64>,
    wait: std::ops::RangeInclusive<u64>,
    work: std::ops::RangeInclusive<u64>,
    commit: std::ops::RangeInclusive<u64>,
    start: std::ops::RangeInclusive<u64>,
    fate: std::ops::RangeInclusive<u64>,
    outage: std::ops::RangeInclusive<u64>,
}

fn scale(backend: Backend) -> Scale {
    match backend {
        Backend::Memory => Scale {
            lease: 30..=2_000,
            wait: 0..=1_500,
            work: 0..=3_000,
            commit: 1..=500,
            start: 0..=1_000,
            fate: 1..=500,
            outage: 100..=40_000,
        },
        // The engine's shortest lease is 30 ms; SQLite's writes take a
        // few, and so do the servers'.
        Backend::Sqlite | Backend::Postgres | Backend::MySql | Backend::Redis => Scale {
            lease: 60..=200,
            // On the servers a duplicate may wait out a body that outlives
            // the ttl, and claim the key as soon as that body fails: its
            // step's journal entry must be there.
            wait: if backend.server() { 0..=800 } else { 0..=300 },
            work: 0..=400,
            commit: 1..=150,
            start: 0..=200,
            fate: 1..=150,
            outage: 50..=600,
        },
        // Every write waits for the replica (up to `REPLICA_WAIT_MS` while
        // the replica is promoted), on the store's one connection.
        Backend::RedisFailover => Scale {
            lease: 150..=400,
            wait: 0..=500,
            work: 0..=600,
            commit: 1..=250,
            start: 0..=300,
            fate: 1..=250,
            outage: 50..=600,
        },
    }
}

/// How long a write waits for the replica's acknowledgement
/// (`wait_for_replicas`) in a failover's histories.
pub const REPLICA_WAIT_MS: u64 = 40;

/// With a failover, callers that end while their step's call is in
/// flight (whose journal entry a retry must find) are drawn as often as
/// callers that wait.
fn fate(s: &Scale, backend: Backend) -> impl Strategy<Value = Fate> {
    let finishes = if backend == Backend::RedisFailover {
        1
    } else {
        3
    };
    prop_oneof![
        finishes => Just(Fate::Finishes),
        1 => s.fate.clone().prop_map(|ms| Fate::DroppedAfter { ms }),
        1 => (1u32..=8).prop_map(|polls| Fate::DroppedAtPoll { polls }),
        1 => s.fate.clone().prop_map(|ms| Fate::StepTimesOut { ms }),
    ]
}

fn attempt(s: &Scale, backend: Backend) -> impl Strategy<Value = Attempt> {
    // On the servers bodies fail more often: a body that outlived the ttl
    // and failed leaves its journal to the next attempt.
    let fails = if backend.server() { 0.4 } else { 0.25 };
    (
        s.start.clone(),
        fate(s, backend),
        prop::bool::weighted(fails),
        prop::bool::weighted(0.15),
    )
        .prop_map(|(at_ms, fate, body_fails, declined)| Attempt {
            at_ms,
            fate,
            body_fails,
            declined,
        })
}

fn fault_kind() -> impl Strategy<Value = FaultKind> {
    prop_oneof![
        Just(FaultKind::Fail),
        Just(FaultKind::LoseReply),
        Just(FaultKind::DelayPastLease),
        any::<bool>().prop_map(|applied| FaultKind::ConnectionDies { applied }),
    ]
}

fn op() -> impl Strategy<Value = Op> {
    prop::sample::select(OPS.to_vec())
}

fn fault() -> impl Strategy<Value = Fault> {
    (op(), 0u32..=2, fault_kind()).prop_map(|(op, nth, kind)| Fault { op, nth, kind })
}

fn outage(s: &Scale) -> impl Strategy<Value = Outage> {
    (op(), s.start.clone(), s.outage.clone()).prop_map(|(op, from_ms, len_ms)| Outage {
        op,
        from_ms,
        len_ms,
    })
}

fn downstream(s: &Scale) -> impl Strategy<Value = Downstream> {
    (
        any::<bool>(),
        any::<bool>(),
        prop_oneof![Just(0u64), s.commit.clone()],
    )
        .prop_map(|(dedupes, askable, commit_after_ms)| Downstream {
            dedupes,
            askable,
            commit_after_ms,
        })
}

/// With a failover, the steps that a lost journal write would run twice
/// (`refuse`, `reconcile`) are drawn most.
fn policy(backend: Backend) -> impl Strategy<Value = StepPolicy> {
    let journaled = if backend == Backend::RedisFailover {
        3
    } else {
        1
    };
    prop_oneof![
        1 => Just(StepPolicy::NoSteps),
        1 => Just(StepPolicy::Rerun),
        journaled => Just(StepPolicy::Reconcile),
        journaled => Just(StepPolicy::Refuse),
        1 => Just(StepPolicy::Atomic),
    ]
}

/// On the servers, entity mode is drawn most: its journal lives under
/// the claim's per-table scope, a seam record mode does not have.
fn mode(backend: Backend) -> impl Strategy<Value = Mode> {
    let entity = if backend.server() { 2 } else { 1 };
    prop_oneof![
        1 => Just(Mode::Record),
        1 => Just(Mode::Transactional),
        entity => Just(Mode::Entity)
    ]
}

/// A failover whose `window_ms` is in percent of the lease (a short
/// window, a write or two lost, the lease held; or one longer than the
/// lease, renewals lost: a retry may take the key over).
///
/// Drawn towards the operations every history sends early (claims, step
/// starts and completions, renewals), so that most histories fail over
/// while an attempt runs.
fn failover() -> impl Strategy<Value = Failover> {
    let percent = prop_oneof![0u64..=25, 100u64..=200];
    let op = prop_oneof![
        3 => Just(Op::Begin),
        5 => Just(Op::BeginStep),
        2 => Just(Op::CompleteStep),
        2 => Just(Op::Complete),
        2 => Just(Op::Renew),
        1 => Just(Op::Release),
        1 => Just(Op::KeepSteps),
        1 => Just(Op::Peek),
    ];
    let nth = prop_oneof![3 => Just(0u32), 1 => Just(1u32)];
    (op, nth, percent).prop_map(|(op, nth, window_ms)| Failover { op, nth, window_ms })
}

fn relay_fate() -> impl Strategy<Value = RelayFate> {
    prop_oneof![
        2 => Just(RelayFate::Marks),
        2 => (0usize..=3).prop_map(|delivered| RelayFate::Dies { delivered }),
        1 => Just(RelayFate::Releases),
        1 => Just(RelayFate::Slow),
        1 => (0u64..=150).prop_map(|pause_ms| RelayFate::Parks { pause_ms }),
    ]
}

/// A relay starts while the bodies run (they publish after their charge
/// and work) and looks for up to two seconds, until the history's calls
/// are over (then the final drain relays what is left).
fn relay() -> impl Strategy<Value = Relay> {
    (
        (0u64..=400, 300u64..=2_000),
        1usize..=3,
        10u64..=100,
        prop_oneof![3 => Just(1u32), 1 => 2u32..=3],
        prop::bool::weighted(0.3),
        relay_fate(),
    )
        .prop_map(
            |((at_ms, for_ms), batch, pause_ms, nth, purges, fate)| Relay {
                at_ms,
                for_ms,
                batch,
                pause_ms,
                nth,
                purges,
                fate,
            },
        )
}

/// The outbox in half the histories of a SQL backend; none elsewhere (no
/// draw, so the other backends' histories are those of their seeds).
fn outbox(s: &Scale, backend: Backend) -> BoxedStrategy<Option<OutboxPlan>> {
    if !backend.sql() {
        return Just(None).boxed();
    }
    let messages = prop_oneof![
        3 => Just(Messages::One),
        1 => Just(Messages::TwoTopics),
        1 => Just(Messages::TwoPayloads),
        1 => Just(Messages::SameTwice),
    ];
    let plan = (
        messages,
        s.lease.clone(),
        prop::collection::vec(relay(), 1..=3),
    )
        .prop_map(|(messages, lease_ms, relays)| OutboxPlan {
            messages,
            lease_ms,
            relays,
        });
    prop::option::weighted(0.5, plan).boxed()
}

/// The histories of `backend`.
pub fn history(backend: Backend) -> impl Strategy<Value = History> {
    let s = scale(backend);
    // The real stores run fewer seeds: bodies that outlive a short ttl
    // are drawn more often there, most on the servers (entity mode's
    // journal must outlive its ttl while the body runs).
    let (long_ttl, no_work, work) = match backend {
        Backend::Memory => (3, 2, 1),
        Backend::Postgres | Backend::MySql => (1, 1, 4),
        _ => (1, 1, 2),
    };
    let timing = (
        s.lease.clone(),
        // The ttl: long, or 1.5 or 2 leases (a body may outlive it). Not
        // at or under the lease: an in-progress record and its journal
        // then expire with the lease, and a takeover at its end is a new
        // operation (the guide's guarantees table, src/_guide/calls.md: "an
        // in-progress record lives at least as long as its lease"), which the checker cannot tell apart.
        prop_oneof![long_ttl => Just(None), 1 => (3u64..=4).prop_map(Some)],
        s.wait.clone(),
        prop_oneof![no_work => Just(0u64), work => s.work.clone()],
    );
    let shape = (
        mode(backend),
        policy(backend),
        downstream(&s),
        prop::bool::weighted(0.1),
        prop::bool::weighted(0.1),
        prop::bool::weighted(0.8),
        prop::bool::weighted(if backend.server() { 0.5 } else { 0.0 }),
    );
    let events = (
        prop::collection::vec(attempt(&s, backend), 1..=4),
        prop::collection::vec(fault(), 0..=3),
        prop::collection::vec(outage(&s), 0..=1),
        failover(),
    );
    // Drawn last: a seed's other parts are what they were before the
    // outbox.
    let outbox = outbox(&s, backend);
    (timing, shape, events, outbox).prop_map(
        move |(
            (lease_ms, ttl, wait_ms, work_ms),
            (mode, policy, downstream, large_outcome, size_limit, detach, outlives),
            (attempts, faults, outages, failover),
            outbox,
        )| {
            let mut h = History {
                backend,
                mode,
                policy,
                downstream,
                lease_ms,
                ttl_ms: ttl.map_or(LONG_TTL_MS, |halves| lease_ms * halves / 2),
                wait_ms,
                work_ms,
                large_outcome,
                size_limit,
                detach,
                attempts,
                faults,
                outages,
                failover: (backend == Backend::RedisFailover).then_some(Failover {
                    window_ms: lease_ms * failover.window_ms / 100,
                    ..failover
                }),
                outbox,
            };
            if outlives {
                outlive(&mut h, ttl.unwrap_or(3));
            }
            fit(&mut h);
            h
        },
    )
}

/// Makes the first caller's body outlive a short ttl (`halves` of the
/// lease), then fail, while the other callers wait for it: the next one
/// claims the key as that body fails, and must find its step's journal
/// entry, kept while the body ran (issue 35's third seam: in entity mode
/// the journal lives under the claim's per-table scope). The drawn spans
/// give the lengths past the ttl.
fn outlive(h: &mut History, halves: u64) {
    h.ttl_ms = h.lease_ms * halves / 2;
    h.work_ms = h.ttl_ms + h.work_ms % h.lease_ms;
    h.wait_ms = h.work_ms + h.lease_ms + h.wait_ms % 200;
    if let Some(first) = h.attempts.iter_mut().min_by_key(|a| a.at_ms) {
        first.fate = Fate::Finishes;
        first.body_fails = true;
        first.declined = false;
    }
}

/// Keeps a drawn history to the combinations the library offers, so that
/// a history tests a promise rather than a documented refusal.
fn fit(h: &mut History) {
    if !h.backend.sql() {
        h.mode = Mode::Record;
        if h.policy == StepPolicy::Atomic {
            h.policy = StepPolicy::Refuse;
        }
    }
    // A failover's histories meet the failover alone, on a store that
    // waits for its replica, and a downstream that does not dedupe: a
    // journal write the failover lost shows as a second effect.
    if h.backend == Backend::RedisFailover {
        h.faults.clear();
        h.outages.clear();
        h.size_limit = false;
        h.downstream.dedupes = false;
    }
    match h.mode {
        // Steps there are unjournaled: reconcile and refuse are refused
        // with `Config` (steps module, *Modes*).
        Mode::Transactional => {
            if matches!(h.policy, StepPolicy::Reconcile | StepPolicy::Refuse) {
                h.policy = StepPolicy::Rerun;
            }
        }
        Mode::Entity => {
            if h.policy == StepPolicy::Atomic {
                h.policy = StepPolicy::Refuse;
            }
        }
        Mode::Record => {}
    }
    // The faults are a store wrapper's: record mode only (entity mode's
    // claims are the pool's, transactional mode's the caller's connection).
    if h.mode != Mode::Record {
        h.faults.clear();
        h.outages.clear();
        h.size_limit = false;
        h.detach = true;
    }
    // An atomic phase's charge is a row of the caller's transaction: it
    // has no downstream to decline it.
    if h.policy == StepPolicy::Atomic {
        for attempt in &mut h.attempts {
            attempt.declined = false;
        }
    }
    // `reconcile` promises one effect for a downstream that can be asked.
    if h.policy == StepPolicy::Reconcile {
        h.downstream.askable = true;
    }
    // Steps journal through the store's detached handle: a store without
    // one journals nothing, refuses `reconcile` and `refuse` with `Config`
    // (as transactional mode does), and runs an atomic phase unjournaled.
    if !h.detach
        && matches!(
            h.policy,
            StepPolicy::Reconcile | StepPolicy::Refuse | StepPolicy::Atomic
        )
    {
        h.detach = true;
    }
}
