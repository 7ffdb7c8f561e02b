//! The records flow every SQL backend shares, written once; a backend
//! brings its statements and its true differences through
//! [`Dialect`](super::dialect::Dialect).
//!
//! - this file: [`SqlStore`], its settings, and its [`Store`]
//!   implementation, which runs each transition on the pool;
//! - [`claim`]: the claim → read → decide loop, and the plain reads
//!   (`peek`) before and beside it;
//! - [`fenced`]: the writes that name the claim's token: renewal,
//!   completion and release;
//! - [`rows`]: reads, purges, and records decoded from their rows;
//! - [`bound`]: what a statement's placeholders are bound to;
//! - [`waking`]: the waits of duplicates ([`Wake`](crate::store::Wake)).
//!
//! The step journal's flow is [`journal`](super::journal)'s.

mod bound;
mod claim;
mod fenced;
mod rows;
mod waking;

use std::fmt;
use std::sync::Arc;

use async_trait::async_trait;

use self::bound::Bound;
use super::exec::Value;
use super::gate::Gate;
use super::read_first::Duplicates;
use super::statements::steps_table;
use super::statements::Statements;
use super::tx::in_transaction;
use super::warm::Warm;
use super::{Backend, DEFAULT_MIGRATIONS_TABLE, DEFAULT_TABLE};
use crate::store::{Capabilities, Detach, Journal, Store, Waiters};
use idem_core::error::Error;
use idem_core::key::{Key, Scope};
use idem_core::record::{Begin, BeginRequest, Claim, Outcome, Record};

pub(crate) use self::rows::{record_from_row, Columns};

/// How often a statement on the store's pool runs when the database
/// rolled it back to break a deadlock (only MySQL says so).
pub(crate) const DEADLOCK_ATTEMPTS: u32 = 5;

/// Idempotency records in a SQL database through a sqlx pool: the type
/// behind [`SqliteStore`](crate::SqliteStore),
/// [`PostgresStore`](crate::PostgresStore) and
/// [`MySqlStore`](crate::MySqlStore), as sqlx's `Pool<DB>` is behind
/// `SqlitePool` and `PgPool`.
///
/// The `*_on` methods run the store's statements on a connection you hold,
/// such as an open transaction: transactional mode writes the claim and
/// the completion there, so that they commit or roll back with your rows.
pub struct SqlStore<DB: Backend> {
    pub(crate) pool: sqlx::Pool<DB>,
    pub(crate) sql: Arc<Statements>,
    pub(crate) waiters: Arc<Waiters>,
    /// What the backend keeps to wake waiters in other processes
    /// (PostgreSQL's listener).
    pub(crate) wake: Arc<DB::Wake>,
    /// The table recording applied migrations.
    pub(crate) migrations: Arc<str>,
    /// Connections kept between the store's own statements.
    pub(crate) warm: Arc<Warm<DB>>,
    /// Where the database takes one write at a time: the queue of this
    /// process's writes to it.
    pub(crate) gate: Gate,
    /// How often the claims on the pool found their key taken lately,
    /// for a backend that reads first only while that is common.
    pub(crate) duplicates: Arc<Duplicates>,
}

impl<DB: Backend> Clone for SqlStore<DB> {
    fn clone(&self) -> Self {
        SqlStore {
            pool: self.pool.clone(),
            sql: self.sql.clone(),
            waiters: self.waiters.clone(),
            wake: self.wake.clone(),
            migrations: self.migrations.clone(),
            warm: self.warm.clone(),
            gate: self.gate.clone(),
            duplicates: self.duplicates.clone(),
        }
    }
}

impl<DB: Backend> fmt::Debug for SqlStore<DB> {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("SqlStore")
            .field("backend", &<DB as sqlx::Database>::NAME)
            .field("table", &self.sql.table)
            .finish_non_exhaustive()
    }
}

/// Runs `$op` on a connection of the store's pool (a kept one where there
/// is one, see [`Warm`]), again when it lost a deadlock or failed on a kept
/// connection the server closed since: on the pool every statement is a
/// transaction of its own, so nothing of the failed attempt remains, and
/// each of the store's statements may run twice.
macro_rules! on_pool {
    ($store:expr, |$conn:ident| $op:expr) => {{
        let mut attempt = 1;
        loop {
            let (mut $conn, kept) = $store.warm.lend().await?;
            match $op.await {
                // A kept connection the server closed since: the next one
                // (kept, or tested by the pool) runs the statement again.
                Err($crate::Error::Store(err)) if kept => {
                    tracing::debug!(error = %err, "a kept connection failed; running again");
                    drop($conn);
                }
                Err(err) if attempt < $crate::store::sql::flow::DEADLOCK_ATTEMPTS && DB::refusal(&err) == Some($crate::store::sql::dialect::Refusal::Deadlock) => {
                    tracing::debug!(attempt, "deadlock on the idempotency table; running again");
                    drop($conn);
                    tokio::time::sleep(::std::time::Duration::from_millis(u64::from(attempt) * 2)).await;
                    attempt += 1;
                }
                // Kept for the next statement only when this one ran to
                // its end: a failed one goes back to sqlx, which tests it.
                Ok(done) => {
                    $store.warm.keep($conn);
                    break Ok(done);
                }
                result => break result,
            }
        }
    }};
}
pub(crate) use on_pool;

impl<DB: Backend> SqlStore<DB> {
    /// A store on an existing pool, using the table `idem_records`. Call
    /// [`migrate`](Self::migrate) once before use.
    pub fn new(pool: sqlx::Pool<DB>) -> Self {
        SqlStore {
            warm: Arc::new(Warm::new(pool.clone())),
            gate: Gate::of(DB::write_gate(&pool)),
            pool,
            sql: Arc::new(DB::statements(DEFAULT_TABLE.to_owned())),
            waiters: Arc::default(),
            wake: Arc::default(),
            migrations: Arc::from(DEFAULT_MIGRATIONS_TABLE),
            duplicates: Arc::new(Duplicates::new(DB::READ_FIRST)),
        }
    }

    /// Uses another table (in the connection's schema or `search_path`).
    /// The name must be 1 to 57 ASCII letters, digits and underscores, not
    /// starting with a digit: the step journal beside it is
    /// `<name>_steps`, within the databases' limit of 63.
    pub fn with_table_name(mut self, table: &str) -> Result<Self, Error> {
        let table = validate_table_name(table)?;
        // The step journal is `<table>_steps`, within the same limit.
        validate_table_name(&steps_table(&table))?;
        self.sql = Arc::new(DB::statements(table));
        // Another table is another notification channel.
        self.waiters = Arc::default();
        self.wake = Arc::default();
        Ok(self)
    }

    /// Records applied migrations in another table than `idem_migrations`
    /// (for example where that name is taken, or each service keeps its own
    /// bookkeeping). The table holds one row per records table and version,
    /// so records tables may share one; a records table must always be
    /// migrated with the same bookkeeping table. The name follows the rule
    /// of [`with_table_name`](Self::with_table_name).
    pub fn with_migrations_table(mut self, table: &str) -> Result<Self, Error> {
        self.migrations = Arc::from(validate_table_name(table)?);
        Ok(self)
    }

    /// The table recording applied migrations.
    pub fn migrations_table(&self) -> &str {
        &self.migrations
    }

    /// The pool.
    pub fn pool(&self) -> &sqlx::Pool<DB> {
        &self.pool
    }

    /// The records table.
    pub fn table_name(&self) -> &str {
        &self.sql.table
    }

    /// A store on `pool`, its records table migrated: how each backend's
    /// `connect` ends.
    #[cfg(any(feature = "sqlite", feature = "postgres", feature = "mysql"))]
    pub(crate) async fn migrated(pool: sqlx::Pool<DB>) -> Result<Self, Error> {
        let store = SqlStore::new(pool);
        store.migrate().await?;
        Ok(store)
    }

    /// Connects a pool to the server at `url` with sqlx's pool settings
    /// and the service's logging ([`service_logging`](super::service_logging)),
    /// and migrates the default table: PostgreSQL's and MySQL's `connect`.
    #[cfg(any(feature = "postgres", feature = "mysql"))]
    pub(crate) async fn connect_to_server(url: &str) -> Result<Self, Error> {
        let options: <DB::Connection as sqlx::Connection>::Options = url.parse()?;
        let pool = sqlx::pool::PoolOptions::<DB>::new()
            .connect_with(super::service_logging(options))
            .await?;
        Self::migrated(pool).await
    }

    /// Creates or upgrades the records table. Safe to call at every start,
    /// from several processes at once: migrators are serialized (SQLite's
    /// write lock, a PostgreSQL advisory lock, a MySQL named lock), and
    /// applied versions are recorded in the bookkeeping table
    /// (`idem_migrations`, or [`with_migrations_table`](Self::with_migrations_table))
    /// and skipped.
    pub async fn migrate(&self) -> Result<(), Error> {
        DB::migrate(self).await
    }
}

#[async_trait]
impl<DB: Backend> Store for SqlStore<DB> {
    async fn begin(&self, req: &BeginRequest<'_>) -> Result<Begin, Error> {
        // A plain read first where it is cheaper than a claim attempt that
        // finds the key taken: a replay is then one read. The claim stays
        // the one write that hands the key out. Where writes queue at the
        // gate (SQLite), the read runs on its own, and the claim waits its
        // turn holding no connection.
        let gated = self.gate.is_on();
        let read_first = self.duplicates.read_first();
        let _turn = if gated {
            if read_first {
                if let Some(answer) = on_pool!(self, |conn| self.peek_on(&mut conn, req))? {
                    self.duplicates.note(true);
                    return Ok(answer);
                }
            }
            self.gate.enter().await
        } else {
            None
        };
        on_pool!(self, |conn| async {
            if read_first && !gated {
                if let Some(answer) = self.peek_on(&mut conn, req).await? {
                    self.duplicates.note(true);
                    return Ok(answer);
                }
            }
            let answer = self.claim_on(&mut conn, req, true).await?;
            self.duplicates.note(!matches!(answer, Begin::Claimed(_)));
            // Committed: the duplicates of this process may wait for it
            // without reading the record.
            if let Begin::Claimed(claim) = &answer {
                self.waiters.hold(claim, req.fingerprint);
            }
            Ok::<_, Error>(answer)
        })
    }

    async fn peek(&self, req: &BeginRequest<'_>) -> Result<Option<Begin>, Error> {
        on_pool!(self, |conn| self.peek_on(&mut conn, req))
    }

    async fn renew(&self, claim: &Claim) -> Result<(), Error> {
        let _turn = self.gate.enter().await;
        match on_pool!(self, |conn| self.renew_on(&mut conn, claim)) {
            Ok(()) => {
                self.waiters.renewed(claim);
                Ok(())
            }
            Err(err) => {
                self.waiters.unhold(claim);
                Err(err)
            }
        }
    }

    async fn complete(&self, claim: &Claim, outcome: &Outcome) -> Result<(), Error> {
        let complete = async {
            let _turn = self.gate.enter().await;
            on_pool!(self, |conn| self.complete_on(&mut conn, claim, outcome))
        };
        self.waiters.complete(claim, outcome, complete).await
    }

    async fn release(&self, claim: &Claim) -> Result<(), Error> {
        self.waiters.unhold(claim);
        let turn = self.gate.enter().await;
        let released = on_pool!(self, |conn| self.release_on(&mut conn, claim));
        drop(turn);
        // Also when the answer says the claim was not there: a release
        // whose answer was lost, sent again, finds its own delete done.
        self.waiters.wake(&claim.scope, &claim.key);
        released
    }

    async fn get(&self, scope: &Scope, key: &Key) -> Result<Option<Record>, Error> {
        let mut conn = self.pool.acquire().await?;
        self.get_on(&mut conn, scope, key).await
    }

    async fn forget(&self, scope: &Scope, key: &Key) -> Result<bool, Error> {
        let bound = Bound::key(scope, key);
        let forget = &self.sql.forget;
        let turn = self.gate.enter().await;
        // The record first, then its journal, in one transaction: a
        // journal write of the record's owner holds the record until it
        // commits, so none lands after the journal is deleted.
        let done = in_transaction!(self, |conn| async {
            let done = DB::execute(conn, &forget.sql, bound.values(forget)?).await?;
            let steps = vec![Value::Text(scope.as_str()), Value::Text(key.as_str())];
            DB::execute(conn, &self.sql.steps.forget, steps).await?;
            Ok::<_, Error>(done)
        })?;
        drop(turn);
        self.waiters.wake(scope, key);
        Ok(DB::rows_affected(&done) > 0)
    }

    async fn purge_expired(&self, batch: usize) -> Result<u64, Error> {
        self.purge_reporting(batch, &|_| {}).await
    }

    fn journal(&self) -> Option<&dyn Journal> {
        Some(self)
    }

    fn capabilities(&self) -> Capabilities<'_> {
        Capabilities::default().with_wake(self).with_detach(self)
    }
}

impl<DB: Backend> Detach for SqlStore<DB> {
    fn detach(&self) -> Option<Arc<dyn Store>> {
        Some(Arc::new(self.clone()))
    }
}

/// Checks a table name: 1 to 63 characters of ASCII letters, digits and
/// underscores, not starting with a digit. Names are formatted into SQL
/// (a table name cannot be bound), so nothing else is accepted.
pub(crate) fn validate_table_name(name: &str) -> Result<String, Error> {
    let mut chars = name.chars();
    let valid_start = chars
        .next()
        .is_some_and(|c| c.is_ascii_alphabetic() || c == '_');
    let valid_rest = chars.all(|c| c.is_ascii_alphanumeric() || c == '_');
    if !valid_start || !valid_rest || name.len() > 63 {
        return Err(Error::Config(format!(
            "invalid table name {name:?}: use 1 to 63 ASCII letters, digits and underscores, \
             not starting with a digit"
        )));
    }
    Ok(name.to_owned())
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn table_names() {
        assert!(validate_table_name("idem_records").is_ok());
        assert!(validate_table_name("_t1").is_ok());
        assert!(validate_table_name(&"a".repeat(63)).is_ok());
        for bad in [
            "",
            "1abc",
            "a-b",
            "a b",
            "a;drop",
            "a\"b",
            "é",
            &"a".repeat(64),
        ] {
            assert!(validate_table_name(bad).is_err(), "{bad:?}");
        }
    }
}
