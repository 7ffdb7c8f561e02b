//! Entity mode's side of a call ([`Rows`]): the row holding a token,
//! found by it, checked against the call, and inserted with the claim's
//! completion and the body's outbox messages in one transaction (see
//! [`crate::entity`]). The statements are the backend's
//! ([`EntityDatabase`]).

use std::any::Any;
use std::marker::PhantomData;
use std::sync::Arc;
use std::time::Duration;

use sqlx::{FromRow, Pool};

use super::entity::{EntityBind, EntityDatabase, TokenEntity};
use super::outbox::{OutboxStatements, Row};
use super::tx::TxConn;
use super::{Backend, SqlStore};
use crate::metrics;
use crate::store::rows::{Asked, Completion, Rows};
use idem_core::error::Error;
use idem_core::key::{Key, Scope};

/// The rows of entity `T` in `pool`'s database, and the claims on their
/// tokens, in the same database.
pub(crate) struct EntityRows<'p, DB: EntityDatabase, T> {
    pool: &'p Pool<DB>,
    entity: PhantomData<fn() -> T>,
}

impl<'p, DB, T> EntityRows<'p, DB, T>
where
    DB: EntityDatabase,
    T: TokenEntity,
{
    /// Checks the entity's table and column names.
    pub(crate) fn new(pool: &'p Pool<DB>) -> Result<Self, Error> {
        super::entity::check_token_names::<T>()?;
        Ok(EntityRows {
            pool,
            entity: PhantomData,
        })
    }
}

impl<DB, T> Rows<T> for EntityRows<'_, DB, T>
where
    DB: EntityDatabase,
    T: TokenEntity + EntityBind<DB> + for<'r> FromRow<'r, DB::Row> + Send + Unpin,
{
    type Claims = SqlStore<DB>;

    async fn claims(&self) -> Result<SqlStore<DB>, Error> {
        DB::claims(self.pool).await
    }

    fn claims_scope(&self) -> Scope {
        crate::admin::entity_claims_scope(T::TABLE)
    }

    async fn find(&self, key: &Key) -> Result<Option<T>, Error> {
        super::entity::find::<DB, T>(self.pool, key).await
    }

    fn answers(&self, found: &T, asked: &Asked) -> Result<(), Error> {
        match found.token() {
            Ok(token) if token == asked.key => {}
            token => {
                return Err(Error::Config(format!(
                    "the row found for the key {:?} holds the token {:?}: the `{}` column \
                     compares tokens otherwise than byte for byte (a case-insensitive \
                     collation?), so the two keys share one row",
                    asked.key,
                    token.map(|t| t.to_string()),
                    T::TOKEN_COLUMN
                )))
            }
        }
        match found.request_hash()? {
            Some(stored) if stored != asked.fingerprint => {
                tracing::info!(
                    decision = "key reused",
                    "the token was used with another payload"
                );
                metrics::key_reused(&asked.scope);
                Err(Error::KeyReused)
            }
            _ => Ok(()),
        }
    }

    /// Inserts the body's entity, trying again while the database cannot
    /// be reached (the claim stays renewed meanwhile): the body has run,
    /// so its row must land before anything is handed back.
    ///
    /// The claim is completed in the transaction that inserts the row: one
    /// commit for both, and no moment where the row is stored and the
    /// claim still in progress. A claim found taken over meanwhile is not
    /// completed, and the row is committed all the same: the token's
    /// UNIQUE constraint decides which row stands, and the engine's own
    /// completion then finds the lease lost, as it would have.
    async fn write(
        &self,
        claims: &SqlStore<DB>,
        mut entity: T,
        asked: &Asked,
        completion: &Completion<'_>,
        held: Vec<Box<dyn Any + Send + Sync>>,
    ) -> Result<T, Error> {
        produced(&mut entity, asked)?;
        let mut pause = Duration::from_millis(20);
        loop {
            match insert_completing(self.pool, claims, completion, &entity, &held).await {
                Ok(Some(row)) => return Ok(row),
                // A row holds the token: written by code that did not
                // claim, or by this very insert whose answer was lost.
                Ok(None) => {
                    let winner = super::entity::find(self.pool, &asked.key).await?;
                    return self.lost_race(winner, asked);
                }
                Err(err) if is_transient(&err) => {
                    tracing::warn!(error = %err, "inserting the entity failed; trying again");
                    tokio::time::sleep(pause).await;
                    pause = (pause * 2).min(Duration::from_secs(1));
                }
                Err(err) => {
                    tracing::error!(
                        error = %err,
                        "the entity cannot be inserted; the operation ran, and a retry runs it again"
                    );
                    return Err(err);
                }
            }
        }
    }
}

impl<DB, T> EntityRows<'_, DB, T>
where
    DB: EntityDatabase,
    T: TokenEntity + EntityBind<DB> + for<'r> FromRow<'r, DB::Row> + Send + Unpin,
{
    /// The insert found the token taken by a row written without a claim:
    /// that row is the answer, under the same payload rule as a replay.
    fn lost_race(&self, winner: Option<T>, asked: &Asked) -> Result<T, Error> {
        let winner = winner.ok_or_else(|| {
            Error::store(
                "the entity was not stored, and no row holds its token: \
                 it collides with another row on a unique key other than the token",
            )
        })?;
        tracing::warn!(
            decision = "lost race",
            "the token was stored meanwhile by a writer that did not claim it; \
             returning its row"
        );
        self.answers(&winner, asked)?;
        Ok(winner)
    }
}

/// Checks the body's entity carries the key, and fills in its request
/// hash.
fn produced<T: TokenEntity>(entity: &mut T, asked: &Asked) -> Result<(), Error> {
    match entity.token() {
        Ok(token) if token == asked.key => {}
        Ok(token) => {
            return Err(Error::Config(format!(
                "the entity's token {token:?} is not the call's key {:?}: the body must \
                 set the `{}` field to the key",
                asked.key,
                T::TOKEN_COLUMN
            )))
        }
        Err(err) => {
            return Err(Error::Config(format!(
                "the entity's token is not the call's key {:?} ({err}): the body must \
                 set the `{}` field to the key",
                asked.key,
                T::TOKEN_COLUMN
            )))
        }
    }
    entity.set_request_hash(&asked.fingerprint);
    Ok(())
}

/// Inserts the entity and, when it stored a row, completes the claim in
/// the same transaction, telling `completion` how far that got.
///
/// The insert comes first: while it waits (for a lock on the table, say),
/// the claim's record is not locked, so the lease goes on being renewed.
async fn insert_completing<DB, T>(
    pool: &Pool<DB>,
    claims: &SqlStore<DB>,
    completion: &Completion<'_>,
    entity: &T,
    held: &[Box<dyn Any + Send + Sync>],
) -> Result<Option<T>, Error>
where
    DB: EntityDatabase,
    T: TokenEntity + EntityBind<DB> + for<'r> FromRow<'r, DB::Row> + Send + Unpin,
{
    // This process's writes to the database queue here first (SQLite).
    let _turn = claims.gate.enter().await;
    // Closed rather than pooled if this call is dropped before its
    // transaction ends (see `TxConn`).
    let mut conn = TxConn::acquire(pool).await?;
    let mut tx = conn.begin(Some(DB::BEGIN_WRITE)).await?;
    let Some(row) = DB::insert_entity(&mut *tx, entity).await? else {
        // The engine completes the claim once the row holding the token
        // is read.
        if tx.rollback().await.is_ok() {
            conn.ended();
        }
        return Ok(None);
    };
    // The body's outbox messages, with the row: committed exactly when it is.
    for message in held {
        let Some(message) = message.downcast_ref::<HeldRow<DB>>() else {
            return Err(Error::Config(
                "a message was enqueued on an outbox of another kind of database than the \
                 entity's: enqueue on an outbox of the entity's database"
                    .to_owned(),
            ));
        };
        message.write(&mut *tx).await?;
    }
    let claim = completion.claim();
    match claims
        .complete_on(&mut *tx, claim, &Completion::outcome())
        .await
    {
        Ok(()) => completion.writing(),
        // Taken over: the row is committed all the same.
        Err(Error::LeaseLost) => {}
        Err(err) => return Err(err),
    }
    if let Err(err) = tx.commit().await {
        completion.not_written();
        return Err(err.into());
    }
    conn.ended();
    if completion.is_written() {
        completion.committed();
    }
    Ok(Some(row))
}

/// An outbox message held for an entity-mode operation's transaction
/// (`Outbox::enqueue`), written there so that it commits exactly when
/// the entity's row does.
pub(crate) struct HeldRow<DB> {
    sql: Arc<OutboxStatements>,
    id: String,
    topic: String,
    key: Option<Vec<u8>>,
    payload: Option<Vec<u8>>,
    headers: Vec<u8>,
    ttl: i64,
    db: PhantomData<fn() -> DB>,
}

impl<DB: Backend> HeldRow<DB> {
    pub(crate) fn new(sql: Arc<OutboxStatements>, row: &Row<'_>) -> Self {
        HeldRow {
            sql,
            id: row.id.to_owned(),
            topic: row.topic.to_owned(),
            key: row.key.map(<[u8]>::to_vec),
            payload: row.payload.map(<[u8]>::to_vec),
            headers: row.headers.to_vec(),
            ttl: row.ttl,
            db: PhantomData,
        }
    }

    async fn write(&self, conn: &mut DB::Connection) -> Result<(), Error> {
        let row = Row {
            id: &self.id,
            topic: &self.topic,
            key: self.key.as_deref(),
            payload: self.payload.as_deref(),
            headers: &self.headers,
            ttl: self.ttl,
        };
        SqlStore::<DB>::outbox_insert(&self.sql, conn, &row).await
    }
}

/// Whether a store error may pass by itself: the connection, not the
/// statement, failed (lost, killed, refused, timed out), or the database
/// asked for the statement to be tried again (deadlock, serialization).
fn is_transient(err: &Error) -> bool {
    let Error::Store(source) = err else {
        return false;
    };
    let Some(err) = source.downcast_ref::<sqlx::Error>() else {
        return false;
    };
    match err {
        sqlx::Error::Io(_)
        | sqlx::Error::Tls(_)
        | sqlx::Error::Protocol(_)
        | sqlx::Error::PoolTimedOut
        | sqlx::Error::PoolClosed
        | sqlx::Error::WorkerCrashed => true,
        sqlx::Error::Database(db) => {
            #[cfg(feature = "mysql")]
            if let Some(mysql) = db.try_downcast_ref::<sqlx::mysql::MySqlDatabaseError>() {
                // Deadlock, lock wait timeout, connection killed, server
                // gone; and, under MariaDB's snapshot isolation, a record
                // changed since the transaction's read (the claim renewed
                // between the row read back and the claim's completion).
                return matches!(mysql.number(), 1213 | 1205 | 1927 | 2006 | 2013 | 1020);
            }
            // PostgreSQL: connection exceptions, operator intervention
            // (a terminated backend), serialization failure, deadlock.
            // SQLite: SQLITE_BUSY and its extended codes.
            db.code().is_some_and(|code| {
                code.starts_with("08")
                    || code.starts_with("57P")
                    || matches!(&*code, "40001" | "40P01" | "5" | "261" | "517")
            })
        }
        _ => false,
    }
}
