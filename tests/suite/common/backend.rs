//! One module per backend, all alike, so that a test body written once
//! runs on each (see [`backends!`](crate::common::backends)): `memory`,
//! `sqlite_file`, `sqlite_memory`, `postgres` and `mysql`.
//!
//! Every backend has:
//!
//! - `NAME`, and `Store`, the store's type;
//! - `store(max)`: a fresh, migrated store on records of its own (a file
//!   of its own, a table of its own on a server), through a pool of at most
//!   `max` connections where the backend pools them, and the [`Guard`]
//!   that cleans up after it;
//! - `if_sql! { items }`, `if_server! { items }`, `if_mysql! { items }`
//!   and `if_own_clock! { items }`: the items on the backends listed
//!   below, on the database servers, on MariaDB/MySQL, on the backends
//!   whose database has a clock of its own (the servers and Redis), and
//!   nothing elsewhere.
//!
//! The SQL backends but `sqlite_memory` also have `Database` (sqlx's),
//! `param(n)` (the n-th bind parameter in the backend's SQL),
//! `store_at(location, max)` and `location(&store, &guard)` (another
//! handle on the same records, as another process opens them),
//! `namespace(tag)` (a [`Namespace`] of the test's own) and `pool(&ns,
//! max)` (a pool into it). The servers also have `SERVER` and `db(&store)`,
//! a [`Db`] on the store's pool.

use std::path::PathBuf;
use std::time::Duration;

use super::namespace::Namespace;
#[cfg_attr(
    not(any(feature = "postgres", feature = "mysql")),
    allow(unused_imports)
)]
use super::servers::{unique_table, Db, DropTables, Server};

/// What a store of a test leaves behind, cleaned up when this is dropped,
/// whether the test passed or panicked: a temporary directory, tables on a
/// server.
#[derive(Debug, Default)]
pub struct Guard {
    dir: Option<tempfile::TempDir>,
    tables: Option<DropTables>,
    #[cfg(feature = "redis")]
    keys: Option<super::redis::DeleteKeys>,
}

impl Guard {
    /// A temporary directory of its own.
    pub fn temp_dir() -> Guard {
        Guard {
            dir: Some(tempfile::tempdir().expect("a temporary directory")),
            ..Guard::default()
        }
    }

    /// Tables on `server`, none yet.
    pub fn tables(server: Server) -> Guard {
        Guard {
            tables: Some(DropTables::new(server)),
            ..Guard::default()
        }
    }

    /// Keys under `prefix` on `redis`, deleted with the guard.
    #[cfg(feature = "redis")]
    pub fn keys(redis: super::redis::Redis, prefix: String) -> Guard {
        Guard {
            keys: Some(super::redis::DeleteKeys { redis, prefix }),
            ..Guard::default()
        }
    }

    /// `file` in the temporary directory.
    pub fn path(&self, file: &str) -> PathBuf {
        self.dir
            .as_ref()
            .expect("a guard with a temporary directory")
            .path()
            .join(file)
    }

    /// The name of a table of the test's own, dropped with the guard (on
    /// SQLite, with the file).
    pub fn table(&mut self, tag: &str) -> String {
        let table = unique_table(tag);
        match &mut self.tables {
            Some(tables) => tables.add(table),
            None => table,
        }
    }
}

/// What the built-in SQL stores share, for cases written once for all.
pub trait SqlStore: idem::Store + Clone + 'static {
    /// sqlx's database of the store.
    type Database: sqlx::Database;

    /// The store's pool.
    fn pool(&self) -> &sqlx::Pool<Self::Database>;
}

macro_rules! sql_store {
    ($($feature:literal: $store:ty, $database:ty;)*) => {$(
        #[cfg(feature = $feature)]
        impl SqlStore for $store {
            type Database = $database;

            fn pool(&self) -> &sqlx::Pool<$database> {
                <$store>::pool(self)
            }
        }
    )*};
}

sql_store! {
    "sqlite": idem::SqliteStore, sqlx::Sqlite;
    "postgres": idem::PostgresStore, sqlx::Postgres;
    "mysql": idem::MySqlStore, sqlx::MySql;
}

/// Keeps the items: what `if_sql!`, `if_server!` and `if_mysql!` are
/// where they apply.
macro_rules! keep {
    ($($item:item)*) => { $($item)* };
}

/// Drops the items: what `if_sql!`, `if_server!` and `if_mysql!` are
/// elsewhere.
macro_rules! skip {
    ($($item:item)*) => {};
}

#[allow(unused_imports)]
pub(crate) use {keep, skip};

/// The memory store.
pub mod memory {
    use super::*;

    pub const NAME: &str = "memory";
    pub type Store = idem::MemoryStore;

    pub async fn store(_max: u32) -> (Store, Guard) {
        (idem::MemoryStore::new(), Guard::default())
    }

    #[allow(unused_imports)]
    pub(crate) use super::{
        skip as if_sql, skip as if_server, skip as if_mysql, skip as if_own_clock,
    };
}

/// The SQLite store on a database file, which connections and processes
/// share.
#[cfg(feature = "sqlite")]
pub mod sqlite_file {
    use std::str::FromStr;

    use sqlx::sqlite::{SqliteConnectOptions, SqliteJournalMode, SqlitePoolOptions};

    use super::*;

    pub const NAME: &str = "sqlite_file";
    pub type Store = idem::SqliteStore;
    pub type Database = sqlx::Sqlite;

    pub fn param(n: usize) -> String {
        format!("?{n}")
    }

    /// A store on `idem.db` in a temporary directory of its own (`max`
    /// does not apply: the store pools 8 connections).
    pub async fn store(max: u32) -> (Store, Guard) {
        let guard = Guard::temp_dir();
        let store = store_at(&guard.path("idem.db").display().to_string(), max).await;
        (store, guard)
    }

    /// A store on the database file `location`.
    pub async fn store_at(location: &str, _max: u32) -> Store {
        idem::SqliteStore::connect(&format!("sqlite://{location}"))
            .await
            .expect("open the SQLite file")
    }

    /// The database file of a store made by [`store`].
    pub fn location(_store: &Store, guard: &Guard) -> String {
        guard.path("idem.db").display().to_string()
    }

    pub async fn namespace(tag: &str) -> Namespace {
        Namespace::sqlite(tag)
    }

    /// A pool on the namespace's file, in WAL mode, whose connections wait
    /// 10 s for a lock.
    pub async fn pool(ns: &Namespace, max: u32) -> sqlx::SqlitePool {
        let options = SqliteConnectOptions::from_str(ns.url())
            .expect("a SQLite URL")
            .create_if_missing(true)
            .journal_mode(SqliteJournalMode::Wal)
            .busy_timeout(Duration::from_secs(10));
        SqlitePoolOptions::new()
            .max_connections(max)
            .acquire_timeout(Duration::from_secs(60))
            .connect_with(options)
            .await
            .expect("open the SQLite file")
    }

    #[allow(unused_imports)]
    pub(crate) use super::{
        keep as if_sql, skip as if_server, skip as if_mysql, skip as if_own_clock,
    };
}

/// The SQLite store on an in-memory database (one connection).
#[cfg(feature = "sqlite")]
pub mod sqlite_memory {
    use super::*;

    pub const NAME: &str = "sqlite_memory";
    pub type Store = idem::SqliteStore;

    pub async fn store(_max: u32) -> (Store, Guard) {
        let store = idem::SqliteStore::connect("sqlite::memory:")
            .await
            .expect("open an in-memory SQLite database");
        (store, Guard::default())
    }

    #[allow(unused_imports)]
    pub(crate) use super::{
        skip as if_sql, skip as if_server, skip as if_mysql, skip as if_own_clock,
    };
}

/// A backend on a database server: the same functions for each.
macro_rules! server_backend {
    (
        $(#[$doc:meta])*
        $name:ident: $feature:literal, Server::$server:ident, $store:ty, $database:ty,
        tag: $tag:literal, param: $param:expr, if_mysql: $if_mysql:ident
    ) => {
        $(#[$doc])*
        #[cfg(feature = $feature)]
        pub mod $name {
            use super::*;

            pub const NAME: &str = stringify!($name);
            pub const SERVER: Server = Server::$server;
            pub type Store = $store;
            pub type Database = $database;

            pub fn param(n: usize) -> String {
                ($param)(n)
            }

            /// A store on a table of its own, dropped with the guard.
            pub async fn store(max: u32) -> (Store, Guard) {
                let mut guard = Guard::tables(SERVER);
                let table = guard.table($tag);
                (store_at(&table, max).await, guard)
            }

            /// A store on `table`, migrated (as another instance starting up
            /// would), through a pool of its own.
            pub async fn store_at(table: &str, max: u32) -> Store {
                let Db::$server(pool) = SERVER.pool(max).await else {
                    unreachable!()
                };
                let store = <$store>::new(pool)
                    .with_table_name(table)
                    .expect("a valid table name");
                store
                    .migrate()
                    .await
                    .unwrap_or_else(|err| panic!("migrate the {} store: {err}", SERVER.name()));
                store
            }

            /// The table of a store.
            pub fn location(store: &Store, _guard: &Guard) -> String {
                store.table_name().to_owned()
            }

            /// The store's pool, for what a test does besides the store.
            pub fn db(store: &Store) -> Db {
                Db::$server(store.pool().clone())
            }

            pub async fn namespace(tag: &str) -> Namespace {
                Namespace::on(SERVER, tag).await
            }

            pub async fn pool(ns: &Namespace, max: u32) -> sqlx::Pool<Database> {
                sqlx::pool::PoolOptions::<Database>::new()
                    .max_connections(max)
                    .acquire_timeout(Duration::from_secs(60))
                    .connect(ns.url())
                    .await
                    .unwrap_or_else(|err| panic!("connect to {}: {err}", ns.name()))
            }

            #[allow(unused_imports)]
            pub(crate) use super::{keep as if_sql, keep as if_server, $if_mysql as if_mysql, keep as if_own_clock};
        }
    };
}

server_backend! {
    /// The PostgreSQL store on the server of `IDEM_POSTGRES_URL`.
    postgres: "postgres", Server::Postgres, idem::PostgresStore, sqlx::Postgres,
    tag: "pg", param: |n| format!("${n}"), if_mysql: skip
}

server_backend! {
    /// The MariaDB/MySQL store on the server of `IDEM_MYSQL_URL`.
    mysql: "mysql", Server::MySql, idem::MySqlStore, sqlx::MySql,
    tag: "my", param: |_| "?".to_owned(), if_mysql: keep
}

/// A backend on Redis: the store, keyed under a prefix of the test's own,
/// and `location` (the prefix: another handle on the same records, as
/// another process opens them, is `store_at(prefix)`).
macro_rules! redis_backend {
    ($(#[$doc:meta])* $name:ident: Redis::$redis:ident) => {
        $(#[$doc])*
        #[cfg(feature = "redis")]
        pub mod $name {
            use super::*;
            use crate::common::redis::{unique_prefix, Redis};

            pub const NAME: &str = stringify!($name);
            pub const REDIS: Redis = Redis::$redis;
            pub type Store = idem::RedisStore;

            /// A store on keys of its own, deleted with the guard (`max`
            /// does not apply: one multiplexed connection).
            pub async fn store(_max: u32) -> (Store, Guard) {
                let prefix = unique_prefix(NAME);
                let store = store_at(&prefix, 1).await;
                (store, Guard::keys(REDIS, prefix))
            }

            /// A store on the keys under `prefix`, on a connection of its own.
            pub async fn store_at(prefix: &str, _max: u32) -> Store {
                REDIS.store(prefix).await
            }

            /// The prefix of a store.
            pub fn location(store: &Store, _guard: &Guard) -> String {
                store.prefix().to_owned()
            }

            #[allow(unused_imports)]
            pub(crate) use super::{skip as if_sql, skip as if_server, skip as if_mysql, keep as if_own_clock};
        }
    };
}

redis_backend! {
    /// The Redis store on the single Redis of `IDEM_REDIS_URL`.
    redis: Redis::Single
}

redis_backend! {
    /// The Redis store on the Redis Cluster of `IDEM_REDIS_CLUSTER_URL`.
    redis_cluster: Redis::Cluster
}
