//! The claim of the SQL stores: the claim statement, then, when it finds
//! the key taken, the record read and decided by [`decide`], a takeover
//! of a record found free, and the answers to a claim the database
//! refused. Also the plain reads (`peek`) on the caller's connection or
//! beside it.

use std::sync::atomic::Ordering;
use std::time::Duration;

use super::bound::Bound;
use super::rows::decode_read;
use super::{Backend, SqlStore};
use crate::store::sql::dialect::Refusal;
use crate::store::sql::statements::{ClaimReturns, Statement};
use idem_core::error::Error;
use idem_core::record::{decide, Begin, BeginRequest, Claim, Millis, Record};

/// How many times a claim is tried against records that change under it
/// (released, lapsed, purged between two statements) before giving up:
/// far more than any real interleaving needs, few enough to never spin.
const CLAIM_ROUNDS: usize = 64;

impl<DB: Backend> SqlStore<DB> {
    /// [`Store::begin`](crate::store::Store::begin) on a given connection
    /// (the pool's, or the caller's open transaction). Inside a
    /// transaction, a claim by another open transaction makes the claim
    /// wait for it to end.
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
    pub(super) async fn claim_on(
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
                Err(err) if DB::refusal(&err) == Some(Refusal::Returning) => {
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
        if !on_pool && DB::refusal(&err) == Some(Refusal::Deadlock) {
            tracing::info!(
                error = %err,
                "the claim in the caller's transaction was a deadlock's victim; retry the transaction"
            );
            return Err(Error::InProgress {
                retry_after: Duration::from_secs(1),
            });
        }
        if DB::refusal(&err) == Some(Refusal::ChangedSinceRead) {
            if let Some(answer) = self.peek_beside(req).await? {
                return Ok(answer);
            }
        }
        Err(err)
    }

    /// [`Store::peek`](crate::store::Store::peek) on a given connection.
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
