//! MySQL's and MariaDB's statements on the step journal
//! (`<records table>_steps`), for the journal's flow
//! ([`journal`](crate::store::sql::journal)); what each is for, and the
//! order of its values, is said on [`StepStatements`]. The fence is a
//! shared lock on the record (`LOCK IN SHARE MODE`), which a takeover's
//! update waits for.

use sqlx::MySql;

use super::NOW;
use crate::store::sql::statements::{filled, filled_on_one_line, JournalSql, StepStatements};

/// Deletes at most a batch of expired entries, oldest first.
const PURGE: &str =
    r#"DELETE FROM `{table}_steps` WHERE expires_at <= {now} ORDER BY expires_at LIMIT ?"#;

/// The attempt that started the entry no longer holds the operation: the
/// condition of both resolutions (see
/// [`StepStatements::resolve_completed`]).
const STARTER_GONE: &str = r#"NOT EXISTS (SELECT 1 FROM `{table}` AS r
    WHERE r.scope = `{table}_steps`.scope AND r.`key` = `{table}_steps`.`key`
    AND r.claim_token = `{table}_steps`.claim_token AND r.state = 'in_progress'
    AND r.lease_until > {now})"#;

impl JournalSql for MySql {
    /// The journal's statements beside the records table `table`.
    fn journal(table: &str) -> StepStatements {
        let fill = |sql: &str| filled_on_one_line(sql, table, NOW);
        let resolution = |sql: &str| fill(&format!("{sql} AND {STARTER_GONE}"));
        StepStatements {
            fence: fill(
                r#"SELECT claim_token, state
                FROM `{table}`
                WHERE scope = ? AND `key` = ? LOCK IN SHARE MODE"#,
            ),
            select: fill(
                r#"SELECT scope, `key`, seq, name, fingerprint, state, claim_token, output,
                updated_at, expires_at, {now} AS db_now
                FROM `{table}_steps`
                WHERE scope = ? AND `key` = ? AND seq = ? FOR UPDATE"#,
            ),
            insert: fill(
                r#"INSERT INTO `{table}_steps` (scope, `key`, seq, name, fingerprint, state,
                    claim_token, updated_at, expires_at)
                VALUES (?, ?, ?, ?, ?, 'started', ?, {now}, {now} + ?)"#,
            ),
            start: fill(
                r#"UPDATE `{table}_steps`
                SET name = ?, fingerprint = ?, state = 'started', claim_token = ?,
                output = NULL, updated_at = {now}, expires_at = {now} + ?
                WHERE scope = ? AND `key` = ? AND seq = ?"#,
            ),
            complete: fill(
                r#"UPDATE `{table}_steps`
                SET state = 'completed', claim_token = ?, output = ?, updated_at = {now},
                expires_at = {now} + ?
                WHERE scope = ? AND `key` = ? AND seq = ? AND name = ? AND state <> 'completed'"#,
            ),
            list: fill(
                r#"SELECT scope, `key`, seq, name, fingerprint, state, claim_token, output,
                updated_at, expires_at, {now} AS db_now
                FROM `{table}_steps`
                WHERE scope = ? AND `key` = ?
                ORDER BY seq"#,
            ),
            resolve_completed: resolution(
                r#"UPDATE `{table}_steps`
                SET state = 'completed', output = ?, updated_at = {now}
                WHERE scope = ? AND `key` = ? AND seq = ? AND name = ?
                AND state <> 'completed' AND expires_at > {now}"#,
            ),
            resolve_rerun: resolution(
                r#"UPDATE `{table}_steps`
                SET state = 'rerun_allowed', updated_at = {now}
                WHERE scope = ? AND `key` = ? AND seq = ? AND name = ?
                AND state <> 'completed' AND expires_at > {now}"#,
            ),
            insert_fenced: fill(
                r#"INSERT INTO `{table}_steps` (scope, `key`, seq, name, fingerprint, state,
                    claim_token, updated_at, expires_at)
                SELECT ?, ?, ?, ?, ?, 'started', ?, {now}, {now} + ?
                FROM `{table}` AS r
                WHERE r.scope = ? AND r.`key` = ? AND r.claim_token = ?
                AND r.state = 'in_progress' LOCK IN SHARE MODE"#,
            ),
            complete_fenced: fill(
                r#"UPDATE `{table}_steps`
                SET state = 'completed', claim_token = ?, output = ?, updated_at = {now},
                expires_at = {now} + ?
                WHERE scope = ? AND `key` = ? AND seq = ? AND name = ? AND state <> 'completed'
                AND EXISTS (SELECT 1 FROM `{table}` AS r
                    WHERE r.scope = ? AND r.`key` = ? AND r.claim_token = ?
                    AND r.state = 'in_progress' LOCK IN SHARE MODE)"#,
            ),
            forget: fill(
                r#"DELETE FROM `{table}_steps`
                WHERE scope = ? AND `key` = ?"#,
            ),
            undo: fill(
                r#"DELETE FROM `{table}_steps`
                WHERE scope = ? AND `key` = ? AND seq = ? AND name = ? AND state = 'started'
                AND claim_token = ?"#,
            ),
            keep: fill(
                r#"UPDATE `{table}_steps`
                SET expires_at = {now} + ?
                WHERE scope = ? AND `key` = ? AND expires_at > {now} AND expires_at < {now} + ?"#,
            ),
            purge: filled(PURGE, table, NOW),
        }
    }
}
