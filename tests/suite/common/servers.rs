//! The database servers the SQL stores are tested on: their URLs (from the
//! environment, with local defaults), pools, and tables of a test's own,
//! dropped when the test ends.
//!
//! A server that cannot be reached fails the test with a message naming the
//! server and the variable that points at it; it never passes silently.

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

    /// `name` quoted as an identifier.
    pub fn ident(self, name: &str) -> String {
        match self {
            Server::Postgres => format!("\"{name}\""),
            Server::MySql => format!("`{name}`"),
        }
    }

    /// The server's name, for messages.
    pub fn name(self) -> &'static str {
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

    /// Runs `statements`, then `best_effort` (whose failures are not
    /// reported), on a connection of its own, on a thread of its own, so
    /// that it works from any runtime or none (in a `Drop`, whether the
    /// test passed or panicked). A lock held elsewhere fails a statement
    /// after 10 s rather than hanging it. Failures are reported on stderr,
    /// naming `what`, never panicked on.
    pub fn clean_up(self, what: &str, statements: Vec<String>, best_effort: Vec<String>) {
        let cleaned = std::thread::spawn(move || {
            let runtime = tokio::runtime::Builder::new_current_thread()
                .enable_all()
                .build()
                .expect("a runtime");
            runtime.block_on(async move {
                let url = self.url();
                macro_rules! run_on {
                    ($conn:ty, $lock_timeout:literal) => {{
                        let mut conn = <$conn>::connect(&url).await?;
                        sqlx::raw_sql($lock_timeout).execute(&mut conn).await?;
                        for sql in &statements {
                            sqlx::raw_sql(sql).execute(&mut conn).await?;
                        }
                        for sql in &best_effort {
                            sqlx::raw_sql(sql).execute(&mut conn).await.ok();
                        }
                    }};
                }
                match self {
                    Server::Postgres => run_on!(sqlx::PgConnection, "SET lock_timeout = '10s'"),
                    Server::MySql => {
                        run_on!(sqlx::MySqlConnection, "SET SESSION lock_wait_timeout = 10")
                    }
                }
                Ok::<_, sqlx::Error>(())
            })
        })
        .join();
        match cleaned {
            Ok(Ok(())) => {}
            Ok(Err(err)) => eprintln!("cleaning up {what} failed: {err}"),
            Err(_) => eprintln!("cleaning up {what} panicked"),
        }
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
        self.server().ident(name)
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
        let tables = std::mem::take(&mut self.tables);
        if tables.is_empty() {
            return;
        }
        // A records table's step journal and outbox, `<table>_steps` and
        // `<table>_outbox`, go with it.
        let drops = tables
            .iter()
            .flat_map(|t| [format!("{t}_steps"), format!("{t}_outbox"), t.clone()])
            .map(|t| format!("DROP TABLE IF EXISTS {}", self.server.ident(&t)))
            .collect();
        // The bookkeeping of tables a store migrated; a server where no
        // store ever migrated has no such table.
        let migrations = tables
            .iter()
            .map(|t| format!("DELETE FROM idem_migrations WHERE table_name = '{t}'"))
            .collect();
        self.server.clean_up("the test tables", drops, migrations);
    }
}
