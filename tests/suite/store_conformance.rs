//! The store conformance suite (`idem::testing`), run on every built-in
//! store: the memory store, SQLite on a file and in memory, PostgreSQL,
//! MariaDB/MySQL and Redis, and each of them behind the local replay
//! cache (`CachedStore`). On the servers each case has a table of its own, dropped
//! when it ends, so cases run in parallel and repeated runs never see each
//! other's rows.

use crate::common;

use std::future::Future;

use common::backend::{self, Guard};
use idem::{CachedStore, Store};

idem::store_conformance!(memory, backend::memory::store(10));

#[cfg(feature = "sqlite")]
idem::store_conformance!(sqlite_file, backend::sqlite_file::store(10));

#[cfg(feature = "sqlite")]
idem::store_conformance!(sqlite_memory, backend::sqlite_memory::store(10));

#[cfg(feature = "postgres")]
idem::store_conformance!(postgres, backend::postgres::store(10));

#[cfg(feature = "mysql")]
idem::store_conformance!(mysql, backend::mysql::store(10));

// The claim in two statements (the upsert, then a locking read), as on a
// server without `INSERT ... RETURNING` (MySQL, MariaDB before 10.5).
#[cfg(feature = "mysql")]
idem::store_conformance!(mysql_without_returning, async {
    let (store, guard) = backend::mysql::store(10).await;
    (store.without_returning(), guard)
});

#[cfg(feature = "redis")]
idem::store_conformance!(redis, backend::redis::store(10));

#[cfg(feature = "redis")]
idem::store_conformance!(redis_cluster, backend::redis_cluster::store(10));

// The local replay cache in front of each store: the whole contract
// holds through it, the step cases included (durable steps journal
// through the inner store's journal and a background handle that shares
// the cache, which also hands a dropped caller's claim back).
async fn cached<S: Store>(made: impl Future<Output = (S, Guard)>) -> (CachedStore<S>, Guard) {
    let (store, guard) = made.await;
    (CachedStore::new(store, 1000).unwrap(), guard)
}

idem::store_conformance!(cached_memory, cached(backend::memory::store(10)));

#[cfg(feature = "sqlite")]
idem::store_conformance!(cached_sqlite_file, cached(backend::sqlite_file::store(10)));

#[cfg(feature = "sqlite")]
idem::store_conformance!(
    cached_sqlite_memory,
    cached(backend::sqlite_memory::store(10))
);

#[cfg(feature = "postgres")]
idem::store_conformance!(cached_postgres, cached(backend::postgres::store(10)));

#[cfg(feature = "mysql")]
idem::store_conformance!(cached_mysql, cached(backend::mysql::store(10)));

#[cfg(feature = "redis")]
idem::store_conformance!(cached_redis, cached(backend::redis::store(10)));

// A store written on `idem-core` alone (idem-core/tests/user_store.rs), in
// under 150 lines: it passes the engine's cases too.
#[path = "../../idem-core/tests/user_store.rs"]
mod user_store;
// It keeps no step journal, and says so: the step cases are left out.
idem::store_conformance!(
    user_map_store,
    async { (user_store::MapStore::default(), ()) },
    journal = false
);
