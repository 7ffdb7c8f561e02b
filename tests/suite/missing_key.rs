//! A `None` key: refused by default (`missing_key = reject`), or, with
//! `missing_key = run`, the body runs without protection, every time, and
//! nothing is recorded. A key that is present but invalid is refused
//! either way, and a present key is protected as usual.

use std::sync::atomic::{AtomicU32, Ordering};

use idem::engine::MissingKey;
use idem::{idempotent, run, Call, Error, MemoryStore, SqliteStore};
use sqlx::{Sqlite, Transaction};

static REJECTED_RUNS: AtomicU32 = AtomicU32::new(0);
static UNPROTECTED_RUNS: AtomicU32 = AtomicU32::new(0);

#[idempotent(key = key, store = store, scope = "emails.default", missing_key = reject)]
async fn send_or_refuse(store: &MemoryStore, key: Option<String>, to: &str) -> Result<u32, Error> {
    Ok(REJECTED_RUNS.fetch_add(1, Ordering::SeqCst) + 1)
}

#[idempotent(key = key, store = store, scope = "emails.send", missing_key = run)]
async fn send_anyway(store: &MemoryStore, key: Option<&str>, to: &str) -> Result<u32, Error> {
    Ok(UNPROTECTED_RUNS.fetch_add(1, Ordering::SeqCst) + 1)
}

#[tokio::test]
async fn reject_refuses_a_missing_key_without_running_the_body() {
    let store = MemoryStore::new();
    let refused = send_or_refuse(&store, None, "ada@example.com").await;
    assert!(matches!(refused, Err(Error::MissingKey)), "{refused:?}");
    assert_eq!(REJECTED_RUNS.load(Ordering::SeqCst), 0);
    // A present key is protected: one run, then a replay.
    for _ in 0..2 {
        let sent = send_or_refuse(&store, Some("e-1".into()), "ada@example.com").await;
        assert_eq!(sent.unwrap(), 1);
    }
}

#[tokio::test]
async fn run_runs_the_body_every_time_and_records_nothing() {
    let store = MemoryStore::new();
    let first = send_anyway(&store, None, "ada@example.com").await.unwrap();
    let second = send_anyway(&store, None, "ada@example.com").await.unwrap();
    assert_eq!(second, first + 1, "a retry without a key runs again");
    assert_eq!(store.len(), 0, "nothing was claimed or recorded");

    // With a key, the same function is protected.
    let keyed = send_anyway(&store, Some("e-2"), "ada@example.com")
        .await
        .unwrap();
    let replayed = send_anyway(&store, Some("e-2"), "ada@example.com")
        .await
        .unwrap();
    assert_eq!(replayed, keyed);
    assert_eq!(store.len(), 1);

    // An invalid key is not a missing one: refused.
    let invalid = send_anyway(&store, Some("has space"), "ada@example.com").await;
    assert!(matches!(invalid, Err(Error::InvalidKey(_))), "{invalid:?}");
}

#[tokio::test]
async fn the_call_says_what_a_missing_key_does() {
    let store = MemoryStore::new();
    let none: Option<String> = None;
    let refused: Result<u32, Error> = run(
        &store,
        Call::new("jobs.nightly", &none, &()).on_missing_key(MissingKey::Reject),
        async { Ok(1) },
    )
    .await;
    assert!(matches!(refused, Err(Error::MissingKey)));
    let ran: Result<u32, Error> = run(
        &store,
        Call::new("jobs.nightly", &none, &()).on_missing_key(MissingKey::Run),
        async { Ok(2) },
    )
    .await;
    assert_eq!(ran.unwrap(), 2);
    assert_eq!(store.len(), 0);
}

struct Orders {
    store: SqliteStore,
}

impl Orders {
    #[idempotent(key = key, store = self.store, scope = "orders.create", tx = tx, missing_key = run)]
    async fn create(
        &self,
        tx: &mut Transaction<'_, Sqlite>,
        key: Option<&str>,
        item: &str,
    ) -> Result<i64, Error> {
        let id = sqlx::query_scalar("INSERT INTO orders (item) VALUES (?) RETURNING id")
            .bind(item)
            .fetch_one(&mut **tx)
            .await
            .map_err(Error::from)?;
        Ok(id)
    }
}

#[tokio::test]
async fn run_in_transactional_mode_writes_only_the_body_rows() {
    let store = SqliteStore::connect("sqlite::memory:").await.unwrap();
    sqlx::query("CREATE TABLE orders (id INTEGER PRIMARY KEY, item TEXT NOT NULL)")
        .execute(store.pool())
        .await
        .unwrap();
    let orders = Orders {
        store: store.clone(),
    };
    let mut ids = Vec::new();
    for _ in 0..2 {
        let mut tx = store.pool().begin().await.unwrap();
        ids.push(orders.create(&mut tx, None, "widget").await.unwrap());
        tx.commit().await.unwrap();
    }
    assert_eq!(ids, [1, 2], "without a key, each call inserts");
    let records: i64 = sqlx::query_scalar("SELECT COUNT(*) FROM idem_records")
        .fetch_one(store.pool())
        .await
        .unwrap();
    assert_eq!(records, 0);
}
