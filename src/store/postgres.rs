//! The PostgreSQL store.

use std::convert::Infallible;
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::{Arc, Mutex};
use std::time::Duration;

use async_trait::async_trait;
use sha2::{Digest, Sha256};
use sqlx::postgres::{PgConnectOptions, PgConnection, PgListener, PgPool, PgPoolOptions, PgRow};
use sqlx::{Executor, Row};
use tokio::task::JoinHandle;

use super::sql::{
    millis, render, unsettled, validate_table_name, StoredRecord, CLAIM_ROUNDS, DEFAULT_TABLE,
};
use super::{BeginRequest, Store, Waiters};
use crate::error::Error;
use crate::key::{Key, Scope};
use crate::record::{decide, now_millis, Begin, Claim, Millis, Outcome, Record};

/// The embedded migrations, in order. `{table}` is the records table,
/// `{index}` the name of its expiry index.
///
/// Scope and key use the `C` collation: they compare and sort byte for
/// byte, whatever the database's locale, and faster.
const MIGRATIONS: &[&str] = &[
    r#"
CREATE TABLE IF NOT EXISTS "{table}" (
    scope        TEXT     COLLATE "C" NOT NULL,
    key          TEXT     COLLATE "C" NOT NULL,
    fingerprint  BYTEA    NOT NULL CHECK (octet_length(fingerprint) = 32),
    state        TEXT     NOT NULL CHECK (state IN ('in_progress', 'completed')),
    fence        BIGINT   NOT NULL,
    lease_until  BIGINT,
    outcome_kind SMALLINT CHECK (outcome_kind IN (0, 1)),
    outcome      BYTEA,
    created_at   BIGINT   NOT NULL,
    expires_at   BIGINT   NOT NULL,
    PRIMARY KEY (scope, key),
    CHECK (state = 'in_progress' OR (outcome IS NOT NULL AND outcome_kind IS NOT NULL))
);
CREATE INDEX IF NOT EXISTS "{index}" ON "{table}" (expires_at);
"#,
    // The claim's identity, checked by every fenced write (NULL on rows
    // written before it existed: they can only lapse and be taken over).
    r#"ALTER TABLE "{table}" ADD COLUMN IF NOT EXISTS claim_token BYTEA
    CHECK (octet_length(claim_token) = 16);
"#,
];

/// The database's clock in milliseconds since the Unix epoch: every lease
/// and expiry is decided with it, never with the application's clock.
const NOW: &str = "(EXTRACT(EPOCH FROM clock_timestamp()) * 1000)::BIGINT";

/// The advisory lock that serializes migrations across processes
/// (`"idemmigr"` in ASCII).
const MIGRATION_LOCK: i64 = 0x6964_656d_6d69_6772;

/// The longest payload `pg_notify` accepts.
const MAX_NOTIFY_PAYLOAD: usize = 7999;

/// Records in a PostgreSQL database through a sqlx pool.
///
/// The claim is `INSERT ... ON CONFLICT (scope, key) DO NOTHING`; when the
/// key is taken, the record is read, and a free one (expired, or a lapsed
/// lease) is taken over with an `UPDATE ... WHERE <still free>`. The primary
/// key on `(scope, key)` decides, so any number of connections, processes
/// and hosts sharing the database claim a key once; none of these
/// statements locks a row it does not claim, so a duplicate never holds a
/// lock the owner needs. Leases and expiry use the database's clock
/// (`clock_timestamp()`), so hosts with skewed clocks agree.
///
/// Duplicates waiting on a key are woken as soon as the first call completes
/// or releases it: in this process directly, in other processes through
/// `LISTEN`/`NOTIFY` on a channel named after the table. The listening
/// connection is opened on the first wait, with the pool's connect options
/// but outside the pool, and closed when the last clone of the store is
/// dropped. Should it fail, waiters fall back to polling.
///
/// The `*_on` methods run the same statements on a connection you hold,
/// such as an open transaction; notifications sent there are delivered when
/// it commits.
///
/// ```no_run
/// # async fn example() -> Result<(), idem::Error> {
/// use idem::PostgresStore;
/// let store = PostgresStore::connect("postgres://postgres@127.0.0.1:5432/test").await?;
/// let audit = PostgresStore::new(store.pool().clone())
///     .with_table_name("audit_idempotency")?;
/// audit.migrate().await?;
/// # Ok(())
/// # }
/// ```
#[derive(Clone, Debug)]
pub struct PostgresStore {
    pool: PgPool,
    sql: Arc<Statements>,
    waiters: Arc<Waiters>,
    listener: Arc<Listener>,
}

#[derive(Debug)]
struct Statements {
    table: String,
    index: String,
    claim: String,
    take_over: String,
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
            claim: r(r#"INSERT INTO "{table}"
                    (scope, key, fingerprint, state, fence, claim_token, lease_until,
                     created_at, expires_at)
                SELECT $1, $2, $3, 'in_progress', 1, $4, c.now + $5, c.now,
                       c.now + GREATEST($5, $6)
                FROM (SELECT {now} AS now) AS c
                ON CONFLICT (scope, key) DO NOTHING
                RETURNING fence"#),
            take_over: r(r#"UPDATE "{table}" AS t SET
                    fingerprint = $3,
                    state = 'in_progress',
                    fence = t.fence + 1,
                    claim_token = $4,
                    lease_until = c.now + $5,
                    outcome_kind = NULL,
                    outcome = NULL,
                    created_at = c.now,
                    expires_at = c.now + GREATEST($5, $6)
                FROM (SELECT {now} AS now) AS c
                WHERE t.scope = $1 AND t.key = $2
                  AND (t.expires_at <= c.now
                       OR (t.state = 'in_progress'
                           AND t.lease_until <= c.now
                           AND t.fingerprint = $3))
                RETURNING t.fence"#),
            select: r(
                r#"SELECT scope, key, fingerprint, state, fence, claim_token, lease_until,
                       outcome_kind, outcome, created_at, expires_at, {now} AS db_now
                FROM "{table}" WHERE scope = $1 AND key = $2"#,
            ),
            renew: r(r#"UPDATE "{table}" AS t
                SET lease_until = c.now + $4, expires_at = GREATEST(t.expires_at, c.now + $4)
                FROM (SELECT {now} AS now) AS c
                WHERE t.scope = $1 AND t.key = $2 AND t.claim_token = $3
                  AND t.state = 'in_progress'"#),
            complete: r(r#"UPDATE "{table}"
                SET state = 'completed', outcome_kind = $1, outcome = $2,
                    lease_until = NULL, expires_at = {now} + $3
                WHERE scope = $4 AND key = $5 AND claim_token = $6
                  AND (state = 'in_progress'
                       OR (state = 'completed' AND outcome_kind = $1 AND outcome = $2))"#),
            release: r(r#"DELETE FROM "{table}"
                WHERE scope = $1 AND key = $2 AND claim_token = $3 AND state = 'in_progress'"#),
            // Rows a claim is taking over right now are skipped, not waited
            // for: the purge never queues behind, nor blocks, new claims.
            purge: r(r#"DELETE FROM "{table}"
                WHERE ctid = ANY(ARRAY(
                    SELECT ctid FROM "{table}" WHERE expires_at <= {now}
                    LIMIT $1 FOR UPDATE SKIP LOCKED))
                  AND expires_at <= {now}"#),
            index: index_name(&table),
            table,
        }
    }
}

/// `{table}_expires_at`, shortened with a digest of the table name when it
/// would pass PostgreSQL's 63-byte identifier limit (index names share the
/// schema's namespace, so a silently truncated name could collide).
fn index_name(table: &str) -> String {
    let name = format!("{table}_expires_at");
    if name.len() <= 63 {
        return name;
    }
    let digest = Sha256::digest(table.as_bytes());
    let hex: String = digest[..4].iter().map(|b| format!("{b:02x}")).collect();
    format!("{}_{hex}_expires_at", &table[..43])
}

impl PostgresStore {
    /// Connects a pool to `url` (`postgres://user:password@host:port/db`)
    /// and applies the migrations to the default table `idem_records`.
    pub async fn connect(url: &str) -> Result<Self, Error> {
        let pool = PgPoolOptions::new().connect(url).await?;
        let store = PostgresStore::new(pool);
        store.migrate().await?;
        Ok(store)
    }

    /// A store on an existing pool, using the table `idem_records`. Call
    /// [`migrate`](Self::migrate) once before use.
    pub fn new(pool: PgPool) -> Self {
        PostgresStore {
            pool,
            sql: Arc::new(Statements::new(DEFAULT_TABLE.to_owned())),
            waiters: Arc::default(),
            listener: Arc::default(),
        }
    }

    /// Uses another table (in the connection's `search_path`). The name
    /// must be 1 to 63 ASCII letters, digits and underscores, not starting
    /// with a digit.
    pub fn with_table_name(mut self, table: &str) -> Result<Self, Error> {
        self.sql = Arc::new(Statements::new(validate_table_name(table)?));
        // Another table is another notification channel.
        self.waiters = Arc::default();
        self.listener = Arc::default();
        Ok(self)
    }

    /// The pool.
    pub fn pool(&self) -> &PgPool {
        &self.pool
    }

    /// The records table.
    pub fn table_name(&self) -> &str {
        &self.sql.table
    }

    /// Creates or upgrades the records table. Safe to call at every start,
    /// from several processes at once: a transaction-scoped advisory lock
    /// serializes migrators, and applied versions are recorded in
    /// `idem_migrations` and skipped.
    pub async fn migrate(&self) -> Result<(), Error> {
        let mut tx = self.pool.begin().await?;
        sqlx::query("SELECT pg_advisory_xact_lock($1)")
            .bind(MIGRATION_LOCK)
            .execute(&mut *tx)
            .await?;
        sqlx::query(
            "CREATE TABLE IF NOT EXISTS idem_migrations (
                table_name TEXT   NOT NULL,
                version    BIGINT NOT NULL,
                applied_at BIGINT NOT NULL,
                PRIMARY KEY (table_name, version)
            )",
        )
        .execute(&mut *tx)
        .await?;
        // A table dropped by hand is created again.
        let exists: bool = sqlx::query_scalar("SELECT to_regclass($1) IS NOT NULL")
            .bind(format!("\"{}\"", self.sql.table))
            .fetch_one(&mut *tx)
            .await?;
        let applied: i64 = if exists {
            sqlx::query_scalar(
                "SELECT COALESCE(MAX(version), 0) FROM idem_migrations WHERE table_name = $1",
            )
            .bind(&self.sql.table)
            .fetch_one(&mut *tx)
            .await?
        } else {
            0
        };
        for (index, migration) in MIGRATIONS.iter().enumerate() {
            let version = index as i64 + 1;
            if version <= applied {
                continue;
            }
            let sql = render(migration, &self.sql.table).replace("{index}", &self.sql.index);
            // Through `Executor` on a `&str`, not `raw_sql`: the future of
            // `raw_sql(..).execute(..)` is not `Send` in every context.
            (&mut *tx).execute(sql.as_str()).await?;
            sqlx::query(
                "INSERT INTO idem_migrations (table_name, version, applied_at)
                 VALUES ($1, $2, $3) ON CONFLICT DO NOTHING",
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
    /// open transaction). Inside a transaction, a claim by another open
    /// transaction makes the insert wait for it to end.
    pub async fn begin_on(
        &self,
        conn: &mut PgConnection,
        req: &BeginRequest<'_>,
    ) -> Result<Begin, Error> {
        for _ in 0..CLAIM_ROUNDS {
            let fence: Option<i64> = self
                .claim_statement(&self.sql.claim, req)
                .fetch_optional(&mut *conn)
                .await?;
            if let Some(fence) = fence {
                return Ok(Begin::Claimed(Claim::granted(req, fence)));
            }
            // The key is taken: read the record to say why. If it is free
            // (expired, lapsed), take it over while it still is.
            let Some((record, now)) = self.read_on(conn, req.scope, req.key).await? else {
                continue;
            };
            if let Some(answer) = decide(req, &record, now).answer()? {
                return Ok(answer);
            }
            let fence: Option<i64> = self
                .claim_statement(&self.sql.take_over, req)
                .fetch_optional(&mut *conn)
                .await?;
            if let Some(fence) = fence {
                return Ok(Begin::Claimed(Claim::granted(req, fence)));
            }
        }
        Err(unsettled())
    }

    fn claim_statement<'q>(
        &self,
        sql: &'q str,
        req: &'q BeginRequest<'_>,
    ) -> sqlx::query::QueryScalar<'q, sqlx::Postgres, i64, sqlx::postgres::PgArguments> {
        sqlx::query_scalar(sql)
            .bind(req.scope.as_str())
            .bind(req.key.as_str())
            .bind(&req.fingerprint.as_bytes()[..])
            .bind(&req.token.as_bytes()[..])
            .bind(millis(req.lease))
            .bind(millis(req.ttl))
    }

    /// [`Store::peek`] on a given connection.
    pub async fn peek_on(
        &self,
        conn: &mut PgConnection,
        req: &BeginRequest<'_>,
    ) -> Result<Option<Begin>, Error> {
        match self.read_on(conn, req.scope, req.key).await? {
            None => Ok(None),
            Some((record, now)) => decide(req, &record, now).answer(),
        }
    }

    /// [`TransactionalStore::peek_in`](super::TransactionalStore::peek_in):
    /// a plain read on the caller's connection (`READ COMMITTED` sees the
    /// latest committed record, and a plain read locks nothing).
    pub async fn peek_in(
        &self,
        conn: &mut PgConnection,
        req: &BeginRequest<'_>,
    ) -> Result<Option<Begin>, Error> {
        self.peek_on(conn, req).await
    }

    /// [`Store::renew`] on a given connection.
    pub async fn renew_on(&self, conn: &mut PgConnection, claim: &Claim) -> Result<(), Error> {
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

    /// [`Store::complete`] on a given connection. Waiters in other
    /// processes are notified when the connection's transaction commits.
    pub async fn complete_on(
        &self,
        conn: &mut PgConnection,
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
        self.notify_on(conn, &claim.scope, &claim.key).await
    }

    /// [`Store::release`] on a given connection. Waiters in other processes
    /// are notified when the connection's transaction commits.
    pub async fn release_on(&self, conn: &mut PgConnection, claim: &Claim) -> Result<(), Error> {
        let done = sqlx::query(&self.sql.release)
            .bind(claim.scope.as_str())
            .bind(claim.key.as_str())
            .bind(&claim.token.as_bytes()[..])
            .execute(&mut *conn)
            .await?;
        if done.rows_affected() == 0 {
            return Err(Error::LeaseLost);
        }
        self.notify_on(conn, &claim.scope, &claim.key).await
    }

    /// [`Store::get`] on a given connection.
    pub async fn get_on(
        &self,
        conn: &mut PgConnection,
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
        conn: &mut PgConnection,
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

    /// Tells the listeners of every process that `(scope, key)` changed.
    /// The payload is the key, a space, then the scope (a key has no
    /// spaces). A payload too long for `NOTIFY` is not sent: waiters
    /// elsewhere then notice at their next poll.
    async fn notify_on(
        &self,
        conn: &mut PgConnection,
        scope: &Scope,
        key: &Key,
    ) -> Result<(), Error> {
        let payload = format!("{} {}", key.as_str(), scope.as_str());
        if payload.len() > MAX_NOTIFY_PAYLOAD {
            return Ok(());
        }
        sqlx::query("SELECT pg_notify($1, $2)")
            .bind(&self.sql.table)
            .bind(payload)
            .execute(&mut *conn)
            .await?;
        Ok(())
    }
}

fn record_from_row(row: &PgRow) -> Result<Record, Error> {
    StoredRecord {
        scope: row.try_get("scope")?,
        key: row.try_get("key")?,
        fingerprint: row.try_get("fingerprint")?,
        state: row.try_get("state")?,
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
impl Store for PostgresStore {
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
        self.listener
            .ensure_running(&self.pool, &self.sql.table, &self.waiters);
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

    fn wakes_across_processes(&self) -> bool {
        self.listener.is_listening()
    }

    fn detach(&self) -> Option<Arc<dyn Store>> {
        Some(Arc::new(self.clone()))
    }
}

/// The task relaying `NOTIFY`s of the store's channel to its [`Waiters`],
/// started on the first wait and stopped with the last clone of the store.
#[derive(Debug, Default)]
struct Listener {
    task: Mutex<Option<JoinHandle<()>>>,
    /// Whether the connection is listening right now.
    live: Arc<AtomicBool>,
}

impl Listener {
    fn is_listening(&self) -> bool {
        self.live.load(Ordering::Acquire)
    }

    fn ensure_running(&self, pool: &PgPool, channel: &str, waiters: &Arc<Waiters>) {
        let mut task = self.task.lock().unwrap_or_else(|e| e.into_inner());
        if task.as_ref().is_some_and(|t| !t.is_finished()) {
            return;
        }
        // Outside a runtime there is nothing to run it on: waiters poll.
        let Ok(runtime) = tokio::runtime::Handle::try_current() else {
            return;
        };
        *task = Some(runtime.spawn(listen(
            pool.connect_options(),
            channel.to_owned(),
            waiters.clone(),
            self.live.clone(),
        )));
    }
}

impl Drop for Listener {
    fn drop(&mut self) {
        let task = self.task.get_mut().unwrap_or_else(|e| e.into_inner());
        if let Some(task) = task.take() {
            task.abort();
        }
    }
}

/// Listens on `channel` for as long as the task lives, reconnecting after a
/// pause when the connection fails. Notifications sent while it is down are
/// lost; the waiters' polling covers them.
async fn listen(
    options: Arc<PgConnectOptions>,
    channel: String,
    waiters: Arc<Waiters>,
    live: Arc<AtomicBool>,
) {
    // A pool of one, of its own, only for reconnecting: the store's pool
    // keeps all its connections for statements.
    let pool = PgPoolOptions::new()
        .max_connections(1)
        .idle_timeout(None)
        .max_lifetime(None)
        .connect_lazy_with((*options).clone());
    let mut pause = Duration::from_millis(100);
    loop {
        let Err(err) = relay(&pool, &channel, &waiters, &mut pause, &live).await;
        live.store(false, Ordering::Release);
        tracing::warn!(
            error = %err,
            channel = %channel,
            "listening for idempotency notifications failed; waiters poll until it is back"
        );
        tokio::time::sleep(pause).await;
        pause = (pause * 2).min(Duration::from_secs(5));
    }
}

async fn relay(
    pool: &PgPool,
    channel: &str,
    waiters: &Waiters,
    pause: &mut Duration,
    live: &AtomicBool,
) -> Result<Infallible, sqlx::Error> {
    let mut listener = PgListener::connect_with(pool).await?;
    listener.ignore_pool_close_event(true);
    listener.listen(channel).await?;
    *pause = Duration::from_millis(100);
    live.store(true, Ordering::Release);
    loop {
        // `None`: the connection was lost and has been re-established;
        // notifications sent meanwhile are lost, so wake every waiter.
        let notification = listener.try_recv().await?;
        if notification.is_none() {
            waiters.wake_all();
        }
        if let Some(notification) = notification {
            let woken = notification
                .payload()
                .split_once(' ')
                .and_then(|(key, scope)| Some((Key::new(key).ok()?, Scope::from_stored(scope))));
            if let Some((key, scope)) = woken {
                waiters.wake(&scope, &key);
            }
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn index_names_fit_postgres_identifiers() {
        assert_eq!(index_name("idem_records"), "idem_records_expires_at");
        let long = "t".repeat(63);
        let index = index_name(&long);
        assert!(index.len() <= 63, "{index}");
        assert_ne!(index_name(&format!("{}a", "t".repeat(62))), index);
    }
}

super::transactional_store!(PostgresStore, sqlx::Postgres, PgConnection);
