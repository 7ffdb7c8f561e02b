//! The SQLite store: the embedded default.

use std::str::FromStr;
use std::sync::Arc;
use std::time::Duration;

use async_trait::async_trait;
use sqlx::sqlite::{
    SqliteConnectOptions, SqliteConnection, SqliteJournalMode, SqlitePool, SqlitePoolOptions,
    SqliteRow,
};
use sqlx::{Connection, Executor, Row};

use super::sql::{
    beside, millis, render, unsettled, validate_table_name, StoredRecord, CLAIM_ROUNDS,
    DEFAULT_TABLE,
};
use super::{BeginRequest, Store, Waiters};
use crate::error::Error;
use crate::key::{Key, Scope};
use crate::record::{decide, now_millis, Begin, Claim, Millis, Outcome, Record};

/// The embedded migrations, in order. `{table}` is the records table.
const MIGRATIONS: &[&str] = &[
    r#"
CREATE TABLE IF NOT EXISTS "{table}" (
    scope        TEXT    NOT NULL,
    key          TEXT    NOT NULL,
    fingerprint  BLOB    NOT NULL,
    state        TEXT    NOT NULL CHECK (state IN ('in_progress', 'completed')),
    fence        INTEGER NOT NULL,
    lease_until  INTEGER,
    outcome_kind INTEGER,
    outcome      BLOB,
    created_at   INTEGER NOT NULL,
    expires_at   INTEGER NOT NULL,
    PRIMARY KEY (scope, key),
    CHECK (state = 'in_progress' OR outcome IS NOT NULL)
);
CREATE INDEX IF NOT EXISTS "{table}_expires_at" ON "{table}" (expires_at);
"#,
    // The claim's identity, checked by every fenced write (NULL on rows
    // written before it existed: they can only lapse and be taken over).
    r#"ALTER TABLE "{table}" ADD COLUMN claim_token BLOB;
"#,
];

/// The database's clock in milliseconds since the Unix epoch (SQLite's
/// `'now'` is the same within one statement): every lease and expiry is
/// decided with it.
const NOW: &str = "CAST(ROUND((julianday('now') - 2440587.5) * 86400000.0) AS INTEGER)";

/// Records in a SQLite database through a sqlx pool.
///
/// The claim is one `INSERT ... ON CONFLICT (scope, key) DO UPDATE ... WHERE
/// <expired or lease lapsed> RETURNING fence` statement: the primary key on
/// `(scope, key)` decides, so any number of connections or processes sharing
/// the database file claim a key once. File databases use WAL and a busy
/// timeout so that concurrent writers queue instead of failing.
///
/// Duplicates waiting in this process are woken as soon as the first call
/// completes; those in other processes notice at their next poll.
///
/// ```
/// # tokio::runtime::Runtime::new().unwrap().block_on(async {
/// use idem::SqliteStore;
/// let store = SqliteStore::connect("sqlite::memory:").await?;
/// let audit = SqliteStore::new(store.pool().clone())
///     .with_table_name("audit_idempotency")?;
/// audit.migrate().await?;
/// # Ok::<_, idem::Error>(())
/// # }).unwrap();
/// ```
#[derive(Clone, Debug)]
pub struct SqliteStore {
    pool: SqlitePool,
    sql: Arc<Statements>,
    waiters: Arc<Waiters>,
}

#[derive(Debug)]
struct Statements {
    table: String,
    claim: String,
    select: String,
    renew: String,
    complete: String,
    release: String,
    purge: String,
}

impl Statements {
    fn new(table: String) -> Self {
        let r = |sql: &str| render(sql, &table).replace("{now}", NOW);
        Statements {
            // `WHERE true` tells SQLite's parser that `ON CONFLICT` belongs
            // to the upsert, not to the SELECT's join.
            claim: r(r#"INSERT INTO "{table}"
                    (scope, key, fingerprint, state, fence, claim_token, lease_until,
                     created_at, expires_at)
                SELECT ?1, ?2, ?3, 'in_progress', 1, ?4, c.now + ?5, c.now, c.now + max(?5, ?6)
                FROM (SELECT {now} AS now) AS c WHERE true
                ON CONFLICT (scope, key) DO UPDATE SET
                    fingerprint = excluded.fingerprint,
                    state = 'in_progress',
                    fence = "{table}".fence + 1,
                    claim_token = excluded.claim_token,
                    lease_until = excluded.lease_until,
                    outcome_kind = NULL,
                    outcome = NULL,
                    created_at = excluded.created_at,
                    expires_at = excluded.expires_at
                WHERE "{table}".expires_at <= excluded.created_at
                   OR ("{table}".state = 'in_progress'
                       AND "{table}".lease_until <= excluded.created_at
                       AND "{table}".fingerprint = excluded.fingerprint)
                RETURNING fence"#),
            select: r(
                r#"SELECT scope, key, fingerprint, state, fence, claim_token, lease_until,
                       outcome_kind, outcome, created_at, expires_at, {now} AS db_now
                FROM "{table}" WHERE scope = ?1 AND key = ?2"#,
            ),
            renew: r(r#"UPDATE "{table}"
                SET lease_until = {now} + ?4, expires_at = max(expires_at, {now} + ?4)
                WHERE scope = ?1 AND key = ?2 AND claim_token = ?3 AND state = 'in_progress'"#),
            complete: r(r#"UPDATE "{table}"
                SET state = 'completed', outcome_kind = ?1, outcome = ?2,
                    lease_until = NULL, expires_at = {now} + ?3
                WHERE scope = ?4 AND key = ?5 AND claim_token = ?6
                  AND (state = 'in_progress'
                       OR (state = 'completed' AND outcome_kind = ?1 AND outcome = ?2))"#),
            release: r(r#"DELETE FROM "{table}"
                WHERE scope = ?1 AND key = ?2 AND claim_token = ?3 AND state = 'in_progress'"#),
            purge: r(r#"DELETE FROM "{table}" WHERE rowid IN
                (SELECT rowid FROM "{table}" WHERE expires_at <= {now} LIMIT ?1)"#),
            table,
        }
    }
}

impl SqliteStore {
    /// Opens (creating if missing) the database at `url` (`sqlite://path`,
    /// `sqlite:path`, or `sqlite::memory:`), and applies the migrations to
    /// the default table `idem_records`.
    ///
    /// An in-memory database lives in one connection that the pool never
    /// closes, so it lasts as long as the store.
    pub async fn connect(url: &str) -> Result<Self, Error> {
        let options = SqliteConnectOptions::from_str(url)?
            .create_if_missing(true)
            .busy_timeout(Duration::from_secs(10));
        let in_memory = url.contains(":memory:") || url.contains("mode=memory");
        let pool = if in_memory {
            SqlitePoolOptions::new()
                .max_connections(1)
                .min_connections(1)
                .idle_timeout(None)
                .max_lifetime(None)
                .connect_with(options)
                .await?
        } else {
            SqlitePoolOptions::new()
                .max_connections(8)
                .connect_with(options.journal_mode(SqliteJournalMode::Wal))
                .await?
        };
        let store = SqliteStore::new(pool);
        store.migrate().await?;
        Ok(store)
    }

    /// A store on an existing pool, using the table `idem_records`. Call
    /// [`migrate`](Self::migrate) once before use.
    pub fn new(pool: SqlitePool) -> Self {
        SqliteStore {
            pool,
            sql: Arc::new(Statements::new(DEFAULT_TABLE.to_owned())),
            waiters: Arc::default(),
        }
    }

    /// Uses another table. The name must be 1 to 63 ASCII letters, digits
    /// and underscores, not starting with a digit.
    pub fn with_table_name(mut self, table: &str) -> Result<Self, Error> {
        self.sql = Arc::new(Statements::new(validate_table_name(table)?));
        Ok(self)
    }

    /// The pool.
    pub fn pool(&self) -> &SqlitePool {
        &self.pool
    }

    /// The records table.
    pub fn table_name(&self) -> &str {
        &self.sql.table
    }

    /// Creates or upgrades the records table. Safe to call at every start,
    /// from several processes: applied versions are recorded in
    /// `idem_migrations` and skipped.
    pub async fn migrate(&self) -> Result<(), Error> {
        let mut conn = self.pool.acquire().await?;
        // IMMEDIATE: the write lock from the start. A deferred transaction
        // that read first could not be upgraded while another migrator
        // writes (SQLITE_BUSY at once, whatever the busy timeout).
        let mut tx = conn.begin_with("BEGIN IMMEDIATE").await?;
        sqlx::query(
            "CREATE TABLE IF NOT EXISTS idem_migrations (
                table_name TEXT    NOT NULL,
                version    INTEGER NOT NULL,
                applied_at INTEGER NOT NULL,
                PRIMARY KEY (table_name, version)
            )",
        )
        .execute(&mut *tx)
        .await?;
        let applied: i64 = sqlx::query_scalar(
            "SELECT COALESCE(MAX(version), 0) FROM idem_migrations WHERE table_name = ?1",
        )
        .bind(&self.sql.table)
        .fetch_one(&mut *tx)
        .await?;
        for (index, migration) in MIGRATIONS.iter().enumerate() {
            let version = index as i64 + 1;
            if version <= applied {
                continue;
            }
            // Through `Executor` on a `&str`, not `raw_sql`: the future of
            // `raw_sql(..).execute(..)` is not `Send` in every context.
            (&mut *tx)
                .execute(render(migration, &self.sql.table).as_str())
                .await?;
            sqlx::query(
                "INSERT OR IGNORE INTO idem_migrations (table_name, version, applied_at)
                 VALUES (?1, ?2, ?3)",
            )
            .bind(&self.sql.table)
            .bind(version)
            .bind(now_millis())
            .execute(&mut *tx)
            .await?;
        }
        tx.commit().await?;
        Ok(())
    }

    /// [`Store::begin`] on a given connection (the pool's, or the caller's
    /// open transaction).
    pub async fn begin_on(
        &self,
        conn: &mut SqliteConnection,
        req: &BeginRequest<'_>,
    ) -> Result<Begin, Error> {
        for _ in 0..CLAIM_ROUNDS {
            let fence: Option<i64> = sqlx::query_scalar(&self.sql.claim)
                .bind(req.scope.as_str())
                .bind(req.key.as_str())
                .bind(&req.fingerprint.as_bytes()[..])
                .bind(&req.token.as_bytes()[..])
                .bind(millis(req.lease))
                .bind(millis(req.ttl))
                .fetch_optional(&mut *conn)
                .await?;
            if let Some(fence) = fence {
                return Ok(Begin::Claimed(Claim::granted(req, fence)));
            }
            // The claim lost to a live record: read it to say why. If it
            // vanished or lapsed meanwhile, claim again.
            if let Some(answer) = self.peek_on(conn, req).await? {
                return Ok(answer);
            }
        }
        Err(unsettled())
    }

    /// [`Store::peek`] on a given connection.
    pub async fn peek_on(
        &self,
        conn: &mut SqliteConnection,
        req: &BeginRequest<'_>,
    ) -> Result<Option<Begin>, Error> {
        match self.read_on(conn, req.scope, req.key).await? {
            None => Ok(None),
            Some((record, now)) => decide(req, &record, now).answer(),
        }
    }

    /// [`TransactionalStore::peek_in`](super::TransactionalStore::peek_in):
    /// a plain read on another of the pool's connections, which sees the
    /// latest committed record without starting a read snapshot in the
    /// caller's transaction; `None` (go on to the claim) when none comes
    /// soon (an in-memory database has one connection, and the caller
    /// holds it).
    pub async fn peek_in(
        &self,
        _conn: &mut SqliteConnection,
        req: &BeginRequest<'_>,
    ) -> Result<Option<Begin>, Error> {
        match beside(&self.pool).await {
            Some(mut own) => self.peek_on(&mut own, req).await,
            None => Ok(None),
        }
    }

    /// [`Store::renew`] on a given connection.
    pub async fn renew_on(&self, conn: &mut SqliteConnection, claim: &Claim) -> Result<(), Error> {
        let done = sqlx::query(&self.sql.renew)
            .bind(claim.scope.as_str())
            .bind(claim.key.as_str())
            .bind(&claim.token.as_bytes()[..])
            .bind(millis(claim.lease))
            .execute(&mut *conn)
            .await?;
        if done.rows_affected() == 0 {
            return Err(Error::LeaseLost);
        }
        Ok(())
    }

    /// [`Store::complete`] on a given connection.
    pub async fn complete_on(
        &self,
        conn: &mut SqliteConnection,
        claim: &Claim,
        outcome: &Outcome,
    ) -> Result<(), Error> {
        let done = sqlx::query(&self.sql.complete)
            .bind(outcome.kind.code())
            .bind(&outcome.body[..])
            .bind(millis(claim.ttl))
            .bind(claim.scope.as_str())
            .bind(claim.key.as_str())
            .bind(&claim.token.as_bytes()[..])
            .execute(&mut *conn)
            .await?;
        if done.rows_affected() == 0 {
            return Err(Error::LeaseLost);
        }
        Ok(())
    }

    /// [`Store::release`] on a given connection.
    pub async fn release_on(
        &self,
        conn: &mut SqliteConnection,
        claim: &Claim,
    ) -> Result<(), Error> {
        let done = sqlx::query(&self.sql.release)
            .bind(claim.scope.as_str())
            .bind(claim.key.as_str())
            .bind(&claim.token.as_bytes()[..])
            .execute(&mut *conn)
            .await?;
        if done.rows_affected() == 0 {
            return Err(Error::LeaseLost);
        }
        Ok(())
    }

    /// [`Store::get`] on a given connection.
    pub async fn get_on(
        &self,
        conn: &mut SqliteConnection,
        scope: &Scope,
        key: &Key,
    ) -> Result<Option<Record>, Error> {
        Ok(self
            .read_on(conn, scope, key)
            .await?
            .map(|(record, _)| record))
    }

    /// The record and the database's time of the read.
    async fn read_on(
        &self,
        conn: &mut SqliteConnection,
        scope: &Scope,
        key: &Key,
    ) -> Result<Option<(Record, Millis)>, Error> {
        let row = sqlx::query(&self.sql.select)
            .bind(scope.as_str())
            .bind(key.as_str())
            .fetch_optional(&mut *conn)
            .await?;
        row.map(|row| Ok((record_from_row(&row)?, row.try_get("db_now")?)))
            .transpose()
    }
}

fn record_from_row(row: &SqliteRow) -> Result<Record, Error> {
    StoredRecord {
        scope: row.try_get("scope")?,
        key: row.try_get("key")?,
        fingerprint: row.try_get("fingerprint")?,
        state: row.try_get("state")?,
        fence: row.try_get("fence")?,
        token: row.try_get("claim_token")?,
        lease_until: row.try_get("lease_until")?,
        outcome_kind: row.try_get("outcome_kind")?,
        outcome: row.try_get("outcome")?,
        created_at: row.try_get("created_at")?,
        expires_at: row.try_get("expires_at")?,
    }
    .into_record()
}

#[async_trait]
impl Store for SqliteStore {
    async fn begin(&self, req: &BeginRequest<'_>) -> Result<Begin, Error> {
        let mut conn = self.pool.acquire().await?;
        self.begin_on(&mut conn, req).await
    }

    async fn peek(&self, req: &BeginRequest<'_>) -> Result<Option<Begin>, Error> {
        let mut conn = self.pool.acquire().await?;
        self.peek_on(&mut conn, req).await
    }

    async fn renew(&self, claim: &Claim) -> Result<(), Error> {
        let mut conn = self.pool.acquire().await?;
        self.renew_on(&mut conn, claim).await
    }

    async fn complete(&self, claim: &Claim, outcome: &Outcome) -> Result<(), Error> {
        let mut conn = self.pool.acquire().await?;
        self.complete_on(&mut conn, claim, outcome).await?;
        self.waiters.wake(&claim.scope, &claim.key);
        Ok(())
    }

    async fn release(&self, claim: &Claim) -> Result<(), Error> {
        let mut conn = self.pool.acquire().await?;
        self.release_on(&mut conn, claim).await?;
        self.waiters.wake(&claim.scope, &claim.key);
        Ok(())
    }

    async fn get(&self, scope: &Scope, key: &Key) -> Result<Option<Record>, Error> {
        let mut conn = self.pool.acquire().await?;
        self.get_on(&mut conn, scope, key).await
    }

    async fn purge_expired(&self, batch: usize) -> Result<u64, Error> {
        let batch = i64::try_from(batch.max(1)).unwrap_or(i64::MAX);
        let mut total = 0;
        loop {
            let done = sqlx::query(&self.sql.purge)
                .bind(batch)
                .execute(&self.pool)
                .await?;
            total += done.rows_affected();
            if done.rows_affected() < batch as u64 {
                return Ok(total);
            }
        }
    }

    async fn wait_for_change(
        &self,
        scope: &Scope,
        key: &Key,
        timeout: Duration,
    ) -> Result<(), Error> {
        self.waiters
            .wait(scope, key, timeout, || async {
                let mut conn = self.pool.acquire().await?;
                Ok(self
                    .read_on(&mut conn, scope, key)
                    .await?
                    .is_some_and(|(record, now)| record.holds_lease(now)))
            })
            .await
    }

    fn detach(&self) -> Option<Arc<dyn Store>> {
        Some(Arc::new(self.clone()))
    }
}

super::transactional_store!(SqliteStore, sqlx::Sqlite, SqliteConnection);
