//! What an operator (or a test suite) does beside the flow:
//!
//! (`Store::forget` on every store is in the conformance suite,
//! `idem::testing`.)
//!
//! - `with_migrations_table` keeps the migration bookkeeping where it is
//!   told to;
//! - `PassThroughStore` records nothing, so every call runs;
//! - `admin::Inventory` finds a key in every scope, counts records and
//!   reports a purge's progress (the `idem` tool, idem-cli, is tested
//!   through its binary in its own crate).

use std::sync::atomic::{AtomicU32, Ordering};
use std::sync::Arc;

use idem::engine::{run, Call};
use idem::{Error, Key};
use idem::{PassThroughStore, Scope, SqliteStore, Store};

use crate::common;

use common::servers::{unique_table, DropTables, Server};

/// Runs `key` once through the engine, counting body runs in `runs`.
async fn charge<S: Store + ?Sized>(store: &S, key: &str, runs: &AtomicU32) -> u32 {
    let call = Call::new("operator::charge", key, &500u32);
    run(store, call, async {
        Ok::<_, Error>(runs.fetch_add(1, Ordering::SeqCst) + 1)
    })
    .await
    .expect("the call succeeds")
}

#[tokio::test]
async fn sqlite_migrations_table_is_the_one_named() {
    let store = SqliteStore::new(
        sqlx::sqlite::SqlitePoolOptions::new()
            .max_connections(1)
            .connect("sqlite::memory:")
            .await
            .unwrap(),
    )
    .with_migrations_table("billing_migrations")
    .unwrap();
    store.migrate().await.unwrap();
    store.migrate().await.unwrap();
    let tables: Vec<String> =
        sqlx::query_scalar("SELECT name FROM sqlite_master WHERE type = 'table' ORDER BY name")
            .fetch_all(store.pool())
            .await
            .unwrap();
    assert_eq!(
        tables,
        [
            "billing_migrations",
            "idem_records",
            "idem_records_outbox",
            "idem_records_steps",
            // The outbox's `seq` is AUTOINCREMENT: never reused.
            "sqlite_sequence",
        ]
    );
    let versions: i64 = sqlx::query_scalar("SELECT COUNT(*) FROM billing_migrations")
        .fetch_one(store.pool())
        .await
        .unwrap();
    assert_eq!(versions, 5, "every version recorded once");
    assert!(SqliteStore::new(store.pool().clone())
        .with_migrations_table("bad name")
        .is_err());
}

#[tokio::test]
async fn postgres_migrations_table_is_the_one_named() {
    let pool = sqlx::postgres::PgPoolOptions::new()
        .max_connections(2)
        .connect(&Server::Postgres.url())
        .await
        .expect("PostgreSQL (IDEM_POSTGRES_URL) answers");
    let mut guard = DropTables::new(Server::Postgres);
    let records = guard.add(unique_table("mig"));
    let bookkeeping = guard.add(unique_table("book"));
    let store = idem::PostgresStore::new(pool.clone())
        .with_table_name(&records)
        .unwrap()
        .with_migrations_table(&bookkeeping)
        .unwrap();
    store.migrate().await.unwrap();
    let recorded: i64 = sqlx::query_scalar(&format!(
        "SELECT COUNT(*) FROM \"{bookkeeping}\" WHERE table_name = $1"
    ))
    .bind(&records)
    .fetch_one(&pool)
    .await
    .unwrap();
    // One row per migration of the records table.
    assert_eq!(recorded, 6);
    let in_default: i64 = sqlx::query_scalar(
        "SELECT COUNT(*) FROM pg_class WHERE oid = to_regclass('idem_migrations')",
    )
    .fetch_one(&pool)
    .await
    .unwrap();
    if in_default > 0 {
        let shared: i64 =
            sqlx::query_scalar("SELECT COUNT(*) FROM idem_migrations WHERE table_name = $1")
                .bind(&records)
                .fetch_one(&pool)
                .await
                .unwrap();
        assert_eq!(shared, 0, "nothing recorded in the default table");
    }
}

#[tokio::test]
async fn pass_through_runs_every_call() {
    let runs = AtomicU32::new(0);
    let store = Arc::new(PassThroughStore);
    assert_eq!(charge(&*store, "k", &runs).await, 1);
    assert_eq!(charge(&*store, "k", &runs).await, 2);
    let scope = Scope::new("operator::charge");
    assert!(store
        .get(&scope, &Key::new("k").unwrap())
        .await
        .unwrap()
        .is_none());
    // Keys are still checked: a bad key is refused before the body.
    let refused = run(&*store, Call::new("operator::charge", "", &1u8), async {
        Ok::<_, Error>(0u32)
    })
    .await;
    assert!(matches!(refused, Err(Error::InvalidKey(_))));
}

/// A purge reports every batch it deleted, records then journal entries,
/// and the counts before it said how many were expired.
#[tokio::test]
async fn inventory_counts_finds_and_reports_a_purge() {
    use idem::admin::Inventory;
    use idem::Policy;
    use std::sync::Mutex;
    use std::time::Duration;

    let dir = tempfile::tempdir().unwrap();
    let url = format!("sqlite://{}", dir.path().join("inventory.db").display());
    let store = SqliteStore::connect(&url).await.unwrap();
    assert!(store.is_set_up().await.unwrap());
    let other = SqliteStore::new(store.pool().clone())
        .with_table_name("not_migrated")
        .unwrap();
    assert!(!other.is_set_up().await.unwrap());
    let runs = AtomicU32::new(0);
    charge(&store, "k1", &runs).await;
    run(&store, Call::new("operator::refund", "k1", &1u8), async {
        Ok::<_, Error>(1u8)
    })
    .await
    .unwrap();
    for i in 0..5 {
        let call = Call::new("operator::short", format!("s{i}").as_str(), &1u8)
            .with_policy(Policy::new().ttl(Duration::from_millis(1)));
        run(&store, call, async { Ok::<_, Error>(1u8) })
            .await
            .unwrap();
    }
    tokio::time::sleep(Duration::from_millis(20)).await;

    let found = store
        .records_with_key(&Key::new("k1").unwrap())
        .await
        .unwrap();
    let scopes: Vec<&str> = found.iter().map(|r| r.scope.as_str()).collect();
    assert_eq!(scopes, ["operator::charge", "operator::refund"]);
    let stats = store.stats().await.unwrap();
    let short = stats
        .scopes
        .iter()
        .find(|s| s.scope == "operator::short")
        .unwrap();
    assert_eq!((short.completed, short.expired), (5, 5));
    assert!(stats.oldest_in_progress.is_none());
    assert!((stats.now - store.now().await.unwrap()).abs() < 60_000);

    let reported = Mutex::new(Vec::new());
    let deleted = store
        .purge_expired_reporting(2, &|n| reported.lock().unwrap().push(n))
        .await
        .unwrap();
    assert_eq!(deleted, 5);
    // Two full batches, a last one of records, then one of the journal.
    assert_eq!(*reported.lock().unwrap(), [2, 2, 1, 0]);
    let after = store.stats().await.unwrap();
    assert!(after.scopes.iter().all(|s| s.scope != "operator::short"));
}
