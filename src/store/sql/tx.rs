//! Transactions on a pooled connection that a dropped caller cannot leave
//! open on the server.
//!
//! sqlx counts a connection's transaction only once the server has
//! answered its `BEGIN` (PostgreSQL and MySQL alike, 0.8): a future
//! dropped while that answer is on its way leaves the server inside a
//! transaction that sqlx does not know of, and the pool lends the
//! connection on as it is. Whatever runs on it next is then part of that
//! transaction, and the locks it takes (a claim's release, say) are held
//! until something happens to commit or roll it back, or the connection
//! closes: a retry of the key waits on them for as long.
//!
//! [`TxConn`] closes its connection instead of returning it to the pool
//! when it is dropped with a transaction opening or open, so the server
//! rolls that transaction back as the connection ends. Only a transaction
//! that committed or rolled back gives its connection back to the pool.
//!
//! On SQLite too, for a database in a file: a connection dropped inside
//! its transaction was seen to go back to the pool still holding the
//! database's one write lock (entity mode, a caller dropped while its row
//! was written): every later write waited for it, and failed "database is
//! locked" (tests/suite/entity_cuts.rs). Not for an in-memory database,
//! which closing its connection would lose: there sqlx's own rollback of
//! a dropped transaction is all there is.

use sqlx::pool::PoolConnection;
use sqlx::{Connection, Database, Pool, Transaction};

use idem_core::error::Error;

/// A pooled connection for one transaction at a time (see the module
/// documentation).
pub(crate) struct TxConn<DB: Database> {
    conn: PoolConnection<DB>,
    /// A transaction was begun and has not ended.
    open: bool,
    /// Whether the connection may be closed (not an in-memory database's).
    closable: bool,
}

impl<DB: Database> TxConn<DB> {
    /// A connection of `pool`.
    pub(crate) async fn acquire(pool: &Pool<DB>) -> Result<Self, Error> {
        Ok(TxConn {
            conn: pool.acquire().await?,
            open: false,
            closable: closable(pool),
        })
    }

    /// Begins a transaction with `statement` (`BEGIN` by default). Until
    /// [`TxConn::ended`] is called, dropping this closes the connection.
    pub(crate) async fn begin(
        &mut self,
        statement: Option<&'static str>,
    ) -> Result<Transaction<'_, DB>, Error> {
        self.open = true;
        Ok(match statement {
            Some(statement) => self.conn.begin_with(statement).await?,
            None => self.conn.begin().await?,
        })
    }

    /// Notes that the transaction committed or rolled back: the connection
    /// goes back to the pool when this is dropped.
    pub(crate) fn ended(&mut self) {
        self.open = false;
    }
}

/// Whether `pool`'s database lives in memory: its name is no file on disk
/// (an in-memory database may be named anything, `file:name?mode=memory`
/// included).
#[cfg(feature = "sqlite")]
pub(crate) fn in_memory(pool: &sqlx::Pool<sqlx::Sqlite>) -> bool {
    !pool.connect_options().get_filename().is_file()
}

/// Whether `pool`'s connections may be closed without losing the database:
/// all but an in-memory SQLite database's.
fn closable<DB: Database>(pool: &Pool<DB>) -> bool {
    #[cfg(feature = "sqlite")]
    if let Some(pool) = (pool as &dyn std::any::Any).downcast_ref::<Pool<sqlx::Sqlite>>() {
        return !in_memory(pool);
    }
    let _ = pool;
    true
}

impl<DB: Database> Drop for TxConn<DB> {
    fn drop(&mut self) {
        if self.open && self.closable {
            self.conn.close_on_drop();
        }
    }
}

/// How often a journal transaction runs when the database rolled it back
/// to break a deadlock (MySQL's gap locks, when steps of one operation
/// begin at once).
pub(crate) const DEADLOCK_ATTEMPTS: u32 = 5;

/// Runs `$op` in a transaction of its own on the store's pool (SQLite:
/// `BEGIN IMMEDIATE`), committed when `$op` succeeds; again when the
/// database rolled it back to break a deadlock.
macro_rules! in_transaction {
    ($store:expr, |$conn:ident| $op:expr) => {{
        let mut attempt = 1;
        loop {
            let mut pooled = $crate::store::sql::tx::TxConn::acquire(&$store.pool).await?;
            let result = async {
                let mut tx = pooled.begin(Some(DB::BEGIN_WRITE)).await?;
                let $conn: &mut DB::Connection = &mut tx;
                let value = $op.await?;
                tx.commit().await?;
                Ok::<_, Error>(value)
            }
            .await;
            if result.is_ok() {
                pooled.ended();
            }
            match result {
                Err(err)
                    if attempt < $crate::store::sql::tx::DEADLOCK_ATTEMPTS
                        && DB::refusal(&err)
                            == Some($crate::store::sql::dialect::Refusal::Deadlock) =>
                {
                    drop(pooled);
                    tokio::time::sleep(std::time::Duration::from_millis(u64::from(attempt) * 2))
                        .await;
                    attempt += 1;
                }
                result => break result,
            }
        }
    }};
}
pub(crate) use in_transaction;
