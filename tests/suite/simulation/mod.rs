//! A deterministic simulation of the engine, in the spirit of
//! FoundationDB's simulation and TigerBeetle's VOPR: from a seed it draws
//! the history of one operation key, runs it, and checks the promises the
//! guide makes (src/_guide/calls.md, *What the simulation checks*).
//!
//! # What a seed generates ([`history`])
//!
//! - **backend** (one per runner): the memory store; SQLite (a file of its
//!   own); PostgreSQL and MariaDB (a schema or a database of its own, the
//!   store's table and the simulation's in it); the single Redis (keys
//!   under a prefix of its own); and a Redis primary and replica of its
//!   own (127.0.0.1:7320-7321), with `wait_for_replicas`, for failovers;
//! - **mode**: record (every backend), transactional and entity (the SQL
//!   backends; on PostgreSQL and MariaDB entity mode is drawn twice as
//!   often as either other mode);
//! - **step policy**: no step, `rerun`, `reconcile`, `refuse`, an atomic
//!   phase (`Step::in_transaction`, the SQL backends);
//! - **downstream**: dedupes by key or not, can be asked by key or not,
//!   commits at once or late (on a task of its own, whatever its client
//!   does);
//! - **attempts**: one to four callers, concurrent or not, each with a
//!   fate: it finishes, it is dropped after a delay or at its n-th poll,
//!   or its step's client gives up on the downstream; its body may fail
//!   after its step;
//! - **store faults** (record mode), through a wrapper of `idem::Store`:
//!   the n-th claim, look, renewal, completion, release, step start, step
//!   completion or journal upkeep fails before the store, loses its reply,
//!   stalls past the lease, or meets a dying connection (applied or not);
//!   outages of one operation; a store without a background (`detach`);
//!   a store that refuses outcomes over the call's `max_outcome` as a
//!   passing failure (as Redis's size limit reads), with bodies whose
//!   value is over it;
//! - **a failover** (`simulation::redis_failover` only, every history, no
//!   other fault): as the n-th operation of a drawn kind is about to be
//!   sent, the replica is promoted (`REPLICAOF NO ONE`); the store talks
//!   to the old primary for a window (up to a quarter of a lease, or one
//!   to two leases), then the old primary is SIGKILLed and the store
//!   talks to the promoted replica. The old primary's writes of the
//!   window are lost; the writes that wait for the replica fail in it
//!   (a window longer than the lease loses renewals too: the checker
//!   counts it as such an outage);
//! - **the outbox** (the SQL backends, half the histories; drawn last,
//!   so that a seed's other parts are what they were without it): the
//!   body publishes, for its charge, one message, two (on two topics, or
//!   on one topic with two payloads) or one message twice, in the
//!   transaction of its effect: in record mode on a transaction of its
//!   own after its work, rolled back when the body fails, or in an atomic
//!   phase's, beside the charge's row; in transactional mode on the
//!   claim's transaction; in entity mode with `Outbox::enqueue`, written
//!   with the row. One to three relays, their leases as short as the
//!   history's, start while the bodies run and lease batches of one to
//!   three messages every 10 to 100 ms until the calls are over; each
//!   delivers what it leased to a consumer that dedupes by message id,
//!   then marks it, except at one drawn lease, where it dies after
//!   delivering none, some or all of it, gives it back, marks it only
//!   after the lease passed, or parks it (the broker refused it for good)
//!   and unparks it up to 150 ms later, and no lease may take a parked
//!   row; some purge after each lease
//!   ([`outbox`]);
//! - **time**: leases of 30 ms to 2 s, ttls about the lease or an hour,
//!   bodies that outlive them. The memory store runs on tokio's paused
//!   clock (a current-thread runtime), so a history of minutes takes
//!   milliseconds; the other stores' clock is the database's, so their
//!   histories run in real time, on shorter spans (leases of 60 to 200 ms;
//!   150 to 400 ms with a failover, where writes wait for the replica).
//!   On the real stores a short ttl (1.5 or 2 leases) is drawn half the
//!   time, and bodies that work after their step two times in three (four
//!   in five on PostgreSQL and MariaDB);
//! - **biases** where a seam needs a shape that independent draws rarely
//!   give: on PostgreSQL and MariaDB, half the histories have their first
//!   caller's body outlive a short ttl and then fail, while the others
//!   wait for it (the next claims the key and must find the step's
//!   journal entry: in entity mode it lives under the claim's per-table
//!   scope), duplicates wait up to 800 ms and bodies fail two times in
//!   five; with a failover, step starts are where it strikes most,
//!   `refuse` and `reconcile` are drawn most, callers end early as often
//!   as they wait, and the downstream never dedupes (a lost journal write
//!   shows as a second effect).
//!
//! # What it checks ([`check`])
//!
//! After the attempts, the store recovers (faults stop, leases pass) and a
//! final clean call is made; then the relays stop and a final drain
//! relays what the outbox holds. Then:
//!
//! - **effects**: at most one effect per operation, except where the
//!   guide documents a repeat for the policy and the downstream
//!   ([`check::repeat`], which cites each);
//! - **answers**: every `Ok` answer carries the same value, an effect's;
//!   no answer is an error the history cannot cause (`KeyReused`,
//!   `StepMismatch`, `Config`...);
//! - **no stuck keys**: the final call is not `InProgress`, and leaves the
//!   record finished or released;
//! - **bounded waits**: a caller that waits gets an answer within a bound
//!   made of the history's own spans;
//! - **bounded state**: one record and at most one journal entry for one
//!   key and one step;
//! - **the outbox** (`check::outbox`, which cites the outbox module's
//!   documentation for each): every message the outbox held was published
//!   by a body whose transaction committed (or may have: its caller
//!   dropped it), and no relay leased it before such a body began (a
//!   rolled-back body's message, published again later); a body whose
//!   transaction committed, and the charge every `Ok` answers with, have
//!   their messages there; each message's id is the one its content
//!   derives (`MessageId::derive`), and a message is written once (again
//!   only after a purge deleted it); after the drain nothing waits, every
//!   message was delivered, and the consumer had one effect of each; a
//!   row is relayed only if a relay that delivered it marked it; a row is
//!   leased again only after its lease passed or was given back, never
//!   once marked, and its lease count grows; a message delivered twice
//!   was delivered first under a lease whose relay died, gave it back, or
//!   marked it after the lease had passed.
//!
//! A key whose record may have expired between two attempts (a ttl about
//! the lease) starts a new operation: the checks hold per such epoch. A
//! run belongs to the operation it met: the one it claimed (its body's
//! start), or the one whose answer it got (a claim stalled in the store,
//! or waiting for SQLite's lock, can outlive the record it was sent for).
//!
//! # Running and replaying
//!
//! `simulation::memory` runs `IDEM_SIM_SEEDS` seeds (default
//! [`MEMORY_SEEDS`]) from `IDEM_SIM_FROM` (default 0);
//! `simulation::sqlite`, `simulation::postgres`, `simulation::mysql`,
//! `simulation::redis` and `simulation::redis_failover` likewise (default
//! [`SQLITE_SEEDS`], [`POSTGRES_SEEDS`], [`MYSQL_SEEDS`], [`REDIS_SEEDS`],
//! [`REDIS_FAILOVER_SEEDS`]); each prints its time, in how many
//! histories a fault struck, and what the outbox's histories did (their
//! messages, the relays' leases, the relays that died holding one, the
//! leases given back or marked late, the redeliveries the consumer
//! absorbed, the rows purged). `simulation::redis_failover` holds
//! `common::FAILOVERS`.
//! `IDEM_SIM_SEED=<n>` runs that one seed. Failures known to be open
//! (`check::known_open` names them; none today: the three it named, a
//! ten-second wait in entity mode on SQLite, a MariaDB deadlock victim in
//! transactional mode and MariaDB's migration lock held by a dropped
//! call, are fixed or no longer seen) are counted and
//! printed, not failed, unless `IDEM_SIM_STRICT=1`. A failing seed is shrunk by
//! proptest, and the test panics with the history as drawn, the smallest
//! failing one, what broke, and the one command that replays it, as:
//!
//! ```text
//! IDEM_SIM_SEED=123 cargo test --all-features --test suite -- simulation::memory --exact
//! ```
//!
//! # Limits
//!
//! - One operation key per history, one step per body.
//! - Faults are injected in record mode only: entity mode claims through
//!   the pool, and transactional mode through the caller's connection.
//!   No process crash (a claim left to its lease with nothing handed
//!   back). A failover only on Redis, one per history, alone; none on a
//!   Redis Cluster.
//! - A history is deterministic on the memory store as far as tokio's
//!   current-thread scheduler is: the random branch order of an unbiased
//!   `select!` is not seeded. The other backends' histories run in real
//!   time and vary with the machine's load; so does whether a failover's
//!   promotion beats the replication of the write before it.
//! - Memory per call is checked as the records and journal entries one
//!   key leaves, not as bytes.
//! - The outbox's relays are its own API, delivering to a consumer in the
//!   harness: no broker (`outbox_kafka` relays to one). One key's
//!   messages only, so the order across operations is not checked; no
//!   store fault strikes the outbox's statements.

mod check;
mod downstream;
#[cfg(feature = "redis")]
mod failover;
mod faults;
mod history;
mod outbox;
mod run;

use std::cell::RefCell;
use std::collections::BTreeMap;
use std::time::Instant;

use proptest::strategy::{Strategy, ValueTree};
use proptest::test_runner::{Config, RngAlgorithm, TestCaseError, TestError, TestRng, TestRunner};

use history::{Backend, History};
use run::Observed;

/// Seeds per run of `simulation::memory` unless `IDEM_SIM_SEEDS` says.
pub const MEMORY_SEEDS: u64 = 5_000;
/// Seeds per run of `simulation::sqlite` unless `IDEM_SIM_SEEDS` says.
pub const SQLITE_SEEDS: u64 = 100;
/// Seeds per run of `simulation::postgres` unless `IDEM_SIM_SEEDS` says.
pub const POSTGRES_SEEDS: u64 = 65;
/// Seeds per run of `simulation::mysql` unless `IDEM_SIM_SEEDS` says.
pub const MYSQL_SEEDS: u64 = 60;
/// Seeds per run of `simulation::redis` unless `IDEM_SIM_SEEDS` says.
pub const REDIS_SEEDS: u64 = 75;
/// Seeds per run of `simulation::redis_failover` unless `IDEM_SIM_SEEDS`
/// says.
pub const REDIS_FAILOVER_SEEDS: u64 = 48;

fn env(name: &str) -> Option<u64> {
    let value = std::env::var(name).ok()?;
    Some(
        value
            .parse()
            .unwrap_or_else(|_| panic!("{name}={value:?} is not a number")),
    )
}

/// The seeds to run: `IDEM_SIM_SEED` alone, or `IDEM_SIM_SEEDS` of them
/// from `IDEM_SIM_FROM`.
fn seeds(default: u64) -> std::ops::Range<u64> {
    if let Some(seed) = env("IDEM_SIM_SEED") {
        return seed..seed + 1;
    }
    let from = env("IDEM_SIM_FROM").unwrap_or(0);
    from..from + env("IDEM_SIM_SEEDS").unwrap_or(default)
}

/// Runs the seeds of `backend`; panics at the first that breaks a
/// promise, with the command that replays it.
fn simulate(backend: Backend, test: &str, default: u64, shrink: u32) {
    let began = Instant::now();
    let seeds = seeds(default);
    let mut known_open: BTreeMap<&'static str, u64> = BTreeMap::new();
    // The histories in which a fault (or a failover) struck.
    let struck = std::cell::Cell::new(0u64);
    let tally = RefCell::new(outbox::Tally::default());
    for seed in seeds.clone() {
        let mut bytes = [0u8; 32];
        bytes[..8].copy_from_slice(&seed.to_le_bytes());
        let config = Config {
            cases: 1,
            failure_persistence: None,
            max_shrink_iters: shrink,
            ..Config::default()
        };
        let mut runner =
            TestRunner::new_with_rng(config, TestRng::from_seed(RngAlgorithm::ChaCha, &bytes));
        let tree = history::history(backend)
            .new_tree(&mut runner)
            .expect("a history");
        let drawn = tree.current();
        // The first run's known open repeats (shrinking runs more).
        let first: RefCell<Option<Vec<&'static str>>> = RefCell::new(None);
        let result = runner.run_one(tree, |h: History| {
            let observed = execute(&h);
            if first.borrow().is_none() && observed.struck > 0 {
                struck.set(struck.get() + 1);
            }
            if let (None, Some(seen)) = (&*first.borrow(), &observed.outbox) {
                tally.borrow_mut().add(seen);
            }
            match check::check(&h, &observed) {
                Ok(passed) => {
                    first.borrow_mut().get_or_insert(passed.known_open);
                    Ok(())
                }
                Err(broken) => {
                    first.borrow_mut().get_or_insert_with(Vec::new);
                    let outbox = observed
                        .outbox
                        .as_ref()
                        .map(|seen| format!("\noutbox: {seen:#?}"))
                        .unwrap_or_default();
                    Err(TestCaseError::fail(format!(
                        "{broken}\n\nwhat the callers got: {:#?}\neffects: {:?}{outbox}",
                        observed.runs, observed.effects
                    )))
                }
            }
        });
        for what in first.into_inner().unwrap_or_default() {
            *known_open.entry(what).or_default() += 1;
        }
        match result {
            Ok(_) => {}
            Err(TestError::Fail(why, smallest)) => panic!(
                "seed {seed} broke a promise (after {} seeds).\n\nhistory: {drawn:#?}\n\n\
                 smallest failing history: {smallest:#?}\n\n{why}\n\nreplay: \
                 IDEM_SIM_SEED={seed} cargo test --all-features --test suite -- \
                 simulation::{test} --exact",
                seed - seeds.start + 1
            ),
            Err(TestError::Abort(why)) => panic!("seed {seed}: {why}"),
        }
    }
    println!(
        "simulation::{test}: {} seeds ({}..{}) in {:.1?}, a fault struck in {}; \
         {}; known open failures hit: {known_open:?}",
        seeds.end - seeds.start,
        seeds.start,
        seeds.end,
        began.elapsed(),
        struck.get(),
        tally.borrow()
    );
}

fn execute(h: &History) -> Observed {
    match h.backend {
        Backend::Memory => run::run_memory(h),
        #[cfg(feature = "sqlite")]
        Backend::Sqlite => run::run_sql::<sqlx::Sqlite>(h),
        #[cfg(feature = "postgres")]
        Backend::Postgres => run::run_sql::<sqlx::Postgres>(h),
        #[cfg(feature = "mysql")]
        Backend::MySql => run::run_sql::<sqlx::MySql>(h),
        #[cfg(feature = "redis")]
        Backend::Redis => run::run_redis(h),
        #[cfg(feature = "redis")]
        Backend::RedisFailover => run::run_redis_failover(h),
        #[allow(unreachable_patterns)]
        other => unreachable!("{other:?} is not built without its feature"),
    }
}

/// The memory store, record mode, every policy but atomic phases, every
/// fault, on the paused clock.
#[test]
fn memory() {
    simulate(Backend::Memory, "memory", MEMORY_SEEDS, 256);
}

/// SQLite in record, transactional and entity modes, in real time; faults
/// in record mode.
#[cfg(feature = "sqlite")]
#[test]
fn sqlite() {
    simulate(Backend::Sqlite, "sqlite", SQLITE_SEEDS, 16);
}

/// PostgreSQL in record, transactional and entity modes, in real time,
/// each history in a schema of its own; faults in record mode.
#[cfg(feature = "postgres")]
#[test]
fn postgres() {
    simulate(Backend::Postgres, "postgres", POSTGRES_SEEDS, 8);
}

/// MariaDB in record, transactional and entity modes, in real time, each
/// history in a database of its own; faults in record mode.
#[cfg(feature = "mysql")]
#[test]
fn mysql() {
    simulate(Backend::MySql, "mysql", MYSQL_SEEDS, 8);
}

/// The single Redis, record mode, every policy but atomic phases, every
/// fault, in real time.
#[cfg(feature = "redis")]
#[test]
fn redis() {
    simulate(Backend::Redis, "redis", REDIS_SEEDS, 8);
}

/// Redis with `wait_for_replicas` on a primary and a replica of each
/// history's own, failed over at a drawn point: the replica promoted, the
/// old primary killed.
#[cfg(feature = "redis")]
#[test]
fn redis_failover() {
    let _failovers = crate::common::FAILOVERS.blocking_lock();
    simulate(
        Backend::RedisFailover,
        "redis_failover",
        REDIS_FAILOVER_SEEDS,
        4,
    );
}
