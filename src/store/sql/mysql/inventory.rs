//! MySQL's and MariaDB's statements for an operator's inventory of a
//! records table and its journal, for the inventory's flow
//! ([`inventory`](crate::store::sql::inventory)); what each is for is
//! said on [`InventoryStatements`].

use sqlx::MySql;

use super::NOW;
use crate::store::sql::statements::{filled_on_one_line, InventorySql, InventoryStatements};

impl InventorySql for MySql {
    /// The inventory's statements on the records table `table`.
    fn inventory(table: &str) -> InventoryStatements {
        let fill = |sql: &str| filled_on_one_line(sql, table, NOW);
        InventoryStatements {
            with_key: fill(
                r#"SELECT scope, `key`, fingerprint, state, fence, claim_token, lease_until,
                outcome_kind, outcome, created_at, expires_at
                FROM `{table}`
                WHERE `key` = ?
                ORDER BY scope"#,
            ),
            by_scope: fill(
                r#"SELECT scope, state, COUNT(*) AS n,
                COUNT(CASE WHEN expires_at <= {now} THEN 1 END) AS expired
                FROM `{table}`
                GROUP BY scope, state
                ORDER BY scope"#,
            ),
            oldest_in_progress: fill(
                r#"SELECT scope, `key`, fingerprint, state, fence, claim_token, lease_until,
                outcome_kind, outcome, created_at, expires_at
                FROM `{table}`
                WHERE state = 'in_progress'
                ORDER BY created_at LIMIT 1"#,
            ),
            steps: fill(
                r#"SELECT state, COUNT(*) AS n,
                COUNT(CASE WHEN expires_at <= {now} THEN 1 END) AS expired
                FROM `{table}_steps`
                GROUP BY state"#,
            ),
            steps_with_key: fill(
                r#"SELECT scope, `key`, seq, name, fingerprint, state, claim_token, output,
                updated_at, expires_at, {now} AS db_now
                FROM `{table}_steps`
                WHERE `key` = ?
                ORDER BY scope, seq"#,
            ),
        }
    }
}
