//! The `operation` label of the engine's metrics behind the HTTP layer is
//! bounded by the application's routes: requests that match no route (a
//! fallback, axum's 404) share one label, and so do requests scoped to
//! their raw path by `route(RequestPath)`, which are labelled by their
//! route template. Over a real axum server and a real client, with a
//! `DebuggingRecorder` on the server's thread.

use crate::common;
use crate::http_support::{fresh_key, replayed};

use std::collections::BTreeSet;
use std::sync::atomic::{AtomicUsize, Ordering};
use std::sync::Arc;

use axum::extract::Request;
use axum::http::StatusCode;
use axum::routing::post;
use axum::Router;
use idem::http::{IdempotencyLayer, RequestPath};
use idem::MemoryStore;
use metrics_util::debugging::DebuggingRecorder;

/// Distinct paths sent to each router.
const PATHS: usize = 500;

/// Two routes, and a fallback that does work (its 201 is stored) unless
/// `fallback` is false (axum's own 404, not stored).
fn app(runs: &Arc<AtomicUsize>, fallback: bool) -> Router {
    let r = runs.clone();
    let handler = move |request: Request| {
        let r = r.clone();
        async move {
            r.fetch_add(1, Ordering::SeqCst);
            (StatusCode::CREATED, request.uri().path().to_owned())
        }
    };
    let router = Router::new()
        .route("/orders", post(handler.clone()))
        .route("/orders/{id}", post(handler.clone()));
    match fallback {
        true => router.fallback(handler),
        false => router,
    }
}

/// The `operation` label of every metric `recorder` holds.
fn operations(snapshotter: &metrics_util::debugging::Snapshotter) -> BTreeSet<String> {
    snapshotter
        .snapshot()
        .into_vec()
        .into_iter()
        .filter_map(|(key, ..)| {
            let operation = key.key().labels().find(|l| l.key() == "operation")?;
            Some(operation.value().to_owned())
        })
        .collect()
}

#[test]
fn unmatched_paths_share_one_operation_label() {
    let recorder = DebuggingRecorder::new();
    let snapshotter = recorder.snapshotter();
    // A local recorder sees the metrics of its own thread: the servers,
    // the layer's tasks and the client all run on this one.
    metrics::with_local_recorder(&recorder, || {
        tokio::runtime::Builder::new_current_thread()
            .enable_all()
            .build()
            .unwrap()
            .block_on(async {
                let store = MemoryStore::new();
                let runs = Arc::new(AtomicUsize::new(0));

                // A fallback that does work: each path is claimed, run and
                // stored, keys scoped to the path; one label for them all.
                let layer = IdempotencyLayer::new(store.clone());
                let (base, client) = common::http::serve(app(&runs, true).layer(layer)).await;
                for i in 0..PATHS {
                    let response = client
                        .post(format!("{base}/nowhere/{i}"))
                        .header("idempotency-key", fresh_key())
                        .send()
                        .await
                        .unwrap();
                    assert_eq!(response.status(), StatusCode::CREATED);
                }
                assert_eq!(runs.load(Ordering::SeqCst), PATHS);
                // Still scoped to the path: one key on two unmatched paths
                // runs on each, and replays on each.
                let key = fresh_key();
                for _ in 0..2 {
                    for path in ["/elsewhere/a", "/elsewhere/b"] {
                        let response = client
                            .post(format!("{base}{path}"))
                            .header("idempotency-key", &key)
                            .send()
                            .await
                            .unwrap();
                        assert_eq!(response.status(), StatusCode::CREATED);
                        assert_eq!(response.text().await.unwrap(), path);
                    }
                }
                assert_eq!(runs.load(Ordering::SeqCst), PATHS + 2);

                // axum's own 404: claimed, not stored, released.
                let layer = IdempotencyLayer::new(store.clone());
                let (base, client) = common::http::serve(app(&runs, false).layer(layer)).await;
                for i in 0..PATHS {
                    let response = client
                        .post(format!("{base}/missing/{i}"))
                        .header("idempotency-key", fresh_key())
                        .send()
                        .await
                        .unwrap();
                    assert_eq!(response.status(), StatusCode::NOT_FOUND);
                }

                // Keys scoped to the raw path by choice: still so (the same
                // key on two paths of one route runs on each), labelled by
                // the route template that matched.
                let runs_before = runs.load(Ordering::SeqCst);
                let layer = IdempotencyLayer::new(store).route(RequestPath);
                let (base, client) = common::http::serve(app(&runs, true).layer(layer)).await;
                let key = fresh_key();
                for i in 0..PATHS {
                    let response = client
                        .post(format!("{base}/orders/{i}"))
                        .header("idempotency-key", &key)
                        .send()
                        .await
                        .unwrap();
                    assert_eq!(response.status(), StatusCode::CREATED);
                    assert!(!replayed(&response));
                }
                let again = client
                    .post(format!("{base}/orders/7"))
                    .header("idempotency-key", &key)
                    .send()
                    .await
                    .unwrap();
                assert!(replayed(&again));
                assert_eq!(runs.load(Ordering::SeqCst), runs_before + PATHS);
            })
    });
    let operations = operations(&snapshotter);
    let expected = BTreeSet::from([
        "POST (unmatched)".to_owned(),
        "POST /orders/{id}".to_owned(),
    ]);
    assert_eq!(
        operations.len(),
        expected.len(),
        "{} operation labels, the first ones: {:?}",
        operations.len(),
        operations.iter().take(5).collect::<Vec<_>>()
    );
    assert_eq!(operations, expected);
}
