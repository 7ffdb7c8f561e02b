//! A namespace of a test's own, for tests that create tables of their own
//! or start an app with its own migrations: a SQLite file in a temporary
//! directory, a PostgreSQL schema or a MariaDB/MySQL database, with a URL
//! that connects into it. It is dropped when the test ends.

use std::time::Duration;

use sqlx::Connection;

use super::servers::{unique_table, Db, Server};

/// A SQLite file, a PostgreSQL schema or a MariaDB/MySQL database of one
/// test, dropped (with everything in it) when this goes out of scope.
pub struct Namespace {
    name: String,
    url: String,
    /// The server, and a pool on it outside the namespace.
    server: Option<(Server, Db)>,
    _dir: Option<tempfile::TempDir>,
}

impl Namespace {
    /// A SQLite database file `<tag>.db` in a temporary directory of its
    /// own. Its name is its URL.
    pub fn sqlite(tag: &str) -> Namespace {
        let dir = tempfile::tempdir().expect("a temporary directory");
        let url = format!(
            "sqlite://{}",
            dir.path().join(format!("{tag}.db")).display()
        );
        Namespace {
            name: url.clone(),
            url,
            server: None,
            _dir: Some(dir),
        }
    }

    /// A schema (PostgreSQL) or a database (MariaDB/MySQL) of its own on
    /// `server`. Connections made with [`url`](Self::url) work in it; on
    /// PostgreSQL they also carry its name as their `application_name`.
    pub async fn on(server: Server, tag: &str) -> Namespace {
        // Fails the test, naming the server's variable, if it is down.
        let admin = server.pool(2).await;
        let name = unique_table(tag);
        let base = server.url();
        let url = match server {
            Server::Postgres => {
                admin.execute(&format!("CREATE SCHEMA \"{name}\"")).await;
                let separator = if base.contains('?') { '&' } else { '?' };
                format!(
                    "{base}{separator}options=-c%20search_path%3D{name}&application_name={name}"
                )
            }
            Server::MySql => {
                admin.execute(&format!("CREATE DATABASE `{name}`")).await;
                let mut url = reqwest::Url::parse(&base).expect("a MariaDB/MySQL URL");
                url.set_path(&name);
                url.to_string()
            }
        };
        Namespace {
            name,
            url,
            server: Some((server, admin)),
            _dir: None,
        }
    }

    /// The schema or database; the URL for SQLite.
    pub fn name(&self) -> &str {
        &self.name
    }

    /// The URL that connects into the namespace.
    pub fn url(&self) -> &str {
        &self.url
    }

    fn on_server(&self) -> &(Server, Db) {
        self.server
            .as_ref()
            .expect("a namespace on a database server, not a SQLite file")
    }

    /// The server the namespace is on.
    pub fn server(&self) -> Server {
        self.on_server().0
    }

    /// A pool on the server outside the namespace: for looking into the
    /// namespace and killing its connections.
    pub fn admin(&self) -> &Db {
        &self.on_server().1
    }

    /// `table` of the namespace, qualified and quoted.
    pub fn table(&self, table: &str) -> String {
        let server = self.server();
        format!("{}.{}", server.ident(&self.name), server.ident(table))
    }

    /// The ids of the open connections made with [`url`](Self::url).
    pub async fn connections(&self) -> Result<Vec<i64>, sqlx::Error> {
        match self.admin() {
            Db::Postgres(pool) => {
                sqlx::query_scalar(
                    "SELECT pid::bigint FROM pg_stat_activity \
                     WHERE datname = current_database() AND pid <> pg_backend_pid() \
                     AND application_name = $1",
                )
                .bind(&self.name)
                .fetch_all(pool)
                .await
            }
            Db::MySql(pool) => {
                sqlx::query_scalar(
                    "SELECT CAST(ID AS SIGNED) FROM information_schema.PROCESSLIST \
                     WHERE DB = ? AND ID <> CONNECTION_ID()",
                )
                .bind(&self.name)
                .fetch_all(pool)
                .await
            }
        }
    }

    /// Kills the connection `id` (`pg_terminate_backend`, `KILL
    /// CONNECTION`); answers whether it was there to kill.
    pub async fn kill(&self, id: i64) -> bool {
        match self.admin() {
            Db::Postgres(pool) => sqlx::query_scalar("SELECT pg_terminate_backend($1::int)")
                .bind(id)
                .fetch_one(pool)
                .await
                .unwrap_or(false),
            // `KILL` takes no parameter; the id is the server's integer.
            Db::MySql(pool) => sqlx::raw_sql(&format!("KILL CONNECTION {id}"))
                .execute(pool)
                .await
                .is_ok(),
        }
    }

    /// Kills every open connection made with [`url`](Self::url); answers
    /// how many there were.
    pub async fn kill_connections(&self) -> usize {
        let ids = self
            .connections()
            .await
            .expect("list the namespace's connections");
        for id in &ids {
            // A connection that ended meanwhile is no error of the test.
            self.kill(*id).await;
        }
        ids.len()
    }

    /// Lets `table` of the namespace be read, not written, until the
    /// returned connection is dropped.
    pub async fn block_writes(&self, table: &str) -> WriteBlock {
        let (server, url) = (self.server(), self.server().url());
        let table = self.table(table);
        let connected = async {
            Ok::<_, sqlx::Error>(match server {
                Server::Postgres => {
                    let mut conn = sqlx::PgConnection::connect(&url).await?;
                    sqlx::raw_sql(&format!("BEGIN; LOCK TABLE {table} IN EXCLUSIVE MODE"))
                        .execute(&mut conn)
                        .await?;
                    WriteBlock::Postgres(conn)
                }
                Server::MySql => {
                    let mut conn = sqlx::MySqlConnection::connect(&url).await?;
                    sqlx::raw_sql(&format!("LOCK TABLES {table} READ"))
                        .execute(&mut conn)
                        .await?;
                    WriteBlock::MySql(conn)
                }
            })
        };
        tokio::time::timeout(Duration::from_secs(30), connected)
            .await
            .expect("the lock within 30 s")
            .unwrap_or_else(|err| panic!("block writes to {table}: {err}"))
    }
}

/// A connection holding a lock that blocks writes, released when dropped.
pub enum WriteBlock {
    Postgres(sqlx::PgConnection),
    MySql(sqlx::MySqlConnection),
}

impl Drop for Namespace {
    fn drop(&mut self) {
        let Some((server, _)) = self.server.take() else {
            return; // the temporary directory goes with the file
        };
        let drop = match server {
            Server::Postgres => format!("DROP SCHEMA IF EXISTS \"{}\" CASCADE", self.name),
            Server::MySql => format!("DROP DATABASE IF EXISTS `{}`", self.name),
        };
        server.clean_up("the test namespace", vec![drop], Vec::new());
    }
}
