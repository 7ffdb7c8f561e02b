//! SQLite's statements on the outbox (`<records table>_outbox`), for the
//! outbox's flow ([`outbox`](crate::store::sql::outbox)); what each is
//! for, and the order of its values, is said on [`OutboxStatements`]. A
//! relay's read of free rows locks nothing: its transaction holds the
//! whole database. A message whose id is there already writes nothing
//! (`ON CONFLICT (message_id) DO NOTHING`).

use sqlx::Sqlite;

use super::NOW;
use crate::store::sql::statements::{
    filled_on_one_line, outbox_table, OutboxSql, OutboxStatements,
};

impl OutboxSql for Sqlite {
    /// The outbox's statements beside the records table `table`.
    fn outbox(table: &str) -> OutboxStatements {
        let fill = |sql: &str| filled_on_one_line(sql, table, NOW);
        OutboxStatements {
            table: outbox_table(table),
            insert_fenced: fill(
                r#"INSERT INTO "{table}_outbox" (message_id, topic, message_key, payload, headers,
                    attempts, created_at, expires_at)
                SELECT ?1, ?2, ?3, ?4, ?5, 0, {now}, {now} + ?6
                FROM "{table}" AS r
                WHERE r.scope = ?7 AND r."key" = ?8 AND r.claim_token = ?9
                AND r.state = 'in_progress'
                ON CONFLICT (message_id) DO NOTHING"#,
            ),
            insert: fill(
                r#"INSERT INTO "{table}_outbox" (message_id, topic, message_key, payload, headers,
                    attempts, created_at, expires_at)
                SELECT ?1, ?2, ?3, ?4, ?5, 0, {now}, {now} + ?6
                FROM (SELECT 1 AS one) AS r
                WHERE true
                ON CONFLICT (message_id) DO NOTHING"#,
            ),
            exists: fill(
                r#"SELECT COUNT(*)
                FROM "{table}_outbox"
                WHERE message_id = ?1"#,
            ),
            free: fill(
                r#"SELECT seq
                FROM "{table}_outbox"
                WHERE relayed_at IS NULL AND parked_at IS NULL
                AND (lease_until IS NULL OR lease_until <= {now})
                ORDER BY relayed_at, seq LIMIT ?1"#,
            ),
            leased: fill(
                r#"SELECT seq, message_id, topic, message_key, payload, headers, attempts
                FROM "{table}_outbox"
                WHERE lease_token = ?1 AND relayed_at IS NULL
                ORDER BY seq"#,
            ),
            purge: fill(
                r#"DELETE FROM "{table}_outbox"
                WHERE seq IN (SELECT seq FROM "{table}_outbox"
                    WHERE relayed_at IS NOT NULL AND expires_at <= {now}
                    ORDER BY seq LIMIT ?1)"#,
            ),
            waiting: fill(
                r#"SELECT COUNT(*)
                FROM "{table}_outbox"
                WHERE relayed_at IS NULL AND parked_at IS NULL"#,
            ),
            park: fill(
                r#"UPDATE "{table}_outbox"
                SET parked_at = {now}, parked_reason = ?1, lease_until = NULL,
                lease_token = NULL
                WHERE relayed_at IS NULL AND lease_token = ?2 AND seq = ?3"#,
            ),
            parked: fill(
                r#"SELECT seq, message_id, topic, message_key, payload, headers, attempts,
                parked_reason
                FROM "{table}_outbox"
                WHERE relayed_at IS NULL AND parked_at IS NOT NULL
                ORDER BY seq LIMIT ?1"#,
            ),
            parked_count: fill(
                r#"SELECT COUNT(*)
                FROM "{table}_outbox"
                WHERE relayed_at IS NULL AND parked_at IS NOT NULL"#,
            ),
            lease: fill(
                r#"UPDATE "{table}_outbox"
                SET lease_until = {now} + ?1, lease_token = ?2, attempts = attempts + 1
                WHERE relayed_at IS NULL AND parked_at IS NULL
                AND (lease_until IS NULL OR lease_until <= {now}) AND seq IN "#,
            ),
            mark: fill(
                r#"UPDATE "{table}_outbox"
                SET relayed_at = {now}, lease_until = NULL, lease_token = NULL
                WHERE relayed_at IS NULL AND seq IN "#,
            ),
            release: fill(
                r#"UPDATE "{table}_outbox"
                SET lease_until = NULL, lease_token = NULL
                WHERE relayed_at IS NULL AND lease_token = ?1 AND seq IN "#,
            ),
            unpark: fill(
                r#"UPDATE "{table}_outbox"
                SET parked_at = NULL, parked_reason = NULL
                WHERE relayed_at IS NULL AND parked_at IS NOT NULL AND seq IN "#,
            ),
        }
    }
}
