//! Counters and histograms, through the [`metrics`](https://docs.rs/metrics)
//! facade: install any recorder (Prometheus exporter, statsd, ...) and they
//! appear; without one they cost next to nothing. The guide shows how
//! ([`operating`](crate::_guide::operating#metrics)). This table lists
//! every metric the library emits; the steps' names are
//! [`steps::STEPS`](crate::steps::STEPS) and
//! [`steps::STEPS_IN_DOUBT`](crate::steps::STEPS_IN_DOUBT).
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
//! | `idem_steps_total` | counter | [durable steps](crate::steps) completed, by `step` and `decision`: `ran` (called now), `replayed` (answered from the journal) |
//! | `idem_steps_in_doubt_total` | counter | steps found in doubt, by `step` and `resolution`: `rerun`, `reconciled`, `reconciled_none` (reconcile found nothing and the step ran), `in_flight` (an earlier attempt's call may still land: the attempt was told to come back), `refused`, `allowed` (an operator allowed a rerun), `operator_completed`, `operator_rerun` |
//! | `idem_outbox_messages_total` | counter | messages an [outbox](crate::outbox) relay handled, by `outcome`: `relayed` (acknowledged by the broker and marked), `failed` (not taken: given back for a later round), `parked` (refused for good) |
//!
//! Each carries an `operation` label (but the outbox's, which carries
//! `table`, the outbox's table): the scope's operation, never the
//! principal or the key, so that label sets stay small. The HTTP layer's
//! scopes of a raw request path (a request that matched no route
//! template) share one label instead, `METHOD (unmatched)`, so that no
//! client makes a label per path: see `idem::http::MakeRoute`.

use std::cell::RefCell;
use tokio::time::Instant;

use indexmap::IndexMap;

use idem_core::key::Scope;

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
/// The name of the outbox relays' counter.
pub const OUTBOX_MESSAGES: &str = "idem_outbox_messages_total";
/// The name of the replay latency histogram.
pub const REPLAY_LATENCY: &str = "idem_replay_latency_seconds";

/// Each metric of this module, by its place in an operation's cached keys.
#[derive(Clone, Copy)]
enum Metric {
    Executions,
    Replays,
    ReplayLatency,
    KeyReused,
    InProgress,
    Takeovers,
    LeaseLost,
    StoreRetries,
    Unprotected,
    AbandonedReleased,
    AbandonedSaved,
    AbandonedLeft,
}

/// How many metrics an operation has keys for.
const METRICS: usize = Metric::AbandonedLeft as usize + 1;

impl Metric {
    fn name(self) -> &'static str {
        match self {
            Metric::Executions => EXECUTIONS,
            Metric::Replays => REPLAYS,
            Metric::ReplayLatency => REPLAY_LATENCY,
            Metric::KeyReused => KEY_REUSED,
            Metric::InProgress => IN_PROGRESS,
            Metric::Takeovers => TAKEOVERS,
            Metric::LeaseLost => LEASE_LOST,
            Metric::StoreRetries => STORE_RETRIES,
            Metric::Unprotected => UNPROTECTED,
            Metric::AbandonedReleased | Metric::AbandonedSaved | Metric::AbandonedLeft => ABANDONED,
        }
    }

    /// The `what` label of the abandoned-calls counter.
    fn what(self) -> Option<&'static str> {
        match self {
            Metric::AbandonedReleased => Some("released"),
            Metric::AbandonedSaved => Some("saved"),
            Metric::AbandonedLeft => Some("left"),
            _ => None,
        }
    }
}

/// What `metrics::counter!` gives a recorder when called in this module.
static METADATA: metrics::Metadata<'static> =
    metrics::Metadata::new(module_path!(), metrics::Level::INFO, Some(module_path!()));

/// The most operations a thread keeps the metric keys of. Operations are
/// few (their names are written in code, or are route templates), so this
/// only bounds the memory of a scope made of raw request paths: past it,
/// the cache starts again.
const CACHED_OPERATIONS: usize = 256;

thread_local! {
    /// The keys of each operation seen by this thread, built on first use,
    /// so that a metric call builds no label: a metric key with a label
    /// that is not `'static` is otherwise allocated at every call, even
    /// without a recorder. Only keys are kept, never a recorder's handles,
    /// so a recorder installed later (or a local one) sees every call.
    static KEYS: RefCell<Cache> = RefCell::new(Cache::default());
}

/// The keys of each operation, and which operation was counted last: a
/// thread counting the same operation again finds it without hashing.
#[derive(Default)]
struct Cache {
    operations: IndexMap<Box<str>, Keys>,
    last: usize,
}

/// An operation's key of each metric, built on its first use.
type Keys = [Option<metrics::Key>; METRICS];

/// Calls `f` with the keys of `metrics` for `scope`'s operation, from this
/// thread's cache.
fn with_keys<const N: usize, F>(scope: &Scope, metrics: [Metric; N], f: F)
where
    F: FnOnce([&metrics::Key; N]),
{
    let operation = scope.metric_label();
    let mut f = Some(f);
    let mut call = |entry: &mut Keys| {
        for metric in metrics {
            entry[metric as usize].get_or_insert_with(|| build(operation, metric));
        }
        if let Some(f) = f.take() {
            f(metrics.map(|metric| entry[metric as usize].as_ref().expect("built above")));
        }
    };
    // Without the cache (its thread is ending, or it is borrowed already
    // by a recorder that counts in turn while it is called), `f` is left
    // to the end.
    let _ = KEYS.try_with(|cache| {
        let Ok(mut cache) = cache.try_borrow_mut() else {
            return;
        };
        let cache = &mut *cache;
        let last = cache.last;
        if let Some((name, entry)) = cache.operations.get_index_mut(last) {
            if **name == *operation {
                return call(entry);
            }
        }
        if let Some((index, _, entry)) = cache.operations.get_full_mut(operation) {
            cache.last = index;
            return call(entry);
        }
        if cache.operations.len() >= CACHED_OPERATIONS {
            cache.operations.clear();
        }
        let (index, _) = cache
            .operations
            .insert_full(operation.into(), [const { None }; METRICS]);
        cache.last = index;
        call(&mut cache.operations[index]);
    });
    if let Some(f) = f.take() {
        let keys = metrics.map(|metric| build(operation, metric));
        f(std::array::from_fn(|i| &keys[i]));
    }
}

/// The key of `metric` for `operation`, as `metrics::counter!(name,
/// "operation" => operation)` builds it (and `"what" => what` for the
/// abandoned calls).
fn build(operation: &str, metric: Metric) -> metrics::Key {
    build_parts(metric.name(), operation, metric.what())
}

fn build_parts(name: &'static str, operation: &str, what: Option<&'static str>) -> metrics::Key {
    let operation = metrics::Label::new("operation", operation.to_owned());
    let labels = match what {
        Some(what) => vec![operation, metrics::Label::new("what", what)],
        None => vec![operation],
    };
    metrics::Key::from_parts(name, labels)
}

fn count(scope: &Scope, metric: Metric) {
    with_keys(scope, [metric], |[key]| {
        metrics::with_recorder(|recorder| recorder.register_counter(key, &METADATA).increment(1));
    });
}

pub(crate) fn executed(scope: &Scope) {
    count(scope, Metric::Executions);
}

/// The time since a call started, read only by a histogram that records
/// it: without a recorder, a replay reads no clock for its latency.
struct Since(Instant);

impl metrics::IntoF64 for Since {
    fn into_f64(self) -> f64 {
        self.0.elapsed().as_secs_f64()
    }
}

/// A replay of a call that started at `started`.
pub(crate) fn replayed(scope: &Scope, started: Instant) {
    with_keys(
        scope,
        [Metric::Replays, Metric::ReplayLatency],
        |[replays, latency_key]| {
            metrics::with_recorder(|recorder| {
                recorder.register_counter(replays, &METADATA).increment(1);
                recorder
                    .register_histogram(latency_key, &METADATA)
                    .record(Since(started));
            });
        },
    );
}

/// A counter's function per decision: `name(scope)` counts one `metric`.
macro_rules! counters {
    ($($name:ident => $metric:ident),* $(,)?) => {
        $(
            pub(crate) fn $name(scope: &Scope) {
                count(scope, Metric::$metric);
            }
        )*
    };
}

counters! {
    key_reused => KeyReused,
    in_progress => InProgress,
    taken_over => Takeovers,
    lease_lost => LeaseLost,
    store_retried => StoreRetries,
    unprotected => Unprotected,
}

/// `what` became of an abandoned call's claim: `released`, `saved` or
/// `left`.
pub(crate) fn abandoned(scope: &Scope, what: &'static str) {
    let metric = match what {
        "released" => Metric::AbandonedReleased,
        "saved" => Metric::AbandonedSaved,
        "left" => Metric::AbandonedLeft,
        // Not one of the three: a key of its own, not cached.
        _ => {
            let key = build_parts(ABANDONED, scope.metric_label(), Some(what));
            metrics::with_recorder(|r| r.register_counter(&key, &METADATA).increment(1));
            return;
        }
    };
    count(scope, metric);
}
