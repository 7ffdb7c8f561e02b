//! The store conformance suite, instantiated per backend: every store must
//! pass the same cases.

mod servers;
mod suite;

use std::future::Future;

/// Emits one `#[tokio::test]` per case for a backend. `$make` is an async
/// block yielding `(store, guard)`; the guard keeps the backend's resources
/// (a temporary directory, a schema) alive for the test.
macro_rules! store_conformance {
    ($backend:ident, $make:expr) => {
        mod $backend {
            use super::*;
            store_conformance!(@cases $make;
                execute_once_then_replay,
                fingerprint_ignores_field_order,
                key_reused_with_other_payload,
                in_progress_duplicate_waits_then_replays,
                fail_fast_reports_in_progress,
                transient_error_released_then_retried,
                replayable_error_replayed,
                ttl_expiry_frees_the_key,
                purge_removes_only_expired,
                lease_takeover_fences_the_old_owner,
                zombie_completion_after_release_is_refused,
                purged_claim_cannot_touch_the_next_one,
                live_owner_keeps_its_claim,
                ttl_shorter_than_lease_keeps_the_claim,
                dropped_caller_hands_the_key_back,
                unbounded_wait_is_accepted,
                scopes_do_not_collide,
                invalid_keys_rejected,
                storm_runs_each_key_once,
            );
        }
    };
    (@cases $make:expr; $($case:ident),* $(,)?) => {$(
        #[tokio::test(flavor = "multi_thread", worker_threads = 4)]
        async fn $case() {
            let (store, _guard) = fixture($make).await;
            crate::suite::$case(store).await;
        }
    )*};
}

async fn fixture<S, G>(make: impl Future<Output = (S, G)>) -> (S, G) {
    make.await
}

store_conformance!(memory, async { (idem::MemoryStore::new(), ()) });

store_conformance!(sqlite_file, async {
    let dir = tempfile::tempdir().expect("a temporary directory");
    let url = format!("sqlite://{}", dir.path().join("idem.db").display());
    let store = idem::SqliteStore::connect(&url)
        .await
        .expect("open the SQLite file");
    (store, dir)
});

store_conformance!(sqlite_memory, async {
    let store = idem::SqliteStore::connect("sqlite::memory:")
        .await
        .expect("open an in-memory SQLite database");
    (store, ())
});

// Each case on a table of its own (dropped afterwards), so cases run in
// parallel and repeated runs never see each other's rows.
#[cfg(feature = "postgres")]
store_conformance!(postgres, async {
    let (store, db, guard) = servers::postgres_store(10).await;
    (store, (db, guard))
});

#[cfg(feature = "mysql")]
store_conformance!(mysql, async {
    let (store, db, guard) = servers::mysql_store(10).await;
    (store, (db, guard))
});
