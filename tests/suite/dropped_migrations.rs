//! A migration whose caller is dropped at any point leaves nothing
//! behind that makes the next migration wait: the first call of entity
//! mode migrates its claims' table, so a client timeout on a service's
//! very first request lands here.
//!
//! MariaDB's migration lock (`GET_LOCK`) belongs to the session: a
//! connection that went back to the pool holding it kept every later
//! migrator waiting for the lock's 60 s, and then failing (found by the
//! entity-mode drop loop in `entity_cuts`). SQLite's migration holds the
//! database's write lock (`BEGIN IMMEDIATE`) on a pooled connection, with
//! the same shape.

use std::time::Duration;

use crate::common;

common::backends!(sqlite_file, postgres, mysql => {
    /// For drops from the start of the migration to past its end, each on
    /// a table of its own: the next migration of the same table, and a
    /// write after it, answer within 15 s.
    #[tokio::test(flavor = "multi_thread", worker_threads = 2)]
    async fn a_dropped_migration_leaves_no_lock_behind() {
        let ns = backend::namespace("dropped_migrations").await;
        let pool = backend::pool(&ns, 4).await;
        for i in 0..40u64 {
            let table = format!("mig_{i}");
            let store = |pool| {
                backend::Store::new(pool)
                    .with_table_name(&table)
                    .expect("a valid table name")
            };
            let drop_at = Duration::from_micros(i * 700);
            let _ = tokio::time::timeout(drop_at, store(pool.clone()).migrate()).await;
            let next = store(pool.clone());
            tokio::time::timeout(Duration::from_secs(15), next.migrate())
                .await
                .unwrap_or_else(|_| {
                    panic!("{table}: the migration after one dropped at {drop_at:?} waits")
                })
                .unwrap_or_else(|err| panic!("{table}: {err}"));
            let scope = idem::Scope::new("dropped_migrations");
            let key = idem::Key::new("after").unwrap();
            tokio::time::timeout(Duration::from_secs(15), idem::Store::forget(&next, &scope, &key))
                .await
                .unwrap_or_else(|_| panic!("{table}: a write after the migrations waits"))
                .unwrap();
        }
    }
});
