//! Transactional mode at its edges (a connection outside a transaction, a
//! body that fails after writing, expiry racing a take-over and a purge),
//! and tenants kept apart whatever their principals hold.

use crate::common;

use std::sync::Arc;
use std::time::Duration;

#[derive(Debug, thiserror::Error)]
pub enum TxError {
    #[error("the body failed after writing")]
    Failed,
    #[error("database: {0}")]
    Db(#[from] sqlx::Error),
    #[error(transparent)]
    Idem(#[from] idem::Error),
}

common::backends!(sqlite_file, postgres, mysql => {
    use idem::{Call, Key, Policy, Scope, Store};

    struct Fixture {
        store: backend::Store,
        pool: sqlx::Pool<backend::Database>,
        table: String,
        runs: common::Runs,
        _guard: common::backend::Guard,
    }

    impl Fixture {
        fn sql(&self, template: &str) -> String {
            template
                .replace("{t}", &self.table)
                .replace("{a}", &backend::param(1))
                .replace("{b}", &backend::param(2))
        }

        async fn rows(&self, key: &str) -> i64 {
            sqlx::query_scalar(&self.sql("SELECT COUNT(*) FROM {t} WHERE order_key = {a}"))
                .bind(key)
                .fetch_one(&self.pool)
                .await
                .unwrap()
        }
    }

    async fn fixture() -> Arc<Fixture> {
        let (store, mut guard) = backend::store(8).await;
        let pool = store.pool().clone();
        let table = guard.table("txedge");
        sqlx::raw_sql(&format!(
            "CREATE TABLE {table} (order_key VARCHAR(255) NOT NULL, item VARCHAR(255) NOT NULL)"
        ))
        .execute(&pool)
        .await
        .unwrap();
        Arc::new(Fixture { store, pool, table, runs: common::Runs::default(), _guard: guard })
    }

    /// `run_in_transaction` on a pooled connection outside a transaction
    /// (autocommit): the claim commits at once and everyone sees it, so
    /// its lease must be renewed while the body runs, as in record mode.
    /// It was not (the claim was taken for one hidden in an open
    /// transaction), and the body ran twice.
    ///
    /// Interleaving: A calls `run_in_transaction` on a pooled connection,
    /// lease 300 ms; its body writes a row (committed at once) and runs
    /// 1.2 s. At 600 ms a duplicate B (record mode, same key and payload)
    /// would find the lease lapsed and take the key over.
    ///
    /// Expected: the body runs once, and B gets A's outcome.
    #[tokio::test(flavor = "multi_thread", worker_threads = 2)]
    async fn a_claim_on_a_plain_connection_is_renewed_and_runs_once() {
        let f = fixture().await;
        let key = "bare-1";
        let policy = Policy::new().lease(Duration::from_millis(300));
        let owner = {
            let f = f.clone();
            tokio::spawn(async move {
                let mut conn = f.pool.acquire().await.unwrap();
                let ins = f.sql("INSERT INTO {t} (order_key, item) VALUES ({a}, {b})");
                let runs = f.runs.clone();
                idem::run_in_transaction(
                    &f.store,
                    &mut conn,
                    Call::new("tx_edges.bare", key, &"widget").with_policy(policy),
                    |conn| async move {
                        let run = runs.next();
                        let r = sqlx::query(&ins).bind(key).bind("a").execute(&mut **conn).await;
                        if let Err(e) = r {
                            return (Err(TxError::Db(e)), conn);
                        }
                        tokio::time::sleep(Duration::from_millis(1_200)).await;
                        (Ok::<_, TxError>(format!("run {run}")), conn)
                    },
                )
                .await
            })
        };
        tokio::time::sleep(Duration::from_millis(600)).await;
        let dup: Result<String, TxError> = {
            let runs = f.runs.clone();
            let pool = f.pool.clone();
            let ins = f.sql("INSERT INTO {t} (order_key, item) VALUES ({a}, {b})");
            idem::run(
                &f.store,
                Call::new("tx_edges.bare", key, &"widget").with_policy(policy.wait(Duration::from_secs(3))),
                async move {
                    let run = runs.next();
                    sqlx::query(&ins).bind(key).bind("b").execute(&pool).await?;
                    Ok(format!("run {run}"))
                },
            )
            .await
        };
        let owner = owner.await.unwrap();
        assert_eq!(
            (f.runs.count(), f.rows(key).await),
            (1, 1),
            "the body ran twice for one key: owner {owner:?}, duplicate {dup:?}"
        );
    }

    /// A body that fails after writing: its claim is deleted on the
    /// caller's transaction, its rows are the transaction's. Rolled back
    /// (as dropping a sqlx transaction does), nothing of the failed attempt
    /// stays and the retry writes once; committed anyway, the key is free
    /// for the retry all the same, and the failed attempt's row stays (the
    /// engine's module docs, *Transactional mode*, say so).
    #[tokio::test(flavor = "multi_thread", worker_threads = 2)]
    async fn a_failed_body_leaves_its_rows_to_the_transaction() {
        let f = fixture().await;
        let ins = f.sql("INSERT INTO {t} (order_key, item) VALUES ({a}, {b})");
        for (key, commit_failed) in [("fail-rollback", false), ("fail-commit", true)] {
            for fail in [true, false] {
                let mut tx = f.pool.begin().await.unwrap();
                let runs = f.runs.clone();
                let ins = ins.clone();
                let result: Result<String, TxError> = idem::run_in_transaction(
                    &f.store,
                    &mut *tx,
                    Call::new("tx_edges.fail", key, &"widget"),
                    |conn| async move {
                        let run = runs.next();
                        if let Err(e) = sqlx::query(&ins).bind(key).bind("w").execute(&mut *conn).await {
                            return (Err(TxError::Db(e)), conn);
                        }
                        let r = if fail { Err(TxError::Failed) } else { Ok(format!("run {run}")) };
                        (r, conn)
                    },
                )
                .await;
                assert_eq!(result.is_err(), fail, "{result:?}");
                if fail && !commit_failed {
                    tx.rollback().await.unwrap();
                } else {
                    tx.commit().await.unwrap();
                }
            }
            let rows = if commit_failed { 2 } else { 1 };
            assert_eq!(f.rows(key).await, rows, "{key}");
        }
        assert_eq!(f.runs.count(), 4);
    }

    /// Expiry racing a takeover: a completed record expires
    /// (ttl 300 ms); at that instant four transactional callers, four
    /// record-mode callers and a purge all hit the key. Exactly one body
    /// runs anew, and every caller gets that run's outcome (or InProgress).
    #[tokio::test(flavor = "multi_thread", worker_threads = 2)]
    async fn expiry_racing_takeover_and_purge_runs_once() {
        let f = fixture().await;
        let key = "expiring";
        let policy = Policy::new().ttl(Duration::from_millis(300)).lease(Duration::from_secs(5));
        let first: Result<String, TxError> = idem::run(
            &f.store, Call::new("tx_edges.exp", key, &"x").with_policy(policy),
            async { Ok("first".to_owned()) }).await;
        assert_eq!(first.unwrap(), "first");
        tokio::time::sleep(Duration::from_millis(320)).await;
        let mut tasks = Vec::new();
        for i in 0..8 {
            let f = f.clone();
            tasks.push(tokio::spawn(async move {
                let runs = f.runs.clone();
                let call = Call::new("tx_edges.exp", key, &"x").with_policy(policy);
                if i % 2 == 0 {
                    let mut tx = f.pool.begin().await.unwrap();
                    let r: Result<String, TxError> = idem::run_in_transaction(&f.store, &mut *tx, call,
                        |conn| async move {
                            tokio::time::sleep(Duration::from_millis(100)).await;
                            (Ok(format!("run {}", runs.next())), conn)
                        }).await;
                    if r.is_ok() { tx.commit().await.unwrap(); } else { tx.rollback().await.unwrap(); }
                    r
                } else {
                    idem::run(&f.store, call, async move {
                        tokio::time::sleep(Duration::from_millis(100)).await;
                        Ok(format!("run {}", runs.next()))
                    }).await
                }
            }));
        }
        let _ = f.store.purge_expired(100).await;
        let mut answers = std::collections::BTreeSet::new();
        for t in tasks {
            match t.await.unwrap() {
                Ok(v) => { answers.insert(v); }
                Err(TxError::Idem(idem::Error::InProgress { .. })) => {}
                Err(e) => panic!("{e:?}"),
            }
        }
        assert_eq!(f.runs.count(), 1, "{answers:?}");
        assert_eq!(answers.len(), 1, "{answers:?}");
    }

    /// Tenants whose principals differ only by case, trailing
    /// spaces, Unicode normalisation (precomposed vs combining) or a
    /// separator inside the principal never share a record: scope and key
    /// compare byte for byte on every backend.
    #[tokio::test(flavor = "multi_thread", worker_threads = 2)]
    async fn principals_that_collate_equal_stay_apart() {
        let f = fixture().await;
        let principals = [
            "acme", "ACME", "acme ", "acme\t", "m\u{fc}ller", "mu\u{308}ller", "muller",
            "a\nb", "a b", "", "x\u{0301}", "\u{1e9e}", "ss", "\u{df}",
        ];
        for p in principals {
            let scope = Scope::new("tx_edges.tenant").with_principal(p);
            let out: Result<String, TxError> =
                idem::run(&f.store, Call::new(scope, "same-key", &"x"), async move {
                    Ok(p.to_owned())
                })
                .await;
            assert_eq!(out.unwrap(), p, "tenant {p:?} got another tenant's outcome");
        }
        for p in principals {
            let scope = Scope::new("tx_edges.tenant").with_principal(p);
            let rec = f.store.get(&scope, &Key::new("same-key").unwrap()).await.unwrap();
            assert!(rec.is_some(), "{p:?}");
        }
    }
});

/// A principal comes from outside (an API key id, a tenant header, a JWT
/// claim), and any text is one. PostgreSQL's text refuses a NUL, and a
/// principal holding one failed there as a transient store error (an HTTP
/// 503 telling the client to retry for ever): the call must run, replay,
/// and stay apart from the principal that spells the NUL as a dot.
#[cfg(feature = "postgres")]
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_principal_holding_nul_is_stored_on_postgres() {
    let (store, _guard) = common::backend::postgres::store(4).await;
    let runs = common::Runs::default();
    let call = |principal: &str| {
        let scope = idem::Scope::new("tx_edges.nul").with_principal(principal);
        let runs = runs.clone();
        idem::run(&store, idem::Call::new(scope, "k", &1u32), async move {
            Ok::<_, TxError>(runs.next())
        })
    };
    let first = call("tenant\0evil").await.unwrap();
    assert_eq!(call("tenant\0evil").await.unwrap(), first);
    assert_ne!(call("tenant.evil").await.unwrap(), first);
    assert_eq!(runs.count(), 2);
}

/// A plain connection that is the only one of its store's pool (SQLite in
/// memory): the claim and the outcome go on that connection, and nothing
/// waits for a second one (a renewal through the pool may wait: none is
/// due in so short a body). The retry replays.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_plain_connection_of_a_pool_of_one() {
    let store = idem::SqliteStore::connect("sqlite::memory:").await.unwrap();
    let runs = common::Runs::default();
    for _ in 0..2 {
        let mut conn = store.pool().acquire().await.unwrap();
        let runs = runs.clone();
        let call = idem::Call::new("tx_edges.one", "k-1", &1);
        let answer = tokio::time::timeout(
            Duration::from_secs(5),
            idem::run_in_transaction(&store, &mut *conn, call, |conn| async move {
                (Ok::<_, idem::Error>(runs.next()), conn)
            }),
        )
        .await
        .expect("the call waited for a second connection");
        assert_eq!(answer.unwrap(), 1);
    }
    assert_eq!(runs.count(), 1);
}
