//! The benchmark harness:
//! `cargo bench --bench idem --features sqlite,postgres,mysql,redis`.
//!
//! Every figure is a ratio of two measurements taken side by side in the
//! same run: baseline and subject alternate in rounds (A B, then B A), and
//! the median of the per-round ratios is reported, since the machine is
//! shared and noisy. The table is printed and written to `BENCHMARKS.md`
//! (anything below the `<!-- notes -->` line of that file is kept), with
//! the chart `benchmarks.svg` beside it.
//!
//! The reference of a server is a client that sends the statements the
//! store sends (from `SqlStore::__reference_statements`, so never a copy)
//! without idem's engine: pgbench on PostgreSQL (when `pgbench` is on the
//! PATH), a bare sqlx loop on MariaDB. It runs in the same rounds as the
//! plain call and idem, and is reported as a ratio to the same plain call.
//!
//! Redis and Redis Cluster have no transactional mode and no SQL: B1
//! (record mode), B2, B4 and the store's cost per call run on them
//! ([`Calls`]), with a plain call that is the body's own write, one
//! `INCRBY` (see [`RedisPayments`]). Their reference is a loop of the
//! scripts the store sends, through the store's own connection (from
//! `RedisStore::__reference_first_execution` and `__reference_replay`),
//! around the same `INCRBY`.
//!
//! Servers: `IDEM_POSTGRES_URL`, `IDEM_MYSQL_URL`, `IDEM_REDIS_URL` and
//! `IDEM_REDIS_CLUSTER_URL` (local defaults as in the tests); SQLite is a
//! file in a temporary directory. `IDEM_BENCH_QUICK=1` shortens every
//! measurement (for trying the harness, not for figures).
//! `IDEM_BENCH_ONLY=postgres` (or `sqlite`, `mariadb`, `redis`,
//! `redis_cluster`, comma-separated) runs some backends only, and
//! `IDEM_BENCH_CASES=B4,B4'` (comma-separated) some measurements only; a
//! run narrowed by either prints its table and leaves `BENCHMARKS.md` and
//! the chart as they are. A whole run first waits, up to five minutes,
//! for the one-minute load average to fall to 1.5 or below (see
//! [`wait_for_quiet`]). B4' runs this
//! binary again as child processes, with `IDEM_BENCH_CHILD` naming the
//! backend (see [`child`]).

use std::fmt::Write as _;
use std::future::Future;
use std::path::{Path, PathBuf};
use std::sync::atomic::{AtomicBool, AtomicUsize, Ordering};
use std::sync::{Arc, OnceLock};
use std::time::{Duration, Instant, SystemTime, UNIX_EPOCH};

use futures::future::{FutureExt, LocalBoxFuture};
use idem::{idempotent, CachedStore, Fingerprint, Store};
use tokio::io::{AsyncBufReadExt, AsyncWriteExt, BufReader};
use tokio::sync::Barrier;

/// The tests' Redis and Redis Cluster: their URLs (`IDEM_REDIS_URL`,
/// `IDEM_REDIS_CLUSTER_URL`, the local ones by default, the local cluster
/// started if down), stores and connections, and the deletion of the keys
/// under a prefix.
#[path = "../tests/suite/common/redis.rs"]
#[allow(dead_code)]
mod redis_env;

use redis_env::{Conn, DeleteKeys, Redis};

const CONCURRENCY: usize = 4;

#[derive(Debug, thiserror::Error)]
pub enum PayError {
    #[error("database: {0}")]
    Db(#[from] sqlx::Error),
    #[error("redis: {0}")]
    Redis(#[from] redis::RedisError),
    #[error(transparent)]
    Idem(#[from] idem::Error),
}

fn quick() -> bool {
    std::env::var("IDEM_BENCH_QUICK").is_ok_and(|v| v == "1")
}

/// Rounds of each interleaved comparison.
fn rounds() -> usize {
    if quick() {
        2
    } else {
        6
    }
}

/// How long one throughput measurement of B1 (and a reference loop) runs.
/// pgbench counts in whole seconds: it runs for this rounded up.
fn window() -> Duration {
    Duration::from_millis(if quick() { 100 } else { 250 })
}

fn unique(tag: &str) -> String {
    static N: AtomicUsize = AtomicUsize::new(0);
    format!(
        "{tag}-{}-{}-{}",
        std::process::id(),
        unix_micros() / 1000,
        N.fetch_add(1, Ordering::Relaxed)
    )
}

/// The wall clock, shared by the processes of B4'.
fn unix_micros() -> u64 {
    SystemTime::now()
        .duration_since(UNIX_EPOCH)
        .unwrap()
        .as_micros() as u64
}

/// A body that takes `time` (nothing when it is zero), as a call to
/// another service does: it ends when its time is up. A tokio sleep would
/// not: the runtime's timer rounds every deadline up to its next
/// millisecond tick, so a call that does 0.3 ms of work before a 20 ms
/// sleep takes 21 ms, and one that does 0.7 ms takes 21 or 22, by where
/// the tick falls; a few tenths of a millisecond of idem's work then show
/// as a whole millisecond or none. A thread's sleep ends within the
/// kernel's timer slack (some 50 µs); pgbench's `\sleep`, the
/// reference's, is as close.
async fn take(time: Duration) {
    if !time.is_zero() {
        tokio::task::spawn_blocking(move || std::thread::sleep(time))
            .await
            .unwrap();
    }
}

fn median(mut v: Vec<f64>) -> f64 {
    v.sort_by(|a, b| a.partial_cmp(b).unwrap());
    let n = v.len();
    if n % 2 == 1 {
        v[n / 2]
    } else {
        (v[n / 2 - 1] + v[n / 2]) / 2.0
    }
}

fn percentile(v: &mut [f64], p: f64) -> f64 {
    v.sort_by(|a, b| a.partial_cmp(b).unwrap());
    let i = ((v.len() as f64 - 1.0) * p).round() as usize;
    v[i]
}

/// How long a throughput measurement runs.
#[derive(Clone, Copy)]
enum Span {
    /// This many calls in all.
    Calls(usize),
    /// New calls start until this much time has passed.
    For(Duration),
}

/// Calls per second of `op` run by `tasks` tasks for `span`.
async fn throughput_of<F, Fut>(tasks: usize, span: Span, op: F) -> f64
where
    F: Fn() -> Fut + Clone + Send + 'static,
    Fut: Future<Output = ()> + Send,
{
    let start = Instant::now();
    let handles: Vec<_> = (0..tasks)
        .map(|_| {
            let op = op.clone();
            tokio::spawn(async move {
                let mut calls = 0;
                while match span {
                    Span::Calls(all) => calls < all / tasks,
                    Span::For(window) => start.elapsed() < window,
                } {
                    op().await;
                    calls += 1;
                }
                calls
            })
        })
        .collect();
    let mut calls = 0;
    for h in handles {
        calls += h.await.unwrap();
    }
    calls as f64 / start.elapsed().as_secs_f64()
}

/// Operations per second of `ops` calls of `op` spread over
/// `CONCURRENCY` tasks.
async fn throughput<F, Fut>(ops: usize, op: F) -> f64
where
    F: Fn() -> Fut + Clone + Send + 'static,
    Fut: Future<Output = ()> + Send,
{
    throughput_of(CONCURRENCY, Span::Calls(ops), op).await
}

/// One measurement of an interleaved comparison.
type Measure<'a> = Box<dyn Fn() -> LocalBoxFuture<'a, f64> + 'a>;

fn measure<'a, F, Fut>(f: F) -> Measure<'a>
where
    F: Fn() -> Fut + 'a,
    Fut: Future<Output = f64> + 'a,
{
    Box::new(move || f().boxed_local())
}

/// Runs the measures in rounds, in an order that alternates (A B C, then
/// C B A); answers, for each, the median of its per-round ratios to the
/// first measure (the baseline) and its own median.
async fn interleave_all(measures: &[Measure<'_>]) -> Vec<(f64, f64)> {
    let mut values = vec![Vec::new(); measures.len()];
    for round in 0..rounds() {
        let mut order: Vec<usize> = (0..measures.len()).collect();
        if round % 2 == 1 {
            order.reverse();
        }
        for i in order {
            values[i].push(measures[i]().await);
        }
    }
    let base = values[0].clone();
    values
        .into_iter()
        .map(|v| {
            let ratios = v.iter().zip(&base).map(|(s, b)| s / b).collect();
            (median(ratios), median(v))
        })
        .collect()
}

/// Median over rounds of subject / baseline, alternating which runs first.
/// Also answers the medians of both.
async fn interleave<A, B, FA, FB>(baseline: A, subject: B) -> (f64, f64, f64)
where
    A: Fn() -> FA,
    B: Fn() -> FB,
    FA: Future<Output = f64>,
    FB: Future<Output = f64>,
{
    let both = interleave_all(&[measure(baseline), measure(subject)]).await;
    (both[1].0, both[0].1, both[1].1)
}

/// A target of issue 14, checked against the measured value.
#[derive(Clone, Copy, Debug)]
enum Goal {
    /// A figure reported, nothing to meet.
    None,
    AtLeast(f64),
    AtMost(f64),
    Above(f64),
    Exactly(f64),
    /// At least `min`, if any, and at most `within` below the reference's
    /// ratio (above it is fine).
    NearReference {
        min: Option<f64>,
        within: f64,
    },
}

impl Goal {
    /// The goal as the table says it, `unit` after the figure.
    fn text(self, unit: &str) -> String {
        // 0.5 and 15, not 0.50 and 15.00; 0.23 for 0.25 - 0.02.
        let n = |v: f64| {
            let s = format!("{v:.2}");
            s.trim_end_matches('0').trim_end_matches('.').to_owned()
        };
        match self {
            Goal::None => "-".to_owned(),
            Goal::AtLeast(v) => format!(">= {}{unit}", n(v)),
            Goal::AtMost(v) => format!("<= {}{unit}", n(v)),
            Goal::Above(v) => format!("> {}{unit}", n(v)),
            Goal::Exactly(v) => format!("{}{unit}", n(v)),
            Goal::NearReference { min, within } => {
                let near = format!(">= reference - {}", n(within));
                min.map_or(near.clone(), |min| format!(">= {} and {near}", n(min)))
            }
        }
    }

    /// Whether `value` meets the goal; `None` when there is nothing to
    /// meet or the reference it needs was not measured.
    fn met(self, value: f64, reference: Option<f64>) -> Option<bool> {
        match self {
            Goal::None => None,
            Goal::AtLeast(v) => Some(value >= v),
            Goal::AtMost(v) => Some(value <= v),
            Goal::Above(v) => Some(value > v),
            Goal::Exactly(v) => Some(value == v),
            Goal::NearReference { min, within } => {
                if min.is_some_and(|min| value < min) {
                    return Some(false);
                }
                reference.map(|r| value >= r - within)
            }
        }
    }
}

/// Issue 14's goals that differ between the backends.
struct Goals {
    /// B1, record mode, bare INSERT.
    record: Goal,
    /// B1, transactional mode, bare INSERT.
    tx: Goal,
    /// B2.
    replay: Goal,
    /// B4', waiter p99 in ms.
    processes: Goal,
}

/// One row of the result table.
struct Row {
    id: &'static str,
    backend: &'static str,
    what: String,
    measured: String,
    goal: String,
    met: Option<bool>,
}

impl Row {
    /// A row whose goal is met by `value` (in `unit`), against the
    /// reference's figure where the goal names one.
    fn judged(
        (id, backend): (&'static str, &'static str),
        what: String,
        measured: String,
        (goal, unit): (Goal, &str),
        (value, reference): (f64, Option<f64>),
    ) -> Row {
        let met = goal.met(value, reference);
        // A miss that rounds to its goal (0.966 against 0.97) shows its
        // third digit, so that "0.97, >= 0.97, no" never reads as a
        // contradiction.
        let measured = match goal {
            Goal::AtLeast(g) | Goal::AtMost(g) | Goal::Above(g)
                if met == Some(false) && format!("{value:.2}") == format!("{g:.2}") =>
            {
                measured.replacen(&format!("{value:.2}"), &format!("{value:.3}"), 1)
            }
            _ => measured,
        };
        Row {
            id,
            backend,
            what,
            measured,
            goal: goal.text(unit),
            met,
        }
    }
}

/// What the bench found, for the table and the chart.
#[derive(Default)]
struct Report {
    rows: Vec<Row>,
    /// B1, bare INSERT: (backend and mode, idem's ratio, the reference's).
    b1: Vec<(String, f64, Option<f64>)>,
    /// B7: tasks, and the calls per second of plain, the reference, idem.
    b7: Vec<(usize, f64, Option<f64>, f64)>,
}

/// What differs between the backends: their SQL, and how to connect.
struct Dialect {
    label: &'static str,
    /// The variable naming the server, and the local default; `None` for
    /// SQLite, a file.
    server: Option<(&'static str, &'static str)>,
    /// The n-th bind parameter.
    param: fn(usize) -> String,
    /// Creates the business table `{pay}` and the check-then-act table
    /// `{cta}`.
    tables: &'static str,
    /// Takes and releases check-then-act's lock on a key, bound to the
    /// statement if it has a parameter.
    lock: &'static str,
    unlock: &'static str,
    /// Bulk-loads `{n}` completed records `k1..=k{n}` into `{records}` with
    /// one INSERT ... SELECT, binding the scope, the fingerprint and the
    /// expiry.
    fill: &'static str,
    /// Refreshes the planner's statistics of `{records}`, where needed.
    analyze: Option<&'static str>,
    /// Creates B8's entity table, `bench_entity_charges`, if missing.
    entity_table: &'static str,
    /// The client that measures the reference.
    reference: Client,
    goals: Goals,
    /// Whether B7 (throughput vs concurrency) runs here.
    curve: bool,
}

/// Who sends the reference's statements.
#[derive(Clone, Copy, PartialEq, Eq)]
enum Client {
    /// pgbench, `-M prepared`.
    Pgbench,
    /// A sqlx loop on the pool, one call after another in each task.
    Loop,
}

/// Whether the reference is measured here: `Some(Err(why))` where it
/// cannot be (the Redis backends, which have none, never ask).
fn reference_status(dialect: &Dialect) -> Option<Result<(), &'static str>> {
    static PGBENCH: OnceLock<bool> = OnceLock::new();
    match dialect.reference {
        Client::Pgbench
            if !*PGBENCH.get_or_init(|| {
                std::process::Command::new("pgbench")
                    .arg("--version")
                    .output()
                    .is_ok()
            }) =>
        {
            Some(Err("pgbench not found"))
        }
        Client::Pgbench | Client::Loop => Some(Ok(())),
    }
}

/// The reference's ratio as printed beside idem's.
fn reference_note(reference: Option<Result<f64, &str>>) -> String {
    match reference {
        None => String::new(),
        Some(Ok(r)) => format!(" (reference {r:.2})"),
        Some(Err(why)) => format!(" (reference not measured: {why})"),
    }
}

/// The calls a reference client makes.
#[derive(Clone, Copy, Debug)]
enum Script {
    /// A first execution in record mode: each statement on its own, the
    /// body taking the time given after its INSERT, as the plain call's.
    Record(Duration),
    /// A first execution in transactional mode: the same statements
    /// between BEGIN and COMMIT, after the read of the record that the
    /// store sends before its claim there, where it sends one.
    Tx(Duration),
    /// [`Script::Tx`] without that read.
    TxWithoutRead(Duration),
    /// A replay: the one read by key.
    Replay,
}

/// One statement of the reference, its parameters named as the store's
/// `Param` (and the bench's `Amount`).
#[derive(Clone, Debug)]
struct Sql {
    sql: String,
    params: Vec<String>,
}

impl Sql {
    /// Whether this is the bench's business INSERT (the body's write),
    /// after which a body that takes time waits.
    fn is_business(&self) -> bool {
        self.params.iter().any(|p| p == "Amount")
    }
}

/// The reference's statements: the store's own, from
/// `__reference_statements`, and the bench's business INSERT.
#[derive(Debug)]
struct RefSql {
    /// A first execution: the claim, the read where the claim returns no
    /// row (the store reads the record back then), the business INSERT,
    /// the completion.
    first: Vec<Sql>,
    /// A replay: the record by key.
    replay: Sql,
    /// Where the store reads the record (`replay`) before its claim in
    /// transactional mode: `None` nowhere, `Some(true)` beside the
    /// transaction, on another connection, `Some(false)` in it.
    tx_read: Option<bool>,
}

/// The key of the record the reference's replays read: numeric, as
/// pgbench sets its keys, and below every key it makes.
const REPLAY_KEY: &str = "0";

impl RefSql {
    /// The store's statement named `name`.
    fn named(statements: &[(&'static str, String, Vec<String>)], name: &str) -> Sql {
        statements
            .iter()
            .find(|(n, _, _)| *n == name)
            .map(|(_, sql, params)| Sql {
                sql: sql.clone(),
                params: params.clone(),
            })
            .unwrap_or_else(|| panic!("the store has no {name:?} statement"))
    }

    /// pgbench's script for `script` (BEGIN/COMMIT around a first
    /// execution in transactional mode) and its `-D` variables. Each `$n`
    /// becomes its parameter's variable, cast to the type sqlx binds
    /// (pgbench prepares without types). A first execution's key is
    /// numeric: the run `run`, the client and a random number.
    fn pgbench(&self, script: Script, run: usize) -> (String, Vec<String>) {
        let mut text = match script {
            Script::Replay => format!("\\set key {REPLAY_KEY}\n"),
            Script::Record(_) | Script::Tx(_) | Script::TxWithoutRead(_) => format!(
                "\\set key {run} * 1000000000000000 + :client_id * 10000000000000 + random(1, 1000000000000)\n"
            ),
        };
        let (statements, body) = match script {
            Script::Replay => (std::slice::from_ref(&self.replay), Duration::ZERO),
            Script::Record(body) | Script::Tx(body) | Script::TxWithoutRead(body) => {
                (&self.first[..], body)
            }
        };
        let tx = matches!(script, Script::Tx(_) | Script::TxWithoutRead(_));
        if tx {
            text.push_str("BEGIN;\n");
        }
        // pgbench has one connection a client: a read beside the
        // transaction would be inside it here. (PostgreSQL's store, the
        // only one measured by pgbench, sends none.)
        let read = match (script, self.tx_read) {
            (Script::Tx(_), Some(beside)) => {
                assert!(!beside, "pgbench cannot read beside its transaction");
                Some(&self.replay)
            }
            _ => None,
        };
        let mut defines = Vec::new();
        for statement in read.into_iter().chain(statements) {
            let mut sql = statement.sql.clone();
            for (i, param) in statement.params.iter().enumerate().rev() {
                let (value, ty) = param_value(param, REPLAY_KEY).pgbench();
                let var = param.to_lowercase();
                sql = sql.replace(&format!("${}", i + 1), &format!("CAST(:{var} AS {ty})"));
                if param != "Key" {
                    defines.push(format!("{var}={value}"));
                }
            }
            let _ = writeln!(text, "{sql};");
            if statement.is_business() && !body.is_zero() {
                let _ = writeln!(text, "\\sleep {} us", body.as_micros());
            }
        }
        if tx {
            text.push_str("COMMIT;\n");
        }
        defines.sort();
        defines.dedup();
        (text, defines)
    }
}

/// A value the reference binds.
enum Val {
    Text(String),
    Bytes(Vec<u8>),
    Int(i64),
    Small(i16),
}

impl Val {
    /// The value as pgbench's `-D` takes it, and its PostgreSQL type.
    fn pgbench(&self) -> (String, &'static str) {
        match self {
            Val::Text(t) => (t.clone(), "text"),
            Val::Bytes(b) => {
                let hex: String = b.iter().map(|b| format!("{b:02x}")).collect();
                (format!("\\x{hex}"), "bytea")
            }
            Val::Int(i) => (i.to_string(), "bigint"),
            Val::Small(i) => (i.to_string(), "smallint"),
        }
    }
}

/// What the reference binds to a parameter, for `key`: the values of a
/// call of the bench's record mode (one token for all calls: nothing reads
/// it but the completion).
fn param_value(param: &str, key: &str) -> Val {
    match param {
        "Scope" => Val::Text("bench.pay".to_owned()),
        "Key" => Val::Text(key.to_owned()),
        "Fingerprint" => Val::Bytes(Fingerprint::of(&500i64).unwrap().as_bytes().to_vec()),
        "Token" => Val::Bytes(vec![0x5a; 16]),
        "Lease" => Val::Int(60_000),
        "Ttl" => Val::Int(24 * 3600 * 1000),
        "OutcomeKind" => Val::Small(0),
        "Outcome" => Val::Bytes(b"500".to_vec()),
        "Amount" => Val::Int(500),
        other => panic!("the reference has no value for the parameter {other}"),
    }
}

/// pgbench's transactions per second for `script` with `clients` clients
/// for `window` (rounded up to whole seconds), against `url`.
async fn pgbench(url: &str, sql: &RefSql, script: Script, clients: usize, window: Duration) -> f64 {
    static RUN: AtomicUsize = AtomicUsize::new(1);
    let run = RUN.fetch_add(1, Ordering::Relaxed);
    let (text, defines) = sql.pgbench(script, run);
    let path = std::env::temp_dir().join(format!("idem-bench-{}-{run}.sql", std::process::id()));
    std::fs::write(&path, &text).unwrap();
    let mut command = tokio::process::Command::new("pgbench");
    command.args(["-n", "-M", "prepared"]);
    command.args([
        "-c",
        &clients.to_string(),
        "-j",
        &clients.min(2).to_string(),
    ]);
    command.args(["-T", &window.as_secs_f64().ceil().max(1.0).to_string()]);
    command.arg("-f").arg(&path);
    for d in &defines {
        command.args(["-D", d]);
    }
    let out = command.arg(url).output().await.unwrap();
    let _ = std::fs::remove_file(&path);
    let stdout = String::from_utf8_lossy(&out.stdout);
    stdout
        .lines()
        .find_map(|l| l.strip_prefix("tps = "))
        .and_then(|l| l.split_whitespace().next())
        .and_then(|tps| tps.parse().ok())
        .filter(|_| out.status.success())
        .unwrap_or_else(|| {
            panic!(
                "pgbench failed ({}):\n{stdout}\n{}\nscript:\n{text}",
                out.status,
                String::from_utf8_lossy(&out.stderr)
            )
        })
}

/// B8's business row: entity mode keeps the token in the row itself.
#[derive(idem::Entity, sqlx::FromRow)]
#[idem(table = "bench_entity_charges")]
struct EntityCharge {
    #[idem(token)]
    token: String,
    amount: i64,
}

/// One backend: "create payment" (one business INSERT, with or without the
/// attribute, in record mode and in transactional mode), check-then-act,
/// and the bulk load, on `$store` through a pool of `$db`.
macro_rules! backend {
    ($name:ident, $db:ty, $store:ty, $dialect:expr, $connect:path) => {
        mod $name {
            use super::*;

            pub const DIALECT: Dialect = $dialect;

            pub struct Payments {
                pub store: $store,
                /// The same records behind a local replay cache.
                pub cached: idem::CachedStore<$store>,
                pub pool: sqlx::Pool<$db>,
                pub table: String,
                pub cta: String,
                /// The business INSERT.
                insert: String,
                /// Where SQLite's file is.
                dir: PathBuf,
                /// The reference's statements, made on first use.
                reference: Arc<tokio::sync::OnceCell<RefSql>>,
            }

            impl Payments {
                pub async fn new(dir: &Path, tag: &str) -> Self {
                    Self::setup($connect(&DIALECT, dir, 16).await, dir, tag).await
                }

                /// The store and the tables, all of their own.
                pub async fn setup(pool: sqlx::Pool<$db>, dir: &Path, tag: &str) -> Self {
                    let (table, cta) = (table_name(tag, "pay"), table_name(tag, "cta"));
                    let this = Self::open(pool, dir, &table_name(tag, "rec"), table, cta);
                    this.store.migrate().await.unwrap();
                    sqlx::raw_sql(
                        &DIALECT
                            .tables
                            .replace("{pay}", &this.table)
                            .replace("{cta}", &this.cta),
                    )
                    .execute(&this.pool)
                    .await
                    .unwrap();
                    this
                }

                /// On existing tables.
                fn open(
                    pool: sqlx::Pool<$db>,
                    dir: &Path,
                    records: &str,
                    table: String,
                    cta: String,
                ) -> Self {
                    let store = <$store>::new(pool.clone())
                        .with_table_name(records)
                        .unwrap();
                    let insert = format!(
                        "INSERT INTO {table} (pay_key, amount) VALUES ({}, {})",
                        Self::p(1),
                        Self::p(2)
                    );
                    Payments {
                        cached: idem::CachedStore::new(store.clone(), 100_000).unwrap(),
                        store,
                        pool,
                        table,
                        cta,
                        insert,
                        dir: dir.to_owned(),
                        reference: Arc::default(),
                    }
                }

                /// B4''s child process: B4's calls on the records table
                /// `records` of the parent.
                pub async fn child(dir: &Path, records: &str) {
                    let pool = $connect(&DIALECT, dir, 16).await;
                    // B4 only calls `dup`, which writes no business row.
                    let this = Self::open(pool, dir, records, String::new(), String::new());
                    super::child(Arc::new(this)).await
                }

                /// The reference's statements. The first use makes one
                /// call, on `REPLAY_KEY`, to see whether the claim returns
                /// a row; that call's record is the one replays read.
                async fn reference_sql(&self) -> &RefSql {
                    self.reference
                        .get_or_init(|| async {
                            let named = self.store.__reference_statements();
                            let sql = |name| RefSql::named(&named, name);
                            let insert = Sql {
                                sql: self.insert.clone(),
                                params: vec!["Key".to_owned(), "Amount".to_owned()],
                            };
                            let mut first = vec![sql("claim")];
                            if !Self::send(&self.pool, &first[0], REPLAY_KEY).await {
                                first.push(sql("read"));
                            }
                            // The journal kept after a granted claim, where
                            // the claim does not keep it itself.
                            if named.iter().any(|(name, _, _)| *name == "keep") {
                                first.push(sql("keep"));
                            }
                            first.extend([insert, sql("complete")]);
                            for statement in &first[1..] {
                                Self::send(&self.pool, statement, REPLAY_KEY).await;
                            }
                            RefSql {
                                first,
                                replay: sql("select"),
                                tx_read: self.store.__transactional_read(),
                            }
                        })
                        .await
                }

                /// Runs `statement` for `key` on `executor`; answers whether
                /// it returned a row.
                async fn send<'e, E>(executor: E, statement: &'e Sql, key: &str) -> bool
                where
                    E: sqlx::Executor<'e, Database = $db>,
                {
                    let mut query = sqlx::query(&statement.sql);
                    for param in &statement.params {
                        query = match param_value(param, key) {
                            Val::Text(v) => query.bind(v),
                            Val::Bytes(v) => query.bind(v),
                            Val::Int(v) => query.bind(v),
                            Val::Small(v) => query.bind(v),
                        };
                    }
                    query.fetch_optional(executor).await.unwrap().is_some()
                }

                /// One call of the reference loop: the store's statements
                /// on the pool, without idem's engine.
                async fn reference_call(&self, script: Script) {
                    let sql = self.reference_sql().await;
                    let key = unique("ref");
                    match script {
                        Script::Replay => {
                            Self::send(&self.pool, &sql.replay, REPLAY_KEY).await;
                        }
                        Script::Record(body) => {
                            for statement in &sql.first {
                                Self::send(&self.pool, statement, &key).await;
                                if statement.is_business() {
                                    take(body).await;
                                }
                            }
                        }
                        Script::Tx(body) | Script::TxWithoutRead(body) => {
                            let mut tx = self.pool.begin().await.unwrap();
                            // The read before the claim, as the store sends
                            // it: beside the transaction, on a connection of
                            // the pool, or in it.
                            if let Script::Tx(_) = script {
                                match sql.tx_read {
                                    Some(true) => {
                                        Self::send(&self.pool, &sql.replay, &key).await;
                                    }
                                    Some(false) => {
                                        Self::send(&mut *tx, &sql.replay, &key).await;
                                    }
                                    None => {}
                                }
                            }
                            for statement in &sql.first {
                                Self::send(&mut *tx, statement, &key).await;
                                if statement.is_business() {
                                    take(body).await;
                                }
                            }
                            tx.commit().await.unwrap();
                        }
                    }
                }

                fn p(n: usize) -> String {
                    (DIALECT.param)(n)
                }

                /// The business INSERT on `executor`, then a body that
                /// takes `body`.
                async fn insert<'e, E>(
                    &'e self,
                    executor: E,
                    key: &str,
                    amount: i64,
                    body: Duration,
                ) -> Result<i64, PayError>
                where
                    E: sqlx::Executor<'e, Database = $db>,
                {
                    sqlx::query(&self.insert)
                        .bind(key)
                        .bind(amount)
                        .execute(executor)
                        .await?;
                    take(body).await;
                    Ok(amount)
                }

                pub async fn plain_tx(
                    &self,
                    tx: &mut sqlx::Transaction<'_, $db>,
                    key: &str,
                    amount: i64,
                    body: Duration,
                ) -> Result<i64, PayError> {
                    self.insert(&mut **tx, key, amount, body).await
                }

                #[idempotent(key = key, store = self.store, tx = tx, scope = "bench.pay_tx", fingerprint = amount)]
                pub async fn in_tx(
                    &self,
                    tx: &mut sqlx::Transaction<'_, $db>,
                    key: &str,
                    amount: i64,
                    body: Duration,
                ) -> Result<i64, PayError> {
                    self.insert(&mut **tx, key, amount, body).await
                }

                /// B8: entity mode, the row itself keeping the token.
                #[idempotent(key = key, store = self.pool, entity, fingerprint = amount)]
                pub async fn entity_charge(
                    &self,
                    key: &str,
                    amount: i64,
                    body: Duration,
                ) -> Result<EntityCharge, PayError> {
                    take(body).await;
                    Ok(EntityCharge {
                        token: key.to_owned(),
                        amount,
                    })
                }

                pub async fn call(self: &Arc<Self>, mode: Mode, body: Duration) {
                    self.call_key(mode, &unique("pay"), body).await
                }

                pub async fn call_key(self: &Arc<Self>, mode: Mode, key: &str, body: Duration) {
                    let key = key.to_owned();
                    let done = match mode {
                        Mode::Plain | Mode::Record | Mode::Cached => {
                            let write = self.insert(&self.pool, &key, 500, body);
                            outside_tx((&self.store, &self.cached), mode, &key, 500, write).await
                        }
                        Mode::PlainTx | Mode::Tx => {
                            let mut tx = self.pool.begin().await.unwrap();
                            let r = if mode == Mode::Tx {
                                self.in_tx(&mut tx, &key, 500, body).await
                            } else {
                                self.plain_tx(&mut tx, &key, 500, body).await
                            };
                            tx.commit().await.unwrap();
                            r
                        }
                    };
                    done.unwrap();
                }

                /// The usual recipe: read the key, take a lock, write the
                /// record and the business row, complete, unlock.
                pub async fn cta_call(&self, key: &str) {
                    let mut conn = self.pool.acquire().await.unwrap();
                    let found: Option<Option<Vec<u8>>> = sqlx::query_scalar(&format!(
                        "SELECT outcome FROM {} WHERE k = {}",
                        self.cta,
                        Self::p(1)
                    ))
                    .bind(key)
                    .fetch_optional(&mut *conn)
                    .await
                    .unwrap();
                    if found.is_some() {
                        return;
                    }
                    let on_key = |statement: &'static str| {
                        let query = sqlx::query(statement);
                        if statement.contains(&Self::p(1)) {
                            query.bind(key)
                        } else {
                            query
                        }
                    };
                    on_key(DIALECT.lock).execute(&mut *conn).await.unwrap();
                    sqlx::query(&format!(
                        "INSERT INTO {} (k, state) VALUES ({}, 'in_progress')",
                        self.cta,
                        Self::p(1)
                    ))
                    .bind(key)
                    .execute(&mut *conn)
                    .await
                    .unwrap();
                    sqlx::query(&self.insert)
                        .bind(key)
                        .bind(500i64)
                        .execute(&mut *conn)
                        .await
                        .unwrap();
                    sqlx::query(&format!(
                        "UPDATE {} SET state = 'completed', outcome = {} WHERE k = {}",
                        self.cta,
                        Self::p(1),
                        Self::p(2)
                    ))
                    .bind(&b"500"[..])
                    .bind(key)
                    .execute(&mut *conn)
                    .await
                    .unwrap();
                    on_key(DIALECT.unlock).execute(&mut *conn).await.unwrap();
                }
            }

            impl Calls for Payments {
                fn label(&self) -> &'static str {
                    DIALECT.label
                }
                fn goals(&self) -> &'static Goals {
                    &DIALECT.goals
                }
                fn write(&self) -> &'static str {
                    "INSERT"
                }
                fn transactional(&self) -> bool {
                    true
                }
                fn reference_status(&self) -> Option<Result<(), &'static str>> {
                    reference_status(&DIALECT)
                }
                fn reference(
                    self: &Arc<Self>,
                    script: Script,
                    tasks: usize,
                    window: Duration,
                ) -> impl Future<Output = f64> + Send {
                    let this = self.clone();
                    async move {
                        let sql = this.reference_sql().await;
                        match DIALECT.reference {
                            Client::Pgbench => {
                                pgbench(&server_url(&DIALECT), sql, script, tasks, window).await
                            }
                            Client::Loop => {
                                this.loop_reference(script, tasks, Span::For(window)).await
                            }
                        }
                    }
                }
                fn second_reference(&self, script: Script) -> Option<(&'static str, Script)> {
                    match (DIALECT.reference, script) {
                        (Client::Pgbench, _) => Some(("by a sqlx loop", script)),
                        (Client::Loop, Script::Tx(body))
                            if self.store.__transactional_read() == Some(true) =>
                        {
                            Some(("without the read beside", Script::TxWithoutRead(body)))
                        }
                        _ => None,
                    }
                }
                fn loop_reference(
                    self: &Arc<Self>,
                    script: Script,
                    tasks: usize,
                    span: Span,
                ) -> impl Future<Output = f64> + Send {
                    let this = self.clone();
                    throughput_of(tasks, span, move || {
                        let this = this.clone();
                        async move { this.reference_call(script).await }
                    })
                }
                fn call(
                    self: &Arc<Self>,
                    mode: Mode,
                    body: Duration,
                ) -> impl Future<Output = ()> + Send {
                    Payments::call(self, mode, body)
                }
                fn store(&self) -> Arc<dyn Store> {
                    Arc::new(self.store.clone())
                }
                fn call_key(
                    self: &Arc<Self>,
                    mode: Mode,
                    key: &str,
                ) -> impl Future<Output = ()> + Send {
                    let (this, key) = (self.clone(), key.to_owned());
                    async move { this.call_key(mode, &key, Duration::ZERO).await }
                }
            }

            impl Bench for Payments {
                fn dialect(&self) -> &'static Dialect {
                    &DIALECT
                }
                fn records(&self) -> String {
                    self.store.table_name().to_owned()
                }
                fn dir(&self) -> &Path {
                    &self.dir
                }
                fn resized(&self, connections: u32) -> impl Future<Output = Self> + Send {
                    async move {
                        let pool = $connect(&DIALECT, &self.dir, connections).await;
                        let mut this = Self::open(
                            pool,
                            &self.dir,
                            self.store.table_name(),
                            self.table.clone(),
                            self.cta.clone(),
                        );
                        this.reference = self.reference.clone();
                        this
                    }
                }
                fn close(&self) -> impl Future<Output = ()> + Send {
                    self.pool.close()
                }
                fn entity_call(
                    self: &Arc<Self>,
                    key: &str,
                    body: Duration,
                ) -> impl Future<Output = ()> + Send {
                    let (this, key) = (self.clone(), key.to_owned());
                    async move {
                        let row = this.entity_charge(&key, 500, body).await.unwrap();
                        assert_eq!((row.token.as_str(), row.amount), (key.as_str(), 500));
                    }
                }
                fn entity_setup(&self) -> impl Future<Output = ()> + Send {
                    async move {
                        sqlx::raw_sql(DIALECT.entity_table)
                            .execute(&self.pool)
                            .await
                            .unwrap();
                    }
                }
                fn check_then_act(self: &Arc<Self>) -> impl Future<Output = ()> + Send {
                    let this = self.clone();
                    async move { this.cta_call(&unique("cta")).await }
                }
                fn held_reference(self: &Arc<Self>) -> impl Future<Output = ()> + Send {
                    let this = self.clone();
                    async move {
                        let sql = this.reference_sql().await;
                        let key = unique("refh");
                        let mut conn = this.pool.acquire().await.unwrap();
                        for statement in &sql.first {
                            Self::send(&mut *conn, statement, &key).await;
                        }
                    }
                }
                fn tx_reference(self: &Arc<Self>) -> impl Future<Output = ()> + Send {
                    let this = self.clone();
                    async move { this.reference_call(Script::Tx(Duration::ZERO)).await }
                }
                fn fresh(&self, tag: &str) -> impl Future<Output = Self> + Send {
                    let tag = tag.to_owned();
                    let pool = self.pool.clone();
                    async move { Payments::setup(pool, &self.dir, &tag).await }
                }
                fn fill(
                    &self,
                    scope: &str,
                    fp: &Fingerprint,
                    n: usize,
                    expires_at: i64,
                ) -> impl Future<Output = ()> + Send {
                    let (scope, fp) = (scope.to_owned(), *fp);
                    async move {
                        let records = self.store.table_name();
                        sqlx::query(
                            &DIALECT
                                .fill
                                .replace("{records}", records)
                                .replace("{n}", &n.to_string()),
                        )
                        .bind(scope)
                        .bind(&fp.as_bytes()[..])
                        .bind(expires_at)
                        .execute(&self.pool)
                        .await
                        .unwrap();
                        if let Some(analyze) = DIALECT.analyze {
                            sqlx::raw_sql(&analyze.replace("{records}", records))
                                .execute(&self.pool)
                                .await
                                .unwrap();
                        }
                    }
                }
                fn drop_tables(&self) -> impl Future<Output = ()> + Send {
                    async move {
                        for t in [
                            self.store.table_name().to_owned(),
                            // The store's step journal (B9's).
                            format!("{}_steps", self.store.table_name()),
                            self.table.clone(),
                            self.cta.clone(),
                            "bench_entity_charges".to_owned(),
                        ] {
                            sqlx::query(&format!("DROP TABLE IF EXISTS {t}"))
                                .execute(&self.pool)
                                .await
                                .ok();
                            sqlx::query(&format!(
                                "DELETE FROM idem_migrations WHERE table_name = '{t}'"
                            ))
                            .execute(&self.pool)
                            .await
                            .ok();
                        }
                    }
                }
            }
        }
    };
}

#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Mode {
    Plain,
    Record,
    /// Record mode through a `CachedStore`.
    Cached,
    PlainTx,
    Tx,
}

/// A record-mode call on `store` whose body is `write`: the backend's
/// business write (and the body's time).
#[idempotent(key = key, store = store, scope = "bench.pay", fingerprint = amount,
             lease = "60s", wait = "30s")]
async fn record<S, W>(store: &S, key: &str, amount: i64, write: W) -> Result<i64, PayError>
where
    S: Store,
    W: Future<Output = Result<i64, PayError>> + Send,
{
    write.await
}

/// A call of `mode` outside a transaction, on a store and the same records
/// behind a local replay cache: `write` alone (the plain call), or as the
/// body of a record-mode call.
async fn outside_tx<S, W>(
    (store, cached): (&S, &CachedStore<S>),
    mode: Mode,
    key: &str,
    amount: i64,
    write: W,
) -> Result<i64, PayError>
where
    S: Store,
    W: Future<Output = Result<i64, PayError>> + Send,
{
    match mode {
        Mode::Plain => write.await,
        Mode::Record => record(store, key, amount, write).await,
        Mode::Cached => record(cached, key, amount, write).await,
        Mode::PlainTx | Mode::Tx => unreachable!("{mode:?} takes a transaction"),
    }
}

/// B4's body: counts its run, and takes 50 ms.
#[idempotent(key = key, store = store, scope = "bench.dup", fingerprint = amount,
             lease = "60s", wait = "30s")]
async fn dup(
    store: &dyn Store,
    key: &str,
    amount: i64,
    ran: &AtomicBool,
    runs: &AtomicUsize,
) -> Result<i64, PayError> {
    ran.store(true, Ordering::SeqCst);
    runs.fetch_add(1, Ordering::SeqCst);
    tokio::time::sleep(Duration::from_millis(50)).await;
    Ok(amount)
}

/// One call of B4 on `store`; answers whether it ran the body.
async fn duplicate(store: &dyn Store, key: &str, runs: &AtomicUsize) -> bool {
    let ran = AtomicBool::new(false);
    dup(store, key, 1, &ran, runs).await.unwrap();
    ran.load(Ordering::SeqCst)
}

backend!(
    pg,
    sqlx::Postgres,
    idem::PostgresStore,
    Dialect {
        label: "PostgreSQL",
        server: Some((
            "IDEM_POSTGRES_URL",
            "postgres://postgres@127.0.0.1:5432/test"
        )),
        param: |n| format!("${n}"),
        tables: "CREATE TABLE {pay} (pay_key TEXT NOT NULL, amount BIGINT NOT NULL);
                 CREATE TABLE {cta} (k TEXT PRIMARY KEY, state TEXT NOT NULL, outcome BYTEA)",
        lock: "SELECT pg_advisory_lock(hashtext($1))",
        unlock: "SELECT pg_advisory_unlock(hashtext($1))",
        fill: "INSERT INTO \"{records}\" (scope, key, fingerprint, state, fence, outcome_kind, outcome, created_at, expires_at)
               SELECT $1, 'k' || g, $2, 'completed', 1, 0, '\\x353030'::bytea, 0, $3 FROM generate_series(1, {n}) g",
        analyze: Some("ANALYZE \"{records}\""),
        entity_table: "CREATE TABLE IF NOT EXISTS bench_entity_charges (token TEXT PRIMARY KEY, amount BIGINT NOT NULL)",
        reference: Client::Pgbench,
        goals: Goals {
            record: Goal::NearReference { min: Some(0.33), within: 0.03 },
            tx: Goal::NearReference { min: None, within: 0.03 },
            replay: Goal::AtMost(0.15),
            processes: Goal::AtMost(15.0),
        },
        curve: true,
    },
    server_pool
);
backend!(
    my,
    sqlx::MySql,
    idem::MySqlStore,
    Dialect {
        label: "MariaDB",
        server: Some(("IDEM_MYSQL_URL", "mysql://root@127.0.0.1:3306/test")),
        param: |_| "?".to_owned(),
        tables: "CREATE TABLE {pay} (pay_key VARCHAR(255) NOT NULL, amount BIGINT NOT NULL) ENGINE = InnoDB;
                 CREATE TABLE {cta} (k VARCHAR(255) PRIMARY KEY, state VARCHAR(20) NOT NULL, outcome BLOB) ENGINE = InnoDB",
        lock: "SELECT GET_LOCK(?, 10)",
        unlock: "SELECT RELEASE_LOCK(?)",
        // MariaDB's sequence engine stands in for generate_series.
        fill: "INSERT INTO `{records}` (scope, `key`, fingerprint, state, fence, outcome_kind, outcome, claim_token, created_at, expires_at)
               SELECT ?, CONCAT('k', seq), ?, 'completed', 1, 0, '500', UNHEX('00000000000000000000000000000000'), 0, ?
               FROM seq_1_to_{n}",
        analyze: Some("ANALYZE TABLE `{records}`"),
        entity_table: "CREATE TABLE IF NOT EXISTS bench_entity_charges (token VARCHAR(255) PRIMARY KEY, amount BIGINT NOT NULL) ENGINE = InnoDB",
        reference: Client::Loop,
        goals: Goals {
            record: Goal::AtLeast(0.28),
            tx: Goal::AtLeast(0.45),
            replay: Goal::AtMost(0.15),
            processes: Goal::None,
        },
        curve: false,
    },
    server_pool
);
backend!(
    lite,
    sqlx::Sqlite,
    idem::SqliteStore,
    Dialect {
        label: "SQLite",
        server: None,
        param: |n| format!("?{n}"),
        tables: "CREATE TABLE {pay} (pay_key TEXT NOT NULL, amount INTEGER NOT NULL);
                 CREATE TABLE {cta} (k TEXT PRIMARY KEY, state TEXT NOT NULL, outcome BLOB)",
        // SQLite has no named locks: the database's write lock stands in.
        lock: "BEGIN IMMEDIATE",
        unlock: "COMMIT",
        fill: "WITH RECURSIVE g(n) AS (SELECT 1 UNION ALL SELECT n + 1 FROM g WHERE n < {n})
               INSERT INTO \"{records}\" (scope, key, fingerprint, state, fence, outcome_kind, outcome, created_at, expires_at)
               SELECT ?1, 'k' || n, ?2, 'completed', 1, 0, x'353030', 0, ?3 FROM g",
        analyze: None,
        entity_table: "CREATE TABLE IF NOT EXISTS bench_entity_charges (token TEXT PRIMARY KEY, amount INTEGER NOT NULL)",
        reference: Client::Loop,
        goals: Goals {
            record: Goal::AtLeast(0.35),
            tx: Goal::AtLeast(0.75),
            replay: Goal::AtMost(0.10),
            processes: Goal::None,
        },
        curve: false,
    },
    connect_sqlite
);

/// The URL of the dialect's server.
fn server_url(dialect: &Dialect) -> String {
    let (var, default) = dialect.server.expect("a backend on a server");
    std::env::var(var).unwrap_or_else(|_| default.to_owned())
}

/// A pool of `connections` connections on the dialect's server.
async fn server_pool<DB: sqlx::Database>(
    dialect: &Dialect,
    _dir: &Path,
    connections: u32,
) -> sqlx::Pool<DB> {
    let url = server_url(dialect);
    sqlx::pool::PoolOptions::<DB>::new()
        .max_connections(connections)
        .test_before_acquire(false)
        .connect(&url)
        .await
        .unwrap_or_else(|e| panic!("{} at {url}: {e}", dialect.label))
}

/// The SQLite store's own pool (of its own size), on a file in `dir`.
async fn connect_sqlite(_dialect: &Dialect, dir: &Path, _connections: u32) -> sqlx::SqlitePool {
    let url = format!("sqlite://{}", dir.join("bench.db").display());
    let store = idem::SqliteStore::connect(&url).await.unwrap();
    store.pool().clone()
}

/// Redis's goals: issue 14 set none for it but those of every backend.
const REDIS_GOALS: Goals = Goals {
    record: Goal::None,
    tx: Goal::None,
    replay: Goal::None,
    processes: Goal::None,
};

/// A single Redis or a Redis Cluster: idem's records, and the body's
/// write, under a key prefix of this run's own, whose keys are deleted
/// when it is dropped. The body's write, and so the whole plain call, is
/// one `INCRBY` on a key of its own (`<prefix>:pay:<key>`), through a
/// multiplexed connection beside the store's: one round trip, as the SQL
/// backends' plain call is their business INSERT. Record mode only: the
/// body has no transaction to be in.
struct RedisPayments {
    redis: Redis,
    store: idem::RedisStore,
    /// The same records behind a local replay cache.
    cached: CachedStore<idem::RedisStore>,
    conn: Conn,
    /// What the reference's calls send beside their key, made once: the
    /// reference fingerprints nothing, as idem's engine does per call.
    reference: (idem::Scope, Fingerprint, idem::Outcome),
    _keys: DeleteKeys,
}

impl RedisPayments {
    async fn new(redis: Redis) -> Self {
        let prefix = redis_env::unique_prefix("bench");
        let store = redis.store(&prefix).await;
        RedisPayments {
            cached: CachedStore::new(store.clone(), 100_000).unwrap(),
            store,
            conn: redis.conn().await,
            reference: (
                idem::Scope::from("bench.ref"),
                Fingerprint::of(&500i64).unwrap(),
                idem::Outcome {
                    kind: idem::OutcomeKind::Ok,
                    body: b"500".to_vec(),
                },
            ),
            redis,
            _keys: DeleteKeys { redis, prefix },
        }
    }

    /// The business write, then a body that takes `body`.
    async fn incr(&self, key: &str, amount: i64, body: Duration) -> Result<i64, PayError> {
        let mut conn = match &self.conn {
            Conn::Single(conn) => Conn::Single(conn.clone()),
            Conn::Cluster(conn) => Conn::Cluster(conn.clone()),
        };
        redis::cmd("INCRBY")
            .arg(format!("{}:pay:{key}", self.store.prefix()))
            .arg(amount)
            .query_async::<i64>(&mut conn)
            .await?;
        take(body).await;
        Ok(amount)
    }

    async fn pay(&self, mode: Mode, key: &str, body: Duration) {
        let write = self.incr(key, 500, body);
        outside_tx((&self.store, &self.cached), mode, key, 500, write)
            .await
            .unwrap();
    }

    /// The reference's call: a first execution's scripts around the same
    /// write as idem's body, on a key of its own, or a replay's read of a
    /// record that one of them wrote.
    async fn reference_call(&self, script: Script) {
        let (scope, fingerprint, outcome) = &self.reference;
        let request = |key| idem::BeginRequest {
            scope,
            key,
            fingerprint,
            token: idem::ClaimToken::new(),
            lease: Duration::from_secs(60),
            ttl: idem::Policy::DEFAULT_TTL,
        };
        match script {
            Script::Record(body) => {
                let key = idem::Key::try_from(unique("ref").as_str()).unwrap();
                let write = async {
                    self.incr(key.as_str(), 500, body).await.unwrap();
                };
                self.store
                    .__reference_first_execution(&request(&key), write, outcome)
                    .await
                    .unwrap();
            }
            Script::Replay => {
                let key = idem::Key::try_from(REPLAY_KEY).unwrap();
                let request = request(&key);
                // Written once, by the first replay of a run.
                if self.store.__reference_replay(&request).await.is_err() {
                    self.store
                        .__reference_first_execution(&request, async {}, outcome)
                        .await
                        .unwrap();
                    self.store.__reference_replay(&request).await.unwrap();
                }
            }
            Script::Tx(_) | Script::TxWithoutRead(_) => {
                unreachable!("Redis has no transactional mode")
            }
        }
    }
}

impl Calls for RedisPayments {
    fn label(&self) -> &'static str {
        match self.redis {
            Redis::Single => "Redis",
            Redis::Cluster => "Redis Cluster",
        }
    }
    fn goals(&self) -> &'static Goals {
        &REDIS_GOALS
    }
    fn write(&self) -> &'static str {
        "INCRBY"
    }
    fn transactional(&self) -> bool {
        false
    }
    fn reference_status(&self) -> Option<Result<(), &'static str>> {
        Some(Ok(()))
    }
    fn reference(
        self: &Arc<Self>,
        script: Script,
        tasks: usize,
        window: Duration,
    ) -> impl Future<Output = f64> + Send {
        let this = self.clone();
        throughput_of(tasks, Span::For(window), move || {
            let this = this.clone();
            async move { this.reference_call(script).await }
        })
    }
    fn call(self: &Arc<Self>, mode: Mode, body: Duration) -> impl Future<Output = ()> + Send {
        let this = self.clone();
        async move { this.pay(mode, &unique("pay"), body).await }
    }
    fn call_key(self: &Arc<Self>, mode: Mode, key: &str) -> impl Future<Output = ()> + Send {
        let (this, key) = (self.clone(), key.to_owned());
        async move { this.pay(mode, &key, Duration::ZERO).await }
    }
    fn store(&self) -> Arc<dyn Store> {
        Arc::new(self.store.clone())
    }
}

/// What the measurements of every backend (B1, B2, B4, the store's cost
/// per call) need from it.
trait Calls: Send + Sync + Sized + 'static {
    fn label(&self) -> &'static str;
    fn goals(&self) -> &'static Goals;
    /// The plain call's one write (the body's), as the rows name it.
    fn write(&self) -> &'static str;
    /// Whether the body can be in the caller's transaction (B1's
    /// transactional rows).
    fn transactional(&self) -> bool;
    /// Whether the reference is measured here: `None` where the backend
    /// has none, `Some(Err(why))` where it cannot be.
    fn reference_status(&self) -> Option<Result<(), &'static str>> {
        None
    }
    /// The reference's calls per second: `script` by `tasks` clients for
    /// `window`; asked only where `reference_status` answers `Some(Ok(()))`.
    fn reference(
        self: &Arc<Self>,
        _script: Script,
        _tasks: usize,
        _window: Duration,
    ) -> impl Future<Output = f64> + Send {
        let label = self.label();
        async move { unreachable!("{label} has no reference") }
    }
    /// A second reference that B1 and B7 measure beside the first, as the
    /// row names it, and its script, sent by a sqlx loop: the same
    /// statements sent by the plain call's and idem's own client, where
    /// the reference is another client's (pgbench); or, in transactional
    /// mode where the store reads the record beside the caller's
    /// transaction before its claim, the statements without that read.
    fn second_reference(&self, _script: Script) -> Option<(&'static str, Script)> {
        None
    }
    /// The reference's calls per second sent by a sqlx loop on the pool,
    /// by `tasks` tasks for `span`; asked only for a `second_reference`.
    fn loop_reference(
        self: &Arc<Self>,
        _script: Script,
        _tasks: usize,
        _span: Span,
    ) -> impl Future<Output = f64> + Send {
        let label = self.label();
        async move { unreachable!("{label} has no sqlx loop reference") }
    }
    /// A call of `mode` (with a body taking `body` after its write) on a
    /// key of its own.
    fn call(self: &Arc<Self>, mode: Mode, body: Duration) -> impl Future<Output = ()> + Send;
    /// A call of `mode` on `key`, the body its write alone.
    fn call_key(self: &Arc<Self>, mode: Mode, key: &str) -> impl Future<Output = ()> + Send;
    fn store(&self) -> Arc<dyn Store>;
}

/// What the SQL backends' other measurements need from them.
trait Bench: Calls {
    fn dialect(&self) -> &'static Dialect;
    /// The records table.
    fn records(&self) -> String;
    /// Where SQLite's file is.
    fn dir(&self) -> &Path;
    /// The same tables through a pool of its own, of `connections`
    /// connections.
    fn resized(&self, connections: u32) -> impl Future<Output = Self> + Send;
    /// Closes the pool.
    fn close(&self) -> impl Future<Output = ()> + Send;
    /// Creates B8's entity table.
    fn entity_setup(&self) -> impl Future<Output = ()> + Send;
    /// One entity-mode call of B8.
    fn entity_call(self: &Arc<Self>, key: &str, body: Duration) -> impl Future<Output = ()> + Send;
    /// The usual recipe: read the key, take a lock, write.
    fn check_then_act(self: &Arc<Self>) -> impl Future<Output = ()> + Send;
    /// B3's reference: the store's statements for a first execution in
    /// record mode, without idem's engine, on one connection held for the
    /// call as check-then-act holds its own.
    fn held_reference(self: &Arc<Self>) -> impl Future<Output = ()> + Send;
    /// B3's reference for transactional mode: B1's (the store's
    /// statements in a transaction, after the read of the record the
    /// store sends before its claim there), by a sqlx loop.
    fn tx_reference(self: &Arc<Self>) -> impl Future<Output = ()> + Send;
    /// The same backend with tables of its own.
    fn fresh(&self, tag: &str) -> impl Future<Output = Self> + Send;
    /// Bulk-loads `n` completed records `k1..=kn` of `scope`.
    fn fill(
        &self,
        scope: &str,
        fp: &Fingerprint,
        n: usize,
        expires_at: i64,
    ) -> impl Future<Output = ()> + Send;
    /// Drops the tables.
    fn drop_tables(&self) -> impl Future<Output = ()> + Send;
}

/// Plain calls, idem's and the reference's, interleaved.
struct Compared {
    /// idem / plain.
    ratio: f64,
    plain: f64,
    idem: f64,
    /// The reference's ratio to plain and its calls per second, or why it
    /// was not measured; `None` where the backend has no reference.
    reference: Option<Result<(f64, f64), &'static str>>,
    /// The second reference ([`Calls::second_reference`]): how the row
    /// names it, its ratio to plain and its calls per second.
    second: Option<(&'static str, f64, f64)>,
}

impl Compared {
    /// Plain calls (`modes.0`) and idem's (`modes.1`), each measured by
    /// `run`, and the reference's `script` by `tasks` clients, if any; the
    /// second reference, where there is one, is measured by `run` too, so
    /// on the same pool as the plain calls and idem's.
    async fn measure<'a, B: Calls, R>(
        b: &'a Arc<B>,
        modes: (Mode, Mode),
        script: Option<Script>,
        tasks: usize,
        run: R,
    ) -> Compared
    where
        R: Fn(Subject) -> LocalBoxFuture<'a, f64> + Copy + 'a,
    {
        let status = script.and(b.reference_status());
        let mut measures = vec![
            measure(move || run(Subject::Call(modes.0))),
            measure(move || run(Subject::Call(modes.1))),
        ];
        if let (Some(script), Some(Ok(()))) = (script, status) {
            measures.push(measure(move || b.reference(script, tasks, window())));
        }
        let second = match script.and_then(|script| b.second_reference(script)) {
            Some((label, script)) => {
                measures.push(measure(move || run(Subject::Loop(script))));
                Some((label, measures.len() - 1))
            }
            None => None,
        };
        let found = interleave_all(&measures).await;
        Compared {
            ratio: found[1].0,
            plain: found[0].1,
            idem: found[1].1,
            reference: status.map(|s| s.map(|()| found[2])),
            second: second.map(|(label, i)| (label, found[i].0, found[i].1)),
        }
    }

    fn reference_ratio(&self) -> Option<f64> {
        self.reference.and_then(|r| r.ok()).map(|(ratio, _)| ratio)
    }

    /// The calls per second, as the row says them.
    fn calls(&self) -> String {
        let reference = match self.reference {
            Some(Ok((_, calls))) => format!(", reference {calls:.0}"),
            _ => String::new(),
        };
        let second = match self.second {
            Some((label, _, calls)) => format!(", reference {label} {calls:.0}"),
            None => String::new(),
        };
        format!(
            "idem {:.0}, plain {:.0}{reference}{second} calls/s",
            self.idem, self.plain
        )
    }

    /// idem's ratio, and the reference's.
    fn measured(&self) -> String {
        let reference = self.reference.map(|r| r.map(|(ratio, _)| ratio));
        let note = reference_note(reference);
        match self.second {
            Some((label, ratio, _)) if note.ends_with(')') => format!(
                "{:.2}{}, {label} {ratio:.2})",
                self.ratio,
                &note[..note.len() - 1]
            ),
            _ => format!("{:.2}{note}", self.ratio),
        }
    }
}

/// What one measure of a [`Compared`] runs.
#[derive(Clone, Copy)]
enum Subject {
    /// Calls of a mode: plain, or idem's.
    Call(Mode),
    /// The second reference's script, by a sqlx loop.
    Loop(Script),
}

/// Calls per second of `subject` by `tasks` tasks on `b` for `span`, a
/// call's body taking `body` after its write.
fn run_subject<B: Calls>(
    b: &Arc<B>,
    tasks: usize,
    subject: Subject,
    body: Duration,
    span: Span,
) -> LocalBoxFuture<'static, f64> {
    match subject {
        Subject::Call(mode) => {
            let b = b.clone();
            throughput_of(tasks, span, move || {
                let b = b.clone();
                async move { b.call(mode, body).await }
            })
            .boxed_local()
        }
        Subject::Loop(script) => {
            let b = b.clone();
            async move { b.loop_reference(script, tasks, span).await }.boxed_local()
        }
    }
}

/// B1: first execution throughput, attribute vs none, and the reference.
async fn b1<B: Calls>(b: &Arc<B>, report: &mut Report) {
    let goals = b.goals();
    let write = b.write();
    let (bare, slow) = (Duration::ZERO, Duration::from_millis(20));
    let tx = (Mode::PlainTx, Mode::Tx);
    let record = (Mode::Plain, Mode::Record);
    let cases = [
        (
            "transactional, bare",
            "tx",
            tx,
            bare,
            Some(Script::Tx(bare)),
            goals.tx,
        ),
        (
            "record mode, bare",
            "record",
            record,
            bare,
            Some(Script::Record(bare)),
            goals.record,
        ),
        (
            "transactional, 20 ms body",
            "",
            tx,
            slow,
            Some(Script::Tx(slow)),
            Goal::AtLeast(0.97),
        ),
        (
            "record mode, 20 ms body",
            "",
            record,
            slow,
            Some(Script::Record(slow)),
            Goal::AtLeast(0.97),
        ),
    ];
    for (what, short, modes, body, script, goal) in cases {
        if modes == tx && !b.transactional() {
            continue;
        }
        let what = if body.is_zero() {
            format!("{what} {write}")
        } else {
            what.to_owned()
        };
        let found = Compared::measure(b, modes, script, CONCURRENCY, |subject| {
            run_subject(b, CONCURRENCY, subject, body, Span::For(window()))
        })
        .await;
        if body.is_zero() {
            // A backend with record mode only: its name alone.
            let label = if b.transactional() {
                format!("{} {short}", b.label())
            } else {
                b.label().to_owned()
            };
            report
                .b1
                .push((label, found.ratio, found.reference_ratio()));
        }
        report.rows.push(Row::judged(
            ("B1", b.label()),
            format!(
                "first execution, {what}: throughput vs no attribute ({}, {CONCURRENCY} tasks, {} ms each)",
                found.calls(),
                window().as_millis()
            ),
            found.measured(),
            (goal, ""),
            (found.ratio, found.reference_ratio()),
        ));
    }
}

/// B2: replay latency vs first execution (record mode, one caller).
async fn b2<B: Calls>(b: &Arc<B>, report: &mut Report) {
    let (ratio, firsts, replays) = replay_vs_first(b, Mode::Record).await;
    // The reference's replay, one read, against its first execution, one
    // client each: the ratio of their latencies.
    let reference = match b.reference_status() {
        None => None,
        Some(Err(why)) => Some(Err(why)),
        Some(Ok(())) => {
            let found = interleave_all(&[
                measure(|| b.reference(Script::Replay, 1, window())),
                measure(|| b.reference(Script::Record(Duration::ZERO), 1, window())),
            ])
            .await;
            Some(Ok(found[1].0))
        }
    };
    report.rows.push(Row::judged(
        ("B2", b.label()),
        format!(
            "replay latency vs first execution, record mode ({replays:.2} ms vs {firsts:.2} ms, median)"
        ),
        format!("{ratio:.2}{}", reference_note(reference)),
        (b.goals().replay, ""),
        (ratio, None),
    ));
    let (ratio, firsts, replays) = replay_vs_first(b, Mode::Cached).await;
    report.rows.push(Row::judged(
        ("B2", b.label()),
        format!(
            "replay latency vs first execution, record mode with the local replay cache \
             (`CachedStore`; {:.3} ms vs {:.2} ms, median)",
            replays, firsts
        ),
        format!("{ratio:.3}"),
        (CACHED_REPLAY_GOAL, ""),
        (ratio, None),
    ));
}

/// B2's goal with the local replay cache.
const CACHED_REPLAY_GOAL: Goal = Goal::AtMost(0.02);

/// Median latencies of first executions and of their replays in `mode`,
/// one caller, and the median of the per-round ratios.
async fn replay_vs_first<B: Calls>(b: &Arc<B>, mode: Mode) -> (f64, f64, f64) {
    let n = if quick() { 20 } else { 100 };
    let mut ratios = Vec::new();
    let (mut firsts, mut replays) = (Vec::new(), Vec::new());
    for keys in keys_per_round("b2", n) {
        let mut first = Vec::new();
        for k in &keys {
            let t = Instant::now();
            b.call_key(mode, k).await;
            first.push(t.elapsed().as_secs_f64() * 1e3);
        }
        let mut replay = Vec::new();
        for k in &keys {
            let t = Instant::now();
            b.call_key(mode, k).await;
            replay.push(t.elapsed().as_secs_f64() * 1e3);
        }
        let (f, r) = (median(first), median(replay));
        ratios.push(r / f);
        firsts.push(f);
        replays.push(r);
    }
    (median(ratios), median(firsts), median(replays))
}

/// B3: idem vs check-then-act (read the key, lock, write), in record mode
/// and, where the backend has it, in transactional mode, and the record
/// mode's statements without the engine (the reference), the four
/// measured in the same rounds.
async fn b3<B: Bench>(b: &Arc<B>, report: &mut Report) {
    let ops = if quick() { 80 } else { 400 };
    let idem = move |mode| {
        let b = b.clone();
        move || {
            let b = b.clone();
            throughput(ops, move || {
                let b = b.clone();
                async move { b.call(mode, Duration::ZERO).await }
            })
        }
    };
    let mut measures = vec![
        measure(move || {
            let b = b.clone();
            throughput(ops, move || {
                let b = b.clone();
                async move { b.check_then_act().await }
            })
        }),
        measure(move || {
            let b = b.clone();
            throughput(ops, move || {
                let b = b.clone();
                async move { b.held_reference().await }
            })
        }),
        measure(idem(Mode::Record)),
    ];
    if b.transactional() {
        measures.push(measure(idem(Mode::Tx)));
        measures.push(measure(move || {
            let b = b.clone();
            throughput(ops, move || {
                let b = b.clone();
                async move { b.tx_reference().await }
            })
        }));
    }
    let found = interleave_all(&measures).await;
    let recipe = found[0].1;
    // (mode, idem's measure, its reference's)
    let mut modes = vec![("record mode", found[2], found[1])];
    if b.transactional() {
        modes.push(("transactional mode", found[3], found[4]));
    }
    for (mode, (ratio, calls), (reference, reference_calls)) in modes {
        let (note, also) = (
            format!(" (reference {reference:.2})"),
            format!("; reference {reference_calls:.0} calls/s"),
        );
        report.rows.push(Row::judged(
            ("B3", b.label()),
            format!(
                "{mode} vs check-then-act (SELECT key, lock, INSERT record, business INSERT, UPDATE, unlock): throughput ({calls:.0} vs {recipe:.0} calls/s{also})"
            ),
            format!("{ratio:.2}{note}"),
            (Goal::Above(1.0), ""),
            (ratio, None),
        ));
    }
}

/// What rounds of calls on one key found.
#[derive(Default)]
struct OneKey {
    /// The most body runs in a round.
    max_runs: usize,
    /// Each waiter's return after the winner's, in ms.
    lags: Vec<f64>,
}

impl OneKey {
    /// One round: each call's answer (whether it ran the body) and the
    /// time it returned (µs of the wall clock).
    fn add(&mut self, returns: &[(bool, u64)]) {
        let runs = returns.iter().filter(|(won, _)| *won).count();
        self.max_runs = self.max_runs.max(runs);
        let winner = returns
            .iter()
            .find(|(won, _)| *won)
            .map(|(_, at)| *at)
            .expect("a winner");
        for (won, at) in returns {
            if !won {
                self.lags.push(at.saturating_sub(winner) as f64 / 1e3);
            }
        }
    }

    /// The rows: body runs, and the waiters' p99 against `goal`.
    fn report(
        mut self,
        id: (&'static str, &'static str),
        what: String,
        goal: Goal,
        report: &mut Report,
    ) {
        let p50 = percentile(&mut self.lags, 0.5);
        let p99 = percentile(&mut self.lags, 0.99);
        report.rows.push(Row::judged(
            id,
            format!("{what}: body runs per key (max over {} rounds)", rounds()),
            format!("{}", self.max_runs),
            (Goal::Exactly(1.0), ""),
            (self.max_runs as f64, None),
        ));
        report.rows.push(Row::judged(
            id,
            format!(
                "winner's return to each waiter's return: p50 {p50:.2} ms, p99 (n = {})",
                self.lags.len()
            ),
            format!("{p99:.2} ms"),
            (goal, " ms"),
            (p99, None),
        ));
    }
}

/// `calls` calls on `key` released together (at `at`, µs of the wall
/// clock, if given): whether each ran the body, and when it returned.
async fn calls_on_one_key<B: Calls>(
    b: &Arc<B>,
    key: &str,
    calls: usize,
    at: Option<u64>,
) -> Vec<(bool, u64)> {
    if let Some(at) = at {
        tokio::time::sleep(Duration::from_micros(at.saturating_sub(unix_micros()))).await;
    }
    let runs = Arc::new(AtomicUsize::new(0));
    let barrier = Arc::new(Barrier::new(calls));
    let store = b.store();
    let tasks: Vec<_> = (0..calls)
        .map(|_| {
            let (store, key, runs, barrier) =
                (store.clone(), key.to_owned(), runs.clone(), barrier.clone());
            tokio::spawn(async move {
                barrier.wait().await;
                let won = duplicate(&*store, &key, &runs).await;
                (won, unix_micros())
            })
        })
        .collect();
    let mut returns = Vec::new();
    for t in tasks {
        returns.push(t.await.unwrap());
    }
    returns
}

/// Whether `IDEM_BENCH_CASES` (comma-separated, e.g. `B4,B4'`) asks for
/// the measurement `id`; all of them when it is unset.
fn case(id: &str) -> bool {
    let cases = std::env::var("IDEM_BENCH_CASES").unwrap_or_default();
    cases.trim().is_empty() || cases.split(',').any(|c| c.trim().eq_ignore_ascii_case(id))
}

/// The one-minute load average at or below which a whole run starts.
const QUIET_LOAD: f64 = 1.5;
/// How long a whole run waits for it.
const QUIET_WAIT: Duration = Duration::from_secs(300);

/// The one-minute load average, where `/proc` tells it.
fn load_now() -> Option<f64> {
    std::fs::read_to_string("/proc/loadavg")
        .ok()?
        .split_whitespace()
        .next()?
        .parse()
        .ok()
}

/// Waits, up to [`QUIET_WAIT`], for the one-minute load average to fall
/// to [`QUIET_LOAD`] or below, so that a whole run does not start on the
/// tail of other work (a build, the previous run's servers catching up);
/// answers whether it did (or the load cannot be read).
async fn wait_for_quiet() -> bool {
    let until = Instant::now() + QUIET_WAIT;
    loop {
        match load_now() {
            Some(load) if load > QUIET_LOAD => {
                if Instant::now() >= until {
                    eprintln!(
                        "the load average is still {load:.2} after {} s: measuring anyway",
                        QUIET_WAIT.as_secs()
                    );
                    return false;
                }
                eprintln!("load average {load:.2}, above {QUIET_LOAD}: waiting for it to fall");
                tokio::time::sleep(Duration::from_secs(10)).await;
            }
            _ => return true,
        }
    }
}

/// Whether this run measures less than the whole table.
fn narrowed() -> bool {
    ["IDEM_BENCH_ONLY", "IDEM_BENCH_CASES"]
        .iter()
        .any(|v| std::env::var(v).is_ok_and(|v| !v.trim().is_empty()))
}

/// B4: 64 calls on one key released at once.
async fn b4<B: Calls>(b: &Arc<B>, report: &mut Report) {
    const CALLS: usize = 64;
    let mut found = OneKey::default();
    for _ in 0..rounds() {
        found.add(&calls_on_one_key(b, &unique("b4"), CALLS, None).await);
    }
    found.report(
        ("B4", b.label()),
        format!("{CALLS} concurrent calls on one key"),
        Goal::AtMost(3.0),
        report,
    );
}

/// The variable that makes this binary B4''s child, naming the backend;
/// `IDEM_BENCH_CHILD_DIR` and `IDEM_BENCH_CHILD_TABLE` say where SQLite's
/// file is and which records table to use.
const CHILD: &str = "IDEM_BENCH_CHILD";

/// B4': B4's 64 calls spread over 4 processes (this binary again), each
/// making 16 at the same instant of the wall clock.
async fn b4_processes<B: Bench>(b: &Arc<B>, report: &mut Report) {
    const PROCESSES: usize = 4;
    let exe = std::env::current_exe().unwrap();
    let mut children = Vec::new();
    for _ in 0..PROCESSES {
        let mut child = tokio::process::Command::new(&exe)
            .env(CHILD, b.label())
            .env("IDEM_BENCH_CHILD_DIR", b.dir())
            .env("IDEM_BENCH_CHILD_TABLE", b.records())
            .stdin(std::process::Stdio::piped())
            .stdout(std::process::Stdio::piped())
            .kill_on_drop(true)
            .spawn()
            .unwrap();
        let stdin = child.stdin.take().unwrap();
        let mut lines = BufReader::new(child.stdout.take().unwrap()).lines();
        assert_eq!(lines.next_line().await.unwrap().as_deref(), Some("ready"));
        children.push((child, stdin, lines));
    }
    let mut found = OneKey::default();
    for _ in 0..rounds() {
        let round = format!("{} {}\n", unique("b4p"), unix_micros() + 100_000);
        for (_, stdin, _) in &mut children {
            stdin.write_all(round.as_bytes()).await.unwrap();
        }
        let mut returns = Vec::new();
        for (_, _, lines) in &mut children {
            while let Some(line) = lines.next_line().await.unwrap() {
                let Some((won, at)) = line.split_once(' ') else {
                    break;
                };
                returns.push((won == "1", at.parse().unwrap()));
            }
        }
        found.add(&returns);
    }
    for (mut child, stdin, _) in children {
        drop(stdin);
        child.wait().await.unwrap();
    }
    found.report(
        ("B4'", b.label()),
        format!(
            "{} calls on one key from {PROCESSES} processes ({CHILD_CALLS} each, at one instant)",
            PROCESSES * CHILD_CALLS
        ),
        b.dialect().goals.processes,
        report,
    );
}

/// The calls each child of B4' makes.
const CHILD_CALLS: usize = 16;

/// B4''s child: opens its connections and its listener with a first
/// round of calls, says `ready`, then for each line `key at` on its
/// standard input makes its calls on `key` at `at`, and answers a line
/// `ran returned_at` for each, then `end`.
async fn child<B: Calls>(b: Arc<B>) {
    // One call runs the body, the others wait: the pool's connections are
    // open, and PostgreSQL's listener is listening.
    calls_on_one_key(&b, &unique("warm"), CHILD_CALLS, None).await;
    println!("ready");
    let mut lines = BufReader::new(tokio::io::stdin()).lines();
    while let Some(line) = lines.next_line().await.unwrap() {
        let (key, at) = line.split_once(' ').unwrap();
        let returns = calls_on_one_key(&b, key, CHILD_CALLS, Some(at.parse().unwrap())).await;
        let mut out = String::new();
        for (won, at) in returns {
            let _ = writeln!(out, "{} {at}", u8::from(won));
        }
        println!("{out}end");
    }
}

/// Runs B4''s child on the backend labelled `label`.
async fn child_main(label: &str) {
    let dir = PathBuf::from(std::env::var("IDEM_BENCH_CHILD_DIR").unwrap());
    let table = std::env::var("IDEM_BENCH_CHILD_TABLE").unwrap();
    match label {
        l if l == pg::DIALECT.label => pg::Payments::child(&dir, &table).await,
        l if l == my::DIALECT.label => my::Payments::child(&dir, &table).await,
        l if l == lite::DIALECT.label => lite::Payments::child(&dir, &table).await,
        other => panic!("no backend {other}"),
    }
}

/// B7: throughput vs concurrency, record mode with a bare INSERT: plain,
/// the reference (as many clients) and idem, through a pool of as many
/// connections as tasks. Each measurement opens its pool (and prepares its
/// statements) before it starts and closes it after, so that pgbench's
/// connections fit in the server's.
async fn b7<B: Bench>(b: &Arc<B>, report: &mut Report) {
    let window = Duration::from_millis(if quick() { 100 } else { 300 });
    let mut previous: Option<f64> = None;
    for tasks in [1, 4, 16, 64] {
        let found = Compared::measure(
            b,
            (Mode::Plain, Mode::Record),
            Some(Script::Record(Duration::ZERO)),
            tasks,
            |subject| {
                let b = b.clone();
                async move {
                    let sized = Arc::new(b.resized(tasks as u32).await);
                    let run = |span| run_subject(&sized, tasks, subject, Duration::ZERO, span);
                    run(Span::Calls(2 * tasks)).await;
                    let calls = run(Span::For(window)).await;
                    sized.close().await;
                    calls
                }
                .boxed_local()
            },
        )
        .await;
        report.b7.push((
            tasks,
            found.plain,
            found.reference.and_then(|r| r.ok()).map(|(_, calls)| calls),
            found.idem,
        ));
        report.rows.push(Row::judged(
            ("B7", b.label()),
            format!(
                "record mode, bare INSERT, concurrency {tasks} (tasks, connections, pgbench clients): throughput vs no attribute ({}, {} ms each)",
                found.calls(),
                window.as_millis()
            ),
            found.measured(),
            (
                previous.map_or(Goal::None, |p| Goal::AtLeast(p - 0.02)),
                if previous.is_some() { " (row above - 0.02)" } else { "" },
            ),
            (found.ratio, None),
        ));
        previous = Some(found.ratio);
    }
}

/// B8: entity mode, 20 distinct keys at once, each body taking 200 ms:
/// the wall time of the 20 against one body. Unrelated tokens must not
/// wait for each other.
async fn b8<B: Bench>(b: &Arc<B>, report: &mut Report) {
    const CALLS: usize = 20;
    let body = Duration::from_millis(200);
    // The first call migrates the claims' table.
    b.entity_setup().await;
    b.entity_call(&unique("b8"), Duration::ZERO).await;
    let mut walls = Vec::new();
    for _ in 0..rounds() {
        let barrier = Arc::new(Barrier::new(CALLS));
        let started = Instant::now();
        let tasks: Vec<_> = (0..CALLS)
            .map(|_| {
                let (b, barrier) = (b.clone(), barrier.clone());
                tokio::spawn(async move {
                    barrier.wait().await;
                    b.entity_call(&unique("b8"), body).await;
                })
            })
            .collect();
        for t in tasks {
            t.await.unwrap();
        }
        walls.push(started.elapsed().as_secs_f64() / body.as_secs_f64());
    }
    let ratio = percentile(&mut walls, 0.5);
    report.rows.push(Row::judged(
        ("B8", b.label()),
        format!(
            "entity mode, {CALLS} distinct keys at once, 200 ms body: wall time in bodies (median of {} rounds)",
            rounds()
        ),
        format!("{ratio:.2}"),
        (Goal::AtMost(1.5), ""),
        (ratio, None),
    ));
}

/// One operation of B9: three downstream calls of `call` each, as durable
/// steps or plainly, in record mode under a fresh key (or `key`).
async fn three_calls(store: Arc<dyn Store>, steps: bool, call: Duration, key: Option<&str>) {
    let key = key.map_or_else(|| unique("b9"), str::to_owned);
    idem::run(&*store, idem::Call::new("bench.steps", &key, &1), async {
        let mut total = 0u64;
        for name in ["reserve", "charge", "receipt"] {
            let one = || async {
                take(call).await;
                Ok::<_, idem::Error>(1u64)
            };
            total += if steps {
                idem::steps::step(name, |_key| one()).await?
            } else {
                one().await?
            };
        }
        Ok::<_, idem::Error>(total)
    })
    .await
    .unwrap();
}

/// B9: durable steps. The throughput of a record-mode operation making
/// three downstream calls of 5 ms as steps, against the same three calls
/// without steps; and the replay of a completed 3-step operation against
/// its first execution.
async fn b9<B: Bench>(b: &Arc<B>, report: &mut Report) {
    let call = Duration::from_millis(5);
    let store = b.store();
    let of = |steps: bool| {
        let store = store.clone();
        move || {
            throughput_of(CONCURRENCY, Span::For(window()), {
                let store = store.clone();
                move || three_calls(store.clone(), steps, call, None)
            })
        }
    };
    let (ratio, plain, steps) = interleave(of(false), of(true)).await;
    report.rows.push(Row::judged(
        ("B9", b.label()),
        format!(
            "durable steps: 3 steps of 5 ms vs the same 3 calls without steps, record mode \
             (throughput {steps:.0} vs {plain:.0} calls/s, {CONCURRENCY} tasks)"
        ),
        format!("{ratio:.2}"),
        (Goal::AtLeast(0.9), ""),
        (ratio, None),
    ));
    let n = if quick() { 10 } else { 40 };
    let (mut firsts, mut replays) = (Vec::new(), Vec::new());
    for _ in 0..rounds() {
        let keys: Vec<String> = (0..n).map(|_| unique("b9r")).collect();
        for times in [&mut firsts, &mut replays] {
            for k in &keys {
                let t = Instant::now();
                three_calls(store.clone(), true, call, Some(k)).await;
                times.push(t.elapsed().as_secs_f64() * 1e3);
            }
        }
    }
    let (first, replay) = (median(firsts), median(replays));
    report.rows.push(Row::judged(
        ("B9", b.label()),
        format!(
            "durable steps: replay of a completed 3-step operation vs its first execution \
             ({replay:.2} ms vs {first:.2} ms, median, one caller)"
        ),
        format!("{:.3}", replay / first),
        (Goal::None, ""),
        (replay / first, None),
    ));
}

/// B5: replay latency with 10 thousand vs 1 million stored records, and
/// the purge rate while claims run.
async fn b5<B: Bench>(b: &Arc<B>, report: &mut Report) {
    let (small, large) = if quick() {
        (10_000, 100_000)
    } else {
        (10_000, 1_000_000)
    };
    let fp = Fingerprint::of(&500i64).unwrap();
    let t = Instant::now();
    let small_b = Arc::new(b.fresh("b5s").await);
    small_b.fill("bench.pay", &fp, small, i64::MAX / 2).await;
    let large_b = Arc::new(b.fresh("b5l").await);
    large_b.fill("bench.pay", &fp, large, i64::MAX / 2).await;
    let load = t.elapsed().as_secs_f64();
    let n = if quick() { 50 } else { 200 };
    let replay = |bb: Arc<B>, count: usize| async move {
        let mut lat = Vec::new();
        for i in 0..n {
            let k = format!("k{}", 1 + (i * 7919 + 13) % count);
            let t = Instant::now();
            bb.call_key(Mode::Record, &k).await;
            lat.push(t.elapsed().as_secs_f64() * 1e3);
        }
        median(lat)
    };
    let (ratio, a, s) = interleave(
        || replay(small_b.clone(), small),
        || replay(large_b.clone(), large),
    )
    .await;
    report.rows.push(Row::judged(
        ("B5", b.label()),
        format!(
            "replay latency with {large} vs {small} stored records ({s:.2} vs {a:.2} ms; bulk-loaded in {load:.0} s by one INSERT ... SELECT)"
        ),
        format!("{ratio:.2}"),
        (Goal::AtMost(1.5), ""),
        (ratio, None),
    ));

    // Purge: expired records, while 4 tasks claim new keys.
    let expired = if quick() { 20_000 } else { 200_000 };
    let purge_b = Arc::new(b.fresh("b5p").await);
    purge_b.fill("bench.old", &fp, expired, 1).await;
    let stop = Arc::new(std::sync::atomic::AtomicBool::new(false));
    let claims = Arc::new(AtomicUsize::new(0));
    let claimers: Vec<_> = (0..CONCURRENCY)
        .map(|_| {
            let (pb, stop, claims) = (purge_b.clone(), stop.clone(), claims.clone());
            tokio::spawn(async move {
                while !stop.load(Ordering::Relaxed) {
                    pb.call(Mode::Record, Duration::ZERO).await;
                    claims.fetch_add(1, Ordering::Relaxed);
                }
            })
        })
        .collect();
    let store = purge_b.store();
    let t = Instant::now();
    let purged = store.purge_expired(1_000).await.unwrap();
    let secs = t.elapsed().as_secs_f64();
    stop.store(true, Ordering::Relaxed);
    for c in claimers {
        c.await.unwrap();
    }
    report.rows.push(Row {
        id: "B5",
        backend: b.label(),
        what: format!(
            "purge of {purged} expired records in batches of 1000 while {CONCURRENCY} tasks claim ({:.0} claims/s meanwhile)",
            claims.load(Ordering::Relaxed) as f64 / secs
        ),
        measured: format!("{:.0} records/s", purged as f64 / secs),
        goal: "-".to_owned(),
        met: None,
    });
    for bb in [small_b, large_b, purge_b] {
        bb.drop_tables().await;
    }
}

/// `n` keys of their own for each round.
fn keys_per_round(tag: &str, n: usize) -> Vec<Vec<String>> {
    (0..rounds())
        .map(|_| (0..n).map(|_| unique(tag)).collect())
        .collect()
}

/// B6's measurement, one caller: the time per call in ns of `plain` calls,
/// of first executions (`idem`, given the round's index and the key) and
/// of their replays (`idem` again on the same keys), and the same of
/// `reference` if there is one, each the mean over a round's keys, in
/// the same rounds; their medians over the rounds, as `[plain, first,
/// replay]` and the reference's `[first, replay]`.
async fn cost_per_call<'a, P, PF, I, IF, R, RF>(
    keys: &'a [Vec<String>],
    plain: P,
    idem: I,
    reference: Option<R>,
) -> ([f64; 3], Option<[f64; 2]>)
where
    P: Fn(&'a str) -> PF,
    PF: Future<Output = ()>,
    I: Fn(usize, &'a str) -> IF,
    IF: Future<Output = ()>,
    R: Fn(usize, &'a str) -> RF,
    RF: Future<Output = ()>,
{
    let mut times = [Vec::new(), Vec::new(), Vec::new()];
    let mut beside = [Vec::new(), Vec::new()];
    for (round, keys) in keys.iter().enumerate() {
        let per_call = |t: Instant| t.elapsed().as_secs_f64() * 1e9 / keys.len() as f64;
        let t = Instant::now();
        for k in keys {
            plain(k).await;
        }
        times[0].push(per_call(t));
        for times in &mut times[1..] {
            let t = Instant::now();
            for k in keys {
                idem(round, k).await;
            }
            times.push(per_call(t));
        }
        if let Some(reference) = &reference {
            for times in &mut beside {
                let t = Instant::now();
                for k in keys {
                    reference(round, k).await;
                }
                times.push(per_call(t));
            }
        }
    }
    let beside = reference.map(|_| beside.map(median));
    (times.map(median), beside)
}

/// No reference for [`cost_per_call`].
fn no_reference<'a>() -> Option<fn(usize, &'a str) -> std::future::Ready<()>> {
    None
}

/// B6's rows: the cost per call of a first execution and of a replay,
/// from `[plain, first, replay]` in ns, against `plain` (`baseline` says
/// what that call is), and beside them, where there is one, a reference's
/// cost per call for each (`(what it is, [first, replay])`, in ns over
/// `plain`).
fn cost_rows(
    backend: &'static str,
    [plain, first, replay]: [f64; 3],
    baseline: &str,
    goals: [Goal; 2],
    reference: Option<(&str, [f64; 2])>,
    report: &mut Report,
) {
    let time = |ns: f64| match ns {
        ns if ns < 100.0 => format!("{ns:.1} ns"),
        ns if ns < 10_000.0 => format!("{ns:.0} ns"),
        ns => format!("{:.0} µs", ns / 1e3),
    };
    let calls = [("first execution", first), ("replay", replay)];
    for (i, ((what, ns), goal)) in calls.into_iter().zip(goals).enumerate() {
        let cost = (ns - plain) / 1e3;
        let digits = if cost.abs() < 10.0 { 2 } else { 0 };
        let (beside, measured_beside) = match reference {
            Some((which, costs)) => (
                format!("; {which}: {}", time(plain + costs[i])),
                format!(" (reference {:+.digits$} µs)", costs[i] / 1e3),
            ),
            None => Default::default(),
        };
        report.rows.push(Row::judged(
            ("B6", backend),
            format!(
                "cost per call, {what}: {} against {} for {baseline}{beside}",
                time(ns),
                time(plain)
            ),
            format!("{cost:+.digits$} µs{measured_beside}"),
            (goal, " µs"),
            (cost, None),
        ));
    }
}

/// B6: the memory store's cost per call vs a plain function call.
async fn b6(report: &mut Report) {
    #[inline(never)]
    async fn plain(amount: i64) -> Result<i64, idem::Error> {
        Ok(std::hint::black_box(amount))
    }
    let keys = keys_per_round("b6", if quick() { 20_000 } else { 200_000 });
    // A store of its own for each round, so that every round measures the
    // same thing: calls on a store of one round's records (how a replay's
    // time grows with the records held is B5's to show).
    let stores: Vec<_> = keys.iter().map(|_| idem::MemoryStore::new()).collect();
    let stores = &stores;
    // The reference, in the same rounds on the same keys: the records
    // alone, in a bare map behind a mutex, as a store in memory needs
    // them at the least (a first execution: one lock, one hash, one
    // insert; a replay: one lock, one hash, one look-up, the outcome
    // copied out). What it costs at this many records is the memory's
    // (cache and TLB misses), whatever the engine does.
    let bare: Vec<_> = keys.iter().map(|_| BareMap::default()).collect();
    let bare = &bare;
    let (times, reference) = cost_per_call(
        &keys,
        |_| async {
            std::hint::black_box(plain(500).await.unwrap());
        },
        |round, k| async move {
            let store = &stores[round];
            let r: Result<i64, idem::Error> =
                idem::run(store, idem::Call::new("bench.mem", k, &500i64), plain(500)).await;
            std::hint::black_box(r.unwrap());
        },
        Some(|round: usize, k: &str| {
            std::hint::black_box(bare[round].call(k));
            std::future::ready(())
        }),
    )
    .await;
    let [first, replay] = reference.expect("measured beside");
    let beside = [first - times[0], replay - times[0]];
    let goals = [Goal::AtMost(1.0), Goal::AtMost(0.5)];
    cost_rows(
        "memory",
        times,
        "a plain async fn call",
        goals,
        Some(("the same records in a bare map", beside)),
        report,
    );
}

/// B6's reference: a store in memory at its barest, records by key in a
/// map behind a mutex (hashed as `MemoryStore` hashes), each with what a
/// replay needs of it.
#[derive(Default)]
struct BareMap(
    std::sync::Mutex<hashbrown::HashMap<String, BareRecord, foldhash::fast::RandomState>>,
);

struct BareRecord {
    fingerprint: [u8; 32],
    expires_at: i64,
    outcome: Vec<u8>,
}

impl BareMap {
    /// The first call on `key` stores its record; a later one, of the
    /// same payload and before the record expires, copies its outcome
    /// out. Hashed once either way.
    fn call(&self, key: &str) -> Vec<u8> {
        const FINGERPRINT: [u8; 32] = [7; 32];
        let mut map = self.0.lock().unwrap();
        match map.entry_ref(key) {
            hashbrown::hash_map::EntryRef::Occupied(r)
                if r.get().expires_at > 0 && r.get().fingerprint == FINGERPRINT =>
            {
                r.get().outcome.clone()
            }
            entry => {
                let outcome = b"500".to_vec();
                entry.insert(BareRecord {
                    fingerprint: FINGERPRINT,
                    expires_at: i64::MAX,
                    outcome: outcome.clone(),
                });
                outcome
            }
        }
    }
}

/// B6 on a backend's store: first executions and replays in record mode
/// against plain calls (the body's write alone), one caller.
async fn b6_on<B: Calls>(b: &Arc<B>, report: &mut Report) {
    let keys = keys_per_round("b6", if quick() { 20 } else { 100 });
    let (times, _) = cost_per_call(
        &keys,
        |k| b.call_key(Mode::Plain, k),
        |_, k| b.call_key(Mode::Record, k),
        no_reference(),
    )
    .await;
    let baseline = format!(
        "the plain call (the body's one {}, without idem), one caller",
        b.write()
    );
    cost_rows(b.label(), times, &baseline, [Goal::None; 2], None, report);
}

fn main() {
    let runtime = tokio::runtime::Builder::new_multi_thread()
        .worker_threads(2)
        .enable_all()
        .build()
        .unwrap();
    match std::env::var(CHILD) {
        Ok(label) => runtime.block_on(child_main(&label)),
        Err(_) => runtime.block_on(main_async()),
    }
}

/// Runs each measurement `id => f` that `IDEM_BENCH_CASES` asks for
/// ([`case`]), in order, as `f(b, report)`.
macro_rules! measure_cases {
    ($b:expr, $report:expr; $($id:literal => $f:ident),+ $(,)?) => {
        $(
            if case($id) {
                $f($b, $report).await;
            }
        )+
    };
}

async fn each<B: Bench>(b: &Arc<B>, report: &mut Report) {
    let t = Instant::now();
    measure_cases!(b, report;
        "B1" => b1, "B2" => b2, "B3" => b3, "B4" => b4, "B4'" => b4_processes,
        "B5" => b5, "B8" => b8, "B9" => b9, "B6" => b6_on,
    );
    if b.dialect().curve && case("B7") {
        b7(b, report).await;
    }
    b.drop_tables().await;
    eprintln!("{} done in {:.0} s", b.label(), t.elapsed().as_secs_f64());
}

/// Redis or Redis Cluster: what runs on every backend; its keys are
/// deleted as it is dropped.
async fn each_redis(redis: Redis, report: &mut Report) {
    let t = Instant::now();
    let b = &Arc::new(RedisPayments::new(redis).await);
    measure_cases!(b, report; "B1" => b1, "B2" => b2, "B4" => b4, "B6" => b6_on);
    eprintln!("{} done in {:.0} s", b.label(), t.elapsed().as_secs_f64());
}

async fn main_async() {
    let quiet = narrowed() || wait_for_quiet().await;
    let started = Instant::now();
    let date = cmd("date", &["-u", "+%Y-%m-%d %H:%M UTC"]);
    let load_before = std::fs::read_to_string("/proc/loadavg").unwrap_or_default();
    let mut report = Report::default();
    let dir = tempfile::tempdir().unwrap();
    let dir = dir.path();
    let only = std::env::var("IDEM_BENCH_ONLY").unwrap_or_default();
    let wanted = |backend: &str| only.is_empty() || only.split(',').any(|b| b.trim() == backend);
    // B6 over MemoryStore first, while the machine is as quiet as the
    // run will find it: it is CPU and memory alone, and after the
    // backends it ran beside their servers' own work on what the run left
    // them (vacuum, purge of the bulk-loaded tables). Its rows go last.
    let mut memory = Report::default();
    if case("B6") {
        b6(&mut memory).await;
    }
    if wanted("sqlite") {
        each(&Arc::new(lite::Payments::new(dir, "b").await), &mut report).await;
    }
    if wanted("postgres") {
        each(&Arc::new(pg::Payments::new(dir, "b").await), &mut report).await;
    }
    if wanted("mariadb") {
        each(&Arc::new(my::Payments::new(dir, "b").await), &mut report).await;
    }
    if wanted("redis") {
        each_redis(Redis::Single, &mut report).await;
    }
    if wanted("redis_cluster") {
        each_redis(Redis::Cluster, &mut report).await;
    }
    report.rows.append(&mut memory.rows);
    let load_after = std::fs::read_to_string("/proc/loadavg").unwrap_or_default();

    let mut table = String::new();
    let _ = writeln!(table, "| | backend | measurement | measured | goal | met |");
    let _ = writeln!(table, "|---|---|---|---|---|---|");
    for r in &report.rows {
        let met = match r.met {
            Some(true) => "yes",
            Some(false) => "**no**",
            None => "-",
        };
        let _ = writeln!(
            table,
            "| {} | {} | {} | {} | {} | {} |",
            r.id, r.backend, r.what, r.measured, r.goal, met
        );
    }
    println!("{table}");
    if narrowed() {
        eprintln!(
            "IDEM_BENCH_ONLY or IDEM_BENCH_CASES narrowed this run: BENCHMARKS.md is left as it is"
        );
        return;
    }

    let cpu = std::fs::read_to_string("/proc/cpuinfo")
        .unwrap_or_default()
        .lines()
        .find(|l| l.starts_with("model name"))
        .and_then(|l| l.split(':').nth(1))
        .unwrap_or("unknown")
        .trim()
        .to_owned();
    let mem = std::fs::read_to_string("/proc/meminfo")
        .unwrap_or_default()
        .lines()
        .find(|l| l.starts_with("MemTotal"))
        .and_then(|l| {
            l.split_whitespace()
                .nth(1)
                .and_then(|kb| kb.parse::<f64>().ok())
        })
        .map(|kb| format!("{:.1} GiB", kb / 1024.0 / 1024.0))
        .unwrap_or_default();
    let nproc = std::thread::available_parallelism()
        .map(|n| n.get())
        .unwrap_or(0);
    let pg_version = cmd("psql", &["-V"]);
    let my_version = cmd("mariadb", &["--version"]);
    // "mariadb  Ver 15.1 Distrib 10.11.19-MariaDB, for ...": the server release.
    let my_version = my_version
        .split("Distrib ")
        .nth(1)
        .and_then(|v| v.split(',').next())
        .map(|v| format!("MariaDB {v}"))
        .unwrap_or(my_version);
    // "Redis server v=7.0.15 sha=...": the release.
    let redis_version = cmd("redis-server", &["--version"]);
    let redis_version = redis_version
        .split("v=")
        .nth(1)
        .and_then(|v| v.split_whitespace().next())
        .map(|v| format!("Redis {v}"))
        .unwrap_or(redis_version);
    let loadavg = |s: &str| s.split_whitespace().take(3).collect::<Vec<_>>().join(" ");
    let notes = std::fs::read_to_string("BENCHMARKS.md")
        .ok()
        .and_then(|old| old.find("<!-- notes -->").map(|i| old[i..].to_owned()))
        .unwrap_or_else(|| "<!-- notes -->\n".to_owned());
    let mut md = String::new();
    let _ = writeln!(md, "# Benchmarks\n");
    let _ = writeln!(
        md,
        "Made by `cargo bench --bench idem --features sqlite,postgres,mysql,redis{}` on {date}, in {:.0} s.\n",
        if quick() { " (IDEM_BENCH_QUICK=1)" } else { "" },
        started.elapsed().as_secs_f64()
    );
    let _ = writeln!(md, "- machine: {nproc} CPUs ({cpu}), {mem} of memory");
    let _ = writeln!(
        md,
        "- servers: {pg_version}; {my_version}; SQLite (bundled with sqlx) on a file in WAL mode; {redis_version}, single and as a cluster of 3 primaries and 3 replicas on this machine"
    );
    let _ = writeln!(
        md,
        "- load average (1, 5, 15 min) before: {}; after: {}{}",
        loadavg(&load_before),
        loadavg(&load_after),
        if quiet {
            ""
        } else {
            " (the run waited five minutes for a load of 1.5 or below, in vain: its figures are noisier than usual)"
        }
    );
    let _ = writeln!(
        md,
        "- every ratio is the median of {} per-round ratios, baseline and subject alternating (A B, B A, ...) in one run; throughput with {CONCURRENCY} tasks",
        rounds()
    );
    let pgbench = cmd("pgbench", &["--version"]);
    let _ = writeln!(
        md,
        "- reference: the statements the store sends for the same call, without idem's engine, in the same rounds, as a ratio to the same plain call: on PostgreSQL {pgbench} (`-M prepared -c <tasks> -j 2 -T 1`), and in B1 and B7 also the same statements sent by a sqlx loop on the pool, the client of the plain call and of idem (\"by a sqlx loop\"), on MariaDB and SQLite a sqlx loop on the pool (as long as idem's measurement), which in transactional mode reads the record beside the transaction before the claim, on another connection of the pool, as the store does there, and is measured without that read too (\"without the read beside\"); a body that takes time (B1's 20 ms) waits after the business INSERT there too (pgbench's `\\sleep`); a replay's reference is the one read by key (B2: its latency against the reference's first execution, one client); B3's is the record mode's statements by a sqlx loop on one connection held for the call, as check-then-act holds its own, and transactional mode's B1's, each as a ratio to check-then-act"
    );
    let _ = writeln!(
        md,
        "- Redis and Redis Cluster: the plain call, the baseline of B1 and B6, is the body's own write alone, one `INCRBY` on a key of its own (where the SQL backends' is their business INSERT), so that a ratio shows idem's cost on top of one round trip; record mode only (a Redis body has no transaction to be in); the reference is the scripts the store sends (claim, completion; a replay's read) in a loop through the store's own connection, around the same `INCRBY`\n"
    );
    let chart_written = chart(&report, Path::new(CHART));
    match &chart_written {
        Ok(()) => {
            let _ = writeln!(
                md,
                "![B7: calls per second against tasks on PostgreSQL, plain, reference and idem; B1: idem's and the reference's ratios to plain calls]({CHART})\n"
            );
        }
        Err(e) => eprintln!("{CHART} not written: {e}"),
    }
    let _ = writeln!(md, "{table}");
    md.push_str(&notes);
    std::fs::write("BENCHMARKS.md", md).unwrap();
}

/// The chart beside `BENCHMARKS.md`.
const CHART: &str = "benchmarks.svg";

/// B7's calls per second against tasks (plain, reference, idem), and
/// B1's ratios to plain calls (idem, reference), as SVG at `path`.
fn chart(report: &Report, path: &Path) -> Result<(), Box<dyn std::error::Error>> {
    use plotters::prelude::*;
    const REFERENCE: RGBColor = RGBColor(0, 140, 0);
    let root = SVGBackend::new(path, (900, 760)).into_drawing_area();
    root.fill(&WHITE)?;
    let (top, bottom) = root.split_vertically(420);
    if !report.b7.is_empty() {
        let calls: Vec<f64> = report
            .b7
            .iter()
            .flat_map(|&(_, plain, reference, idem)| [Some(plain), reference, Some(idem)])
            .flatten()
            .collect();
        let (lowest, highest) = (
            calls.iter().copied().fold(f64::MAX, f64::min),
            calls.iter().copied().fold(0.0, f64::max),
        );
        let tasks: Vec<f64> = report.b7.iter().map(|p| p.0 as f64).collect();
        let mut chart = panel(&top, "B7, PostgreSQL: record mode, bare INSERT")
            .build_cartesian_2d(
                (0.8f64..80.0).log_scale().with_key_points(tasks),
                (lowest * 0.7..highest * 1.5).log_scale(),
            )?;
        chart
            .configure_mesh()
            .x_desc("tasks (and connections, and pgbench clients)")
            .y_desc("calls per second (log scale)")
            .x_label_formatter(&|x| format!("{x:.0}"))
            .y_label_formatter(&|y| format!("{y:.0}"))
            .draw()?;
        let curves = [
            (
                "plain (no attribute)",
                BLUE,
                report
                    .b7
                    .iter()
                    .map(|p| Some((p.0 as f64, p.1)))
                    .collect::<Vec<_>>(),
            ),
            (
                "reference (pgbench)",
                REFERENCE,
                report
                    .b7
                    .iter()
                    .map(|p| p.2.map(|r| (p.0 as f64, r)))
                    .collect(),
            ),
            (
                "idem, record mode",
                RED,
                report.b7.iter().map(|p| Some((p.0 as f64, p.3))).collect(),
            ),
        ];
        for (name, color, points) in curves {
            let points: Vec<(f64, f64)> = points.into_iter().flatten().collect();
            chart
                .draw_series(LineSeries::new(points.clone(), color.stroke_width(2)))?
                .label(name)
                .legend(move |(x, y)| {
                    PathElement::new(vec![(x, y), (x + 20, y)], color.stroke_width(2))
                });
            chart.draw_series(
                points
                    .into_iter()
                    .map(|p| Circle::new(p, 4, color.filled())),
            )?;
        }
        chart
            .configure_series_labels()
            .position(SeriesLabelPosition::UpperLeft)
            .background_style(WHITE)
            .border_style(BLACK)
            .draw()?;
    }
    if !report.b1.is_empty() {
        let labels: Vec<&str> = report
            .b1
            .iter()
            .map(|(label, _, _)| label.as_str())
            .collect();
        let highest = report
            .b1
            .iter()
            .flat_map(|&(_, idem, reference)| [idem, reference.unwrap_or(0.0)])
            .fold(0.0, f64::max);
        let mut chart = panel(
            &bottom,
            "B1, first execution, bare write (INSERT, Redis INCRBY): throughput / plain calls",
        )
        // Integer ranges are inclusive: one segment per label.
        .build_cartesian_2d(
            (0..labels.len() - 1).into_segmented(),
            0f64..(highest * 1.2).max(0.1),
        )?;
        chart
            .configure_mesh()
            .x_labels(labels.len())
            .x_label_formatter(&|v| match v {
                SegmentValue::CenterOf(i) => labels.get(*i).copied().unwrap_or_default().to_owned(),
                _ => String::new(),
            })
            .y_desc("ratio to plain calls")
            .draw()?;
        let at = |i: usize, ratio: f64| (SegmentValue::CenterOf(i), ratio);
        chart
            .draw_series(
                report
                    .b1
                    .iter()
                    .enumerate()
                    .map(|(i, p)| Circle::new(at(i, p.1), 6, RED.filled())),
            )?
            .label("idem")
            .legend(|(x, y)| Circle::new((x + 10, y), 6, RED.filled()));
        chart
            .draw_series(report.b1.iter().enumerate().filter_map(|(i, p)| {
                p.2.map(|r| Cross::new(at(i, r), 7, REFERENCE.stroke_width(3)))
            }))?
            .label("reference")
            .legend(|(x, y)| Cross::new((x + 10, y), 7, REFERENCE.stroke_width(3)));
        chart
            .configure_series_labels()
            .position(SeriesLabelPosition::UpperRight)
            .background_style(WHITE)
            .border_style(BLACK)
            .draw()?;
    }
    root.present()?;
    Ok(())
}

/// One of the chart's panels, with its caption.
fn panel<'a, 'b, DB: plotters::prelude::DrawingBackend>(
    area: &'a plotters::prelude::DrawingArea<DB, plotters::coord::Shift>,
    caption: &str,
) -> plotters::prelude::ChartBuilder<'a, 'b, DB> {
    let mut builder = plotters::prelude::ChartBuilder::on(area);
    builder
        .caption(caption, ("sans-serif", 20))
        .margin(15)
        .x_label_area_size(40)
        .y_label_area_size(70);
    builder
}

fn cmd(program: &str, args: &[&str]) -> String {
    std::process::Command::new(program)
        .args(args)
        .output()
        .ok()
        .map(|o| String::from_utf8_lossy(&o.stdout).trim().to_owned())
        .filter(|s| !s.is_empty())
        .unwrap_or_else(|| format!("{program}: unknown"))
}

fn table_name(tag: &str, what: &str) -> String {
    static N: AtomicUsize = AtomicUsize::new(0);
    format!(
        "idem_bench_{tag}_{what}_{}_{}",
        std::process::id(),
        N.fetch_add(1, Ordering::Relaxed)
    )
}
