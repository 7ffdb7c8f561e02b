//! The HTTP layer compares JSON bodies by their canonical JSON, over real
//! HTTP on each store: a retry whose members come in another order or
//! with other whitespace is a replay, not a reused key (422); so is one in
//! which only an ignored field differs; a real change is still a 422; a
//! body that is not JSON, or not valid JSON, is compared byte for byte.

use crate::http_support;

use std::sync::Arc;

use axum::extract::State;
use axum::http::StatusCode;
use axum::routing::post;
use axum::Router;
use http_support::{fresh_key, on_each_store, replayed, Runs, Server};
use idem::http::{IdempotencyLayer, Problem};
use idem::Store;

on_each_store!(
    reordered_members_and_whitespace_are_a_replay,
    ignored_field_differing_is_a_replay,
    real_change_is_422,
    other_media_types_compare_bytes,
    invalid_json_compares_bytes,
    canonical_json_off_compares_bytes,
    js_shortest_doubles_keep_json_canonical,
);

/// `POST /orders`, whatever the body: 201 with the run's number.
async fn serve(layer: IdempotencyLayer) -> (Server, Arc<Runs>) {
    async fn order(State(runs): State<Arc<Runs>>, _body: String) -> (StatusCode, String) {
        (StatusCode::CREATED, format!("run {}", runs.next()))
    }
    let runs = Arc::new(Runs::default());
    let router = Router::new()
        .route("/orders", post(order))
        .with_state(runs.clone())
        .layer(layer);
    (Server::start(router).await, runs)
}

const ORDER: &str =
    r#"{"item":"apple","quantity":2,"sent_at":"10:00:00","lines":[{"sku":"a","n":1}]}"#;

/// `body`, sent as `content_type` with `key`: its status, whether it was
/// a replay, and its body.
async fn send(
    server: &Server,
    key: &str,
    content_type: &str,
    body: &str,
) -> (StatusCode, bool, String) {
    let response = server
        .post("/orders", key)
        .header("content-type", content_type)
        .body(body.to_owned())
        .send()
        .await
        .unwrap();
    let (status, replayed) = (response.status(), replayed(&response));
    (status, replayed, response.text().await.unwrap())
}

/// The first of `bodies` (each sent as `content_type` with one key) runs;
/// every other is a replay of its answer.
async fn all_replayed(server: &Server, runs: &Runs, content_type: &str, bodies: &[&str]) {
    let key = fresh_key();
    let run = format!("run {}", runs.count() + 1);
    for (i, body) in bodies.iter().enumerate() {
        let answer = send(server, &key, content_type, body).await;
        assert_eq!(answer, (StatusCode::CREATED, i > 0, run.clone()), "{body}");
    }
    assert_eq!(format!("run {}", runs.count()), run);
}

/// `first` runs; `second`, with the same key, is a reused key (422).
async fn reused(server: &Server, content_type: &str, first: &str, second: &str) {
    let key = fresh_key();
    let ran = send(server, &key, content_type, first).await;
    assert_eq!(ran.0, StatusCode::CREATED, "{first}");
    let refused = send(server, &key, content_type, second).await;
    assert_eq!(refused.0, Problem::KeyReused.status(), "{second}");
}

async fn reordered_members_and_whitespace_are_a_replay<S: Store + 'static>(store: S) {
    let (server, runs) = serve(IdempotencyLayer::new(store)).await;
    let same = [
        ORDER,
        r#"{"sent_at":"10:00:00","lines":[{"n":1,"sku":"a"}],"quantity":2,"item":"apple"}"#,
        "{\n  \"item\": \"apple\",\n  \"quantity\": 2,\n  \"sent_at\": \"10:00:00\",\n  \"lines\": [ { \"sku\": \"a\", \"n\": 1 } ]\n}\n",
        r#"{"item":"\u0061pple","quantity":2,"sent_at":"10:00:00","lines":[{"sku":"a","n":1}]}"#,
    ];
    all_replayed(&server, &runs, "application/json", &same).await;
    // Any JSON media type, with parameters.
    all_replayed(
        &server,
        &runs,
        "application/vnd.shop+json; charset=utf-8",
        &same,
    )
    .await;
}

async fn ignored_field_differing_is_a_replay<S: Store + 'static>(store: S) {
    let layer = IdempotencyLayer::new(store)
        .ignore_fields(["/sent_at", "/lines/0/note"])
        .expect("JSON pointers");
    let (server, runs) = serve(layer).await;
    let same = [
        ORDER,
        r#"{"item":"apple","quantity":2,"sent_at":"10:00:07","lines":[{"sku":"a","n":1}]}"#,
        r#"{"quantity":2,"item":"apple","lines":[{"n":1,"sku":"a","note":"retry"}]}"#,
    ];
    all_replayed(&server, &runs, "application/json", &same).await;
    let other = r#"{"item":"apple","quantity":3,"sent_at":"10:00:07","lines":[{"sku":"a","n":1}]}"#;
    reused(&server, "application/json", ORDER, other).await;
}

async fn real_change_is_422<S: Store + 'static>(store: S) {
    let (server, _runs) = serve(IdempotencyLayer::new(store)).await;
    let changes = [
        r#"{"item":"apple","quantity":3,"sent_at":"10:00:00","lines":[{"sku":"a","n":1}]}"#,
        r#"{"item":"apple","quantity":"2","sent_at":"10:00:00","lines":[{"sku":"a","n":1}]}"#,
        r#"{"item":"apple","quantity":2,"sent_at":"10:00:01","lines":[{"sku":"a","n":1}]}"#,
        r#"{"item":"apple","quantity":2,"sent_at":"10:00:00","lines":[{"sku":"a","n":1}],"gift":false}"#,
        r#"{"item":"apple","quantity":2,"sent_at":"10:00:00","lines":[]}"#,
    ];
    for change in changes {
        reused(&server, "application/json", ORDER, change).await;
    }
}

/// A form, or text, is compared by its bytes: reordering its fields is
/// another payload.
async fn other_media_types_compare_bytes<S: Store + 'static>(store: S) {
    let (server, _runs) = serve(IdempotencyLayer::new(store)).await;
    let form = "application/x-www-form-urlencoded";
    reused(
        &server,
        form,
        "item=apple&quantity=2",
        "quantity=2&item=apple",
    )
    .await;
    reused(
        &server,
        "text/plain",
        r#"{"a":1,"b":2}"#,
        r#"{"b":2,"a":1}"#,
    )
    .await;
}

/// A JSON body that does not parse is compared by its bytes: the same
/// bytes are a replay, other whitespace is another payload.
async fn invalid_json_compares_bytes<S: Store + 'static>(store: S) {
    let (server, runs) = serve(IdempotencyLayer::new(store)).await;
    let broken = r#"{"item": "apple", "quantity": 2"#;
    all_replayed(&server, &runs, "application/json", &[broken, broken]).await;
    reused(
        &server,
        "application/json",
        broken,
        r#"{"item":"apple","quantity":2"#,
    )
    .await;
}

async fn canonical_json_off_compares_bytes<S: Store + 'static>(store: S) {
    let (server, _runs) = serve(IdempotencyLayer::new(store).canonical_json(false)).await;
    let reordered =
        r#"{"sent_at":"10:00:00","lines":[{"n":1,"sku":"a"}],"quantity":2,"item":"apple"}"#;
    reused(&server, "application/json", ORDER, reordered).await;
}

/// A browser's amount, as `JSON.stringify` writes a computed number (the
/// shortest text that reads back as its double, such as
/// `59.97000000000001` for `19.99 * 3`), keeps the body canonical: a retry
/// with a new ignored field, its members in another order, or the amount
/// in another spelling is a replay. Another amount is a 422, even one that
/// reads as the same double (`0.10000000000000001` and `0.1`) or that
/// serde_json reads as the same double (`1945349.4000000001` and
/// `1945349.4`).
async fn js_shortest_doubles_keep_json_canonical<S: Store + 'static>(store: S) {
    let layer = IdempotencyLayer::new(store)
        .ignore_fields(["/sent_at"])
        .expect("a JSON pointer");
    let (server, runs) = serve(layer).await;
    for (total, respelled) in [
        ("59.97", "5997e-2"),
        ("59.97000000000001", "5.997000000000001e1"),
        ("0.30000000000000004", "3.0000000000000004E-1"),
        ("1e+21", "1000000000000000000000"),
        ("1.5e-7", "0.00000015"),
        ("-0.7000000000000001", "-7.000000000000001e-1"),
    ] {
        let bodies = [
            format!(r#"{{"total":{total},"sent_at":"10:00:00"}}"#),
            format!(r#"{{"total":{total},"sent_at":"10:00:05"}}"#),
            format!(r#"{{"sent_at":"10:00:09","total":{total}}}"#),
            format!(r#"{{ "total": {respelled} }}"#),
        ];
        let bodies: Vec<&str> = bodies.iter().map(String::as_str).collect();
        all_replayed(&server, &runs, "application/json", &bodies).await;
    }
    for (first, second) in [
        ("59.97000000000001", "59.97"),
        ("59.97000000000001", "59.970000000000006"),
        ("0.10000000000000001", "0.1"),
        ("1945349.4000000001", "1945349.4"),
        ("18446744073709551616", "18446744073709552000"),
    ] {
        let body = |total: &str| format!(r#"{{"total":{total},"sent_at":"10:00:00"}}"#);
        reused(&server, "application/json", &body(first), &body(second)).await;
        reused(&server, "application/json", &body(second), &body(first)).await;
    }
}
