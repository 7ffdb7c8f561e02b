//! The records flow every SQL backend shares: the claim → read → decide
//! loop, the fenced renewal, completion and release, reads, purges, and
//! the [`Store`] and [`TransactionalStore`] implementations. A backend
//! brings its statements and its true differences through
//! [`Dialect`](super::Dialect).

use std::fmt;
use std::sync::atomic::Ordering;
use std::sync::Arc;
use std::time::Duration;

use async_trait::async_trait;

use super::exec::Value;
use super::gate::Gate;
use super::read_first::Duplicates;
use super::statements::steps_table;
use super::statements::{ClaimReturns, Param, Statement, Statements};
use super::tx::in_transaction;
use super::warm::Warm;
use super::{Backend, DEFAULT_MIGRATIONS_TABLE, DEFAULT_TABLE};
use crate::store::{Capabilities, Detach, Journal, Look, Store, Waiters, Wake};
use idem_core::error::Error;
use idem_core::fingerprint::Fingerprint;
use idem_core::journal::{StepBegin, StepRecord, StepRequest, StepResolution};
use idem_core::key::{Key, Scope};
use idem_core::record::{
    decide, duration_millis, Begin, BeginRequest, Claim, ClaimToken, Millis, Outcome, OutcomeKind,
    Record, State,
};

/// How many times a claim is tried against records that change under it
/// (released, lapsed, purged between two statements) before giving up:
/// far more than any real interleaving needs, few enough to never spin.
const CLAIM_ROUNDS: usize = 64;

/// How often a statement on the store's pool runs when the database
/// rolled it back to break a deadlock (only MySQL says so).
const DEADLOCK_ATTEMPTS: u32 = 5;

/// Idempotency records in a SQL database through a sqlx pool: the type
/// behind [`SqliteStore`](crate::SqliteStore),
/// [`PostgresStore`](crate::PostgresStore) and
/// [`MySqlStore`](crate::MySqlStore), as sqlx's `Pool<DB>` is behind
/// `SqlitePool` and `PgPool`.
///
/// The `*_on` methods run the store's statements on a connection you hold,
/// such as an open transaction: transactional mode writes the claim and
/// the completion there, so that they commit or roll back with your rows.
pub struct SqlStore<DB: Backend> {
    pub(crate) pool: sqlx::Pool<DB>,
    pub(crate) sql: Arc<Statements>,
    pub(crate) waiters: Arc<Waiters>,
    /// What the backend keeps to wake waiters in other processes
    /// (PostgreSQL's listener).
    pub(crate) wake: Arc<DB::Wake>,
    /// The table recording applied migrations.
    pub(crate) migrations: Arc<str>,
    /// Connections kept between the store's own statements.
    pub(crate) warm: Arc<Warm<DB>>,
    /// Where the database takes one write at a time: the queue of this
    /// process's writes to it.
    pub(crate) gate: Gate,
    /// How often the claims on the pool found their key taken lately,
    /// for a backend that reads first only while that is common.
    pub(crate) duplicates: Arc<Duplicates>,
}

impl<DB: Backend> Clone for SqlStore<DB> {
    fn clone(&self) -> Self {
        SqlStore {
            pool: self.pool.clone(),
            sql: self.sql.clone(),
            waiters: self.waiters.clone(),
            wake: self.wake.clone(),
            migrations: self.migrations.clone(),
            warm: self.warm.clone(),
            gate: self.gate.clone(),
            duplicates: self.duplicates.clone(),
        }
    }
}

impl<DB: Backend> fmt::Debug for SqlStore<DB> {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("SqlStore")
            .field("backend", &<DB as sqlx::Database>::NAME)
            .field("table", &self.sql.table)
            .finish_non_exhaustive()
    }
}

/// Runs `$op` on a connection of the store's pool (a kept one where there
/// is one, see [`Warm`]), again when it lost a deadlock or failed on a kept
/// connection the server closed since: on the pool every statement is a
/// transaction of its own, so nothing of the failed attempt remains, and
/// each of the store's statements may run twice.
macro_rules! on_pool {
    ($store:expr, |$conn:ident| $op:expr) => {{
        let mut attempt = 1;
        loop {
            let (mut $conn, kept) = $store.warm.lend().await?;
            match $op.await {
                // A kept connection the server closed since: the next one
                // (kept, or tested by the pool) runs the statement again.
                Err(Error::Store(err)) if kept => {
                    tracing::debug!(error = %err, "a kept connection failed; running again");
                    drop($conn);
                }
                Err(err) if attempt < DEADLOCK_ATTEMPTS && DB::is_deadlock(&err) => {
                    tracing::debug!(attempt, "deadlock on the idempotency table; running again");
                    drop($conn);
                    tokio::time::sleep(Duration::from_millis(u64::from(attempt) * 2)).await;
                    attempt += 1;
                }
                // Kept for the next statement only when this one ran to
                // its end: a failed one goes back to sqlx, which tests it.
                Ok(done) => {
                    $store.warm.keep($conn);
                    break Ok(done);
                }
                result => break result,
            }
        }
    }};
}

impl<DB: Backend> SqlStore<DB> {
    /// A store on an existing pool, using the table `idem_records`. Call
    /// [`migrate`](Self::migrate) once before use.
    pub fn new(pool: sqlx::Pool<DB>) -> Self {
        SqlStore {
            warm: Arc::new(Warm::new(pool.clone())),
            gate: Gate::of(DB::write_gate(&pool)),
            pool,
            sql: Arc::new(DB::statements(DEFAULT_TABLE.to_owned())),
            waiters: Arc::default(),
            wake: Arc::default(),
            migrations: Arc::from(DEFAULT_MIGRATIONS_TABLE),
            duplicates: Arc::new(Duplicates::new(DB::READ_FIRST)),
        }
    }

    /// Uses another table (in the connection's schema or `search_path`).
    /// The name must be 1 to 57 ASCII letters, digits and underscores, not
    /// starting with a digit: the step journal beside it is
    /// `<name>_steps`, within the databases' limit of 63.
    pub fn with_table_name(mut self, table: &str) -> Result<Self, Error> {
        let table = validate_table_name(table)?;
        // The step journal is `<table>_steps`, within the same limit.
        validate_table_name(&steps_table(&table))?;
        self.sql = Arc::new(DB::statements(table));
        // Another table is another notification channel.
        self.waiters = Arc::default();
        self.wake = Arc::default();
        Ok(self)
    }

    /// Records applied migrations in another table than `idem_migrations`
    /// (for example where that name is taken, or each service keeps its own
    /// bookkeeping). The table holds one row per records table and version,
    /// so records tables may share one; a records table must always be
    /// migrated with the same bookkeeping table. The name follows the rule
    /// of [`with_table_name`](Self::with_table_name).
    pub fn with_migrations_table(mut self, table: &str) -> Result<Self, Error> {
        self.migrations = Arc::from(validate_table_name(table)?);
        Ok(self)
    }

    /// The table recording applied migrations.
    pub fn migrations_table(&self) -> &str {
        &self.migrations
    }

    /// The pool.
    pub fn pool(&self) -> &sqlx::Pool<DB> {
        &self.pool
    }

    /// The records table.
    pub fn table_name(&self) -> &str {
        &self.sql.table
    }

    /// Creates or upgrades the records table. Safe to call at every start,
    /// from several processes at once: migrators are serialized (SQLite's
    /// write lock, a PostgreSQL advisory lock, a MySQL named lock), and
    /// applied versions are recorded in the bookkeeping table
    /// (`idem_migrations`, or [`with_migrations_table`](Self::with_migrations_table))
    /// and skipped.
    pub async fn migrate(&self) -> Result<(), Error> {
        DB::migrate(self).await
    }

    /// [`Store::begin`] on a given connection (the pool's, or the caller's
    /// open transaction). Inside a transaction, a claim by another open
    /// transaction makes the claim wait for it to end.
    pub async fn begin_on(
        &self,
        conn: &mut DB::Connection,
        req: &BeginRequest<'_>,
    ) -> Result<Begin, Error> {
        self.claim_on(conn, req, false).await
    }

    /// [`begin_on`](Self::begin_on); `keep_journal`: a granted claim keeps
    /// the operation's journal ([`joined`](Self::joined)). Not in a
    /// caller's transaction (transactional mode): its record commits
    /// completed or not at all, so no later claim takes it over while in
    /// progress, and on MariaDB the keep's empty `UPDATE` would hold a gap
    /// lock on the journal's index, holding up other keys' steps, until
    /// the caller commits.
    async fn claim_on(
        &self,
        conn: &mut DB::Connection,
        req: &BeginRequest<'_>,
        keep_journal: bool,
    ) -> Result<Begin, Error> {
        DB::check_request(req)?;
        let bound = Bound::request(req);
        for _ in 0..CLAIM_ROUNDS {
            let found = match self.claim(conn, &bound).await {
                Ok(Claimed::Fence(fence)) => {
                    return self.joined(conn, req, fence, keep_journal).await
                }
                Ok(Claimed::Found(record, now)) => Some((record, now)),
                // The key is taken (or, where the claim answers nothing,
                // maybe ours): read the record to say why.
                Ok(Claimed::Unknown) => self.read_on(conn, &self.sql.claimed, &bound).await?,
                Err(err) => return self.answer_refused_claim(err, req, keep_journal).await,
            };
            // Gone meanwhile: claim again.
            let Some((record, now)) = found else {
                continue;
            };
            match decide(req, &record, now).answer()? {
                // Ours: claimed by this very request (a claim statement
                // that answers nothing, or one sent again).
                Some(Begin::Claimed(claim)) => {
                    return self.joined(conn, req, claim.fence, keep_journal).await
                }
                Some(answer) => return Ok(answer),
                None => {}
            }
            // Free (expired, lapsed): take it over while it still is.
            if let Some(take_over) = &self.sql.take_over {
                let values = bound.values(take_over)?;
                if let Some(fence) = DB::fetch_int(conn, &take_over.sql, values).await? {
                    return self.joined(conn, req, fence, keep_journal).await;
                }
            }
        }
        Err(Error::store(format!(
            "the claim did not settle after {CLAIM_ROUNDS} rounds: the record kept changing"
        )))
    }

    /// A granted claim joins the operation's journal, if it has one: its
    /// live entries are kept until at least the record expires, so that the
    /// record never outlives the steps a later attempt would otherwise run
    /// again (an attempt that takes over, or claims while the journal is
    /// live, belongs to that operation). PostgreSQL's claim statements do
    /// it themselves; elsewhere, where the claim is an autocommit statement,
    /// a crash between the two statements leaves the journal to its own
    /// expiry, a ttl from its last write.
    async fn joined(
        &self,
        conn: &mut DB::Connection,
        req: &BeginRequest<'_>,
        fence: i64,
        keep_journal: bool,
    ) -> Result<Begin, Error> {
        if keep_journal && !DB::CLAIM_KEEPS_JOURNAL {
            self.keep_steps_on(conn, req.scope, req.key, req.ttl.max(req.lease))
                .await?;
        }
        Ok(Begin::Claimed(Claim::granted(req, fence)))
    }

    /// [`Journal::keep_steps`](crate::store::Journal::keep_steps) on a given connection.
    async fn keep_steps_on(
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

    /// Runs the claim statement, and says what it answered.
    async fn claim(&self, conn: &mut DB::Connection, bound: &Bound<'_>) -> Result<Claimed, Error> {
        let sql = &self.sql;
        let plain = sql
            .claim_without_returning
            .as_ref()
            .filter(|_| sql.returning_refused.load(Ordering::Relaxed));
        if let Some(plain) = plain {
            return self.claim_without_returning(conn, plain, bound).await;
        }
        let claim = &sql.claim;
        let values = bound.values(claim)?;
        match sql.claim_returns {
            ClaimReturns::Fence => Ok(DB::fetch_int(conn, &claim.sql, values)
                .await?
                .map_or(Claimed::Unknown, Claimed::Fence)),
            ClaimReturns::Record => match DB::fetch_row(conn, &claim.sql, values)
                .await
                .map_err(Error::from)
            {
                Ok(Some(row)) => {
                    let (record, now) = decode_read::<DB>(&row)?;
                    Ok(Claimed::Found(record, now))
                }
                Ok(None) => Ok(Claimed::Unknown),
                Err(err) if DB::refuses_returning(&err) => {
                    let Some(plain) = &sql.claim_without_returning else {
                        return Err(err);
                    };
                    tracing::info!(
                        "the database has no INSERT ... RETURNING: claiming in two statements"
                    );
                    sql.returning_refused.store(true, Ordering::Relaxed);
                    self.claim_without_returning(conn, plain, bound).await
                }
                Err(err) => Err(err),
            },
        }
    }

    async fn claim_without_returning(
        &self,
        conn: &mut DB::Connection,
        plain: &Statement,
        bound: &Bound<'_>,
    ) -> Result<Claimed, Error> {
        DB::execute(conn, &plain.sql, bound.values(plain)?).await?;
        Ok(Claimed::Unknown)
    }

    /// A claim the database refused: when it refused because the caller's
    /// snapshot is older than the record (MariaDB's snapshot isolation),
    /// the record is read beside the caller's transaction and a duplicate
    /// is answered from it.
    ///
    /// In a caller's transaction (`on_pool` false), a claim the database
    /// chose as a deadlock's victim is answered [`Error::InProgress`]: two
    /// duplicates blocked on the same owner's claim, which rolled back,
    /// deadlock on MariaDB's index locks, and InnoDB rolls one of their
    /// transactions back. Nothing can run on it any more (MySQL goes on in
    /// autocommit after such a rollback), so the caller retries the whole
    /// transaction, as after any conflict.
    async fn answer_refused_claim(
        &self,
        err: Error,
        req: &BeginRequest<'_>,
        on_pool: bool,
    ) -> Result<Begin, Error> {
        if !on_pool && DB::is_deadlock(&err) {
            tracing::info!(
                error = %err,
                "the claim in the caller's transaction was a deadlock's victim; retry the transaction"
            );
            return Err(Error::InProgress {
                retry_after: Duration::from_secs(1),
            });
        }
        if DB::changed_since_read(&err) {
            if let Some(answer) = self.peek_beside(req).await? {
                return Ok(answer);
            }
        }
        Err(err)
    }

    /// [`Store::peek`] on a given connection.
    pub async fn peek_on(
        &self,
        conn: &mut DB::Connection,
        req: &BeginRequest<'_>,
    ) -> Result<Option<Begin>, Error> {
        match self
            .read_on(conn, &self.sql.select, &Bound::request(req))
            .await?
        {
            None => Ok(None),
            Some((record, now)) => decide(req, &record, now).answer(),
        }
    }

    /// [`TransactionalStore::peek_in`](crate::store::TransactionalStore::peek_in):
    /// a plain read that sees the latest committed record. On PostgreSQL
    /// that is a read on the caller's connection (`READ COMMITTED`, and a
    /// plain read locks nothing); elsewhere the caller's transaction would
    /// see its snapshot (or, on SQLite, could not start reading beside a
    /// writer), so the read runs on another of the pool's connections, or
    /// not at all (`None`: go on to the claim, which reads the latest row)
    /// when none comes soon.
    pub async fn peek_in(
        &self,
        conn: &mut DB::Connection,
        req: &BeginRequest<'_>,
    ) -> Result<Option<Begin>, Error> {
        if DB::PEEK_IN_CALLER {
            return self.peek_on(conn, req).await;
        }
        self.peek_beside(req).await
    }

    /// A plain read on another of the pool's connections than the
    /// caller's, or `None` when none comes soon.
    async fn peek_beside(&self, req: &BeginRequest<'_>) -> Result<Option<Begin>, Error> {
        // A kept connection the server closed since fails the read: the
        // next one (kept, or tested by the pool) reads again.
        while let Some((mut own, kept)) = self.beside().await {
            match self.peek_on(&mut own, req).await {
                Ok(answer) => {
                    self.warm.keep(own);
                    return Ok(answer);
                }
                Err(Error::Store(_)) if kept => {}
                Err(err) => return Err(err),
            }
        }
        Ok(None)
    }

    /// [`Store::renew`] on a given connection.
    pub async fn renew_on(&self, conn: &mut DB::Connection, claim: &Claim) -> Result<(), Error> {
        self.fenced(conn, &self.sql.renew, &Bound::claim(claim, None))
            .await
    }

    /// [`Store::complete`] on a given connection. Waiters in other
    /// processes are told when the connection's transaction commits.
    pub async fn complete_on(
        &self,
        conn: &mut DB::Connection,
        claim: &Claim,
        outcome: &Outcome,
    ) -> Result<(), Error> {
        DB::check_outcome(conn, &self.sql.complete, outcome).await?;
        self.fenced(
            conn,
            &self.sql.complete,
            &Bound::claim(claim, Some(outcome)),
        )
        .await
    }

    /// [`Store::release`] on a given connection. Waiters in other processes
    /// are told when the connection's transaction commits.
    pub async fn release_on(&self, conn: &mut DB::Connection, claim: &Claim) -> Result<(), Error> {
        self.fenced(conn, &self.sql.release, &Bound::claim(claim, None))
            .await
    }

    /// A write that names the claim's token: [`Error::LeaseLost`] when it
    /// matched no row (the claim is not the record's any more).
    async fn fenced(
        &self,
        conn: &mut DB::Connection,
        statement: &Statement,
        bound: &Bound<'_>,
    ) -> Result<(), Error> {
        let done = DB::execute(conn, &statement.sql, bound.values(statement)?).await?;
        // MySQL counts a matched row even when nothing changed (sqlx asks
        // for found rows), so a completion sent again still counts.
        if DB::rows_affected(&done) == 0 {
            return Err(Error::LeaseLost);
        }
        Ok(())
    }

    /// [`Store::get`] on a given connection.
    pub async fn get_on(
        &self,
        conn: &mut DB::Connection,
        scope: &Scope,
        key: &Key,
    ) -> Result<Option<Record>, Error> {
        let bound = Bound::key(scope, key);
        Ok(self
            .read_on(conn, &self.sql.select, &bound)
            .await?
            .map(|(record, _)| record))
    }

    /// [`Store::purge_expired`], telling `progress` how many records and
    /// journal entries each batch deleted.
    pub(crate) async fn purge_reporting(
        &self,
        batch: usize,
        progress: &(dyn Fn(u64) + Send + Sync),
    ) -> Result<u64, Error> {
        let batch = i64::try_from(batch.max(1)).unwrap_or(i64::MAX);
        let records = Bound::batch(batch).values(&self.sql.purge)?;
        let steps = vec![Value::Int(batch)];
        let mut total = 0;
        for (sql, values) in [
            (&self.sql.purge.sql, records),
            (&self.sql.steps.purge, steps),
        ] {
            loop {
                let _turn = self.gate.enter().await;
                let done = on_pool!(self, |conn| async {
                    Ok::<_, Error>(DB::execute(&mut conn, sql, values.clone()).await?)
                })?;
                let deleted = DB::rows_affected(&done);
                progress(deleted);
                total += deleted;
                if deleted < batch as u64 {
                    break;
                }
            }
        }
        Ok(total)
    }

    /// The record and the database's time of the read.
    async fn read_on(
        &self,
        conn: &mut DB::Connection,
        statement: &Statement,
        bound: &Bound<'_>,
    ) -> Result<Option<(Record, Millis)>, Error> {
        let row = DB::fetch_row(conn, &statement.sql, bound.values(statement)?).await?;
        row.map(|row| decode_read::<DB>(&row)).transpose()
    }

    /// A connection of the store's own pool for a plain read beside a
    /// caller's transaction, or `None` when none comes soon (the pool is
    /// exhausted, or holds a single connection the caller has).
    /// With it, whether it is a kept one ([`Warm::lend`]).
    async fn beside(&self) -> Option<(sqlx::pool::PoolConnection<DB>, bool)> {
        const SOON: Duration = Duration::from_millis(100);
        if self.pool.options().get_max_connections() <= 1 {
            return None;
        }
        tokio::time::timeout(SOON, self.warm.lend())
            .await
            .ok()?
            .ok()
    }

    /// Waits on `(scope, key)` as [`Waiters::wait`] does, listening to
    /// other processes where the backend can.
    async fn wait_on(
        &self,
        scope: &Scope,
        key: &Key,
        fingerprint: Option<&Fingerprint>,
        timeout: Duration,
    ) -> Result<Option<Outcome>, Error> {
        DB::listen(self);
        self.waiters
            .wait(scope, key, timeout, || self.look(scope, key, fingerprint))
            .await
    }

    /// Whether the record of `(scope, key)` is held by a live claim of the
    /// payload of `fingerprint` (of any payload: `None`) now, and by which.
    async fn look(
        &self,
        scope: &Scope,
        key: &Key,
        fingerprint: Option<&Fingerprint>,
    ) -> Result<Look, Error> {
        // Held here: its completion or release wakes this waiter itself
        // (with the outcome), and a failed one wakes it to read.
        if let Some((token, holder)) = self.waiters.held_here(scope, key) {
            return Ok(Look::held(Some(token), &holder, fingerprint));
        }
        let bound = Bound::key(scope, key);
        let read = on_pool!(self, |conn| self.read_on(&mut conn, &self.sql.look, &bound))?;
        Ok(match read {
            Some((record, now)) => Look::at(Some(&record), now, fingerprint),
            None => Look::Free,
        })
    }
}

#[async_trait]
impl<DB: Backend> Store for SqlStore<DB> {
    async fn begin(&self, req: &BeginRequest<'_>) -> Result<Begin, Error> {
        // A plain read first where it is cheaper than a claim attempt that
        // finds the key taken: a replay is then one read. The claim stays
        // the one write that hands the key out. Where writes queue at the
        // gate (SQLite), the read runs on its own, and the claim waits its
        // turn holding no connection.
        let gated = self.gate.is_on();
        let read_first = self.duplicates.read_first();
        let _turn = if gated {
            if read_first {
                if let Some(answer) = on_pool!(self, |conn| self.peek_on(&mut conn, req))? {
                    self.duplicates.note(true);
                    return Ok(answer);
                }
            }
            self.gate.enter().await
        } else {
            None
        };
        on_pool!(self, |conn| async {
            if read_first && !gated {
                if let Some(answer) = self.peek_on(&mut conn, req).await? {
                    self.duplicates.note(true);
                    return Ok(answer);
                }
            }
            let answer = self.claim_on(&mut conn, req, true).await?;
            self.duplicates.note(!matches!(answer, Begin::Claimed(_)));
            // Committed: the duplicates of this process may wait for it
            // without reading the record.
            if let Begin::Claimed(claim) = &answer {
                self.waiters.hold(claim, req.fingerprint);
            }
            Ok::<_, Error>(answer)
        })
    }

    async fn peek(&self, req: &BeginRequest<'_>) -> Result<Option<Begin>, Error> {
        on_pool!(self, |conn| self.peek_on(&mut conn, req))
    }

    async fn renew(&self, claim: &Claim) -> Result<(), Error> {
        let _turn = self.gate.enter().await;
        match on_pool!(self, |conn| self.renew_on(&mut conn, claim)) {
            Ok(()) => {
                self.waiters.renewed(claim);
                Ok(())
            }
            Err(err) => {
                self.waiters.unhold(claim);
                Err(err)
            }
        }
    }

    async fn complete(&self, claim: &Claim, outcome: &Outcome) -> Result<(), Error> {
        let complete = async {
            let _turn = self.gate.enter().await;
            on_pool!(self, |conn| self.complete_on(&mut conn, claim, outcome))
        };
        self.waiters.complete(claim, outcome, complete).await
    }

    async fn release(&self, claim: &Claim) -> Result<(), Error> {
        self.waiters.unhold(claim);
        let turn = self.gate.enter().await;
        let released = on_pool!(self, |conn| self.release_on(&mut conn, claim));
        drop(turn);
        // Also when the answer says the claim was not there: a release
        // whose answer was lost, sent again, finds its own delete done.
        self.waiters.wake(&claim.scope, &claim.key);
        released
    }

    async fn get(&self, scope: &Scope, key: &Key) -> Result<Option<Record>, Error> {
        let mut conn = self.pool.acquire().await?;
        self.get_on(&mut conn, scope, key).await
    }

    async fn forget(&self, scope: &Scope, key: &Key) -> Result<bool, Error> {
        let bound = Bound::key(scope, key);
        let forget = &self.sql.forget;
        let turn = self.gate.enter().await;
        // The record first, then its journal, in one transaction: a
        // journal write of the record's owner holds the record until it
        // commits, so none lands after the journal is deleted.
        let done = in_transaction!(self, |conn| async {
            let done = DB::execute(conn, &forget.sql, bound.values(forget)?).await?;
            let steps = vec![Value::Text(scope.as_str()), Value::Text(key.as_str())];
            DB::execute(conn, &self.sql.steps.forget, steps).await?;
            Ok::<_, Error>(done)
        })?;
        drop(turn);
        self.waiters.wake(scope, key);
        Ok(DB::rows_affected(&done) > 0)
    }

    async fn purge_expired(&self, batch: usize) -> Result<u64, Error> {
        self.purge_reporting(batch, &|_| {}).await
    }

    fn journal(&self) -> Option<&dyn Journal> {
        Some(self)
    }

    fn capabilities(&self) -> Capabilities<'_> {
        Capabilities::default().with_wake(self).with_detach(self)
    }
}

#[async_trait]
impl<DB: Backend> Journal for SqlStore<DB> {
    async fn keep_steps(&self, scope: &Scope, key: &Key, ttl: Duration) -> Result<(), Error> {
        let _turn = self.gate.enter().await;
        on_pool!(self, |conn| self.keep_steps_on(&mut conn, scope, key, ttl))
    }

    async fn begin_step(&self, claim: &Claim, step: &StepRequest<'_>) -> Result<StepBegin, Error> {
        self.begin_step_in_transaction(claim, step).await
    }

    async fn complete_step(
        &self,
        claim: &Claim,
        step: &StepRequest<'_>,
        output: &[u8],
    ) -> Result<(), Error> {
        self.complete_step_in_transaction(claim, step, output).await
    }

    async fn undo_step(&self, claim: &Claim, step: &StepRequest<'_>) -> Result<bool, Error> {
        let _turn = self.gate.enter().await;
        on_pool!(self, |conn| self.undo_step_on(&mut conn, claim, step))
    }

    async fn steps(&self, scope: &Scope, key: &Key) -> Result<Vec<StepRecord>, Error> {
        self.list_steps(scope, key).await
    }

    async fn resolve_step(
        &self,
        scope: &Scope,
        key: &Key,
        seq: u32,
        name: &str,
        resolution: &StepResolution,
    ) -> Result<bool, Error> {
        self.resolve_step_now(scope, key, seq, name, resolution)
            .await
    }

    fn writes_beside(&self) -> bool {
        DB::WRITES_IN_PARALLEL
    }
}

#[async_trait]
impl<DB: Backend> Wake for SqlStore<DB> {
    async fn wait_for_change(
        &self,
        scope: &Scope,
        key: &Key,
        timeout: Duration,
    ) -> Result<(), Error> {
        self.wait_on(scope, key, None, timeout).await.map(drop)
    }

    async fn wait_for_outcome(
        &self,
        req: &BeginRequest<'_>,
        timeout: Duration,
    ) -> Result<Option<Begin>, Error> {
        let handed = self
            .wait_on(req.scope, req.key, Some(req.fingerprint), timeout)
            .await?;
        Ok(handed.map(Begin::Replay))
    }

    fn wakes_across_processes(&self) -> bool {
        DB::wakes_across_processes(self)
    }
}

impl<DB: Backend> Detach for SqlStore<DB> {
    fn detach(&self) -> Option<Arc<dyn Store>> {
        Some(Arc::new(self.clone()))
    }
}

/// What a statement's placeholders are bound to, by [`Param`].
#[derive(Default)]
struct Bound<'a> {
    scope: Option<&'a str>,
    key: Option<&'a str>,
    fingerprint: Option<&'a [u8]>,
    token: Option<&'a [u8]>,
    lease: Option<Millis>,
    ttl: Option<Millis>,
    outcome: Option<&'a Outcome>,
    batch: Option<i64>,
}

impl<'a> Bound<'a> {
    fn request(req: &'a BeginRequest<'_>) -> Self {
        Bound {
            scope: Some(req.scope.as_str()),
            key: Some(req.key.as_str()),
            fingerprint: Some(&req.fingerprint.as_bytes()[..]),
            token: Some(&req.token.as_bytes()[..]),
            lease: Some(duration_millis(req.lease)),
            ttl: Some(duration_millis(req.ttl)),
            ..Bound::default()
        }
    }

    fn claim(claim: &'a Claim, outcome: Option<&'a Outcome>) -> Self {
        Bound {
            scope: Some(claim.scope.as_str()),
            key: Some(claim.key.as_str()),
            token: Some(&claim.token.as_bytes()[..]),
            lease: Some(duration_millis(claim.lease)),
            ttl: Some(duration_millis(claim.ttl)),
            outcome,
            ..Bound::default()
        }
    }

    fn key(scope: &'a Scope, key: &'a Key) -> Self {
        Bound {
            scope: Some(scope.as_str()),
            key: Some(key.as_str()),
            ..Bound::default()
        }
    }

    fn batch(batch: i64) -> Self {
        Bound {
            batch: Some(batch),
            ..Bound::default()
        }
    }

    /// The values of `statement`'s placeholders, in order. Every statement
    /// is paired with the flow that binds it, so a missing value is this
    /// crate's bug, reported as such rather than bound as something else.
    fn values(&self, statement: &Statement) -> Result<Vec<Value<'a>>, Error> {
        statement
            .params
            .iter()
            .map(|param| {
                let value = match param {
                    Param::Scope => self.scope.map(Value::Text),
                    Param::Key => self.key.map(Value::Text),
                    Param::Fingerprint => self.fingerprint.map(Value::Bytes),
                    Param::Token => self.token.map(Value::Bytes),
                    Param::Lease => self.lease.map(Value::Int),
                    Param::Ttl => self.ttl.map(Value::Int),
                    Param::OutcomeKind => self.outcome.map(|o| Value::Small(o.kind.code())),
                    Param::Outcome => self.outcome.map(|o| Value::Bytes(&o.body[..])),
                    Param::Batch => self.batch.map(Value::Int),
                };
                value.ok_or_else(|| {
                    Error::Config(format!("no value for the statement's {param:?} parameter"))
                })
            })
            .collect()
    }
}

/// What a claim statement answered.
enum Claimed {
    /// Claimed, with this fence.
    Fence(i64),
    /// The record as the claim left it, and the database's time.
    Found(Record, Millis),
    /// Nothing to go by: read the record.
    Unknown,
}

/// A record's row and the database's time of the read (`db_now`).
fn decode_read<DB: Backend>(row: &DB::Row) -> Result<(Record, Millis), Error> {
    let now =
        DB::int(row, "db_now")?.ok_or_else(|| Error::store("the database's clock read NULL"))?;
    Ok((record_from_row::<DB>(row)?, now))
}

/// The columns of a row this library wrote, read by name; a value it could
/// not have written is a store error naming `what` the row is and what is
/// wrong. Shared by the records and the step journal.
pub(crate) struct Columns<'r, DB: Backend> {
    row: &'r DB::Row,
    what: &'static str,
}

impl<'r, DB: Backend> Columns<'r, DB> {
    pub(crate) fn new(row: &'r DB::Row, what: &'static str) -> Self {
        Columns { row, what }
    }

    pub(crate) fn corrupt(&self, wrong: &str) -> Error {
        Error::store(format!("corrupt {}: {wrong}", self.what))
    }

    /// A text column (read as bytes and checked as UTF-8 where text
    /// columns are binary).
    pub(crate) fn text(&self, column: &str) -> Result<String, Error> {
        if DB::TEXT_AS_BYTES {
            let bytes = DB::bytes(self.row, column)?.unwrap_or_default();
            String::from_utf8(bytes).map_err(|_| self.corrupt(&format!("{column} is not UTF-8")))
        } else {
            Ok(DB::text(self.row, column)?)
        }
    }

    /// An integer column that is never NULL.
    pub(crate) fn int(&self, column: &str) -> Result<i64, Error> {
        DB::int(self.row, column)?.ok_or_else(|| self.corrupt(&format!("{column} is NULL")))
    }

    pub(crate) fn bytes(&self, column: &str) -> Result<Option<Vec<u8>>, Error> {
        Ok(DB::bytes(self.row, column)?)
    }

    pub(crate) fn scope(&self) -> Result<Scope, Error> {
        Ok(Scope::from_stored(&self.text("scope")?))
    }

    pub(crate) fn key(&self) -> Result<Key, Error> {
        Key::new(self.text("key")?).map_err(|_| self.corrupt("invalid key"))
    }

    pub(crate) fn fingerprint(&self) -> Result<Fingerprint, Error> {
        let fingerprint = self.bytes("fingerprint")?.unwrap_or_default();
        <[u8; 32]>::try_from(fingerprint.as_slice())
            .map(Fingerprint::from_digest)
            .map_err(|_| self.corrupt("fingerprint is not 32 bytes"))
    }

    /// The claim token, `None` when NULL.
    pub(crate) fn token(&self) -> Result<Option<ClaimToken>, Error> {
        self.bytes("claim_token")?
            .map(|t| <[u8; 16]>::try_from(t.as_slice()).map(ClaimToken::from_bytes))
            .transpose()
            .map_err(|_| self.corrupt("claim token is not 16 bytes"))
    }
}

/// Decodes a record's row; a row this library could not have written is a
/// store error naming what is wrong.
pub(crate) fn record_from_row<DB: Backend>(row: &DB::Row) -> Result<Record, Error> {
    let columns = Columns::<DB>::new(row, "idempotency record");
    let kind = if DB::SMALL_OUTCOME_KIND {
        DB::small(row, "outcome_kind")?.map(i64::from)
    } else {
        DB::int(row, "outcome_kind")?
    };
    let state =
        State::parse(&columns.text("state")?).ok_or_else(|| columns.corrupt("unknown state"))?;
    let outcome = match (kind, columns.bytes("outcome")?) {
        (Some(kind), Some(body)) => Some(Outcome {
            kind: OutcomeKind::from_code(kind)
                .ok_or_else(|| columns.corrupt("unknown outcome kind"))?,
            body,
        }),
        _ => None,
    };
    Ok(Record {
        scope: columns.scope()?,
        key: columns.key()?,
        fingerprint: columns.fingerprint()?,
        state,
        fence: columns.int("fence")?,
        token: columns.token()?,
        lease_until: DB::int(row, "lease_until")?,
        outcome,
        created_at: columns.int("created_at")?,
        expires_at: columns.int("expires_at")?,
    })
}

/// Checks a table name: 1 to 63 characters of ASCII letters, digits and
/// underscores, not starting with a digit. Names are formatted into SQL
/// (a table name cannot be bound), so nothing else is accepted.
pub(crate) fn validate_table_name(name: &str) -> Result<String, Error> {
    let mut chars = name.chars();
    let valid_start = chars
        .next()
        .is_some_and(|c| c.is_ascii_alphabetic() || c == '_');
    let valid_rest = chars.all(|c| c.is_ascii_alphanumeric() || c == '_');
    if !valid_start || !valid_rest || name.len() > 63 {
        return Err(Error::Config(format!(
            "invalid table name {name:?}: use 1 to 63 ASCII letters, digits and underscores, \
             not starting with a digit"
        )));
    }
    Ok(name.to_owned())
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn table_names() {
        assert!(validate_table_name("idem_records").is_ok());
        assert!(validate_table_name("_t1").is_ok());
        assert!(validate_table_name(&"a".repeat(63)).is_ok());
        for bad in [
            "",
            "1abc",
            "a-b",
            "a b",
            "a;drop",
            "a\"b",
            "é",
            &"a".repeat(64),
        ] {
            assert!(validate_table_name(bad).is_err(), "{bad:?}");
        }
    }
}
