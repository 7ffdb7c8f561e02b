//! MySQL's and MariaDB's statements on the outbox
//! (`<records table>_outbox`), for the outbox's flow
//! ([`outbox`](crate::store::sql::outbox)); what each is for, and the
//! order of its values, is said on [`OutboxStatements`]. A relay's read
//! of free rows passes over those another relay is leasing
//! (`FOR UPDATE SKIP LOCKED`); a message whose id is there already writes
//! nothing (`ON DUPLICATE KEY UPDATE message_id = message_id`, which
//! counts as a matched row).

use sqlx::MySql;

use super::NOW;
use crate::store::sql::statements::{
    filled_on_one_line, outbox_table, OutboxSql, OutboxStatements,
};

impl OutboxSql for MySql {
    /// The outbox's statements beside the records table `table`.
    fn outbox(table: &str) -> OutboxStatements {
        let fill = |sql: &str| filled_on_one_line(sql, table, NOW);
        OutboxStatements {
            table: outbox_table(table),
            insert_fenced: fill(
                r#"INSERT INTO `{table}_outbox` (message_id, topic, message_key, payload, headers,
                    attempts, created_at, expires_at)
                SELECT ?, ?, ?, ?, ?, 0, {now}, {now} + ?
                FROM `{table}` AS r
                WHERE r.scope = ? AND r.`key` = ? AND r.claim_token = ?
                AND r.state = 'in_progress' LOCK IN SHARE MODE
                ON DUPLICATE KEY UPDATE message_id = message_id"#,
            ),
            insert: fill(
                r#"INSERT INTO `{table}_outbox` (message_id, topic, message_key, payload, headers,
                    attempts, created_at, expires_at)
                SELECT ?, ?, ?, ?, ?, 0, {now}, {now} + ?
                FROM (SELECT 1 AS one) AS r
                WHERE true
                ON DUPLICATE KEY UPDATE message_id = message_id"#,
            ),
            exists: fill(
                r#"SELECT COUNT(*)
                FROM `{table}_outbox`
                WHERE message_id = ?"#,
            ),
            free: fill(
                r#"SELECT seq
                FROM `{table}_outbox`
                WHERE relayed_at IS NULL AND parked_at IS NULL
                AND (lease_until IS NULL OR lease_until <= {now})
                ORDER BY relayed_at, seq LIMIT ? FOR UPDATE SKIP LOCKED"#,
            ),
            leased: fill(
                r#"SELECT seq, message_id, topic, message_key, payload, headers, attempts
                FROM `{table}_outbox`
                WHERE lease_token = ? AND relayed_at IS NULL
                ORDER BY seq"#,
            ),
            purge: fill(
                r#"DELETE FROM `{table}_outbox`
                WHERE relayed_at IS NOT NULL AND expires_at <= {now}
                ORDER BY seq LIMIT ?"#,
            ),
            waiting: fill(
                r#"SELECT COUNT(*)
                FROM `{table}_outbox`
                WHERE relayed_at IS NULL AND parked_at IS NULL"#,
            ),
            park: fill(
                r#"UPDATE `{table}_outbox`
                SET parked_at = {now}, parked_reason = ?, lease_until = NULL, lease_token = NULL
                WHERE relayed_at IS NULL AND lease_token = ? AND seq = ?"#,
            ),
            parked: fill(
                r#"SELECT seq, message_id, topic, message_key, payload, headers, attempts,
                parked_reason
                FROM `{table}_outbox`
                WHERE relayed_at IS NULL AND parked_at IS NOT NULL
                ORDER BY seq LIMIT ?"#,
            ),
            parked_count: fill(
                r#"SELECT COUNT(*)
                FROM `{table}_outbox`
                WHERE relayed_at IS NULL AND parked_at IS NOT NULL"#,
            ),
            lease: fill(
                r#"UPDATE `{table}_outbox`
                SET lease_until = {now} + ?, lease_token = ?, attempts = attempts + 1
                WHERE relayed_at IS NULL AND parked_at IS NULL
                AND (lease_until IS NULL OR lease_until <= {now}) AND seq IN "#,
            ),
            mark: fill(
                r#"UPDATE `{table}_outbox`
                SET relayed_at = {now}, lease_until = NULL, lease_token = NULL
                WHERE relayed_at IS NULL AND seq IN "#,
            ),
            release: fill(
                r#"UPDATE `{table}_outbox`
                SET lease_until = NULL, lease_token = NULL
                WHERE relayed_at IS NULL AND lease_token = ? AND seq IN "#,
            ),
            unpark: fill(
                r#"UPDATE `{table}_outbox`
                SET parked_at = NULL, parked_reason = NULL
                WHERE relayed_at IS NULL AND parked_at IS NOT NULL AND seq IN "#,
            ),
        }
    }
}
