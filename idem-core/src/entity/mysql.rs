//! Entity mode and upserts on MySQL and MariaDB.
//!
//! The per-token lock is a named lock, `GET_LOCK('idem-entity:<hash of
//! database, table and token>', 0)` (tried without waiting; names are
//! server-wide and at most 64 characters long), held by one pooled
//! connection while the body runs. The lock belongs to the session, not to
//! a transaction, so it is given back with `RELEASE_LOCK` on every way out;
//! if that fails, or the call is dropped while it holds the lock, the
//! connection is closed instead of returned to the pool, which ends the
//! session and frees the lock.
//!
//! The statements run in autocommit mode, so each read sees the latest
//! committed rows whatever the isolation level. The entity is saved with a
//! plain `INSERT`; a duplicate-key error (1062) means another writer, one
//! that did not take the lock, stored the token first, and its row is read
//! and returned. (`ON DUPLICATE KEY UPDATE` would hide which insert won:
//! sqlx connects with `CLIENT_FOUND_ROWS`, so both answer one row.)

use std::future::Future;
use std::time::Duration;

use sqlx::mysql::{MySql, MySqlPool};
use sqlx::FromRow;
use tracing::Instrument;

use super::{
    arguments, check_conflict, check_token_names, is_unique_violation, sealed, Dialect, EntityBind,
    EntityDatabase, Held, Prepared, TokenEntity,
};
use crate::{Call, Error, Key};

const DIALECT: Dialect = Dialect::MySql;

/// `ER_LOCK_DEADLOCK`: InnoDB chose this transaction as a deadlock victim.
const ER_LOCK_DEADLOCK: u16 = 1213;
/// How many times an upsert chosen as a deadlock victim is tried again.
const UPSERT_ATTEMPTS: u32 = 5;

impl sealed::Sealed for MySql {}

impl EntityDatabase for MySql {
    async fn run_entity<T, E, Fut>(pool: &MySqlPool, call: Call, body: Fut) -> Result<T, E>
    where
        T: TokenEntity + EntityBind<MySql> + for<'r> FromRow<'r, Self::Row> + Send + Unpin,
        E: From<Error>,
        Fut: Future<Output = Result<T, E>>,
    {
        let call = Prepared::new(call)?;
        check_token_names::<T>()?;
        let span = call.span();
        match run(pool, &call, body).instrument(span).await {
            Ok(result) => result,
            Err(err) => Err(err.into()),
        }
    }

    async fn find_entity<T>(pool: &MySqlPool, token: &Key) -> Result<Option<T>, Error>
    where
        T: TokenEntity + for<'r> FromRow<'r, Self::Row> + Send + Unpin,
    {
        check_token_names::<T>()?;
        let find = DIALECT.select_where(T::TABLE, &[T::TOKEN_COLUMN]);
        Ok(sqlx::query_as(&find)
            .bind(token.as_str())
            .fetch_optional(pool)
            .await?)
    }

    async fn upsert_entity<T>(pool: &MySqlPool, entity: &T, conflict: &[&str]) -> Result<T, Error>
    where
        T: EntityBind<MySql> + for<'r> FromRow<'r, Self::Row> + Send + Unpin,
    {
        check_conflict::<T>(conflict)?;
        let mut updated: Vec<&str> = T::COLUMNS
            .iter()
            .copied()
            .filter(|c| !conflict.contains(c))
            .collect();
        if updated.is_empty() {
            updated.push(conflict[0]);
        }
        let set: Vec<String> = updated
            .iter()
            .map(|c| format!("{0} = VALUES({0})", DIALECT.quote(c)))
            .collect();
        let upsert = format!(
            "{} ON DUPLICATE KEY UPDATE {}",
            DIALECT.insert(T::TABLE, T::COLUMNS),
            set.join(", ")
        );
        let select = DIALECT.select_where(T::TABLE, conflict);
        let mut attempt = 1;
        loop {
            match upsert_once(pool, entity, conflict, &upsert, &select).await {
                Err(err) if attempt < UPSERT_ATTEMPTS && is_deadlock(&err) => {
                    tracing::debug!(attempt, "the upsert was a deadlock victim; trying again");
                    tokio::time::sleep(Duration::from_millis(5 * u64::from(attempt))).await;
                    attempt += 1;
                }
                result => return result,
            }
        }
    }
}

/// The upsert and the read of the row it left, in one transaction, so the
/// row read is the one this statement wrote (it stays locked until the
/// commit).
async fn upsert_once<T>(
    pool: &MySqlPool,
    entity: &T,
    conflict: &[&str],
    upsert: &str,
    select: &str,
) -> Result<T, Error>
where
    T: EntityBind<MySql> + for<'r> FromRow<'r, <MySql as sqlx::Database>::Row> + Send + Unpin,
{
    let mut tx = pool.begin().await?;
    let args = arguments::<MySql, T>(entity, T::COLUMNS)?;
    sqlx::query_with(upsert, args).execute(&mut *tx).await?;
    let args = arguments::<MySql, T>(entity, conflict)?;
    let row = sqlx::query_as_with(select, args)
        .fetch_one(&mut *tx)
        .await?;
    tx.commit().await?;
    Ok(row)
}

fn is_deadlock(err: &Error) -> bool {
    let Error::Store(err) = err else {
        return false;
    };
    err.downcast_ref::<sqlx::Error>()
        .and_then(|err| err.as_database_error())
        .and_then(|db| db.try_downcast_ref::<sqlx::mysql::MySqlDatabaseError>())
        .is_some_and(|db| db.number() == ER_LOCK_DEADLOCK)
}

/// The per-token lock's name: the database, table and token, hashed into
/// 52 characters (a lock name has at most 64, and names are server-wide).
/// Its two parameters are the table and the token.
const LOCK_NAME: &str =
    "CONCAT('idem-entity:', LEFT(SHA2(CONCAT_WS('/', DATABASE(), ?, ?), 256), 40))";

/// The flow; the outer error is the library's, the inner result the body's.
async fn run<T, E, Fut>(pool: &MySqlPool, call: &Prepared, body: Fut) -> Result<Result<T, E>, Error>
where
    T: TokenEntity
        + EntityBind<MySql>
        + for<'r> FromRow<'r, <MySql as sqlx::Database>::Row>
        + Send
        + Unpin,
    Fut: Future<Output = Result<T, E>>,
{
    let find = DIALECT.select_where(T::TABLE, &[T::TOKEN_COLUMN]);
    let get_lock = format!("SELECT GET_LOCK({LOCK_NAME}, 0)");
    let release_lock = format!("SELECT RELEASE_LOCK({LOCK_NAME})");
    let mut wait = call.waiting();
    loop {
        let found: Option<T> = sqlx::query_as(&find)
            .bind(call.key.as_str())
            .fetch_optional(pool)
            .await?;
        if let Some(found) = found {
            return Ok(Ok(call.replay(found)?));
        }

        let mut held = Held::acquire(pool).await?;
        let locked: Option<i64> = sqlx::query_scalar(&get_lock)
            .bind(T::TABLE)
            .bind(call.key.as_str())
            .fetch_one(held.conn())
            .await?;
        match locked {
            Some(1) => {}
            Some(_) => {
                held.give_back();
                wait.pause(&call.scope).await?;
                continue;
            }
            None => return Err(Error::store("GET_LOCK failed")),
        }

        let outcome = under_lock(held.conn(), call, &find, body).await;

        let released: Result<Option<i64>, _> = sqlx::query_scalar(&release_lock)
            .bind(T::TABLE)
            .bind(call.key.as_str())
            .fetch_one(held.conn())
            .await;
        match released {
            Ok(Some(1)) => held.give_back(),
            // Closing the connection ends the session, which frees the lock.
            other => {
                tracing::warn!(
                    ?other,
                    "releasing the entity lock failed; closing its connection"
                );
                drop(held);
            }
        }
        return outcome;
    }
}

/// What runs under the lock: look again, run the body, save.
async fn under_lock<T, E, Fut>(
    conn: &mut sqlx::MySqlConnection,
    call: &Prepared,
    find: &str,
    body: Fut,
) -> Result<Result<T, E>, Error>
where
    T: TokenEntity
        + EntityBind<MySql>
        + for<'r> FromRow<'r, <MySql as sqlx::Database>::Row>
        + Send
        + Unpin,
    Fut: Future<Output = Result<T, E>>,
{
    // The holder before this one stored its row before freeing the lock.
    let found: Option<T> = sqlx::query_as(find)
        .bind(call.key.as_str())
        .fetch_optional(&mut *conn)
        .await?;
    if let Some(found) = found {
        return Ok(Ok(call.replay(found)?));
    }

    call.executing();
    let mut entity = match body.await {
        Ok(entity) => entity,
        Err(err) => {
            call.failed();
            return Ok(Err(err));
        }
    };
    call.produced(&mut entity)?;
    let insert = DIALECT.insert(T::TABLE, T::COLUMNS);
    let args = arguments::<MySql, T>(&entity, T::COLUMNS)?;
    match sqlx::query_with(&insert, args).execute(&mut *conn).await {
        Ok(_) => {}
        Err(err) if is_unique_violation(&err) => {
            let winner: Option<T> = sqlx::query_as(find)
                .bind(call.key.as_str())
                .fetch_optional(&mut *conn)
                .await?;
            return match winner {
                Some(winner) => Ok(Ok(call.lost_race(Some(winner))?)),
                // The row collides on a unique key other than the token.
                None => Err(err.into()),
            };
        }
        Err(err) => return Err(err.into()),
    }
    let saved: Option<T> = sqlx::query_as(find)
        .bind(call.key.as_str())
        .fetch_optional(&mut *conn)
        .await?;
    Ok(Ok(saved.ok_or_else(|| {
        Error::store("the entity was inserted but cannot be read back by its token")
    })?))
}
