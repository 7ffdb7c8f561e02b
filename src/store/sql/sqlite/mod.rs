//! SQLite, the embedded default, and all of its SQL: every statement on
//! the records table, the step journal, the outbox, an operator's reads
//! and entity mode's ([`sql`]); here, its clock ([`NOW`]), its
//! migrations and their bookkeeping, and its true differences
//! ([`Dialect`]): one write at a time, which `BEGIN IMMEDIATE` takes from
//! the start.

mod sql;

use std::str::FromStr;
use std::time::Duration;

use sqlx::sqlite::{
    Sqlite, SqliteConnectOptions, SqliteConnection, SqliteJournalMode, SqlitePoolOptions,
    SqliteQueryResult,
};

use super::dialect::Dialect;
use super::migrate::{self, Bookkeeping};
use super::read_first::ReadFirst;
use super::tx::{in_memory, TxConn};
use super::SqlStore;
use idem_core::error::Error;

/// Records in a SQLite database through a sqlx pool.
///
/// The claim is one `INSERT ... ON CONFLICT (scope, key) DO UPDATE ... WHERE
/// <expired or lease lapsed> RETURNING fence` statement: the primary key on
/// `(scope, key)` decides, so any number of connections or processes sharing
/// the database file claim a key once. File databases use WAL and a busy
/// timeout so that concurrent writers queue instead of failing. Leases and
/// expiry use SQLite's `julianday('now')`: the clock of the host the
/// database file is on.
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
pub type SqliteStore = SqlStore<Sqlite>;

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
    // The step journal (see `sql.rs`).
    r#"
CREATE TABLE IF NOT EXISTS "{table}_steps" (
    scope       TEXT    NOT NULL,
    key         TEXT    NOT NULL,
    seq         INTEGER NOT NULL CHECK (seq >= 0),
    name        TEXT    NOT NULL,
    fingerprint BLOB    NOT NULL,
    state       TEXT    NOT NULL CHECK (state IN ('started', 'completed', 'rerun_allowed')),
    claim_token BLOB    NOT NULL,
    output      BLOB,
    updated_at  INTEGER NOT NULL,
    expires_at  INTEGER NOT NULL,
    PRIMARY KEY (scope, key, seq),
    CHECK (state <> 'completed' OR output IS NOT NULL)
);
CREATE INDEX IF NOT EXISTS "{table}_steps_expires_at" ON "{table}_steps" (expires_at);
"#,
    // The outbox (see `sql.rs`). AUTOINCREMENT: a purged row's
    // number is never given again, so the order of rows is the order they
    // were written in.
    r#"
CREATE TABLE IF NOT EXISTS "{table}_outbox" (
    seq         INTEGER PRIMARY KEY AUTOINCREMENT,
    message_id  TEXT    NOT NULL UNIQUE,
    topic       TEXT    NOT NULL,
    message_key BLOB,
    payload     BLOB,
    headers     BLOB    NOT NULL,
    attempts    INTEGER NOT NULL,
    created_at  INTEGER NOT NULL,
    expires_at  INTEGER NOT NULL,
    lease_until INTEGER,
    lease_token BLOB,
    relayed_at  INTEGER
);
CREATE INDEX IF NOT EXISTS "{table}_outbox_waiting" ON "{table}_outbox" (relayed_at, seq);
CREATE INDEX IF NOT EXISTS "{table}_outbox_expires_at" ON "{table}_outbox" (expires_at);
"#,
    // Parked outbox rows: the broker refused them for good (see
    // `outbox::Outbox::park`).
    r#"
ALTER TABLE "{table}_outbox" ADD COLUMN parked_at INTEGER;
ALTER TABLE "{table}_outbox" ADD COLUMN parked_reason TEXT;
"#,
];

const BOOKKEEPING: Bookkeeping = Bookkeeping {
    create: "CREATE TABLE IF NOT EXISTS \"{migrations}\" (
            table_name TEXT    NOT NULL,
            version    INTEGER NOT NULL,
            applied_at INTEGER NOT NULL,
            PRIMARY KEY (table_name, version)
        )",
    exists: "SELECT COUNT(*) FROM sqlite_master WHERE type = 'table' AND name = '{table}'",
    applied: "SELECT COALESCE(MAX(version), 0) FROM \"{migrations}\" WHERE table_name = ?1",
    record: "INSERT OR IGNORE INTO \"{migrations}\" (table_name, version, applied_at)
        VALUES (?1, ?2, ?3)",
};

/// The database's clock in milliseconds since the Unix epoch (SQLite's
/// `'now'` is the same within one statement): every lease and expiry is
/// decided with it.
const NOW: &str = "CAST(ROUND((julianday('now') - 2440587.5) * 86400000.0) AS INTEGER)";

impl Dialect for Sqlite {
    const BEGIN_WRITE: &'static str = "BEGIN IMMEDIATE";
    const WRITES_IN_PARALLEL: bool = false;
    const SMALL_OUTCOME_KIND: bool = false;
    const READ_FIRST: ReadFirst = ReadFirst::WhileDuplicates;
    /// A blob holds at most `SQLITE_MAX_LENGTH` bytes, 10^9 as SQLite is
    /// built by default (and by sqlx's bundled build).
    const MAX_OUTCOME_BYTES: usize = 1_000_000_000;
    const MAX_OUTCOME_LIMIT: &'static str = "SQLite's limit of 10^9 bytes on a value";
    const NOW: &'static str = NOW;
    const TABLE_EXISTS: &'static str = BOOKKEEPING.exists;
    type Wake = ();

    fn param(n: usize) -> String {
        format!("?{n}")
    }

    fn rows_affected(result: &SqliteQueryResult) -> u64 {
        result.rows_affected()
    }

    async fn holds_lock_or_snapshot(conn: &mut SqliteConnection) -> Result<bool, Error> {
        let mut handle = conn.lock_handle().await?;
        let db = handle.as_raw_handle().as_ptr();
        // SAFETY: `db` is the connection's open handle, locked for this
        // thread's use while `handle` lives; a null schema asks about
        // every database attached to it.
        let state = unsafe { libsqlite3_sys::sqlite3_txn_state(db, std::ptr::null()) };
        // A read counts as much as a write: a commit through another
        // connection would leave the transaction's snapshot stale, and its
        // first write would then fail at once (SQLITE_BUSY_SNAPSHOT in WAL
        // mode; in rollback mode the commit would wait for its shared
        // lock).
        Ok(state != libsqlite3_sys::SQLITE_TXN_NONE as std::os::raw::c_int)
    }

    fn write_gate(pool: &sqlx::Pool<Sqlite>) -> Option<std::path::PathBuf> {
        let options = pool.connect_options();
        let file = options.get_filename();
        // One connection queues its writes by itself; an in-memory
        // database has no file to name it by.
        let one = pool.options().get_max_connections() <= 1;
        if one || in_memory(pool) {
            return None;
        }
        // As the pool names it: every store on one pool shares a gate (a
        // file opened under two names gets two, and queues less).
        Some(file.to_owned())
    }

    async fn migrate(store: &SqlStore<Self>) -> Result<(), Error> {
        // Closed rather than pooled if this call is dropped before its
        // transaction ends (see `TxConn`): a pooled connection would keep
        // the database's write lock until its next use.
        let mut conn = TxConn::acquire(&store.pool).await?;
        // IMMEDIATE: the write lock from the start. A deferred transaction
        // that read first could not be upgraded while another migrator
        // writes (SQLITE_BUSY at once, whatever the busy timeout).
        let mut tx = conn.begin(Some("BEGIN IMMEDIATE")).await?;
        migrate::apply::<Sqlite>(
            &mut tx,
            &store.sql.table,
            &store.migrations,
            &BOOKKEEPING,
            MIGRATIONS,
            |s| s,
        )
        .await?;
        tx.commit().await?;
        conn.ended();
        Ok(())
    }
}

impl SqlStore<Sqlite> {
    /// Opens (creating if missing) the database at `url` (`sqlite://path`,
    /// `sqlite:path`, or `sqlite::memory:`), and applies the migrations to
    /// the default table `idem_records`.
    ///
    /// An in-memory database lives in one connection that the pool never
    /// closes, so it lasts as long as the store.
    ///
    /// The pool logs its statements at TRACE, and one slower than a
    /// second at INFO (sqlx's defaults are DEBUG and WARN).
    pub async fn connect(url: &str) -> Result<Self, Error> {
        let options = super::service_logging(SqliteConnectOptions::from_str(url)?)
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
        Self::migrated(pool).await
    }
}

super::transactional_store!(Sqlite, SqliteConnection);

#[cfg(test)]
mod tests {
    use std::time::Duration;

    use crate::store::Store;
    use crate::SqliteStore;
    use idem_core::fingerprint::Fingerprint;
    use idem_core::key::{Key, Scope};
    use idem_core::record::{Begin, BeginRequest, ClaimToken, Outcome, OutcomeKind};

    fn request<'a>(
        scope: &'a Scope,
        key: &'a Key,
        fingerprint: &'a Fingerprint,
    ) -> BeginRequest<'a> {
        BeginRequest {
            scope,
            key,
            fingerprint,
            token: ClaimToken::new(),
            lease: Duration::from_secs(60),
            ttl: Duration::from_secs(3600),
        }
    }

    /// Every kind of duplicate gets the same answer whether the store
    /// claims at once (duplicates rare) or reads first (duplicates
    /// common), on a file database, where the claim waits at the gate.
    #[tokio::test]
    async fn duplicates_get_the_same_answer_with_or_without_the_read_first() {
        let dir = tempfile::tempdir().unwrap();
        let url = format!("sqlite://{}", dir.path().join("rf.db").display());
        let store = SqliteStore::connect(&url).await.unwrap();
        assert!(store.gate.is_on());
        let scope = Scope::from("rf");
        let (done, running) = (Key::new("done").unwrap(), Key::new("running").unwrap());
        let (paid, other) = (Fingerprint::of(&1).unwrap(), Fingerprint::of(&2).unwrap());
        let outcome = Outcome {
            kind: OutcomeKind::Ok,
            body: b"42".to_vec(),
        };
        let Begin::Claimed(claim) = store.begin(&request(&scope, &done, &paid)).await.unwrap()
        else {
            panic!("a fresh key is claimed");
        };
        store.complete(&claim, &outcome).await.unwrap();
        let Begin::Claimed(_) = store
            .begin(&request(&scope, &running, &paid))
            .await
            .unwrap()
        else {
            panic!("a fresh key is claimed");
        };

        for reads_first in [false, true] {
            // Two claims, none found taken: the store claims at once; the
            // three duplicates below turn the read on.
            assert_eq!(store.duplicates.read_first(), reads_first);
            assert_eq!(
                store.begin(&request(&scope, &done, &paid)).await.unwrap(),
                Begin::Replay(outcome.clone())
            );
            assert_eq!(
                store.begin(&request(&scope, &done, &other)).await.unwrap(),
                Begin::KeyReused
            );
            assert!(matches!(
                store
                    .begin(&request(&scope, &running, &paid))
                    .await
                    .unwrap(),
                Begin::InProgress { .. }
            ));
        }
        // First executions turn it back off.
        for i in 0..12 {
            let key = Key::new(format!("fresh-{i}")).unwrap();
            assert!(matches!(
                store.begin(&request(&scope, &key, &paid)).await.unwrap(),
                Begin::Claimed(_)
            ));
        }
        assert!(!store.duplicates.read_first());
    }
}
