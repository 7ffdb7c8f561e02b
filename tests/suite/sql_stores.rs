//! The PostgreSQL and MariaDB/MySQL stores when connections die,
//! when several processes migrate at once, when waiters sit in another
//! process, and with keys and scopes that differ only in case or spaces.
#![cfg(any(feature = "postgres", feature = "mysql"))]

use crate::common;

use std::sync::Arc;
use std::time::{Duration, Instant, SystemTime, UNIX_EPOCH};

use common::backend::Guard;
use common::servers::Db;
use common::Runs;
use idem::record::State;
use idem::{run, Call, Error, Key, Policy, Scope, Store};
use tokio::sync::oneshot;

const SCOPE: &str = "sql_stores.charge";

async fn charge(store: &dyn Store, key: &str, policy: Policy, runs: &Runs) -> Result<usize, Error> {
    run(
        store,
        Call::new(SCOPE, key, &1).with_policy(policy),
        async { Ok(runs.next()) },
    )
    .await
}

/// A row lock held by an open transaction of the test, as another
/// application instance would hold it.
enum RowLock {
    Postgres(sqlx::Transaction<'static, sqlx::Postgres>),
    MySql(sqlx::Transaction<'static, sqlx::MySql>),
}

impl RowLock {
    /// Locks the record of `key` (`SELECT ... FOR UPDATE`).
    async fn take(db: &Db, table: &str, key: &str) -> RowLock {
        let sql = format!(
            "SELECT fence FROM {} WHERE scope = {} AND {} = {} FOR UPDATE",
            db.ident(table),
            if matches!(db, Db::Postgres(_)) {
                "$1"
            } else {
                "?"
            },
            db.ident("key"),
            if matches!(db, Db::Postgres(_)) {
                "$2"
            } else {
                "?"
            },
        );
        match db {
            Db::Postgres(pool) => {
                let mut tx = pool.begin().await.unwrap();
                let fence: i64 = sqlx::query_scalar(&sql)
                    .bind(SCOPE)
                    .bind(key)
                    .fetch_one(&mut *tx)
                    .await
                    .unwrap();
                assert!(fence > 0);
                RowLock::Postgres(tx)
            }
            Db::MySql(pool) => {
                let mut tx = pool.begin().await.unwrap();
                let fence: i64 = sqlx::query_scalar(&sql)
                    .bind(SCOPE)
                    .bind(key)
                    .fetch_one(&mut *tx)
                    .await
                    .unwrap();
                assert!(fence > 0);
                RowLock::MySql(tx)
            }
        }
    }

    async fn release(self) {
        match self {
            RowLock::Postgres(tx) => tx.rollback().await.unwrap(),
            RowLock::MySql(tx) => tx.rollback().await.unwrap(),
        }
    }
}

/// Kills every other session whose running statement contains `part`
/// (`pg_terminate_backend` / `KILL`). Answers how many.
async fn kill_sessions_running(db: &Db, part: &str) -> usize {
    let pattern = format!("%{}%", part.replace('%', "\\%").replace('_', "\\_"));
    match db {
        Db::Postgres(pool) => {
            let pids: Vec<i32> = sqlx::query_scalar(
                "SELECT pid FROM pg_stat_activity
                 WHERE pid <> pg_backend_pid() AND state = 'active' AND query LIKE $1",
            )
            .bind(&pattern)
            .fetch_all(pool)
            .await
            .unwrap();
            for pid in &pids {
                sqlx::query("SELECT pg_terminate_backend($1)")
                    .bind(pid)
                    .execute(pool)
                    .await
                    .unwrap();
            }
            pids.len()
        }
        Db::MySql(pool) => {
            let ids: Vec<i64> = sqlx::query_scalar(
                "SELECT id FROM information_schema.processlist
                 WHERE id <> CONNECTION_ID() AND info LIKE ?",
            )
            .bind(&pattern)
            .fetch_all(pool)
            .await
            .unwrap();
            for id in &ids {
                // An id is an integer: nothing to escape. A session that
                // ended meanwhile is no error of the test.
                let _ = sqlx::raw_sql(&format!("KILL {id}")).execute(pool).await;
            }
            ids.len()
        }
    }
}

/// Kills sessions running a statement that contains `prefix` until
/// `until` is ready; answers its output and how many sessions were killed.
async fn kill_until<T>(
    db: &Db,
    prefix: &str,
    until: impl std::future::Future<Output = T>,
) -> (T, usize) {
    tokio::pin!(until);
    let mut killed = 0;
    let deadline = Instant::now() + Duration::from_secs(60);
    loop {
        tokio::select! {
            out = &mut until => return (out, killed),
            _ = tokio::time::sleep(Duration::from_millis(20)) => {
                assert!(Instant::now() < deadline, "the call never ended");
                killed += kill_sessions_running(db, prefix).await;
            }
        }
    }
}

/// The error is `Error::Store`, caused by the database driver.
fn assert_store_error_with_cause(err: &Error) {
    let Error::Store(source) = err else {
        panic!("expected Error::Store, got {err:?}")
    };
    let cause = source
        .downcast_ref::<sqlx::Error>()
        .unwrap_or_else(|| panic!("the cause is not a database error: {source:?}"));
    eprintln!("surfaced as: {err} (cause: {cause:?})");
}

/// The records no store should ever write.
async fn completed_without_outcome(db: &Db, table: &str) -> i64 {
    db.count(&format!(
        "SELECT COUNT(*) FROM {} WHERE state = 'completed' AND (outcome IS NULL OR outcome_kind IS NULL)",
        db.ident(table)
    ))
    .await
}

/// A retry of an expired key blocks on its record (another instance holds
/// the row); the connection is killed while the claim waits. The call
/// fails with `Error::Store` and its cause, its body never runs; a retry
/// afterwards claims and completes once.
async fn killed_while_claiming(store: Arc<dyn Store>, db: Db, table: &str) {
    let runs = Runs::default();
    let key = "killed-claim";
    let short = Policy::new().ttl(Duration::from_millis(300));
    assert_eq!(charge(&*store, key, short, &runs).await.unwrap(), 1);
    tokio::time::sleep(Duration::from_millis(400)).await;

    let lock = RowLock::take(&db, table, key).await;
    // PostgreSQL takes an expired record over with an UPDATE (its INSERT
    // does nothing on a conflict); MySQL upserts.
    let claim_sql = match &db {
        Db::Postgres(_) => format!("UPDATE {} AS t SET", db.ident(table)),
        Db::MySql(_) => format!("INSERT INTO {}", db.ident(table)),
    };
    let (result, killed) = kill_until(&db, &claim_sql, charge(&*store, key, short, &runs)).await;
    assert!(killed >= 1);
    assert_store_error_with_cause(&result.unwrap_err());
    assert_eq!(runs.count(), 1, "the body ran although the claim failed");
    lock.release().await;

    assert_eq!(charge(&*store, key, Policy::new(), &runs).await.unwrap(), 2);
    assert_eq!(charge(&*store, key, Policy::new(), &runs).await.unwrap(), 2);
    assert_eq!(runs.count(), 2);
    let record = store
        .get(&Scope::new(SCOPE), &Key::new(key).unwrap())
        .await
        .unwrap()
        .unwrap();
    assert_eq!((record.state, record.fence), (State::Completed, 2));
    assert_eq!(completed_without_outcome(&db, table).await, 0);
}

/// The body runs, then every attempt to store its outcome blocks on the
/// record and has its connection killed. The caller still gets its body's
/// value (the effect happened); the outcome is stored in the background
/// once the record can be written, and every retry replays it: the body
/// ran once. No record is ever completed without its outcome.
async fn killed_while_completing(store: Arc<dyn Store>, db: Db, table: &str) {
    let runs = Runs::default();
    let key = "killed-complete";
    let policy = Policy::new().lease(Duration::from_secs(30)).fail_fast();
    let (started_tx, started_rx) = oneshot::channel();
    let (go_tx, go_rx) = oneshot::channel::<()>();
    let first = {
        let (store, runs) = (store.clone(), runs.clone());
        tokio::spawn(async move {
            run(
                &*store,
                Call::new(SCOPE, key, &1).with_policy(policy),
                async {
                    let n = runs.next();
                    started_tx.send(()).unwrap();
                    go_rx.await.unwrap();
                    Ok::<_, Error>(n)
                },
            )
            .await
        })
    };
    started_rx.await.unwrap();
    let lock = RowLock::take(&db, table, key).await;
    go_tx.send(()).unwrap();
    // PostgreSQL completes and notifies in one statement (`WITH done AS
    // (UPDATE ...) SELECT pg_notify(...)`); MariaDB runs the bare UPDATE.
    let complete_sql = match db {
        Db::Postgres(_) => "WITH done AS (".to_owned(),
        Db::MySql(_) => format!("UPDATE {}", db.ident(table)),
    };
    let (result, killed) = kill_until(&db, &complete_sql, first).await;
    assert_eq!(
        result.unwrap().unwrap(),
        1,
        "the caller gets its body's value"
    );
    assert!(killed >= 1);
    let record = store
        .get(&Scope::new(SCOPE), &Key::new(key).unwrap())
        .await
        .unwrap()
        .unwrap();
    assert_eq!(record.state, State::InProgress);
    lock.release().await;

    // Stored in the background; meanwhile a retry waits, then replays.
    let waiting = Policy::new().wait(Duration::from_secs(20));
    assert_eq!(charge(&*store, key, waiting, &runs).await.unwrap(), 1);
    assert_eq!(runs.count(), 1, "the body ran again");
    let record = store
        .get(&Scope::new(SCOPE), &Key::new(key).unwrap())
        .await
        .unwrap()
        .unwrap();
    assert_eq!((record.state, record.fence), (State::Completed, 1));
    assert_eq!(completed_without_outcome(&db, table).await, 0);

    // The table itself refuses a completed record without an outcome.
    let t = db.ident(table);
    let forge = format!("UPDATE {t} SET state = 'completed', outcome = NULL");
    let forged = match &db {
        Db::Postgres(pool) => sqlx::query(&forge).execute(pool).await.map(drop),
        Db::MySql(pool) => sqlx::query(&forge).execute(pool).await.map(drop),
    };
    assert!(
        forged.is_err(),
        "a completed record without outcome was accepted"
    );
}

/// With a pool of one connection, the connection is killed between the
/// claim and the completion, while the body runs: the pool replaces it
/// and the call completes once.
async fn killed_while_the_body_runs(store: Arc<dyn Store>, pool_of_one: Db, admin: Db) {
    let id_sql = match &pool_of_one {
        Db::Postgres(_) => "SELECT pg_backend_pid()::BIGINT",
        Db::MySql(_) => "SELECT CAST(CONNECTION_ID() AS SIGNED)",
    };
    let runs = Runs::default();
    let killed = run(&*store, Call::new(SCOPE, "killed-body", &1), async {
        let id = pool_of_one.count(id_sql).await;
        admin
            .execute(&match &admin {
                Db::Postgres(_) => format!("SELECT pg_terminate_backend({id})"),
                Db::MySql(_) => format!("KILL {id}"),
            })
            .await;
        Ok::<_, Error>((runs.next(), id))
    })
    .await
    .unwrap();
    // Another connection answers now, and the outcome was stored once.
    assert_ne!(pool_of_one.count(id_sql).await, killed.1);
    let replay = run(&*store, Call::new(SCOPE, "killed-body", &1), async {
        Ok::<_, Error>((runs.next(), 0))
    })
    .await
    .unwrap();
    assert_eq!(replay, killed);
    assert_eq!(runs.count(), 1);
}

/// Several instances starting at once migrate the same new table: each
/// of 4 tasks opens a store on it with `open`, which migrates, and claims.
async fn concurrent_migrations<S, F>(open: impl Fn() -> F)
where
    S: Store + 'static,
    F: std::future::Future<Output = S> + Send + 'static,
{
    let tasks: Vec<_> = (0..4)
        .map(|_| {
            let opening = open();
            tokio::spawn(async move {
                let store = opening.await;
                charge(&store, "after-migration", Policy::new(), &Runs::default())
                    .await
                    .unwrap()
            })
        })
        .collect();
    for task in tasks {
        assert_eq!(task.await.unwrap(), 1);
    }
}

/// Keys and scopes are compared byte for byte: case and trailing spaces
/// make them different.
async fn byte_exact_keys_and_scopes(store: Arc<dyn Store>) {
    let runs = Runs::default();
    let mut seen = Vec::new();
    for (scope, key) in [
        ("exact.op", "abc"),
        ("exact.op", "ABC"),
        ("exact.op", "abc."),
        ("exact.OP", "abc"),
        ("exact.op ", "abc"),
    ] {
        for _ in 0..2 {
            let n = run(&*store, Call::new(scope, key, &1), async {
                Ok::<_, Error>(runs.next())
            })
            .await
            .unwrap();
            seen.push(n);
        }
    }
    assert_eq!(seen, vec![1, 1, 2, 2, 3, 3, 4, 4, 5, 5]);
    // A principal with a line feed and non-ASCII text round-trips.
    let scope = Scope::new("exact.op").with_principal("tenant\nü");
    run(&*store, Call::new(&scope, "k", &1), async {
        Ok::<_, Error>(0)
    })
    .await
    .unwrap();
    let record = store
        .get(&scope, &Key::new("k").unwrap())
        .await
        .unwrap()
        .unwrap();
    assert_eq!(record.scope, scope);
}

/// A record this library cannot have written (in progress without a
/// lease) makes a claim fail with a store error naming the problem, at
/// once: it never loops on it.
async fn corrupt_record_is_an_error_not_a_loop(store: Arc<dyn Store>, db: Db, table: &str) {
    let fingerprint = idem::Fingerprint::of(&1).unwrap().to_hex();
    let t = db.ident(table);
    let (bytes, token) = match &db {
        Db::Postgres(_) => (format!("decode('{fingerprint}', 'hex')"), "NULL".to_owned()),
        Db::MySql(_) => (
            format!("X'{fingerprint}'"),
            format!("X'{}'", "00".repeat(16)),
        ),
    };
    let key = if matches!(db, Db::Postgres(_)) {
        "key"
    } else {
        "`key`"
    };
    db.execute(&format!(
        "INSERT INTO {t} (scope, {key}, fingerprint, state, fence, lease_until, claim_token, \
         created_at, expires_at) VALUES ('{SCOPE}', 'corrupt', {bytes}, 'in_progress', 1, NULL, \
         {token}, 0, 9000000000000)"
    ))
    .await;
    let runs = Runs::default();
    let result = tokio::time::timeout(
        Duration::from_secs(10),
        charge(&*store, "corrupt", Policy::new(), &runs),
    )
    .await
    .expect("a corrupt record made the claim loop");
    let err = result.unwrap_err();
    assert!(
        matches!(&err, Error::Store(e) if e.to_string().contains("corrupt idempotency record")),
        "{err:?}"
    );
    assert_eq!(runs.count(), 0);
}

/// A claim that takes a record over rewrites all of it: after a lapsed
/// lease (same payload) and after expiry (another payload), the record is
/// the new claim's, column by column.
async fn takeover_rewrites_the_whole_record(store: Arc<dyn Store>) {
    use idem::record::{Begin, Outcome, OutcomeKind};
    use idem::store::BeginRequest;
    use idem::Fingerprint;
    let (scope, key) = (Scope::new(SCOPE), Key::new("rewritten").unwrap());
    let (a, b) = (
        Fingerprint::of(&"a").unwrap(),
        Fingerprint::of(&"b").unwrap(),
    );
    let request = |fingerprint, lease: u64, ttl: u64| BeginRequest {
        scope: &scope,
        key: &key,
        fingerprint,
        token: idem::record::ClaimToken::new(),
        lease: Duration::from_millis(lease),
        ttl: Duration::from_millis(ttl),
    };
    let claimed = |begun: Begin| match begun {
        Begin::Claimed(claim) => claim,
        other => panic!("not claimed: {other:?}"),
    };
    let check = |record: idem::record::Record,
                 fingerprint: &Fingerprint,
                 fence,
                 lease: i64,
                 ttl: i64,
                 since| {
        assert_eq!(record.state, State::InProgress);
        assert_eq!(&record.fingerprint, fingerprint);
        assert_eq!(record.fence, fence);
        assert!(record.outcome.is_none());
        assert!(record.created_at >= since, "{record:?}");
        assert_eq!(
            record.lease_until,
            Some(record.created_at + lease),
            "{record:?}"
        );
        // In progress, a record lives at least as long as its lease.
        assert_eq!(
            record.expires_at,
            record.created_at + ttl.max(lease),
            "{record:?}"
        );
    };

    // Held for 200 ms, kept for 60 s.
    claimed(store.begin(&request(&a, 200, 60_000)).await.unwrap());
    tokio::time::sleep(Duration::from_millis(300)).await;
    let since = SystemTime::now()
        .duration_since(UNIX_EPOCH)
        .unwrap()
        .as_millis() as i64;
    // The lease lapsed: taken over with the same payload, new lease and ttl.
    let claim = claimed(store.begin(&request(&a, 5_000, 600)).await.unwrap());
    assert_eq!(claim.fence, 2);
    let record = store.get(&scope, &key).await.unwrap().unwrap();
    check(record, &a, 2, 5_000, 600, since);

    let outcome = Outcome {
        kind: OutcomeKind::Ok,
        body: b"\"done\"".to_vec(),
    };
    store.complete(&claim, &outcome).await.unwrap();
    tokio::time::sleep(Duration::from_millis(700)).await;
    let since = SystemTime::now()
        .duration_since(UNIX_EPOCH)
        .unwrap()
        .as_millis() as i64;
    // Expired: taken over with another payload; the outcome is gone.
    let claim = claimed(store.begin(&request(&b, 3_000, 60_000)).await.unwrap());
    assert_eq!(claim.fence, 3);
    let record = store.get(&scope, &key).await.unwrap().unwrap();
    check(record, &b, 3, 3_000, 60_000, since);
}

common::backends!(postgres, mysql => {
    /// A store on a table of its own, its pool, and the table's name.
    async fn store(max: u32) -> (Arc<dyn Store>, Db, Guard, String) {
        let (store, guard) = backend::store(max).await;
        let (db, table) = (backend::db(&store), store.table_name().to_owned());
        (Arc::new(store), db, guard, table)
    }

    #[tokio::test(flavor = "multi_thread", worker_threads = 2)]
    async fn killed_while_claiming() {
        let (store, db, _guard, table) = store(4).await;
        super::killed_while_claiming(store, db, &table).await;
    }

    #[tokio::test(flavor = "multi_thread", worker_threads = 2)]
    async fn corrupt_record_is_an_error_not_a_loop() {
        let (store, db, _guard, table) = store(4).await;
        super::corrupt_record_is_an_error_not_a_loop(store, db, &table).await;
    }

    #[tokio::test(flavor = "multi_thread", worker_threads = 2)]
    async fn killed_while_completing() {
        let (store, db, _guard, table) = store(4).await;
        super::killed_while_completing(store, db, &table).await;
    }

    #[tokio::test(flavor = "multi_thread", worker_threads = 2)]
    async fn killed_while_the_body_runs() {
        let (store, db, _guard, _) = store(1).await;
        let admin = backend::SERVER.pool(2).await;
        super::killed_while_the_body_runs(store, db, admin).await;
    }

    #[tokio::test(flavor = "multi_thread", worker_threads = 2)]
    async fn concurrent_migrations() {
        let mut guard = Guard::tables(backend::SERVER);
        let table = guard.table("mig");
        super::concurrent_migrations(|| {
            let table = table.clone();
            async move { backend::store_at(&table, 2).await }
        })
        .await;
    }

    #[tokio::test(flavor = "multi_thread", worker_threads = 2)]
    async fn takeover_rewrites_the_whole_record() {
        let (store, _db, _guard, _) = store(2).await;
        super::takeover_rewrites_the_whole_record(store).await;
    }

    #[tokio::test(flavor = "multi_thread", worker_threads = 2)]
    async fn byte_exact_keys_and_scopes() {
        let (store, _db, _guard, _) = store(4).await;
        super::byte_exact_keys_and_scopes(store).await;
    }

    /// A claim that meets another transaction's claim not committed yet
    /// waits for it (the primary key decides), then answers from the
    /// record as it is once that transaction ends: in progress when it
    /// committed (on PostgreSQL the row was committed after the claim's
    /// statement began, so the statement cannot see it and the record is
    /// read again), the key when it rolled back.
    #[tokio::test(flavor = "multi_thread", worker_threads = 2)]
    async fn a_claim_behind_an_uncommitted_claim() {
        use idem::Fingerprint;
        use idem::record::{Begin, ClaimToken};
        use idem::store::BeginRequest;
        let (store, _guard) = backend::store(4).await;
        let scope = Scope::new(SCOPE);
        let fingerprint = Fingerprint::of_bytes(b"one payload");
        for commit in [true, false] {
            let key = Key::new(format!("uncommitted-{commit}")).unwrap();
            fn request<'a>(scope: &'a Scope, key: &'a Key, fp: &'a Fingerprint) -> BeginRequest<'a> {
                BeginRequest {
                    scope,
                    key,
                    fingerprint: fp,
                    token: ClaimToken::new(),
                    lease: Duration::from_secs(30),
                    ttl: Duration::from_secs(60),
                }
            }
            let mut owner = store.pool().begin().await.unwrap();
            let owned = store.begin_on(&mut *owner, &request(&scope, &key, &fingerprint)).await.unwrap();
            assert!(matches!(owned, Begin::Claimed(_)), "{owned:?}");
            let duplicate = {
                let (store, scope, key) = (store.clone(), scope.clone(), key.clone());
                tokio::spawn(async move { store.begin(&request(&scope, &key, &fingerprint)).await })
            };
            tokio::time::sleep(Duration::from_millis(300)).await;
            assert!(!duplicate.is_finished(), "the claim did not wait for the owner's");
            if commit {
                owner.commit().await.unwrap();
            } else {
                owner.rollback().await.unwrap();
            }
            let answer = duplicate.await.unwrap().unwrap();
            if commit {
                assert!(matches!(answer, Begin::InProgress { .. }), "{answer:?}");
            } else {
                assert!(matches!(answer, Begin::Claimed(_)), "{answer:?}");
            }
        }
    }

    /// Connecting, migrating and claiming can run on a task of their own:
    /// their futures are `Send` in every context (which a
    /// `raw_sql(..).execute(..)` inside used to fail).
    #[tokio::test]
    async fn store_futures_can_be_spawned() {
        let url = format!("{}://unused", backend::NAME);
        let connecting_to = url.clone();
        spawnable(async move { backend::Store::connect(&connecting_to).await });
        let pool = sqlx::pool::PoolOptions::<backend::Database>::new()
            .connect_lazy(&url)
            .unwrap();
        let store = backend::Store::new(pool);
        spawnable(async move { store.migrate().await });
    }

    backend::if_mysql! {
        /// MariaDB's `SIMULTANEOUS_ASSIGNMENT` mode evaluates every assignment
        /// of the claim on the old row; the claim must decide the same.
        #[tokio::test(flavor = "multi_thread", worker_threads = 2)]
        async fn takeover_rewrites_the_whole_record_with_simultaneous_assignment() {
            use sqlx::Executor;
            let Db::MySql(probe) = backend::SERVER.pool(1).await else {
                unreachable!()
            };
            let version: String = sqlx::query_scalar("SELECT VERSION()")
                .fetch_one(&probe)
                .await
                .unwrap();
            if !version.contains("MariaDB") {
                eprintln!("{version} is not MariaDB: SIMULTANEOUS_ASSIGNMENT does not exist there");
                return;
            }
            let pool = sqlx::mysql::MySqlPoolOptions::new()
                .max_connections(2)
                .after_connect(|conn, _| {
                    Box::pin(async move {
                        conn.execute(
                            "SET SESSION sql_mode = CONCAT(@@sql_mode, ',SIMULTANEOUS_ASSIGNMENT')",
                        )
                        .await
                        .map(drop)
                    })
                })
                .connect(&backend::SERVER.url())
                .await
                .unwrap();
            let mut guard = Guard::tables(backend::SERVER);
            let table = guard.table("simul");
            let store = idem::MySqlStore::new(pool).with_table_name(&table).unwrap();
            store.migrate().await.unwrap();
            super::takeover_rewrites_the_whole_record(Arc::new(store)).await;
        }

        /// A stored form longer than the table holds (only `Scope::from_stored`
        /// makes one: `Scope` shortens long parts) is refused before any write,
        /// rather than truncated into another scope.
        #[tokio::test(flavor = "multi_thread", worker_threads = 2)]
        async fn overlong_scope_refused() {
            let (store, _db, _guard, _) = store(2).await;
            let long = Scope::from_stored(&format!("op\n{}", "p".repeat(1024)));
            let err = run(&*store, Call::new(&long, "k", &1), async {
                Ok::<_, Error>(())
            })
            .await
            .unwrap_err();
            assert!(matches!(err, Error::Config(_)), "{err:?}");
            let fits = Scope::from_stored(&format!("op\n{}", "p".repeat(1024 - 3)));
            run(&*store, Call::new(&fits, "k", &1), async {
                Ok::<_, Error>(())
            })
            .await
            .unwrap();
            // The same principal given to `with_principal` is shortened to fit.
            let shortened = Scope::new("op").with_principal("p".repeat(1024));
            run(&*store, Call::new(&shortened, "k", &1), async {
                Ok::<_, Error>(())
            })
            .await
            .unwrap();
        }
    }
});

/// PostgreSQL: a waiter on another pool (as in another process, with
/// waiters of its own) is woken by the completion's NOTIFY, long before its
/// timeout.
#[cfg(feature = "postgres")]
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn notify_wakes_waiters_of_other_processes() {
    use common::backend::postgres;
    let (first, _guard) = postgres::store(2).await;
    let other = postgres::store_at(first.table_name(), 2).await;
    let (scope, key) = (Scope::new(SCOPE), Key::new("notified").unwrap());
    let fingerprint = idem::Fingerprint::of(&1).unwrap();
    let request = idem::store::BeginRequest {
        scope: &scope,
        key: &key,
        fingerprint: &fingerprint,
        token: idem::record::ClaimToken::new(),
        lease: Duration::from_secs(30),
        ttl: Duration::from_secs(60),
    };
    let idem::record::Begin::Claimed(claim) = first.begin(&request).await.unwrap() else {
        panic!("not claimed")
    };
    // The first wait starts the listener; give it time to LISTEN.
    other
        .capabilities()
        .waker()
        .wait_for_change(&scope, &key, Duration::from_millis(300))
        .await
        .unwrap();
    for release in [false, true] {
        let claim = if release {
            let request = idem::store::BeginRequest {
                key: &Key::new("notified-release").unwrap(),
                token: idem::record::ClaimToken::new(),
                ..request
            };
            let idem::record::Begin::Claimed(claim) = first.begin(&request).await.unwrap() else {
                panic!("not claimed")
            };
            claim
        } else {
            claim.clone()
        };
        let waiting = {
            let (other, scope, key) = (other.clone(), claim.scope.clone(), claim.key.clone());
            tokio::spawn(async move {
                let started = Instant::now();
                other
                    .capabilities()
                    .waker()
                    .wait_for_change(&scope, &key, Duration::from_secs(20))
                    .await
                    .unwrap();
                started.elapsed()
            })
        };
        tokio::time::sleep(Duration::from_millis(200)).await;
        if release {
            first.release(&claim).await.unwrap();
        } else {
            let outcome = idem::record::Outcome {
                kind: idem::record::OutcomeKind::Ok,
                body: b"1".to_vec(),
            };
            first.complete(&claim, &outcome).await.unwrap();
        }
        let waited = waiting.await.unwrap();
        assert!(
            waited < Duration::from_secs(5),
            "the waiter slept {waited:?} (release: {release})"
        );
    }
}

/// Fails to compile unless the future can be spawned: `tokio::spawn`
/// checks that it is `Send` with lifetimes erased.
fn spawnable<F: std::future::Future + Send + 'static>(_: F) {}

/// Connecting can run on a task of its own.
#[cfg(feature = "sqlite")]
#[tokio::test]
async fn sqlite_store_futures_can_be_spawned() {
    spawnable(async { idem::SqliteStore::connect("sqlite::memory:").await });
}

/// PostgreSQL: a completion nobody waited for sends no `NOTIFY` (a
/// notifying commit takes a database-wide lock), and one that a duplicate
/// of another process found in progress does, so that duplicate is woken.
#[cfg(feature = "postgres")]
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn only_a_completion_waited_for_notifies() {
    use common::backend::postgres;
    let (first, _guard) = postgres::store(4).await;
    let other = Arc::new(postgres::store_at(first.table_name(), 4).await);
    let mut listener = sqlx::postgres::PgListener::connect_with(first.pool())
        .await
        .unwrap();
    listener.listen(first.table_name()).await.unwrap();
    let runs = Runs::default();
    let policy = Policy::new().wait(Duration::from_secs(20));

    charge(&first, "alone", policy, &runs).await.unwrap();
    let heard = tokio::time::timeout(Duration::from_millis(300), listener.recv()).await;
    assert!(
        heard.is_err(),
        "a completion nobody waited for notified: {heard:?}"
    );

    let (started, start) = oneshot::channel();
    let owner = {
        let (first, runs) = (Arc::new(first.clone()), runs.clone());
        tokio::spawn(async move {
            run(
                &*first,
                Call::new(SCOPE, "waited", &1).with_policy(policy),
                async {
                    let _ = started.send(());
                    tokio::time::sleep(Duration::from_millis(500)).await;
                    Ok::<_, Error>(runs.next())
                },
            )
            .await
        })
    };
    start.await.unwrap();
    let duplicate = charge(&*other, "waited", policy, &runs).await.unwrap();
    let notified = tokio::time::timeout(Duration::from_secs(5), listener.recv())
        .await
        .expect("the waited-for completion did not notify")
        .unwrap();
    assert_eq!(notified.payload(), format!("waited {SCOPE}"));
    assert_eq!(owner.await.unwrap().unwrap(), duplicate);
    assert_eq!(runs.count(), 2);
}

/// PostgreSQL: a waiter's look marks the record it waits on, but never
/// waits for a row lock to do so. A transactional owner that took a
/// lapsed record over holds its row until its transaction ends; a waiter
/// looking meanwhile returns (and polls) instead of blocking on it.
#[cfg(feature = "postgres")]
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_look_does_not_wait_for_an_open_takeover() {
    use common::backend::postgres;
    use idem::record::{Begin, ClaimToken};
    use idem::store::BeginRequest;
    use idem::Fingerprint;
    let (store, _guard) = postgres::store(4).await;
    let (scope, key) = (Scope::new(SCOPE), Key::new("lapsed").unwrap());
    let fingerprint = Fingerprint::of_bytes(b"one payload");
    let request = |lease| BeginRequest {
        scope: &scope,
        key: &key,
        fingerprint: &fingerprint,
        token: ClaimToken::new(),
        lease,
        ttl: Duration::from_secs(60),
    };
    // An owner that stopped: its lease lapses.
    let first = store
        .begin(&request(Duration::from_millis(200)))
        .await
        .unwrap();
    assert!(matches!(first, Begin::Claimed(_)), "{first:?}");
    tokio::time::sleep(Duration::from_millis(400)).await;
    // A transactional retry takes it over; its row stays locked.
    let mut tx = store.pool().begin().await.unwrap();
    let taken = store
        .begin_on(&mut *tx, &request(Duration::from_secs(30)))
        .await
        .unwrap();
    assert!(matches!(taken, Begin::Claimed(_)), "{taken:?}");
    let looked = tokio::time::timeout(
        Duration::from_secs(5),
        store
            .capabilities()
            .waker()
            .wait_for_change(&scope, &key, Duration::from_millis(300)),
    )
    .await;
    tx.rollback().await.unwrap();
    assert!(
        looked.is_ok(),
        "the waiter's look waited for the open takeover"
    );
    looked.unwrap().unwrap();
}
