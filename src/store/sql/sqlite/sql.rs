//! SQLite's SQL, all of it but the migrations (`mod.rs`): every
//! statement it sends on the records table, the step journal, the outbox,
//! for the inventory and for entity mode, written in its own dialect, as
//! the database receives it but for the table's name (`{table}`) and the
//! clock (`{now}`). What each statement is for, and the order of its
//! values, is said on the types that hold them
//! ([`statements`](crate::store::sql::statements)).

use sqlx::Sqlite;

use super::NOW;
use crate::store::sql::entity::{listed, updated_columns, EntityDatabase, EntitySql};
use crate::store::sql::statements::{
    filled, filled_on_one_line, outbox_table, ClaimReturns, InventorySql, InventoryStatements,
    JournalSql, Numbered, OutboxSql, OutboxStatements, RecordsSql, Statements, StepStatements,
};

// ---- The records table ----
// SQLite's statements on the records table: the claim (which also takes
// over a free record), the read, and the fenced writes, for the records
// flow ([`flow`](crate::store::sql::flow)), with the order of their
// values ([`Numbered`]).

/// The claim: one upsert, which also takes over a free record (expired,
/// or in progress with a lapsed lease and the same payload), answering the
/// fence; no separate take-over. `WHERE true` tells SQLite's parser that
/// `ON CONFLICT` belongs to the upsert, not to the SELECT's join.
const CLAIM: &str = r#"INSERT INTO "{table}"
        (scope, key, fingerprint, state, fence, claim_token, lease_until,
         created_at, expires_at)
    SELECT ?1, ?2, ?3, 'in_progress', 1, ?4, c.now + ?5, c.now, c.now + max(?5, ?6)
    FROM (SELECT {now} AS now) AS c WHERE true
    ON CONFLICT (scope, key) DO UPDATE SET
        fingerprint = excluded.fingerprint,
        state = 'in_progress',
        fence = "{table}".fence + 1,
        claim_token = excluded.claim_token,
        lease_until = excluded.lease_until,
        outcome_kind = NULL,
        outcome = NULL,
        created_at = excluded.created_at,
        expires_at = excluded.expires_at
    WHERE "{table}".expires_at <= excluded.created_at
       OR ("{table}".state = 'in_progress'
           AND "{table}".lease_until <= excluded.created_at
           AND "{table}".fingerprint = excluded.fingerprint)
    RETURNING fence"#;

const SELECT: &str = r#"SELECT scope, key, fingerprint, state, fence, claim_token, lease_until,
        outcome_kind, outcome, created_at, expires_at, {now} AS db_now
    FROM "{table}" WHERE scope = ?1 AND key = ?2"#;

const RENEW: &str = r#"UPDATE "{table}"
    SET lease_until = {now} + ?4, expires_at = max(expires_at, {now} + ?4)
    WHERE scope = ?1 AND key = ?2 AND claim_token = ?3 AND state = 'in_progress'"#;

const COMPLETE: &str = r#"UPDATE "{table}"
    SET state = 'completed', outcome_kind = ?1, outcome = ?2,
        lease_until = NULL, expires_at = {now} + ?3
    WHERE scope = ?4 AND key = ?5 AND claim_token = ?6
      AND (state = 'in_progress'
           OR (state = 'completed' AND outcome_kind = ?1 AND outcome = ?2))"#;

const RELEASE: &str = r#"DELETE FROM "{table}"
    WHERE scope = ?1 AND key = ?2 AND claim_token = ?3 AND state = 'in_progress'"#;

const FORGET: &str = r#"DELETE FROM "{table}" WHERE scope = ?1 AND key = ?2"#;

const PURGE: &str = r#"DELETE FROM "{table}" WHERE rowid IN
    (SELECT rowid FROM "{table}" WHERE expires_at <= {now} LIMIT ?1)"#;

impl RecordsSql for Sqlite {
    /// The statements on the records table `table`, and the journal's beside
    /// it.
    fn statements(table: String) -> Statements {
        Numbered {
            claim: CLAIM,
            take_over: None,
            select: SELECT,
            look: None,
            renew: RENEW,
            complete: COMPLETE,
            release: RELEASE,
            forget: FORGET,
            purge: PURGE,
        }
        .on(
            table.clone(),
            NOW,
            ClaimReturns::Fence,
            Sqlite::journal(&table),
        )
    }
}

// ---- The step journal ----
// SQLite's statements on the step journal (`<records table>_steps`), for
// the journal's flow ([`journal`](crate::store::sql::journal)); what each
// is for, and the order of its values, is said on [`StepStatements`]. No
// statement locks a row: the transaction holds the whole database from
// its first write.

/// Deletes at most a batch of expired entries (sent as written, over two
/// lines).
const STEPS_PURGE: &str = r#"DELETE FROM "{table}_steps" WHERE rowid IN
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
            purge: filled(STEPS_PURGE, table, NOW),
        }
    }
}

// ---- The outbox ----
// SQLite's statements on the outbox (`<records table>_outbox`), for the
// outbox's flow ([`outbox`](crate::store::sql::outbox)); what each is
// for, and the order of its values, is said on [`OutboxStatements`]. A
// relay's read of free rows locks nothing: its transaction holds the
// whole database. A message whose id is there already writes nothing
// (`ON CONFLICT (message_id) DO NOTHING`).

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

// ---- The inventory ----
// SQLite's statements for an operator's inventory of a records table
// and its journal, for the inventory's flow
// ([`inventory`](crate::store::sql::inventory)); what each is for is
// said on [`InventoryStatements`].

impl InventorySql for Sqlite {
    /// The inventory's statements on the records table `table`.
    fn inventory(table: &str) -> InventoryStatements {
        let fill = |sql: &str| filled_on_one_line(sql, table, NOW);
        InventoryStatements {
            with_key: fill(
                r#"SELECT scope, "key", fingerprint, state, fence, claim_token, lease_until,
                outcome_kind, outcome, created_at, expires_at
                FROM "{table}"
                WHERE "key" = ?1
                ORDER BY scope"#,
            ),
            by_scope: fill(
                r#"SELECT scope, state, COUNT(*) AS n,
                COUNT(CASE WHEN expires_at <= {now} THEN 1 END) AS expired
                FROM "{table}"
                GROUP BY scope, state
                ORDER BY scope"#,
            ),
            oldest_in_progress: fill(
                r#"SELECT scope, "key", fingerprint, state, fence, claim_token, lease_until,
                outcome_kind, outcome, created_at, expires_at
                FROM "{table}"
                WHERE state = 'in_progress'
                ORDER BY created_at LIMIT 1"#,
            ),
            steps: fill(
                r#"SELECT state, COUNT(*) AS n,
                COUNT(CASE WHEN expires_at <= {now} THEN 1 END) AS expired
                FROM "{table}_steps"
                GROUP BY state"#,
            ),
            steps_with_key: fill(
                r#"SELECT scope, "key", seq, name, fingerprint, state, claim_token, output,
                updated_at, expires_at, {now} AS db_now
                FROM "{table}_steps"
                WHERE "key" = ?1
                ORDER BY scope, seq"#,
            ),
        }
    }
}

// ---- Entity mode ----
// SQLite's statements for entity mode, built for each entity from its
// table and column names (checked before): an insert and an upsert that
// answer the row as stored (`RETURNING *`), in one round trip. The flow
// that runs them is [`EntityDatabase`]'s.

impl EntitySql for Sqlite {
    fn select_where(table: &str, columns: &[&str]) -> String {
        let conditions = listed(columns, " AND ", |n, c| format!(r#""{c}" = ?{n}"#));
        format!(r#"SELECT * FROM "{table}" WHERE {conditions}"#)
    }

    fn insert(table: &str, columns: &[&str], token: &str) -> String {
        let insert = plain_insert(table, columns);
        format!(r#"{insert} ON CONFLICT ("{token}") DO NOTHING RETURNING *"#)
    }

    fn upsert(table: &str, columns: &[&str], conflict: &[&str]) -> String {
        let (insert, keys) = (plain_insert(table, columns), names(conflict));
        let updated = updated_columns(columns, conflict);
        let set = listed(&updated, ", ", |_, c| format!(r#""{c}" = excluded."{c}""#));
        format!("{insert} ON CONFLICT ({keys}) DO UPDATE SET {set} RETURNING *")
    }
}

/// `INSERT INTO <table> (<columns>) VALUES (<a placeholder each>)`.
fn plain_insert(table: &str, columns: &[&str]) -> String {
    let names = names(columns);
    let values = listed(columns, ", ", |n, _| format!("?{n}"));
    format!(r#"INSERT INTO "{table}" ({names}) VALUES ({values})"#)
}

/// `names`, quoted.
fn names(names: &[&str]) -> String {
    listed(names, ", ", |_, name| format!(r#""{name}""#))
}

impl EntityDatabase for Sqlite {}
