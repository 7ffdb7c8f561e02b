//! Entity mode and upserts on SQLite.
//!
//! SQLite has one writer per database, so the per-token lock is the write
//! lock itself: `BEGIN IMMEDIATE`, taken without waiting in SQLite's busy
//! handler (the connection's `busy_timeout` is zero for that statement
//! only), so that a caller waits under its policy and gives its connection
//! back between looks. First executions are serialized database-wide.

use std::future::Future;

use sqlx::sqlite::{Sqlite, SqliteConnection, SqlitePool};
use sqlx::{Connection, FromRow};
use tracing::Instrument;

use super::{
    arguments, check_conflict, check_token_names, sealed, Answer, Dialect, EntityBind,
    EntityDatabase, Held, Prepared, TokenEntity,
};
use crate::{Call, Error, Key};

const DIALECT: Dialect = Dialect::Sqlite;

/// `SQLITE_BUSY`: the primary result code of every busy answer.
const SQLITE_BUSY: i64 = 5;

impl sealed::Sealed for Sqlite {}

impl EntityDatabase for Sqlite {
    async fn run_entity<T, E, Fut>(pool: &SqlitePool, call: Call, body: Fut) -> Result<T, E>
    where
        T: TokenEntity + EntityBind<Sqlite> + for<'r> FromRow<'r, Self::Row> + Send + Unpin,
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

    async fn find_entity<T>(pool: &SqlitePool, token: &Key) -> Result<Option<T>, Error>
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

    async fn upsert_entity<T>(pool: &SqlitePool, entity: &T, conflict: &[&str]) -> Result<T, Error>
    where
        T: EntityBind<Sqlite> + for<'r> FromRow<'r, Self::Row> + Send + Unpin,
    {
        check_conflict::<T>(conflict)?;
        let sql = upsert_sql::<T>(conflict);
        let args = arguments::<Sqlite, T>(entity, T::COLUMNS)?;
        Ok(sqlx::query_as_with(&sql, args).fetch_one(pool).await?)
    }
}

/// The flow; the outer error is the library's, the inner result the body's.
async fn run<T, E, Fut>(
    pool: &SqlitePool,
    call: &Prepared,
    body: Fut,
) -> Result<Result<T, E>, Error>
where
    T: TokenEntity
        + EntityBind<Sqlite>
        + for<'r> FromRow<'r, <Sqlite as sqlx::Database>::Row>
        + Send
        + Unpin,
    Fut: Future<Output = Result<T, E>>,
{
    let find = DIALECT.select_where(T::TABLE, &[T::TOKEN_COLUMN]);
    let insert = format!(
        "{} ON CONFLICT ({}) DO NOTHING RETURNING *",
        DIALECT.insert(T::TABLE, T::COLUMNS),
        DIALECT.quote(T::TOKEN_COLUMN)
    );
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
        let timeout = set_busy_timeout(held.conn(), 0).await?;
        let began = held.conn().begin_with("BEGIN IMMEDIATE").await;
        if matches!(&began, Err(err) if is_busy(err)) {
            drop(began);
            set_busy_timeout(held.conn(), timeout).await?;
            held.give_back();
            wait.pause(&call.scope).await?;
            continue;
        }
        let mut tx = began?;
        set_busy_timeout(&mut tx, timeout).await?;
        let outcome = under_lock(&mut tx, call, &find, &insert, body).await;
        // Only a new row is committed; anything else is undone. Should that
        // fail, the connection is closed rather than given back.
        match &outcome {
            Ok(Ok(Answer::Saved(_))) => tx.commit().await?,
            _ => tx.rollback().await?,
        }
        held.give_back();
        return outcome.map(|result| result.map(Answer::into_inner));
    }
}

/// What runs under the lock: look again, run the body, insert.
async fn under_lock<T, E, Fut>(
    conn: &mut SqliteConnection,
    call: &Prepared,
    find: &str,
    insert: &str,
    body: Fut,
) -> Result<Result<Answer<T>, E>, Error>
where
    T: TokenEntity
        + EntityBind<Sqlite>
        + for<'r> FromRow<'r, <Sqlite as sqlx::Database>::Row>
        + Send
        + Unpin,
    Fut: Future<Output = Result<T, E>>,
{
    let found: Option<T> = sqlx::query_as(find)
        .bind(call.key.as_str())
        .fetch_optional(&mut *conn)
        .await?;
    if let Some(found) = found {
        return Ok(Ok(Answer::Existing(call.replay(found)?)));
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
    let args = arguments::<Sqlite, T>(&entity, T::COLUMNS)?;
    let inserted: Option<T> = sqlx::query_as_with(insert, args)
        .fetch_optional(&mut *conn)
        .await?;
    Ok(Ok(match inserted {
        Some(row) => Answer::Saved(row),
        None => {
            let winner = sqlx::query_as(find)
                .bind(call.key.as_str())
                .fetch_optional(&mut *conn)
                .await?;
            Answer::Existing(call.lost_race(winner)?)
        }
    }))
}

/// Sets the connection's busy timeout (milliseconds); answers the one it
/// replaces.
async fn set_busy_timeout(conn: &mut SqliteConnection, millis: i64) -> Result<i64, Error> {
    let prior: i64 = sqlx::query_scalar("PRAGMA busy_timeout")
        .fetch_one(&mut *conn)
        .await?;
    // A pragma takes no parameters; the value is an integer.
    sqlx::query(&format!("PRAGMA busy_timeout = {millis}"))
        .execute(&mut *conn)
        .await?;
    Ok(prior)
}

/// Whether SQLite answered busy: another connection holds the write lock.
fn is_busy(err: &sqlx::Error) -> bool {
    err.as_database_error()
        .and_then(|db| db.code())
        .and_then(|code| code.parse::<i64>().ok())
        .is_some_and(|code| code & 0xff == SQLITE_BUSY)
}

fn upsert_sql<T: super::Entity>(conflict: &[&str]) -> String {
    format!(
        "{} {} RETURNING *",
        DIALECT.insert(T::TABLE, T::COLUMNS),
        DIALECT.on_conflict_update(conflict, T::COLUMNS)
    )
}
