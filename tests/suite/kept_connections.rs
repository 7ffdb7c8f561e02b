//! The connections a SQL store keeps between its own statements (so that
//! each statement is one round trip, without sqlx's test of a connection
//! going back to the pool), killed by the server.
//!
//! - Killed while the body runs: the completion's first attempt lands on
//!   a dead kept connection and runs again on the next; the outcome is
//!   stored once and the body ran once.
//! - Killed between calls: the replay, and a first execution, are answered,
//!   and nothing ran twice.
//! - Killed between two durable steps: the second step's journal write
//!   is decided again on a tested connection, and each step runs once.
//! - Killed before the store's own `begin` (without the engine, which
//!   tries a failed claim again): the claim statement runs again on the
//!   next connection, as sqlx's test would have replaced the connection
//!   before lending it, and answers.
#![cfg(any(feature = "postgres", feature = "mysql"))]

use crate::common;
use crate::common::journal_of;

use std::sync::atomic::{AtomicUsize, Ordering};
use std::sync::Arc;
use std::time::Duration;

use idem::journal::{StepBegin, StepRequest};
use idem::record::{Begin, ClaimToken};
use idem::steps::Step;
use idem::store::BeginRequest;
use idem::{run, Call, Error, Fingerprint, Key, Scope, Store};

const SCOPE: &str = "kept_connections.charge";

/// Kills every connection of the namespace, and waits until the server
/// has closed them (a kill only signals the session).
async fn kill_all(ns: &common::namespace::Namespace) {
    assert!(ns.kill_connections().await > 0, "no connection to kill");
    for _ in 0..500 {
        if ns.connections().await.unwrap().is_empty() {
            return;
        }
        tokio::time::sleep(Duration::from_millis(10)).await;
    }
    panic!("the killed connections stayed open");
}

/// A bare claim's request, as the engine makes it.
fn request<'a>(scope: &'a Scope, key: &'a Key, fingerprint: &'a Fingerprint) -> BeginRequest<'a> {
    BeginRequest {
        scope,
        key,
        fingerprint,
        token: ClaimToken::new(),
        lease: Duration::from_secs(30),
        ttl: Duration::from_secs(3600),
    }
}

common::backends!(postgres, mysql => {
    /// A pool of 8: the store keeps up to 2 connections.
    #[tokio::test(flavor = "multi_thread", worker_threads = 2)]
    async fn killed_kept_connections_neither_fail_a_call_nor_run_a_body_twice() {
        let ns = Arc::new(backend::namespace("kept").await);
        let store = backend::Store::new(backend::pool(&ns, 8).await);
        store.migrate().await.unwrap();
        let runs = Arc::new(AtomicUsize::new(0));
        let call = |key: &'static str, kill: bool| {
            let (ns, runs) = (ns.clone(), runs.clone());
            run(&store, Call::new(SCOPE, key, &1), async move {
                runs.fetch_add(1, Ordering::SeqCst);
                if kill {
                    kill_all(&ns).await;
                }
                Ok::<_, Error>(format!("charged {key}"))
            })
        };
        // Warm: the store keeps connections.
        for key in ["warm-1", "warm-2", "warm-3"] {
            call(key, false).await.unwrap();
        }
        assert_eq!(call("k", true).await.unwrap(), "charged k");
        assert_eq!(runs.load(Ordering::SeqCst), 4);
        kill_all(&ns).await;
        assert_eq!(call("k", false).await.unwrap(), "charged k", "the replay");
        kill_all(&ns).await;
        assert_eq!(call("k2", false).await.unwrap(), "charged k2");
        assert_eq!(runs.load(Ordering::SeqCst), 5, "a body ran twice");
        // The store itself, without the engine's retry of a failed claim:
        // its statement on the dead kept connection runs again on the
        // next, and answers.
        kill_all(&ns).await;
        let (scope, key) = (Scope::new(SCOPE), Key::try_from("k").unwrap());
        let fingerprint = Fingerprint::of(&1).unwrap();
        let begun = store
            .begin(&request(&scope, &key, &fingerprint))
            .await
            .unwrap();
        assert!(matches!(begun, Begin::Replay(_)), "{begun:?}");
        // A bare read (a waiter's poll) likewise.
        kill_all(&ns).await;
        let peeked = store
            .peek(&request(&scope, &key, &fingerprint))
            .await
            .unwrap();
        assert!(matches!(peeked, Some(Begin::Replay(_))), "{peeked:?}");
    }

    /// Steps that refuse when in doubt journal in line, through kept
    /// connections: killed between two steps, the second step's journal
    /// write lands on a dead kept connection, and is decided again on a
    /// tested one. Each step runs once.
    #[tokio::test(flavor = "multi_thread", worker_threads = 2)]
    async fn killed_kept_connections_between_steps_run_each_step_once() {
        let ns = backend::namespace("kept_steps").await;
        let store = backend::Store::new(backend::pool(&ns, 8).await);
        store.migrate().await.unwrap();
        let (first, second) = (AtomicUsize::new(0), AtomicUsize::new(0));
        let out = run(&store, Call::new(SCOPE, "steps", &1), async {
            Step::new("first")
                .refuse()
                .run(|_| async {
                    first.fetch_add(1, Ordering::SeqCst);
                    Ok::<_, Error>(1)
                })
                .await?;
            kill_all(&ns).await;
            Step::new("second")
                .refuse()
                .run(|_| async {
                    second.fetch_add(1, Ordering::SeqCst);
                    Ok::<_, Error>(2)
                })
                .await?;
            Ok::<_, Error>("done".to_owned())
        })
        .await
        .unwrap();
        assert_eq!(out, "done");
        assert_eq!(first.load(Ordering::SeqCst), 1);
        assert_eq!(second.load(Ordering::SeqCst), 1);
        let (scope, key) = (Scope::new(SCOPE), Key::try_from("steps").unwrap());
        assert_eq!(journal_of(&store).steps(&scope, &key).await.unwrap().len(), 2);
        // The store itself, without the engine's retries: a step's begin
        // and completion on a dead kept connection are decided again on a
        // tested one.
        let key = Key::try_from("bare-steps").unwrap();
        let fingerprint = Fingerprint::of(&1).unwrap();
        let Begin::Claimed(claim) = store
            .begin(&request(&scope, &key, &fingerprint))
            .await
            .unwrap()
        else {
            panic!("not claimed");
        };
        let step = StepRequest {
            claim: &claim,
            seq: 0,
            name: "bare",
            fingerprint: &fingerprint,
            ttl: Duration::from_secs(3600),
            adopt: false,
            settle: Duration::ZERO,
        };
        kill_all(&ns).await;
        let begun = journal_of(&store).begin_step(&step).await.unwrap();
        assert!(matches!(begun, StepBegin::Run(_)), "{begun:?}");
        kill_all(&ns).await;
        journal_of(&store).complete_step(&step, b"2").await.unwrap();
        assert_eq!(journal_of(&store).steps(&scope, &key).await.unwrap().len(), 1);
    }
});
