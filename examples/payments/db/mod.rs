//! The database, chosen by URL at start: SQLite (the default), PostgreSQL
//! or MySQL/MariaDB, each opened in a file of its own ([`sqlite`],
//! [`postgres`], [`mysql`]) with its tables. One pool serves the business
//! tables and entity mode; the HTTP layer's records go to the same
//! database, or to Redis ([`idempotency_store`]).
//!
//! The operations are generic over the database
//! ([`Payments<DB>`](super::service::Payments)); [`Backend`] holds the
//! one the URL names and answers the few reads the API needs, in that
//! database's SQL.

#[cfg(feature = "mysql")]
pub mod mysql;
#[cfg(feature = "postgres")]
pub mod postgres;
pub mod sqlite;

use std::borrow::Cow;
use std::sync::Arc;
use std::time::Duration;

use idem::Store;

use super::gateway::Gateway;
use super::model::{NewIntent, NewPayment, Payment, PaymentIntent, Subscription};
use super::service::{Payments, ServiceError};

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
                let $sql = mysql::params;
                $body
            }
        }
    };
}

/// What a database looks like to the rest of the app.
pub struct Database {
    pub backend: Backend,
    /// The HTTP layer's records (`idem_records`), on the same database.
    pub store: Arc<dyn Store>,
    /// `SQLite payments.db`, for the banner.
    pub description: String,
}

/// The app's own pools log as the library's stores do: every statement
/// at TRACE, one slower than a second at INFO (sqlx's defaults, DEBUG and
/// WARN with the whole SQL, would fill a service's log at its default
/// level).
pub fn service_logging<O: sqlx::ConnectOptions>(options: O) -> O {
    options
        .log_statements(log::LevelFilter::Trace)
        .log_slow_statements(log::LevelFilter::Info, Duration::from_secs(1))
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
    #[error(
        "unsupported idempotency store URL {0}: use redis://HOST:PORT or \
         redis+cluster://HOST:PORT[,HOST:PORT...]"
    )]
    UnsupportedStore(String),
    #[cfg(not(feature = "redis"))]
    #[error(
        "{0} is a Redis URL, but this build has no Redis support: run it with `--features redis`"
    )]
    RedisNotBuilt(String),
}

impl ConnectError {
    /// Wraps a failure to open or set up the database at `url`.
    fn sqlx(url: &str) -> impl FnOnce(sqlx::Error) -> ConnectError + '_ {
        move |source| ConnectError::Sqlx {
            url: url.to_owned(),
            source,
        }
    }

    /// Wraps a failure to set up the idempotency store at `url`.
    fn store(url: &str) -> impl FnOnce(idem::Error) -> ConnectError + '_ {
        move |source| ConnectError::Store {
            url: url.to_owned(),
            source,
        }
    }
}

/// Opens the database at `url`, creating the tables if missing, with a
/// card gateway of this `latency` and `failure_rate`.
pub async fn connect(
    url: &str,
    latency: Duration,
    failure_rate: f64,
) -> Result<Database, ConnectError> {
    let gateway = |ledger| Arc::new(Gateway::new(latency, failure_rate, ledger));
    if url.starts_with("sqlite:") {
        return sqlite::open(url, gateway).await;
    }
    if url.starts_with("postgres:") || url.starts_with("postgresql:") {
        #[cfg(feature = "postgres")]
        return postgres::open(url, gateway).await;
        #[cfg(not(feature = "postgres"))]
        return Err(ConnectError::NotBuilt {
            url: url.to_owned(),
            name: "PostgreSQL",
            feature: "postgres",
        });
    }
    if url.starts_with("mysql:") || url.starts_with("mariadb:") {
        #[cfg(feature = "mysql")]
        return mysql::open(url, gateway).await;
        #[cfg(not(feature = "mysql"))]
        return Err(ConnectError::NotBuilt {
            url: url.to_owned(),
            name: "MySQL/MariaDB",
            feature: "mysql",
        });
    }
    Err(ConnectError::Unsupported(url.to_owned()))
}

/// The HTTP layer's store at `url`, when its records are not kept in the
/// database: `redis://HOST:PORT[/DB]` (a single Redis) or
/// `redis+cluster://HOST:PORT[,HOST:PORT...]` (a Redis Cluster, any of its
/// nodes), keyed under `payments`. Answers the store and its description
/// for the banner.
pub async fn idempotency_store(url: &str) -> Result<(Arc<dyn Store>, String), ConnectError> {
    let cluster = url.strip_prefix("redis+cluster://");
    if cluster.is_none() && !url.starts_with("redis://") {
        return Err(ConnectError::UnsupportedStore(url.to_owned()));
    }
    #[cfg(feature = "redis")]
    {
        let store = match cluster {
            Some(nodes) => {
                let nodes = nodes.split(',').map(|node| format!("redis://{node}"));
                idem::RedisStore::connect_cluster(nodes).await
            }
            None => idem::RedisStore::connect(url).await,
        };
        let store = store
            .and_then(|store| store.with_prefix("payments"))
            .map_err(ConnectError::store(url))?;
        let what = if cluster.is_some() {
            "Redis Cluster"
        } else {
            "Redis"
        };
        Ok((Arc::new(store), format!("{what} {url}")))
    }
    #[cfg(not(feature = "redis"))]
    Err(ConnectError::RedisNotBuilt(url.to_owned()))
}

/// The outbox's relay, to run on a task of its own.
pub type Relay = std::pin::Pin<Box<dyn std::future::Future<Output = ()> + Send>>;

impl Backend {
    pub fn gateway(&self) -> &Gateway {
        on_backend!(self, |service, _sql| &service.gateway)
    }

    /// Announces payments on `topic` from now on.
    pub fn set_events_topic(&mut self, topic: &str) {
        on_backend!(self, |service, _sql| service.events.topic =
            topic.to_owned())
    }

    /// The outbox's relay to the Kafka cluster at `brokers`.
    #[cfg(feature = "kafka")]
    pub fn relay(&self, brokers: &str) -> Result<Relay, idem::Error> {
        on_backend!(self, |service, _sql| {
            let relay = service.events.relay(brokers)?;
            Ok(Box::pin(async move { relay.run().await }))
        })
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
        Ok(on_backend!(self, |service, _sql| idem::entity::upsert(
            &service.pool,
            subscription,
            &["user_id"]
        )
        .await?))
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
