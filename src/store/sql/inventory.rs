//! [`Inventory`] on the SQL backends: an operator's reads over a whole
//! records table and its journal, on each backend's statements
//! ([`InventoryStatements`], in `<backend>/inventory.rs`).

use async_trait::async_trait;

use super::exec::Value;
use super::flow::{record_from_row, Columns};
use super::journal::decode;
use super::statements::InventoryStatements;
use super::{Backend, SqlStore};
use crate::admin::{Inventory, ScopeStats, Stats, StepStats};
use idem_core::error::Error;
use idem_core::journal::{StepRecord, StepState};
use idem_core::key::Key;
use idem_core::record::{Millis, Record, State};

/// Reads the database's clock: the one statement of the inventory every
/// backend shares, each with its own clock
/// ([`Dialect::NOW`](super::dialect::Dialect::NOW)).
const CLOCK: &str = "SELECT {now}";

impl<DB: Backend> SqlStore<DB> {
    /// The inventory's statements on this store's table
    /// (`<backend>/inventory.rs`).
    fn inventory_sql(&self) -> InventoryStatements {
        DB::inventory(&self.sql.table)
    }

    /// Reads the database's clock.
    async fn clock(&self, conn: &mut DB::Connection) -> Result<Millis, Error> {
        DB::fetch_int(conn, &clock::<DB>(), Vec::new())
            .await?
            .ok_or_else(|| Error::store("the database's clock read NULL"))
    }
}

/// [`CLOCK`] on `DB`.
fn clock<DB: Backend>() -> String {
    CLOCK.replace("{now}", DB::NOW)
}

/// Counts the tables named `table`: the backend's own statement, which its
/// migrations send too. The name is checked (`validate_table_name`): it
/// cannot end the quoted literal.
fn table_exists<DB: Backend>(table: &str) -> String {
    DB::TABLE_EXISTS.replace("{table}", table)
}

/// Every statement of the inventory as `DB` is sent it on `table`, by
/// name.
#[cfg(test)]
pub(super) fn sent<DB: Backend>(table: &str) -> Vec<(&'static str, String)> {
    let sql = DB::inventory(table);
    vec![
        ("now", clock::<DB>()),
        ("exists", table_exists::<DB>(table)),
        ("with_key", sql.with_key),
        ("by_scope", sql.by_scope),
        ("oldest_in_progress", sql.oldest_in_progress),
        ("steps", sql.steps),
        ("steps_with_key", sql.steps_with_key),
    ]
}

/// A count as `u64` (a negative one is no count this library wrote).
fn count<DB: Backend>(columns: &Columns<'_, DB>, column: &str) -> Result<u64, Error> {
    u64::try_from(columns.int(column)?).map_err(|_| columns.corrupt("a negative count"))
}

#[async_trait]
impl<DB: Backend> Inventory for SqlStore<DB> {
    async fn now(&self) -> Result<Millis, Error> {
        let mut conn = self.pool.acquire().await?;
        self.clock(&mut conn).await
    }

    async fn is_set_up(&self) -> Result<bool, Error> {
        let mut conn = self.pool.acquire().await?;
        let exists = table_exists::<DB>(&self.sql.table);
        let tables = DB::fetch_int(&mut conn, &exists, Vec::new()).await?;
        Ok(tables.unwrap_or(0) > 0)
    }

    async fn records_with_key(&self, key: &Key) -> Result<Vec<Record>, Error> {
        let mut conn = self.pool.acquire().await?;
        let sql = self.inventory_sql();
        let rows = DB::fetch_all(&mut conn, &sql.with_key, vec![Value::Text(key.as_str())]).await?;
        rows.iter().map(record_from_row::<DB>).collect()
    }

    async fn steps_with_key(&self, key: &Key) -> Result<Vec<StepRecord>, Error> {
        let mut conn = self.pool.acquire().await?;
        let sql = self.inventory_sql();
        let values = vec![Value::Text(key.as_str())];
        let rows = DB::fetch_all(&mut conn, &sql.steps_with_key, values).await?;
        rows.iter()
            .map(|row| decode::<DB>(row).map(|(entry, _)| entry))
            .collect()
    }

    async fn stats(&self) -> Result<Stats, Error> {
        let sql = self.inventory_sql();
        let mut conn = self.pool.acquire().await?;
        let now = self.clock(&mut conn).await?;
        let mut scopes: Vec<ScopeStats> = Vec::new();
        for row in DB::fetch_all(&mut conn, &sql.by_scope, Vec::new()).await? {
            let columns = Columns::<DB>::new(&row, "count of records");
            let scope = columns.text("scope")?;
            let state = State::parse(&columns.text("state")?)
                .ok_or_else(|| columns.corrupt("unknown state"))?;
            let (n, expired) = (count(&columns, "n")?, count(&columns, "expired")?);
            if scopes.last().is_none_or(|last| last.scope != scope) {
                scopes.push(ScopeStats {
                    scope,
                    ..ScopeStats::default()
                });
            }
            let entry = scopes.last_mut().expect("pushed above");
            match state {
                State::InProgress => entry.in_progress += n,
                State::Completed => entry.completed += n,
            }
            entry.expired += expired;
        }
        let mut steps = StepStats::default();
        for row in DB::fetch_all(&mut conn, &sql.steps, Vec::new()).await? {
            let columns = Columns::<DB>::new(&row, "count of journal entries");
            let state = StepState::parse(&columns.text("state")?)
                .ok_or_else(|| columns.corrupt("unknown state"))?;
            let n = count(&columns, "n")?;
            match state {
                StepState::Started => steps.started += n,
                StepState::Completed => steps.completed += n,
                StepState::RerunAllowed => steps.rerun_allowed += n,
            }
            steps.expired += count(&columns, "expired")?;
        }
        let oldest = DB::fetch_row(&mut conn, &sql.oldest_in_progress, Vec::new()).await?;
        Ok(Stats {
            now,
            scopes,
            steps,
            oldest_in_progress: oldest.as_ref().map(record_from_row::<DB>).transpose()?,
        })
    }

    async fn purge_expired_reporting(
        &self,
        batch: usize,
        progress: &(dyn Fn(u64) + Send + Sync),
    ) -> Result<u64, Error> {
        self.purge_reporting(batch, progress).await
    }
}
