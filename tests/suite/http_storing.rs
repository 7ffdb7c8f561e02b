//! Which responses the HTTP layer stores, over real HTTP on each store: a
//! request refused as it was sent (axum's extractor rejections: no
//! `Content-Type`, malformed JSON, JSON of the wrong shape) leaves no
//! record, so the corrected retry with the same key runs; a response the
//! handler marks `Final` is stored and replayed whatever its status; and
//! the default table holds status by status.

use crate::http_support;

use std::sync::Arc;

use axum::extract::{Path, State};
use axum::http::StatusCode;
use axum::response::IntoResponse;
use axum::routing::post;
use axum::{Json, Router};
use http_support::{fresh_key, on_each_store, replayed, Runs, Server};
use idem::http::{Final, IdempotencyLayer};
use idem::Store;
use serde::Deserialize;
use serde_json::{json, Value};

on_each_store!(
    missing_content_type_is_not_stored_and_the_corrected_retry_runs,
    malformed_json_is_not_stored_and_the_corrected_body_runs,
    wrong_shape_is_not_stored_and_the_corrected_body_runs,
    final_422_is_stored_and_replayed,
    final_402_is_stored_whatever_store_status_says,
    default_table_status_by_status,
);

#[derive(Deserialize)]
struct Order {
    item: String,
    quantity: u32,
}

/// `POST /orders` (a JSON `Order`): 201 with the run's number.
/// `POST /final/{code}`: `code`, marked final. `POST /status/{code}`:
/// `code`, unmarked.
fn app(runs: &Arc<Runs>) -> Router {
    async fn order(State(runs): State<Arc<Runs>>, Json(order): Json<Order>) -> impl IntoResponse {
        let run = runs.next();
        let body = json!({ "run": run, "item": order.item, "quantity": order.quantity });
        (StatusCode::CREATED, Json(body))
    }
    async fn marked(State(runs): State<Arc<Runs>>, Path(code): Path<u16>) -> impl IntoResponse {
        let run = runs.next();
        (
            StatusCode::from_u16(code).unwrap(),
            Final,
            format!("run {run}"),
        )
    }
    async fn status(State(runs): State<Arc<Runs>>, Path(code): Path<u16>) -> impl IntoResponse {
        let run = runs.next();
        (StatusCode::from_u16(code).unwrap(), format!("run {run}"))
    }
    Router::new()
        .route("/orders", post(order))
        .route("/final/{code}", post(marked))
        .route("/status/{code}", post(status))
        .with_state(runs.clone())
}

async fn serve(layer: IdempotencyLayer) -> (Server, Arc<Runs>) {
    let runs = Arc::new(Runs::default());
    (Server::start(app(&runs).layer(layer)).await, runs)
}

const ORDER: &str = r#"{"item": "apple", "quantity": 2}"#;

/// The corrected request ran (201, not a replay), and its retry is
/// answered with its response.
async fn corrected_runs_then_replays(server: &Server, runs: &Runs, key: &str) {
    let corrected = server
        .post_json("/orders", key, ORDER)
        .send()
        .await
        .unwrap();
    assert_eq!(corrected.status(), StatusCode::CREATED);
    assert!(!replayed(&corrected), "the refused request was stored");
    let first: Value = corrected.json().await.unwrap();
    assert_eq!(first["run"], 1);
    let retry = server
        .post_json("/orders", key, ORDER)
        .send()
        .await
        .unwrap();
    assert!(replayed(&retry));
    assert_eq!(retry.json::<Value>().await.unwrap(), first);
    assert_eq!(runs.count(), 1);
}

async fn missing_content_type_is_not_stored_and_the_corrected_retry_runs<S: Store + 'static>(
    store: S,
) {
    let (server, runs) = serve(IdempotencyLayer::new(store)).await;
    let key = fresh_key();
    for _ in 0..2 {
        let bare = server
            .post("/orders", &key)
            .body(ORDER)
            .send()
            .await
            .unwrap();
        assert_eq!(bare.status(), StatusCode::UNSUPPORTED_MEDIA_TYPE);
        assert!(!replayed(&bare));
    }
    assert_eq!(runs.count(), 0);
    corrected_runs_then_replays(&server, &runs, &key).await;
}

/// `body` is refused with `status`, and not stored: another body with the
/// same key (the corrected one) runs, and is no reused key (422).
async fn refused_then_corrected<S: Store + 'static>(store: S, body: &str, status: StatusCode) {
    let (server, runs) = serve(IdempotencyLayer::new(store)).await;
    let key = fresh_key();
    let refused = server
        .post_json("/orders", &key, body)
        .send()
        .await
        .unwrap();
    assert_eq!(refused.status(), status);
    assert!(!replayed(&refused));
    corrected_runs_then_replays(&server, &runs, &key).await;
}

async fn malformed_json_is_not_stored_and_the_corrected_body_runs<S: Store + 'static>(store: S) {
    let malformed = r#"{"item": "apple", "quantity": 2"#;
    refused_then_corrected(store, malformed, StatusCode::BAD_REQUEST).await;
}

async fn wrong_shape_is_not_stored_and_the_corrected_body_runs<S: Store + 'static>(store: S) {
    let wrong = r#"{"item": "apple", "quantity": "two"}"#;
    refused_then_corrected(store, wrong, StatusCode::UNPROCESSABLE_ENTITY).await;
}

/// `path` sent twice with one key: both answers (status, replayed, body),
/// and how many times the handler ran.
async fn twice(
    server: &Server,
    runs: &Runs,
    path: &str,
) -> ([(StatusCode, bool, String); 2], usize) {
    let key = fresh_key();
    let before = runs.count();
    let mut answers = Vec::new();
    for _ in 0..2 {
        let response = server.post(path, &key).send().await.unwrap();
        let (status, replayed) = (response.status(), replayed(&response));
        answers.push((status, replayed, response.text().await.unwrap()));
    }
    (answers.try_into().unwrap(), runs.count() - before)
}

/// The second of two requests to `path` with one key is a replay of the
/// first: the handler ran once.
async fn assert_stored(server: &Server, runs: &Runs, path: &str) {
    let ([first, retry], ran) = twice(server, runs, path).await;
    assert!(!first.1 && retry.1, "{path}: not stored");
    assert_eq!((retry.0, &retry.2), (first.0, &first.2), "{path}");
    assert_eq!(ran, 1, "{path}");
}

/// Two requests to `path` with one key both run.
async fn assert_not_stored(server: &Server, runs: &Runs, path: &str) {
    let ([first, retry], ran) = twice(server, runs, path).await;
    assert!(!first.1 && !retry.1, "{path}: stored");
    assert_eq!(ran, 2, "{path}");
}

/// A 422 that the handler marks final (a business rule ran) is stored,
/// where an unmarked 422 (a failed validation) is not.
async fn final_422_is_stored_and_replayed<S: Store + 'static>(store: S) {
    let (server, runs) = serve(IdempotencyLayer::new(store)).await;
    assert_stored(&server, &runs, "/final/422").await;
    assert_not_stored(&server, &runs, "/status/422").await;
}

/// `store_status` replaces the rule by status, and the `Final` mark still
/// wins over it: under a layer that stores 2xx alone, a declined card's
/// 402 marked final is stored, an unmarked one is not.
async fn final_402_is_stored_whatever_store_status_says<S: Store + 'static>(store: S) {
    let layer = IdempotencyLayer::new(store).store_status(|status| status.is_success());
    let (server, runs) = serve(layer).await;
    assert_stored(&server, &runs, "/final/402").await;
    assert_not_stored(&server, &runs, "/status/402").await;
    assert_stored(&server, &runs, "/status/201").await;
}

/// Every row of the module documentation's table, over HTTP.
async fn default_table_status_by_status<S: Store + 'static>(store: S) {
    let (server, runs) = serve(IdempotencyLayer::new(store)).await;
    for code in [200, 201, 204, 303, 402, 410, 451] {
        assert_stored(&server, &runs, &format!("/status/{code}")).await;
    }
    let refused = [
        400, 403, 404, 405, 406, 411, 412, 413, 414, 415, 417, 421, 422, 426, 428, 431,
    ];
    let try_again = [401, 407, 408, 409, 425, 429];
    let failed = [500, 502, 503];
    for code in refused.into_iter().chain(try_again).chain(failed) {
        assert_not_stored(&server, &runs, &format!("/status/{code}")).await;
    }
    // A final 5xx is stored too: the handler's word wins.
    assert_stored(&server, &runs, "/final/503").await;
}
