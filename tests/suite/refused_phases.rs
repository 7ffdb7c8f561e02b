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
    /// README's atomic phases describe ("create the ride, charge, send the
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
        // IMMEDIATE` after a write of the caller's, as the README
        // recommends.
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
