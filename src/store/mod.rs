//! The storage contract and its backends.
//!
//! The contract is `idem-core`'s, re-exported here: [`Store`], the record
//! transitions; [`Journal`], the step transitions; and the optional parts
//! of [`Capabilities`] ([`Wake`], [`Immediate`], [`Detach`]). A store of
//! your own can depend on `idem-core` alone.
//!
//! One folder per backend: `memory/`, `sql/` (the flow the SQL stores
//! share, and `sql/{sqlite, postgres, mysql}/`), `redis/`; beside them
//! the wrappers ([`CachedStore`], [`PassThroughStore`]) and the waiters
//! every store in this process wakes.
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

mod cached;
mod memory;
mod pass_through;
#[cfg(feature = "redis")]
pub(crate) mod redis;
pub(crate) mod rows;
#[cfg(feature = "_sql")]
pub(crate) mod sql;
mod waiters;

#[cfg(feature = "_sql")]
#[cfg_attr(
    docsrs,
    doc(cfg(any(feature = "sqlite", feature = "postgres", feature = "mysql")))
)]
pub use crate::store::sql::{Backend, SqlStore};
pub use cached::CachedStore;
pub use idem_core::record::BeginRequest;
pub(crate) use idem_core::store::{journal_of, step_not_journaled};
pub use idem_core::store::{
    Capabilities, Detach, Immediate, Journal, Polling, Store, TransactionalStore, Wake,
};
pub use memory::MemoryStore;
pub use pass_through::PassThroughStore;
pub(crate) use waiters::{wake_by_waiting, Look, Waiters};
