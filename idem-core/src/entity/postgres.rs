//! Entity mode and upserts on PostgreSQL.
//!
//! The per-token lock is a transaction-scoped advisory lock on a 64-bit
//! hash of the table and the token, tried without waiting
//! (`pg_try_advisory_xact_lock`) in a `READ COMMITTED` transaction. The
//! body runs and the entity is inserted inside that transaction; its commit
//! releases the lock, and only after the row is visible.

use std::future::Future;

use sqlx::postgres::{PgConnection, PgPool, Postgres};
use sqlx::{Connection, FromRow};
use tracing::Instrument;

use super::{
    arguments, check_conflict, check_token_names, lock_digest, sealed, Answer, Dialect, EntityBind,
    EntityDatabase, Held, Prepared, TokenEntity,
};
use crate::{Call, Error, Key};

const DIALECT: Dialect = Dialect::Postgres;

impl sealed::Sealed for Postgres {}

impl EntityDatabase for Postgres {
    async fn run_entity<T, E, Fut>(pool: &PgPool, call: Call, body: Fut) -> Result<T, E>
    where
        T: TokenEntity + EntityBind<Postgres> + for<'r> FromRow<'r, Self::Row> + Send + Unpin,
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

    async fn find_entity<T>(pool: &PgPool, token: &Key) -> Result<Option<T>, Error>
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

    async fn upsert_entity<T>(pool: &PgPool, entity: &T, conflict: &[&str]) -> Result<T, Error>
    where
        T: EntityBind<Postgres> + for<'r> FromRow<'r, Self::Row> + Send + Unpin,
    {
        check_conflict::<T>(conflict)?;
        let sql = format!(
            "{} {} RETURNING *",
            DIALECT.insert(T::TABLE, T::COLUMNS),
            DIALECT.on_conflict_update(conflict, T::COLUMNS)
        );
        let args = arguments::<Postgres, T>(entity, T::COLUMNS)?;
        Ok(sqlx::query_as_with(&sql, args).fetch_one(pool).await?)
    }
}

/// The flow; the outer error is the library's, the inner result the body's.
async fn run<T, E, Fut>(pool: &PgPool, call: &Prepared, body: Fut) -> Result<Result<T, E>, Error>
where
    T: TokenEntity
        + EntityBind<Postgres>
        + for<'r> FromRow<'r, <Postgres as sqlx::Database>::Row>
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
    let digest = lock_digest(T::TABLE, &call.key);
    let lock = i64::from_be_bytes(digest[..8].try_into().expect("8 bytes"));
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
        let mut tx = held
            .conn()
            .begin_with("BEGIN ISOLATION LEVEL READ COMMITTED")
            .await?;
        let locked: bool = sqlx::query_scalar("SELECT pg_try_advisory_xact_lock($1)")
            .bind(lock)
            .fetch_one(&mut *tx)
            .await?;
        if !locked {
            tx.rollback().await?;
            held.give_back();
            wait.pause(&call.scope).await?;
            continue;
        }
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
    conn: &mut PgConnection,
    call: &Prepared,
    find: &str,
    insert: &str,
    body: Fut,
) -> Result<Result<Answer<T>, E>, Error>
where
    T: TokenEntity
        + EntityBind<Postgres>
        + for<'r> FromRow<'r, <Postgres as sqlx::Database>::Row>
        + Send
        + Unpin,
    Fut: Future<Output = Result<T, E>>,
{
    // The holder before this one committed before its lock was freed.
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
    let args = arguments::<Postgres, T>(&entity, T::COLUMNS)?;
    let inserted: Option<T> = sqlx::query_as_with(insert, args)
        .fetch_optional(&mut *conn)
        .await?;
    Ok(Ok(match inserted {
        Some(row) => Answer::Saved(row),
        None => {
            // A new statement sees the conflicting row once committed.
            let winner = sqlx::query_as(find)
                .bind(call.key.as_str())
                .fetch_optional(&mut *conn)
                .await?;
            Answer::Existing(call.lost_race(winner)?)
        }
    }))
}
