//! Entity mode and upserts on MySQL and MariaDB: the statements. The flow
//! is [`crate::entity::run`]'s; claims live in the records table
//! [`CLAIMS_TABLE`](crate::entity::CLAIMS_TABLE) of the same database.

use std::time::Duration;

use sqlx::mysql::{MySql, MySqlConnection, MySqlPool};
use sqlx::FromRow;

use crate::store::sql::entity::{
    self as statements, arguments, check_conflict, is_unique_violation, EntityBind, EntityDatabase,
    TokenEntity,
};
use crate::store::sql::tx::TxConn;
use idem_core::error::Error;

/// InnoDB's deadlock error.
const ER_LOCK_DEADLOCK: u16 = 1213;
/// How often an upsert picked as a deadlock victim runs.
const UPSERT_ATTEMPTS: u32 = 5;

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
        let insert = statements::insert::<MySql>(T::TABLE, T::COLUMNS);
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
        let upsert = upsert(T::TABLE, T::COLUMNS, conflict);
        let select = statements::select_where::<MySql>(T::TABLE, conflict);
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

/// `INSERT ... ON DUPLICATE KEY UPDATE <c> = VALUES(<c>), ...` over the
/// columns other than the conflict's. With no other column, the first
/// conflict column is set to itself.
pub(crate) fn upsert(table: &str, columns: &[&str], conflict: &[&str]) -> String {
    let mut updated: Vec<&str> = columns
        .iter()
        .copied()
        .filter(|c| !conflict.contains(c))
        .collect();
    if updated.is_empty() {
        updated.push(conflict[0]);
    }
    let set: Vec<String> = updated
        .iter()
        .map(|c| format!("{0} = VALUES({0})", statements::quote::<MySql>(c)))
        .collect();
    format!(
        "{} ON DUPLICATE KEY UPDATE {}",
        statements::insert::<MySql>(table, columns),
        set.join(", ")
    )
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
