//! The transactional outbox against producing to Kafka directly:
//! `cargo bench --bench outbox --features kafka,sqlite,postgres`.
//!
//! Four ways to do one operation, "write the order, announce it", each
//! measured as operations per second by `tasks` tasks (1, 4 and 16):
//!
//! - **direct**: a transaction that INSERTs the effect and commits, then
//!   the event produced with an idempotent producer
//!   (`enable.idempotence=true`), its delivery awaited;
//! - **direct + idem**: the same inside an idempotent operation
//!   (`idem::run`, record mode), so that the reader sees what idem itself
//!   costs;
//! - **outbox**: an idempotent operation whose body INSERTs the effect and
//!   publishes the event into the outbox ([`Outbox::publish`]) in the same
//!   transaction, while a [`KafkaRelay`] with its default settings runs in
//!   the same process. Its throughput counts an operation when the broker
//!   acknowledged its event: from the first operation to the moment no
//!   message waits in the outbox. The rate at which the operations alone
//!   ran (their events enqueued, not yet produced) is reported beside it;
//! - **outbox, transactional mode**: the same in transactional mode
//!   (`idem::run_in_transaction`): the claim, the effect, the event and the
//!   completion in one transaction, where record mode commits three (the
//!   claim, the body's, the completion).
//!
//! The four run side by side in rounds whose order alternates (A B C D,
//! then D C B A), since the machine is shared and noisy; a ratio is the
//! median of its per-round ratios, with their least and greatest. The run
//! first waits, up to five minutes, for the one-minute load average to
//! fall to 1.5 or below.
//!
//! PostgreSQL (`IDEM_POSTGRES_URL`, the local `test` database by default)
//! in a schema of the run's own, dropped at its end; SQLite on a file in a
//! temporary directory. The broker is `IDEM_KAFKA_BROKERS` (the local
//! `127.0.0.1:9092` by default, which `.ci/kafka-broker start` serves),
//! on a topic of the run's own, deleted at its end.
//!
//! Knobs: `IDEM_BENCH_OPS` operations per measurement (default 400),
//! `IDEM_BENCH_ROUNDS` rounds (default 6), `IDEM_BENCH_TASKS` the task
//! counts (default `1,4,16`), `IDEM_BENCH_ONLY` a store (`postgres` or
//! `sqlite`), `IDEM_BENCH_DIRECT_LINGER_MS` the direct producer's
//! `linger.ms` (default 0, see [`direct_linger`]). `IDEM_BENCH_PROFILE=1`
//! adds, after the rounds, where an outbox operation's time goes (see
//! [`profile`]).

#[path = "../tests/suite/common/kafka.rs"]
#[allow(dead_code)]
mod kafka_env;

use std::fmt::Write as _;
use std::future::Future;
use std::pin::Pin;
use std::str::FromStr;
use std::sync::atomic::{AtomicUsize, Ordering};
use std::sync::Arc;
use std::time::{Duration, Instant};

use idem::outbox::kafka::KafkaRelay;
use idem::outbox::{Message, Outbox};
use idem::store::{Backend, SqlStore, TransactionalStore};
use idem::{run, run_in_transaction, Call, Error, Store};
use rdkafka::message::{Header, OwnedHeaders};
use rdkafka::producer::{FutureProducer, FutureRecord};
use rdkafka::util::Timeout;
use rdkafka::ClientConfig;

use kafka_env::{brokers, Topic};

/// A name no other run uses: the topic's (see [`kafka_env::Topic`]), the
/// schema's and the operations' keys.
fn fresh(tag: &str) -> String {
    format!(
        "{tag}-{}-{}",
        std::process::id(),
        std::time::SystemTime::now()
            .duration_since(std::time::UNIX_EPOCH)
            .unwrap()
            .as_nanos()
    )
}

/// The goal: outbox / direct at [`GOAL_TASKS`] tasks.
const GOAL: f64 = 0.5;
const GOAL_TASKS: usize = 4;

/// The longest the relay may take to drain one measurement's messages.
const DRAIN_BOUND: Duration = Duration::from_secs(120);

fn knob(var: &str, default: usize) -> usize {
    std::env::var(var)
        .ok()
        .and_then(|v| v.trim().parse().ok())
        .filter(|&n| n > 0)
        .unwrap_or(default)
}

/// Operations per measurement.
fn ops() -> usize {
    knob("IDEM_BENCH_OPS", 400)
}

fn rounds() -> usize {
    knob("IDEM_BENCH_ROUNDS", 6)
}

fn task_counts() -> Vec<usize> {
    std::env::var("IDEM_BENCH_TASKS")
        .ok()
        .map(|v| {
            v.split(',')
                .filter_map(|n| n.trim().parse().ok())
                .filter(|&n| n > 0)
                .collect::<Vec<usize>>()
        })
        .filter(|v| !v.is_empty())
        .unwrap_or_else(|| vec![1, 4, 16])
}

fn wanted(store: &str) -> bool {
    let only = std::env::var("IDEM_BENCH_ONLY").unwrap_or_default();
    only.trim().is_empty() || only.split(',').any(|s| s.trim() == store)
}

/// The effect's INSERT on a transaction: `key`, `amount`.
type Insert<DB> = for<'c> fn(
    &'c mut <DB as sqlx::Database>::Connection,
    &'c str,
    i64,
) -> Pin<Box<dyn Future<Output = Result<(), sqlx::Error>> + Send + 'c>>;

fn pg_insert<'c>(
    conn: &'c mut sqlx::PgConnection,
    key: &'c str,
    amount: i64,
) -> Pin<Box<dyn Future<Output = Result<(), sqlx::Error>> + Send + 'c>> {
    Box::pin(async move {
        sqlx::query("INSERT INTO bench_orders (order_key, amount) VALUES ($1, $2)")
            .bind(key)
            .bind(amount)
            .execute(conn)
            .await
            .map(drop)
    })
}

fn lite_insert<'c>(
    conn: &'c mut sqlx::SqliteConnection,
    key: &'c str,
    amount: i64,
) -> Pin<Box<dyn Future<Output = Result<(), sqlx::Error>> + Send + 'c>> {
    Box::pin(async move {
        sqlx::query("INSERT INTO bench_orders (order_key, amount) VALUES (?1, ?2)")
            .bind(key)
            .bind(amount)
            .execute(conn)
            .await
            .map(drop)
    })
}

const ORDERS_TABLE: &str =
    "CREATE TABLE bench_orders (order_key TEXT NOT NULL, amount BIGINT NOT NULL)";

/// What is measured.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
enum Way {
    Direct,
    DirectIdem,
    Outbox,
    /// The outbox in transactional mode.
    OutboxTx,
}

const WAYS: [Way; 4] = [Way::Direct, Way::DirectIdem, Way::Outbox, Way::OutboxTx];

impl Way {
    fn through_outbox(self) -> bool {
        matches!(self, Way::Outbox | Way::OutboxTx)
    }
}

/// One store: its records, its outbox, the effect's INSERT and how its
/// write transactions begin, and the producer of the direct ways.
struct Side<DB: Backend> {
    label: &'static str,
    store: SqlStore<DB>,
    outbox: Outbox<DB>,
    /// The most tasks the outbox's transactional mode is measured with:
    /// on SQLite, fewer than the pool's connections. There the store
    /// reads a record beside the caller's transaction, on another
    /// connection of the pool, waiting a little for one; with as many
    /// tasks as connections, every connection may be held by a task
    /// waiting for the write lock (SQLite's busy handler) that the task
    /// waiting for a connection holds, and the waits run into the busy
    /// timeout.
    transactional_tasks: usize,
    /// `BEGIN`, or SQLite's `BEGIN IMMEDIATE` (a write transaction from
    /// its start, as a writer on SQLite should).
    begin: &'static str,
    insert: Insert<DB>,
    producer: FutureProducer,
    topic: String,
}

/// The event of the order `key`.
fn payload(key: &str, amount: i64) -> String {
    format!(r#"{{"order":"{key}","amount":{amount}}}"#)
}

impl<DB: Backend> Side<DB>
where
    SqlStore<DB>: Store + TransactionalStore<<DB as sqlx::Database>::Connection>,
{
    /// The effect, committed.
    async fn effect(&self, key: &str, amount: i64) -> Result<(), Error> {
        let mut tx = self
            .store
            .pool()
            .begin_with(self.begin)
            .await
            .map_err(Error::store)?;
        (self.insert)(&mut *tx, key, amount)
            .await
            .map_err(Error::store)?;
        tx.commit().await.map_err(Error::store)
    }

    /// The event, produced and acknowledged, with a header as large as
    /// the outbox's message id.
    async fn produce(&self, key: &str, amount: i64) -> Result<(), Error> {
        let payload = payload(key, amount);
        let id = format!("{key:0>64}");
        let headers = OwnedHeaders::new_with_capacity(1).insert(Header {
            key: idem::outbox::MESSAGE_ID_HEADER,
            value: Some(id.as_str()),
        });
        let record = FutureRecord::to(&self.topic)
            .key(key)
            .payload(&payload)
            .headers(headers);
        self.producer
            .send(record, Timeout::Never)
            .await
            .map(drop)
            .map_err(|(err, _)| Error::store(err))
    }

    /// One operation of `way` on the order `key`.
    async fn op(&self, way: Way, key: &str, amount: i64) -> Result<(), Error> {
        match way {
            Way::Direct => {
                self.effect(key, amount).await?;
                self.produce(key, amount).await
            }
            Way::DirectIdem => {
                run(
                    &self.store,
                    Call::new("bench.order.direct", &key, &amount),
                    async {
                        self.effect(key, amount).await?;
                        self.produce(key, amount).await
                    },
                )
                .await
            }
            Way::Outbox => {
                run(
                    &self.store,
                    Call::new("bench.order.outbox", &key, &amount),
                    async {
                        let mut tx = self
                            .store
                            .pool()
                            .begin_with(self.begin)
                            .await
                            .map_err(Error::store)?;
                        (self.insert)(&mut *tx, key, amount)
                            .await
                            .map_err(Error::store)?;
                        let event =
                            Message::new(&self.topic, payload(key, amount))?.with_key(key)?;
                        self.outbox.publish(&mut tx, &event).await?;
                        tx.commit().await.map_err(Error::store)
                    },
                )
                .await
            }
            Way::OutboxTx => {
                let mut tx = self
                    .store
                    .pool()
                    .begin_with(self.begin)
                    .await
                    .map_err(Error::store)?;
                run_in_transaction(
                    &self.store,
                    &mut *tx,
                    Call::new("bench.order.outbox_tx", &key, &amount),
                    |conn| async move {
                        let written = async {
                            (self.insert)(&mut *conn, key, amount)
                                .await
                                .map_err(Error::store)?;
                            let event =
                                Message::new(&self.topic, payload(key, amount))?.with_key(key)?;
                            self.outbox.publish(&mut *conn, &event).await.map(drop)
                        }
                        .await;
                        (written, conn)
                    },
                )
                .await?;
                tx.commit().await.map_err(Error::store)
            }
        }
    }
}

/// One measurement: operations per second, and for the outbox the rate of
/// the operations alone (their events enqueued).
#[derive(Clone, Copy, Debug)]
struct Measured {
    rate: f64,
    enqueued: Option<f64>,
}

/// `ops` operations of `way` by `tasks` tasks; for the outbox, until the
/// relay has relayed them all.
async fn measure<DB: Backend>(side: &Arc<Side<DB>>, way: Way, tasks: usize, ops: usize) -> Measured
where
    SqlStore<DB>: Store + TransactionalStore<<DB as sqlx::Database>::Connection>,
{
    static N: AtomicUsize = AtomicUsize::new(0);
    let run_tag = fresh("order");
    let per_task = (ops / tasks).max(1);
    let start = Instant::now();
    let handles: Vec<_> = (0..tasks)
        .map(|_| {
            let side = side.clone();
            let run_tag = run_tag.clone();
            tokio::spawn(async move {
                for _ in 0..per_task {
                    let n = N.fetch_add(1, Ordering::Relaxed);
                    let key = format!("{run_tag}-{n}");
                    side.op(way, &key, n as i64)
                        .await
                        .unwrap_or_else(|err| panic!("{} {way:?}: {err}", side.label));
                }
            })
        })
        .collect();
    for h in handles {
        h.await.unwrap();
    }
    let done = (per_task * tasks) as f64;
    let enqueued = start.elapsed();
    if !way.through_outbox() {
        return Measured {
            rate: done / enqueued.as_secs_f64(),
            enqueued: None,
        };
    }
    loop {
        if side.outbox.waiting().await.unwrap() == 0 {
            break;
        }
        assert!(
            start.elapsed() < DRAIN_BOUND,
            "{}: the relay did not drain the outbox within {DRAIN_BOUND:?}",
            side.label
        );
        tokio::time::sleep(Duration::from_millis(1)).await;
    }
    Measured {
        rate: done / start.elapsed().as_secs_f64(),
        enqueued: Some(done / enqueued.as_secs_f64()),
    }
}

/// The median; NaN for a way not measured (NaN in every round).
fn median(mut v: Vec<f64>) -> f64 {
    if v.iter().any(|x| x.is_nan()) {
        return f64::NAN;
    }
    v.sort_by(|a, b| a.partial_cmp(b).unwrap());
    let n = v.len();
    if n % 2 == 1 {
        v[n / 2]
    } else {
        (v[n / 2 - 1] + v[n / 2]) / 2.0
    }
}

/// A ratio over rounds: its median, least and greatest.
#[derive(Clone, Copy, Debug)]
struct Spread {
    median: f64,
    min: f64,
    max: f64,
}

impl Spread {
    fn of(v: Vec<f64>) -> Spread {
        Spread {
            min: v.iter().copied().fold(f64::INFINITY, f64::min),
            max: v.iter().copied().fold(f64::NEG_INFINITY, f64::max),
            median: median(v),
        }
    }
}

impl std::fmt::Display for Spread {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        if self.median.is_nan() {
            return f.write_str("-");
        }
        write!(f, "{:.2} ({:.2}–{:.2})", self.median, self.min, self.max)
    }
}

/// Operations per second as the report prints them: "-" when not measured.
fn per_second(rate: f64) -> String {
    if rate.is_nan() {
        "-".to_owned()
    } else {
        format!("{rate:.0}")
    }
}

/// What one store and task count found.
struct Line {
    store: &'static str,
    tasks: usize,
    /// Median operations per second of each way, as [`WAYS`].
    rates: [f64; 4],
    /// The outbox's enqueue rates: record mode, transactional mode.
    enqueued: [f64; 2],
    outbox_to_direct: Spread,
    enqueued_to_direct: Spread,
    idem_to_direct: Spread,
    outbox_to_idem: Spread,
    tx_to_direct: Spread,
}

/// The rounds of one store at one task count.
async fn compare<DB: Backend>(side: &Arc<Side<DB>>, tasks: usize) -> Line
where
    SqlStore<DB>: Store + TransactionalStore<<DB as sqlx::Database>::Connection>,
{
    let transactional = tasks <= side.transactional_tasks;
    let ways: Vec<Way> = WAYS
        .into_iter()
        .filter(|&way| way != Way::OutboxTx || transactional)
        .collect();
    let mut found: Vec<[Measured; 4]> = Vec::new();
    for round in 0..rounds() {
        let mut order = ways.clone();
        if round % 2 == 1 {
            order.reverse();
        }
        let mut this = [Measured {
            rate: f64::NAN,
            enqueued: Some(f64::NAN),
        }; 4];
        for way in order {
            let i = WAYS.iter().position(|w| *w == way).unwrap();
            this[i] = measure(side, way, tasks, ops()).await;
        }
        found.push(this);
    }
    let ratio = |f: &dyn Fn(&[Measured; 4]) -> f64| Spread::of(found.iter().map(f).collect());
    let rate = |i: usize| median(found.iter().map(|m| m[i].rate).collect());
    let enq = |m: &[Measured; 4], i: usize| m[i].enqueued.unwrap();
    let line = Line {
        store: side.label,
        tasks,
        rates: [rate(0), rate(1), rate(2), rate(3)],
        enqueued: [2, 3].map(|i| median(found.iter().map(|m| enq(m, i)).collect())),
        outbox_to_direct: ratio(&|m| m[2].rate / m[0].rate),
        enqueued_to_direct: ratio(&|m| enq(m, 2) / m[0].rate),
        idem_to_direct: ratio(&|m| m[1].rate / m[0].rate),
        outbox_to_idem: ratio(&|m| m[2].rate / m[1].rate),
        tx_to_direct: ratio(&|m| m[3].rate / m[0].rate),
    };
    eprintln!(
        "{} {tasks} tasks: direct {:.0}, direct + idem {:.0}, outbox {:.0} (enqueued {:.0}), transactional {} ops/s; outbox / direct {}",
        line.store,
        line.rates[0],
        line.rates[1],
        line.rates[2],
        line.enqueued[0],
        per_second(line.rates[3]),
        line.outbox_to_direct
    );
    line
}

/// The direct ways' `linger.ms`: 0 unless `IDEM_BENCH_DIRECT_LINGER_MS`
/// says otherwise. An operation that awaits its one record gains nothing
/// by waiting for a batch to fill, and librdkafka's default (5 ms) would
/// add that wait to every direct operation.
fn direct_linger() -> String {
    std::env::var("IDEM_BENCH_DIRECT_LINGER_MS").unwrap_or_else(|_| "0".to_owned())
}

/// The direct ways' producer: idempotent, no linger (see
/// [`direct_linger`]), otherwise librdkafka's defaults, as the relay's.
fn direct_producer(bootstrap: &str) -> FutureProducer {
    ClientConfig::new()
        .set("bootstrap.servers", bootstrap)
        .set("enable.idempotence", "true")
        .set("linger.ms", direct_linger())
        .create()
        .expect("a producer")
}

/// The store's side with a relay running; measures every task count, then
/// stops the relay.
async fn each<DB: Backend>(side: Side<DB>, lines: &mut Vec<Line>, profiles: &mut Vec<String>)
where
    SqlStore<DB>: Store + TransactionalStore<<DB as sqlx::Database>::Connection>,
{
    let t = Instant::now();
    let side = Arc::new(side);
    let relay = KafkaRelay::new(
        side.outbox.clone(),
        ClientConfig::new().set("bootstrap.servers", brokers()),
    )
    .expect("a relay");
    let relaying = tokio::spawn(async move { relay.run().await });
    // Connections, prepared statements, the producers' broker connections.
    for way in WAYS {
        measure(&side, way, GOAL_TASKS, 40).await;
    }
    for tasks in task_counts() {
        lines.push(compare(&side, tasks).await);
    }
    relaying.abort();
    let _ = relaying.await;
    if profiling() {
        profiles.push(profile(&side).await);
    }
    eprintln!("{} done in {:.0} s", side.label, t.elapsed().as_secs_f64());
}

/// `IDEM_BENCH_PROFILE=1`: after the rounds, where an outbox operation's
/// time goes ([`profile`]).
fn profiling() -> bool {
    std::env::var("IDEM_BENCH_PROFILE").is_ok_and(|v| v == "1")
}

fn micros(since: Instant) -> f64 {
    since.elapsed().as_secs_f64() * 1e6
}

/// Where an outbox operation's time goes on one store, with no relay
/// running: the latency of each part of an operation, one caller; then a
/// backlog enqueued by [`GOAL_TASKS`] tasks and drained by the relay's own
/// steps (lease, produce, mark), timed, with the relay's default
/// producer and with one that does not linger.
async fn profile<DB: Backend>(side: &Arc<Side<DB>>) -> String
where
    SqlStore<DB>: Store + TransactionalStore<<DB as sqlx::Database>::Connection>,
{
    const ONE_CALLER: usize = 200;
    const BACKLOG: usize = 2000;
    let tag = fresh("profile");
    let (mut effect, mut idem_effect, mut produce, mut op, mut publish, mut op_tx) = (
        Vec::new(),
        Vec::new(),
        Vec::new(),
        Vec::new(),
        Vec::new(),
        Vec::new(),
    );
    for n in 0..ONE_CALLER as i64 {
        let key = format!("{tag}-{n}");
        let t = Instant::now();
        side.effect(&format!("{key}-e"), n).await.unwrap();
        effect.push(micros(t));
        let t = Instant::now();
        run(
            &side.store,
            Call::new("bench.order.idem", &key, &n),
            side.effect(&format!("{key}-i"), n),
        )
        .await
        .unwrap();
        idem_effect.push(micros(t));
        let t = Instant::now();
        side.produce(&key, n).await.unwrap();
        produce.push(micros(t));
        let t = Instant::now();
        let published = run(
            &side.store,
            Call::new("bench.order.outbox", &key, &n),
            async {
                let mut tx = side
                    .store
                    .pool()
                    .begin_with(side.begin)
                    .await
                    .map_err(Error::store)?;
                (side.insert)(&mut *tx, &key, n)
                    .await
                    .map_err(Error::store)?;
                let event = Message::new(&side.topic, payload(&key, n))?.with_key(key.as_str())?;
                let t = Instant::now();
                side.outbox.publish(&mut tx, &event).await?;
                let published = micros(t);
                tx.commit().await.map_err(Error::store)?;
                Ok::<_, Error>(published)
            },
        )
        .await
        .unwrap();
        op.push(micros(t));
        publish.push(published);
        let t = Instant::now();
        side.op(Way::OutboxTx, &key, n).await.unwrap();
        op_tx.push(micros(t));
    }
    let mut out = String::new();
    let _ = writeln!(
        out,
        "- {}, one caller, median of {ONE_CALLER}: the effect's transaction {:.0} µs; in an idempotent operation {:.0} µs; with the event published in the outbox {:.0} µs, of which `publish` {:.0} µs; the same in transactional mode {:.0} µs; producing the event directly {:.0} µs",
        side.label,
        median(effect),
        median(idem_effect),
        median(op),
        median(publish),
        median(op_tx),
        median(produce),
    );
    for (label, linger) in [
        ("default producer (`linger.ms=5`)", None),
        ("`linger.ms=0`", Some("0")),
    ] {
        let t = Instant::now();
        let handles: Vec<_> = (0..GOAL_TASKS)
            .map(|task| {
                let side = side.clone();
                let tag = format!("{tag}-{task}-{}", linger.unwrap_or("d"));
                tokio::spawn(async move {
                    for n in 0..(BACKLOG / GOAL_TASKS) as i64 {
                        side.op(Way::Outbox, &format!("{tag}-{n}"), n)
                            .await
                            .unwrap();
                    }
                })
            })
            .collect();
        for h in handles {
            h.await.unwrap();
        }
        let enqueued = BACKLOG as f64 / t.elapsed().as_secs_f64();
        let mut config = ClientConfig::new();
        config.set("bootstrap.servers", brokers());
        if let Some(linger) = linger {
            config.set("linger.ms", linger);
        }
        let relay = KafkaRelay::new(side.outbox.clone(), &config).expect("a relay");
        // The backlog, and the messages the one-caller part left.
        let (mut lease, mut produced, mut mark, mut batches, mut messages) = (0.0, 0.0, 0.0, 0, 0);
        let t = Instant::now();
        loop {
            let t0 = Instant::now();
            let leased = side
                .outbox
                .lease(500, Duration::from_secs(30))
                .await
                .unwrap();
            if leased.is_empty() {
                break;
            }
            lease += micros(t0);
            batches += 1;
            messages += leased.messages().len();
            let t1 = Instant::now();
            let acks = relay.produce(&leased).await;
            produced += micros(t1);
            assert!(
                acks.failed.is_empty(),
                "{} not acknowledged",
                acks.failed.len()
            );
            let t2 = Instant::now();
            side.outbox.mark_relayed(&acks.acknowledged).await.unwrap();
            mark += micros(t2);
        }
        let drained = t.elapsed().as_secs_f64();
        let per_batch = |us: f64| us / 1000.0 / batches.max(1) as f64;
        let _ = writeln!(
            out,
            "- {}, a backlog of {BACKLOG} enqueued by {GOAL_TASKS} tasks at {enqueued:.0} ops/s, drained ({messages} messages) by the relay's steps with the {label} in {batches} batches at {:.0} messages/s: per batch of up to 500, lease {:.1} ms, produce {:.1} ms, mark {:.1} ms",
            side.label,
            messages as f64 / drained,
            per_batch(lease),
            per_batch(produced),
            per_batch(mark),
        );
    }
    out
}

async fn postgres(topic: &str, lines: &mut Vec<Line>, profiles: &mut Vec<String>) -> String {
    let url = std::env::var("IDEM_POSTGRES_URL")
        .unwrap_or_else(|_| "postgres://postgres@127.0.0.1:5432/test".to_owned());
    let schema = fresh("idem_bench_outbox").replace('-', "_");
    let mut admin = <sqlx::PgConnection as sqlx::Connection>::connect(&url)
        .await
        .unwrap_or_else(|e| panic!("PostgreSQL at {url}: {e}"));
    sqlx::raw_sql(&format!("CREATE SCHEMA \"{schema}\""))
        .execute(&mut admin)
        .await
        .unwrap();
    let version: String = sqlx::query_scalar("SHOW server_version")
        .fetch_one(&mut admin)
        .await
        .unwrap();
    let options = sqlx::postgres::PgConnectOptions::from_str(&url)
        .unwrap()
        .options([("search_path", schema.as_str())]);
    let pool = sqlx::postgres::PgPoolOptions::new()
        .max_connections(20)
        .test_before_acquire(false)
        .connect_with(options)
        .await
        .unwrap();
    let store = idem::PostgresStore::new(pool.clone())
        .with_table_name("bench_records")
        .unwrap();
    store.migrate().await.unwrap();
    sqlx::raw_sql(ORDERS_TABLE).execute(&pool).await.unwrap();
    let side = Side {
        label: "PostgreSQL",
        outbox: Outbox::new(&store),
        store,
        transactional_tasks: usize::MAX,
        begin: "BEGIN",
        insert: pg_insert,
        producer: direct_producer(&brokers()),
        topic: topic.to_owned(),
    };
    each(side, lines, profiles).await;
    pool.close().await;
    sqlx::raw_sql(&format!("DROP SCHEMA \"{schema}\" CASCADE"))
        .execute(&mut admin)
        .await
        .unwrap();
    format!("PostgreSQL {version}")
}

async fn sqlite(topic: &str, lines: &mut Vec<Line>, profiles: &mut Vec<String>) -> String {
    let dir = tempfile::tempdir().unwrap();
    let url = format!("sqlite://{}", dir.path().join("outbox.db").display());
    let store = idem::SqliteStore::connect(&url).await.unwrap();
    sqlx::raw_sql(ORDERS_TABLE)
        .execute(store.pool())
        .await
        .unwrap();
    let version: String = sqlx::query_scalar("SELECT sqlite_version()")
        .fetch_one(store.pool())
        .await
        .unwrap();
    let transactional_tasks = store.pool().options().get_max_connections() as usize - 1;
    let side = Side {
        label: "SQLite",
        outbox: Outbox::new(&store),
        store,
        transactional_tasks,
        begin: "BEGIN IMMEDIATE",
        insert: lite_insert,
        producer: direct_producer(&brokers()),
        topic: topic.to_owned(),
    };
    each(side, lines, profiles).await;
    format!("SQLite {version} on a file in WAL mode")
}

/// The one-minute load average at or below which the run starts, and how
/// long it waits for it (as the `idem` bench does): a run started on the
/// tail of other work (a build) measures that work.
const QUIET_LOAD: f64 = 1.5;
const QUIET_WAIT: Duration = Duration::from_secs(300);

/// Waits, up to [`QUIET_WAIT`], for the load average to fall to
/// [`QUIET_LOAD`] or below; answers whether it did (or cannot be read).
async fn wait_for_quiet() -> bool {
    let until = Instant::now() + QUIET_WAIT;
    loop {
        let load = loadavg()
            .split_whitespace()
            .next()
            .and_then(|l| l.parse::<f64>().ok());
        match load {
            Some(load) if load > QUIET_LOAD => {
                if Instant::now() >= until {
                    eprintln!("the load average is still {load:.2}: measuring anyway");
                    return false;
                }
                eprintln!("load average {load:.2}, above {QUIET_LOAD}: waiting for it to fall");
                tokio::time::sleep(Duration::from_secs(10)).await;
            }
            _ => return true,
        }
    }
}

fn loadavg() -> String {
    std::fs::read_to_string("/proc/loadavg")
        .unwrap_or_default()
        .split_whitespace()
        .take(3)
        .collect::<Vec<_>>()
        .join(" ")
}

fn report(
    lines: &[Line],
    servers: &[String],
    (load_before, quiet): (&str, bool),
    took: Duration,
) -> String {
    let mut md = String::new();
    let date = std::process::Command::new("date")
        .args(["-u", "+%Y-%m-%d %H:%M UTC"])
        .output()
        .map(|o| String::from_utf8_lossy(&o.stdout).trim().to_owned())
        .unwrap_or_default();
    let cpus = std::thread::available_parallelism().map_or(0, |n| n.get());
    let cpu = std::fs::read_to_string("/proc/cpuinfo")
        .unwrap_or_default()
        .lines()
        .find(|l| l.starts_with("model name"))
        .and_then(|l| l.split(':').nth(1))
        .unwrap_or("unknown")
        .trim()
        .to_owned();
    let _ = writeln!(
        md,
        "Made by `cargo bench --bench outbox --features kafka,sqlite,postgres` on {date}, in {:.0} s.\n",
        took.as_secs_f64()
    );
    let _ = writeln!(md, "- machine: {cpus} CPUs ({cpu})");
    let _ = writeln!(
        md,
        "- servers: {}; the Kafka-protocol broker at {} (librdkafka {})",
        servers.join("; "),
        brokers(),
        rdkafka::util::get_rdkafka_version().1
    );
    let _ = writeln!(
        md,
        "- load average (1, 5, 15 min) before: {load_before}; after: {}{}",
        loadavg(),
        if quiet {
            ""
        } else {
            " (the run waited five minutes for a load of 1.5 or below, in vain: its figures are noisier than usual)"
        }
    );
    let _ = writeln!(
        md,
        "- direct: a producer with `enable.idempotence=true` and `linger.ms={}`; the relay: `KafkaRelay::new` with `bootstrap.servers` alone (librdkafka's defaults: `linger.ms=5`; batches of 500, 50 ms idle)"
    , direct_linger());
    let _ = writeln!(
        md,
        "- {} operations per measurement, {} rounds; a ratio is the median of the per-round ratios (least–greatest), the ways alternating (A B C D, D C B A) in one run\n",
        ops(),
        rounds()
    );
    let _ = writeln!(
        md,
        "- \"-\": not measured. On SQLite the outbox's transactional mode runs with fewer tasks than the store's pool has connections: the store reads the record beside the caller's transaction, on another connection, and with a task on every connection (each waiting for SQLite's write lock, which the task that waits for a connection holds) the waits end in the busy timeout (`database is locked`)\n"
    );
    let _ = writeln!(
        md,
        "| store | tasks | outbox / direct | enqueued / direct | direct + idem / direct | outbox / direct + idem | outbox, transactional mode / direct | goal | met |"
    );
    let _ = writeln!(md, "|---|---|---|---|---|---|---|---|---|");
    for l in lines {
        let (goal, met) = if l.tasks == GOAL_TASKS {
            let met = if l.outbox_to_direct.median >= GOAL {
                "yes"
            } else {
                "**no**"
            };
            (format!(">= {GOAL}"), met)
        } else {
            ("-".to_owned(), "-")
        };
        // A ratio that rounds to the goal shows its third digit, so that
        // "0.50, >= 0.5, no" never reads as a contradiction.
        let r = l.outbox_to_direct;
        let outbox = if l.tasks == GOAL_TASKS && format!("{:.2}", r.median) == format!("{GOAL:.2}")
        {
            format!("{:.3} ({:.2}–{:.2})", r.median, r.min, r.max)
        } else {
            r.to_string()
        };
        let _ = writeln!(
            md,
            "| {} | {} | {outbox} | {} | {} | {} | {} | {goal} | {met} |",
            l.store,
            l.tasks,
            l.enqueued_to_direct,
            l.idem_to_direct,
            l.outbox_to_idem,
            l.tx_to_direct,
        );
    }
    let _ = writeln!(
        md,
        "\nOperations per second (medians over the rounds); for the outbox, acknowledged by the broker, and in brackets enqueued:\n"
    );
    let _ = writeln!(
        md,
        "| store | tasks | direct | direct + idem | outbox | outbox, transactional mode |"
    );
    let _ = writeln!(md, "|---|---|---|---|---|---|");
    for l in lines {
        let _ = writeln!(
            md,
            "| {} | {} | {:.0} | {:.0} | {:.0} ({:.0}) | {} ({}) |",
            l.store,
            l.tasks,
            l.rates[0],
            l.rates[1],
            l.rates[2],
            l.enqueued[0],
            per_second(l.rates[3]),
            per_second(l.enqueued[1]),
        );
    }

    md
}

async fn main_async() {
    let quiet = wait_for_quiet().await;
    let t = Instant::now();
    let load_before = loadavg();
    let topic = Topic::create("bench-outbox", &brokers()).await;
    let mut lines = Vec::new();
    let mut servers = Vec::new();
    let mut profiles = Vec::new();
    if wanted("postgres") {
        servers.push(postgres(&topic.name, &mut lines, &mut profiles).await);
    }
    if wanted("sqlite") {
        servers.push(sqlite(&topic.name, &mut lines, &mut profiles).await);
    }
    println!(
        "{}",
        report(&lines, &servers, (&load_before, quiet), t.elapsed())
    );
    if !profiles.is_empty() {
        println!("Where an outbox operation's time goes (no relay running):\n");
        println!("{}", profiles.concat());
    }
}

fn main() {
    tokio::runtime::Builder::new_multi_thread()
        .worker_threads(2)
        .enable_all()
        .build()
        .unwrap()
        .block_on(main_async());
}
