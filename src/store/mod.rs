//! The storage contract and its backends.
//!
//! Every backend keeps records unique per `(scope, key)` and decides the
//! claim with one atomic conditional write (a UNIQUE constraint with an
//! upsert, or a lock-protected map), never with a read followed by a write.
//! Leases and expiry are decided with the database's clock (the process's
//! clock only for the in-memory store, whose database is the process), and
//! every fenced write (renewal, completion, release) names the claim's
//! [`ClaimToken`](crate::record::ClaimToken), which never repeats.
//! The answer to a duplicate is computed by [`record::decide`](crate::record::decide)
//! so that all backends behave the same; the conformance suite (`idem::testing`,
//! feature `testing`) holds each of them, and stores of your own, to it.

use std::sync::Arc;

use async_trait::async_trait;

use crate::error::Error;
use crate::journal::{StepBegin, StepRequest};
use crate::key::{Key, Scope};
pub use crate::record::BeginRequest;
use crate::record::{Begin, Claim, Outcome, Record};

mod cached;
mod contract;
mod memory;
mod memory_records;
mod pass_through;
mod waiters;

pub use cached::CachedStore;
pub(crate) use contract::{journal_of, no_journal, step_not_journaled};
pub use contract::{Capabilities, Detach, Immediate, Journal, Polling, Store, Wake};
pub use memory::MemoryStore;
pub use pass_through::PassThroughStore;
pub(crate) use waiters::{Look, Waiters};

/// A store whose statements can also run on a caller's connection: the
/// transactional mode of [`run_in_transaction`](crate::engine::run_in_transaction).
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
    /// its journal entry ([`Step::in_transaction`](crate::steps::Step::in_transaction)).
    /// The default keeps no journal there and refuses.
    async fn complete_step_on(
        &self,
        conn: &mut C,
        claim: &Claim,
        step: &StepRequest<'_>,
        output: &[u8],
    ) -> Result<(), Error> {
        let _ = (conn, claim, step, output);
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
        claim: &Claim,
        step: &StepRequest<'_>,
    ) -> Result<StepBegin, Error> {
        let _ = (conn, claim, step);
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
    /// [`run_in_transaction`](crate::engine::run_in_transaction) then keeps
    /// it as [`run`](crate::engine::run) does, its lease renewed through
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
                claim: &Claim,
                step: &StepRequest<'_>,
                output: &[u8],
            ) -> Result<(), Error> {
                (**self).complete_step_on(conn, claim, step, output).await
            }
            async fn journals_on(&self, conn: &mut C) -> Result<bool, Error> {
                (**self).journals_on(conn).await
            }
            async fn begin_step_on(
                &self,
                conn: &mut C,
                claim: &Claim,
                step: &StepRequest<'_>,
            ) -> Result<StepBegin, Error> {
                (**self).begin_step_on(conn, claim, step).await
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
macro_rules! forward_store {
    ($([$($generics:tt)*] $ty:ty => |$this:ident| $to:expr;)*) => {$(
        $crate::store::forward_store!(
            [$($generics)*] $ty => |$this| $to,
            capabilities: ($to).capabilities();
        );
    )*};
    ($([$($generics:tt)*] $ty:ty => |$this:ident| $to:expr, capabilities: $caps:expr;)*) => {$(
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
                let $this = self;
                $caps
            }
        }
    )*};
}
/// Implements [`Store`] for `$ty` by forwarding every method to the store
/// `$to` borrows (from `self`, named `$this`), but `capabilities` where
/// `$caps` is given.
pub(crate) use forward_store;
forward_store!(
    [S: Store + ?Sized] Arc<S> => |s| &**s;
    [S: Store + ?Sized] Box<S> => |s| &**s;
    [S: Store + ?Sized] &S => |s| &**s;
);
