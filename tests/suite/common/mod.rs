//! What the integration tests share (each test binary does `mod common;`
//! and uses a part):
//!
//! - [`servers`]: the database servers, from `IDEM_POSTGRES_URL` and
//!   `IDEM_MYSQL_URL` with local defaults, their pools, fresh table names,
//!   and tables dropped when a test ends;
//! - [`broker`]: RabbitMQ, from `IDEM_AMQP_URL`, and a queue per test;
//! - [`namespace`]: a SQLite file, a PostgreSQL schema or a MariaDB/MySQL
//!   database of a test's own;
//! - [`backend`]: fresh stores, pools and namespaces, one module per
//!   backend, all alike;
//! - [`http`]: a real server on 127.0.0.1 and a real client;
//! - [`own_redis`]: Redis servers a test starts, kills and promotes;
//! - [`kafka`]: the Kafka-protocol broker, and a topic per test;
//! - [`backends!`]: a test body, written once, run on each backend.
//!
//! A test that cannot reach its server fails with a message naming the
//! variable that points at it; it never passes silently.
#![allow(dead_code, unused_macros)]

pub mod backend;
pub mod broker;
pub mod http;
#[cfg(feature = "kafka")]
pub mod kafka;
pub mod namespace;
#[cfg(feature = "redis")]
pub mod own_redis;
#[cfg(feature = "redis")]
pub mod redis;
pub mod servers;

use std::sync::atomic::{AtomicUsize, Ordering};
use std::sync::Arc;

/// Counts body runs, shared by clones; each run gets its number.
#[derive(Clone, Debug, Default)]
pub struct Runs(Arc<AtomicUsize>);

impl Runs {
    /// Counts one more run, and returns its number (1 for the first).
    pub fn next(&self) -> usize {
        self.0.fetch_add(1, Ordering::SeqCst) + 1
    }

    /// How many runs were counted.
    pub fn count(&self) -> usize {
        self.0.load(Ordering::SeqCst)
    }
}

/// Runs a test body on each backend named (`memory`, `sqlite_file`,
/// `sqlite_memory`, `postgres`, `mysql`): for each, a module of that name,
/// compiled when the backend's feature is on, with the body in it. There
/// `backend` is the backend's module of [`backend`](crate::common::backend)
/// (`backend::store(4)`, `backend::Database`, `backend::if_server! {..}`),
/// and the test file's items are in scope.
///
/// ```ignore
/// common::backends!(memory, sqlite_file, postgres, mysql => {
///     #[tokio::test]
///     async fn replays() {
///         let (store, _guard) = backend::store(4).await;
///         // ...
///     }
/// });
/// ```
///
/// The second form runs cases, functions of the test file: one test per
/// case, with the attributes given, that awaits `runner(fixture, case)`.
///
/// ```ignore
/// common::backends!(sqlite_file, postgres =>
///     #[tokio::test(flavor = "multi_thread", worker_threads = 4)]
///     cases(on_store, backend::store(8)) { replay_is_identical, other_payload_is_422 }
/// );
/// ```
macro_rules! backends {
    ($($backend:ident),+ $(,)? => $body:tt) => {
        $( $crate::common::backends!(@module $backend $body); )+
    };
    (
        $($backend:ident),+ $(,)? =>
        $(#[$attr:meta])*
        cases($runner:path, $fixture:expr) { $($case:ident),* $(,)? }
    ) => {
        $crate::common::backends!($($backend),+ => {
            $crate::common::backends!(@cases { $(#[$attr])* } $runner, $fixture; $($case),*);
        });
    };
    (@cases $attrs:tt $runner:path, $fixture:expr; $($case:ident),*) => {
        $( $crate::common::backends!(@case $attrs $runner, $fixture, $case); )*
    };
    (@case { $(#[$attr:meta])* } $runner:path, $fixture:expr, $case:ident) => {
        $(#[$attr])*
        async fn $case() {
            $runner($fixture, super::$case).await;
        }
    };
    (@module memory $body:tt) => {
        $crate::common::backends!(@mod memory $body);
    };
    (@module sqlite_file $body:tt) => {
        #[cfg(feature = "sqlite")]
        $crate::common::backends!(@mod sqlite_file $body);
    };
    (@module sqlite_memory $body:tt) => {
        #[cfg(feature = "sqlite")]
        $crate::common::backends!(@mod sqlite_memory $body);
    };
    (@module postgres $body:tt) => {
        #[cfg(feature = "postgres")]
        $crate::common::backends!(@mod postgres $body);
    };
    (@module mysql $body:tt) => {
        #[cfg(feature = "mysql")]
        $crate::common::backends!(@mod mysql $body);
    };
    (@module redis $body:tt) => {
        #[cfg(feature = "redis")]
        $crate::common::backends!(@mod redis $body);
    };
    (@module redis_cluster $body:tt) => {
        #[cfg(feature = "redis")]
        $crate::common::backends!(@mod redis_cluster $body);
    };
    (@mod $backend:ident { $($item:item)* }) => {
        mod $backend {
            #[allow(unused_imports)]
            use super::*;
            #[allow(unused_imports)]
            use $crate::common::backend::$backend as backend;

            $($item)*
        }
    };
}

#[allow(unused_imports)]
pub(crate) use backends;

/// The name of a test for `--exact`, from its full path
/// (`concat!(module_path!(), "::name")`): the path without the crate. Tests
/// that start their own binary again in a child mode run themselves so.
pub fn test_name(path: &'static str) -> &'static str {
    path.split_once("::").map_or(path, |(_crate, test)| test)
}

/// A key no other run has used: `tag`, this process and the time in
/// nanoseconds.
pub fn fresh(tag: &str) -> String {
    format!(
        "{tag}-{}-{}",
        std::process::id(),
        std::time::SystemTime::now()
            .duration_since(std::time::UNIX_EPOCH)
            .unwrap()
            .as_nanos()
    )
}

/// Held by the tests that kill Redis servers and promote replicas
/// (`redis_failover`, `redis_own_servers`, `simulation::redis_failover`):
/// run side by side, each one's failover waited on the other's stopped
/// processes and lost its time bounds on a loaded machine.
#[allow(dead_code)]
pub static FAILOVERS: tokio::sync::Mutex<()> = tokio::sync::Mutex::const_new(());

/// The step journal of `store`, which the test's store keeps.
pub fn journal_of<S: idem::Store + ?Sized>(store: &S) -> &dyn idem::store::Journal {
    store
        .journal()
        .expect("the test's store keeps a step journal")
}

/// The journal request of step `seq`, `name`, by the attempt of `claim`
/// on the payload of `fingerprint`, kept `ttl`; a start in doubt is
/// adopted when `adopt` says so, at once (no settle window).
pub fn step_request<'a>(
    claim: &'a idem::record::Claim,
    (seq, name): (u32, &'a str),
    fingerprint: &'a idem::Fingerprint,
    ttl: std::time::Duration,
    adopt: bool,
) -> idem::journal::StepRequest<'a> {
    idem::journal::StepRequest {
        claim,
        seq,
        name,
        fingerprint,
        ttl,
        adopt,
        settle: std::time::Duration::ZERO,
    }
}
