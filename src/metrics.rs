//! Counters and histograms, through the [`metrics`](https://docs.rs/metrics)
//! facade: install any recorder (Prometheus exporter, statsd, ...) and they
//! appear; without one they cost next to nothing.
//!
//! | name | kind | meaning |
//! |---|---|---|
//! | `idem_executions_total` | counter | bodies started (claims won) |
//! | `idem_replays_total` | counter | calls answered from a stored outcome |
//! | `idem_key_reused_total` | counter | keys reused with another payload |
//! | `idem_in_progress_total` | counter | duplicates rejected while the first call ran |
//! | `idem_takeovers_total` | counter | claims that replaced a lapsed lease or an expired record |
//! | `idem_replay_latency_seconds` | histogram | time to answer a replayed call |
//! | `idem_lease_lost_total` | counter | claims found taken over while their body ran or their outcome was stored |
//! | `idem_store_retries_total` | counter | failed attempts to store an outcome, tried again |
//! | `idem_unprotected_total` | counter | calls without a key that ran their body without protection (`MissingKey::Run`) |
//! | `idem_abandoned_total` | counter | callers dropped before their call ended, by `what` became of the claim: `released` (handed back for a retry), `saved` (the outcome in hand is stored in the background), `left` (left to its lease: no runtime or store to hand it back with) |
//!
//! Each carries an `operation` label: the scope's operation, never the
//! principal or the key, so that label sets stay small.

use std::time::Duration;

use crate::key::Scope;

/// The name of the executions counter.
pub const EXECUTIONS: &str = "idem_executions_total";
/// The name of the replays counter.
pub const REPLAYS: &str = "idem_replays_total";
/// The name of the key-reuse counter.
pub const KEY_REUSED: &str = "idem_key_reused_total";
/// The name of the in-progress rejections counter.
pub const IN_PROGRESS: &str = "idem_in_progress_total";
/// The name of the takeovers counter.
pub const TAKEOVERS: &str = "idem_takeovers_total";
/// The name of the lost-lease counter.
pub const LEASE_LOST: &str = "idem_lease_lost_total";
/// The name of the outcome-store retries counter.
pub const STORE_RETRIES: &str = "idem_store_retries_total";
/// The name of the counter of calls run without protection, for want of a
/// key.
pub const UNPROTECTED: &str = "idem_unprotected_total";
/// The name of the abandoned-calls counter.
pub const ABANDONED: &str = "idem_abandoned_total";
/// The name of the replay latency histogram.
pub const REPLAY_LATENCY: &str = "idem_replay_latency_seconds";

fn operation(scope: &Scope) -> String {
    scope.operation().to_owned()
}

pub(crate) fn executed(scope: &Scope) {
    metrics::counter!(EXECUTIONS, "operation" => operation(scope)).increment(1);
}

pub(crate) fn replayed(scope: &Scope, latency: Duration) {
    metrics::counter!(REPLAYS, "operation" => operation(scope)).increment(1);
    metrics::histogram!(REPLAY_LATENCY, "operation" => operation(scope))
        .record(latency.as_secs_f64());
}

pub(crate) fn key_reused(scope: &Scope) {
    metrics::counter!(KEY_REUSED, "operation" => operation(scope)).increment(1);
}

pub(crate) fn in_progress(scope: &Scope) {
    metrics::counter!(IN_PROGRESS, "operation" => operation(scope)).increment(1);
}

pub(crate) fn taken_over(scope: &Scope) {
    metrics::counter!(TAKEOVERS, "operation" => operation(scope)).increment(1);
}

pub(crate) fn lease_lost(scope: &Scope) {
    metrics::counter!(LEASE_LOST, "operation" => operation(scope)).increment(1);
}

pub(crate) fn store_retried(scope: &Scope) {
    metrics::counter!(STORE_RETRIES, "operation" => operation(scope)).increment(1);
}

pub(crate) fn unprotected(scope: &Scope) {
    metrics::counter!(UNPROTECTED, "operation" => operation(scope)).increment(1);
}

pub(crate) fn abandoned(scope: &Scope, what: &'static str) {
    metrics::counter!(ABANDONED, "operation" => operation(scope), "what" => what).increment(1);
}
