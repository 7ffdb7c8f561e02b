//! MySQL and MariaDB: the tables, including the gateway's ledger, and the
//! statements' placeholders in MySQL's form.

use std::borrow::Cow;
use std::sync::Arc;

use sqlx::mysql::MySqlPoolOptions;

use super::super::gateway::{Gateway, Ledger};
use super::super::service::Payments;
use super::{service_logging, Backend, ConnectError, Database};

/// Opens the MySQL or MariaDB database at `url` (`mysql://` or
/// `mariadb://`), creating the tables if missing.
pub async fn open(
    url: &str,
    gateway: impl FnOnce(Ledger) -> Arc<Gateway>,
) -> Result<Database, ConnectError> {
    let url = url.replacen("mariadb:", "mysql:", 1);
    let url = url.as_str();
    let options = service_logging(
        url.parse::<sqlx::mysql::MySqlConnectOptions>()
            .map_err(ConnectError::sqlx(url))?,
    );
    let pool = MySqlPoolOptions::new()
        .max_connections(16)
        .connect_with(options.clone())
        .await
        .map_err(ConnectError::sqlx(url))?;
    // Instances starting together create the tables one at a time.
    let mut conn = pool.acquire().await.map_err(ConnectError::sqlx(url))?;
    sqlx::query("SELECT GET_LOCK('payments-schema', 60)")
        .execute(&mut *conn)
        .await
        .map_err(ConnectError::sqlx(url))?;
    let created = async {
        sqlx::raw_sql(SCHEMA).execute(&mut *conn).await?;
        let keys: i64 = sqlx::query_scalar(KEYS_ADDED).fetch_one(&mut *conn).await?;
        if keys == 0 {
            sqlx::raw_sql(ADD_KEYS).execute(&mut *conn).await?;
        }
        Ok::<_, sqlx::Error>(())
    }
    .await;
    sqlx::query("SELECT RELEASE_LOCK('payments-schema')")
        .execute(&mut *conn)
        .await
        .map_err(ConnectError::sqlx(url))?;
    created.map_err(ConnectError::sqlx(url))?;
    drop(conn);
    let store = idem::MySqlStore::connect(url)
        .await
        .map_err(ConnectError::store(url))?;
    let ledger = MySqlPoolOptions::new()
        .max_connections(8)
        .connect_with(options.clone())
        .await
        .map_err(ConnectError::sqlx(url))?;
    Ok(Database {
        backend: Backend::MySql(Payments::new(pool, gateway(Ledger::MySql(ledger)))),
        store: Arc::new(store),
        description: "MySQL/MariaDB".to_owned(),
    })
}

/// A statement with PostgreSQL placeholders (`$1`, `$2`, ...) in MySQL's
/// (`?`), for statements that bind each parameter once, in order.
pub fn params(sql: &'static str) -> Cow<'static, str> {
    let mut out = String::with_capacity(sql.len());
    let mut chars = sql.chars().peekable();
    while let Some(c) = chars.next() {
        if c == '$' && chars.peek().is_some_and(char::is_ascii_digit) {
            while chars.peek().is_some_and(char::is_ascii_digit) {
                chars.next();
            }
            out.push('?');
        } else {
            out.push(c);
        }
    }
    Cow::Owned(out)
}

/// Identifiers and tokens are ASCII. Not in a `_bin` collation: sqlx
/// reads such a column as bytes, not as a `String`.
const SCHEMA: &str = "
CREATE TABLE IF NOT EXISTS payments (
    seq BIGINT AUTO_INCREMENT PRIMARY KEY,
    id VARCHAR(64) CHARACTER SET ascii NOT NULL UNIQUE,
    idempotency_token VARCHAR(255) CHARACTER SET ascii NOT NULL UNIQUE,
    request_hash CHAR(64) CHARACTER SET ascii,
    amount BIGINT NOT NULL,
    currency CHAR(3) NOT NULL,
    status VARCHAR(32) NOT NULL,
    card VARCHAR(32) NOT NULL,
    description TEXT,
    charge_id VARCHAR(64) NOT NULL,
    created_at VARCHAR(32) NOT NULL
) ENGINE = InnoDB;
CREATE TABLE IF NOT EXISTS subscriptions (
    user_id VARCHAR(255) PRIMARY KEY,
    plan VARCHAR(64) NOT NULL
) ENGINE = InnoDB;
CREATE TABLE IF NOT EXISTS payment_intents (
    seq BIGINT AUTO_INCREMENT PRIMARY KEY,
    id VARCHAR(64) CHARACTER SET ascii NOT NULL UNIQUE,
    idempotency_token VARCHAR(255) CHARACTER SET ascii NOT NULL UNIQUE,
    request_hash CHAR(64) CHARACTER SET ascii,
    account VARCHAR(64) CHARACTER SET ascii NOT NULL,
    amount BIGINT NOT NULL,
    currency CHAR(3) NOT NULL,
    payment_method VARCHAR(255),
    status VARCHAR(32) NOT NULL,
    latest_charge VARCHAR(64),
    created BIGINT NOT NULL
) ENGINE = InnoDB;
CREATE TABLE IF NOT EXISTS gateway_charges (
    seq BIGINT AUTO_INCREMENT PRIMARY KEY,
    id VARCHAR(64) CHARACTER SET ascii NOT NULL UNIQUE,
    reference VARCHAR(255) CHARACTER SET ascii NOT NULL,
    amount BIGINT NOT NULL,
    currency CHAR(3) NOT NULL,
    card VARCHAR(32) NOT NULL,
    status VARCHAR(32) NOT NULL,
    created_at VARCHAR(32) NOT NULL
) ENGINE = InnoDB;
";

/// The gateway's idempotency keys, kept with their charges: UNIQUE, so that
/// two requests with one key charge once; NULL once the key is forgotten.
/// Added to a ledger that has none ([`KEYS_ADDED`] says whether it has).
const ADD_KEYS: &str = "
ALTER TABLE gateway_charges
    ADD COLUMN idempotency_key VARCHAR(255) CHARACTER SET ascii UNIQUE,
    ADD COLUMN request_hash CHAR(64) CHARACTER SET ascii,
    ADD COLUMN key_expires_at BIGINT;
";
const KEYS_ADDED: &str = "SELECT COUNT(*) FROM information_schema.COLUMNS \
    WHERE TABLE_SCHEMA = DATABASE() AND TABLE_NAME = 'gateway_charges' \
    AND COLUMN_NAME = 'idempotency_key'";
