//! An atomic phase (`Step::in_transaction`) that refuses when in doubt
//! keeps its promise, "no second effect, ever", whatever the database and
//! whatever becomes of the caller's transaction.

use crate::common;

use std::sync::atomic::{AtomicUsize, Ordering};

use idem::steps::{Step, StepKey};
use idem::{run, Call, Error};

/// A downstream that performs every call it receives (it does not dedupe),
/// and whose client then reports an error: the request reached it, the
/// answer did not come back (a timeout after the charge was made).
#[derive(Default)]
struct Gateway {
    charges: AtomicUsize,
}

impl Gateway {
    fn charge_then_time_out(&self) -> Result<u64, Error> {
        self.charges.fetch_add(1, Ordering::SeqCst);
        Err(Error::store("the gateway did not answer in time"))
    }
}

common::backends!(sqlite_file, postgres, mysql => {
    /// `Step::in_transaction` with `.refuse()`, whose phase makes a call
    /// (a charge) and records it in the caller's transaction, as the
    /// steps module's atomic phases describe ("create the ride, charge, send the
    /// receipt"). The charge reaches the downstream, then its client times
    /// out: the phase returns an error, the caller's `?` drops the
    /// transaction, which rolls back. A retry comes at once.
    ///
    /// Expected: the retry fails with `Error::OutcomeUnknown`, after one
    /// charge: the step's start was committed before the phase ran. On
    /// SQLite inside a transaction that already holds the write lock
    /// (`BEGIN IMMEDIATE` after a write), where that start could only be
    /// written in the transaction and roll back with it, the phase is
    /// refused at once with `Error::Config`, before any charge. (Written
    /// in the transaction, the start rolled back and the retry charged a
    /// second time.)
    #[tokio::test(flavor = "multi_thread", worker_threads = 2)]
    async fn a_refused_atomic_phase_is_not_charged_twice() {
        let (store, _guard) = backend::store(8).await;
        let pool = store.pool().clone();
        let rows = format!("refused_phase_{}", std::process::id());
        sqlx::query(&format!("CREATE TABLE IF NOT EXISTS {rows} (k VARCHAR(100) NOT NULL)"))
            .execute(&pool)
            .await
            .unwrap();
        let insert = format!("INSERT INTO {rows} (k) VALUES ({})", backend::param(1));
        // A plain deferred `BEGIN` that has not written yet, then `BEGIN
        // IMMEDIATE` after a write of the caller's, as the guide
        // recommends (src/_guide/modes.md, Transactional mode).
        let immediate = if backend::NAME.starts_with("sqlite") { "BEGIN IMMEDIATE" } else { "BEGIN" };
        for (begin, writes_first) in [("BEGIN", false), (immediate, true)] {
            let gateway = Gateway::default();
            let key = crate::common::fresh("refused-phase");
            let attempt = || {
                let (store, pool, insert, key, gateway) = (&store, &pool, &insert, &key, &gateway);
                async move {
                    run(store, Call::new("seams.refused_phase", key, &1), async move {
                        let mut tx = pool.begin_with(begin).await?;
                        if writes_first {
                            sqlx::query(insert).bind(format!("{key}-order")).execute(&mut *tx).await?;
                        }
                        let charge: u64 = Step::new("charge")
                            .refuse()
                            .in_transaction(store, &mut *tx, |conn, _key: StepKey| async move {
                                // The charge is sent; its answer is lost.
                                (gateway.charge_then_time_out(), conn)
                            })
                            .await?;
                        tx.commit().await?;
                        Ok::<_, Error>(charge)
                    })
                    .await
                }
            };
            let first = attempt().await;
            if writes_first && backend::NAME.starts_with("sqlite") {
                assert!(matches!(first, Err(Error::Config(_))), "{first:?}");
                assert_eq!(gateway.charges.load(Ordering::SeqCst), 0);
                continue;
            }
            assert!(matches!(first, Err(Error::Store(_))), "{first:?}");
            let retry = attempt().await;
            let charges = gateway.charges.load(Ordering::SeqCst);
            assert_eq!(
                charges, 1,
                "{} ({begin}): a refused step was charged {charges} times; the retry answered \
                 {retry:?}",
                backend::NAME
            );
            assert!(matches!(retry, Err(Error::OutcomeUnknown { .. })), "{retry:?}");
        }
        sqlx::query(&format!("DROP TABLE IF EXISTS {rows}"))
            .execute(&pool)
            .await
            .unwrap();
    }
});

/// An atomic phase after a read, in a deferred SQLite transaction (a check
/// before the write): the transaction holds a read snapshot, not the
/// write lock. The step's start used to be committed through the store's
/// pool, which left the caller's snapshot stale in WAL mode: the phase's
/// insert then failed at once (SQLITE_BUSY_SNAPSHOT) and rolled back,
/// after the start had been committed. Under `refuse` every retry answered
/// `OutcomeUnknown` though nothing happened; under `rerun` every attempt
/// failed the same way.
///
/// Expected: `rerun` writes its start in the transaction and commits one
/// row; `refuse` is refused at once with `Error::Config`, and neither its
/// start nor a row is left behind, so the call can be fixed and retried.
#[cfg(feature = "sqlite")]
mod after_a_read {
    use super::*;

    common::backends!(sqlite_file => {
        #[tokio::test(flavor = "multi_thread", worker_threads = 2)]
        async fn a_phase_after_a_read_commits_or_is_refused_at_once() {
            let (store, _guard) = backend::store(8).await;
            let pool = store.pool().clone();
            sqlx::query("CREATE TABLE orders_read_first (k TEXT NOT NULL)")
                .execute(&pool)
                .await
                .unwrap();
            for refuse in [true, false] {
                let key = common::fresh("read-first");
                let attempt = || {
                    let (store, pool, key) = (&store, &pool, &key);
                    async move {
                        let call = Call::new("refused_phases.read_first", key.as_str(), &1);
                        run(store, call, async move {
                            let mut tx = pool.begin().await?;
                            let _seen: i64 = sqlx::query_scalar(
                                "SELECT count(*) FROM orders_read_first WHERE k = ?1",
                            )
                            .bind(key.as_str())
                            .fetch_one(&mut *tx)
                            .await?;
                            let step = if refuse {
                                Step::new("order").refuse()
                            } else {
                                Step::new("order")
                            };
                            let row = step
                                .in_transaction(store, &mut *tx, |conn, _key: StepKey| async move {
                                    let inserted =
                                        sqlx::query("INSERT INTO orders_read_first (k) VALUES (?1)")
                                            .bind(key.as_str())
                                            .execute(&mut *conn)
                                            .await
                                            .map(|done| done.rows_affected())
                                            .map_err(Error::from);
                                    (inserted, conn)
                                })
                                .await?;
                            tx.commit().await?;
                            Ok::<_, Error>(row)
                        })
                        .await
                    }
                };
                let first = attempt().await;
                let retry = attempt().await;
                let rows: i64 =
                    sqlx::query_scalar("SELECT count(*) FROM orders_read_first WHERE k = ?1")
                        .bind(key.as_str())
                        .fetch_one(&pool)
                        .await
                        .unwrap();
                let journal = idem::store::Journal::steps(
                    &store,
                    &idem::Scope::new("refused_phases.read_first"),
                    &idem::Key::new(key.as_str()).unwrap(),
                )
                .await
                .unwrap();
                if refuse {
                    assert!(matches!(first, Err(Error::Config(_))), "refuse: {first:?}");
                    assert!(matches!(retry, Err(Error::Config(_))), "refuse, retry: {retry:?}");
                    assert_eq!(rows, 0, "refuse: a row without its step");
                    assert!(journal.is_empty(), "refuse: a start left behind: {journal:?}");
                } else {
                    assert_eq!(first.unwrap(), 1, "rerun: the phase did not commit");
                    assert_eq!(retry.unwrap(), 1, "rerun: the retry is no replay");
                    assert_eq!(rows, 1, "rerun: one row");
                }
            }
        }
    });
}
