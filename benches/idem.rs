//! The benchmark harness:
//! `cargo bench --bench idem --features sqlite,postgres,mysql`.
//!
//! Every figure is a ratio of two measurements taken side by side in the
//! same run: baseline and subject alternate in rounds (A B, then B A), and
//! the median of the per-round ratios is reported, since the machine is
//! shared and noisy. The table is printed and written to `BENCHMARKS.md`
//! (anything below the `<!-- notes -->` line of that file is kept).
//!
//! Servers: `IDEM_POSTGRES_URL` and `IDEM_MYSQL_URL` (local defaults as in
//! the tests); SQLite is a file in a temporary directory. `IDEM_BENCH_QUICK=1`
//! shortens every measurement (for trying the harness, not for figures).
//! `IDEM_BENCH_ONLY=postgres` (or `sqlite`, `mariadb`, comma-separated) runs
//! some backends only.

use std::fmt::Write as _;
use std::future::Future;
use std::sync::atomic::{AtomicUsize, Ordering};
use std::sync::Arc;
use std::time::{Duration, Instant, SystemTime, UNIX_EPOCH};

use idem::{idempotent, Fingerprint, Store};
use tokio::sync::Barrier;

const CONCURRENCY: usize = 4;

#[derive(Debug, thiserror::Error)]
pub enum PayError {
    #[error("database: {0}")]
    Db(#[from] sqlx::Error),
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

fn unique(tag: &str) -> String {
    static N: AtomicUsize = AtomicUsize::new(0);
    format!(
        "{tag}-{}-{}-{}",
        std::process::id(),
        SystemTime::now()
            .duration_since(UNIX_EPOCH)
            .unwrap()
            .as_millis(),
        N.fetch_add(1, Ordering::Relaxed)
    )
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

/// Operations per second of `ops` calls of `op` spread over
/// `CONCURRENCY` tasks.
async fn throughput<F, Fut>(ops: usize, op: F) -> f64
where
    F: Fn() -> Fut + Clone + Send + 'static,
    Fut: Future<Output = ()> + Send,
{
    let start = Instant::now();
    let tasks: Vec<_> = (0..CONCURRENCY)
        .map(|_| {
            let op = op.clone();
            tokio::spawn(async move {
                for _ in 0..ops / CONCURRENCY {
                    op().await;
                }
            })
        })
        .collect();
    for t in tasks {
        t.await.unwrap();
    }
    (ops / CONCURRENCY * CONCURRENCY) as f64 / start.elapsed().as_secs_f64()
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
    let (mut ratios, mut base, mut subj) = (Vec::new(), Vec::new(), Vec::new());
    for round in 0..rounds() {
        let (a, b) = if round % 2 == 0 {
            let a = baseline().await;
            (a, subject().await)
        } else {
            let b = subject().await;
            (baseline().await, b)
        };
        ratios.push(b / a);
        base.push(a);
        subj.push(b);
    }
    (median(ratios), median(base), median(subj))
}

/// One row of the result table.
struct Row {
    id: &'static str,
    backend: &'static str,
    what: String,
    measured: String,
    goal: &'static str,
    met: Option<bool>,
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
                pub pool: sqlx::Pool<$db>,
                pub table: String,
                pub cta: String,
                /// The business INSERT.
                insert: String,
            }

            impl Payments {
                pub async fn new(dir: &tempfile::TempDir, tag: &str) -> Self {
                    Self::setup($connect(&DIALECT, dir).await, tag).await
                }

                /// The store and the tables, all of their own.
                pub async fn setup(pool: sqlx::Pool<$db>, tag: &str) -> Self {
                    let records = table_name(tag, "rec");
                    let store = <$store>::new(pool.clone())
                        .with_table_name(&records)
                        .unwrap();
                    store.migrate().await.unwrap();
                    let (table, cta) = (table_name(tag, "pay"), table_name(tag, "cta"));
                    sqlx::raw_sql(&DIALECT.tables.replace("{pay}", &table).replace("{cta}", &cta))
                        .execute(&pool)
                        .await
                        .unwrap();
                    let insert = format!(
                        "INSERT INTO {table} (pay_key, amount) VALUES ({}, {})",
                        Self::p(1),
                        Self::p(2)
                    );
                    Payments {
                        store,
                        pool,
                        table,
                        cta,
                        insert,
                    }
                }

                fn p(n: usize) -> String {
                    (DIALECT.param)(n)
                }

                /// The business INSERT on `executor`, then a body that
                /// takes `body`.
                async fn insert<'e, E>(&'e self, executor: E, key: &str, amount: i64, body: Duration) -> Result<i64, PayError>
                where
                    E: sqlx::Executor<'e, Database = $db>,
                {
                    sqlx::query(&self.insert).bind(key).bind(amount).execute(executor).await?;
                    if !body.is_zero() {
                        tokio::time::sleep(body).await;
                    }
                    Ok(amount)
                }

                pub async fn plain(&self, key: &str, amount: i64, body: Duration) -> Result<i64, PayError> {
                    self.insert(&self.pool, key, amount, body).await
                }

                #[idempotent(key = key, store = self.store, scope = "bench.pay", fingerprint = amount,
                             lease = "60s", wait = "30s")]
                pub async fn record(&self, key: &str, amount: i64, body: Duration) -> Result<i64, PayError> {
                    self.insert(&self.pool, key, amount, body).await
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

                #[idempotent(key = key, store = self.store, tx = tx, scope = "bench.pay_tx",
                             fingerprint = amount)]
                pub async fn in_tx(
                    &self,
                    tx: &mut sqlx::Transaction<'_, $db>,
                    key: &str,
                    amount: i64,
                    body: Duration,
                ) -> Result<i64, PayError> {
                    self.insert(&mut **tx, key, amount, body).await
                }

                #[idempotent(key = key, store = self.store, scope = "bench.dup", fingerprint = amount,
                             lease = "60s", wait = "30s")]
                pub async fn dup(&self, key: &str, amount: i64, ran: &std::sync::atomic::AtomicBool, runs: &AtomicUsize) -> Result<i64, PayError> {
                    ran.store(true, Ordering::SeqCst);
                    runs.fetch_add(1, Ordering::SeqCst);
                    tokio::time::sleep(Duration::from_millis(50)).await;
                    Ok(amount)
                }

                /// B8: entity mode, the row itself keeping the token.
                #[idempotent(key = key, store = self.pool, entity, fingerprint = amount)]
                pub async fn entity_charge(&self, key: &str, amount: i64, body: Duration) -> Result<EntityCharge, PayError> {
                    tokio::time::sleep(body).await;
                    Ok(EntityCharge { token: key.to_owned(), amount })
                }

                pub async fn call(self: &Arc<Self>, mode: Mode, body: Duration) {
                    self.call_key(mode, &unique("pay"), body).await
                }

                pub async fn call_key(self: &Arc<Self>, mode: Mode, key: &str, body: Duration) {
                    let key = key.to_owned();
                    let done = match mode {
                        Mode::Plain => self.plain(&key, 500, body).await,
                        Mode::Record => self.record(&key, 500, body).await,
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

            impl Bench for Payments {
                fn label(&self) -> &'static str {
                    DIALECT.label
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
                fn duplicate(
                    self: &Arc<Self>,
                    key: &str,
                    runs: Arc<AtomicUsize>,
                ) -> impl Future<Output = bool> + Send {
                    let (this, key) = (self.clone(), key.to_owned());
                    async move {
                        let ran = std::sync::atomic::AtomicBool::new(false);
                        this.dup(&key, 1, &ran, &runs).await.unwrap();
                        ran.load(Ordering::SeqCst)
                    }
                }
                fn entity_call(self: &Arc<Self>, key: &str, body: Duration) -> impl Future<Output = ()> + Send {
                    let (this, key) = (self.clone(), key.to_owned());
                    async move {
                        let row = this.entity_charge(&key, 500, body).await.unwrap();
                        assert_eq!((row.token.as_str(), row.amount), (key.as_str(), 500));
                    }
                }
                fn entity_setup(&self) -> impl Future<Output = ()> + Send {
                    async move {
                        sqlx::raw_sql(DIALECT.entity_table).execute(&self.pool).await.unwrap();
                    }
                }
                fn check_then_act(self: &Arc<Self>) -> impl Future<Output = ()> + Send {
                    let this = self.clone();
                    async move { this.cta_call(&unique("cta")).await }
                }
                fn fresh(&self, tag: &str) -> impl Future<Output = Self> + Send {
                    let tag = tag.to_owned();
                    let pool = self.pool.clone();
                    async move { Payments::setup(pool, &tag).await }
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
    PlainTx,
    Tx,
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
    },
    connect_sqlite
);

/// A pool of 16 connections on the dialect's server.
async fn server_pool<DB: sqlx::Database>(
    dialect: &Dialect,
    _dir: &tempfile::TempDir,
) -> sqlx::Pool<DB> {
    let (var, default) = dialect.server.expect("a backend on a server");
    let url = std::env::var(var).unwrap_or_else(|_| default.to_owned());
    sqlx::pool::PoolOptions::<DB>::new()
        .max_connections(16)
        .connect(&url)
        .await
        .unwrap_or_else(|e| panic!("{} at {url} ({var}): {e}", dialect.label))
}

/// The SQLite store's own pool, on a file in `dir`.
async fn connect_sqlite(_dialect: &Dialect, dir: &tempfile::TempDir) -> sqlx::SqlitePool {
    let url = format!("sqlite://{}", dir.path().join("bench.db").display());
    let store = idem::SqliteStore::connect(&url).await.unwrap();
    store.pool().clone()
}

/// What the generic measurements need from a backend.
trait Bench: Send + Sync + Sized + 'static {
    fn label(&self) -> &'static str;
    fn call(self: &Arc<Self>, mode: Mode, body: Duration) -> impl Future<Output = ()> + Send;
    fn call_key(self: &Arc<Self>, mode: Mode, key: &str) -> impl Future<Output = ()> + Send;
    fn store(&self) -> Arc<dyn Store>;
    /// One call of B4; answers whether it ran the body.
    fn duplicate(
        self: &Arc<Self>,
        key: &str,
        runs: Arc<AtomicUsize>,
    ) -> impl Future<Output = bool> + Send;
    /// Creates B8's entity table.
    fn entity_setup(&self) -> impl Future<Output = ()> + Send;
    /// One entity-mode call of B8.
    fn entity_call(self: &Arc<Self>, key: &str, body: Duration) -> impl Future<Output = ()> + Send;
    /// The usual recipe: read the key, take a lock, write.
    fn check_then_act(self: &Arc<Self>) -> impl Future<Output = ()> + Send;
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

/// B1: first execution throughput, attribute vs none.
async fn b1<B: Bench>(b: &Arc<B>, rows: &mut Vec<Row>) {
    let ops = if quick() { 80 } else { 400 };
    let slow_ops = if quick() { 16 } else { 48 };
    let cases: [(&str, Mode, Mode, Duration, usize, &str, f64); 4] = [
        (
            "transactional, bare INSERT",
            Mode::PlainTx,
            Mode::Tx,
            Duration::ZERO,
            ops,
            ">= 0.50",
            0.5,
        ),
        (
            "record mode, bare INSERT",
            Mode::Plain,
            Mode::Record,
            Duration::ZERO,
            ops,
            ">= 0.35",
            0.35,
        ),
        (
            "transactional, 20 ms body",
            Mode::PlainTx,
            Mode::Tx,
            Duration::from_millis(20),
            slow_ops,
            ">= 0.95",
            0.95,
        ),
        (
            "record mode, 20 ms body",
            Mode::Plain,
            Mode::Record,
            Duration::from_millis(20),
            slow_ops,
            ">= 0.95",
            0.95,
        ),
    ];
    for (what, base, subj, body, n, goal, target) in cases {
        let (ratio, a, s) = interleave(
            || {
                let b = b.clone();
                throughput(n, move || {
                    let b = b.clone();
                    async move { b.call(base, body).await }
                })
            },
            || {
                let b = b.clone();
                throughput(n, move || {
                    let b = b.clone();
                    async move { b.call(subj, body).await }
                })
            },
        )
        .await;
        rows.push(Row {
            id: "B1",
            backend: b.label(),
            what: format!("first execution, {what}: throughput vs no attribute ({s:.0} vs {a:.0} calls/s, {CONCURRENCY} tasks)"),
            measured: format!("{ratio:.2}"),
            goal,
            met: Some(ratio >= target),
        });
    }
}

/// B2: replay latency vs first execution (record mode, one caller).
async fn b2<B: Bench>(b: &Arc<B>, rows: &mut Vec<Row>) {
    let n = if quick() { 20 } else { 100 };
    let mut ratios = Vec::new();
    let (mut firsts, mut replays) = (Vec::new(), Vec::new());
    for _ in 0..rounds() {
        let keys: Vec<String> = (0..n).map(|_| unique("b2")).collect();
        let mut first = Vec::new();
        for k in &keys {
            let t = Instant::now();
            b.call_key(Mode::Record, k).await;
            first.push(t.elapsed().as_secs_f64() * 1e3);
        }
        let mut replay = Vec::new();
        for k in &keys {
            let t = Instant::now();
            b.call_key(Mode::Record, k).await;
            replay.push(t.elapsed().as_secs_f64() * 1e3);
        }
        let (f, r) = (median(first), median(replay));
        ratios.push(r / f);
        firsts.push(f);
        replays.push(r);
    }
    let ratio = median(ratios);
    rows.push(Row {
        id: "B2",
        backend: b.label(),
        what: format!(
            "replay latency vs first execution, record mode ({:.2} ms vs {:.2} ms, median)",
            median(replays),
            median(firsts)
        ),
        measured: format!("{ratio:.2}"),
        goal: "<= 0.20",
        met: Some(ratio <= 0.2),
    });
}

/// B3: idem's record mode vs check-then-act (read the key, lock, write).
async fn b3<B: Bench>(b: &Arc<B>, rows: &mut Vec<Row>) {
    let ops = if quick() { 80 } else { 400 };
    let (ratio, a, s) = interleave(
        || {
            let b = b.clone();
            throughput(ops, move || {
                let b = b.clone();
                async move { b.check_then_act().await }
            })
        },
        || {
            let b = b.clone();
            throughput(ops, move || {
                let b = b.clone();
                async move { b.call(Mode::Record, Duration::ZERO).await }
            })
        },
    )
    .await;
    rows.push(Row {
        id: "B3",
        backend: b.label(),
        what: format!(
            "record mode vs check-then-act (SELECT key, lock, INSERT record, business INSERT, UPDATE, unlock): throughput ({s:.0} vs {a:.0} calls/s)"
        ),
        measured: format!("{ratio:.2}"),
        goal: "(> 1 = idem faster)",
        met: None,
    });
}

/// B4: 64 calls on one key released at once.
async fn b4<B: Bench>(b: &Arc<B>, rows: &mut Vec<Row>) {
    const CALLS: usize = 64;
    let mut lags = Vec::new();
    let mut max_runs = 0;
    for _ in 0..rounds() {
        let key = unique("b4");
        let runs = Arc::new(AtomicUsize::new(0));
        let barrier = Arc::new(Barrier::new(CALLS));
        let tasks: Vec<_> = (0..CALLS)
            .map(|_| {
                let (b, key, runs, barrier) =
                    (b.clone(), key.clone(), runs.clone(), barrier.clone());
                tokio::spawn(async move {
                    barrier.wait().await;
                    let won = b.duplicate(&key, runs).await;
                    (won, Instant::now())
                })
            })
            .collect();
        let mut done = Vec::new();
        for t in tasks {
            done.push(t.await.unwrap());
        }
        max_runs = max_runs.max(runs.load(Ordering::SeqCst));
        let winner = done
            .iter()
            .find(|(won, _)| *won)
            .map(|(_, at)| *at)
            .expect("a winner");
        for (won, at) in done {
            if !won {
                lags.push(at.saturating_duration_since(winner).as_secs_f64() * 1e3);
            }
        }
    }
    let p50 = percentile(&mut lags, 0.5);
    let p99 = percentile(&mut lags, 0.99);
    rows.push(Row {
        id: "B4",
        backend: b.label(),
        what: format!(
            "{CALLS} concurrent calls on one key: body runs per key (max over {} rounds)",
            rounds()
        ),
        measured: format!("{max_runs}"),
        goal: "1",
        met: Some(max_runs == 1),
    });
    rows.push(Row {
        id: "B4",
        backend: b.label(),
        what: format!(
            "winner's return to each waiter's return: p50 {p50:.2} ms, p99 (n = {})",
            lags.len()
        ),
        measured: format!("{p99:.2} ms"),
        goal: "<= 10 ms",
        met: Some(p99 <= 10.0),
    });
}

/// B8: entity mode, 20 distinct keys at once, each body taking 200 ms:
/// the wall time of the 20 against one body. Unrelated tokens must not
/// wait for each other.
async fn b8<B: Bench>(b: &Arc<B>, rows: &mut Vec<Row>) {
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
    rows.push(Row {
        id: "B8",
        backend: b.label(),
        what: format!(
            "entity mode, {CALLS} distinct keys at once, 200 ms body: wall time in bodies (median of {} rounds)",
            rounds()
        ),
        measured: format!("{ratio:.2}"),
        goal: "<= 1.5",
        met: Some(ratio <= 1.5),
    });
}

/// B5: replay latency with 10 thousand vs 1 million stored records, and
/// the purge rate while claims run.
async fn b5<B: Bench>(b: &Arc<B>, rows: &mut Vec<Row>) {
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
    rows.push(Row {
        id: "B5",
        backend: b.label(),
        what: format!(
            "replay latency with {large} vs {small} stored records ({s:.2} vs {a:.2} ms; bulk-loaded in {load:.0} s by one INSERT ... SELECT)"
        ),
        measured: format!("{ratio:.2}"),
        goal: "<= 1.5",
        met: Some(ratio <= 1.5),
    });

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
    rows.push(Row {
        id: "B5",
        backend: b.label(),
        what: format!(
            "purge of {purged} expired records in batches of 1000 while {CONCURRENCY} tasks claim ({:.0} claims/s meanwhile)",
            claims.load(Ordering::Relaxed) as f64 / secs
        ),
        measured: format!("{:.0} records/s", purged as f64 / secs),
        goal: "-",
        met: None,
    });
    for bb in [small_b, large_b, purge_b] {
        bb.drop_tables().await;
    }
}

/// B6: the memory store's cost per call vs a plain function call.
async fn b6(rows: &mut Vec<Row>) {
    #[inline(never)]
    async fn plain(amount: i64) -> Result<i64, idem::Error> {
        Ok(std::hint::black_box(amount))
    }
    let store = idem::MemoryStore::new();
    let n = if quick() { 20_000 } else { 200_000 };
    let (mut first, mut replay, mut base) = (Vec::new(), Vec::new(), Vec::new());
    for _ in 0..rounds() {
        let t = Instant::now();
        for _ in 0..n {
            std::hint::black_box(plain(500).await.unwrap());
        }
        base.push(t.elapsed().as_secs_f64() * 1e9 / n as f64);
        let keys: Vec<String> = (0..n).map(|i| format!("m{i}-{}", unique("b6"))).collect();
        let t = Instant::now();
        for k in &keys {
            let r: Result<i64, idem::Error> = idem::run(
                &store,
                idem::Call::new("bench.mem", k.as_str(), &500i64),
                plain(500),
            )
            .await;
            std::hint::black_box(r.unwrap());
        }
        first.push(t.elapsed().as_secs_f64() * 1e9 / n as f64);
        let t = Instant::now();
        for k in &keys {
            let r: Result<i64, idem::Error> = idem::run(
                &store,
                idem::Call::new("bench.mem", k.as_str(), &500i64),
                plain(500),
            )
            .await;
            std::hint::black_box(r.unwrap());
        }
        replay.push(t.elapsed().as_secs_f64() * 1e9 / n as f64);
    }
    let (b, f, r) = (median(base), median(first), median(replay));
    rows.push(Row {
        id: "B6",
        backend: "memory",
        what: format!("cost per call: first execution {f:.0} ns, replay {r:.0} ns, plain async fn call {b:.1} ns"),
        measured: format!("+{:.2} µs", (f - b) / 1e3),
        goal: "-",
        met: None,
    });
}

fn main() {
    let runtime = tokio::runtime::Builder::new_multi_thread()
        .worker_threads(2)
        .enable_all()
        .build()
        .unwrap();
    runtime.block_on(main_async());
}

async fn each<B: Bench>(b: &Arc<B>, rows: &mut Vec<Row>) {
    let t = Instant::now();
    b1(b, rows).await;
    b2(b, rows).await;
    b3(b, rows).await;
    b4(b, rows).await;
    b5(b, rows).await;
    b8(b, rows).await;
    b.drop_tables().await;
    eprintln!("{} done in {:.0} s", b.label(), t.elapsed().as_secs_f64());
}

async fn main_async() {
    let started = Instant::now();
    let date = cmd("date", &["-u", "+%Y-%m-%d %H:%M UTC"]);
    let load_before = std::fs::read_to_string("/proc/loadavg").unwrap_or_default();
    let mut rows = Vec::new();
    let dir = tempfile::tempdir().unwrap();
    let only = std::env::var("IDEM_BENCH_ONLY").unwrap_or_default();
    let wanted = |backend: &str| only.is_empty() || only.contains(backend);
    if wanted("sqlite") {
        each(&Arc::new(lite::Payments::new(&dir, "b").await), &mut rows).await;
    }
    if wanted("postgres") {
        each(&Arc::new(pg::Payments::new(&dir, "b").await), &mut rows).await;
    }
    if wanted("mariadb") {
        each(&Arc::new(my::Payments::new(&dir, "b").await), &mut rows).await;
    }
    b6(&mut rows).await;
    let load_after = std::fs::read_to_string("/proc/loadavg").unwrap_or_default();

    let mut table = String::new();
    let _ = writeln!(table, "| | backend | measurement | measured | goal | met |");
    let _ = writeln!(table, "|---|---|---|---|---|---|");
    for r in &rows {
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
    let loadavg = |s: &str| s.split_whitespace().take(3).collect::<Vec<_>>().join(" ");
    let notes = std::fs::read_to_string("BENCHMARKS.md")
        .ok()
        .and_then(|old| old.find("<!-- notes -->").map(|i| old[i..].to_owned()))
        .unwrap_or_else(|| "<!-- notes -->\n".to_owned());
    let mut md = String::new();
    let _ = writeln!(md, "# Benchmarks\n");
    let _ = writeln!(
        md,
        "Made by `cargo bench --bench idem --features sqlite,postgres,mysql{}` on {date}, in {:.0} s.\n",
        if quick() { " (IDEM_BENCH_QUICK=1)" } else { "" },
        started.elapsed().as_secs_f64()
    );
    let _ = writeln!(md, "- machine: {nproc} CPUs ({cpu}), {mem} of memory");
    let _ = writeln!(
        md,
        "- servers: {pg_version}; {my_version}; SQLite (bundled with sqlx) on a file in WAL mode"
    );
    let _ = writeln!(
        md,
        "- load average (1, 5, 15 min) before: {}; after: {}",
        loadavg(&load_before),
        loadavg(&load_after)
    );
    let _ = writeln!(
        md,
        "- every ratio is the median of {} per-round ratios, baseline and subject alternating (A B, B A, ...) in one run; throughput with {CONCURRENCY} tasks\n",
        rounds()
    );
    let _ = writeln!(md, "{table}");
    md.push_str(&notes);
    std::fs::write("BENCHMARKS.md", md).unwrap();
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
