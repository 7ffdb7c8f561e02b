//! The SQL backends: one folder each, on one shared skeleton.
//!
//! Where is PostgreSQL's SQL? In `store/sql/postgres/`, all of it, and
//! likewise for `sqlite/` and `mysql/`. Each backend's folder holds every
//! statement it sends, written in its own dialect (quotes, placeholders,
//! locks), as the database receives it but for the table's name
//! (`{table}`) and the clock (`{now}`):
//!
//! - `sql.rs`: every statement but the migrations, in sections: on the
//!   records table (the claim, the reads, the fenced renewal, completion
//!   and release, the forget and the purge), on the step journal
//!   (`<table>_steps`), on the outbox (`<table>_outbox`), an operator's
//!   reads over a whole table, and entity mode's, built for each entity,
//!   whose table and column names are known only at run time;
//! - `mod.rs`: the clock (`NOW`), the migrations and their bookkeeping,
//!   how migrators are kept apart, and how a transaction that writes
//!   opens; PostgreSQL's `listener.rs` listens for other processes'
//!   changes.
//!
//! A statement that differs between backends only in quotes and
//! placeholders is written out in each. One statement is the same on all
//! three, and is written once: the inventory's read of the clock,
//! `SELECT {now}` ([`inventory`]), each backend with its own `NOW`. What
//! each statement is for, and the order in which its values are bound, is
//! said once too, on the types that hold them ([`statements`]). Every
//! statement each backend sends but its migrations is kept, byte for
//! byte, in `tests/snapshots/sql/<backend>.sql`, which a test compares
//! with what the code builds.
//!
//! The skeleton every backend runs, written once:
//!
//! - [`flow`]: the records' flow: the claim → read → decide loop, the
//!   fenced renewal, completion and release, row decoding, purges, the
//!   waits of duplicates, and the [`Store`](crate::store::Store)
//!   implementation of [`SqlStore`] (its
//!   [`TransactionalStore`](crate::store::TransactionalStore) ones are
//!   written by the macro below);
//! - [`journal`]: the step journal's flow, and the
//!   [`Journal`](crate::store::Journal) implementation of [`SqlStore`];
//! - [`outbox`], [`inventory`]: the outbox's and the inventory's flows;
//! - [`entity`]: entity mode's model, and the flow of its statements
//!   where the database answers the rows it writes;
//! - [`entity_rows`]: entity mode's side of a call (the engine's
//!   `Rows`): the row found by its token, checked, and inserted with the
//!   claim's completion in one transaction;
//! - [`tx`]: transactions a dropped caller cannot leave open, and the
//!   store's own short ones;
//! - [`migrate`]: the migrations' bookkeeping (`idem_migrations` by
//!   default);
//! - [`Dialect`](dialect::Dialect): what a backend supplies: its
//!   statements and its true differences (its clock, how it numbers
//!   placeholders, its limits, the errors it answers with).

use std::fmt::Debug;
use std::future::Future;

use idem_core::error::Error;
use idem_core::record::BeginRequest;

pub(crate) mod entity;
pub(crate) mod entity_rows;
pub(crate) mod exec;
pub(crate) mod flow;
pub(crate) mod gate;
mod inventory;
pub(crate) mod journal;
pub(crate) mod migrate;
#[cfg(feature = "mysql")]
pub(crate) mod mysql;
pub(crate) mod outbox;
#[cfg(feature = "postgres")]
pub(crate) mod postgres;
pub(crate) mod read_first;
#[cfg(feature = "testing")]
mod reference;
#[cfg(test)]
mod snapshot;
#[cfg(feature = "sqlite")]
pub(crate) mod sqlite;
mod statements;
pub(crate) mod tx;
pub(crate) mod warm;

pub use flow::SqlStore;

/// The statement logging of the pools a store opens itself (`connect`):
/// sqlx logs every statement at DEBUG, and one slower than a second at
/// WARN with its whole SQL. A store's statements are the library's, not
/// the service's, and a slow one (a claim that waited for a lock) is
/// answered and counted by the engine: every statement at TRACE, a slow
/// one at INFO. A pool you open yourself keeps the logging you give it.
#[cfg(any(feature = "sqlite", feature = "postgres", feature = "mysql"))]
pub(crate) fn service_logging<O: sqlx::ConnectOptions>(options: O) -> O {
    options
        .log_statements(log::LevelFilter::Trace)
        .log_slow_statements(log::LevelFilter::Info, std::time::Duration::from_secs(1))
}

/// The default name of the records table.
pub(crate) const DEFAULT_TABLE: &str = "idem_records";

/// The default name of the table recording applied migrations.
pub(crate) const DEFAULT_MIGRATIONS_TABLE: &str = "idem_migrations";

/// A sqlx database that [`SqlStore`] keeps records in: SQLite, PostgreSQL
/// or MySQL/MariaDB, each behind its cargo feature. Sealed: its items are
/// this crate's.
pub trait Backend: dialect::Dialect {}

impl<DB: dialect::Dialect> Backend for DB {}

pub(crate) mod dialect {
    //! What a backend supplies to the shared skeleton.
    #![allow(unreachable_pub)] // named in `Backend`'s bounds, so `pub`; unnameable outside

    pub use super::exec::Exec;
    pub use super::statements::Statement;
    pub use super::statements::{InventorySql, JournalSql, OutboxSql, RecordsSql};
    use super::*;
    use idem_core::record::Outcome;

    /// A refusal of the database that the shared flow answers in its own
    /// way ([`Dialect::refusal`]).
    #[derive(Clone, Copy, Debug, PartialEq, Eq)]
    pub enum Refusal {
        /// The database rolled a statement back to break a deadlock: on
        /// the pool, the statement runs again.
        Deadlock,
        /// The database refused a claim because the caller's snapshot is
        /// older than the record (MariaDB's `innodb_snapshot_isolation`):
        /// the claim answers from a read beside the transaction.
        ChangedSinceRead,
        /// The server refused the claim's `RETURNING` clause: the claim
        /// without it is used from then on.
        Returning,
        /// A migration's `ADD COLUMN` found the column there: the
        /// migration ran, and its record did not (MySQL's DDL commits at
        /// once, and MySQL, unlike MariaDB, has no `ADD COLUMN IF NOT
        /// EXISTS`).
        ColumnExists,
    }

    /// A backend's statements, one trait for each file of its folder that
    /// holds them ([`RecordsSql`], [`JournalSql`], [`OutboxSql`],
    /// [`InventorySql`]), and its true differences.
    pub trait Dialect: Exec + RecordsSql + JournalSql + OutboxSql + InventorySql + Sized {
        /// Text columns are binary (MySQL's `VARBINARY`): read as bytes,
        /// checked as UTF-8.
        const TEXT_AS_BYTES: bool = false;
        /// `outcome_kind` is a `SMALLINT` (SQLite's integers are 64 bits).
        const SMALL_OUTCOME_KIND: bool = true;
        /// A plain read on the caller's transaction sees the latest
        /// committed record (PostgreSQL's `READ COMMITTED`); otherwise
        /// [`SqlStore::peek_in`] reads beside it.
        const PEEK_IN_CALLER: bool = false;
        /// The claim locks no record it does not claim, even inside a
        /// caller's transaction.
        const CLAIM_LOCKS_ONLY_ITS_OWN: bool = false;
        /// The claim and takeover statements keep the operation's journal
        /// themselves (PostgreSQL's writable CTEs); otherwise a granted
        /// claim sends the journal's `keep` statement after them.
        const CLAIM_KEEPS_JOURNAL: bool = false;
        /// Whether a claim on the store's pool reads the record first, and
        /// claims only when the read has no answer (see
        /// [`read_first`](crate::store::sql::read_first)).
        const READ_FIRST: crate::store::sql::read_first::ReadFirst =
            crate::store::sql::read_first::ReadFirst::Never;

        /// The statement that opens a transaction that writes (SQLite:
        /// `BEGIN IMMEDIATE`, the write lock from the start, since a
        /// deferred transaction that read first cannot always be upgraded).
        const BEGIN_WRITE: &'static str;
        /// Writes of several connections can proceed at once (row locks);
        /// not on SQLite, where they queue for the database's one write
        /// lock.
        const WRITES_IN_PARALLEL: bool = true;

        /// The database's clock in milliseconds since the Unix epoch, as
        /// an SQL expression.
        const NOW: &'static str;
        /// Counts the tables named `{table}` in the connection's database
        /// or schema.
        const TABLE_EXISTS: &'static str;

        /// What the store keeps to wake waiters in other processes.
        type Wake: Default + Debug + Send + Sync + 'static;

        /// The `n`th placeholder of a statement (from 1).
        fn param(n: usize) -> String;

        /// How many rows a statement changed (or, on MySQL, matched).
        fn rows_affected(result: &Self::QueryResult) -> u64;

        /// Creates or upgrades the records table (see [`SqlStore::migrate`]).
        fn migrate(store: &SqlStore<Self>) -> impl Future<Output = Result<(), Error>> + Send;

        /// Refuses a request this backend cannot keep.
        fn check_request(request: &BeginRequest<'_>) -> Result<(), Error> {
            let _ = request;
            Ok(())
        }

        /// What the database's error `err` means to the shared flow, when
        /// it is one of the refusals the flow answers in its own way.
        /// None by default.
        fn refusal(err: &Error) -> Option<Refusal> {
            let _ = err;
            None
        }

        /// The most bytes of outcome one completion can carry, all its
        /// copies of the outcome together: a fixed limit of the database's
        /// protocol or value types, which no setting raises. None by
        /// default.
        const MAX_OUTCOME_BYTES: usize = usize::MAX;

        /// What [`MAX_OUTCOME_BYTES`](Dialect::MAX_OUTCOME_BYTES) is, for
        /// the error that names it.
        const MAX_OUTCOME_LIMIT: &'static str = "";

        /// Refuses an outcome that `statement` (a completion) could never
        /// carry to the server, with [`Error::Unrecorded`] saying why; it
        /// may ask the server on `conn`. Such a statement would fail the
        /// same way every time it was sent, keeping its key in progress.
        /// By default, checks [`MAX_OUTCOME_BYTES`](Dialect::MAX_OUTCOME_BYTES).
        fn check_outcome(
            conn: &mut Self::Connection,
            statement: &Statement,
            outcome: &Outcome,
        ) -> impl Future<Output = Result<(), Error>> + Send {
            let _ = conn;
            let checked = over_fixed_limit(
                statement,
                outcome,
                Self::MAX_OUTCOME_BYTES,
                Self::MAX_OUTCOME_LIMIT,
            );
            async move { checked }
        }

        /// Whether a transaction on `conn` holds a lock that every other
        /// writer waits for, or a snapshot that another connection's
        /// commit would break (SQLite: once the transaction read or wrote,
        /// or began `IMMEDIATE`). No by default: row locks, and snapshots
        /// that survive others' commits.
        fn holds_lock_or_snapshot(
            conn: &mut Self::Connection,
        ) -> impl Future<Output = Result<bool, Error>> + Send {
            let _ = conn;
            async { Ok(false) }
        }

        /// The database file whose writes this process queues for
        /// ([`gate`](super::gate)): where the database takes one write at
        /// a time, and the pool has more than one connection.
        fn write_gate(pool: &sqlx::Pool<Self>) -> Option<std::path::PathBuf> {
            let _ = pool;
            None
        }

        /// Starts listening for changes made by other processes, if the
        /// backend can.
        fn listen(store: &SqlStore<Self>) {
            let _ = store;
        }

        /// Whether changes made in other processes wake waiters right now.
        fn wakes_across_processes(store: &SqlStore<Self>) -> bool {
            let _ = store;
            false
        }
    }
}

/// Implements [`TransactionalStore`](crate::store::TransactionalStore) for
/// [`SqlStore`] on a backend's connection, transaction and pooled
/// connection, through the store's `*_on` methods. (One generic impl per
/// kind would overlap: the compiler cannot tell a backend's connection
/// type from a transaction.)
macro_rules! transactional_store {
    ($db:ty, $conn:ty) => {
        // A connection is in a transaction when one was begun on it
        // through sqlx (which is what it counts); a `Transaction` always.
        $crate::store::sql::transactional_store!(@impl $db, $conn, [], |c| c,
            |c| ::sqlx::Connection::is_in_transaction(c));
        $crate::store::sql::transactional_store!(@impl $db, ::sqlx::Transaction<'c, $db>, ['c], |c| &mut **c,
            |_c| true);
        $crate::store::sql::transactional_store!(@impl $db, ::sqlx::pool::PoolConnection<$db>, [], |c| &mut **c,
            |c| ::sqlx::Connection::is_in_transaction(&**c));
    };
    (@impl $db:ty, $on:ty, [$($lt:lifetime)?], |$c:ident| $conn:expr, |$t:ident| $in_transaction:expr) => {
        #[::async_trait::async_trait]
        impl<$($lt)?> $crate::store::TransactionalStore<$on> for $crate::store::sql::SqlStore<$db> {
            async fn peek_in(
                &self,
                $c: &mut $on,
                request: &::idem_core::record::BeginRequest<'_>,
            ) -> Result<Option<::idem_core::record::Begin>, ::idem_core::error::Error> {
                $crate::store::sql::SqlStore::peek_in(self, $conn, request).await
            }
            async fn begin_on(
                &self,
                $c: &mut $on,
                request: &::idem_core::record::BeginRequest<'_>,
            ) -> Result<::idem_core::record::Begin, ::idem_core::error::Error> {
                $crate::store::sql::SqlStore::begin_on(self, $conn, request).await
            }
            async fn complete_on(
                &self,
                $c: &mut $on,
                claim: &::idem_core::record::Claim,
                outcome: &::idem_core::record::Outcome,
            ) -> Result<(), ::idem_core::error::Error> {
                $crate::store::sql::SqlStore::complete_on(self, $conn, claim, outcome).await
            }
            async fn release_on(
                &self,
                $c: &mut $on,
                claim: &::idem_core::record::Claim,
            ) -> Result<(), ::idem_core::error::Error> {
                $crate::store::sql::SqlStore::release_on(self, $conn, claim).await
            }
            async fn complete_step_on(
                &self,
                $c: &mut $on,
                step: &::idem_core::journal::StepRequest<'_>,
                output: &[u8],
            ) -> Result<(), ::idem_core::error::Error> {
                $crate::store::sql::SqlStore::complete_step_on(self, $conn, step, output).await
            }
            async fn journals_on(&self, $c: &mut $on) -> Result<bool, ::idem_core::error::Error> {
                <$db as $crate::store::sql::dialect::Dialect>::holds_lock_or_snapshot($conn).await
            }
            async fn begin_step_on(
                &self,
                $c: &mut $on,
                step: &::idem_core::journal::StepRequest<'_>,
            ) -> Result<::idem_core::journal::StepBegin, ::idem_core::error::Error> {
                $crate::store::sql::SqlStore::begin_step_on(self, $conn, step).await
            }
            fn claim_locks_only_its_own(&self) -> bool {
                <$db as $crate::store::sql::dialect::Dialect>::CLAIM_LOCKS_ONLY_ITS_OWN
            }
            fn in_transaction(&self, $t: &mut $on) -> bool {
                $in_transaction
            }
        }
    };
}
pub(crate) use transactional_store;

/// Refuses an outcome that `statement` names so many times that together
/// they exceed `max` bytes, the database's fixed `limit`.
fn over_fixed_limit(
    statement: &statements::Statement,
    outcome: &idem_core::record::Outcome,
    max: usize,
    limit: &str,
) -> Result<(), Error> {
    let copies = statement
        .params
        .iter()
        .filter(|p| matches!(p, statements::Param::Outcome))
        .count();
    let len = copies.saturating_mul(outcome.body.len());
    if len > max {
        return Err(Error::Unrecorded(format!(
            "an outcome of {} bytes makes a completion carrying {len} bytes of outcome, over \
             {limit}",
            outcome.body.len()
        )));
    }
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::statements::{Param, Statement};
    use super::*;
    use idem_core::record::{Outcome, OutcomeKind};

    /// A completion names its outcome twice (the value to write, and the
    /// one a completion sent again compares with): both count.
    #[test]
    fn a_fixed_limit_counts_every_copy_of_the_outcome() {
        let complete = Statement::new(
            "UPDATE t SET outcome = ?1 WHERE outcome = ?2",
            "t",
            "now()",
            &[Param::Outcome, Param::Outcome, Param::Token],
        );
        let outcome = |len| Outcome {
            kind: OutcomeKind::Ok,
            body: vec![b'x'; len],
        };
        assert!(over_fixed_limit(&complete, &outcome(50), 100, "a limit").is_ok());
        match over_fixed_limit(&complete, &outcome(51), 100, "a limit of 100 bytes") {
            Err(Error::Unrecorded(why)) => {
                assert!(
                    why.contains("51 bytes") && why.contains("a limit of 100"),
                    "{why}"
                )
            }
            other => panic!("{other:?}"),
        }
    }
}
