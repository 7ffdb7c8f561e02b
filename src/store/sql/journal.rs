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

use std::time::Duration;

use async_trait::async_trait;

use super::exec::Value;
use super::flow::{on_pool, Columns};
use super::statements::StepStatements;
use super::tx::in_transaction;
use super::{Backend, SqlStore};
use crate::store::Journal;
use idem_core::error::Error;
use idem_core::journal::{
    decide_step, StepAt, StepBegin, StepDecision, StepRecord, StepRequest, StepResolution, StepRun,
    StepState,
};
use idem_core::key::{Key, Scope};
use idem_core::record::{duration_millis, Claim, Millis};

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
        step: &StepRequest<'_>,
    ) -> Result<StepBegin, Error> {
        let claim = step.claim;
        self.fence_on(conn, claim).await?;
        let found = self
            .step_on(conn, &claim.scope, &claim.key, step.seq)
            .await?;
        let (entry, now) = match &found {
            Some((entry, now)) => (Some(entry), *now),
            None => (None, 0),
        };
        let run = match decide_step(step, entry, now) {
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
            DB::execute(conn, &sql.insert, inserted(step)).await?;
        }
        Ok(StepBegin::Run(run))
    }

    /// [`Journal::complete_step`](crate::store::Journal::complete_step) on a
    /// connection in a transaction: the caller's, for a step whose rows
    /// commit with its entry.
    pub async fn complete_step_on(
        &self,
        conn: &mut DB::Connection,
        step: &StepRequest<'_>,
        output: &[u8],
    ) -> Result<(), Error> {
        let claim = step.claim;
        self.fence_on(conn, claim).await?;
        let sql = self.step_sql();
        let done = DB::execute(conn, &sql.complete, completed(step, output)).await?;
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
                DB::execute(conn, &sql.insert, inserted(step)).await?;
                DB::execute(conn, &sql.complete, completed(step, output)).await?;
                Ok(())
            }
            _ => Err(crate::store::step_not_journaled(step)),
        }
    }

    /// Runs the one-statement form of a journal write (`sql`, fenced by
    /// the claim) on a connection of the pool, and answers whether it
    /// wrote its row. Not written (it changed nothing; the entry was there
    /// already, where `found_is_known`; it failed on a kept connection the
    /// server closed since): the caller's transaction, on a connection the
    /// pool tests, reads and decides whatever the statement did.
    async fn written_at_once(
        &self,
        sql: &str,
        values: Values<'_>,
        found_is_known: bool,
    ) -> Result<bool, Error> {
        let (mut conn, kept) = self.warm.lend().await?;
        match DB::execute(&mut conn, sql, values).await {
            Ok(done) if DB::rows_affected(&done) > 0 => {
                self.warm.keep(conn);
                Ok(true)
            }
            Ok(_) => Ok(false),
            Err(err) if found_is_known && is_unique_violation(&err) => Ok(false),
            Err(_) if kept => Ok(false),
            Err(err) => Err(err.into()),
        }
    }

    /// [`Journal::keep_steps`](crate::store::Journal::keep_steps) on a given connection.
    pub(crate) async fn keep_steps_on(
        &self,
        conn: &mut DB::Connection,
        scope: &Scope,
        key: &Key,
        ttl: Duration,
    ) -> Result<(), Error> {
        let ttl = duration_millis(ttl);
        let values = vec![
            Value::Int(ttl),
            Value::Text(scope.as_str()),
            Value::Text(key.as_str()),
            Value::Int(ttl),
        ];
        DB::execute(conn, &self.sql.steps.keep, values).await?;
        Ok(())
    }
}

#[async_trait]
impl<DB: Backend> Journal for SqlStore<DB> {
    async fn keep_steps(&self, scope: &Scope, key: &Key, ttl: Duration) -> Result<(), Error> {
        let _turn = self.gate.enter().await;
        on_pool!(self, |conn| self.keep_steps_on(&mut conn, scope, key, ttl))
    }

    /// A step met for the first time (the common case) is started with
    /// one statement; anything else (an entry there, a fence that does not
    /// hold) is read and decided in a transaction.
    async fn begin_step(&self, step: &StepRequest<'_>) -> Result<StepBegin, Error> {
        let claim = step.claim;
        let mut values = inserted(step);
        values.extend(owned(claim));
        let _turn = self.gate.enter().await;
        let insert = &self.step_sql().insert_fenced;
        // An entry there already is decided in the transaction.
        if self.written_at_once(insert, values, true).await? {
            return Ok(StepBegin::Run(StepRun::Fresh));
        }
        in_transaction!(self, |conn| self.begin_step_on(conn, step))
    }

    /// One statement, or, when it changes nothing (a completion sent
    /// again, a fence that does not hold), a transaction that says why.
    async fn complete_step(&self, step: &StepRequest<'_>, output: &[u8]) -> Result<(), Error> {
        let claim = step.claim;
        let mut values = completed(step, output);
        values.extend(owned(claim));
        let _turn = self.gate.enter().await;
        let complete = &self.step_sql().complete_fenced;
        if self.written_at_once(complete, values, false).await? {
            return Ok(());
        }
        in_transaction!(self, |conn| self.complete_step_on(conn, step, output))
    }

    async fn undo_step(&self, step: &StepRequest<'_>) -> Result<bool, Error> {
        let claim = step.claim;
        let values = vec![
            Value::Text(claim.scope.as_str()),
            Value::Text(claim.key.as_str()),
            Value::Int(i64::from(step.seq)),
            Value::Text(step.name),
            Value::Bytes(&claim.token.as_bytes()[..]),
        ];
        let undo = &self.step_sql().undo;
        let _turn = self.gate.enter().await;
        let done = on_pool!(self, |conn| async {
            Ok::<_, Error>(DB::execute(&mut conn, undo, values.clone()).await?)
        })?;
        Ok(DB::rows_affected(&done) > 0)
    }

    async fn steps(&self, scope: &Scope, key: &Key) -> Result<Vec<StepRecord>, Error> {
        let mut conn = self.pool.acquire().await?;
        let values = vec![Value::Text(scope.as_str()), Value::Text(key.as_str())];
        let rows = DB::fetch_all(&mut conn, &self.step_sql().list, values).await?;
        rows.iter()
            .map(|row| decode::<DB>(row).map(|(entry, _)| entry))
            .collect()
    }

    async fn resolve_step(&self, step: &StepAt<'_>, to: &StepResolution) -> Result<bool, Error> {
        let sql = self.step_sql();
        let mut values = Vec::with_capacity(5);
        let statement = match to {
            StepResolution::Completed(output) => {
                values.push(Value::Bytes(output));
                &sql.resolve_completed
            }
            StepResolution::Rerun => &sql.resolve_rerun,
        };
        values.extend([
            Value::Text(step.scope.as_str()),
            Value::Text(step.key.as_str()),
            Value::Int(i64::from(step.seq)),
            Value::Text(step.name),
        ]);
        let _turn = self.gate.enter().await;
        let mut conn = self.pool.acquire().await?;
        let done = DB::execute(&mut conn, statement, values).await?;
        Ok(DB::rows_affected(&done) > 0)
    }

    fn writes_beside(&self) -> bool {
        DB::WRITES_IN_PARALLEL
    }
}

/// The database refused an insert for a duplicate key.
fn is_unique_violation(err: &sqlx::Error) -> bool {
    err.as_database_error()
        .is_some_and(|e| e.is_unique_violation())
}

/// The values of `insert`, and the first ones of `insert_fenced`.
fn inserted<'a>(step: &StepRequest<'a>) -> Values<'a> {
    let claim = step.claim;
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
fn completed<'a>(step: &StepRequest<'a>, output: &'a [u8]) -> Values<'a> {
    let claim = step.claim;
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
