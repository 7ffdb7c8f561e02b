//! A real HTTP server on an ephemeral port of 127.0.0.1, and a real client.

use std::sync::atomic::{AtomicUsize, Ordering};
use std::time::{SystemTime, UNIX_EPOCH};

use axum::Router;

/// Serves `router` on an ephemeral port of 127.0.0.1; its base URL
/// (`http://127.0.0.1:port`) and a client that follows no redirect.
pub async fn serve(router: Router) -> (String, reqwest::Client) {
    let listener = tokio::net::TcpListener::bind("127.0.0.1:0")
        .await
        .expect("bind an ephemeral port on 127.0.0.1");
    let addr = listener.local_addr().unwrap();
    tokio::spawn(async move { axum::serve(listener, router).await.unwrap() });
    let client = reqwest::Client::builder()
        .redirect(reqwest::redirect::Policy::none())
        .build()
        .unwrap();
    (format!("http://{addr}"), client)
}

/// A quoted `Idempotency-Key` value (a structured-field string) no other
/// test, process or run sends: `"<tag>-<pid>-<ms>-<n>"`.
pub fn fresh_key(tag: &str) -> String {
    static N: AtomicUsize = AtomicUsize::new(0);
    let millis = SystemTime::now()
        .duration_since(UNIX_EPOCH)
        .unwrap()
        .as_millis();
    let n = N.fetch_add(1, Ordering::Relaxed);
    format!("\"{tag}-{}-{millis}-{n}\"", std::process::id())
}

/// Whether the response is marked as a replay (`Idempotent-Replayed: true`).
pub fn replayed(response: &reqwest::Response) -> bool {
    response
        .headers()
        .get("idempotent-replayed")
        .is_some_and(|v| v == "true")
}

/// Whether the response is an `application/problem+json` document.
pub fn problem_json(response: &reqwest::Response) -> bool {
    response
        .headers()
        .get("content-type")
        .is_some_and(|v| v == "application/problem+json")
}
