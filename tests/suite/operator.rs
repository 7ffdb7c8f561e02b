//! What an operator (or a test suite) does beside the flow:
//!
//! (`Store::forget` on every store is in the conformance suite,
//! `idem::testing`.)
//!
//! - `with_migrations_table` keeps the migration bookkeeping where it is
//!   told to;
//! - `PassThroughStore` records nothing, so every call runs;
//! - `examples/idem_admin.rs` inspects, forgets and purges from a URL.

use std::sync::atomic::{AtomicU32, Ordering};
use std::sync::Arc;

use idem::engine::{run, Call};
use idem::{Error, Key};
use idem::{PassThroughStore, Scope, SqliteStore, Store};

use crate::common;

#[path = "../../examples/idem_admin.rs"]
#[allow(dead_code)] // its `main` is the example's, not this test's
mod idem_admin;

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
        ["billing_migrations", "idem_records", "idem_records_steps"]
    );
    let versions: i64 = sqlx::query_scalar("SELECT COUNT(*) FROM billing_migrations")
        .fetch_one(store.pool())
        .await
        .unwrap();
    assert_eq!(versions, 3, "every version recorded once");
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
    assert_eq!(recorded, 4);
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

#[tokio::test]
async fn admin_inspects_forgets_and_purges_by_url() {
    let dir = tempfile::tempdir().unwrap();
    let url = format!("sqlite://{}", dir.path().join("admin.db").display());
    let store = SqliteStore::connect(&url).await.unwrap();
    let runs = AtomicU32::new(0);
    charge(&store, "order-42", &runs).await;
    let admin = |words: &[&str]| {
        let mut args = vec![url.clone()];
        args.extend(words.iter().map(|w| w.to_string()));
        async move { idem_admin::admin(&args).await }
    };
    let report = admin(&["inspect", "operator::charge", "order-42"])
        .await
        .unwrap();
    assert!(report.contains("state        completed"), "{report}");
    assert!(report.contains("outcome      Ok: 1"), "{report}");
    let report = admin(&["forget", "operator::charge", "order-42"])
        .await
        .unwrap();
    assert!(report.starts_with("forgot key order-42"), "{report}");
    let report = admin(&["inspect", "operator::charge", "order-42"])
        .await
        .unwrap();
    assert!(report.starts_with("no record"), "{report}");
    assert_eq!(
        charge(&store, "order-42", &runs).await,
        2,
        "the key runs again"
    );
    let report = admin(&["purge"]).await.unwrap();
    assert_eq!(report, "purged 0 expired records");
    // Mistakes are explained, never panics.
    assert!(admin(&["inspect", "scope"])
        .await
        .unwrap_err()
        .starts_with("usage"));
    assert!(admin(&["forget", "s", "bad key"])
        .await
        .unwrap_err()
        .contains("invalid key"));
    let other = idem_admin::admin(&["redis://x".into(), "purge".into()]).await;
    assert!(other.unwrap_err().contains("unsupported URL"));
}
