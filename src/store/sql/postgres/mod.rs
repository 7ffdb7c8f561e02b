//! PostgreSQL: its records statements, clock, migrations and listener
//! ([`listener`]); entity mode runs its shared `ON CONFLICT` statements.

use sha2::{Digest, Sha256};
use sqlx::postgres::{PgConnection, PgPoolOptions, PgQueryResult, Postgres};

use super::dialect::Dialect;
use super::entity::EntityDatabase;
use super::migrate::{self, Bookkeeping};
use super::statements::{ClaimReturns, Numbered, Statements};
use super::step_statements::StepStatements;
use super::SqlStore;
use crate::store::sql::tx::TxConn;
use idem_core::error::Error;

mod listener;

use listener::Listener;

/// Records in a PostgreSQL database through a sqlx pool.
///
/// The claim is `INSERT ... ON CONFLICT (scope, key) DO NOTHING`, which
/// answers in the same round trip the record that holds a taken key; a
/// free one (expired, or a lapsed lease) is taken over with an
/// `UPDATE ... WHERE <still free>`. The primary
/// key on `(scope, key)` decides, so any number of connections, processes
/// and hosts sharing the database claim a key once; none of these
/// statements locks a row it does not claim, so a duplicate never holds a
/// lock the owner needs. Leases and expiry use the database's clock
/// (`clock_timestamp()`), so hosts with skewed clocks agree.
///
/// Duplicates waiting on a key are woken as soon as the first call completes
/// or releases it: in this process directly, in other processes through
/// `LISTEN`/`NOTIFY` on a channel named after the table. A completion
/// notifies only when a duplicate found its record in progress (and marked
/// it): a notifying commit takes a lock on the whole database, so commits
/// that notify run one at a time, and calls nobody waits for do not. The listening
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
pub type PostgresStore = SqlStore<Postgres>;

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
    // Whether a duplicate found the record in progress and may wait on
    // it: only then do its completion and release notify (a notifying
    // commit takes a database-wide lock, so commits that notify run one
    // at a time). Once set it stays set for the row.
    r#"ALTER TABLE "{table}" ADD COLUMN IF NOT EXISTS waited BOOLEAN NOT NULL DEFAULT false;
"#,
    // The step journal (see `backend/journal.rs`).
    r#"
CREATE TABLE IF NOT EXISTS "{table}_steps" (
    scope       TEXT   COLLATE "C" NOT NULL,
    key         TEXT   COLLATE "C" NOT NULL,
    seq         BIGINT NOT NULL CHECK (seq >= 0),
    name        TEXT   NOT NULL,
    fingerprint BYTEA  NOT NULL CHECK (octet_length(fingerprint) = 32),
    state       TEXT   NOT NULL CHECK (state IN ('started', 'completed', 'rerun_allowed')),
    claim_token BYTEA  NOT NULL CHECK (octet_length(claim_token) = 16),
    output      BYTEA,
    updated_at  BIGINT NOT NULL,
    expires_at  BIGINT NOT NULL,
    PRIMARY KEY (scope, key, seq),
    CHECK (state <> 'completed' OR output IS NOT NULL)
);
CREATE INDEX IF NOT EXISTS "{table}_steps_expires_at" ON "{table}_steps" (expires_at);
"#,
    // The outbox (see `backend/outbox.rs`).
    r#"
CREATE TABLE IF NOT EXISTS "{table}_outbox" (
    seq         BIGINT   GENERATED ALWAYS AS IDENTITY PRIMARY KEY,
    message_id  TEXT     COLLATE "C" NOT NULL UNIQUE,
    topic       TEXT     COLLATE "C" NOT NULL,
    message_key BYTEA,
    payload     BYTEA,
    headers     BYTEA    NOT NULL,
    attempts    BIGINT   NOT NULL,
    created_at  BIGINT   NOT NULL,
    expires_at  BIGINT   NOT NULL,
    lease_until BIGINT,
    lease_token BYTEA    CHECK (octet_length(lease_token) = 16),
    relayed_at  BIGINT
);
CREATE INDEX IF NOT EXISTS "{outbox_waiting}" ON "{table}_outbox" (seq) WHERE relayed_at IS NULL;
CREATE INDEX IF NOT EXISTS "{outbox_expires_at}" ON "{table}_outbox" (expires_at)
    WHERE relayed_at IS NOT NULL;
"#,
    // Parked outbox rows: the broker refused them for good (see
    // `outbox::Outbox::park`).
    r#"
ALTER TABLE "{table}_outbox" ADD COLUMN IF NOT EXISTS parked_at BIGINT,
    ADD COLUMN IF NOT EXISTS parked_reason TEXT;
"#,
];

/// Deletes at most a batch of expired journal entries, skipping rows a
/// write holds.
const PURGE_STEPS: &str = "DELETE FROM {steps} WHERE ctid = ANY(ARRAY(
        SELECT ctid FROM {steps} WHERE expires_at <= {now} LIMIT ? FOR UPDATE SKIP LOCKED))
      AND expires_at <= {now}";

const BOOKKEEPING: Bookkeeping = Bookkeeping {
    create: "CREATE TABLE IF NOT EXISTS \"{migrations}\" (
            table_name TEXT   NOT NULL,
            version    BIGINT NOT NULL,
            applied_at BIGINT NOT NULL,
            PRIMARY KEY (table_name, version)
        )",
    exists: r#"SELECT COUNT(*) FROM pg_class WHERE oid = to_regclass('"{table}"')"#,
    applied: "SELECT COALESCE(MAX(version), 0) FROM \"{migrations}\" WHERE table_name = $1",
    record: "INSERT INTO \"{migrations}\" (table_name, version, applied_at)
        VALUES ($1, $2, $3) ON CONFLICT DO NOTHING",
};

/// The database's clock in milliseconds since the Unix epoch: every lease
/// and expiry is decided with it, never with the application's clock.
const NOW: &str = "(EXTRACT(EPOCH FROM clock_timestamp()) * 1000)::BIGINT";

/// The advisory lock that serializes migrations across processes
/// (`"idemmigr"` in ASCII).
const MIGRATION_LOCK: i64 = 0x6964_656d_6d69_6772;

/// Answers the record holding the key, or, when there is none, inserts a
/// new record, in one round trip: a replay is this one statement, and
/// costs one index lookup, as a plain read does (the insert runs only when
/// the lookup found nothing).
///
/// `ON CONFLICT DO NOTHING` locks nothing, so a duplicate (even inside a
/// caller's transaction) holds no lock the owner needs. The existing row
/// is read with the statement's snapshot: a row committed after it began
/// (the conflict waited for its inserter) is not in it, and the statement
/// answers no row; the record is then read again. A free record (expired,
/// or a lapsed lease) is taken over with [`TAKE_OVER`].
const CLAIM: &str = r#"WITH c AS (SELECT {now} AS now),
    held AS (
        SELECT scope, key, fingerprint, state, fence, claim_token, lease_until,
            outcome_kind, outcome, created_at, expires_at
        FROM "{table}" WHERE scope = $1 AND key = $2),
    ins AS (
        INSERT INTO "{table}"
            (scope, key, fingerprint, state, fence, claim_token, lease_until,
             created_at, expires_at)
        SELECT $1, $2, $3, 'in_progress', 1, $4, c.now + $5, c.now,
               c.now + GREATEST($5, $6)
        FROM c
        WHERE NOT EXISTS (SELECT 1 FROM held)
        ON CONFLICT (scope, key) DO NOTHING
        RETURNING scope, key, fingerprint, state, fence, claim_token, lease_until,
            outcome_kind, outcome, created_at, expires_at),
    kept AS (
        UPDATE "{table}_steps" AS j SET expires_at = c.now + GREATEST($5, $6)
        FROM c
        WHERE j.scope = $1 AND j.key = $2 AND EXISTS (SELECT 1 FROM ins)
          AND j.expires_at > c.now AND j.expires_at < c.now + GREATEST($5, $6))
    SELECT ins.*, c.now AS db_now FROM ins, c
    UNION ALL
    SELECT held.*, c.now AS db_now FROM held, c"#;

const TAKE_OVER: &str = r#"WITH c AS (SELECT {now} AS now),
    taken AS (
    UPDATE "{table}" AS t SET
        fingerprint = $3,
        state = 'in_progress',
        fence = t.fence + 1,
        claim_token = $4,
        lease_until = c.now + $5,
        outcome_kind = NULL,
        outcome = NULL,
        created_at = c.now,
        expires_at = c.now + GREATEST($5, $6)
    FROM c
    WHERE t.scope = $1 AND t.key = $2
      AND (t.expires_at <= c.now
           OR (t.state = 'in_progress'
               AND t.lease_until <= c.now
               AND t.fingerprint = $3))
    RETURNING t.fence),
    kept AS (
        UPDATE "{table}_steps" AS j SET expires_at = c.now + GREATEST($5, $6)
        FROM c
        WHERE j.scope = $1 AND j.key = $2 AND EXISTS (SELECT 1 FROM taken)
          AND j.expires_at > c.now AND j.expires_at < c.now + GREATEST($5, $6))
    SELECT fence FROM taken"#;

const SELECT: &str = r#"SELECT scope, key, fingerprint, state, fence, claim_token, lease_until,
        outcome_kind, outcome, created_at, expires_at, {now} AS db_now
    FROM "{table}" WHERE scope = $1 AND key = $2"#;

/// The record as a waiter sees it when it starts to wait (registered in
/// this process, listening), marking it `waited` while it is in progress,
/// so that its completion or release notifies. Only the first waiter
/// writes; the mark runs on the store's pool, never in a caller's
/// transaction, and holds the row for its own commit only.
///
/// The row is the mark's when it marked (the latest version), else the
/// statement's snapshot: marked already (every later completion
/// notifies), or not in progress any more. In that last case a completion
/// committed between the snapshot and the mark can show the record still
/// in progress though nothing will notify: the waiter then looks again
/// at its next poll (at most 500 ms later); waiters in the completing
/// process are woken in process all the same. A row locked by a write
/// still open (a transactional owner's takeover) is skipped, not waited
/// for: the waiter then polls, within its own wait bound.
const LOOK: &str = r#"WITH c AS (SELECT {now} AS now),
    mark AS (
        UPDATE "{table}" SET waited = true
        WHERE ctid = (
            SELECT ctid FROM "{table}"
            WHERE scope = $1 AND key = $2 AND state = 'in_progress' AND NOT waited
            FOR UPDATE SKIP LOCKED)
          AND state = 'in_progress' AND NOT waited
        RETURNING scope, key, fingerprint, state, fence, claim_token, lease_until,
            outcome_kind, outcome, created_at, expires_at)
    SELECT mark.*, c.now AS db_now FROM mark, c
    UNION ALL
    SELECT t.scope, t.key, t.fingerprint, t.state, t.fence, t.claim_token, t.lease_until,
        t.outcome_kind, t.outcome, t.created_at, t.expires_at, c.now AS db_now
    FROM "{table}" AS t, c
    WHERE t.scope = $1 AND t.key = $2 AND NOT EXISTS (SELECT 1 FROM mark)"#;

const RENEW: &str = r#"UPDATE "{table}" AS t
    SET lease_until = c.now + $4, expires_at = GREATEST(t.expires_at, c.now + $4)
    FROM (SELECT {now} AS now) AS c
    WHERE t.scope = $1 AND t.key = $2 AND t.claim_token = $3
      AND t.state = 'in_progress'"#;

/// Completes, and in the same round trip, when a duplicate marked the
/// record `waited`, tells the listeners of every process (`NOTIFY` on the
/// table's channel, delivered when the transaction commits) that the key
/// changed: the payload is the key, a space, then the scope (a key has no
/// spaces; both are short enough for `NOTIFY`, as checked below). The
/// statement answers one row per record written, notifying or not, so the
/// fenced check counts the same as the bare `UPDATE`.
const COMPLETE: &str = r#"WITH done AS (
        UPDATE "{table}"
        SET state = 'completed', outcome_kind = $1, outcome = $2,
            lease_until = NULL, expires_at = {now} + $3
        WHERE scope = $4 AND key = $5 AND claim_token = $6
          AND (state = 'in_progress'
               OR (state = 'completed' AND outcome_kind = $1 AND outcome = $2))
        RETURNING waited)
    SELECT CASE WHEN done.waited THEN pg_notify('{table}', $5 || ' ' || $4) END FROM done"#;

// `NOTIFY` refuses payloads of 8000 bytes or more: the longest key, a
// space and the longest stored scope stay far below.
const _: () = assert!(idem_core::key::MAX_KEY_LEN + 1 + idem_core::key::MAX_SCOPE_LEN < 8000);

/// Releases, and notifies as [`COMPLETE`] does.
const RELEASE: &str = r#"WITH done AS (
        DELETE FROM "{table}"
        WHERE scope = $1 AND key = $2 AND claim_token = $3 AND state = 'in_progress'
        RETURNING waited)
    SELECT CASE WHEN done.waited THEN pg_notify('{table}', $2 || ' ' || $1) END FROM done"#;

/// Forgets, and notifies as [`COMPLETE`] does.
const FORGET: &str = r#"WITH done AS (
        DELETE FROM "{table}" WHERE scope = $1 AND key = $2
        RETURNING 1)
    SELECT pg_notify('{table}', $2 || ' ' || $1) FROM done"#;

/// Rows a claim is taking over right now are skipped, not waited for: the
/// purge never queues behind, nor blocks, new claims.
const PURGE: &str = r#"DELETE FROM "{table}"
    WHERE ctid = ANY(ARRAY(
        SELECT ctid FROM "{table}" WHERE expires_at <= {now}
        LIMIT $1 FOR UPDATE SKIP LOCKED))
      AND expires_at <= {now}"#;

impl Dialect for Postgres {
    const LOCK_SHARE: &'static str = " FOR SHARE";
    const LOCK_UPDATE: &'static str = " FOR UPDATE";
    const SKIP_LOCKED: &'static str = " FOR UPDATE SKIP LOCKED";
    const PEEK_IN_CALLER: bool = true;
    const CLAIM_LOCKS_ONLY_ITS_OWN: bool = true;
    const CLAIM_KEEPS_JOURNAL: bool = true;
    /// A `bytea` value, and the whole message that binds the completion's
    /// values, hold less than 1 GiB (the server's `MaxAllocSize`); some
    /// room is left for the statement's other values.
    const MAX_OUTCOME_BYTES: usize = (1 << 30) - 1 - (1 << 16);
    const MAX_OUTCOME_LIMIT: &'static str =
        "PostgreSQL's limit of 1 GiB on a value and on a message";
    const NOW: &'static str = NOW;
    const TABLE_EXISTS: &'static str = BOOKKEEPING.exists;
    type Wake = Listener;

    fn param(n: usize) -> String {
        format!("${n}")
    }

    fn statements(table: String) -> Statements {
        // None of these statements locks a row it does not claim, so a
        // duplicate never holds a lock the owner needs.
        Numbered {
            claim: CLAIM,
            take_over: Some(TAKE_OVER),
            select: SELECT,
            look: Some(LOOK),
            renew: RENEW,
            complete: COMPLETE,
            release: RELEASE,
            forget: FORGET,
            purge: PURGE,
        }
        .on(
            table.clone(),
            NOW,
            ClaimReturns::Record,
            StepStatements::new::<Postgres>(&table, NOW, PURGE_STEPS),
        )
    }

    fn rows_affected(result: &PgQueryResult) -> u64 {
        result.rows_affected()
    }

    async fn migrate(store: &SqlStore<Self>) -> Result<(), Error> {
        // Closed rather than pooled if this call is dropped before its
        // transaction ends (see `TxConn`).
        let mut conn = TxConn::acquire(&store.pool).await?;
        let mut tx = conn.begin(None).await?;
        sqlx::query("SELECT pg_advisory_xact_lock($1)")
            .bind(MIGRATION_LOCK)
            .execute(&mut *tx)
            .await?;
        let table = &store.sql.table;
        let index = index_name(table);
        let waiting = short_name(&format!("{table}_outbox_waiting"));
        let expires = short_name(&format!("{table}_outbox_expires_at"));
        migrate::apply::<Postgres>(
            &mut tx,
            table,
            &store.migrations,
            &BOOKKEEPING,
            MIGRATIONS,
            |sql| {
                sql.replace("{index}", &index)
                    .replace("{outbox_waiting}", &waiting)
                    .replace("{outbox_expires_at}", &expires)
            },
        )
        .await?;
        tx.commit().await?;
        conn.ended();
        Ok(())
    }

    fn listen(store: &SqlStore<Self>) {
        store
            .wake
            .ensure_running(&store.pool, &store.sql.table, &store.waiters);
    }

    fn wakes_across_processes(store: &SqlStore<Self>) -> bool {
        store.wake.is_listening()
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

/// `name`, shortened with a digest of it when it would pass PostgreSQL's
/// 63-byte identifier limit.
fn short_name(name: &str) -> String {
    if name.len() <= 63 {
        return name.to_owned();
    }
    let digest = Sha256::digest(name.as_bytes());
    let hex: String = digest[..4].iter().map(|b| format!("{b:02x}")).collect();
    format!("{}_{hex}", &name[..54])
}

impl SqlStore<Postgres> {
    /// Connects a pool to `url` (`postgres://user:password@host:port/db`)
    /// and applies the migrations to the default table `idem_records`.
    ///
    /// The pool logs its statements at TRACE, and one slower than a
    /// second at INFO (sqlx's defaults are DEBUG and WARN).
    pub async fn connect(url: &str) -> Result<Self, Error> {
        let options = super::service_logging(url.parse::<sqlx::postgres::PgConnectOptions>()?);
        let pool = PgPoolOptions::new().connect_with(options).await?;
        let store = SqlStore::new(pool);
        store.migrate().await?;
        Ok(store)
    }
}

/// Entity mode with the shared `INSERT ... ON CONFLICT ... RETURNING *`
/// statements.
impl EntityDatabase for Postgres {}

super::transactional_store!(Postgres, PgConnection);

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
        let long = format!("{}_outbox_waiting", "t".repeat(57));
        assert_eq!(short_name(&long).len(), 63);
        assert_ne!(
            short_name(&long),
            short_name(&format!("{}_outbox_expires_at", "t".repeat(57)))
        );
        assert_eq!(short_name("a_outbox_waiting"), "a_outbox_waiting");
    }
}
