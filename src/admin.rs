//! What an operator reads and does beside the flow: every record behind a
//! key whatever its scope, counts by scope and state, the database's
//! clock, and purges that say how far they got. The `idem` command line
//! tool (crate `idem-cli`) is built on this module and on [`Store`]'s own
//! operator methods ([`get`](Store::get), [`forget`](Store::forget)),
//! and [`Journal`](crate::store::Journal)'s ([`steps`](crate::store::Journal::steps),
//! [`resolve_step`](crate::store::Journal::resolve_step)).
//!
//! [`Inventory`] is implemented by the SQL stores and by
//! [`RedisStore`](crate::RedisStore). Its reads look at every record (a
//! full scan of the table, or `SCAN` over every primary of a cluster):
//! they are for an operator, never for a request's path.
//!
//! # Where entity mode keeps its claims
//!
//! A call in entity mode ([`crate::entity`]) claims its token in the
//! records table [`ENTITY_CLAIMS_TABLE`] of the entity's database, under
//! the scope [`entity_claims_scope`]`(<entity table>)`, and journals its
//! steps in that table's journal under the operation's own scope. An HTTP
//! request served by the layer and by an operation in entity mode is held
//! by two records after a crash: the layer's, and the entity claim.

use async_trait::async_trait;

use idem_core::error::Error;
use idem_core::journal::StepRecord;
use idem_core::key::{Key, Scope};
use idem_core::record::{Millis, Record};
use idem_core::store::Store;

/// The records table that holds entity mode's claims, in the database of
/// the entity's table.
pub const ENTITY_CLAIMS_TABLE: &str = "idem_entity_claims";

/// How the scope of every entity-mode claim begins.
pub const ENTITY_CLAIMS_SCOPE_PREFIX: &str = "idem.entity.";

/// The scope under which entity mode claims the tokens of rows of
/// `table`, in [`ENTITY_CLAIMS_TABLE`]: `idem.entity.<table>`.
pub fn entity_claims_scope(table: &str) -> Scope {
    Scope::new(format!("{ENTITY_CLAIMS_SCOPE_PREFIX}{table}"))
}

/// The records of one scope, by state.
#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub struct ScopeStats {
    /// The scope, as stored.
    pub scope: String,
    /// Records in progress (live or not).
    pub in_progress: u64,
    /// Records completed (live or not).
    pub completed: u64,
    /// Records of either state whose expiry has passed, not yet purged.
    pub expired: u64,
}

/// The step journal's entries, by state.
#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub struct StepStats {
    /// Started and without an outcome: running, or in doubt.
    pub started: u64,
    /// Completed.
    pub completed: u64,
    /// Allowed by an operator to run again.
    pub rerun_allowed: u64,
    /// Entries of any state whose expiry has passed, not yet purged.
    pub expired: u64,
}

/// What [`Inventory::stats`] counts.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Stats {
    /// The database's clock when the counts were taken.
    pub now: Millis,
    /// The records, by scope, ordered by scope.
    pub scopes: Vec<ScopeStats>,
    /// The entries of the step journal.
    pub steps: StepStats,
    /// The record in progress that was claimed first, if any: the one most
    /// likely stuck.
    pub oldest_in_progress: Option<Record>,
}

/// An operator's reads over a whole store, and a purge that reports its
/// progress. See the [module documentation](self).
#[async_trait]
pub trait Inventory: Store {
    /// The database's clock (Redis: `TIME`), the time every lease and
    /// expiry of the store is decided with.
    async fn now(&self) -> Result<Millis, Error>;

    /// Whether the store's records table exists: `false` where no
    /// `migrate()` ran on this database, or the table name is not the
    /// application's. Redis has no table (`true`), but a store connected
    /// to one node of a cluster as to a single Redis is refused with
    /// [`Error::Config`].
    async fn is_set_up(&self) -> Result<bool, Error>;

    /// Every record whose key is `key`, in any scope, ordered by scope.
    async fn records_with_key(&self, key: &Key) -> Result<Vec<Record>, Error>;

    /// Every step journal entry of an operation whose key is `key`, in
    /// any scope, by scope and `seq`. On Redis, only the journals of keys
    /// that have a record (a journal outlives its released claim there
    /// unseen: look it up with [`Journal::steps`](crate::store::Journal::steps)).
    async fn steps_with_key(&self, key: &Key) -> Result<Vec<StepRecord>, Error>;

    /// Counts of records by scope and state, of journal entries by state,
    /// and the oldest record in progress.
    async fn stats(&self) -> Result<Stats, Error>;

    /// [`Store::purge_expired`], calling `progress` with the number of
    /// records and journal entries each batch deleted.
    async fn purge_expired_reporting(
        &self,
        batch: usize,
        progress: &(dyn Fn(u64) + Send + Sync),
    ) -> Result<u64, Error>;
}

/// Why the result an outcome stands in for could not be encoded, when the
/// engine stored that in its place (its replays answer
/// [`Error::Unrecorded`]); `None` for any other outcome.
pub fn unrecorded_reason(outcome: &idem_core::record::Outcome) -> Option<String> {
    outcome.unrecorded_reason()
}
