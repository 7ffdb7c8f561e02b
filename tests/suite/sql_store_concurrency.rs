//! The PostgreSQL and MariaDB/MySQL stores under real concurrency.
//!
//! - 500 concurrent calls over 25 keys through a pool of 16 connections run
//!   each body exactly once (counted in a table the body writes), and every
//!   caller of a key gets that run's result;
//! - the same storm from 4 OS processes sharing one database (this binary,
//!   started again in a child mode) runs each key once;
//! - thousands of expired records are purged in batches while claims,
//!   some on those very keys, run.
#![cfg(any(feature = "postgres", feature = "mysql"))]

use crate::common;

use std::collections::HashMap;
use std::sync::Arc;
use std::time::{Duration, Instant, SystemTime, UNIX_EPOCH};

use common::backend::Guard;
use common::servers::{Db, Server};
use idem::{run, Call, Error, Key, Policy, Scope, Store};
use tokio::sync::Barrier;

const CALLS: usize = 500;
const KEYS: usize = 25;
const PROCESSES: usize = 4;
const SCOPE: &str = "sql_store_concurrency.charge";

/// Set in the children of a storm across processes: what to do, as
/// `records_table runs_table results_table start_at_millis child_index`.
const CHILD_VAR: &str = "IDEM_STORM_CHILD";

fn policy() -> Policy {
    Policy::new().wait(Duration::from_secs(60))
}

/// One call: the body records its run in `runs` and answers the run's
/// number, which every caller of the key must get back.
async fn charge(store: &dyn Store, db: &Db, runs: &str, key: &str) -> Result<i64, Error> {
    run(
        store,
        Call::new(SCOPE, key, &1).with_policy(policy()),
        async { db.record_run(runs, key).await.map_err(Error::store) },
    )
    .await
}

/// Fires `calls` calls over `KEYS` keys at once; answers each call's key and
/// result.
async fn storm(
    store: Arc<dyn Store>,
    db: &Db,
    runs: &str,
    prefix: &str,
    calls: usize,
) -> Vec<(String, i64)> {
    let barrier = Arc::new(Barrier::new(calls));
    let tasks: Vec<_> = (0..calls)
        .map(|i| {
            let (store, db, barrier) = (store.clone(), db.clone(), barrier.clone());
            let (runs, key) = (runs.to_owned(), format!("{prefix}-{}", i % KEYS));
            tokio::spawn(async move {
                barrier.wait().await;
                let result = charge(&*store, &db, &runs, &key).await;
                (key, result)
            })
        })
        .collect();
    let mut results = Vec::with_capacity(calls);
    for task in tasks {
        let (key, result) = task.await.expect("a call panicked");
        let result = result.unwrap_or_else(|err| panic!("call on {key} failed: {err:?}"));
        results.push((key, result));
    }
    results
}

/// Every key ran once (one row in `runs`), and every caller got that run.
async fn assert_one_run_per_key(db: &Db, runs: &str, results: &[(String, i64)]) {
    let t = db.ident(runs);
    assert_eq!(
        db.count(&format!("SELECT COUNT(*) FROM {t}")).await,
        KEYS as i64,
        "exactly one body run per key"
    );
    assert_eq!(
        db.count(&format!("SELECT COUNT(DISTINCT run_key) FROM {t}"))
            .await,
        KEYS as i64
    );
    let mut by_key: HashMap<&str, Vec<i64>> = HashMap::new();
    for (key, run) in results {
        by_key.entry(key).or_default().push(*run);
    }
    assert_eq!(by_key.len(), KEYS);
    for (key, runs_seen) in &by_key {
        assert_eq!(runs_seen.len(), CALLS / KEYS, "{key}");
        assert!(
            runs_seen.iter().all(|r| *r == runs_seen[0]),
            "callers of {key} got different results: {runs_seen:?}"
        );
    }
}

async fn storm_in_one_process(store: Arc<dyn Store>, db: Db, mut guard: Guard) {
    let runs = guard.table("runs");
    db.create_runs_table(&runs).await;
    let results = storm(store, &db, &runs, "one", CALLS).await;
    assert_one_run_per_key(&db, &runs, &results).await;
}

// --- across processes -----------------------------------------------------

fn now_millis() -> i64 {
    SystemTime::now()
        .duration_since(UNIX_EPOCH)
        .unwrap()
        .as_millis() as i64
}

/// The parent: creates the tables (all but the records table, which the
/// children migrate concurrently), starts the children of `test` with a
/// common start time, waits for them, and checks the runs and results.
async fn storm_across_processes(server: Server, test: &str) {
    let db = server.pool(4).await;
    let mut guard = Guard::tables(server);
    let records = guard.table("procs");
    let runs = guard.table("runs");
    let results = guard.table("results");
    db.create_runs_table(&runs).await;
    db.execute(&format!(
        "CREATE TABLE {} (run_key VARCHAR(255) NOT NULL, run BIGINT NOT NULL, child INT NOT NULL)",
        db.ident(&results)
    ))
    .await;

    let start_at = now_millis() + 3_000;
    let exe = std::env::current_exe().expect("the test binary");
    let children = (0..PROCESSES).map(|child| {
        tokio::process::Command::new(&exe)
            .args([test, "--exact", "--nocapture", "--test-threads", "1"])
            .env(
                CHILD_VAR,
                format!("{records} {runs} {results} {start_at} {child}"),
            )
            .kill_on_drop(true)
            .output()
    });
    let outputs = tokio::time::timeout(
        Duration::from_secs(180),
        futures::future::join_all(children),
    )
    .await
    .expect("the children did not finish within 180 s");
    for (child, output) in outputs.into_iter().enumerate() {
        let output = output.expect("start a child process");
        assert!(
            output.status.success(),
            "child {child} failed ({}):\n{}\n{}",
            output.status,
            String::from_utf8_lossy(&output.stdout),
            String::from_utf8_lossy(&output.stderr)
        );
    }

    // The children reported every call's result in `results`.
    let r = db.ident(&results);
    assert_eq!(
        db.count(&format!("SELECT COUNT(*) FROM {r}")).await,
        CALLS as i64
    );
    assert_eq!(
        db.count(&format!("SELECT COUNT(DISTINCT child) FROM {r}"))
            .await,
        PROCESSES as i64
    );
    let rows = match &db {
        Db::Postgres(pool) => {
            sqlx::query_as::<_, (String, i64)>(&format!("SELECT run_key, run FROM {r}"))
                .fetch_all(pool)
                .await
        }
        Db::MySql(pool) => {
            sqlx::query_as::<_, (String, i64)>(&format!("SELECT run_key, run FROM {r}"))
                .fetch_all(pool)
                .await
        }
    }
    .expect("read the results");
    assert_one_run_per_key(&db, &runs, &rows).await;
    // Each result is the number of the key's one recorded run.
    let t = db.ident(&runs);
    assert_eq!(
        db.count(&format!(
            "SELECT COUNT(*) FROM {r} JOIN {t} ON {t}.id = {r}.run AND {t}.run_key = {r}.run_key"
        ))
        .await,
        CALLS as i64
    );
}

/// A child: migrates the shared records table (racing its siblings) with
/// `open`, which answers the store and its pool, waits for the common
/// start, fires its share of the storm, and writes each call's result for
/// the parent.
async fn storm_child<F>(spec: &str, open: impl FnOnce(String) -> F)
where
    F: std::future::Future<Output = (Arc<dyn Store>, Db)>,
{
    let parts: Vec<&str> = spec.split(' ').collect();
    let [records, runs, results, start_at, child] = parts[..] else {
        panic!("{CHILD_VAR}={spec:?}: expected 5 fields")
    };
    let (start_at, child): (i64, usize) = (start_at.parse().unwrap(), child.parse().unwrap());
    let (store, db) = open(records.to_owned()).await;
    let wait = start_at - now_millis();
    assert!(wait > 0, "the child started after the common start time");
    tokio::time::sleep(Duration::from_millis(wait as u64)).await;
    let outcome = storm(store, &db, runs, "procs", CALLS / PROCESSES).await;
    let insert = format!(
        "INSERT INTO {} (run_key, run, child) VALUES ({})",
        db.ident(results),
        match &db {
            Db::Postgres(_) => "$1, $2, $3",
            Db::MySql(_) => "?, ?, ?",
        }
    );
    for (key, run) in outcome {
        let written = match &db {
            Db::Postgres(pool) => sqlx::query(&insert)
                .bind(&key)
                .bind(run)
                .bind(child as i32)
                .execute(pool)
                .await
                .map(drop),
            Db::MySql(pool) => sqlx::query(&insert)
                .bind(&key)
                .bind(run)
                .bind(child as i32)
                .execute(pool)
                .await
                .map(drop),
        };
        written.expect("write a result");
    }
}

// --- purge while claiming -------------------------------------------------

const EXPIRED: usize = 3_000;
const CONTESTED: usize = 200;
const FRESH: usize = 200;
const PURGE_BATCH: usize = 100;

/// Creates `EXPIRED` records that expire at once, then purges them in
/// batches while `FRESH` new keys and `CONTESTED` of the expired keys are
/// claimed. Every expired record ends either purged or taken over by a
/// claim, none is left, every claim runs once, and no claim waits long.
async fn purge_while_claiming(store: Arc<dyn Store>, db: Db, table: &str) {
    let scope = Scope::new(SCOPE);
    let keys: Vec<Key> = (0..EXPIRED)
        .map(|i| Key::new(format!("expired-{i}")).unwrap())
        .collect();
    let ttl = Duration::from_millis(1_500);
    let fingerprint = idem::Fingerprint::of(&1).unwrap();
    // Fill through the store, 16 at a time.
    let fill = futures::stream::iter(keys.iter().cloned().map(|key| {
        let (store, scope) = (store.clone(), scope.clone());
        async move {
            let begun = store
                .begin(&idem::store::BeginRequest {
                    scope: &scope,
                    key: &key,
                    fingerprint: &fingerprint,
                    token: idem::record::ClaimToken::new(),
                    lease: Duration::from_secs(30),
                    ttl,
                })
                .await
                .unwrap();
            let idem::record::Begin::Claimed(claim) = begun else {
                panic!("a fresh key was not claimed: {begun:?}")
            };
            store
                .complete(
                    &claim,
                    &idem::record::Outcome {
                        kind: idem::record::OutcomeKind::Ok,
                        body: b"0".to_vec(),
                    },
                )
                .await
                .unwrap();
        }
    }));
    futures::StreamExt::for_each_concurrent(fill, 16, |f| f).await;
    tokio::time::sleep(ttl + Duration::from_millis(200)).await;
    let t = db.ident(table);
    let cutoff = now_millis();
    assert_eq!(
        db.count(&format!(
            "SELECT COUNT(*) FROM {t} WHERE expires_at <= {cutoff}"
        ))
        .await,
        EXPIRED as i64
    );

    let mut guard = Guard::tables(db.server());
    let runs = guard.table("runs");
    db.create_runs_table(&runs).await;
    let barrier = Arc::new(Barrier::new(CONTESTED + FRESH + 1));
    let claims: Vec<_> = (0..CONTESTED + FRESH)
        .map(|i| {
            let (store, db, barrier, runs) =
                (store.clone(), db.clone(), barrier.clone(), runs.clone());
            let key = if i < CONTESTED {
                // Spread over the expiry index, so claims and batches meet.
                format!("expired-{}", i * (EXPIRED / CONTESTED))
            } else {
                format!("fresh-{i}")
            };
            tokio::spawn(async move {
                barrier.wait().await;
                let started = Instant::now();
                let result = charge(&*store, &db, &runs, &key).await;
                (key, result, started.elapsed())
            })
        })
        .collect();
    let purge = {
        let (store, barrier) = (store.clone(), barrier.clone());
        tokio::spawn(async move {
            barrier.wait().await;
            store.purge_expired(PURGE_BATCH).await
        })
    };
    let mut slowest = Duration::ZERO;
    for claim in claims {
        let (key, result, took) = claim.await.unwrap();
        result.unwrap_or_else(|err| panic!("claim on {key} failed: {err:?}"));
        slowest = slowest.max(took);
    }
    let purged = purge.await.unwrap().expect("purge");

    // Each contested key was either purged first (then claimed afresh, fence
    // 1) or taken over by its claim first (fence 2, not purged).
    let taken_over = db
        .count(&format!(
            "SELECT COUNT(*) FROM {t} WHERE {} LIKE 'expired-%' AND fence = 2",
            db.ident("key")
        ))
        .await;
    eprintln!(
        "{:?}: purged {purged}, taken over {taken_over}, slowest claim {slowest:?}",
        db.server()
    );
    assert_eq!(
        purged + taken_over as u64,
        EXPIRED as u64,
        "every expired record is purged or taken over ({purged} purged, {taken_over} taken over)"
    );
    assert_eq!(
        db.count(&format!(
            "SELECT COUNT(*) FROM {t} WHERE expires_at <= {cutoff}"
        ))
        .await,
        0,
        "expired records left"
    );
    assert_eq!(
        db.count(&format!("SELECT COUNT(*) FROM {t}")).await,
        (CONTESTED + FRESH) as i64
    );
    let r = db.ident(&runs);
    assert_eq!(
        db.count(&format!("SELECT COUNT(*) FROM {r}")).await,
        (CONTESTED + FRESH) as i64,
        "one run per claimed key"
    );
    assert!(
        slowest < Duration::from_secs(5),
        "a claim waited {slowest:?} while the purge ran"
    );
    assert_eq!(store.purge_expired(PURGE_BATCH).await.unwrap(), 0);
}

common::backends!(postgres, mysql => {
    #[tokio::test(flavor = "multi_thread", worker_threads = 4)]
    async fn storm_through_a_pool_of_16() {
        let (store, guard) = backend::store(16).await;
        let db = backend::db(&store);
        storm_in_one_process(Arc::new(store), db, guard).await;
    }

    #[tokio::test(flavor = "multi_thread", worker_threads = 4)]
    async fn storm_across_processes() {
        if let Ok(spec) = std::env::var(CHILD_VAR) {
            return storm_child(&spec, |records| async move {
                let store = backend::store_at(&records, 8).await;
                let db = backend::db(&store);
                (Arc::new(store) as Arc<dyn Store>, db)
            })
            .await;
        }
        let test = common::test_name(concat!(module_path!(), "::storm_across_processes"));
        super::storm_across_processes(backend::SERVER, test).await;
    }

    #[tokio::test(flavor = "multi_thread", worker_threads = 4)]
    async fn purge_while_claiming() {
        let (store, _guard) = backend::store(16).await;
        let (db, table) = (backend::db(&store), store.table_name().to_owned());
        super::purge_while_claiming(Arc::new(store), db, &table).await;
    }
});
