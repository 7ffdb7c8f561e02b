//! The SQL backends (PostgreSQL, MariaDB, SQLite): what differs between
//! them ([`Dialect`]), and one module of each, made by `backend!`, whose
//! `Payments` makes the rows' calls on its store and its tables.

use std::future::Future;
use std::path::{Path, PathBuf};
use std::sync::atomic::{AtomicUsize, Ordering};
use std::sync::Arc;
use std::time::Duration;

use idem::{idempotent, Fingerprint, Store};

use super::calls::{outside_tx, Bench, Calls, Mode, PayError};
use super::dialect::Dialect;
use super::goal::{Goal, Goals};
use super::measure::Span;
use super::reference::{
    param_value, pgbench, reference_status, Client, RefSql, Script, Sql, Val, REPLAY_KEY,
};
use super::{take, unique};

/// B8's business row: entity mode keeps the token in the row itself.
#[derive(idem::Entity, sqlx::FromRow)]
#[idem(table = "bench_entity_charges")]
pub struct EntityCharge {
    #[idem(token)]
    pub token: String,
    pub amount: i64,
}

/// One backend: "create payment" (one business INSERT, with or without the
/// attribute, in record mode and in transactional mode), check-then-act,
/// and the bulk load, on `$store` through a pool of `$db`.
macro_rules! backend {
    ($name:ident, $db:ty, $store:ty, $dialect:expr, $connect:path) => {
        pub mod $name {
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

                /// B4''s child process's backend: the records table
                /// `records` of the parent, through a pool of its own.
                pub async fn for_child(dir: &Path, records: &str) -> Self {
                    let pool = $connect(&DIALECT, dir, 16).await;
                    // B4 only calls `dup`, which writes no business row.
                    Self::open(pool, dir, records, String::new(), String::new())
                }

                /// The reference's statements. The first use makes one
                /// call, on `REPLAY_KEY`, to see whether the claim returns
                /// a row; that call's record is the one replays read.
                async fn reference_sql(&self) -> &RefSql {
                    self.reference
                        .get_or_init(|| async {
                            let named = self.store.reference_statements();
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
                                tx_read: self.store.transactional_read(),
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
                                self.insert(&mut *tx, &key, 500, body).await
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
                    let (cta, p1, p2) = (&self.cta, Self::p(1), Self::p(2));
                    let mut conn = self.pool.acquire().await.unwrap();
                    let read = format!("SELECT outcome FROM {cta} WHERE k = {p1}");
                    let found: Option<Option<Vec<u8>>> = sqlx::query_scalar(&read)
                        .bind(key)
                        .fetch_optional(&mut *conn)
                        .await
                        .unwrap();
                    if found.is_some() {
                        return;
                    }
                    let on_key = |statement: &'static str| {
                        let query = sqlx::query(statement);
                        if statement.contains(&p1) {
                            query.bind(key)
                        } else {
                            query
                        }
                    };
                    on_key(DIALECT.lock).execute(&mut *conn).await.unwrap();
                    let claim = format!("INSERT INTO {cta} (k, state) VALUES ({p1}, 'in_progress')");
                    let business = sqlx::query(&self.insert).bind(key).bind(500i64);
                    let complete =
                        format!("UPDATE {cta} SET state = 'completed', outcome = {p1} WHERE k = {p2}");
                    for query in [
                        sqlx::query(&claim).bind(key),
                        business,
                        sqlx::query(&complete).bind(&b"500"[..]).bind(key),
                    ] {
                        query.execute(&mut *conn).await.unwrap();
                    }
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
                    reference_status(&DIALECT.reference)
                }
                /// The store's statements on the pool.
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
                            if self.store.transactional_read() == Some(true) =>
                        {
                            Some(("without the read beside", Script::TxWithoutRead(body)))
                        }
                        _ => None,
                    }
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
pub fn server_url(dialect: &Dialect) -> String {
    let (var, default) = dialect.server.expect("a backend on a server");
    std::env::var(var).unwrap_or_else(|_| default.to_owned())
}

/// A pool of `connections` connections on the dialect's server.
pub async fn server_pool<DB: sqlx::Database>(
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
pub async fn connect_sqlite(_dialect: &Dialect, dir: &Path, _connections: u32) -> sqlx::SqlitePool {
    let url = format!("sqlite://{}", dir.join("bench.db").display());
    let store = idem::SqliteStore::connect(&url).await.unwrap();
    store.pool().clone()
}

pub fn table_name(tag: &str, what: &str) -> String {
    static N: AtomicUsize = AtomicUsize::new(0);
    format!(
        "idem_bench_{tag}_{what}_{}_{}",
        std::process::id(),
        N.fetch_add(1, Ordering::Relaxed)
    )
}
