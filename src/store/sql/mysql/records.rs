//! MySQL's and MariaDB's statements on the records table: the claim (one
//! upsert, which also takes over a free record), the reads, and the
//! fenced writes, for the records flow ([`flow`](crate::store::sql::flow)),
//! each with the order of its values: MySQL's `?` are bound in order, so a
//! value named twice is bound twice.

use sqlx::MySql;

use super::NOW;
use crate::store::sql::statements::{
    ClaimReturns, JournalSql, Param, RecordsSql, Statement, Statements,
};

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
