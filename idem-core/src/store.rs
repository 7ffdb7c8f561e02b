//! The contract a store implements: [`Store`], the record transitions;
//! [`Journal`], the step transitions; and the optional parts a store may
//! offer through [`Store::capabilities`]: waking ([`Wake`]), answering
//! without waiting ([`Immediate`]) and an owned handle ([`Detach`]).
//!
//! A store of your own implements the eight record transitions, and
//! [`Store::journal`] and [`Detach`] if it keeps durable steps (they are
//! journaled through the owned handle: without one, the engine refuses
//! them rather than run them unjournaled). The rest has defaults that are correct, only slower:
//! duplicates poll for a change, every transition is awaited, and a
//! dropped caller's claim is left to its lease.

use std::sync::Arc;
use std::time::Duration;

use async_trait::async_trait;

use crate::error::Error;
use crate::journal::{StepAt, StepBegin, StepRecord, StepRequest, StepResolution};
use crate::key::{Key, Scope};
use crate::record::{Begin, BeginRequest, Claim, Outcome, Record};

/// A place to keep idempotency records.
///
/// Implementations must make [`begin`](Store::begin) atomic: of any number of
/// concurrent callers with one `(scope, key)`, exactly one is answered
/// [`Begin::Claimed`] while the record is live.
#[async_trait]
pub trait Store: Send + Sync {
    /// Claims the key, or tells why not. One atomic step:
    ///
    /// - no live record (none, or expired): insert `in_progress`, fence 1
    ///   (or the old fence + 1): [`Begin::Claimed`];
    /// - `in_progress` with the same fingerprint and a lapsed lease: take it
    ///   over with fence + 1: [`Begin::Claimed`];
    /// - otherwise the answer of [`record::decide`](crate::record::decide).
    ///
    /// Sending the same request (same token) again after its answer was lost
    /// answers [`Begin::Claimed`] again while the claim stands.
    ///
    /// A store with a step journal keeps the operation's live entries until
    /// at least the new record expires when it grants a claim (as
    /// [`Journal::keep_steps`] would with the record's ttl): an attempt that
    /// takes the key over, or claims it while its journal lives, belongs to
    /// that operation, and if it dies before its first renewal, the record
    /// it leaves must not outlive the steps the next attempt would otherwise
    /// run again.
    async fn begin(&self, request: &BeginRequest<'_>) -> Result<Begin, Error>;

    /// Looks at the record with a plain read, taking no lock: the answer a
    /// duplicate gets without claiming ([`Begin::Replay`],
    /// [`Begin::KeyReused`], [`Begin::InProgress`]), or `None` when the key
    /// may be claimed (no record, an expired one, a lapsed lease). Waiting
    /// duplicates poll with this. The default answers `None` (always try
    /// the claim), which is correct but costs a write per look.
    async fn peek(&self, request: &BeginRequest<'_>) -> Result<Option<Begin>, Error> {
        let _ = request;
        Ok(None)
    }

    /// Extends the claim's lease to the claim's lease duration from now (and
    /// the record's expiry with it), while the operation still runs. Fails
    /// with [`Error::LeaseLost`] unless the record is in progress under this
    /// claim's token. "Now" is when the lease is written, after any lock
    /// the renewal waited for.
    async fn renew(&self, claim: &Claim) -> Result<(), Error>;

    /// Stores the outcome and marks the record completed, kept for the
    /// claim's ttl from now. Fails with [`Error::LeaseLost`] unless the
    /// record is in progress under this claim's token, or already completed
    /// by it with this very outcome (a completion sent again after its
    /// answer was lost).
    async fn complete(&self, claim: &Claim, outcome: &Outcome) -> Result<(), Error>;

    /// Deletes the claim so that a retry runs the operation again. Fails with
    /// [`Error::LeaseLost`] unless the record is still in progress under this
    /// claim's token (in which case nothing is deleted).
    async fn release(&self, claim: &Claim) -> Result<(), Error>;

    /// Reads the record of `(scope, key)`, live or not.
    async fn get(&self, scope: &Scope, key: &Key) -> Result<Option<Record>, Error>;

    /// Deletes the record of `(scope, key)` whatever its state, and its
    /// step journal, so that the next call with that key runs again from
    /// its first step: the operator's way out of a stored mistake or a
    /// stuck record. Returns whether there was a record.
    ///
    /// Forgetting a key in progress does not stop its body: the owner's
    /// completion then fails with [`Error::LeaseLost`] (the record is not
    /// its claim's any more), and a retry meanwhile may run the body a
    /// second time. Forget a key in progress only when its owner is known
    /// to be gone.
    async fn forget(&self, scope: &Scope, key: &Key) -> Result<bool, Error>;

    /// Deletes expired records and expired step journal entries, at most
    /// `batch` per statement so that no statement holds locks for long,
    /// until none is left. Returns how many records and entries were
    /// deleted.
    async fn purge_expired(&self, batch: usize) -> Result<u64, Error>;

    /// The step journal kept beside these records, which durable steps
    /// (`idem::steps`) need: `None` (the default) for a store that keeps
    /// none, where a call with steps fails with [`Error::Config`].
    fn journal(&self) -> Option<&dyn Journal> {
        None
    }

    /// The optional parts this store offers: none by default.
    fn capabilities(&self) -> Capabilities<'_> {
        Capabilities::default()
    }
}

/// The optional parts of a [`Store`], which make it faster or more
/// thorough but never change what it answers. A store that offers none is
/// correct for its records: duplicates then poll for a change, every
/// transition is awaited, and a dropped caller's claim is left to its
/// lease (but see [`Detach`] for durable steps, below).
///
/// A wrapper store offers its own: the engine calls an [`Immediate`] or a
/// [`Detach`] instead of the wrapper's `begin`, `complete` and handle, so
/// passing on the inner store's whole would skip what the wrapper does
/// (its faults, its counts, its cache). Pass on only the parts it does not
/// change, such as the inner store's [`Wake`]. A wrapper that keeps a
/// journal offers a [`Detach`] of its own (itself again, over the inner
/// store's handle): durable steps are journaled through that handle, and
/// refused on a store that keeps a journal and offers none.
///
/// ```
/// # use idem_core::store::{Capabilities, Wake};
/// # fn offered<'a>(waker: &'a dyn Wake) -> Capabilities<'a> {
/// Capabilities::default().with_wake(waker)
/// # }
/// ```
#[derive(Clone, Copy, Default)]
#[non_exhaustive]
pub struct Capabilities<'a> {
    /// Wakes duplicates waiting for a key when it changes.
    pub wake: Option<&'a dyn Wake>,
    /// Answers claims and completions without waiting.
    pub immediate: Option<&'a dyn Immediate>,
    /// Gives an owned handle for the work that outlives a dropped caller.
    pub detach: Option<&'a dyn Detach>,
    /// The database deletes expired records and journal entries by itself
    /// (Redis's key expiry), so that [`Store::purge_expired`] has nothing
    /// to do and answers 0.
    pub deletes_expired_itself: bool,
}

impl<'a> Capabilities<'a> {
    /// These, with `wake`.
    pub fn with_wake(mut self, wake: &'a dyn Wake) -> Self {
        self.wake = Some(wake);
        self
    }
    /// These, with `immediate`.
    pub fn with_immediate(mut self, immediate: &'a dyn Immediate) -> Self {
        self.immediate = Some(immediate);
        self
    }
    /// These, with `detach`.
    pub fn with_detach(mut self, detach: &'a dyn Detach) -> Self {
        self.detach = Some(detach);
        self
    }
    /// These, for a database that deletes what expires by itself.
    pub fn deleting_expired_itself(mut self) -> Self {
        self.deletes_expired_itself = true;
        self
    }
    /// The waking of [`wake`](Capabilities::wake), or [`Polling`].
    pub fn waker(&self) -> &'a dyn Wake {
        self.wake.unwrap_or(&Polling)
    }
    /// The owned handle of [`detach`](Capabilities::detach), if any.
    pub fn detached(&self) -> Option<Arc<dyn Store>> {
        self.detach.and_then(|d| d.detach())
    }
}

impl std::fmt::Debug for Capabilities<'_> {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Capabilities")
            .field("wake", &self.wake.is_some())
            .field("immediate", &self.immediate.is_some())
            .field("detach", &self.detach.is_some())
            .field("deletes_expired_itself", &self.deletes_expired_itself)
            .finish()
    }
}

/// The step journal: the transitions of durable steps
/// (`idem::steps`), each fenced by the claim of the operation they
/// belong to.
#[async_trait]
pub trait Journal: Send + Sync {
    /// Begins step `step` of the operation that `step.claim` holds, as
    /// one atomic step fenced by the claim: the journal entry at `step.seq` is
    /// read and answered with [`decide_step`](crate::journal::decide_step),
    /// and marked started by this attempt when the decision says so. Fails
    /// with [`Error::LeaseLost`] unless the operation's record is in
    /// progress under the claim's token.
    async fn begin_step(&self, step: &StepRequest<'_>) -> Result<StepBegin, Error>;

    /// Journals the output of step `step` (begun by `step.claim`, in doubt
    /// and reconciled, or never started because that write failed),
    /// fenced by the claim as [`begin_step`](Journal::begin_step) is. Sent
    /// again after its answer was lost, it succeeds when the entry holds
    /// this very output.
    async fn complete_step(&self, step: &StepRequest<'_>, output: &[u8]) -> Result<(), Error>;

    /// Takes back the start of step `step` that `step.claim` wrote,
    /// because the step's call failed cleanly (it had no effect
    /// downstream): the entry
    /// is deleted if it is still started under the claim's token and named
    /// `step.name`, and left as it is otherwise (completed, resolved, or
    /// taken over by a later attempt). The next attempt then runs the
    /// step as one never started. Returns whether the entry was deleted.
    /// The default deletes nothing (`false`): the step is then in doubt
    /// at the next attempt, which is safe, only slower.
    async fn undo_step(&self, step: &StepRequest<'_>) -> Result<bool, Error> {
        let _ = step;
        Ok(false)
    }

    /// The journal of the operation `(scope, key)`, live entries and
    /// expired ones not yet purged, by `seq`: what an operator reads
    /// before [`resolve_step`](Journal::resolve_step).
    async fn steps(&self, scope: &Scope, key: &Key) -> Result<Vec<StepRecord>, Error>;

    /// Keeps every live entry of the journal of `(scope, key)` until at
    /// least `ttl` from now (an expired one stays expired). An operation
    /// in progress does so each time its lease is renewed, so that a body
    /// that runs longer than its entries were kept for does not outlive
    /// its journal: after a crash, the attempt that takes over still finds
    /// the steps that completed.
    async fn keep_steps(&self, scope: &Scope, key: &Key, ttl: Duration) -> Result<(), Error>;

    /// An operator settles the step at `step`, which is started and has
    /// no outcome (in doubt, or still running): with its output, replayed
    /// by the next attempt, or by allowing the next attempt to run it
    /// again. Returns whether there was such a step. A step still running
    /// when it is resolved may then fail to journal its own output.
    async fn resolve_step(&self, step: &StepAt<'_>, to: &StepResolution) -> Result<bool, Error>;

    /// Whether the journal writes of a step may run beside the step's own
    /// call and behind the body, off their path (`idem::steps`): `true`
    /// by default; `false` where writes queue for one lock anyway
    /// (SQLite's), so that more of them at once only wait longer.
    fn writes_beside(&self) -> bool {
        true
    }
}

/// Waking: a store that can be told when a record changes wakes the
/// duplicates waiting for it at once. Without it
/// ([`Capabilities::wake`] is `None`), they poll, with a short, growing
/// backoff.
#[async_trait]
pub trait Wake: Send + Sync {
    /// Waits until the record of `(scope, key)` may have changed (completed
    /// or released), or at most `timeout`.
    async fn wait_for_change(
        &self,
        scope: &Scope,
        key: &Key,
        timeout: Duration,
    ) -> Result<(), Error>;

    /// [`wait_for_change`](Wake::wait_for_change) for a duplicate whose
    /// claim found the key in progress, answering it at once when the
    /// change is the completion, in this process, of the very claim that
    /// held the key: the outcome is handed over without a read. `None`:
    /// look at the record. The default waits for a change and answers
    /// `None`.
    async fn wait_for_outcome(
        &self,
        request: &BeginRequest<'_>,
        timeout: Duration,
    ) -> Result<Option<Begin>, Error> {
        self.wait_for_change(request.scope, request.key, timeout)
            .await?;
        Ok(None)
    }

    /// Whether [`wait_for_change`](Wake::wait_for_change) is woken by
    /// changes made in other processes right now (PostgreSQL's `LISTEN` is
    /// connected), so that waiters may poll slowly.
    fn wakes_across_processes(&self) -> bool {
        false
    }
}

/// The waking of a store that cannot be told about changes: it sleeps for
/// the whole timeout, so that the waiter looks at the record again.
#[derive(Clone, Copy, Debug, Default)]
pub struct Polling;

#[async_trait]
impl Wake for Polling {
    async fn wait_for_change(
        &self,
        _scope: &Scope,
        _key: &Key,
        timeout: Duration,
    ) -> Result<(), Error> {
        tokio::time::sleep(timeout).await;
        Ok(())
    }
}

/// Answers without waiting, for a store that can (its records in this
/// process's memory, or the outcome in a cache): [`Store::begin`] and
/// [`Store::complete`] under the same contract, without a future.
pub trait Immediate: Send + Sync {
    /// [`Store::begin`], answered now, or `None` when it cannot be (and
    /// the engine then sends `begin`).
    ///
    /// The engine takes a claim answered here to hold its whole lease: it
    /// renews a claim answered late by [`Store::begin`] before the body
    /// runs, but not one answered here. So the lease must count from when
    /// the claim is written: read the time after any lock the claim waits
    /// for, not before.
    fn begin_now(&self, request: &BeginRequest<'_>) -> Option<Result<Begin, Error>>;

    /// [`Store::complete`], done now, or `None` when it cannot be (having
    /// done nothing; the engine then sends `complete`).
    fn complete_now(&self, claim: &Claim, outcome: &Outcome) -> Option<Result<(), Error>>;
}

/// An owned handle on the same records, for the work that must outlive a
/// dropped caller: handing a claim back, storing an outcome already in
/// hand, or journaling a step's output.
pub trait Detach: Send + Sync {
    /// The handle, or `None` when there is none to give (the claim is then
    /// left to its lease).
    fn detach(&self) -> Option<Arc<dyn Store>>;
}

/// The journal of `store`, or the error a call with steps gets from a
/// store that keeps none.
pub fn journal_of(store: &(impl Store + ?Sized)) -> Result<&dyn Journal, Error> {
    store.journal().ok_or_else(no_journal)
}

/// A completion of a step that the journal does not hold as started: an
/// operator resolved it (or a forget removed it) while it ran.
pub fn step_not_journaled(step: &StepRequest<'_>) -> Error {
    Error::store(format!(
        "step {} ({:?}) is not started in the journal any more: it was resolved or forgotten \
         while it ran",
        step.seq, step.name
    ))
}

/// What a store without a step journal answers.
pub fn no_journal() -> Error {
    Error::Config("this store keeps no step journal (durable steps need one)".into())
}

/// A store whose statements can also run on a caller's connection: the
/// transactional mode of `idem::run_in_transaction`.
///
/// The SQL stores implement it for their connection, their transaction and
/// their pooled connection types (`&mut SqliteConnection`,
/// `&mut Transaction<'_, Sqlite>`, ...), running exactly the statements of
/// record mode, so that the claim and the completion commit or roll back
/// with the caller's own writes.
///
/// A duplicate in transactional mode looks first with a plain read
/// ([`peek_in`](TransactionalStore::peek_in)), which takes no lock, and
/// tries the claim only when the key looks free. Should that claim find
/// the key in progress after all, the duplicate does not wait: the attempt
/// may have left a lock in the caller's transaction that the owner needs.
/// A store whose claim locks nothing it does not claim says so
/// ([`claim_locks_only_its_own`](TransactionalStore::claim_locks_only_its_own)),
/// and its duplicates claim at once, one round trip fewer.
#[async_trait]
pub trait TransactionalStore<C: Send + ?Sized>: Store {
    /// [`Store::peek`] for a caller in a transaction on `conn`: a plain
    /// read that sees the latest committed record (on `conn` where its
    /// isolation allows, else on a free connection of the store's own).
    async fn peek_in(
        &self,
        conn: &mut C,
        request: &BeginRequest<'_>,
    ) -> Result<Option<Begin>, Error>;
    /// [`Store::begin`] on `conn`.
    async fn begin_on(&self, conn: &mut C, request: &BeginRequest<'_>) -> Result<Begin, Error>;
    /// [`Store::complete`] on `conn`.
    async fn complete_on(
        &self,
        conn: &mut C,
        claim: &Claim,
        outcome: &Outcome,
    ) -> Result<(), Error>;
    /// [`Store::release`] on `conn`.
    async fn release_on(&self, conn: &mut C, claim: &Claim) -> Result<(), Error>;
    /// [`Journal::complete_step`] on `conn`: a step whose rows commit with
    /// its journal entry (`idem::steps::Step::in_transaction`).
    /// The default keeps no journal there and refuses.
    async fn complete_step_on(
        &self,
        conn: &mut C,
        step: &StepRequest<'_>,
        output: &[u8],
    ) -> Result<(), Error> {
        let _ = (conn, step, output);
        Err(no_journal())
    }
    /// Whether the journal writes of a step whose rows commit with its
    /// entry must go on `conn`: the caller's transaction holds a lock that
    /// the store's own connections would wait for until the database gives
    /// up, or a snapshot their commit would break (SQLite, once the
    /// transaction read, wrote or began `IMMEDIATE`). `false` (the
    /// default): they go through the store.
    async fn journals_on(&self, conn: &mut C) -> Result<bool, Error> {
        let _ = conn;
        Ok(false)
    }
    /// [`Journal::begin_step`] on `conn`, where
    /// [`journals_on`](TransactionalStore::journals_on) says so: the entry
    /// commits or rolls back with the caller's transaction. The default
    /// keeps no journal there and refuses.
    async fn begin_step_on(
        &self,
        conn: &mut C,
        step: &StepRequest<'_>,
    ) -> Result<StepBegin, Error> {
        let _ = (conn, step);
        Err(no_journal())
    }
    /// Whether [`begin_on`](TransactionalStore::begin_on) locks no record
    /// but the one it claims (PostgreSQL's `INSERT ... ON CONFLICT DO
    /// NOTHING`): a duplicate then claims without looking first, and may
    /// wait for an owner in progress. `false` (the default) looks first
    /// with [`peek_in`](TransactionalStore::peek_in), and a claim attempt
    /// that finds the key in progress does not wait.
    fn claim_locks_only_its_own(&self) -> bool {
        false
    }
    /// Whether `conn` is in a transaction, so that a claim written on it
    /// is seen by no one else until the caller commits. On a connection
    /// outside one, each statement commits as it runs, the claim too:
    /// `idem::run_in_transaction` then keeps
    /// it as `idem::run` does, its lease renewed through
    /// the store while the body runs, and its outcome stored through the
    /// store should the connection fail to. `true` (the default) for a
    /// store that cannot tell.
    fn in_transaction(&self, conn: &mut C) -> bool {
        let _ = conn;
        true
    }
}

macro_rules! forward_transactional_store {
    ($($ty:ty),*) => {$(
        #[async_trait]
        impl<C, S> TransactionalStore<C> for $ty
        where
            C: Send + ?Sized,
            S: TransactionalStore<C> + ?Sized,
        {
            async fn peek_in(
                &self,
                conn: &mut C,
                request: &BeginRequest<'_>,
            ) -> Result<Option<Begin>, Error> {
                (**self).peek_in(conn, request).await
            }
            async fn begin_on(&self, conn: &mut C, request: &BeginRequest<'_>) -> Result<Begin, Error> {
                (**self).begin_on(conn, request).await
            }
            async fn complete_on(
                &self,
                conn: &mut C,
                claim: &Claim,
                outcome: &Outcome,
            ) -> Result<(), Error> {
                (**self).complete_on(conn, claim, outcome).await
            }
            async fn release_on(&self, conn: &mut C, claim: &Claim) -> Result<(), Error> {
                (**self).release_on(conn, claim).await
            }
            async fn complete_step_on(
                &self,
                conn: &mut C,
                step: &StepRequest<'_>,
                output: &[u8],
            ) -> Result<(), Error> {
                (**self).complete_step_on(conn, step, output).await
            }
            async fn journals_on(&self, conn: &mut C) -> Result<bool, Error> {
                (**self).journals_on(conn).await
            }
            async fn begin_step_on(
                &self,
                conn: &mut C,
                step: &StepRequest<'_>,
            ) -> Result<StepBegin, Error> {
                (**self).begin_step_on(conn, step).await
            }
            fn claim_locks_only_its_own(&self) -> bool {
                (**self).claim_locks_only_its_own()
            }
            fn in_transaction(&self, conn: &mut C) -> bool {
                (**self).in_transaction(conn)
            }
        }
    )*};
}
forward_transactional_store!(Arc<S>, Box<S>, &S);
// Implements `Store` for `$ty` by forwarding every method to the store
// `$to` borrows (from `self`, named `$this`).
macro_rules! forward_store {
    ($([$($generics:tt)*] $ty:ty => |$this:ident| $to:expr;)*) => {$(
        #[async_trait]
        impl<$($generics)*> Store for $ty {
            async fn begin(&self, request: &BeginRequest<'_>) -> Result<Begin, Error> {
                ({ let $this = self; $to }).begin(request).await
            }
            async fn peek(&self, request: &BeginRequest<'_>) -> Result<Option<Begin>, Error> {
                ({ let $this = self; $to }).peek(request).await
            }
            async fn renew(&self, claim: &Claim) -> Result<(), Error> {
                ({ let $this = self; $to }).renew(claim).await
            }
            async fn complete(&self, claim: &Claim, outcome: &Outcome) -> Result<(), Error> {
                ({ let $this = self; $to }).complete(claim, outcome).await
            }
            async fn release(&self, claim: &Claim) -> Result<(), Error> {
                ({ let $this = self; $to }).release(claim).await
            }
            async fn get(&self, scope: &Scope, key: &Key) -> Result<Option<Record>, Error> {
                ({ let $this = self; $to }).get(scope, key).await
            }
            async fn forget(&self, scope: &Scope, key: &Key) -> Result<bool, Error> {
                ({ let $this = self; $to }).forget(scope, key).await
            }
            async fn purge_expired(&self, batch: usize) -> Result<u64, Error> {
                ({ let $this = self; $to }).purge_expired(batch).await
            }
            fn journal(&self) -> Option<&dyn Journal> {
                ({ let $this = self; $to }).journal()
            }
            fn capabilities(&self) -> Capabilities<'_> {
                ({ let $this = self; $to }).capabilities()
            }
        }
    )*};
}
forward_store!(
    [S: Store + ?Sized] Arc<S> => |s| &**s;
    [S: Store + ?Sized] Box<S> => |s| &**s;
    [S: Store + ?Sized] &S => |s| &**s;
);
