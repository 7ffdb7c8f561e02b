//! SQLite's statements on the step journal (`<records table>_steps`), for
//! the journal's flow ([`journal`](crate::store::sql::journal)); what each
//! is for, and the order of its values, is said on [`StepStatements`]. No
//! statement locks a row: the transaction holds the whole database from
//! its first write.

use sqlx::Sqlite;

use super::NOW;
use crate::store::sql::statements::{filled, filled_on_one_line, JournalSql, StepStatements};

/// Deletes at most a batch of expired entries (sent as written, over two
/// lines).
const PURGE: &str = r#"DELETE FROM "{table}_steps" WHERE rowid IN
    (SELECT rowid FROM "{table}_steps" WHERE expires_at <= {now} LIMIT ?1)"#;

/// The attempt that started the entry no longer holds the operation: the
/// condition of both resolutions (see
/// [`StepStatements::resolve_completed`]).
const STARTER_GONE: &str = r#"NOT EXISTS (SELECT 1 FROM "{table}" AS r
    WHERE r.scope = "{table}_steps".scope AND r."key" = "{table}_steps"."key"
    AND r.claim_token = "{table}_steps".claim_token AND r.state = 'in_progress'
    AND r.lease_until > {now})"#;

impl JournalSql for Sqlite {
    /// The journal's statements beside the records table `table`.
    fn journal(table: &str) -> StepStatements {
        let fill = |sql: &str| filled_on_one_line(sql, table, NOW);
        let resolution = |sql: &str| fill(&format!("{sql} AND {STARTER_GONE}"));
        StepStatements {
            fence: fill(
                r#"SELECT claim_token, state
                FROM "{table}"
                WHERE scope = ?1 AND "key" = ?2"#,
            ),
            select: fill(
                r#"SELECT scope, "key", seq, name, fingerprint, state, claim_token, output,
                updated_at, expires_at, {now} AS db_now
                FROM "{table}_steps"
                WHERE scope = ?1 AND "key" = ?2 AND seq = ?3"#,
            ),
            insert: fill(
                r#"INSERT INTO "{table}_steps" (scope, "key", seq, name, fingerprint, state,
                    claim_token, updated_at, expires_at)
                VALUES (?1, ?2, ?3, ?4, ?5, 'started', ?6, {now}, {now} + ?7)"#,
            ),
            start: fill(
                r#"UPDATE "{table}_steps"
                SET name = ?1, fingerprint = ?2, state = 'started', claim_token = ?3,
                output = NULL, updated_at = {now}, expires_at = {now} + ?4
                WHERE scope = ?5 AND "key" = ?6 AND seq = ?7"#,
            ),
            complete: fill(
                r#"UPDATE "{table}_steps"
                SET state = 'completed', claim_token = ?1, output = ?2, updated_at = {now},
                expires_at = {now} + ?3
                WHERE scope = ?4 AND "key" = ?5 AND seq = ?6 AND name = ?7
                AND state <> 'completed'"#,
            ),
            list: fill(
                r#"SELECT scope, "key", seq, name, fingerprint, state, claim_token, output,
                updated_at, expires_at, {now} AS db_now
                FROM "{table}_steps"
                WHERE scope = ?1 AND "key" = ?2
                ORDER BY seq"#,
            ),
            resolve_completed: resolution(
                r#"UPDATE "{table}_steps"
                SET state = 'completed', output = ?1, updated_at = {now}
                WHERE scope = ?2 AND "key" = ?3 AND seq = ?4 AND name = ?5
                AND state <> 'completed' AND expires_at > {now}"#,
            ),
            resolve_rerun: resolution(
                r#"UPDATE "{table}_steps"
                SET state = 'rerun_allowed', updated_at = {now}
                WHERE scope = ?1 AND "key" = ?2 AND seq = ?3 AND name = ?4
                AND state <> 'completed' AND expires_at > {now}"#,
            ),
            insert_fenced: fill(
                r#"INSERT INTO "{table}_steps" (scope, "key", seq, name, fingerprint, state,
                    claim_token, updated_at, expires_at)
                SELECT ?1, ?2, ?3, ?4, ?5, 'started', ?6, {now}, {now} + ?7
                FROM "{table}" AS r
                WHERE r.scope = ?8 AND r."key" = ?9 AND r.claim_token = ?10
                AND r.state = 'in_progress'"#,
            ),
            complete_fenced: fill(
                r#"UPDATE "{table}_steps"
                SET state = 'completed', claim_token = ?1, output = ?2, updated_at = {now},
                expires_at = {now} + ?3
                WHERE scope = ?4 AND "key" = ?5 AND seq = ?6 AND name = ?7
                AND state <> 'completed' AND EXISTS (SELECT 1 FROM "{table}" AS r
                    WHERE r.scope = ?8 AND r."key" = ?9 AND r.claim_token = ?10
                    AND r.state = 'in_progress')"#,
            ),
            forget: fill(
                r#"DELETE FROM "{table}_steps"
                WHERE scope = ?1 AND "key" = ?2"#,
            ),
            undo: fill(
                r#"DELETE FROM "{table}_steps"
                WHERE scope = ?1 AND "key" = ?2 AND seq = ?3 AND name = ?4 AND state = 'started'
                AND claim_token = ?5"#,
            ),
            keep: fill(
                r#"UPDATE "{table}_steps"
                SET expires_at = {now} + ?1
                WHERE scope = ?2 AND "key" = ?3 AND expires_at > {now}
                AND expires_at < {now} + ?4"#,
            ),
            purge: filled(PURGE, table, NOW),
        }
    }
}
