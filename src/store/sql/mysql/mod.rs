//! MySQL and MariaDB, and all of their SQL: every statement on the
//! records table, the step journal, the outbox, an operator's reads and
//! entity mode's, with how entity mode's run without `RETURNING`
//! ([`sql`]); here, their clock ([`NOW`]), their migrations and
//! bookkeeping, the named lock that keeps migrators apart, the limits of
//! a statement, and the errors InnoDB answers with ([`Dialect`]).

mod sql;

use sqlx::mysql::{MySql, MySqlConnection, MySqlQueryResult};

use super::dialect::{Dialect, Refusal};
use super::migrate::{self, Bookkeeping};
use super::read_first::ReadFirst;
use super::statements::{Param, Statement};
use super::SqlStore;
use idem_core::error::Error;
use idem_core::record::BeginRequest;

/// Records in a MySQL (8.0 or later) or MariaDB (10.5 or later) database
/// through a sqlx pool.
///
/// The claim is one `INSERT ... ON DUPLICATE KEY UPDATE` statement: the
/// primary key on `(scope, key)` decides, so any number of connections,
/// processes and hosts sharing the database claim a key once. Each attempt
/// writes a fresh random claim token with the record; the row the
/// statement leaves, answered in the same round trip (`RETURNING`, MariaDB
/// 10.5+) or read back on the same connection (MySQL), tells whether this
/// attempt holds it (then with which fence) or why not. On the pool a
/// claim reads the record first, so a replay is one plain read that locks
/// nothing. Leases and expiry use the database's clock
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
pub type MySqlStore = SqlStore<MySql>;

/// The longest scope (operation and principal) the table holds, in bytes.
const MAX_SCOPE_LEN: usize = 1024;

/// The embedded migrations, in order, one statement each. `{table}` is the
/// records table.
///
/// Scope and key are binary strings, so they compare byte for byte, case
/// and trailing spaces included, whatever the server's collation. The
/// primary key (at most 1024 + 255 bytes) fits InnoDB's 3072-byte limit
/// with the `DYNAMIC` row format.
const MIGRATIONS: &[&str] = &[
    r#"
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
"#,
    // The step journal (see `sql.rs`).
    r#"
CREATE TABLE IF NOT EXISTS `{table}_steps` (
    scope       VARBINARY(1024) NOT NULL,
    `key`       VARBINARY(255)  NOT NULL,
    seq         BIGINT          NOT NULL,
    name        VARCHAR(64) CHARACTER SET ascii COLLATE ascii_bin NOT NULL,
    fingerprint BINARY(32)      NOT NULL,
    state       VARCHAR(13) CHARACTER SET ascii COLLATE ascii_bin NOT NULL,
    claim_token BINARY(16)      NOT NULL,
    output      LONGBLOB        NULL,
    updated_at  BIGINT          NOT NULL,
    expires_at  BIGINT          NOT NULL,
    PRIMARY KEY (scope, `key`, seq),
    KEY expires_at (expires_at),
    CHECK (seq >= 0),
    CHECK (state IN ('started', 'completed', 'rerun_allowed')),
    CHECK (state <> 'completed' OR output IS NOT NULL)
) ENGINE = InnoDB ROW_FORMAT = DYNAMIC
"#,
    // The outbox (see `sql.rs`).
    r#"
CREATE TABLE IF NOT EXISTS `{table}_outbox` (
    seq         BIGINT          NOT NULL AUTO_INCREMENT,
    message_id  VARBINARY(255)  NOT NULL,
    topic       VARBINARY(255)  NOT NULL,
    message_key LONGBLOB        NULL,
    payload     LONGBLOB        NULL,
    headers     LONGBLOB        NOT NULL,
    attempts    BIGINT          NOT NULL,
    created_at  BIGINT          NOT NULL,
    expires_at  BIGINT          NOT NULL,
    lease_until BIGINT          NULL,
    lease_token BINARY(16)      NULL,
    relayed_at  BIGINT          NULL,
    PRIMARY KEY (seq),
    UNIQUE KEY message_id (message_id),
    KEY waiting (relayed_at, seq),
    KEY expires_at (expires_at)
) ENGINE = InnoDB ROW_FORMAT = DYNAMIC
"#,
    // Parked outbox rows: the broker refused them for good (see
    // `outbox::Outbox::park`). One statement, so both columns come or
    // neither; without `IF NOT EXISTS`, which MySQL lacks: a run whose
    // record was lost finds the columns there (`column_exists_already`).
    r#"
ALTER TABLE `{table}_outbox` ADD COLUMN parked_at BIGINT NULL,
    ADD COLUMN parked_reason BLOB NULL
"#,
];

/// The server-wide lock that serializes migrations across processes.
const MIGRATION_LOCK: &str = "idem_migrations";
/// How long a migration waits for that lock, in seconds.
const MIGRATION_LOCK_WAIT: i64 = 60;

const BOOKKEEPING: Bookkeeping = Bookkeeping {
    create: "CREATE TABLE IF NOT EXISTS `{migrations}` (
            table_name VARCHAR(64) CHARACTER SET ascii COLLATE ascii_bin NOT NULL,
            version    BIGINT NOT NULL,
            applied_at BIGINT NOT NULL,
            PRIMARY KEY (table_name, version)
        ) ENGINE = InnoDB",
    exists: "SELECT COUNT(*) FROM information_schema.tables
        WHERE table_schema = DATABASE() AND table_name = '{table}'",
    applied: "SELECT COALESCE(MAX(version), 0) FROM `{migrations}` WHERE table_name = ?",
    record: "INSERT INTO `{migrations}` (table_name, version, applied_at)
        VALUES (?, ?, ?) ON DUPLICATE KEY UPDATE version = version",
};

/// The database's clock in milliseconds since the Unix epoch, whatever the
/// session's time zone: every lease and expiry is decided with it, never
/// with the application's clock.
const NOW: &str = "(TIMESTAMPDIFF(MICROSECOND, '1970-01-01 00:00:00', UTC_TIMESTAMP(6)) DIV 1000)";

/// What a completion's statement carries beside its SQL and outcomes
/// (scope, key, token, numbers, packet headers), at most.
const PACKET_SLACK: usize = 4096;

/// The statement length from which a completion asks the server's
/// `max_allowed_packet` first: below any value a server would run with
/// (MariaDB's default is 16 MiB, MySQL's 64 MiB).
const PACKET_ASKED_FROM: usize = 256 * 1024;

impl Dialect for MySql {
    const BEGIN_WRITE: &'static str = "BEGIN";
    const TEXT_AS_BYTES: bool = true;
    // A read before the claim only while duplicates are common: the
    // claim's upsert answers the record holding the key (RETURNING), and
    // the row lock it takes ends with its own statement (autocommit), so
    // a first execution, the commoner call, saves a round trip, and a
    // retry storm is still answered by plain reads. Inside a caller's
    // transaction, where that lock would last, the read beside stays
    // (`peek_in`).
    const READ_FIRST: ReadFirst = ReadFirst::WhileDuplicates;
    const NOW: &'static str = NOW;
    const TABLE_EXISTS: &'static str = BOOKKEEPING.exists;
    type Wake = ();

    fn param(n: usize) -> String {
        let _ = n;
        "?".to_owned()
    }

    fn rows_affected(result: &MySqlQueryResult) -> u64 {
        // sqlx asks for found rows, so a matched row counts even unchanged.
        result.rows_affected()
    }

    /// A named lock (`GET_LOCK`) serializes migrators: DDL is not
    /// transactional in MySQL.
    async fn migrate(store: &SqlStore<Self>) -> Result<(), Error> {
        let mut conn = store.pool.acquire().await?;
        // The named lock belongs to the session: a connection that went
        // back to the pool holding it (this call dropped between the lock
        // and its release) would keep every later migrator waiting. Closed
        // after use instead; a migration runs once per table and process.
        conn.close_on_drop();
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
        let migrated = migrate::apply::<MySql>(
            &mut conn,
            &store.sql.table,
            &store.migrations,
            &BOOKKEEPING,
            MIGRATIONS,
            |s| s,
        )
        .await;
        // The lock is what keeps two migrators apart, so give it back even
        // when a step failed.
        let unlocked = sqlx::query("SELECT RELEASE_LOCK(?)")
            .bind(MIGRATION_LOCK)
            .execute(&mut *conn)
            .await;
        migrated?;
        unlocked?;
        Ok(())
    }

    /// A statement longer than the server's `max_allowed_packet` is not
    /// refused with an error: the server closes the connection, which
    /// looks like any lost connection, so the completion would be sent
    /// again for ever. A completion carries its outcome twice; where that
    /// makes a large statement, the limit is asked first, on the same
    /// connection (the server's current value, which its administrator
    /// may raise).
    async fn check_outcome(
        conn: &mut MySqlConnection,
        statement: &Statement,
        outcome: &idem_core::record::Outcome,
    ) -> Result<(), Error> {
        let copies = statement
            .params
            .iter()
            .filter(|p| matches!(p, Param::Outcome))
            .count();
        let len = statement.sql.len() + copies * outcome.body.len() + PACKET_SLACK;
        if len <= PACKET_ASKED_FROM {
            return Ok(());
        }
        let limit: u64 = sqlx::query_scalar("SELECT @@max_allowed_packet")
            .fetch_one(&mut *conn)
            .await?;
        if len as u64 > limit {
            return Err(Error::Unrecorded(format!(
                "an outcome of {} bytes makes a completion of some {len} bytes, over the \
                 server's max_allowed_packet of {limit}",
                outcome.body.len()
            )));
        }
        Ok(())
    }

    fn check_request(request: &BeginRequest<'_>) -> Result<(), Error> {
        let scope_len = request.scope.as_str().len();
        if scope_len > MAX_SCOPE_LEN {
            return Err(Error::Config(format!(
                "the scope is {scope_len} bytes long; the MySQL store keeps scopes of at most \
                 {MAX_SCOPE_LEN} bytes"
            )));
        }
        Ok(())
    }

    /// InnoDB's refusals, by error number: a deadlock's victim rolled
    /// back (ER_LOCK_DEADLOCK, 1213; not every error of SQLSTATE 40001,
    /// which a trigger's `SIGNAL` may carry too); a locking read or write
    /// of a row changed since the transaction's snapshot (MariaDB's
    /// `innodb_snapshot_isolation`: error 1020, "Record has changed since
    /// last read"); a statement the server cannot parse (ER_PARSE_ERROR, 1064: MySQL, and MariaDB
    /// before 10.5, have no `INSERT ... RETURNING`); a column added twice
    /// (ER_DUP_FIELDNAME, 1060).
    fn refusal(err: &Error) -> Option<Refusal> {
        let Error::Store(source) = err else {
            return None;
        };
        let database = source.downcast_ref::<sqlx::Error>()?.as_database_error()?;
        match database
            .try_downcast_ref::<sqlx::mysql::MySqlDatabaseError>()?
            .number()
        {
            1213 => Some(Refusal::Deadlock),
            1020 => Some(Refusal::ChangedSinceRead),
            1064 => Some(Refusal::Returning),
            1060 => Some(Refusal::ColumnExists),
            _ => None,
        }
    }
}

impl SqlStore<MySql> {
    /// Connects a pool to `url` (`mysql://user:password@host:port/db`) and
    /// applies the migrations to the default table `idem_records`.
    ///
    /// The pool logs its statements at TRACE, and one slower than a
    /// second at INFO (sqlx's defaults are DEBUG and WARN).
    pub async fn connect(url: &str) -> Result<Self, Error> {
        Self::connect_to_server(url).await
    }
}

impl SqlStore<MySql> {
    /// Claims in two statements from now on, as on a server without
    /// `INSERT ... RETURNING`: for tests of that path on MariaDB.
    #[cfg(feature = "testing")]
    #[cfg_attr(docsrs, doc(cfg(feature = "testing")))]
    pub fn without_returning(self) -> Self {
        self.sql
            .returning_refused
            .store(true, std::sync::atomic::Ordering::Relaxed);
        self
    }
}

super::transactional_store!(MySql, MySqlConnection);

#[cfg(test)]
mod tests {
    use super::*;
    use crate::store::sql::statements::RecordsSql;

    #[test]
    fn claim_statement_has_no_placeholders_left() {
        let s = MySql::statements("t".into());
        for sql in [&s.claim, s.claim_without_returning.as_ref().unwrap()] {
            assert!(!sql.sql.contains('{'), "{}", sql.sql);
            assert_eq!(sql.sql.matches('?').count(), sql.params.len());
        }
    }

    /// The server's refusal of a statement it cannot parse is what turns
    /// the claim's `RETURNING` off.
    #[tokio::test]
    async fn a_parse_error_is_a_refused_returning() {
        let url = std::env::var("IDEM_MYSQL_URL")
            .unwrap_or_else(|_| "mysql://root@127.0.0.1:3306/test".to_owned());
        let pool = sqlx::MySqlPool::connect(&url).await.unwrap();
        let err = sqlx::query("INSERT INTO nowhere (a) VALUES (?) RETURNING a b c")
            .bind(1)
            .execute(&pool)
            .await
            .unwrap_err();
        assert_eq!(MySql::refusal(&Error::from(err)), Some(Refusal::Returning));
        let err = sqlx::query("SELECT * FROM no_such_table_here")
            .execute(&pool)
            .await
            .unwrap_err();
        assert_ne!(MySql::refusal(&Error::from(err)), Some(Refusal::Returning));
    }

    #[test]
    fn every_statement_binds_each_placeholder() {
        let s = MySql::statements("t".into());
        for statement in [
            &s.claim,
            s.claim_without_returning.as_ref().unwrap(),
            &s.claimed,
            &s.select,
            &s.renew,
            &s.complete,
            &s.release,
            &s.forget,
            &s.purge,
        ] {
            assert_eq!(
                statement.sql.matches('?').count(),
                statement.params.len(),
                "{}",
                statement.sql
            );
        }
    }
}
