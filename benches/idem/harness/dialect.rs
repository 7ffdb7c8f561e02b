//! What differs between the SQL backends the bench runs on: their SQL, and
//! how to connect.

use super::goal::Goals;
use super::reference::Client;

/// What differs between the backends: their SQL, and how to connect.
pub struct Dialect {
    pub label: &'static str,
    /// The variable naming the server, and the local default; `None` for
    /// SQLite, a file.
    pub server: Option<(&'static str, &'static str)>,
    /// The n-th bind parameter.
    pub param: fn(usize) -> String,
    /// Creates the business table `{pay}` and the check-then-act table
    /// `{cta}`.
    pub tables: &'static str,
    /// Takes and releases check-then-act's lock on a key, bound to the
    /// statement if it has a parameter.
    pub lock: &'static str,
    pub unlock: &'static str,
    /// Bulk-loads `{n}` completed records `k1..=k{n}` into `{records}` with
    /// one INSERT ... SELECT, binding the scope, the fingerprint and the
    /// expiry.
    pub fill: &'static str,
    /// Refreshes the planner's statistics of `{records}`, where needed.
    pub analyze: Option<&'static str>,
    /// Creates B8's entity table, `bench_entity_charges`, if missing.
    pub entity_table: &'static str,
    /// The client that measures the reference.
    pub reference: Client,
    pub goals: Goals,
    /// Whether B7 (throughput vs concurrency) runs here.
    pub curve: bool,
}
