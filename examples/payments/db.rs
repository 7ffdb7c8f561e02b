//! The database: chosen by URL at start, one pool for the business tables,
//! another for the idempotency layer's records, and the schema.
//!
//! The service is generic over the database ([`Payments<DB>`]); this
//! module picks the one the URL names and answers the few reads the API
//! needs, in that database's SQL.

use std::borrow::Cow;
use std::str::FromStr;
use std::sync::{Arc, Mutex};
use std::time::Duration;

use idem::Store;
use sqlx::sqlite::{SqliteConnectOptions, SqlitePoolOptions};

use super::gateway::{Gateway, Ledger};
use super::model::{NewPayment, Payment, PaymentIntent, Subscription};
use super::service::{NewIntent, Payments, ServiceError};

/// The service on the database the URL names.
pub enum Backend {
    Sqlite(Payments<sqlx::Sqlite>),
    #[cfg(feature = "postgres")]
    Postgres(Payments<sqlx::Postgres>),
    #[cfg(feature = "mysql")]
    MySql(Payments<sqlx::MySql>),
}

/// Runs `$body` with `$service` bound to the [`Payments`] of whichever
/// database this is, and `$sql` to a function that turns the PostgreSQL
/// placeholders of a statement (`$1`) into this database's.
macro_rules! on_backend {
    ($backend:expr, |$service:ident, $sql:ident| $body:expr) => {
        match $backend {
            Backend::Sqlite($service) => {
                // SQLite reads `$1` as PostgreSQL does.
                let $sql = |sql: &'static str| Cow::Borrowed(sql);
                $body
            }
            #[cfg(feature = "postgres")]
            Backend::Postgres($service) => {
                let $sql = |sql: &'static str| Cow::Borrowed(sql);
                $body
            }
            #[cfg(feature = "mysql")]
            Backend::MySql($service) => {
                let $sql = mysql_params;
                $body
            }
        }
    };
}

/// A statement with PostgreSQL placeholders (`$1`, `$2`, ...) in MySQL's
/// (`?`), for statements that bind each parameter once, in order.
#[cfg(feature = "mysql")]
pub fn mysql_params(sql: &'static str) -> Cow<'static, str> {
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

/// What a database looks like to the rest of the app.
pub struct Database {
    pub backend: Backend,
    /// The HTTP layer's records (`idem_records`), on the same database.
    pub store: Arc<dyn Store>,
    /// `SQLite payments.db`, for the banner.
    pub description: String,
}

#[derive(Debug, thiserror::Error)]
pub enum ConnectError {
    #[error("cannot open {url}: {source}")]
    Sqlx { url: String, source: sqlx::Error },
    #[error("cannot set up the idempotency store on {url}: {source}")]
    Store { url: String, source: idem::Error },
    #[cfg(not(all(feature = "postgres", feature = "mysql")))]
    #[error(
        "{url} is a {name} URL, but this build has no {name} support: \
         run it with `--features {feature}`"
    )]
    NotBuilt {
        url: String,
        name: &'static str,
        feature: &'static str,
    },
    #[error("unsupported database URL {0}: use sqlite://<file>, postgres://... or mysql://...")]
    Unsupported(String),
}

/// Opens the database at `url`, creating the tables if missing.
pub async fn connect(
    url: &str,
    latency: Duration,
    failure_rate: f64,
) -> Result<Database, ConnectError> {
    let sqlx_err = |source| ConnectError::Sqlx {
        url: url.to_owned(),
        source,
    };
    let store_err = |source| ConnectError::Store {
        url: url.to_owned(),
        source,
    };
    let gateway = |ledger| {
        Arc::new(Gateway {
            latency,
            failure_rate,
            ledger,
        })
    };
    if url.starts_with("sqlite:") {
        let options = SqliteConnectOptions::from_str(url)
            .map_err(sqlx_err)?
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
            .map_err(sqlx_err)?;
        sqlx::raw_sql(SQLITE_SCHEMA)
            .execute(&pool)
            .await
            .map_err(sqlx_err)?;
        let store = idem::SqliteStore::new(pool.clone());
        store.migrate().await.map_err(store_err)?;
        let path = url
            .trim_start_matches("sqlite:")
            .trim_start_matches("//")
            .split('?')
            .next()
            .unwrap_or_default();
        return Ok(Database {
            backend: Backend::Sqlite(Payments::new(
                pool,
                gateway(Ledger::Memory(Mutex::default())),
            )),
            store: Arc::new(store),
            description: format!("SQLite {path}"),
        });
    }
    if url.starts_with("postgres:") || url.starts_with("postgresql:") {
        #[cfg(feature = "postgres")]
        {
            let pool = sqlx::postgres::PgPoolOptions::new()
                .max_connections(16)
                .connect(url)
                .await
                .map_err(sqlx_err)?;
            // Instances starting together create the tables one at a time.
            let mut tx = pool.begin().await.map_err(sqlx_err)?;
            sqlx::query("SELECT pg_advisory_xact_lock(7277067367367726)")
                .execute(&mut *tx)
                .await
                .map_err(sqlx_err)?;
            sqlx::raw_sql(POSTGRES_SCHEMA)
                .execute(&mut *tx)
                .await
                .map_err(sqlx_err)?;
            tx.commit().await.map_err(sqlx_err)?;
            let store = idem::PostgresStore::connect(url).await.map_err(store_err)?;
            // The ledger gets a pool of its own: a charge is recorded while
            // the payment's call holds a connection of the main pool.
            let ledger = sqlx::postgres::PgPoolOptions::new()
                .max_connections(8)
                .connect(url)
                .await
                .map_err(sqlx_err)?;
            return Ok(Database {
                backend: Backend::Postgres(Payments::new(pool, gateway(Ledger::Postgres(ledger)))),
                store: Arc::new(store),
                description: "PostgreSQL".to_owned(),
            });
        }
        #[cfg(not(feature = "postgres"))]
        return Err(ConnectError::NotBuilt {
            url: url.to_owned(),
            name: "PostgreSQL",
            feature: "postgres",
        });
    }
    if url.starts_with("mysql:") || url.starts_with("mariadb:") {
        #[cfg(feature = "mysql")]
        {
            let url = url.replacen("mariadb:", "mysql:", 1);
            let url = url.as_str();
            let pool = sqlx::mysql::MySqlPoolOptions::new()
                .max_connections(16)
                .connect(url)
                .await
                .map_err(sqlx_err)?;
            let mut conn = pool.acquire().await.map_err(sqlx_err)?;
            sqlx::query("SELECT GET_LOCK('payments-schema', 60)")
                .execute(&mut *conn)
                .await
                .map_err(sqlx_err)?;
            let created = sqlx::raw_sql(MYSQL_SCHEMA).execute(&mut *conn).await;
            sqlx::query("SELECT RELEASE_LOCK('payments-schema')")
                .execute(&mut *conn)
                .await
                .map_err(sqlx_err)?;
            created.map_err(sqlx_err)?;
            drop(conn);
            let store = idem::MySqlStore::connect(url).await.map_err(store_err)?;
            let ledger = sqlx::mysql::MySqlPoolOptions::new()
                .max_connections(8)
                .connect(url)
                .await
                .map_err(sqlx_err)?;
            return Ok(Database {
                backend: Backend::MySql(Payments::new(pool, gateway(Ledger::MySql(ledger)))),
                store: Arc::new(store),
                description: "MySQL/MariaDB".to_owned(),
            });
        }
        #[cfg(not(feature = "mysql"))]
        return Err(ConnectError::NotBuilt {
            url: url.to_owned(),
            name: "MySQL/MariaDB",
            feature: "mysql",
        });
    }
    Err(ConnectError::Unsupported(url.to_owned()))
}

impl Backend {
    pub fn gateway(&self) -> &Gateway {
        on_backend!(self, |service, _sql| &service.gateway)
    }

    pub async fn create(&self, command: &NewPayment) -> Result<Payment, ServiceError> {
        on_backend!(self, |service, _sql| service.create(command).await)
    }

    pub async fn create_intent(&self, command: &NewIntent) -> Result<PaymentIntent, ServiceError> {
        on_backend!(self, |service, _sql| service.create_intent(command).await)
    }

    pub async fn put_subscription(
        &self,
        subscription: &Subscription,
    ) -> Result<Subscription, ServiceError> {
        on_backend!(self, |service, _sql| service
            .put_subscription(subscription)
            .await)
    }

    pub async fn payment(&self, id: &str) -> Result<Option<Payment>, ServiceError> {
        const SQL: &str = "SELECT * FROM payments WHERE id = $1";
        Ok(on_backend!(self, |service, sql| sqlx::query_as(&sql(SQL))
            .bind(id)
            .fetch_optional(&service.pool)
            .await?))
    }

    /// The number of payments, and the latest `limit`, newest first.
    pub async fn payments(&self, limit: i64) -> Result<(i64, Vec<Payment>), ServiceError> {
        const COUNT: &str = "SELECT COUNT(*) FROM payments";
        const LATEST: &str = "SELECT * FROM payments ORDER BY seq DESC LIMIT $1";
        Ok(on_backend!(self, |service, sql| {
            let count: i64 = sqlx::query_scalar(COUNT).fetch_one(&service.pool).await?;
            let latest = sqlx::query_as(&sql(LATEST))
                .bind(limit)
                .fetch_all(&service.pool)
                .await?;
            (count, latest)
        }))
    }

    pub async fn subscription(&self, user_id: &str) -> Result<Option<Subscription>, ServiceError> {
        const SQL: &str = "SELECT * FROM subscriptions WHERE user_id = $1";
        Ok(on_backend!(self, |service, sql| sqlx::query_as(&sql(SQL))
            .bind(user_id)
            .fetch_optional(&service.pool)
            .await?))
    }

    pub async fn payment_intent(
        &self,
        account: &str,
        id: &str,
    ) -> Result<Option<PaymentIntent>, ServiceError> {
        const SQL: &str = "SELECT * FROM payment_intents WHERE id = $1 AND account = $2";
        Ok(on_backend!(self, |service, sql| sqlx::query_as(&sql(SQL))
            .bind(id)
            .bind(account)
            .fetch_optional(&service.pool)
            .await?))
    }
}

const SQLITE_SCHEMA: &str = "
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

#[cfg(feature = "postgres")]
const POSTGRES_SCHEMA: &str = "
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
";

/// Identifiers and tokens are ASCII. Not in a `_bin` collation: sqlx
/// reads such a column as bytes, not as a `String`.
#[cfg(feature = "mysql")]
const MYSQL_SCHEMA: &str = "
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
