//! PostgreSQL: the tables, including the gateway's ledger, so that every
//! instance of the app on one database counts into one ledger.

use std::sync::Arc;

use sqlx::postgres::PgPoolOptions;

use super::super::gateway::{Gateway, Ledger};
use super::super::service::Payments;
use super::{service_logging, Backend, ConnectError, Database};

/// Opens the PostgreSQL database at `url`, creating the tables if missing.
pub async fn open(
    url: &str,
    gateway: impl FnOnce(Ledger) -> Arc<Gateway>,
) -> Result<Database, ConnectError> {
    let options = service_logging(
        url.parse::<sqlx::postgres::PgConnectOptions>()
            .map_err(ConnectError::sqlx(url))?,
    );
    let pool = PgPoolOptions::new()
        .max_connections(16)
        .connect_with(options.clone())
        .await
        .map_err(ConnectError::sqlx(url))?;
    // Instances starting together create the tables one at a time.
    let mut tx = pool.begin().await.map_err(ConnectError::sqlx(url))?;
    sqlx::query("SELECT pg_advisory_xact_lock(7277067367367726)")
        .execute(&mut *tx)
        .await
        .map_err(ConnectError::sqlx(url))?;
    sqlx::raw_sql(SCHEMA)
        .execute(&mut *tx)
        .await
        .map_err(ConnectError::sqlx(url))?;
    tx.commit().await.map_err(ConnectError::sqlx(url))?;
    let store = idem::PostgresStore::connect(url)
        .await
        .map_err(ConnectError::store(url))?;
    // The ledger gets a pool of its own: a charge is recorded while the
    // payment's call holds a connection of the main pool.
    let ledger = PgPoolOptions::new()
        .max_connections(8)
        .connect_with(options.clone())
        .await
        .map_err(ConnectError::sqlx(url))?;
    Ok(Database {
        backend: Backend::Postgres(Payments::new(pool, gateway(Ledger::Postgres(ledger)))),
        store: Arc::new(store),
        description: "PostgreSQL".to_owned(),
    })
}

const SCHEMA: &str = "
CREATE TABLE IF NOT EXISTS payments (
    seq BIGINT GENERATED ALWAYS AS IDENTITY PRIMARY KEY,
    id TEXT NOT NULL UNIQUE,
    idempotency_token TEXT NOT NULL UNIQUE,
    request_hash TEXT,
    amount BIGINT NOT NULL,
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
    seq BIGINT GENERATED ALWAYS AS IDENTITY PRIMARY KEY,
    id TEXT NOT NULL UNIQUE,
    idempotency_token TEXT NOT NULL UNIQUE,
    request_hash TEXT,
    account TEXT NOT NULL,
    amount BIGINT NOT NULL,
    currency TEXT NOT NULL,
    payment_method TEXT,
    status TEXT NOT NULL,
    latest_charge TEXT,
    created BIGINT NOT NULL
);
CREATE TABLE IF NOT EXISTS gateway_charges (
    seq BIGINT GENERATED ALWAYS AS IDENTITY PRIMARY KEY,
    id TEXT NOT NULL UNIQUE,
    reference TEXT NOT NULL,
    amount BIGINT NOT NULL,
    currency TEXT NOT NULL,
    card TEXT NOT NULL,
    status TEXT NOT NULL,
    created_at TEXT NOT NULL
);
-- The gateway's idempotency keys, kept with their charges: UNIQUE, so that
-- two requests with one key charge once; NULL once the key is forgotten.
ALTER TABLE gateway_charges ADD COLUMN IF NOT EXISTS idempotency_key TEXT UNIQUE;
ALTER TABLE gateway_charges ADD COLUMN IF NOT EXISTS request_hash TEXT;
ALTER TABLE gateway_charges ADD COLUMN IF NOT EXISTS key_expires_at BIGINT;
";
