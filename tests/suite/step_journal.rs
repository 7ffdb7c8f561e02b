//! The step journal under races, on every store:
//!
//! - a stopped owner's late journal write racing the takeover that
//!   replaces it: the write lands before the takeover (the successor then
//!   replays the step) or is refused (the successor then finds the step in
//!   doubt); never both landed and rerun;
//! - an owner's step completion racing an operator's forget: no entry
//!   survives the forget;
//! - steps of one operation begun at once (`join!`): each is journaled at
//!   its place, and a retry replays them all (MariaDB's gap locks, which
//!   make such inserts deadlock, are retried).

use crate::common;
use crate::common::journal_of;

use std::sync::atomic::{AtomicUsize, Ordering};
use std::sync::Arc;
use std::time::Duration;

use idem::journal::{StepBegin, StepRequest, StepRun};
use idem::record::{Begin, ClaimToken};
use idem::steps::step;
use idem::store::BeginRequest;
use idem::{run, Call, Error, Fingerprint, Key, Policy, Scope, Store};

/// One race of a stopped owner's step completion against a successor's
/// takeover and step begin. Returns what each got.
async fn one_race<S: Store>(store: &S) -> (Result<(), Error>, StepBegin) {
    let (scope, key) = (
        Scope::new("journal.race"),
        Key::new(common::fresh("race")).unwrap(),
    );
    let fingerprint = Fingerprint::of(&1).unwrap();
    let lease = Duration::from_millis(100);
    let ttl = Duration::from_secs(60);
    let request = |token| BeginRequest {
        scope: &scope,
        key: &key,
        fingerprint: &fingerprint,
        token,
        lease,
        ttl,
    };
    let Begin::Claimed(stopped) = store.begin(&request(ClaimToken::new())).await.unwrap() else {
        panic!("not claimed")
    };
    let fingerprint = &fingerprint;
    assert_eq!(
        journal_of(&store)
            .begin_step(&common::step_request(
                &stopped,
                (0, "charge"),
                fingerprint,
                ttl,
                false
            ))
            .await
            .unwrap(),
        StepBegin::Run(StepRun::Fresh)
    );
    // Just before the lease lapses: the two meet.
    tokio::time::sleep(lease - Duration::from_millis(5)).await;
    let late = async {
        journal_of(&store)
            .complete_step(
                &common::step_request(&stopped, (0, "charge"), fingerprint, ttl, false),
                b"\"ch_1\"",
            )
            .await
    };
    let successor = async {
        let token = ClaimToken::new();
        loop {
            match store.begin(&request(token)).await.unwrap() {
                Begin::Claimed(claim) => {
                    return journal_of(&store)
                        .begin_step(&common::step_request(
                            &claim,
                            (0, "charge"),
                            fingerprint,
                            ttl,
                            true,
                        ))
                        .await
                        .unwrap()
                }
                Begin::InProgress { .. } => tokio::time::sleep(Duration::from_millis(1)).await,
                other => panic!("{other:?}"),
            }
        }
    };
    tokio::join!(late, successor)
}

async fn late_write_races_the_takeover<S: Store>(store: S) {
    let (mut landed, mut refused) = (0, 0);
    for _ in 0..25 {
        match one_race(&store).await {
            (Ok(()), StepBegin::Replay(output)) => {
                assert_eq!(output, b"\"ch_1\"");
                landed += 1;
            }
            (Err(Error::LeaseLost), StepBegin::Run(StepRun::Adopted)) => refused += 1,
            other => panic!("the late write and the takeover both won: {other:?}"),
        }
    }
    println!("late write landed first {landed} times, refused {refused} times");
}

/// An owner's step completion racing an operator's forget: whichever
/// lands first, no journal entry survives the forget, and the completion
/// either landed before it or is refused.
async fn completion_races_a_forget<S: Store>(store: S) {
    let fingerprint = Fingerprint::of(&1).unwrap();
    let ttl = Duration::from_secs(60);
    for _ in 0..20 {
        let (scope, key) = (
            Scope::new("journal.forget"),
            Key::new(common::fresh("forget")).unwrap(),
        );
        let request = BeginRequest {
            scope: &scope,
            key: &key,
            fingerprint: &fingerprint,
            token: ClaimToken::new(),
            lease: Duration::from_secs(30),
            ttl,
        };
        let Begin::Claimed(claim) = store.begin(&request).await.unwrap() else {
            panic!("not claimed")
        };
        let step = StepRequest {
            claim: &claim,
            seq: 0,
            name: "charge",
            fingerprint: &fingerprint,
            ttl,
            adopt: false,
            settle: Duration::ZERO,
        };
        journal_of(&store).begin_step(&step).await.unwrap();
        let (completed, forgot) = tokio::join!(
            journal_of(&store).complete_step(&step, b"1"),
            store.forget(&scope, &key)
        );
        assert!(forgot.unwrap());
        assert!(
            matches!(completed, Ok(()) | Err(Error::LeaseLost)),
            "{completed:?}"
        );
        assert!(
            journal_of(&store)
                .steps(&scope, &key)
                .await
                .unwrap()
                .is_empty(),
            "an entry survived the forget"
        );
    }
}

async fn steps_begun_at_once_replay<S: Store>(store: S) {
    let calls = Arc::new(AtomicUsize::new(0));
    let key = common::fresh("join");
    let attempt = |fail: bool| {
        let (store, calls, key) = (&store, calls.clone(), key.clone());
        async move {
            run(
                store,
                Call::new("journal.join", &key, &1).with_policy(Policy::new()),
                async {
                    let call = |n: u64| {
                        let calls = calls.clone();
                        move |_key| async move {
                            calls.fetch_add(1, Ordering::SeqCst);
                            tokio::task::yield_now().await;
                            Ok::<_, Error>(n)
                        }
                    };
                    let (a, b, c) =
                        tokio::join!(step("a", call(1)), step("b", call(2)), step("c", call(3)));
                    let sum: u64 = a? + b? + c?;
                    if fail {
                        return Err(Error::Config("failing on purpose".into()));
                    }
                    Ok(sum)
                },
            )
            .await
        }
    };
    for _ in 0..3 {
        assert!(attempt(true).await.is_err());
    }
    assert_eq!(attempt(false).await.unwrap(), 6);
    assert_eq!(calls.load(Ordering::SeqCst), 3, "a step ran again");
    let entries = journal_of(&store)
        .steps(
            &Scope::new("journal.join"),
            &Key::new(key.as_str()).unwrap(),
        )
        .await
        .unwrap();
    let names: Vec<_> = entries.iter().map(|e| (e.seq, e.name.as_str())).collect();
    assert_eq!(names, [(0, "a"), (1, "b"), (2, "c")]);
}

common::backends!(memory, sqlite_file, sqlite_memory, postgres, mysql => {
    #[tokio::test(flavor = "multi_thread", worker_threads = 4)]
    async fn a_late_step_write_races_the_takeover() {
        let (store, _guard) = backend::store(8).await;
        super::late_write_races_the_takeover(store).await;
    }

    #[tokio::test(flavor = "multi_thread", worker_threads = 4)]
    async fn a_step_completion_races_a_forget() {
        let (store, _guard) = backend::store(8).await;
        super::completion_races_a_forget(store).await;
    }

    #[tokio::test(flavor = "multi_thread", worker_threads = 4)]
    async fn steps_begun_at_once_are_journaled_in_place() {
        let (store, _guard) = backend::store(8).await;
        super::steps_begun_at_once_replay(store).await;
    }

    backend::if_sql! {
    /// An atomic phase (`Step::in_transaction`): the step's row and its
    /// journal entry commit together. Rolled back, the step is in doubt
    /// and runs again (its row was never kept); committed, it replays
    /// without writing its row again.
    #[tokio::test(flavor = "multi_thread", worker_threads = 4)]
    async fn an_atomic_phase_commits_its_rows_with_its_entry() {
        use idem::steps::Step;

        let (store, _guard) = backend::store(8).await;
        let pool = store.pool().clone();
        let rows = format!("phase_rows_{}", std::process::id());
        sqlx::query(&format!("CREATE TABLE IF NOT EXISTS {rows} (k VARCHAR(100) NOT NULL)"))
            .execute(&pool)
            .await
            .unwrap();
        let key = crate::common::fresh("phase");
        let count = || async {
            let n: i64 = sqlx::query_scalar(&format!(
                "SELECT COUNT(*) FROM {rows} WHERE k = {}",
                backend::param(1)
            ))
            .bind(&key)
            .fetch_one(&pool)
            .await
            .unwrap();
            n
        };
        // `commit`: whether the phase's transaction commits; `fail`:
        // whether the body fails after it.
        let attempt = |commit: bool, fail: bool| {
            let (store, pool, rows, key) = (&store, &pool, &rows, &key);
            async move {
                run(store, Call::new("journal.phase", key, &1), async move {
                    let mut tx = pool.begin().await?;
                    let made: u64 = Step::new("create")
                        .in_transaction(store, &mut *tx, |conn, _step_key| async move {
                            let insert = format!(
                                "INSERT INTO {rows} (k) VALUES ({})",
                                backend::param(1)
                            );
                            let written = sqlx::query(&insert).bind(key).execute(&mut *conn).await;
                            (written.map(|_| 1u64).map_err(Error::from), conn)
                        })
                        .await?;
                    if commit {
                        tx.commit().await?;
                    } else {
                        tx.rollback().await?;
                    }
                    if fail {
                        return Err(Error::Config("failing after the phase".into()));
                    }
                    Ok::<_, Error>(made)
                })
                .await
            }
        };
        // Rolled back: nothing kept; the retry runs the phase again.
        assert!(attempt(false, true).await.is_err());
        assert_eq!(count().await, 0);
        // Committed, then the body fails: the row and the entry stay.
        assert!(attempt(true, true).await.is_err());
        assert_eq!(count().await, 1);
        // The retry replays the phase: no second row.
        assert_eq!(attempt(true, false).await.unwrap(), 1);
        assert_eq!(count().await, 1);
        let entries = journal_of(&store)
            .steps(&Scope::new("journal.phase"), &Key::new(key.as_str()).unwrap())
            .await
            .unwrap();
        assert_eq!(entries.len(), 1);
        assert_eq!(entries[0].state, idem::journal::StepState::Completed);
        sqlx::query(&format!("DROP TABLE IF EXISTS {rows}"))
            .execute(&pool)
            .await
            .unwrap();
    }

    /// An atomic phase inside a transaction that already writes (SQLite:
    /// `BEGIN IMMEDIATE`, as the guide recommends, which holds the
    /// database's one write lock): the step's start is not queued behind
    /// the caller's own lock (it waited until SQLite gave up, "database is
    /// locked"). A rerun phase runs and its retry replays; on SQLite a
    /// refusing or reconciling phase, whose start must outlive the
    /// transaction, is refused at once.
    #[tokio::test(flavor = "multi_thread", worker_threads = 4)]
    async fn an_atomic_phase_in_a_transaction_that_already_writes() {
        use idem::steps::{Step, StepKey};

        let (store, _guard) = backend::store(8).await;
        let pool = store.pool().clone();
        let rows = format!("phase_locked_{}", std::process::id());
        sqlx::query(&format!("CREATE TABLE IF NOT EXISTS {rows} (k VARCHAR(100) NOT NULL)"))
            .execute(&pool)
            .await
            .unwrap();
        let insert = format!("INSERT INTO {rows} (k) VALUES ({})", backend::param(1));
        let begin = if backend::NAME.starts_with("sqlite") { "BEGIN IMMEDIATE" } else { "BEGIN" };
        for policy in ["rerun", "refuse", "reconcile"] {
            let key = crate::common::fresh(policy);
            let attempt = || {
                let (store, pool, insert, key) = (&store, &pool, &insert, &key);
                async move {
                    run(store, Call::new("journal.locked_phase", key, &1), async move {
                        let mut tx = pool.begin_with(begin).await?;
                        // The caller's own write first: the write lock is its.
                        sqlx::query(insert).bind(format!("{key}-before")).execute(&mut *tx).await?;
                        // The phase, written where it is passed, so that its
                        // borrow of the connection is the step's to name.
                        macro_rules! phase {
                            () => {
                                |conn, _key: StepKey| async move {
                                    let written =
                                        sqlx::query(insert).bind(key).execute(&mut *conn).await;
                                    (written.map(|_| 1u64).map_err(Error::from), conn)
                                }
                            };
                        }
                        let step = Step::new("create");
                        let made: u64 = match policy {
                            "rerun" => step.in_transaction(store, &mut *tx, phase!()).await?,
                            "refuse" => {
                                step.refuse().in_transaction(store, &mut *tx, phase!()).await?
                            }
                            _ => {
                                step.reconcile(|_key| async { Ok::<_, Error>(None) })
                                    .in_transaction(store, &mut *tx, phase!())
                                    .await?
                            }
                        };
                        tx.commit().await?;
                        Ok::<_, Error>(made)
                    })
                    .await
                }
            };
            let first = tokio::time::timeout(std::time::Duration::from_secs(10), attempt())
                .await
                .unwrap_or_else(|_| panic!("{policy}: the phase waited on the caller's own lock"));
            if backend::NAME.starts_with("sqlite") && policy != "rerun" {
                // Its start must outlive the transaction, which holds the
                // lock the start would wait for: refused at once.
                assert!(
                    matches!(&first, Err(Error::Config(why)) if why.contains("write lock")),
                    "{policy}: {first:?}"
                );
                continue;
            }
            assert_eq!(first.unwrap(), 1, "{policy}");
            assert_eq!(attempt().await.unwrap(), 1, "{policy}: the replay");
            let n: i64 = sqlx::query_scalar(&format!(
                "SELECT COUNT(*) FROM {rows} WHERE k = {}",
                backend::param(1)
            ))
            .bind(&key)
            .fetch_one(&pool)
            .await
            .unwrap();
            assert_eq!(n, 1, "{policy}: the phase's row, once");
        }
        sqlx::query(&format!("DROP TABLE IF EXISTS {rows}"))
            .execute(&pool)
            .await
            .unwrap();
    }
    }
});
