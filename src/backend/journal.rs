//! The step journal on the SQL backends: a table beside the records table
//! (`<records table>_steps`), and the flow every backend shares.
//!
//! Each journal write is one short transaction that first reads the
//! operation's record with a shared lock (PostgreSQL `FOR SHARE`, MySQL
//! `LOCK IN SHARE MODE`, SQLite's write lock on the whole database): the
//! write lands only while the record is in progress under the writer's
//! claim token, and a takeover (which updates the record) waits for it to
//! commit. So once a takeover committed, no write of the claim it replaced
//! can land: the new owner reads the journal as the old one left it.
//! The transactions lock the record before the entries. InnoDB's
//! one-statement completion locks the entry it scans first, so it can
//! deadlock with a forget; InnoDB then rolls one back, and both run again
//! (the forget in its transaction, the completion through the journal's
//! retries).
#![allow(unreachable_pub)] // named by the sealed `Dialect`'s statements, so `pub`; unnameable outside

use super::exec::Value;
use super::records::Columns;
use super::{Backend, SqlStore};
use crate::error::Error;
use crate::journal::{
    decide_step, StepBegin, StepDecision, StepRecord, StepRequest, StepResolution, StepRun,
    StepState,
};
use crate::key::{Key, Scope};
use crate::record::{duration_millis, Claim, Millis};

/// How often a journal transaction runs when the database rolled it back
/// to break a deadlock (MySQL's gap locks, when steps of one operation
/// begin at once).
const DEADLOCK_ATTEMPTS: u32 = 5;

/// A backend's statements on the journal table. Placeholders are bound in
/// the order the flow below gives their values.
#[derive(Debug)]
pub struct StepStatements {
    /// The operation's record, locked against a takeover: scope, key.
    fence: String,
    /// An entry, locked: scope, key, seq.
    select: String,
    /// A new entry, started: scope, key, seq, name, fingerprint, token, ttl.
    insert: String,
    /// An entry replaced by a started one: name, fingerprint, token, ttl,
    /// scope, key, seq.
    start: String,
    /// An entry completed: token, output, ttl, scope, key, seq, name.
    complete: String,
    /// Every entry of an operation: scope, key.
    list: String,
    /// An operator's resolution with an output: output, scope, key, seq,
    /// name.
    resolve_completed: String,
    /// An operator's resolution allowing a rerun: scope, key, seq, name.
    resolve_rerun: String,
    /// A new entry, started, in one statement that checks the fence as the
    /// transaction's first read does: scope, key, seq, name, fingerprint,
    /// token, ttl, then the record's scope, key, token.
    insert_fenced: String,
    /// An entry completed in one statement, under the same check: token,
    /// output, ttl, scope, key, seq, name, then the record's scope, key,
    /// token.
    complete_fenced: String,
    /// Deletes an operation's entries: scope, key.
    pub(crate) forget: String,
    /// Deletes an entry still started under a claim, whose call failed
    /// cleanly: scope, key, seq, name, token.
    undo: String,
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

/// Runs `$op` in a transaction of its own on the store's pool (SQLite:
/// `BEGIN IMMEDIATE`), committed when `$op` succeeds; again when the
/// database rolled it back to break a deadlock.
macro_rules! in_transaction {
    ($store:expr, |$conn:ident| $op:expr) => {{
        let mut attempt = 1;
        loop {
            let mut pooled = $crate::backend::tx::TxConn::acquire(&$store.pool).await?;
            let result = async {
                let mut tx = pooled.begin(Some(DB::BEGIN_WRITE)).await?;
                let $conn: &mut DB::Connection = &mut tx;
                let value = $op.await?;
                tx.commit().await?;
                Ok::<_, Error>(value)
            }
            .await;
            if result.is_ok() {
                pooled.ended();
            }
            match result {
                Err(err) if attempt < DEADLOCK_ATTEMPTS && DB::is_deadlock(&err) => {
                    drop(pooled);
                    tokio::time::sleep(std::time::Duration::from_millis(u64::from(attempt) * 2))
                        .await;
                    attempt += 1;
                }
                result => break result,
            }
        }
    }};
}
pub(crate) use in_transaction;

/// The values of a statement, in order.
type Values<'a> = Vec<Value<'a>>;

impl<DB: Backend> SqlStore<DB> {
    fn step_sql(&self) -> &StepStatements {
        &self.sql.steps
    }

    /// Fails with [`Error::LeaseLost`] unless the operation's record is in
    /// progress under `claim`'s token, and keeps it so (locked) until the
    /// transaction on `conn` ends.
    async fn fence_on(&self, conn: &mut DB::Connection, claim: &Claim) -> Result<(), Error> {
        let values: Values<'_> = vec![
            Value::Text(claim.scope.as_str()),
            Value::Text(claim.key.as_str()),
        ];
        let row = DB::fetch_row(conn, &self.step_sql().fence, values).await?;
        let Some(row) = row else {
            return Err(Error::LeaseLost);
        };
        let columns = Columns::<DB>::new(&row, "idempotency record");
        if columns.token()? == Some(claim.token) && columns.text("state")? == "in_progress" {
            Ok(())
        } else {
            Err(Error::LeaseLost)
        }
    }

    /// The entry at `seq`, and the database's time.
    async fn step_on(
        &self,
        conn: &mut DB::Connection,
        scope: &Scope,
        key: &Key,
        seq: u32,
    ) -> Result<Option<(StepRecord, Millis)>, Error> {
        let values: Values<'_> = vec![
            Value::Text(scope.as_str()),
            Value::Text(key.as_str()),
            Value::Int(i64::from(seq)),
        ];
        let row = DB::fetch_row(conn, &self.step_sql().select, values).await?;
        row.map(|row| decode::<DB>(&row)).transpose()
    }

    /// [`Journal::begin_step`](crate::store::Journal::begin_step) on a connection in
    /// a transaction.
    pub(crate) async fn begin_step_on(
        &self,
        conn: &mut DB::Connection,
        claim: &Claim,
        step: &StepRequest<'_>,
    ) -> Result<StepBegin, Error> {
        self.fence_on(conn, claim).await?;
        let found = self
            .step_on(conn, &claim.scope, &claim.key, step.seq)
            .await?;
        let (entry, now) = match &found {
            Some((entry, now)) => (Some(entry), *now),
            None => (None, 0),
        };
        let run = match decide_step(step, claim.token, entry, now) {
            StepDecision::Answer(answer) => return Ok(answer),
            StepDecision::Start(run) => run,
        };
        let sql = self.step_sql();
        if found.is_some() {
            let values = vec![
                Value::Text(step.name),
                Value::Bytes(&step.fingerprint.as_bytes()[..]),
                Value::Bytes(&claim.token.as_bytes()[..]),
                Value::Int(duration_millis(step.ttl)),
                Value::Text(claim.scope.as_str()),
                Value::Text(claim.key.as_str()),
                Value::Int(i64::from(step.seq)),
            ];
            DB::execute(conn, &sql.start, values).await?;
        } else {
            DB::execute(conn, &sql.insert, inserted(claim, step)).await?;
        }
        Ok(StepBegin::Run(run))
    }

    /// [`Journal::complete_step`](crate::store::Journal::complete_step) on a
    /// connection in a transaction: the caller's, for a step whose rows
    /// commit with its entry.
    pub async fn complete_step_on(
        &self,
        conn: &mut DB::Connection,
        claim: &Claim,
        step: &StepRequest<'_>,
        output: &[u8],
    ) -> Result<(), Error> {
        self.fence_on(conn, claim).await?;
        let sql = self.step_sql();
        let done = DB::execute(conn, &sql.complete, completed(claim, step, output)).await?;
        if DB::rows_affected(&done) > 0 {
            return Ok(());
        }
        // Completed already: by this very completion, sent again after its
        // answer was lost (MySQL counts matched rows, so it lands here only
        // when the state did not match)?
        match self
            .step_on(conn, &claim.scope, &claim.key, step.seq)
            .await?
        {
            Some((entry, _))
                if entry.state == StepState::Completed
                    && entry.output.as_deref() == Some(output) =>
            {
                Ok(())
            }
            // Never started (its entry's write failed while the step
            // ran): journaled all the same.
            None => {
                DB::execute(conn, &sql.insert, inserted(claim, step)).await?;
                DB::execute(conn, &sql.complete, completed(claim, step, output)).await?;
                Ok(())
            }
            _ => Err(crate::store::step_not_journaled(step)),
        }
    }

    /// [`Journal::begin_step`](crate::store::Journal::begin_step) on the pool. A
    /// step met for the first time (the common case) is started with one
    /// statement; anything else (an entry there, a fence that does not
    /// hold) is read and decided in a transaction.
    pub(crate) async fn begin_step_in_transaction(
        &self,
        claim: &Claim,
        step: &StepRequest<'_>,
    ) -> Result<StepBegin, Error> {
        let mut values = inserted(claim, step);
        values.extend(owned(claim));
        let _turn = self.gate.enter().await;
        let (mut conn, kept) = self.warm.lend().await?;
        match DB::execute(&mut conn, &self.step_sql().insert_fenced, values).await {
            Ok(done) if DB::rows_affected(&done) > 0 => {
                self.warm.keep(conn);
                return Ok(StepBegin::Run(StepRun::Fresh));
            }
            Ok(_) => {}
            Err(err) if is_unique_violation(&err) => {}
            // A kept connection the server closed since: the transaction
            // below, on a connection the pool tests, reads and decides
            // whatever the failed statement did.
            Err(_) if kept => {}
            Err(err) => return Err(err.into()),
        }
        drop(conn);
        in_transaction!(self, |conn| self.begin_step_on(conn, claim, step))
    }

    /// [`Journal::complete_step`](crate::store::Journal::complete_step) on the pool:
    /// one statement, or, when it changes nothing (a completion sent
    /// again, a fence that does not hold), a transaction that says why.
    pub(crate) async fn complete_step_in_transaction(
        &self,
        claim: &Claim,
        step: &StepRequest<'_>,
        output: &[u8],
    ) -> Result<(), Error> {
        let mut values = completed(claim, step, output);
        values.extend(owned(claim));
        let _turn = self.gate.enter().await;
        let (mut conn, kept) = self.warm.lend().await?;
        match DB::execute(&mut conn, &self.step_sql().complete_fenced, values).await {
            Ok(done) if DB::rows_affected(&done) > 0 => {
                self.warm.keep(conn);
                return Ok(());
            }
            Ok(_) => {}
            // A kept connection the server closed since: the transaction
            // below says what the failed statement did.
            Err(_) if kept => {}
            Err(err) => return Err(err.into()),
        }
        drop(conn);
        in_transaction!(self, |conn| self
            .complete_step_on(conn, claim, step, output))
    }

    pub(crate) async fn list_steps(
        &self,
        scope: &Scope,
        key: &Key,
    ) -> Result<Vec<StepRecord>, Error> {
        let mut conn = self.pool.acquire().await?;
        let values = vec![Value::Text(scope.as_str()), Value::Text(key.as_str())];
        let rows = DB::fetch_all(&mut conn, &self.step_sql().list, values).await?;
        rows.iter()
            .map(|row| decode::<DB>(row).map(|(entry, _)| entry))
            .collect()
    }

    /// [`Journal::undo_step`](crate::store::Journal::undo_step) on a connection.
    pub(crate) async fn undo_step_on(
        &self,
        conn: &mut DB::Connection,
        claim: &Claim,
        step: &StepRequest<'_>,
    ) -> Result<bool, Error> {
        let values = vec![
            Value::Text(claim.scope.as_str()),
            Value::Text(claim.key.as_str()),
            Value::Int(i64::from(step.seq)),
            Value::Text(step.name),
            Value::Bytes(&claim.token.as_bytes()[..]),
        ];
        let done = DB::execute(conn, &self.step_sql().undo, values).await?;
        Ok(DB::rows_affected(&done) > 0)
    }

    pub(crate) async fn resolve_step_now(
        &self,
        scope: &Scope,
        key: &Key,
        seq: u32,
        name: &str,
        resolution: &StepResolution,
    ) -> Result<bool, Error> {
        let sql = self.step_sql();
        let mut values = Vec::with_capacity(5);
        let statement = match resolution {
            StepResolution::Completed(output) => {
                values.push(Value::Bytes(output));
                &sql.resolve_completed
            }
            StepResolution::Rerun => &sql.resolve_rerun,
        };
        values.extend([
            Value::Text(scope.as_str()),
            Value::Text(key.as_str()),
            Value::Int(i64::from(seq)),
            Value::Text(name),
        ]);
        let _turn = self.gate.enter().await;
        let mut conn = self.pool.acquire().await?;
        let done = DB::execute(&mut conn, statement, values).await?;
        Ok(DB::rows_affected(&done) > 0)
    }
}

/// The database refused an insert for a duplicate key.
fn is_unique_violation(err: &sqlx::Error) -> bool {
    err.as_database_error()
        .is_some_and(|e| e.is_unique_violation())
}

/// The values of `insert`, and the first ones of `insert_fenced`.
fn inserted<'a>(claim: &'a Claim, step: &StepRequest<'a>) -> Values<'a> {
    vec![
        Value::Text(claim.scope.as_str()),
        Value::Text(claim.key.as_str()),
        Value::Int(i64::from(step.seq)),
        Value::Text(step.name),
        Value::Bytes(&step.fingerprint.as_bytes()[..]),
        Value::Bytes(&claim.token.as_bytes()[..]),
        Value::Int(duration_millis(step.ttl)),
    ]
}

/// The values of `complete`, and the first ones of `complete_fenced`.
fn completed<'a>(claim: &'a Claim, step: &StepRequest<'a>, output: &'a [u8]) -> Values<'a> {
    vec![
        Value::Bytes(&claim.token.as_bytes()[..]),
        Value::Bytes(output),
        Value::Int(duration_millis(step.ttl)),
        Value::Text(claim.scope.as_str()),
        Value::Text(claim.key.as_str()),
        Value::Int(i64::from(step.seq)),
        Value::Text(step.name),
    ]
}

/// The fence's values, last in the one-statement writes: the record's
/// scope, key and the claim's token.
fn owned(claim: &Claim) -> [Value<'_>; 3] {
    [
        Value::Text(claim.scope.as_str()),
        Value::Text(claim.key.as_str()),
        Value::Bytes(&claim.token.as_bytes()[..]),
    ]
}

/// An entry's row and the database's time of the read.
pub(crate) fn decode<DB: Backend>(row: &DB::Row) -> Result<(StepRecord, Millis), Error> {
    let columns = Columns::<DB>::new(row, "step journal entry");
    let entry = StepRecord {
        scope: columns.scope()?,
        key: columns.key()?,
        seq: u32::try_from(columns.int("seq")?).map_err(|_| columns.corrupt("seq out of range"))?,
        name: columns.text("name")?,
        fingerprint: columns.fingerprint()?,
        state: StepState::parse(&columns.text("state")?)
            .ok_or_else(|| columns.corrupt("unknown state"))?,
        token: columns
            .token()?
            .ok_or_else(|| columns.corrupt("claim token is NULL"))?,
        output: columns.bytes("output")?,
        updated_at: columns.int("updated_at")?,
        expires_at: columns.int("expires_at")?,
    };
    Ok((entry, columns.int("db_now")?))
}
