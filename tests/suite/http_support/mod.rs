//! What the HTTP layer's test files share: the stores each case runs on
//! (SQLite, PostgreSQL), a real axum server on an ephemeral port of
//! 127.0.0.1 with a real client, fresh keys, and a count of handler runs.
#![allow(dead_code)] // shared by several test crates, each using a part

use std::sync::atomic::{AtomicUsize, Ordering};
use std::time::{SystemTime, UNIX_EPOCH};

use axum::Router;

/// Emits one `#[tokio::test]` per case and store: `sqlite::case` and
/// `postgres::case` each await `case(store)` on a store of their own (a
/// temporary SQLite file; a PostgreSQL table dropped when the test ends).
macro_rules! on_each_store {
    ($($case:ident),* $(,)?) => {
        mod sqlite {
            $(
                #[tokio::test(flavor = "multi_thread", worker_threads = 4)]
                async fn $case() {
                    let (store, _guard) = $crate::http_support::sqlite_store().await;
                    super::$case(store).await;
                }
            )*
        }
        mod postgres {
            $(
                #[tokio::test(flavor = "multi_thread", worker_threads = 4)]
                async fn $case() {
                    let (store, _guard) = $crate::http_support::postgres_store().await;
                    super::$case(store).await;
                }
            )*
        }
    };
}
pub(crate) use on_each_store;

/// A store on a SQLite file of its own, removed with the guard.
pub async fn sqlite_store() -> (idem::SqliteStore, crate::common::backend::Guard) {
    crate::common::backend::sqlite_file::store(8).await
}

/// A store on a PostgreSQL table of its own, dropped with the guard.
pub async fn postgres_store() -> (idem::PostgresStore, crate::common::backend::Guard) {
    crate::common::backend::postgres::store(8).await
}

/// A running server, and a client that follows no redirect.
pub struct Server {
    base: String,
    client: reqwest::Client,
}

impl Server {
    /// Serves `router` on an ephemeral port of 127.0.0.1.
    pub async fn start(router: Router) -> Server {
        let (base, client) = crate::common::http::serve(router).await;
        Server { base, client }
    }

    /// `POST path` with `key` in the `Idempotency-Key` header.
    pub fn post(&self, path: &str, key: &str) -> reqwest::RequestBuilder {
        self.client
            .post(format!("{}{path}", self.base))
            .header("idempotency-key", key)
    }

    /// `POST path` of a JSON `body` (its text as given), with `key`.
    pub fn post_json(&self, path: &str, key: &str, body: &str) -> reqwest::RequestBuilder {
        self.post(path, key)
            .header("content-type", "application/json")
            .body(body.to_owned())
    }

    /// A request to `path` without any header of the test's.
    pub fn request(&self, method: reqwest::Method, path: &str) -> reqwest::RequestBuilder {
        self.client.request(method, format!("{}{path}", self.base))
    }
}

/// A structured-field key, unique per call.
pub fn fresh_key() -> String {
    static N: AtomicUsize = AtomicUsize::new(0);
    let millis = SystemTime::now()
        .duration_since(UNIX_EPOCH)
        .unwrap()
        .as_millis();
    let n = N.fetch_add(1, Ordering::Relaxed);
    format!("\"{}-{millis}-{n}\"", std::process::id())
}

/// Whether the layer answered with a stored response.
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

/// How many times the handlers ran.
#[derive(Debug, Default)]
pub struct Runs(AtomicUsize);

impl Runs {
    /// Counts one more run, and returns its number (1 for the first).
    pub fn next(&self) -> usize {
        self.0.fetch_add(1, Ordering::SeqCst) + 1
    }

    pub fn count(&self) -> usize {
        self.0.load(Ordering::SeqCst)
    }
}
