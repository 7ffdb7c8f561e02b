//! The MySQL and MariaDB store.

use std::collections::hash_map::RandomState;
use std::hash::{BuildHasher, Hasher};
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::{Arc, OnceLock};
use std::time::{Duration, SystemTime, UNIX_EPOCH};

use async_trait::async_trait;
use sqlx::mysql::{MySqlConnection, MySqlPool, MySqlPoolOptions, MySqlRow};
use sqlx::{Executor, Row};

use super::sql::{render, validate_table_name, StoredRecord, DEFAULT_TABLE};
use super::{BeginRequest, Store, Waiters};
use crate::record::{decide, duration_millis, now_millis, Begin, Claim, Decision, Outcome, Record};
use crate::{Error, Key, Scope};

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
/// with which fence) or why not. Times are the application's clock in
/// milliseconds, bound as parameters, as in every store.
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
/// # async fn example() -> Result<(), idem_core::Error> {
/// use idem_core::MySqlStore;
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
    complete: String,
    release: String,
    purge: String,
}

/// The claim. MySQL evaluates the assignments of `ON DUPLICATE KEY UPDATE`
/// from left to right, each seeing the values written before it (MariaDB
/// with `SIMULTANEOUS_ASSIGNMENT` evaluates them all on the old row). So
/// the first assignment decides, from the old row, whether the key is
/// `{free}`, and if so stores this attempt's token; every later column then
/// asks `{ours}`: the token is ours (left to right) or the old row was free
/// (all at once). Either way each column sees the same decision.
const CLAIM: &str = r#"INSERT INTO `{table}`
        (scope, `key`, fingerprint, state, fence, lease_until, claim_token, created_at, expires_at)
    SELECT c.scope, c.k, c.fingerprint, 'in_progress', 1, c.lease_until, c.token, c.now_ms,
           c.expires_at
    FROM (SELECT ? AS scope, ? AS k, ? AS fingerprint, ? AS now_ms,
                 ? AS lease_until, ? AS expires_at, ? AS token) AS c
    ON DUPLICATE KEY UPDATE
        claim_token  = IF({free}, c.token, `{table}`.claim_token),
        fence        = IF({ours}, `{table}`.fence + 1, `{table}`.fence),
        outcome_kind = IF({ours}, NULL, `{table}`.outcome_kind),
        outcome      = IF({ours}, NULL, `{table}`.outcome),
        fingerprint  = IF({ours}, c.fingerprint, `{table}`.fingerprint),
        state        = IF({ours}, 'in_progress', `{table}`.state),
        lease_until  = IF({ours}, c.lease_until, `{table}`.lease_until),
        created_at   = IF({ours}, c.now_ms, `{table}`.created_at),
        expires_at   = IF({ours}, c.expires_at, `{table}`.expires_at)"#;

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
        let r = |sql: &str| render(sql, &table);
        let claim = CLAIM.replace("{ours}", OURS).replace("{free}", FREE);
        Statements {
            claim: r(&claim),
            // A locking read: it sees the latest committed row even inside
            // a REPEATABLE READ transaction.
            claimed: r(&format!(
                "SELECT {COLUMNS} FROM `{{table}}` WHERE scope = ? AND `key` = ? FOR UPDATE"
            )),
            select: r(&format!(
                "SELECT {COLUMNS} FROM `{{table}}` WHERE scope = ? AND `key` = ?"
            )),
            complete: r("UPDATE `{table}`
                SET state = 'completed', outcome_kind = ?, outcome = ?,
                    lease_until = NULL, expires_at = ?
                WHERE scope = ? AND `key` = ? AND fence = ? AND state = 'in_progress'"),
            release: r("DELETE FROM `{table}`
                WHERE scope = ? AND `key` = ? AND fence = ? AND state = 'in_progress'"),
            purge: r("DELETE FROM `{table}` WHERE expires_at <= ? ORDER BY expires_at LIMIT ?"),
            table,
        }
    }
}

/// Sixteen bytes no other claim attempt uses: a random number drawn once
/// per process, then a counter.
fn claim_token() -> [u8; 16] {
    static PROCESS: OnceLock<u64> = OnceLock::new();
    static COUNTER: AtomicU64 = AtomicU64::new(0);
    let process = *PROCESS.get_or_init(|| {
        // `RandomState` is seeded from the operating system's randomness.
        let mut hasher = RandomState::new().build_hasher();
        hasher.write_u32(std::process::id());
        hasher.write_u128(
            SystemTime::now()
                .duration_since(UNIX_EPOCH)
                .map(|d| d.as_nanos())
                .unwrap_or(0),
        );
        hasher.finish()
    });
    let mut token = [0; 16];
    token[..8].copy_from_slice(&process.to_be_bytes());
    token[8..].copy_from_slice(&COUNTER.fetch_add(1, Ordering::Relaxed).to_be_bytes());
    token
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
        loop {
            let now = now_millis();
            let token = claim_token();
            sqlx::query(&self.sql.claim)
                .bind(req.scope.as_str())
                .bind(req.key.as_str())
                .bind(&req.fingerprint.as_bytes()[..])
                .bind(now)
                .bind(now.saturating_add(duration_millis(req.lease)))
                .bind(now.saturating_add(duration_millis(req.ttl)))
                .bind(&token[..])
                .execute(&mut *conn)
                .await?;
            let row = sqlx::query(&self.sql.claimed)
                .bind(req.scope.as_str())
                .bind(req.key.as_str())
                .fetch_optional(&mut *conn)
                .await?;
            // Gone already (released, or purged after a tiny ttl): claim again.
            let Some(row) = row else { continue };
            let record = record_from_row(&row)?;
            let holder: Vec<u8> = row.try_get("claim_token")?;
            if holder == token {
                return Ok(Begin::Claimed(Claim {
                    scope: req.scope.clone(),
                    key: req.key.clone(),
                    fence: record.fence,
                    ttl: req.ttl,
                }));
            }
            // The claim lost to a live record: say why. If it lapsed
            // meanwhile, claim again.
            if let Decision::Answer(answer) = decide(&record, req.fingerprint, now) {
                return Ok(answer);
            }
        }
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
            .bind(now_millis().saturating_add(duration_millis(claim.ttl)))
            .bind(claim.scope.as_str())
            .bind(claim.key.as_str())
            .bind(claim.fence)
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
            .bind(claim.fence)
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
        let row = sqlx::query(&self.sql.select)
            .bind(scope.as_str())
            .bind(key.as_str())
            .fetch_optional(&mut *conn)
            .await?;
        row.map(|row| record_from_row(&row)).transpose()
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
                    .bind(now_millis())
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
            .wait(scope, key, timeout, || self.get(scope, key))
            .await
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn claim_tokens_differ() {
        let (a, b) = (claim_token(), claim_token());
        assert_ne!(a, b);
        assert_eq!(a[..8], b[..8], "one process, one random prefix");
    }

    #[test]
    fn claim_statement_has_no_placeholders_left() {
        let sql = Statements::new("t".into()).claim;
        assert!(!sql.contains('{'), "{sql}");
        assert_eq!(sql.matches('?').count(), 7);
    }
}

super::transactional_store!(MySqlStore, sqlx::MySql, MySqlConnection);
