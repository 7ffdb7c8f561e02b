//! Entity mode and upserts on SQLite: the statements. The flow is
//! [`super::run`]'s; claims live in the records table
//! [`CLAIMS_TABLE`](super::CLAIMS_TABLE) of the same database, so a claim
//! holds no lock and unrelated tokens run at once.

use std::sync::Arc;

use sqlx::sqlite::{Sqlite, SqlitePool};
use sqlx::FromRow;

use super::{
    arguments, check_conflict, check_token_names, migrate_once, sealed, Claims, Dialect,
    EntityBind, EntityDatabase, TokenEntity, CLAIMS_TABLE,
};
use crate::error::Error;
use crate::key::Key;
use crate::store::{SqliteStore, Store};

const DIALECT: Dialect = Dialect::Sqlite;

impl sealed::Sealed for Sqlite {}

impl EntityDatabase for Sqlite {
    async fn claims(pool: &SqlitePool) -> Result<Arc<dyn Store>, Error> {
        let store = SqliteStore::new(pool.clone()).with_table_name(CLAIMS_TABLE)?;
        migrate_once(
            format!("sqlite {:?}", pool.connect_options()),
            store.migrate(),
        )
        .await?;
        Ok(Arc::new(Claims(store)))
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

    async fn insert_entity<T>(pool: &SqlitePool, entity: &T) -> Result<Option<T>, Error>
    where
        T: TokenEntity + EntityBind<Sqlite> + for<'r> FromRow<'r, Self::Row> + Send + Unpin,
    {
        let insert = format!(
            "{} ON CONFLICT ({}) DO NOTHING RETURNING *",
            DIALECT.insert(T::TABLE, T::COLUMNS),
            DIALECT.quote(T::TOKEN_COLUMN)
        );
        let args = arguments::<Sqlite, T>(entity, T::COLUMNS)?;
        Ok(sqlx::query_as_with(&insert, args)
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

/// `INSERT ... ON CONFLICT (<conflict>) DO UPDATE ... RETURNING *`.
fn upsert_sql<T: super::Entity>(conflict: &[&str]) -> String {
    format!(
        "{} {} RETURNING *",
        DIALECT.insert(T::TABLE, T::COLUMNS),
        DIALECT.on_conflict_update(conflict, T::COLUMNS)
    )
}
