//! The SQL stores' kept connections (`src/backend/warm.rs`) killed by the
//! server (`pg_terminate_backend`, `KILL CONNECTION`) between two
//! statements of one call or between calls, on the flows that
//! `kept_connections` does not reach:
//!
//! - the release of a key whose body failed (the release's first attempt
//!   lands on a dead kept connection): released in line, the retry runs;
//! - renewals while the body runs, with every kept connection killed
//!   again and again: the claim is never taken over, duplicates never run;
//! - a waiter in another "process" (a second store on the same table, with
//!   kept connections of its own) whose looks land on dead kept
//!   connections: it gets the replay;
//! - transactional mode after a kill (MariaDB reads beside the caller's
//!   transaction on a kept connection): replays and first executions run
//!   once.
//!
//! Each case counts body runs and asserts exactly one per key (or two,
//! when the first released the key).

use crate::common;

use std::sync::atomic::{AtomicBool, AtomicUsize, Ordering};
use std::sync::Arc;
use std::time::Duration;

use idem::{run, run_in_transaction, Call, Error, Key, Policy, Scope, Store};

const SCOPE: &str = "kept_connection_kills.charge";

/// Kills every connection of the namespace (at least one), and waits
/// until the server has closed them.
async fn kill_all(ns: &common::namespace::Namespace) {
    assert!(ns.kill_connections().await > 0, "no connection to kill");
    closed(ns).await;
}

/// Kills whatever connections of the namespace are open, possibly none,
/// and waits until the server has closed those (others may open
/// meanwhile).
async fn kill_any(ns: &common::namespace::Namespace) -> usize {
    let ids = ns.connections().await.unwrap();
    for id in &ids {
        ns.kill(*id).await;
    }
    for _ in 0..500 {
        let open = ns.connections().await.unwrap();
        if !ids.iter().any(|id| open.contains(id)) {
            return ids.len();
        }
        tokio::time::sleep(Duration::from_millis(10)).await;
    }
    panic!("the killed connections stayed open");
}

async fn closed(ns: &common::namespace::Namespace) {
    for _ in 0..500 {
        if ns.connections().await.unwrap().is_empty() {
            return;
        }
        tokio::time::sleep(Duration::from_millis(10)).await;
    }
    panic!("the killed connections stayed open");
}

/// A body's own failure: not stored, so the engine releases the key.
#[derive(Debug)]
enum Failure {
    Declined,
    Idem(#[allow(dead_code)] Error),
}

impl From<Error> for Failure {
    fn from(err: Error) -> Self {
        Failure::Idem(err)
    }
}

common::backends!(postgres, mysql => {
    /// The body fails after every connection was killed: the release's
    /// first attempt lands on a dead kept connection and must run again
    /// on the next, in line. The key is free at once, and the caller's
    /// retry runs the body (a second and last time).
    #[tokio::test(flavor = "multi_thread", worker_threads = 2)]
    async fn a_release_on_a_killed_kept_connection_frees_the_key_in_line() {
        let ns = Arc::new(backend::namespace("kk_release").await);
        let store = backend::Store::new(backend::pool(&ns, 8).await);
        store.migrate().await.unwrap();
        let runs = common::Runs::default();
        for key in ["warm-1", "warm-2", "warm-3"] {
            let runs = runs.clone();
            run(&store, Call::new(SCOPE, key, &1), async move {
                runs.next();
                Ok::<_, Failure>(key.to_owned())
            })
            .await
            .unwrap();
        }
        let failed = {
            let (ns, runs) = (ns.clone(), runs.clone());
            run(&store, Call::new(SCOPE, "r", &1), async move {
                runs.next();
                kill_all(&ns).await;
                Err::<String, _>(Failure::Declined)
            })
            .await
        };
        assert!(matches!(failed, Err(Failure::Declined)), "{failed:?}");
        assert_eq!(runs.count(), 4);
        let (scope, key) = (Scope::new(SCOPE), Key::try_from("r").unwrap());
        let record = store.get(&scope, &key).await.unwrap();
        assert!(record.is_none(), "the release did not land in line: {record:?}");
        // The retry runs, once; its replay does not.
        let retried = {
            let runs = runs.clone();
            run(&store, Call::new(SCOPE, "r", &1), async move {
                runs.next();
                Ok::<_, Failure>("charged r".to_owned())
            })
            .await
            .unwrap()
        };
        assert_eq!(retried, "charged r");
        kill_all(&ns).await;
        let replayed = {
            let runs = runs.clone();
            run(&store, Call::new(SCOPE, "r", &1), async move {
                runs.next();
                Ok::<_, Failure>("charged again".to_owned())
            })
            .await
            .unwrap()
        };
        assert_eq!(replayed, "charged r");
        assert_eq!(runs.count(), 5, "a body ran twice");
    }

    /// A lease of 1.5 s, renewed every 500 ms, while every connection of
    /// the namespace is killed every ~60 ms: each renewal finds its kept
    /// connection dead. Duplicates that fail fast keep asking all along;
    /// none may find the lease lapsed and take the key over. (With a
    /// lease of 300 ms, a run of the whole suite on two busy cores once
    /// took longer than that to land a renewal through the kills: a
    /// lapse the lease allows, not a renewal lost.)
    #[tokio::test(flavor = "multi_thread", worker_threads = 2)]
    async fn renewals_on_killed_kept_connections_keep_the_claim() {
        let ns = Arc::new(backend::namespace("kk_renew").await);
        let store = backend::Store::new(backend::pool(&ns, 8).await);
        store.migrate().await.unwrap();
        let policy = Policy::new().lease(Duration::from_millis(1500)).fail_fast();
        for key in ["warm-1", "warm-2", "warm-3"] {
            run(&store, Call::new(SCOPE, key, &1).with_policy(policy), async move {
                Ok::<_, Error>(key.to_owned())
            })
            .await
            .unwrap();
        }
        let (owner_runs, duplicate_runs) = (common::Runs::default(), common::Runs::default());
        let done = Arc::new(AtomicBool::new(false));
        let kills = Arc::new(AtomicUsize::new(0));
        let owner = {
            let (store, ns, runs, kills) =
                (store.clone(), ns.clone(), owner_runs.clone(), kills.clone());
            tokio::spawn(async move {
                run(&store, Call::new(SCOPE, "lease", &1).with_policy(policy), async move {
                    runs.next();
                    // Three renewals' worth, killing all along.
                    for _ in 0..30 {
                        kills.fetch_add(kill_any(&ns).await, Ordering::SeqCst);
                        tokio::time::sleep(Duration::from_millis(60)).await;
                    }
                    Ok::<_, Error>("charged lease".to_owned())
                })
                .await
            })
        };
        let duplicates = {
            let (store, runs, done) = (store.clone(), duplicate_runs.clone(), done.clone());
            tokio::spawn(async move {
                let mut answers = Vec::new();
                tokio::time::sleep(Duration::from_millis(50)).await;
                while !done.load(Ordering::SeqCst) {
                    let runs = runs.clone();
                    let answer = run(
                        &store,
                        Call::new(SCOPE, "lease", &1).with_policy(policy),
                        async move {
                            runs.next();
                            Ok::<_, Error>("charged by a duplicate".to_owned())
                        },
                    )
                    .await;
                    answers.push(format!("{answer:?}"));
                    tokio::time::sleep(Duration::from_millis(20)).await;
                }
                answers
            })
        };
        let owned = owner.await.unwrap();
        done.store(true, Ordering::SeqCst);
        let answers = duplicates.await.unwrap();
        assert_eq!(owned.unwrap(), "charged lease");
        assert!(kills.load(Ordering::SeqCst) > 5, "too few kills to mean anything");
        assert_eq!(
            (owner_runs.count(), duplicate_runs.count()),
            (1, 0),
            "a duplicate took the key over: {answers:?}"
        );
        assert!(
            answers.iter().all(|a| a.contains("InProgress") || a.contains("charged lease")),
            "{answers:?}"
        );
        let replayed = run(&store, Call::new(SCOPE, "lease", &1), async {
            Ok::<_, Error>("charged again".to_owned())
        })
        .await
        .unwrap();
        assert_eq!(replayed, "charged lease");
    }

    /// A duplicate in another "process" (a second store on the same
    /// table, with its own kept connections) waits for the first call;
    /// its looks at the record land on dead kept connections. It gets
    /// the replay; the body ran once.
    #[tokio::test(flavor = "multi_thread", worker_threads = 2)]
    async fn a_waiter_in_another_process_on_killed_kept_connections_replays() {
        let ns = Arc::new(backend::namespace("kk_wait").await);
        let first = backend::Store::new(backend::pool(&ns, 8).await);
        first.migrate().await.unwrap();
        let second = backend::Store::new(backend::pool(&ns, 8).await);
        let runs = common::Runs::default();
        for (store, key) in [(&first, "warm-1"), (&second, "warm-2"), (&second, "warm-3")] {
            run(store, Call::new(SCOPE, key, &1), async move { Ok::<_, Error>(key.to_owned()) })
                .await
                .unwrap();
        }
        let (killed_tx, killed_rx) = tokio::sync::oneshot::channel();
        let owner = {
            let (store, ns, runs) = (first.clone(), ns.clone(), runs.clone());
            tokio::spawn(async move {
                run(&store, Call::new(SCOPE, "w", &1), async move {
                    runs.next();
                    kill_all(&ns).await;
                    let _ = killed_tx.send(());
                    tokio::time::sleep(Duration::from_millis(400)).await;
                    Ok::<_, Error>("charged w".to_owned())
                })
                .await
            })
        };
        killed_rx.await.unwrap();
        // The waiter's store kept connections from its warm-up calls;
        // they are dead now.
        let waited = {
            let runs = runs.clone();
            run(&second, Call::new(SCOPE, "w", &1), async move {
                runs.next();
                Ok::<_, Error>("charged by the waiter".to_owned())
            })
            .await
        };
        assert_eq!(owner.await.unwrap().unwrap(), "charged w");
        assert_eq!(waited.unwrap(), "charged w");
        assert_eq!(runs.count(), 1, "a body ran twice");
    }

    /// Transactional mode after a kill: the duplicate's read beside the
    /// caller's transaction (MariaDB) takes a dead kept connection first.
    /// The duplicate replays; a new key after a kill runs once and its
    /// record commits with the caller's transaction.
    #[tokio::test(flavor = "multi_thread", worker_threads = 2)]
    async fn transactional_calls_after_a_kill_run_once() {
        let ns = Arc::new(backend::namespace("kk_tx").await);
        let store = backend::Store::new(backend::pool(&ns, 8).await);
        store.migrate().await.unwrap();
        let runs = common::Runs::default();
        let in_tx = |key: &'static str| {
            let (store, runs) = (store.clone(), runs.clone());
            async move {
                let mut tx = store.pool().begin().await.unwrap();
                let answer = run_in_transaction(
                    &store,
                    &mut *tx,
                    Call::new(SCOPE, key, &1),
                    |conn| async move {
                        let n = runs.next();
                        (Ok::<_, Error>(format!("charged {key} #{n}")), conn)
                    },
                )
                .await;
                tx.commit().await.unwrap();
                answer
            }
        };
        // Warm: the reads beside the transactions leave kept connections.
        for key in ["warm-1", "warm-2", "warm-3", "t"] {
            in_tx(key).await.unwrap();
        }
        assert_eq!(runs.count(), 4);
        kill_all(&ns).await;
        assert_eq!(in_tx("t").await.unwrap(), "charged t #4", "the replay");
        kill_all(&ns).await;
        assert_eq!(in_tx("t2").await.unwrap(), "charged t2 #5");
        kill_all(&ns).await;
        assert_eq!(in_tx("t2").await.unwrap(), "charged t2 #5", "the replay");
        assert_eq!(runs.count(), 5, "a body ran twice");
    }
});
