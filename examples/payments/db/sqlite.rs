//! SQLite: the default, a file (`payments.db`) or an in-memory database;
//! the gateway's ledger, and the idempotency keys it keeps, live in the
//! process.

use std::str::FromStr;
use std::sync::Arc;
use std::time::Duration;

use sqlx::sqlite::{SqliteConnectOptions, SqlitePoolOptions};

use super::super::gateway::{Gateway, Ledger};
use super::super::service::Payments;
use super::{service_logging, Backend, ConnectError, Database};

/// Opens the SQLite database at `url`, creating the file and the tables
/// if missing.
pub async fn open(
    url: &str,
    gateway: impl FnOnce(Ledger) -> Arc<Gateway>,
) -> Result<Database, ConnectError> {
    let options =
        service_logging(SqliteConnectOptions::from_str(url).map_err(ConnectError::sqlx(url))?)
            .create_if_missing(true)
            .busy_timeout(Duration::from_secs(10));
    // One connection keeps an in-memory database alive and shared.
    let in_memory = url.contains(":memory:") || url.contains("mode=memory");
    let pool = SqlitePoolOptions::new()
        .max_connections(if in_memory { 1 } else { 8 })
        .min_connections(u32::from(in_memory))
        .idle_timeout(None)
        .max_lifetime(None)
        .connect_with(options)
        .await
        .map_err(ConnectError::sqlx(url))?;
    sqlx::raw_sql(SCHEMA)
        .execute(&pool)
        .await
        .map_err(ConnectError::sqlx(url))?;
    let store = idem::SqliteStore::new(pool.clone());
    store.migrate().await.map_err(ConnectError::store(url))?;
    let path = url
        .trim_start_matches("sqlite:")
        .trim_start_matches("//")
        .split('?')
        .next()
        .unwrap_or_default();
    Ok(Database {
        backend: Backend::Sqlite(Payments::new(pool, gateway(Ledger::memory()))),
        store: Arc::new(store),
        description: format!("SQLite {path}"),
    })
}

const SCHEMA: &str = "
CREATE TABLE IF NOT EXISTS payments (
    seq INTEGER PRIMARY KEY AUTOINCREMENT,
    id TEXT NOT NULL UNIQUE,
    idempotency_token TEXT NOT NULL UNIQUE,
    request_hash TEXT,
    amount INTEGER NOT NULL,
    currency TEXT NOT NULL,
    status TEXT NOT NULL,
    card TEXT NOT NULL,
    description TEXT,
    charge_id TEXT NOT NULL,
    created_at TEXT NOT NULL
);
CREATE TABLE IF NOT EXISTS subscriptions (
    user_id TEXT PRIMARY KEY,
    plan TEXT NOT NULL
);
CREATE TABLE IF NOT EXISTS payment_intents (
    seq INTEGER PRIMARY KEY AUTOINCREMENT,
    id TEXT NOT NULL UNIQUE,
    idempotency_token TEXT NOT NULL UNIQUE,
    request_hash TEXT,
    account TEXT NOT NULL,
    amount INTEGER NOT NULL,
    currency TEXT NOT NULL,
    payment_method TEXT,
    status TEXT NOT NULL,
    latest_charge TEXT,
    created INTEGER NOT NULL
);
";
