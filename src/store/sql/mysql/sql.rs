//! MySQL and MariaDB's SQL, all of it but the migrations (`mod.rs`): every
//! statement it sends on the records table, the step journal, the outbox,
//! for the inventory and for entity mode, written in its own dialect, as
//! the database receives it but for the table's name (`{table}`) and the
//! clock (`{now}`). What each statement is for, and the order of its
//! values, is said on the types that hold them
//! ([`statements`](crate::store::sql::statements)).

use std::time::Duration;

use sqlx::mysql::{MySql, MySqlConnection, MySqlPool};
use sqlx::FromRow;

use super::NOW;
use crate::store::sql::dialect::{Dialect, Refusal};
use crate::store::sql::entity::{
    arguments, check_conflict, find_on, is_unique_violation, listed, updated_columns, EntityBind,
    EntityDatabase, EntitySql, TokenEntity,
};
use crate::store::sql::statements::{
    filled, filled_on_one_line, outbox_table, ClaimReturns, InventorySql, InventoryStatements,
    JournalSql, OutboxSql, OutboxStatements, Param, RecordsSql, Statement, Statements,
    StepStatements,
};
use crate::store::sql::tx::TxConn;
use idem_core::error::Error;

// ---- The records table ----
// MySQL's and MariaDB's statements on the records table: the claim (one
// upsert, which also takes over a free record), the reads, and the
// fenced writes, for the records flow ([`flow`](crate::store::sql::flow)),
// each with the order of its values: MySQL's `?` are bound in order, so a
// value named twice is bound twice.

/// The claim. MySQL evaluates the assignments of `ON DUPLICATE KEY UPDATE`
/// from left to right, each seeing the values written before it (MariaDB
/// with `SIMULTANEOUS_ASSIGNMENT` evaluates them all on the old row). So
/// the first assignment decides, from the old row, whether the key is
/// `{free}`, and if so stores this attempt's token; every later column then
/// asks `{ours}`: the token is ours (left to right) or the old row was free
/// (all at once). Either way each column sees the same decision.
///
/// The attempt's values are one `VALUES` row, which the update reads back
/// with `VALUES(column)`: its `created_at` is the database's clock at the
/// statement's start (`UTC_TIMESTAMP` is fixed for a statement, so every
/// `{now}` in it is the same instant). Selecting them from a derived table
/// instead makes InnoDB materialize a temporary table for every claim.
const CLAIM: &str = r#"INSERT INTO `{table}`
        (scope, `key`, fingerprint, state, fence, lease_until, claim_token, created_at, expires_at)
    VALUES (?, ?, ?, 'in_progress', 1, {now} + ?, ?, {now}, {now} + GREATEST(?, ?))
    ON DUPLICATE KEY UPDATE
        claim_token  = IF({free}, VALUES(claim_token), `{table}`.claim_token),
        fence        = IF({ours}, `{table}`.fence + 1, `{table}`.fence),
        outcome_kind = IF({ours}, NULL, `{table}`.outcome_kind),
        outcome      = IF({ours}, NULL, `{table}`.outcome),
        fingerprint  = IF({ours}, VALUES(fingerprint), `{table}`.fingerprint),
        state        = IF({ours}, 'in_progress', `{table}`.state),
        lease_until  = IF({ours}, VALUES(lease_until), `{table}`.lease_until),
        created_at   = IF({ours}, VALUES(created_at), `{table}`.created_at),
        expires_at   = IF({ours}, VALUES(expires_at), `{table}`.expires_at)"#;

/// The key may be claimed: expired, or in progress with a lapsed lease and
/// the same payload. `VALUES(created_at)` is the claim's "now".
const FREE: &str = "(`{table}`.expires_at <= VALUES(created_at)
            OR (`{table}`.state = 'in_progress'
                AND `{table}`.lease_until <= VALUES(created_at)
                AND `{table}`.fingerprint = VALUES(fingerprint)))";

/// This attempt holds the key.
const OURS: &str = "(`{table}`.claim_token = VALUES(claim_token) OR {free})";

/// A record's columns and the database's clock.
const COLUMNS: &str = "scope, `key`, fingerprint, state, fence, lease_until, outcome_kind,
        outcome, claim_token, created_at, expires_at, {now} AS db_now";

const SELECT: &str = "SELECT {columns} FROM `{table}` WHERE scope = ? AND `key` = ?";

const RENEW: &str = "UPDATE `{table}`
    SET lease_until = {now} + ?, expires_at = GREATEST(expires_at, {now} + ?)
    WHERE scope = ? AND `key` = ? AND claim_token = ? AND state = 'in_progress'";

/// The outcome is written before `state`: MySQL assigns left to right, and
/// the WHERE has already picked the row.
const COMPLETE: &str = "UPDATE `{table}`
    SET outcome_kind = ?, outcome = ?, lease_until = NULL, expires_at = {now} + ?,
        state = 'completed'
    WHERE scope = ? AND `key` = ? AND claim_token = ?
      AND (state = 'in_progress'
           OR (state = 'completed' AND outcome_kind = ? AND outcome = ?))";

const RELEASE: &str = "DELETE FROM `{table}`
    WHERE scope = ? AND `key` = ? AND claim_token = ? AND state = 'in_progress'";

const FORGET: &str = "DELETE FROM `{table}` WHERE scope = ? AND `key` = ?";

const PURGE: &str = "DELETE FROM `{table}` WHERE expires_at <= {now} ORDER BY expires_at LIMIT ?";

impl RecordsSql for MySql {
    /// The statements on the records table `table`, and the journal's beside
    /// it.
    fn statements(table: String) -> Statements {
        use Param::*;
        let s = |sql: &str, params: &'static [Param]| Statement::new(sql, &table, NOW, params);
        const CLAIM_PARAMS: &[Param] = &[Scope, Key, Fingerprint, Lease, Token, Lease, Ttl];
        let claim = CLAIM.replace("{ours}", OURS).replace("{free}", FREE);
        let select = SELECT.replace("{columns}", COLUMNS);
        Statements {
            // MariaDB (10.5+) answers the row as the claim left it, locked
            // and latest: the caller's claim, or the record holding the
            // key, in one round trip.
            claim: s(&format!("{claim} RETURNING {COLUMNS}"), CLAIM_PARAMS),
            claim_returns: ClaimReturns::Record,
            claim_without_returning: Some(s(&claim, CLAIM_PARAMS)),
            returning_refused: Default::default(),
            // A locking read: it sees the latest committed row even inside
            // a REPEATABLE READ transaction.
            claimed: s(&format!("{select} FOR UPDATE"), &[Scope, Key]),
            take_over: None,
            select: s(&select, &[Scope, Key]),
            look: s(&select, &[Scope, Key]),
            renew: s(RENEW, &[Lease, Lease, Scope, Key, Token]),
            complete: s(
                COMPLETE,
                &[
                    OutcomeKind,
                    Outcome,
                    Ttl,
                    Scope,
                    Key,
                    Token,
                    OutcomeKind,
                    Outcome,
                ],
            ),
            release: s(RELEASE, &[Scope, Key, Token]),
            forget: s(FORGET, &[Scope, Key]),
            purge: s(PURGE, &[Batch]),
            steps: MySql::journal(&table),
            table,
        }
    }
}

// ---- The step journal ----
// MySQL's and MariaDB's statements on the step journal
// (`<records table>_steps`), for the journal's flow
// ([`journal`](crate::store::sql::journal)); what each is for, and the
// order of its values, is said on [`StepStatements`]. The fence is a
// shared lock on the record (`LOCK IN SHARE MODE`), which a takeover's
// update waits for.

/// Deletes at most a batch of expired entries, oldest first.
const STEPS_PURGE: &str =
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
            purge: filled(STEPS_PURGE, table, NOW),
        }
    }
}

// ---- The outbox ----
// MySQL's and MariaDB's statements on the outbox
// (`<records table>_outbox`), for the outbox's flow
// ([`outbox`](crate::store::sql::outbox)); what each is for, and the
// order of its values, is said on [`OutboxStatements`]. A relay's read
// of free rows passes over those another relay is leasing
// (`FOR UPDATE SKIP LOCKED`); a message whose id is there already writes
// nothing (`ON DUPLICATE KEY UPDATE message_id = message_id`, which
// counts as a matched row).

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

// ---- The inventory ----
// MySQL's and MariaDB's statements for an operator's inventory of a
// records table and its journal, for the inventory's flow
// ([`inventory`](crate::store::sql::inventory)); what each is for is
// said on [`InventoryStatements`].

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

// ---- Entity mode ----
// Entity mode and upserts on MySQL and MariaDB: their statements, built
// for each entity from its table and column names (checked before), and
// how they run, since neither an insert nor an upsert answers the row it
// wrote (MySQL has no `RETURNING`): the row is read back. The flow is
// [`crate::entity::run`]'s; claims live in the records table
// [`CLAIMS_TABLE`](crate::entity::CLAIMS_TABLE) of the same database.

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
                return match find_on::<MySql, T>(conn, &token).await? {
                    Some(_) => Ok(None),
                    None => Err(err.into()),
                };
            }
            Err(err) => return Err(err.into()),
        }
        find_on::<MySql, T>(conn, &token)
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
                Err(err)
                    if attempt < UPSERT_ATTEMPTS
                        && MySql::refusal(&err) == Some(Refusal::Deadlock) =>
                {
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
