//! The MySQL and MariaDB store.

use std::sync::Arc;
use std::time::Duration;

use async_trait::async_trait;
use sqlx::mysql::{MySqlConnection, MySqlPool, MySqlPoolOptions, MySqlRow};
use sqlx::{Executor, Row};

use super::sql::{
    beside, millis, render, unsettled, validate_table_name, StoredRecord, CLAIM_ROUNDS,
    DEFAULT_TABLE,
};
use super::{BeginRequest, Store, Waiters};
use crate::error::Error;
use crate::key::{Key, Scope};
use crate::record::{decide, now_millis, Begin, Claim, Millis, Outcome, Record};

/// The longest scope (operation and principal) the table holds, in bytes.
const MAX_SCOPE_LEN: usize = 1024;

/// The embedded migrations, in order, one statement each. `{table}` is the
/// records table.
///
/// Scope and key are binary strings, so they compare byte for byte, case
/// and trailing spaces included, whatever the server's collation. The
/// primary key (at most 1024 + 255 bytes) fits InnoDB's 3072-byte limit
/// with the `DYNAMIC` row format.
const MIGRATIONS: &[&str] = &[r#"
CREATE TABLE IF NOT EXISTS `{table}` (
    scope        VARBINARY(1024) NOT NULL,
    `key`        VARBINARY(255)  NOT NULL,
    fingerprint  BINARY(32)      NOT NULL,
    state        VARCHAR(11) CHARACTER SET ascii COLLATE ascii_bin NOT NULL,
    fence        BIGINT          NOT NULL,
    lease_until  BIGINT          NULL,
    outcome_kind SMALLINT        NULL,
    outcome      LONGBLOB        NULL,
    claim_token  BINARY(16)      NOT NULL,
    created_at   BIGINT          NOT NULL,
    expires_at   BIGINT          NOT NULL,
    PRIMARY KEY (scope, `key`),
    KEY expires_at (expires_at),
    CHECK (state IN ('in_progress', 'completed')),
    CHECK (outcome_kind IN (0, 1)),
    CHECK (state = 'in_progress' OR (outcome IS NOT NULL AND outcome_kind IS NOT NULL))
) ENGINE = InnoDB ROW_FORMAT = DYNAMIC
"#];

/// The server-wide lock that serializes migrations across processes.
const MIGRATION_LOCK: &str = "idem_migrations";
/// How long a migration waits for that lock, in seconds.
const MIGRATION_LOCK_WAIT: i64 = 60;

/// How often a statement on the pool runs when InnoDB picks it as a
/// deadlock victim.
const DEADLOCK_ATTEMPTS: u32 = 5;

/// Records in a MySQL (8.0 or later) or MariaDB (10.5 or later) database
/// through a sqlx pool.
///
/// The claim is one `INSERT ... ON DUPLICATE KEY UPDATE` statement: the
/// primary key on `(scope, key)` decides, so any number of connections,
/// processes and hosts sharing the database claim a key once. Each attempt
/// writes a fresh random claim token with the record; reading the record
/// back on the same connection tells whether this attempt holds it (then
/// with which fence) or why not. Leases and expiry use the database's clock
/// (`UTC_TIMESTAMP(6)`), never the application's.
///
/// Scopes are limited to 1024 bytes ([`Error::Config`] beyond). Duplicates
/// waiting in this process are woken as soon as the first call completes;
/// those in other processes notice at their next poll (at most 25 ms
/// apart). A statement that InnoDB rolls back to break a deadlock is run
/// again, up to a few times, when it ran on the pool.
///
/// The `*_on` methods run the same statements on a connection you hold,
/// such as an open transaction.
///
/// ```no_run
/// # async fn example() -> Result<(), idem::Error> {
/// use idem::MySqlStore;
/// let store = MySqlStore::connect("mysql://root@127.0.0.1:3306/test").await?;
/// let audit = MySqlStore::new(store.pool().clone())
///     .with_table_name("audit_idempotency")?;
/// audit.migrate().await?;
/// # Ok(())
/// # }
/// ```
#[derive(Clone, Debug)]
pub struct MySqlStore {
    pool: MySqlPool,
    sql: Arc<Statements>,
    waiters: Arc<Waiters>,
}

#[derive(Debug)]
struct Statements {
    table: String,
    claim: String,
    claimed: String,
    select: String,
    renew: String,
    complete: String,
    release: String,
    purge: String,
}

/// The database's clock in milliseconds since the Unix epoch, whatever the
/// session's time zone: every lease and expiry is decided with it, never
/// with the application's clock.
const NOW: &str = "(TIMESTAMPDIFF(MICROSECOND, '1970-01-01 00:00:00', UTC_TIMESTAMP(6)) DIV 1000)";

/// The claim. MySQL evaluates the assignments of `ON DUPLICATE KEY UPDATE`
/// from left to right, each seeing the values written before it (MariaDB
/// with `SIMULTANEOUS_ASSIGNMENT` evaluates them all on the old row). So
/// the first assignment decides, from the old row, whether the key is
/// `{free}`, and if so stores this attempt's token; every later column then
/// asks `{ours}`: the token is ours (left to right) or the old row was free
/// (all at once). Either way each column sees the same decision.
const CLAIM: &str = r#"INSERT INTO `{table}`
        (scope, `key`, fingerprint, state, fence, lease_until, claim_token, created_at, expires_at)
    SELECT c.scope, c.k, c.fingerprint, 'in_progress', 1, c.now_ms + c.lease_ms, c.token, c.now_ms,
           c.now_ms + GREATEST(c.lease_ms, c.ttl_ms)
    FROM (SELECT ? AS scope, ? AS k, ? AS fingerprint, {now} AS now_ms,
                 ? AS lease_ms, ? AS ttl_ms, ? AS token) AS c
    ON DUPLICATE KEY UPDATE
        claim_token  = IF({free}, c.token, `{table}`.claim_token),
        fence        = IF({ours}, `{table}`.fence + 1, `{table}`.fence),
        outcome_kind = IF({ours}, NULL, `{table}`.outcome_kind),
        outcome      = IF({ours}, NULL, `{table}`.outcome),
        fingerprint  = IF({ours}, c.fingerprint, `{table}`.fingerprint),
        state        = IF({ours}, 'in_progress', `{table}`.state),
        lease_until  = IF({ours}, c.now_ms + c.lease_ms, `{table}`.lease_until),
        created_at   = IF({ours}, c.now_ms, `{table}`.created_at),
        expires_at   = IF({ours}, c.now_ms + GREATEST(c.lease_ms, c.ttl_ms), `{table}`.expires_at)"#;

/// The key may be claimed: expired, or in progress with a lapsed lease and
/// the same payload.
const FREE: &str = "(`{table}`.expires_at <= c.now_ms
            OR (`{table}`.state = 'in_progress'
                AND `{table}`.lease_until <= c.now_ms
                AND `{table}`.fingerprint = c.fingerprint))";

/// This attempt holds the key.
const OURS: &str = "(`{table}`.claim_token = c.token OR {free})";

const COLUMNS: &str = "scope, `key`, fingerprint, state, fence, lease_until, \
                       outcome_kind, outcome, claim_token, created_at, expires_at";

impl Statements {
    fn new(table: String) -> Self {
        let r = |sql: &str| render(sql, &table).replace("{now}", NOW);
        let claim = CLAIM.replace("{ours}", OURS).replace("{free}", FREE);
        Statements {
            claim: r(&claim),
            // A locking read: it sees the latest committed row even inside
            // a REPEATABLE READ transaction.
            claimed: r(&format!(
                "SELECT {COLUMNS}, {{now}} AS db_now FROM `{{table}}`
                 WHERE scope = ? AND `key` = ? FOR UPDATE"
            )),
            select: r(&format!(
                "SELECT {COLUMNS}, {{now}} AS db_now FROM `{{table}}` WHERE scope = ? AND `key` = ?"
            )),
            renew: r("UPDATE `{table}`
                SET lease_until = {now} + ?, expires_at = GREATEST(expires_at, {now} + ?)
                WHERE scope = ? AND `key` = ? AND claim_token = ? AND state = 'in_progress'"),
            // The outcome is written before `state`: MySQL assigns left to
            // right, and the WHERE has already picked the row.
            complete: r("UPDATE `{table}`
                SET outcome_kind = ?, outcome = ?, lease_until = NULL, expires_at = {now} + ?,
                    state = 'completed'
                WHERE scope = ? AND `key` = ? AND claim_token = ?
                  AND (state = 'in_progress'
                       OR (state = 'completed' AND outcome_kind = ? AND outcome = ?))"),
            release: r("DELETE FROM `{table}`
                WHERE scope = ? AND `key` = ? AND claim_token = ? AND state = 'in_progress'"),
            purge: r("DELETE FROM `{table}` WHERE expires_at <= {now} ORDER BY expires_at LIMIT ?"),
            table,
        }
    }
}

/// Whether InnoDB rolled the statement back to break a deadlock (error
/// 1213, SQLSTATE 40001).
fn is_deadlock(err: &Error) -> bool {
    let Error::Store(source) = err else {
        return false;
    };
    source
        .downcast_ref::<sqlx::Error>()
        .and_then(|e| e.as_database_error())
        .and_then(|e| e.code())
        .is_some_and(|code| code == "40001")
}

/// Whether InnoDB refused a locking read or write of a row changed since
/// the transaction's snapshot (MariaDB's `innodb_snapshot_isolation`:
/// error 1020, "Record has changed since last read").
fn is_changed_since_read(err: &sqlx::Error) -> bool {
    err.as_database_error()
        .and_then(|e| e.try_downcast_ref::<sqlx::mysql::MySqlDatabaseError>())
        .is_some_and(|e| e.number() == 1020)
}

/// Runs `$op` on a connection of the store's pool, again when it lost a
/// deadlock: on the pool every statement is a transaction of its own, so
/// nothing of the failed attempt remains.
macro_rules! on_pool {
    ($store:expr, |$conn:ident| $op:expr) => {{
        let mut attempt = 1;
        loop {
            let mut $conn = $store.pool.acquire().await?;
            match $op.await {
                Err(err) if attempt < DEADLOCK_ATTEMPTS && is_deadlock(&err) => {
                    tracing::debug!(attempt, "deadlock on the idempotency table; running again");
                    drop($conn);
                    tokio::time::sleep(Duration::from_millis(u64::from(attempt) * 2)).await;
                    attempt += 1;
                }
                result => break result,
            }
        }
    }};
}

impl MySqlStore {
    /// Connects a pool to `url` (`mysql://user:password@host:port/db`) and
    /// applies the migrations to the default table `idem_records`.
    pub async fn connect(url: &str) -> Result<Self, Error> {
        let pool = MySqlPoolOptions::new().connect(url).await?;
        let store = MySqlStore::new(pool);
        store.migrate().await?;
        Ok(store)
    }

    /// A store on an existing pool, using the table `idem_records`. Call
    /// [`migrate`](Self::migrate) once before use.
    pub fn new(pool: MySqlPool) -> Self {
        MySqlStore {
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
    pub fn pool(&self) -> &MySqlPool {
        &self.pool
    }

    /// The records table.
    pub fn table_name(&self) -> &str {
        &self.sql.table
    }

    /// Creates or upgrades the records table. Safe to call at every start,
    /// from several processes at once: a named lock (`GET_LOCK`) serializes
    /// migrators, and applied versions are recorded in `idem_migrations`
    /// and skipped.
    pub async fn migrate(&self) -> Result<(), Error> {
        let mut conn = self.pool.acquire().await?;
        let locked: Option<i64> = sqlx::query_scalar("SELECT GET_LOCK(?, ?)")
            .bind(MIGRATION_LOCK)
            .bind(MIGRATION_LOCK_WAIT)
            .fetch_one(&mut *conn)
            .await?;
        if locked != Some(1) {
            return Err(Error::store(format!(
                "could not take the migration lock `{MIGRATION_LOCK}` within \
                 {MIGRATION_LOCK_WAIT} s: another process is migrating"
            )));
        }
        let migrated = self.apply_migrations(&mut conn).await;
        // DDL is not transactional in MySQL: the lock is what keeps two
        // migrators apart, so give it back even when a step failed.
        let unlocked = sqlx::query("SELECT RELEASE_LOCK(?)")
            .bind(MIGRATION_LOCK)
            .execute(&mut *conn)
            .await;
        migrated?;
        unlocked?;
        Ok(())
    }

    async fn apply_migrations(&self, conn: &mut MySqlConnection) -> Result<(), Error> {
        sqlx::query(
            "CREATE TABLE IF NOT EXISTS idem_migrations (
                table_name VARCHAR(64) CHARACTER SET ascii COLLATE ascii_bin NOT NULL,
                version    BIGINT NOT NULL,
                applied_at BIGINT NOT NULL,
                PRIMARY KEY (table_name, version)
            ) ENGINE = InnoDB",
        )
        .execute(&mut *conn)
        .await?;
        // A table dropped by hand is created again.
        let exists: i64 = sqlx::query_scalar(
            "SELECT COUNT(*) FROM information_schema.tables
             WHERE table_schema = DATABASE() AND table_name = ?",
        )
        .bind(&self.sql.table)
        .fetch_one(&mut *conn)
        .await?;
        let applied: i64 = if exists > 0 {
            sqlx::query_scalar(
                "SELECT COALESCE(MAX(version), 0) FROM idem_migrations WHERE table_name = ?",
            )
            .bind(&self.sql.table)
            .fetch_one(&mut *conn)
            .await?
        } else {
            0
        };
        for (index, migration) in MIGRATIONS.iter().enumerate() {
            let version = index as i64 + 1;
            if version <= applied {
                continue;
            }
            // Through `Executor` on a `&str`, not `raw_sql`: the future of
            // `raw_sql(..).execute(..)` is not `Send` in every context.
            (&mut *conn)
                .execute(render(migration, &self.sql.table).as_str())
                .await?;
            sqlx::query(
                "INSERT INTO idem_migrations (table_name, version, applied_at)
                 VALUES (?, ?, ?) ON DUPLICATE KEY UPDATE version = version",
            )
            .bind(&self.sql.table)
            .bind(version)
            .bind(now_millis())
            .execute(&mut *conn)
            .await?;
        }
        Ok(())
    }

    /// [`Store::begin`] on a given connection (the pool's, or the caller's
    /// open transaction).
    ///
    /// Inside a transaction whose snapshot predates the record's last
    /// change, MariaDB with `innodb_snapshot_isolation` refuses the claim
    /// (error 1020); the record is then read on the pool, and a duplicate
    /// is answered from it instead of failing.
    pub async fn begin_on(
        &self,
        conn: &mut MySqlConnection,
        req: &BeginRequest<'_>,
    ) -> Result<Begin, Error> {
        let scope_len = req.scope.as_str().len();
        if scope_len > MAX_SCOPE_LEN {
            return Err(Error::Config(format!(
                "the scope is {scope_len} bytes long; the MySQL store keeps scopes of at most \
                 {MAX_SCOPE_LEN} bytes"
            )));
        }
        for _ in 0..CLAIM_ROUNDS {
            let claimed = sqlx::query(&self.sql.claim)
                .bind(req.scope.as_str())
                .bind(req.key.as_str())
                .bind(&req.fingerprint.as_bytes()[..])
                .bind(millis(req.lease))
                .bind(millis(req.ttl))
                .bind(&req.token.as_bytes()[..])
                .execute(&mut *conn)
                .await;
            if let Err(err) = claimed {
                if is_changed_since_read(&err) {
                    if let Some(mut own) = beside(&self.pool).await {
                        if let Some(answer) = self.peek_on(&mut own, req).await? {
                            return Ok(answer);
                        }
                    }
                }
                return Err(err.into());
            }
            // The locking read sees the latest row, ours or not. Gone
            // already (released, or purged): claim again.
            let row = sqlx::query(&self.sql.claimed)
                .bind(req.scope.as_str())
                .bind(req.key.as_str())
                .fetch_optional(&mut *conn)
                .await?;
            let Some(row) = row else { continue };
            let (record, now) = (record_from_row(&row)?, row.try_get("db_now")?);
            // Ours (the token is this attempt's), or the reason why not; if
            // it lapsed meanwhile, claim again.
            if let Some(answer) = decide(req, &record, now).answer()? {
                return Ok(answer);
            }
        }
        Err(unsettled())
    }

    /// [`Store::peek`] on a given connection.
    pub async fn peek_on(
        &self,
        conn: &mut MySqlConnection,
        req: &BeginRequest<'_>,
    ) -> Result<Option<Begin>, Error> {
        match self.read_on(conn, req.scope, req.key).await? {
            None => Ok(None),
            Some((record, now)) => decide(req, &record, now).answer(),
        }
    }

    /// [`TransactionalStore::peek_in`](super::TransactionalStore::peek_in):
    /// a plain read on a connection of the store's own pool, which sees the
    /// latest committed record (a read in the caller's `REPEATABLE READ`
    /// transaction would see its snapshot); `None` (go on to the claim,
    /// which reads the latest row) when no connection comes soon.
    pub async fn peek_in(
        &self,
        _conn: &mut MySqlConnection,
        req: &BeginRequest<'_>,
    ) -> Result<Option<Begin>, Error> {
        match beside(&self.pool).await {
            Some(mut own) => self.peek_on(&mut own, req).await,
            None => Ok(None),
        }
    }

    /// [`Store::renew`] on a given connection.
    pub async fn renew_on(&self, conn: &mut MySqlConnection, claim: &Claim) -> Result<(), Error> {
        let lease = millis(claim.lease);
        let done = sqlx::query(&self.sql.renew)
            .bind(lease)
            .bind(lease)
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

    /// [`Store::complete`] on a given connection.
    pub async fn complete_on(
        &self,
        conn: &mut MySqlConnection,
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
            .bind(outcome.kind.code())
            .bind(&outcome.body[..])
            .execute(&mut *conn)
            .await?;
        // sqlx asks for found rows, so a matched row counts even unchanged.
        if done.rows_affected() == 0 {
            return Err(Error::LeaseLost);
        }
        Ok(())
    }

    /// [`Store::release`] on a given connection.
    pub async fn release_on(&self, conn: &mut MySqlConnection, claim: &Claim) -> Result<(), Error> {
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
        conn: &mut MySqlConnection,
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
        conn: &mut MySqlConnection,
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

fn record_from_row(row: &MySqlRow) -> Result<Record, Error> {
    // Binary columns: text is read as bytes and checked here.
    let text = |column: &str| -> Result<String, Error> {
        let bytes: Vec<u8> = row.try_get(column)?;
        String::from_utf8(bytes)
            .map_err(|_| Error::store(format!("corrupt idempotency record: {column} is not UTF-8")))
    };
    StoredRecord {
        scope: text("scope")?,
        key: text("key")?,
        fingerprint: row.try_get("fingerprint")?,
        state: text("state")?,
        fence: row.try_get("fence")?,
        token: row.try_get("claim_token")?,
        lease_until: row.try_get("lease_until")?,
        outcome_kind: row
            .try_get::<Option<i16>, _>("outcome_kind")?
            .map(i64::from),
        outcome: row.try_get("outcome")?,
        created_at: row.try_get("created_at")?,
        expires_at: row.try_get("expires_at")?,
    }
    .into_record()
}

#[async_trait]
impl Store for MySqlStore {
    async fn begin(&self, req: &BeginRequest<'_>) -> Result<Begin, Error> {
        on_pool!(self, |conn| self.begin_on(&mut conn, req))
    }

    async fn peek(&self, req: &BeginRequest<'_>) -> Result<Option<Begin>, Error> {
        let mut conn = self.pool.acquire().await?;
        self.peek_on(&mut conn, req).await
    }

    async fn renew(&self, claim: &Claim) -> Result<(), Error> {
        on_pool!(self, |conn| self.renew_on(&mut conn, claim))
    }

    async fn complete(&self, claim: &Claim, outcome: &Outcome) -> Result<(), Error> {
        on_pool!(self, |conn| self.complete_on(&mut conn, claim, outcome))?;
        self.waiters.wake(&claim.scope, &claim.key);
        Ok(())
    }

    async fn release(&self, claim: &Claim) -> Result<(), Error> {
        on_pool!(self, |conn| self.release_on(&mut conn, claim))?;
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
            let deleted = on_pool!(self, |conn| async {
                let done = sqlx::query(&self.sql.purge)
                    .bind(batch)
                    .execute(&mut *conn)
                    .await?;
                Ok::<_, Error>(done.rows_affected())
            })?;
            total += deleted;
            if deleted < batch as u64 {
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

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn claim_statement_has_no_placeholders_left() {
        let sql = Statements::new("t".into()).claim;
        assert!(!sql.contains('{'), "{sql}");
        assert_eq!(sql.matches('?').count(), 6);
    }
}

super::transactional_store!(MySqlStore, sqlx::MySql, MySqlConnection);
