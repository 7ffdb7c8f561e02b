//! [`Inventory`] on the SQL backends: an operator's reads over a whole
//! records table and its journal, written once for every backend with its
//! clock ([`Dialect::NOW`](super::dialect::Dialect::NOW)) and its quoting.

use async_trait::async_trait;

use super::exec::Value;
use super::flow::{record_from_row, Columns};
use super::journal::decode;
use super::step_statements::{numbered, steps_table};
use super::{Backend, SqlStore};
use crate::admin::{Inventory, ScopeStats, Stats, StepStats};
use idem_core::error::Error;
use idem_core::journal::{StepRecord, StepState};
use idem_core::key::Key;
use idem_core::record::{Millis, Record, State};

/// The statements of [`Inventory`] on one records table.
pub(super) struct InventoryStatements {
    now: String,
    exists: String,
    with_key: String,
    by_scope: String,
    oldest_in_progress: String,
    steps: String,
    steps_with_key: String,
}

impl InventoryStatements {
    fn new<DB: Backend>(table: &str) -> Self {
        let q = DB::QUOTE;
        let fill = |sql: &str| {
            let sql = sql
                .replace("{records}", &format!("{q}{table}{q}"))
                .replace("{steps}", &format!("{q}{}{q}", steps_table(table)))
                .replace("{key}", &format!("{q}key{q}"))
                .replace("{now}", DB::NOW);
            numbered::<DB>(&sql)
        };
        const COLUMNS: &str = "scope, {key}, fingerprint, state, fence, claim_token, \
                               lease_until, outcome_kind, outcome, created_at, expires_at";
        InventoryStatements {
            now: fill("SELECT {now}"),
            // The name is checked (`validate_table_name`): it cannot end
            // the quoted literal.
            exists: DB::TABLE_EXISTS.replace("{table}", table),
            with_key: fill(&format!(
                "SELECT {COLUMNS} FROM {{records}} WHERE {{key}} = ? ORDER BY scope"
            )),
            by_scope: fill(
                "SELECT scope, state, COUNT(*) AS n, \
                 COUNT(CASE WHEN expires_at <= {now} THEN 1 END) AS expired \
                 FROM {records} GROUP BY scope, state ORDER BY scope",
            ),
            oldest_in_progress: fill(&format!(
                "SELECT {COLUMNS} FROM {{records}} WHERE state = 'in_progress' \
                 ORDER BY created_at LIMIT 1"
            )),
            steps_with_key: fill(&format!(
                "SELECT {} FROM {{steps}} WHERE {{key}} = ? ORDER BY scope, seq",
                super::step_statements::COLUMNS
            )),
            steps: fill(
                "SELECT state, COUNT(*) AS n, \
                 COUNT(CASE WHEN expires_at <= {now} THEN 1 END) AS expired \
                 FROM {steps} GROUP BY state",
            ),
        }
    }
}

#[cfg(test)]
impl InventoryStatements {
    /// Every statement as `DB` is sent it on `table`, by name.
    pub(super) fn sent<DB: Backend>(table: &str) -> Vec<(&'static str, String)> {
        let sql = Self::new::<DB>(table);
        vec![
            ("now", sql.now),
            ("exists", sql.exists),
            ("with_key", sql.with_key),
            ("by_scope", sql.by_scope),
            ("oldest_in_progress", sql.oldest_in_progress),
            ("steps", sql.steps),
            ("steps_with_key", sql.steps_with_key),
        ]
    }
}

impl<DB: Backend> SqlStore<DB> {
    fn inventory_sql(&self) -> InventoryStatements {
        InventoryStatements::new::<DB>(&self.sql.table)
    }
}

/// A count as `u64` (a negative one is no count this library wrote).
fn count<DB: Backend>(columns: &Columns<'_, DB>, column: &str) -> Result<u64, Error> {
    u64::try_from(columns.int(column)?).map_err(|_| columns.corrupt("a negative count"))
}

#[async_trait]
impl<DB: Backend> Inventory for SqlStore<DB> {
    async fn now(&self) -> Result<Millis, Error> {
        let mut conn = self.pool.acquire().await?;
        DB::fetch_int(&mut conn, &self.inventory_sql().now, Vec::new())
            .await?
            .ok_or_else(|| Error::store("the database's clock read NULL"))
    }

    async fn is_set_up(&self) -> Result<bool, Error> {
        let mut conn = self.pool.acquire().await?;
        let tables = DB::fetch_int(&mut conn, &self.inventory_sql().exists, Vec::new()).await?;
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
        let now = DB::fetch_int(&mut conn, &sql.now, Vec::new())
            .await?
            .ok_or_else(|| Error::store("the database's clock read NULL"))?;
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
