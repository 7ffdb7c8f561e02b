//! Transactional mode (`tx = conn`): the claim and the completion are
//! written on the caller's transaction, so the business rows and the record
//! commit or roll back together. Each case runs on SQLite, PostgreSQL and
//! MariaDB, each in tables of its own.

use crate::common;

use std::sync::atomic::{AtomicBool, AtomicUsize, Ordering};
use std::sync::Arc;
use std::time::Duration;

use tokio::sync::Notify;

#[derive(Debug, thiserror::Error)]
pub enum OrderError {
    #[error("the order failed")]
    Failed,
    #[error("database: {0}")]
    Db(#[from] sqlx::Error),
    #[error(transparent)]
    Idem(#[from] idem::Error),
}

/// Lets a test hold a body after its insert, before its completion.
#[derive(Default)]
pub struct Gate {
    reached: Notify,
    open: Notify,
}

common::backends!(sqlite_file, postgres, mysql => {
    use idem::{idempotent, Key, Scope, Store};

    pub struct Orders {
        pub store: backend::Store,
        pub pool: sqlx::Pool<backend::Database>,
        pub table: String,
        pub runs: AtomicUsize,
        pub fail_next: AtomicBool,
        pub _guard: common::backend::Guard,
    }

    impl Orders {
        fn sql(&self, template: &str) -> String {
            template
                .replace("{t}", &self.table)
                .replace("{a}", &backend::param(1))
                .replace("{b}", &backend::param(2))
        }

        #[idempotent(key = key, store = self.store, tx = tx, fingerprint = item, scope = "orders.create")]
        pub async fn create(
            &self,
            tx: &mut sqlx::Transaction<'_, backend::Database>,
            key: &str,
            item: &str,
            gate: Option<&Gate>,
        ) -> Result<String, OrderError> {
            let run = self.runs.fetch_add(1, Ordering::SeqCst) + 1;
            sqlx::query(&self.sql("INSERT INTO {t} (order_key, item) VALUES ({a}, {b})"))
                .bind(key)
                .bind(item)
                .execute(&mut **tx)
                .await?;
            if let Some(gate) = gate {
                gate.reached.notify_one();
                gate.open.notified().await;
            }
            if self.fail_next.swap(false, Ordering::SeqCst) {
                return Err(OrderError::Failed);
            }
            Ok(format!("{item} #{run}"))
        }

        async fn rows(&self, key: &str) -> i64 {
            sqlx::query_scalar(&self.sql("SELECT COUNT(*) FROM {t} WHERE order_key = {a}"))
                .bind(key)
                .fetch_one(&self.pool)
                .await
                .unwrap()
        }

        async fn record(&self, key: &str) -> Option<idem::record::Record> {
            self.store
                .get(&Scope::new("orders.create"), &Key::new(key).unwrap())
                .await
                .unwrap()
        }

        fn runs(&self) -> usize {
            self.runs.load(Ordering::SeqCst)
        }
    }

    async fn orders() -> Arc<Orders> {
        let (store, mut guard) = backend::store(8).await;
        let pool = store.pool().clone();
        let table = guard.table("txord");
        sqlx::raw_sql(&format!(
            "CREATE TABLE {table} (order_key VARCHAR(255) NOT NULL, item VARCHAR(255) NOT NULL)"
        ))
        .execute(&pool)
        .await
        .unwrap();
        Arc::new(Orders {
            store,
            pool,
            table,
            runs: AtomicUsize::new(0),
            fail_next: AtomicBool::new(false),
            _guard: guard,
        })
    }

    #[tokio::test(flavor = "multi_thread", worker_threads = 2)]
    async fn failure_then_rollback_leaves_nothing_and_the_retry_runs() {
        let orders = orders().await;
        orders.fail_next.store(true, Ordering::SeqCst);
        let mut tx = orders.pool.begin().await.unwrap();
        let err = orders.create(&mut tx, "k1", "widget", None).await.unwrap_err();
        assert!(matches!(err, OrderError::Failed), "{err:?}");
        tx.rollback().await.unwrap();
        assert_eq!(orders.rows("k1").await, 0);
        assert!(orders.record("k1").await.is_none());

        let mut tx = orders.pool.begin().await.unwrap();
        let ok = orders.create(&mut tx, "k1", "widget", None).await.unwrap();
        tx.commit().await.unwrap();
        assert_eq!(ok, "widget #2");
        assert_eq!((orders.rows("k1").await, orders.runs()), (1, 2));
    }

    #[tokio::test(flavor = "multi_thread", worker_threads = 2)]
    async fn commit_keeps_both_and_the_retry_replays() {
        let orders = orders().await;
        let mut tx = orders.pool.begin().await.unwrap();
        let first = orders.create(&mut tx, "k2", "widget", None).await.unwrap();
        // Not visible outside the transaction before the commit.
        assert!(orders.record("k2").await.is_none());
        tx.commit().await.unwrap();
        assert_eq!(orders.rows("k2").await, 1);
        let record = orders.record("k2").await.expect("the record committed with the row");
        assert_eq!(record.state, idem::record::State::Completed);

        let mut tx = orders.pool.begin().await.unwrap();
        let again = orders.create(&mut tx, "k2", "widget", None).await.unwrap();
        tx.commit().await.unwrap();
        assert_eq!(again, first);
        assert_eq!((orders.rows("k2").await, orders.runs()), (1, 1));

        // Another payload under the same key is refused.
        let mut tx = orders.pool.begin().await.unwrap();
        let err = orders.create(&mut tx, "k2", "gadget", None).await.unwrap_err();
        assert!(matches!(err, OrderError::Idem(idem::Error::KeyReused)), "{err:?}");
    }

    /// Starts a first transaction that holds its claim inside the
    /// body, and a second one with the same key, which must block.
    async fn race(
        orders: &Arc<Orders>,
        key: &'static str,
    ) -> (
        Arc<Gate>,
        tokio::task::JoinHandle<Result<String, OrderError>>,
        tokio::task::JoinHandle<Result<String, OrderError>>,
    ) {
        let gate = Arc::new(Gate::default());
        let (o, g) = (orders.clone(), gate.clone());
        let first = tokio::spawn(async move {
            let mut tx = o.pool.begin().await?;
            let r = o.create(&mut tx, key, "widget", Some(&g)).await;
            if r.is_ok() {
                tx.commit().await?;
            } else {
                tx.rollback().await?;
            }
            r
        });
        gate.reached.notified().await;
        let o = orders.clone();
        let second = tokio::spawn(async move {
            let mut tx = o.pool.begin().await?;
            let r = o.create(&mut tx, key, "widget", None).await;
            if r.is_ok() {
                tx.commit().await?;
            }
            r
        });
        tokio::time::sleep(Duration::from_millis(300)).await;
        assert!(!second.is_finished(), "the duplicate must wait for the first transaction");
        assert_eq!(orders.runs(), 1);
        (gate, first, second)
    }

    #[tokio::test(flavor = "multi_thread", worker_threads = 4)]
    async fn concurrent_duplicate_waits_then_replays() {
        let orders = orders().await;
        let (gate, first, second) = race(&orders, "k3").await;
        gate.open.notify_one();
        let first = first.await.unwrap().unwrap();
        let second = second.await.unwrap().unwrap();
        assert_eq!(first, second);
        assert_eq!((orders.rows("k3").await, orders.runs()), (1, 1));
    }

    #[tokio::test(flavor = "multi_thread", worker_threads = 4)]
    async fn concurrent_duplicate_runs_when_the_first_rolls_back() {
        let orders = orders().await;
        orders.fail_next.store(true, Ordering::SeqCst);
        let (gate, first, second) = race(&orders, "k4").await;
        gate.open.notify_one();
        assert!(matches!(first.await.unwrap(), Err(OrderError::Failed)));
        let second = second.await.unwrap().unwrap();
        assert_eq!(second, "widget #2");
        assert_eq!((orders.rows("k4").await, orders.runs()), (1, 2));
    }

    /// Three duplicates blocked on a first transaction that rolls back.
    /// On MariaDB they then deadlock on the index's locks, and InnoDB rolls
    /// one of their transactions back: that caller used to get
    /// `Error::Store` (found by the simulation, seed 2 of
    /// `simulation::mysql`). Each duplicate now replays, runs the body, or
    /// is told `InProgress` (retry the transaction); one row in the end.
    #[tokio::test(flavor = "multi_thread", worker_threads = 4)]
    async fn several_duplicates_when_the_first_rolls_back() {
        let orders = orders().await;
        for round in 0..5 {
            let key: &'static str = Box::leak(format!("k7-{round}").into_boxed_str());
            orders.fail_next.store(true, Ordering::SeqCst);
            let gate = Arc::new(Gate::default());
            let (o, g) = (orders.clone(), gate.clone());
            let first = tokio::spawn(async move {
                let mut tx = o.pool.begin().await?;
                let r = o.create(&mut tx, key, "widget", Some(&g)).await;
                tx.rollback().await?;
                r
            });
            gate.reached.notified().await;
            let duplicates: Vec<_> = (0..3)
                .map(|_| {
                    let o = orders.clone();
                    tokio::spawn(async move {
                        let mut tx = o.pool.begin().await?;
                        let r = o.create(&mut tx, key, "widget", None).await;
                        if r.is_ok() {
                            tx.commit().await?;
                        }
                        r
                    })
                })
                .collect();
            tokio::time::sleep(Duration::from_millis(200)).await;
            gate.open.notify_one();
            assert!(matches!(first.await.unwrap(), Err(OrderError::Failed)));
            let mut values = std::collections::BTreeSet::new();
            for duplicate in duplicates {
                match duplicate.await.unwrap() {
                    Ok(value) => {
                        values.insert(value);
                    }
                    Err(OrderError::Idem(idem::Error::InProgress { .. })) => {}
                    Err(err) => panic!("round {round}: a duplicate got {err:?}"),
                }
            }
            assert!(values.len() <= 1, "round {round}: {values:?}");
            let rows = orders.rows(key).await;
            assert!(rows <= 1, "round {round}: {rows} rows");
            assert_eq!(rows as usize, values.len(), "round {round}");
        }
    }

    /// A record-mode owner (body 300 ms, lease 1.5 s) and a duplicate
    /// in transactional mode: the duplicate waits with plain reads
    /// and holds no lock on the record, so the owner's completion
    /// lands at once and the duplicate replays it. (A waiter whose
    /// claim attempt locked the row stalled the completion until the
    /// lease lapsed, then ran the body a second time.)
    #[tokio::test(flavor = "multi_thread", worker_threads = 4)]
    async fn waiting_duplicate_holds_no_lock_the_owner_needs() {
        let orders = orders().await;
        let key = "k6";
        let policy = idem::Policy::new().lease(Duration::from_millis(1_500));
        let owner = {
            let o = orders.clone();
            tokio::spawn(async move {
                idem::run(
                    &o.store,
                    idem::Call::new("orders.create", key, &"widget").with_policy(policy),
                    async {
                        let run = o.runs.fetch_add(1, Ordering::SeqCst) + 1;
                        tokio::time::sleep(Duration::from_millis(300)).await;
                        Ok::<_, OrderError>(format!("widget #{run}"))
                    },
                )
                .await
            })
        };
        tokio::time::sleep(Duration::from_millis(50)).await;
        let mut tx = orders.pool.begin().await.unwrap();
        let duplicate = orders.create(&mut tx, key, "widget", None).await.unwrap();
        tx.commit().await.unwrap();
        let owner = owner.await.unwrap().unwrap();
        assert_eq!(owner, "widget #1");
        assert_eq!(duplicate, owner);
        assert_eq!(orders.runs(), 1, "the body ran twice");
    }

    #[tokio::test(flavor = "multi_thread", worker_threads = 2)]
    async fn dropped_transaction_lets_the_retry_run() {
        let orders = orders().await;
        {
            let mut tx = orders.pool.begin().await.unwrap();
            orders.create(&mut tx, "k5", "widget", None).await.unwrap();
            // A crash before the commit: the transaction is dropped.
        }
        assert!(orders.record("k5").await.is_none());
        let mut tx = orders.pool.begin().await.unwrap();
        let retry = orders.create(&mut tx, "k5", "widget", None).await.unwrap();
        tx.commit().await.unwrap();
        assert_eq!(retry, "widget #2");
        assert_eq!((orders.rows("k5").await, orders.runs()), (1, 2));
    }
});
/// MariaDB with `innodb_snapshot_isolation=ON` (the default of newer
/// releases) refuses a locking write of a row changed since the
/// transaction's snapshot (error 1020). A duplicate whose transaction
/// started before the first call completed still gets the replay, not a
/// store error.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn mariadb_snapshot_isolation_replays() {
    use sqlx::Connection;
    let (store, _guard) = common::backend::mysql::store(4).await;
    let pool = store.pool();
    let table = store.table_name().to_owned();
    let store = &store;
    let key = "snapshot";
    let first: Result<String, OrderError> = idem::run(
        store,
        idem::Call::new("orders.create", key, &"widget"),
        async { Ok("widget #1".to_owned()) },
    )
    .await;
    let mut conn = pool.acquire().await.unwrap();
    sqlx::query("SET SESSION innodb_snapshot_isolation = ON")
        .execute(&mut *conn)
        .await
        .unwrap();
    let mut tx = conn.begin().await.unwrap();
    // The snapshot is taken before the record changes.
    let _: i64 = sqlx::query_scalar(&format!("SELECT COUNT(*) FROM `{table}`"))
        .fetch_one(&mut *tx)
        .await
        .unwrap();
    // Another instance takes the (expired) record over and completes it.
    let _ = first.unwrap();
    let second = "widget #2".to_owned();
    sqlx::query(&format!(
        "UPDATE `{}` SET fence = fence + 1, outcome = ? WHERE `key` = ?",
        store.table_name()
    ))
    .bind(serde_json::to_vec(&second).unwrap())
    .bind(key)
    .execute(pool)
    .await
    .unwrap();
    let replayed: Result<String, OrderError> = idem::run_in_transaction(
        store,
        &mut *tx,
        idem::Call::new("orders.create", key, &"widget"),
        |conn| async move { (Ok("widget #3".to_owned()), conn) },
    )
    .await;
    tx.rollback().await.unwrap();
    assert_eq!(replayed.unwrap(), second);
}
