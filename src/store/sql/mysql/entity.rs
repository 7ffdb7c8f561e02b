//! Entity mode and upserts on MySQL and MariaDB: their statements, built
//! for each entity from its table and column names (checked before), and
//! how they run, since neither an insert nor an upsert answers the row it
//! wrote (MySQL has no `RETURNING`): the row is read back. The flow is
//! [`crate::entity::run`]'s; claims live in the records table
//! [`CLAIMS_TABLE`](crate::entity::CLAIMS_TABLE) of the same database.

use std::time::Duration;

use sqlx::mysql::{MySql, MySqlConnection, MySqlPool};
use sqlx::FromRow;

use crate::store::sql::entity::{
    arguments, check_conflict, is_unique_violation, listed, updated_columns, EntityBind,
    EntityDatabase, EntitySql, TokenEntity,
};
use crate::store::sql::tx::TxConn;
use idem_core::error::Error;

/// InnoDB's deadlock error.
const ER_LOCK_DEADLOCK: u16 = 1213;
/// How often an upsert picked as a deadlock victim runs.
const UPSERT_ATTEMPTS: u32 = 5;

impl EntitySql for MySql {
    fn select_where(table: &str, columns: &[&str]) -> String {
        let conditions = listed(columns, " AND ", |_, c| format!("`{c}` = ?"));
        format!("SELECT * FROM `{table}` WHERE {conditions}")
    }

    /// A plain insert: a duplicate token fails (error 1062).
    fn insert(table: &str, columns: &[&str], _token: &str) -> String {
        plain_insert(table, columns)
    }

    /// `ON DUPLICATE KEY UPDATE`, which answers nothing: the row is read
    /// back with [`select_where`](EntitySql::select_where) on the
    /// conflict columns.
    fn upsert(table: &str, columns: &[&str], conflict: &[&str]) -> String {
        let insert = plain_insert(table, columns);
        let updated = updated_columns(columns, conflict);
        let set = listed(&updated, ", ", |_, c| format!("`{c}` = VALUES(`{c}`)"));
        format!("{insert} ON DUPLICATE KEY UPDATE {set}")
    }
}

/// `INSERT INTO <table> (<columns>) VALUES (<a placeholder each>)`.
fn plain_insert(table: &str, columns: &[&str]) -> String {
    let names = listed(columns, ", ", |_, c| format!("`{c}`"));
    let values = listed(columns, ", ", |_, _| "?".to_owned());
    format!("INSERT INTO `{table}` ({names}) VALUES ({values})")
}

impl EntityDatabase for MySql {
    /// `INSERT`, then the row read back by its token; a duplicate of the
    /// token (error 1062) answers `None`.
    async fn insert_entity<'c, T>(
        conn: &'c mut MySqlConnection,
        entity: &'c T,
    ) -> Result<Option<T>, Error>
    where
        T: TokenEntity + EntityBind<MySql> + for<'r> FromRow<'r, Self::Row> + Send + Unpin,
    {
        let insert = Self::insert(T::TABLE, T::COLUMNS, T::TOKEN_COLUMN);
        let args = arguments::<MySql, T>(entity, T::COLUMNS)?;
        let token = entity
            .token()
            .map_err(|err| Error::Config(err.to_string()))?;
        match sqlx::query_with(&insert, args).execute(&mut *conn).await {
            Ok(_) => {}
            Err(err) if is_unique_violation(&err) => {
                // The token's row, or another unique key's collision.
                return match Self::find_entity_on::<T>(conn, &token).await? {
                    Some(_) => Ok(None),
                    None => Err(err.into()),
                };
            }
            Err(err) => return Err(err.into()),
        }
        Self::find_entity_on(conn, &token)
            .await?
            .map(Some)
            .ok_or_else(|| {
                Error::store("the entity was inserted but cannot be read back by its token")
            })
    }

    async fn upsert_entity<T>(pool: &MySqlPool, entity: &T, conflict: &[&str]) -> Result<T, Error>
    where
        T: EntityBind<MySql> + for<'r> FromRow<'r, Self::Row> + Send + Unpin,
    {
        check_conflict::<T>(conflict)?;
        let upsert = Self::upsert(T::TABLE, T::COLUMNS, conflict);
        let select = Self::select_where(T::TABLE, conflict);
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
    // Closed rather than pooled if this call is dropped before its
    // transaction ends (see `TxConn`).
    let mut conn = TxConn::acquire(pool).await?;
    let mut tx = conn.begin(None).await?;
    let args = arguments::<MySql, T>(entity, T::COLUMNS)?;
    sqlx::query_with(upsert, args).execute(&mut *tx).await?;
    let args = arguments::<MySql, T>(entity, conflict)?;
    let row = sqlx::query_as_with(select, args)
        .fetch_one(&mut *tx)
        .await?;
    tx.commit().await?;
    conn.ended();
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
