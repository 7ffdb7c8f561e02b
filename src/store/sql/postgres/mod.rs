//! PostgreSQL and all of its SQL: every statement on the records table,
//! the step journal, the outbox, an operator's reads and entity mode's
//! ([`sql`]); here, its clock ([`NOW`]), its migrations and their
//! bookkeeping, the advisory lock that keeps migrators apart, and its
//! true differences ([`Dialect`]); and the listener that wakes waiters
//! in other processes ([`listener`]).

use sha2::{Digest, Sha256};
use sqlx::postgres::{PgConnection, PgQueryResult, Postgres};

use super::dialect::Dialect;
use super::migrate::{self, Bookkeeping};
use super::SqlStore;
use crate::store::sql::tx::TxConn;
use idem_core::error::Error;

mod listener;
mod sql;

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
    // The step journal (see `sql.rs`).
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
    // The outbox (see `sql.rs`).
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

impl Dialect for Postgres {
    const BEGIN_WRITE: &'static str = "BEGIN";
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
        Self::connect_to_server(url).await
    }
}

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
