//! The step journal's statements on the SQL backends: the table beside
//! the records table (`<records table>_steps`) and what each transition
//! of the journal's flow ([`super::journal`]) sends, written once with
//! each backend's placeholders, quotes and locks.
#![allow(unreachable_pub)] // named by the sealed `Dialect`'s statements, so `pub`; unnameable outside

use super::Backend;

/// A backend's statements on the journal table. Placeholders are bound in
/// the order the flow below gives their values.
#[derive(Debug)]
pub struct StepStatements {
    /// The operation's record, locked against a takeover: scope, key.
    pub(super) fence: String,
    /// An entry, locked: scope, key, seq.
    pub(super) select: String,
    /// A new entry, started: scope, key, seq, name, fingerprint, token, ttl.
    pub(super) insert: String,
    /// An entry replaced by a started one: name, fingerprint, token, ttl,
    /// scope, key, seq.
    pub(super) start: String,
    /// An entry completed: token, output, ttl, scope, key, seq, name.
    pub(super) complete: String,
    /// Every entry of an operation: scope, key.
    pub(super) list: String,
    /// An operator's resolution with an output: output, scope, key, seq,
    /// name.
    pub(super) resolve_completed: String,
    /// An operator's resolution allowing a rerun: scope, key, seq, name.
    pub(super) resolve_rerun: String,
    /// A new entry, started, in one statement that checks the fence as the
    /// transaction's first read does: scope, key, seq, name, fingerprint,
    /// token, ttl, then the record's scope, key, token.
    pub(super) insert_fenced: String,
    /// An entry completed in one statement, under the same check: token,
    /// output, ttl, scope, key, seq, name, then the record's scope, key,
    /// token.
    pub(super) complete_fenced: String,
    /// Deletes an operation's entries: scope, key.
    pub(crate) forget: String,
    /// Deletes an entry still started under a claim, whose call failed
    /// cleanly: scope, key, seq, name, token.
    pub(super) undo: String,
    /// Keeps an operation's live entries until at least a ttl from now:
    /// ttl, scope, key, ttl.
    pub(crate) keep: String,
    /// Deletes at most a batch of expired entries: batch.
    pub(crate) purge: String,
}

/// The columns of an entry, and the database's time.
pub(crate) const COLUMNS: &str =
    "scope, {key}, seq, name, fingerprint, state, claim_token, output, \
                       updated_at, expires_at, {now} AS db_now";

impl StepStatements {
    /// The statements on `<table>_steps` for `DB`, with its clock `now`
    /// and its purge statement (`{steps}` the table, `{now}` the clock,
    /// one placeholder: the batch).
    pub(crate) fn new<DB: Backend>(table: &str, now: &str, purge: &str) -> Self {
        let q = DB::QUOTE;
        let steps = format!("{q}{}{q}", steps_table(table));
        let fill = |sql: &str| {
            let sql = sql
                .replace("{columns}", COLUMNS)
                .replace("{records}", &format!("{q}{table}{q}"))
                .replace("{steps}", &steps)
                .replace("{key}", &format!("{q}key{q}"))
                .replace("{now}", now)
                .replace("{share}", DB::LOCK_SHARE)
                .replace("{update}", DB::LOCK_UPDATE);
            numbered::<DB>(&sql)
        };
        StepStatements {
            fence: fill(
                "SELECT claim_token, state FROM {records} WHERE scope = ? AND {key} = ?{share}",
            ),
            select: fill(
                "SELECT {columns} FROM {steps} WHERE scope = ? AND {key} = ? AND seq = ?{update}",
            ),
            insert: fill(
                "INSERT INTO {steps} (scope, {key}, seq, name, fingerprint, state, claim_token, \
                 updated_at, expires_at) VALUES (?, ?, ?, ?, ?, 'started', ?, {now}, {now} + ?)",
            ),
            start: fill(
                "UPDATE {steps} SET name = ?, fingerprint = ?, state = 'started', \
                 claim_token = ?, output = NULL, updated_at = {now}, expires_at = {now} + ? \
                 WHERE scope = ? AND {key} = ? AND seq = ?",
            ),
            complete: fill(
                "UPDATE {steps} SET state = 'completed', claim_token = ?, output = ?, \
                 updated_at = {now}, expires_at = {now} + ? \
                 WHERE scope = ? AND {key} = ? AND seq = ? AND name = ? AND state <> 'completed'",
            ),
            insert_fenced: fill(&format!(
                "INSERT INTO {{steps}} (scope, {{key}}, seq, name, fingerprint, state, \
                 claim_token, updated_at, expires_at) \
                 SELECT ?, ?, ?, ?, ?, 'started', ?, {{now}}, {{now}} + ? FROM {{records}} AS r \
                 WHERE {OWNED}"
            )),
            complete_fenced: fill(&format!(
                "UPDATE {{steps}} SET state = 'completed', claim_token = ?, output = ?, \
                 updated_at = {{now}}, expires_at = {{now}} + ? \
                 WHERE scope = ? AND {{key}} = ? AND seq = ? AND name = ? \
                 AND state <> 'completed' \
                 AND EXISTS (SELECT 1 FROM {{records}} AS r WHERE {OWNED})"
            )),
            list: fill("SELECT {columns} FROM {steps} WHERE scope = ? AND {key} = ? ORDER BY seq"),
            resolve_completed: fill(&format!(
                "UPDATE {{steps}} SET state = 'completed', output = ?, updated_at = {{now}} \
                 WHERE scope = ? AND {{key}} = ? AND seq = ? AND name = ? \
                 AND state <> 'completed' AND expires_at > {{now}} AND {STARTER_GONE}"
            )),
            resolve_rerun: fill(&format!(
                "UPDATE {{steps}} SET state = 'rerun_allowed', updated_at = {{now}} \
                 WHERE scope = ? AND {{key}} = ? AND seq = ? AND name = ? \
                 AND state <> 'completed' AND expires_at > {{now}} AND {STARTER_GONE}"
            )),
            forget: fill("DELETE FROM {steps} WHERE scope = ? AND {key} = ?"),
            undo: fill(
                "DELETE FROM {steps} WHERE scope = ? AND {key} = ? AND seq = ? AND name = ? \
                 AND state = 'started' AND claim_token = ?",
            ),
            keep: fill(
                "UPDATE {steps} SET expires_at = {now} + ? WHERE scope = ? AND {key} = ? \
                 AND expires_at > {now} AND expires_at < {now} + ?",
            ),
            purge: fill(purge),
        }
    }
}

/// The attempt that started the entry no longer holds the operation: no
/// record is in progress under the entry's claim with a live lease. Only
/// then is a step in doubt, for an operator to settle: a resolution sent
/// again, or a second operator's, must not land on a step that a later
/// attempt, let run by the first resolution, is running now.
const STARTER_GONE: &str = "NOT EXISTS (SELECT 1 FROM {records} AS r \
     WHERE r.scope = {steps}.scope AND r.{key} = {steps}.{key} \
     AND r.claim_token = {steps}.claim_token AND r.state = 'in_progress' \
     AND r.lease_until > {now})";

/// The record `r` is in progress under the claim, and locked against a
/// takeover until the statement's transaction ends.
const OWNED: &str =
    "r.scope = ? AND r.{key} = ? AND r.claim_token = ? AND r.state = 'in_progress'{share}";

/// `sql` with its `?`s written as `DB` writes placeholders, numbered in
/// order.
pub(crate) fn numbered<DB: Backend>(sql: &str) -> String {
    let mut out = String::with_capacity(sql.len() + 16);
    let mut n = 0;
    for c in sql.chars() {
        if c == '?' {
            n += 1;
            out.push_str(&DB::param(n));
        } else {
            out.push(c);
        }
    }
    out
}

/// The journal table of the records table `table`.
pub(crate) fn steps_table(table: &str) -> String {
    format!("{table}_steps")
}
