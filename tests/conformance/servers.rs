//! The database servers the SQL stores are tested on: their URLs, pools,
//! and a table of its own for every test, dropped when the test ends.
//!
//! A server that cannot be reached fails the test with a message naming the
//! server and the variable that points at it; it never passes silently.
#![allow(dead_code)] // shared by several test crates, each using a part

use std::sync::atomic::{AtomicUsize, Ordering};
use std::time::{Duration, SystemTime, UNIX_EPOCH};

use sqlx::mysql::{MySqlPool, MySqlPoolOptions};
use sqlx::postgres::{PgPool, PgPoolOptions};
use sqlx::Connection;

/// A database server of the test environment.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Server {
    Postgres,
    MySql,
}

impl Server {
    /// The environment variable holding the server's URL.
    pub fn var(self) -> &'static str {
        match self {
            Server::Postgres => "IDEM_POSTGRES_URL",
            Server::MySql => "IDEM_MYSQL_URL",
        }
    }

    /// The server's URL: the variable, or the local default.
    pub fn url(self) -> String {
        std::env::var(self.var()).unwrap_or_else(|_| {
            match self {
                Server::Postgres => "postgres://postgres@127.0.0.1:5432/test",
                Server::MySql => "mysql://root@127.0.0.1:3306/test",
            }
            .to_owned()
        })
    }

    fn name(self) -> &'static str {
        match self {
            Server::Postgres => "PostgreSQL",
            Server::MySql => "MariaDB/MySQL",
        }
    }

    fn unreachable(self, url: &str, err: impl std::fmt::Display) -> ! {
        panic!(
            "cannot reach the {} server at {url} (set {} to the URL of a reachable server): {err}",
            self.name(),
            self.var()
        )
    }

    /// A pool of at most `max` connections, or a failed test.
    pub async fn pool(self, max: u32) -> Db {
        let url = self.url();
        // One plain connection first, so that an unreachable server fails
        // the test at once rather than after the pool's acquire timeout.
        let probe = async {
            match self {
                Server::Postgres => sqlx::PgConnection::connect(&url).await?.close().await,
                Server::MySql => sqlx::MySqlConnection::connect(&url).await?.close().await,
            }
        };
        match tokio::time::timeout(Duration::from_secs(10), probe).await {
            Ok(Ok(())) => {}
            Ok(Err(err)) => self.unreachable(&url, err),
            Err(_) => self.unreachable(&url, "no answer within 10 s"),
        }
        let db = match self {
            Server::Postgres => PgPoolOptions::new()
                .max_connections(max)
                .acquire_timeout(Duration::from_secs(60))
                .connect(&url)
                .await
                .map(Db::Postgres),
            Server::MySql => MySqlPoolOptions::new()
                .max_connections(max)
                .acquire_timeout(Duration::from_secs(60))
                .connect(&url)
                .await
                .map(Db::MySql),
        };
        db.unwrap_or_else(|err| self.unreachable(&url, err))
    }
}

/// A pool on one of the servers, for what the tests do besides the store:
/// counting body runs, killing connections, inspecting rows.
#[derive(Clone, Debug)]
pub enum Db {
    Postgres(PgPool),
    MySql(MySqlPool),
}

impl Db {
    pub fn server(&self) -> Server {
        match self {
            Db::Postgres(_) => Server::Postgres,
            Db::MySql(_) => Server::MySql,
        }
    }

    /// `name` quoted as an identifier.
    pub fn ident(&self, name: &str) -> String {
        match self {
            Db::Postgres(_) => format!("\"{name}\""),
            Db::MySql(_) => format!("`{name}`"),
        }
    }

    /// Runs statements without parameters.
    pub async fn execute(&self, sql: &str) {
        let done = match self {
            Db::Postgres(pool) => sqlx::raw_sql(sql).execute(pool).await.map(drop),
            Db::MySql(pool) => sqlx::raw_sql(sql).execute(pool).await.map(drop),
        };
        done.unwrap_or_else(|err| panic!("{sql}: {err}"));
    }

    /// The one integer a query answers.
    pub async fn count(&self, sql: &str) -> i64 {
        let n = match self {
            Db::Postgres(pool) => sqlx::query_scalar::<_, i64>(sql).fetch_one(pool).await,
            Db::MySql(pool) => sqlx::query_scalar::<_, i64>(sql).fetch_one(pool).await,
        };
        n.unwrap_or_else(|err| panic!("{sql}: {err}"))
    }

    /// Creates a table counting body runs: one row per run, numbered.
    pub async fn create_runs_table(&self, table: &str) {
        let t = self.ident(table);
        self.execute(&match self {
            Db::Postgres(_) => format!(
                "CREATE TABLE {t} (id BIGINT GENERATED ALWAYS AS IDENTITY PRIMARY KEY, \
                 run_key TEXT NOT NULL)"
            ),
            Db::MySql(_) => format!(
                "CREATE TABLE {t} (id BIGINT AUTO_INCREMENT PRIMARY KEY, \
                 run_key VARCHAR(255) NOT NULL) ENGINE = InnoDB"
            ),
        })
        .await;
    }

    /// Records one body run of `key` in `table`; answers the run's number.
    pub async fn record_run(&self, table: &str, key: &str) -> Result<i64, sqlx::Error> {
        let t = self.ident(table);
        match self {
            Db::Postgres(pool) => {
                sqlx::query_scalar(&format!(
                    "INSERT INTO {t} (run_key) VALUES ($1) RETURNING id"
                ))
                .bind(key)
                .fetch_one(pool)
                .await
            }
            Db::MySql(pool) => sqlx::query(&format!("INSERT INTO {t} (run_key) VALUES (?)"))
                .bind(key)
                .execute(pool)
                .await
                .map(|done| done.last_insert_id() as i64),
        }
    }
}

/// A table name no other test, process or earlier run uses.
pub fn unique_table(tag: &str) -> String {
    static N: AtomicUsize = AtomicUsize::new(0);
    let nanos = SystemTime::now()
        .duration_since(UNIX_EPOCH)
        .map(|d| d.subsec_nanos())
        .unwrap_or(0);
    format!(
        "idem_t_{tag}_{}_{nanos}_{}",
        std::process::id(),
        N.fetch_add(1, Ordering::Relaxed)
    )
}

/// Drops tables (and their migration bookkeeping) when it goes out of
/// scope, whether the test passed or panicked. It opens a connection of
/// its own on a thread of its own, so it works from any runtime, or none.
#[derive(Debug)]
pub struct DropTables {
    server: Server,
    tables: Vec<String>,
}

impl DropTables {
    pub fn new(server: Server) -> Self {
        DropTables {
            server,
            tables: Vec::new(),
        }
    }

    /// Adds a table to drop, and returns its name.
    pub fn add(&mut self, table: String) -> String {
        self.tables.push(table.clone());
        table
    }
}

impl Drop for DropTables {
    fn drop(&mut self) {
        let (server, tables) = (self.server, std::mem::take(&mut self.tables));
        if tables.is_empty() {
            return;
        }
        let dropped = std::thread::spawn(move || {
            let runtime = tokio::runtime::Builder::new_current_thread()
                .enable_all()
                .build()
                .expect("a runtime");
            runtime.block_on(async move {
                let url = server.url();
                match server {
                    Server::Postgres => {
                        let mut conn = sqlx::PgConnection::connect(&url).await?;
                        for t in &tables {
                            sqlx::raw_sql(&format!("DROP TABLE IF EXISTS \"{t}\""))
                                .execute(&mut conn)
                                .await?;
                            sqlx::query("DELETE FROM idem_migrations WHERE table_name = $1")
                                .bind(t)
                                .execute(&mut conn)
                                .await
                                .ok();
                        }
                    }
                    Server::MySql => {
                        let mut conn = sqlx::MySqlConnection::connect(&url).await?;
                        for t in &tables {
                            sqlx::raw_sql(&format!("DROP TABLE IF EXISTS `{t}`"))
                                .execute(&mut conn)
                                .await?;
                            sqlx::query("DELETE FROM idem_migrations WHERE table_name = ?")
                                .bind(t)
                                .execute(&mut conn)
                                .await
                                .ok();
                        }
                    }
                }
                Ok::<_, sqlx::Error>(())
            })
        })
        .join();
        match dropped {
            Ok(Ok(())) => {}
            Ok(Err(err)) => eprintln!("dropping the test tables failed: {err}"),
            Err(_) => eprintln!("dropping the test tables panicked"),
        }
    }
}

/// A migrated `PostgresStore` on a table of its own, through a pool of
/// `max` connections, with the guard that drops the table.
#[cfg(feature = "postgres")]
pub async fn postgres_store(max: u32) -> (idem::PostgresStore, Db, DropTables) {
    let db = Server::Postgres.pool(max).await;
    let Db::Postgres(pool) = &db else {
        unreachable!()
    };
    let mut guard = DropTables::new(Server::Postgres);
    let table = guard.add(unique_table("pg"));
    let store = idem::PostgresStore::new(pool.clone())
        .with_table_name(&table)
        .expect("a valid table name");
    store.migrate().await.expect("migrate the PostgreSQL store");
    (store, db, guard)
}

/// A migrated `MySqlStore` on a table of its own, through a pool of `max`
/// connections, with the guard that drops the table.
#[cfg(feature = "mysql")]
pub async fn mysql_store(max: u32) -> (idem::MySqlStore, Db, DropTables) {
    let db = Server::MySql.pool(max).await;
    let Db::MySql(pool) = &db else { unreachable!() };
    let mut guard = DropTables::new(Server::MySql);
    let table = guard.add(unique_table("my"));
    let store = idem::MySqlStore::new(pool.clone())
        .with_table_name(&table)
        .expect("a valid table name");
    store.migrate().await.expect("migrate the MySQL store");
    (store, db, guard)
}
