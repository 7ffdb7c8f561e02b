//! The integration tests, one module per subject (each module's
//! documentation says what it proves), built as one test binary: the
//! subjects share most of what they compile (the stores, the servers'
//! clients, the engine's code for each store), and one build and one link
//! cost a fraction of thirty. `tests/allocations.rs` stays a binary of its
//! own, as it counts every allocation of its process.
//!
//! Run one subject with `cargo test --all-features --test suite -- <module>::`.
//! A module's features are the ones it needs; without them it is not
//! built.

mod common;
#[cfg(all(feature = "axum", feature = "sqlite", feature = "postgres"))]
mod http_support;
#[cfg(all(
    feature = "axum",
    feature = "sqlite",
    feature = "postgres",
    feature = "mysql"
))]
#[path = "../../examples/payments/main.rs"]
#[allow(dead_code)]
mod payments;
#[cfg(all(
    feature = "axum",
    feature = "sqlite",
    feature = "postgres",
    feature = "mysql"
))]
mod payments_app;

mod attribute;
mod bounded_saves;
mod cache_expiry;
mod clean_step_failures;
#[cfg(all(feature = "sqlite", feature = "postgres"))]
mod consumer;
#[cfg(all(feature = "kafka", feature = "sqlite", feature = "postgres"))]
mod consumer_kafka;
#[cfg(all(feature = "postgres", feature = "mysql"))]
mod consumer_races;
mod content_keys;
mod default_fingerprint;
mod dropped_migrations;
mod entity;
mod entity_cuts;
#[cfg(all(feature = "axum", feature = "sqlite", feature = "postgres"))]
mod http_edges;
#[cfg(all(feature = "axum", feature = "sqlite", feature = "postgres"))]
mod http_fingerprint;
#[cfg(all(feature = "axum", feature = "sqlite", feature = "postgres"))]
mod http_isolation;
#[cfg(all(feature = "axum", feature = "sqlite", feature = "postgres"))]
mod http_key_extension;
#[cfg(all(feature = "axum", feature = "sqlite", feature = "postgres"))]
mod http_labels;
#[cfg(all(feature = "axum", feature = "sqlite"))]
mod http_layer;
#[cfg(all(feature = "axum", feature = "sqlite", feature = "postgres"))]
mod http_slow_streams;
mod http_steps;
#[cfg(all(feature = "axum", feature = "sqlite", feature = "postgres"))]
mod http_storing;
#[cfg(all(feature = "axum", feature = "sqlite", feature = "postgres"))]
mod http_streaming;
#[cfg(all(feature = "kafka", feature = "sqlite"))]
mod kafka_transactions;
#[cfg(all(feature = "postgres", feature = "mysql"))]
mod kept_connection_kills;
mod kept_connections;
#[cfg(feature = "http")]
mod key_parsers;
#[cfg(feature = "uuid")]
mod keys;
mod late_claims;
mod lease_upkeep;
mod live_journals;
mod local_cache;
mod macro_expansion;
mod memory_clock;
mod memory_store;
#[cfg(feature = "sqlite")]
mod missing_key;
#[cfg(feature = "postgres")]
mod network_cuts;
mod non_finite_and_pools;
mod observability;
#[cfg(all(feature = "sqlite", feature = "postgres", feature = "mysql"))]
mod operator;
#[cfg(any(feature = "sqlite", feature = "postgres", feature = "mysql"))]
mod outbox;
#[cfg(any(feature = "sqlite", feature = "postgres", feature = "mysql"))]
mod outbox_ids;
#[cfg(all(feature = "kafka", feature = "sqlite"))]
mod outbox_kafka;
#[cfg(all(
    feature = "axum",
    feature = "sqlite",
    feature = "postgres",
    feature = "mysql"
))]
mod payments_crash_after_charge;
#[cfg(all(
    feature = "axum",
    feature = "sqlite",
    feature = "postgres",
    feature = "mysql"
))]
mod payments_example;
#[cfg(all(
    feature = "axum",
    feature = "sqlite",
    feature = "postgres",
    feature = "mysql"
))]
mod payments_killed_connections;
#[cfg(all(
    feature = "axum",
    feature = "sqlite",
    feature = "postgres",
    feature = "mysql",
    feature = "kafka"
))]
mod payments_outbox_soak;
#[cfg(all(feature = "sqlite", feature = "postgres", feature = "mysql"))]
mod process_faults;
mod redis_failover;
mod redis_own_servers;
mod redis_store;
#[cfg(feature = "sqlite")]
mod refused_phases;
mod replayable_errors;
#[cfg(feature = "sqlite")]
mod simulation;
mod sql_store_concurrency;
mod sql_stores;
mod state_machine_model;
mod step_crash_points;
mod step_flush_drops;
mod step_in_flight;
mod step_journal;
mod step_resolutions;
#[cfg(feature = "testing")]
mod store_conformance;
#[cfg(all(feature = "sqlite", feature = "postgres", feature = "mysql"))]
mod store_faults;
mod tracked;
#[cfg(all(feature = "sqlite", feature = "postgres", feature = "mysql"))]
mod transactional;
#[cfg(all(feature = "sqlite", feature = "postgres", feature = "mysql"))]
mod transactional_edges;
mod unencodable_outcomes;
mod waiter_payloads;
mod wrapper_capabilities;
