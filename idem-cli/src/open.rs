//! One `--url` for every store: the scheme picks it.
//!
//! | scheme | store |
//! |---|---|
//! | `sqlite:` | SQLite (the file must exist: nothing is created) |
//! | `postgres:`, `postgresql:` | PostgreSQL |
//! | `mysql:`, `mariadb:` | MySQL / MariaDB |
//! | `redis:` | a single Redis |
//! | `redis+cluster://host:port[,host:port...]` | a Redis Cluster, by any of its nodes |

use std::str::FromStr;
use std::time::Duration;

use idem::admin::{Inventory, ENTITY_CLAIMS_TABLE};
use idem::outbox::Outbox;
use idem::store::SqlStore;

use crate::failure::Failure;
use crate::outbox_admin::OutboxAdmin;

/// How long opening a store may take before it counts as unreachable.
const CONNECT_TIMEOUT: Duration = Duration::from_secs(10);

/// The stores one URL names.
pub(crate) struct Target {
    /// What the URL names, for messages: `PostgreSQL at <url>`.
    pub(crate) name: String,
    /// The records table (or Redis prefix) asked for: `None` when the SQL
    /// database has no such table.
    pub(crate) records: Option<Box<dyn Inventory>>,
    /// The table or prefix of `records`, for messages.
    pub(crate) records_at: String,
    /// Entity mode's claims (`idem_entity_claims`), where the database has
    /// them (SQL only).
    pub(crate) entity: Option<Box<dyn Inventory>>,
    /// Whether it is a SQL database (the outbox lives there only).
    pub(crate) sql: bool,
    /// The outbox beside the records table (SQL, where the records table
    /// exists).
    pub(crate) outbox: Option<Box<dyn OutboxAdmin>>,
}

impl Target {
    /// The store whose records are under `scope`: entity mode's claims
    /// for its scopes, the records table for the rest.
    pub(crate) fn store_for(&self, scope: &str) -> Option<&dyn Inventory> {
        if scope.starts_with(idem::admin::ENTITY_CLAIMS_SCOPE_PREFIX) {
            self.entity.as_deref()
        } else {
            self.records.as_deref()
        }
    }

    /// The stores there are, each with what it is called in output.
    pub(crate) fn stores(&self) -> Vec<(&'static str, &dyn Inventory)> {
        let mut stores = Vec::new();
        if let Some(records) = self.records.as_deref() {
            stores.push(("records", records));
        }
        if let Some(entity) = self.entity.as_deref() {
            stores.push(("entity_claims", entity));
        }
        stores
    }

    /// A message for a command that needs the records table.
    pub(crate) fn missing_records(&self) -> Failure {
        Failure::MissingTable(format!(
            "{} has no idem records table {}: name the application's with --table, or run its \
             migrate() first",
            self.name, self.records_at
        ))
    }
}

/// `url` with its password hidden, for messages.
pub(crate) fn redacted(url: &str) -> String {
    let Some((scheme, rest)) = url.split_once("://") else {
        return url.to_owned();
    };
    let (authority, tail) = match rest.find('/') {
        Some(at) => rest.split_at(at),
        None => (rest, ""),
    };
    match authority.rsplit_once('@') {
        Some((user, host)) => match user.split_once(':') {
            Some((user, _password)) => format!("{scheme}://{user}:***@{host}{tail}"),
            None => url.to_owned(),
        },
        None => url.to_owned(),
    }
}

/// Opens what `url` names, with the records table `table` (SQL) or the
/// key prefix `prefix` (Redis).
pub(crate) async fn open(
    url: &str,
    table: Option<&str>,
    prefix: Option<&str>,
) -> Result<Target, Failure> {
    let shown = redacted(url);
    let scheme = url.split_once(':').map(|(s, _)| s).unwrap_or_default();
    let sql = matches!(
        scheme,
        "sqlite" | "postgres" | "postgresql" | "mysql" | "mariadb"
    );
    let redis = matches!(scheme, "redis" | "redis+cluster");
    if sql && prefix.is_some() {
        return Err(Failure::Usage(
            "--prefix is for Redis; a SQL store's records are named by --table".into(),
        ));
    }
    if redis && table.is_some() {
        return Err(Failure::Usage(
            "--table is for SQL stores; Redis keys are named by --prefix".into(),
        ));
    }
    let table = table.unwrap_or("idem_records");
    let opened = tokio::time::timeout(CONNECT_TIMEOUT, async {
        match scheme {
            "sqlite" => open_sqlite(url, &shown, table).await,
            "postgres" | "postgresql" => {
                let options = sqlx::postgres::PgConnectOptions::from_str(url)
                    .map_err(|e| bad_url(&shown, e))?;
                // One attempt first: a pool retries a refused connection
                // until its timeout, and then no longer says why.
                let first =
                    <sqlx::postgres::PgConnection as sqlx::Connection>::connect_with(&options)
                        .await
                        .map_err(|e| unreachable(&format!("PostgreSQL at {shown}"), e))?;
                let pool = sqlx::postgres::PgPoolOptions::new()
                    .max_connections(2)
                    .acquire_timeout(CONNECT_TIMEOUT)
                    .connect_lazy_with(options);
                drop(first);
                sql_target(format!("PostgreSQL at {shown}"), pool, table).await
            }
            "mysql" | "mariadb" => {
                let url = url.replacen("mariadb:", "mysql:", 1);
                let options = sqlx::mysql::MySqlConnectOptions::from_str(&url)
                    .map_err(|e| bad_url(&shown, e))?;
                // One attempt first: a pool retries a refused connection
                // until its timeout, and then no longer says why.
                let first =
                    <sqlx::mysql::MySqlConnection as sqlx::Connection>::connect_with(&options)
                        .await
                        .map_err(|e| unreachable(&format!("MySQL at {shown}"), e))?;
                let pool = sqlx::mysql::MySqlPoolOptions::new()
                    .max_connections(2)
                    .acquire_timeout(CONNECT_TIMEOUT)
                    .connect_lazy_with(options);
                drop(first);
                sql_target(format!("MySQL at {shown}"), pool, table).await
            }
            "redis" | "redis+cluster" => open_redis(url, &shown, prefix).await,
            _ => Err(Failure::BadUrl(format!(
                "cannot tell the store from {shown:?}: the URL must begin with sqlite:, \
                 postgres:, mysql:, mariadb:, redis: or redis+cluster:"
            ))),
        }
    })
    .await;
    opened.unwrap_or_else(|_| {
        Err(Failure::Unreachable(format!(
            "{shown} did not answer within {} s: is the server up, and the host and port right?",
            CONNECT_TIMEOUT.as_secs()
        )))
    })
}

fn bad_url(shown: &str, err: impl std::fmt::Display) -> Failure {
    Failure::BadUrl(format!("invalid URL {shown}: {err}"))
}

fn unreachable(what: &str, err: sqlx::Error) -> Failure {
    match err {
        sqlx::Error::Configuration(err) => {
            Failure::BadUrl(format!("invalid URL for {what}: {err}"))
        }
        err => Failure::Unreachable(format!("cannot connect to {what}: {err}")),
    }
}

async fn open_sqlite(url: &str, shown: &str, table: &str) -> Result<Target, Failure> {
    let options = sqlx::sqlite::SqliteConnectOptions::from_str(url)
        .map_err(|e| bad_url(shown, e))?
        // An operator's typo must not leave an empty database behind.
        .create_if_missing(false)
        .busy_timeout(Duration::from_secs(5));
    let file = options.get_filename().to_owned();
    let memory = file.as_os_str().is_empty()
        || url.contains(":memory:")
        || url.contains("mode=memory")
        || file.to_string_lossy().contains(":memory:");
    if memory {
        return Err(Failure::BadUrl(format!(
            "{shown} is an in-memory database, which lives inside the process that opened it: \
             give the path of the application's database file"
        )));
    }
    if !file.exists() {
        return Err(Failure::Unreachable(format!(
            "no SQLite database at {}: check the path (relative paths start from {})",
            file.display(),
            std::env::current_dir()
                .map(|d| d.display().to_string())
                .unwrap_or_else(|_| "the current directory".into())
        )));
    }
    let pool = sqlx::sqlite::SqlitePoolOptions::new()
        .max_connections(1)
        .connect_with(options)
        .await
        .map_err(|e| unreachable(&format!("SQLite at {}", file.display()), e))?;
    sql_target(format!("SQLite at {}", file.display()), pool, table).await
}

/// The records table `table` and the entity claims of the database
/// behind `pool`, each only where it exists.
async fn sql_target<DB: idem::store::Backend>(
    name: String,
    pool: sqlx::Pool<DB>,
    table: &str,
) -> Result<Target, Failure>
where
    SqlStore<DB>: Inventory,
{
    let records = SqlStore::new(pool.clone())
        .with_table_name(table)
        .map_err(|e| Failure::Usage(format!("--table: {e}")))?;
    let records_exist = records
        .is_set_up()
        .await
        .map_err(|e| Failure::Unreachable(format!("cannot read {name}: {e}")))?;
    let entity = SqlStore::new(pool).with_table_name(ENTITY_CLAIMS_TABLE)?;
    let entity_exists = table != ENTITY_CLAIMS_TABLE && entity.is_set_up().await?;
    let outbox = records_exist.then(|| Box::new(Outbox::new(&records)) as Box<dyn OutboxAdmin>);
    let target = Target {
        name,
        records_at: format!("{table:?}"),
        records: records_exist.then(|| Box::new(records) as Box<dyn Inventory>),
        entity: entity_exists.then(|| Box::new(entity) as Box<dyn Inventory>),
        sql: true,
        outbox,
    };
    if target.records.is_none() && target.entity.is_none() {
        return Err(Failure::MissingTable(format!(
            "{} has neither the idem records table {} nor entity mode's {ENTITY_CLAIMS_TABLE:?}: \
             is this the application's database, and its table name the one given with --table?",
            target.name, target.records_at
        )));
    }
    Ok(target)
}

async fn open_redis(url: &str, shown: &str, prefix: Option<&str>) -> Result<Target, Failure> {
    let (store, name) = if let Some(nodes) = url.strip_prefix("redis+cluster://") {
        // `user:password@` before the first node applies to every node.
        let (auth, nodes) = match nodes.rsplit_once('@') {
            Some((auth, nodes)) => (format!("{auth}@"), nodes),
            None => (String::new(), nodes),
        };
        let nodes: Vec<String> = nodes
            .trim_end_matches('/')
            .split(',')
            .filter(|n| !n.is_empty())
            .map(|node| format!("redis://{auth}{node}"))
            .collect();
        if nodes.is_empty() {
            return Err(Failure::BadUrl(format!(
                "{shown} names no node: redis+cluster://host:port[,host:port...]"
            )));
        }
        let store = idem::RedisStore::connect_cluster(&nodes).await;
        (store, format!("Redis Cluster at {shown}"))
    } else {
        let store = idem::RedisStore::connect(url).await;
        (store, format!("Redis at {shown}"))
    };
    let store = match store {
        Ok(store) => store,
        Err(idem::Error::Config(message)) => return Err(Failure::BadUrl(message)),
        Err(err) => {
            return Err(Failure::Unreachable(format!(
                "cannot connect to {name}: {err}"
            )))
        }
    };
    let store = match prefix {
        Some(prefix) => store
            .with_prefix(prefix)
            .map_err(|e| Failure::Usage(format!("--prefix: {e}")))?,
        None => store,
    };
    match store.is_set_up().await {
        Ok(_) => {}
        Err(idem::Error::Config(_)) => {
            return Err(Failure::BadUrl(format!(
                "{shown} is a node of a Redis Cluster, which holds only some of the records: \
                 use redis+cluster://{}",
                url.trim_start_matches("redis://")
            )))
        }
        Err(err) => return Err(Failure::Unreachable(format!("cannot read {name}: {err}"))),
    }
    let records_at = format!("(key prefix {:?})", store.prefix());
    Ok(Target {
        name,
        records_at,
        records: Some(Box::new(store)),
        entity: None,
        sql: false,
        outbox: None,
    })
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn passwords_are_hidden() {
        assert_eq!(
            redacted("postgres://app:s3cret@db:5432/app"),
            "postgres://app:***@db:5432/app"
        );
        assert_eq!(redacted("redis://127.0.0.1:6379"), "redis://127.0.0.1:6379");
        assert_eq!(redacted("sqlite://app.db"), "sqlite://app.db");
        assert_eq!(
            redacted("postgres://postgres@127.0.0.1/test"),
            "postgres://postgres@127.0.0.1/test"
        );
    }
}
