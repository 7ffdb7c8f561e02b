//! The HTTP `Idempotency-Key` layer end to end: a real axum server on an
//! ephemeral port of 127.0.0.1, a real HTTP client, and every case run on
//! SQLite (a file) and PostgreSQL, each in a table of its own; MariaDB runs
//! the case its store once refused.

use crate::common;

use std::future::Future;
use std::sync::atomic::{AtomicUsize, Ordering};
use std::sync::Arc;
use std::time::{Duration, SystemTime, UNIX_EPOCH};

use axum::extract::{MatchedPath, Path, Request};
use axum::http::{HeaderMap, HeaderValue, StatusCode};
use axum::middleware::{self, Next};
use axum::response::{IntoResponse, Response};
use axum::routing::post;
use axum::Router;
use common::backend::{Guard, SqlStore};
use idem::http::{IdempotencyKey, IdempotencyLayer, Problem, ProblemDetails};
use idem::{idempotent, Store};
use reqwest::header::RETRY_AFTER;
use serde_json::{json, Value};
use tokio::sync::Notify;

common::backends!(sqlite_file, postgres =>
    #[tokio::test(flavor = "multi_thread", worker_threads = 4)]
    cases(on_store, backend::store(8)) {
        replay_is_identical,
        other_payload_is_422,
        missing_key_is_400,
        malformed_keys_are_400,
        fail_fast_is_409,
        retry_after_is_the_lease_left,
        concurrent_duplicates_run_once,
        server_error_released_then_retried,
        stored_statuses_follow_the_policy,
        principals_never_share_a_response,
        missing_principal_is_refused_with_401,
        set_cookie_is_never_replayed,
        long_raw_path_is_answered_and_replayed,
        get_is_untouched,
        body_over_limit_is_413,
        store_down_is_503,
        panicking_handler_releases_the_key,
        disconnected_client_outcome_is_saved,
        key_extractor_refuses_as_the_layer_does,
        engine_errors_are_answered_as_the_layer_answers_them,
        plain_tower_service_scoped_by_make_route,
    }
);

// MariaDB: the case that its store used to refuse (a scope over the 1024
// bytes of its column).
common::backends!(mysql =>
    #[tokio::test(flavor = "multi_thread", worker_threads = 4)]
    cases(on_store, backend::store(4)) { long_raw_path_is_answered_and_replayed }
);

/// Runs `case` on the store of `fixture`, then drops the fixture's guard.
async fn on_store<S, F>(fixture: impl Future<Output = (S, Guard)>, case: impl FnOnce(S) -> F)
where
    F: Future<Output = ()>,
{
    let (store, guard) = fixture.await;
    case(store).await;
    drop(guard);
}

// ---------------------------------------------------------------------------
// The application under test.

/// What the handlers did, shared with the test.
#[derive(Default)]
struct Seen {
    runs: AtomicUsize,
    gets: AtomicUsize,
    started: Notify,
    release: Notify,
}

impl Seen {
    fn next(&self) -> usize {
        self.runs.fetch_add(1, Ordering::SeqCst) + 1
    }

    fn runs(&self) -> usize {
        self.runs.load(Ordering::SeqCst)
    }
}

/// 201 with a body and headers that differ at every run, so a replay is
/// told apart from a second execution. The cookies and the
/// `Authentication-Info` are for the client of this run only.
fn created(run: usize, body: &str) -> Response {
    let mut headers = HeaderMap::new();
    headers.insert("location", HeaderValue::from(run));
    headers.insert("x-run", HeaderValue::from(run));
    headers.append("set-cookie", HeaderValue::from(run));
    headers.append("set-cookie", HeaderValue::from_static("b=2"));
    headers.insert("authentication-info", HeaderValue::from(run));
    headers.insert("content-type", HeaderValue::from_static("application/json"));
    let doc = json!({ "run": run, "echo": body });
    (StatusCode::CREATED, headers, doc.to_string()).into_response()
}

fn app(seen: &Arc<Seen>) -> Router {
    let s = seen.clone();
    let orders = move |body: String| {
        let s = s.clone();
        async move { created(s.next(), &body) }
    };
    let s = seen.clone();
    let order = move |Path(id): Path<u32>, body: String| {
        let s = s.clone();
        async move { created(s.next(), &format!("{id}:{body}")) }
    };
    let s = seen.clone();
    let list = move || {
        let s = s.clone();
        async move { format!("get {}", s.gets.fetch_add(1, Ordering::SeqCst) + 1) }
    };
    let s = seen.clone();
    let slow = move |body: String| {
        let s = s.clone();
        async move {
            tokio::time::sleep(Duration::from_millis(300)).await;
            created(s.next(), &body)
        }
    };
    let s = seen.clone();
    let gated = move |body: String| {
        let s = s.clone();
        async move {
            s.started.notify_one();
            s.release.notified().await;
            created(s.next(), &body)
        }
    };
    let s = seen.clone();
    let flaky = move || {
        let s = s.clone();
        async move {
            match s.next() {
                1 => (StatusCode::INTERNAL_SERVER_ERROR, "try again".to_owned()),
                n => (StatusCode::OK, format!("run {n}")),
            }
        }
    };
    let s = seen.clone();
    let status = move |Path(code): Path<u16>| {
        let s = s.clone();
        async move {
            let run = s.next();
            (StatusCode::from_u16(code).unwrap(), format!("run {run}"))
        }
    };
    let s = seen.clone();
    let panicky = move |body: String| {
        let s = s.clone();
        async move {
            let run = s.next();
            if run == 1 {
                panic!("the handler fails on its first run");
            }
            created(run, &body)
        }
    };
    let s = seen.clone();
    // Outside every route: the layer sees no `MatchedPath`, and scopes keys
    // to the raw path.
    let unrouted = move |request: Request| {
        let s = s.clone();
        async move {
            if request.extensions().get::<MatchedPath>().is_some() {
                let wrong = "the fallback has a MatchedPath";
                return (StatusCode::INTERNAL_SERVER_ERROR, wrong).into_response();
            }
            let len = request.uri().path().len();
            created(s.next(), &format!("a path of {len} bytes"))
        }
    };
    Router::new()
        .route("/orders", post(orders).get(list))
        .route("/orders/{id}", post(order))
        .route("/slow", post(slow))
        .route("/gated", post(gated))
        .route("/flaky", post(flaky))
        .route("/status/{code}", post(status))
        .route("/panic", post(panicky))
        .fallback(unrouted)
}

/// The tenant that [`authenticate`] verified, in the request's extensions.
#[derive(Clone)]
struct Tenant(String);

/// Stands for an authentication middleware: the bearer token `t-<name>`
/// authenticates tenant `<name>`. A request without a token goes on
/// unauthenticated, as past a middleware that lets anonymous requests
/// through, so that the layer's own refusal is seen.
async fn authenticate(mut request: Request, next: Next) -> Response {
    let tenant = request
        .headers()
        .get("authorization")
        .and_then(|v| v.to_str().ok())
        .and_then(|v| v.strip_prefix("Bearer t-"))
        .map(|name| Tenant(name.to_owned()));
    if let Some(tenant) = tenant {
        request.extensions_mut().insert(tenant);
    }
    next.run(request).await
}

/// A layer that scopes keys to the authenticated tenant.
fn by_tenant<S: SqlStore>(store: S) -> IdempotencyLayer {
    IdempotencyLayer::new(store).principal(|parts: &axum::http::request::Parts| {
        Some(parts.extensions.get::<Tenant>()?.0.clone())
    })
}

/// A running server.
struct Server {
    base: String,
    client: reqwest::Client,
}

impl Server {
    async fn start(router: Router) -> Server {
        let (base, client) = common::http::serve(router).await;
        Server { base, client }
    }

    fn post(&self, path: &str, key: &str, body: &str) -> reqwest::RequestBuilder {
        self.client
            .post(format!("{}{path}", self.base))
            .header("idempotency-key", key)
            .body(body.to_owned())
    }

    /// `POST path` with these key header values, none or several.
    fn post_with_keys(&self, path: &str, keys: &[HeaderValue]) -> reqwest::RequestBuilder {
        let mut request = self
            .client
            .post(format!("{}{path}", self.base))
            .body("2 apples");
        for key in keys {
            request = request.header("idempotency-key", key);
        }
        request
    }
}

/// Starts the app behind `layer`.
async fn serve(layer: IdempotencyLayer) -> (Server, Arc<Seen>) {
    let seen = Arc::new(Seen::default());
    (Server::start(app(&seen).layer(layer)).await, seen)
}

/// Starts the app behind `layer`, behind [`authenticate`].
async fn serve_authenticated(layer: IdempotencyLayer) -> (Server, Arc<Seen>) {
    let seen = Arc::new(Seen::default());
    let router = app(&seen)
        .layer(layer)
        .layer(middleware::from_fn(authenticate));
    (Server::start(router).await, seen)
}

/// A structured-field key, unique per call.
fn fresh_key() -> String {
    static N: AtomicUsize = AtomicUsize::new(0);
    format!(
        "\"{}-{}-{}\"",
        std::process::id(),
        SystemTime::now()
            .duration_since(UNIX_EPOCH)
            .unwrap()
            .as_millis(),
        N.fetch_add(1, Ordering::Relaxed)
    )
}

/// Status, headers without `Date`, and body.
async fn parts(response: reqwest::Response) -> (StatusCode, HeaderMap, Vec<u8>) {
    let status = response.status();
    let mut headers = response.headers().clone();
    headers.remove("date");
    let body = response.bytes().await.unwrap().to_vec();
    (status, headers, body)
}

/// Removes the headers that go to the first client only, never to a
/// replay (`set_cookie_is_never_replayed`).
fn remove_per_client(headers: &mut HeaderMap) {
    headers.remove("set-cookie");
    headers.remove("authentication-info");
}

fn replayed(headers: &HeaderMap) -> bool {
    headers
        .get("idempotent-replayed")
        .is_some_and(|v| v == "true")
}

/// Checks an RFC 9457 answer and returns its document.
/// The whole seconds of a response's `Retry-After`.
fn retry_after(response: &reqwest::Response) -> u64 {
    response.headers()[RETRY_AFTER]
        .to_str()
        .unwrap()
        .parse()
        .unwrap()
}

async fn problem(response: reqwest::Response, expected: Problem) -> Value {
    assert_eq!(response.status(), expected.status());
    assert_eq!(
        response.headers()["content-type"],
        "application/problem+json"
    );
    let doc: Value = response.json().await.unwrap();
    assert_eq!(doc["type"], expected.type_uri());
    assert_eq!(doc["title"], expected.title());
    assert_eq!(doc["status"], expected.status().as_u16());
    assert!(
        doc["detail"].as_str().is_some_and(|d| !d.is_empty()),
        "{doc}"
    );
    doc
}

// ---------------------------------------------------------------------------
// The cases.

async fn replay_is_identical<S: SqlStore>(store: S) {
    let (server, seen) = serve(IdempotencyLayer::new(store)).await;
    let key = fresh_key();
    let first = server
        .post("/orders", &key, "2 apples")
        .send()
        .await
        .unwrap();
    let (status, mut headers, body) = parts(first).await;
    assert_eq!(status, StatusCode::CREATED);
    assert!(!replayed(&headers));
    assert_eq!(headers.get_all("set-cookie").iter().count(), 2);
    remove_per_client(&mut headers);

    for retry_key in [key.clone(), key.trim_matches('"').to_owned()] {
        // The bare form names the same key as the structured string.
        let retry = server.post("/orders", &retry_key, "2 apples");
        let (r_status, mut r_headers, r_body) = parts(retry.send().await.unwrap()).await;
        assert!(replayed(&r_headers), "{r_headers:?}");
        r_headers.remove("idempotent-replayed");
        assert_eq!((r_status, &r_headers, &r_body), (status, &headers, &body));
    }
    assert_eq!(seen.runs(), 1);
}

async fn other_payload_is_422<S: SqlStore>(store: S) {
    let (server, seen) = serve(IdempotencyLayer::new(store)).await;
    let key = fresh_key();
    let first = server
        .post("/orders", &key, "2 apples")
        .send()
        .await
        .unwrap();
    assert_eq!(first.status(), StatusCode::CREATED);
    let other = server
        .post("/orders", &key, "3 pears")
        .send()
        .await
        .unwrap();
    let doc = problem(other, Problem::KeyReused).await;
    // The 422 names what differed from the request stored under the key.
    let detail = doc["detail"].as_str().unwrap();
    assert!(detail.contains(": the body differs;"), "{detail}");

    // One route template, two paths: the same operation, another payload.
    let key = fresh_key();
    let one = server.post("/orders/1", &key, "x").send().await.unwrap();
    assert_eq!(one.status(), StatusCode::CREATED);
    let two = server.post("/orders/2", &key, "x").send().await.unwrap();
    let doc = problem(two, Problem::KeyReused).await;
    let detail = doc["detail"].as_str().unwrap();
    assert!(detail.contains(": the path differs;"), "{detail}");
    let three = server
        .post("/orders/3?dry_run=1", &key, "y")
        .send()
        .await
        .unwrap();
    let doc = problem(three, Problem::KeyReused).await;
    let detail = doc["detail"].as_str().unwrap();
    assert!(
        detail.contains(": the path, the query and the body differ;"),
        "{detail}"
    );

    // The same JSON bytes, first undeclared (compared as bytes), then
    // declared (compared as JSON): the 422 says why they differ.
    let key = fresh_key();
    let json = r#"{"amount": 100}"#;
    let plain = server.post("/orders", &key, json).send().await.unwrap();
    assert_eq!(plain.status(), StatusCode::CREATED);
    let declared = server
        .post("/orders", &key, json)
        .header("content-type", "application/json")
        .send()
        .await
        .unwrap();
    let doc = problem(declared, Problem::KeyReused).await;
    let detail = doc["detail"].as_str().unwrap();
    assert!(
        detail.contains("read as JSON one time and as bytes"),
        "{detail}"
    );
    assert_eq!(seen.runs(), 3);
}

async fn missing_key_is_400<S: SqlStore>(store: S) {
    let (server, seen) = serve(IdempotencyLayer::new(store)).await;
    let response = server
        .client
        .post(format!("{}/orders", server.base))
        .body("2 apples")
        .send()
        .await
        .unwrap();
    problem(response, Problem::MissingKey).await;
    assert_eq!(seen.runs(), 0);
}

/// Key headers that the layer refuses as malformed (400), each with what
/// is wrong with it.
fn malformed_key_headers() -> Vec<(&'static str, Vec<HeaderValue>)> {
    let long = "k".repeat(256);
    vec![
        ("empty string", vec![HeaderValue::from_static("\"\"")]),
        ("empty value", vec![HeaderValue::from_static("")]),
        (
            "over 255 bytes",
            vec![HeaderValue::from_str(&format!("\"{long}\"")).unwrap()],
        ),
        (
            "over 255 bytes, bare",
            vec![HeaderValue::from_str(&long).unwrap()],
        ),
        ("a space", vec![HeaderValue::from_static("\"a b\"")]),
        (
            "not ASCII",
            vec![HeaderValue::from_bytes(b"k\xc3\xa9").unwrap()],
        ),
        (
            "unterminated string",
            vec![HeaderValue::from_static("\"abc")],
        ),
        ("bad escape", vec![HeaderValue::from_static(r#""a\x""#)]),
        ("parameters", vec![HeaderValue::from_static("\"abc\";v=1")]),
        (
            "repeated",
            vec![
                HeaderValue::from_static("\"a\""),
                HeaderValue::from_static("\"a\""),
            ],
        ),
    ]
}

async fn malformed_keys_are_400<S: SqlStore>(store: S) {
    let (server, seen) = serve(IdempotencyLayer::new(store)).await;
    for (what, values) in malformed_key_headers() {
        let response = server.post_with_keys("/orders", &values).send();
        let response = response.await.unwrap();
        assert_eq!(response.status(), StatusCode::BAD_REQUEST, "{what}");
        let doc = problem(response, Problem::InvalidKey).await;
        eprintln!("{what}: {}", doc["detail"]);
    }
    assert_eq!(seen.runs(), 0);
}

async fn fail_fast_is_409<S: SqlStore>(store: S) {
    let (server, seen) = serve(IdempotencyLayer::new(store).fail_fast()).await;
    let key = fresh_key();
    let first = tokio::spawn(server.post("/gated", &key, "x").send());
    seen.started.notified().await;
    let duplicate = server.post("/gated", &key, "x").send().await.unwrap();
    assert!(retry_after(&duplicate) >= 1);
    problem(duplicate, Problem::InProgress).await;
    seen.release.notify_one();
    let first = first.await.unwrap().unwrap();
    assert_eq!(first.status(), StatusCode::CREATED);
    let retry = server.post("/gated", &key, "x").send().await.unwrap();
    assert!(replayed(retry.headers()));
    assert_eq!(seen.runs(), 1);
}

/// The `Retry-After` of a 409 is when the key can move: the lease its
/// holder has left (a lease of 20 s, not a fixed second), whether the
/// duplicate waited first or not.
async fn retry_after_is_the_lease_left<S: SqlStore + Clone>(store: S) {
    let lease = Duration::from_secs(20);
    let layers = [
        IdempotencyLayer::new(store.clone())
            .lease(lease)
            .fail_fast(),
        IdempotencyLayer::new(store)
            .lease(lease)
            .wait(Duration::from_millis(1500)),
    ];
    for layer in layers {
        let (server, seen) = serve(layer).await;
        let key = fresh_key();
        let first = tokio::spawn(server.post("/gated", &key, "x").send());
        seen.started.notified().await;
        let duplicate = server.post("/gated", &key, "x").send().await.unwrap();
        let retry_after = retry_after(&duplicate);
        // The lease less the wait (1.5 s) and the time the test took,
        // rounded up to whole seconds.
        assert!(
            (15..=20).contains(&retry_after),
            "Retry-After: {retry_after}"
        );
        problem(duplicate, Problem::InProgress).await;
        seen.release.notify_one();
        assert_eq!(first.await.unwrap().unwrap().status(), StatusCode::CREATED);
    }
}

async fn concurrent_duplicates_run_once<S: SqlStore>(store: S) {
    let (server, seen) = serve(IdempotencyLayer::new(store)).await;
    let server = Arc::new(server);
    let key = fresh_key();
    let barrier = Arc::new(tokio::sync::Barrier::new(50));
    let requests = (0..50).map(|_| {
        let (server, key, barrier) = (server.clone(), key.clone(), barrier.clone());
        tokio::spawn(async move {
            barrier.wait().await;
            parts(server.post("/slow", &key, "once").send().await.unwrap()).await
        })
    });
    let answers = futures::future::join_all(requests).await;
    let mut originals = 0;
    let mut bodies = Vec::new();
    for answer in answers {
        let (status, mut headers, body) = answer.unwrap();
        assert_eq!(status, StatusCode::CREATED);
        if !replayed(&headers) {
            originals += 1;
        }
        headers.remove("idempotent-replayed");
        remove_per_client(&mut headers);
        bodies.push((headers, body));
    }
    assert_eq!(originals, 1);
    assert!(bodies.windows(2).all(|w| w[0] == w[1]));
    assert_eq!(seen.runs(), 1);
}

async fn server_error_released_then_retried<S: SqlStore>(store: S) {
    let (server, seen) = serve(IdempotencyLayer::new(store)).await;
    let key = fresh_key();
    let failed = server.post("/flaky", &key, "x").send().await.unwrap();
    assert_eq!(failed.status(), StatusCode::INTERNAL_SERVER_ERROR);
    assert!(!replayed(failed.headers()));
    let retried = server.post("/flaky", &key, "x").send().await.unwrap();
    assert_eq!(retried.status(), StatusCode::OK);
    assert!(!replayed(retried.headers()));
    assert_eq!(retried.text().await.unwrap(), "run 2");
    let again = server.post("/flaky", &key, "x").send().await.unwrap();
    assert!(replayed(again.headers()));
    assert_eq!(again.text().await.unwrap(), "run 2");
    assert_eq!(seen.runs(), 2);
}

async fn stored_statuses_follow_the_policy<S: SqlStore>(store: S) {
    let (server, seen) = serve(IdempotencyLayer::new(store)).await;
    // Final answers are stored and replayed.
    for code in [200u16, 303, 402, 410] {
        let key = fresh_key();
        let path = format!("/status/{code}");
        let before = seen.runs();
        for attempt in 0..2 {
            let response = server.post(&path, &key, "").send().await.unwrap();
            assert_eq!(response.status().as_u16(), code);
            assert_eq!(replayed(response.headers()), attempt == 1, "{code}");
        }
        assert_eq!(seen.runs(), before + 1, "{code}");
    }
    // Refusals of the request as sent, "try again" answers (authenticated,
    // later) and server errors release the key.
    for code in [400u16, 404, 422, 401, 407, 408, 409, 425, 429, 503] {
        let key = fresh_key();
        let path = format!("/status/{code}");
        let before = seen.runs();
        for _ in 0..2 {
            let response = server.post(&path, &key, "").send().await.unwrap();
            assert_eq!(response.status().as_u16(), code);
            assert!(!replayed(response.headers()), "{code}");
        }
        assert_eq!(seen.runs(), before + 2, "{code}");
    }
}

/// The same key and payload sent by two authenticated tenants never share
/// a response: each runs once, and each replay is its own.
async fn principals_never_share_a_response<S: SqlStore>(store: S) {
    let (server, seen) = serve_authenticated(by_tenant(store)).await;
    let key = fresh_key();
    let send = |tenant: &'static str| {
        server
            .post("/orders", &key, "2 apples")
            .bearer_auth(format!("t-{tenant}"))
            .send()
    };
    let a = send("acme").await.unwrap();
    assert!(!replayed(a.headers()));
    let a_body = a.text().await.unwrap();
    let b = send("globex").await.unwrap();
    assert!(
        !replayed(b.headers()),
        "another principal's response was shared"
    );
    let b_body = b.text().await.unwrap();
    assert_ne!(a_body, b_body);
    for (tenant, body) in [("acme", &a_body), ("globex", &b_body)] {
        let again = send(tenant).await.unwrap();
        assert!(replayed(again.headers()));
        assert_eq!(&again.text().await.unwrap(), body, "{tenant}");
    }
    assert_eq!(seen.runs(), 2);
}

/// A layer that scopes keys to a principal refuses a request in which its
/// extractor finds none (401), rather than widening the key to the whole
/// route: the handler does not run, and nothing is stored.
async fn missing_principal_is_refused_with_401<S: SqlStore>(store: S) {
    let (server, seen) = serve_authenticated(by_tenant(store)).await;
    let key = fresh_key();
    let anonymous = || server.post("/orders", &key, "2 apples").send();
    let refused = anonymous().await.unwrap();
    assert!(!replayed(refused.headers()));
    problem(refused, Problem::MissingPrincipal).await;
    assert_eq!(seen.runs(), 0);
    // Nothing was stored under the key: an authenticated request with it
    // runs the handler.
    let acme = server
        .post("/orders", &key, "2 apples")
        .bearer_auth("t-acme")
        .send()
        .await
        .unwrap();
    assert_eq!(acme.status(), StatusCode::CREATED);
    assert!(!replayed(acme.headers()));
    assert_eq!(seen.runs(), 1);
    // And the anonymous retry is still refused, not answered acme's
    // response.
    problem(anonymous().await.unwrap(), Problem::MissingPrincipal).await;
    assert_eq!(seen.runs(), 1);
}

/// A replay never carries the `Set-Cookie` (nor the `Authentication-Info`)
/// of the response it replays, which went to its first client only: a
/// replay may go to any client that sends the key.
async fn set_cookie_is_never_replayed<S: SqlStore>(store: S) {
    let (server, seen) = serve(IdempotencyLayer::new(store)).await;
    let key = fresh_key();
    let first = server.post("/orders", &key, "2 apples").send();
    let (status, headers, body) = parts(first.await.unwrap()).await;
    assert_eq!(status, StatusCode::CREATED);
    assert_eq!(headers.get_all("set-cookie").iter().count(), 2);
    assert!(headers.contains_key("authentication-info"));

    let retry = server.post("/orders", &key, "2 apples").send();
    let (r_status, r_headers, r_body) = parts(retry.await.unwrap()).await;
    assert!(replayed(&r_headers));
    assert_eq!((r_status, &r_body), (status, &body));
    assert_eq!(r_headers["x-run"], headers["x-run"]);
    assert!(!r_headers.contains_key("set-cookie"), "{r_headers:?}");
    assert!(
        !r_headers.contains_key("authentication-info"),
        "{r_headers:?}"
    );
    assert_eq!(seen.runs(), 1);
}

/// A raw request path too long for a store's index, outside every route
/// template (no `MatchedPath`), is answered and replayed like any other:
/// its scope is stored as a prefix and a digest. Two such paths that
/// differ only at their end stay two scopes.
async fn long_raw_path_is_answered_and_replayed<S: SqlStore>(store: S) {
    let (server, seen) = serve(IdempotencyLayer::new(store)).await;
    // Letters that do not compress: PostgreSQL compresses an index entry
    // before it checks its size, so a repeated letter would fit.
    let mut state = 0x9e37_79b9_7f4a_7c15_u64;
    let noise: String = (0..6000)
        .map(|_| {
            state ^= state << 13;
            state ^= state >> 7;
            state ^= state << 17;
            char::from(b'a' + (state % 26) as u8)
        })
        .collect();
    let long = format!("/files/{noise}");
    let key = fresh_key();
    for (n, path) in [format!("{long}1"), format!("{long}2")].iter().enumerate() {
        let first = server.post(path, &key, "x").send().await.unwrap();
        assert_eq!(first.status(), StatusCode::CREATED, "path {n}");
        assert!(!replayed(first.headers()));
        let first_body = first.text().await.unwrap();
        assert!(first_body.contains("a path of 6008 bytes"), "{first_body}");
        let retry = server.post(path, &key, "x").send().await.unwrap();
        assert_eq!(retry.status(), StatusCode::CREATED, "path {n}");
        assert!(replayed(retry.headers()), "path {n}");
        assert_eq!(retry.text().await.unwrap(), first_body);
        assert_eq!(seen.runs(), n + 1);
    }
}

async fn get_is_untouched<S: SqlStore>(store: S) {
    let (server, seen) = serve(IdempotencyLayer::new(store)).await;
    let key = fresh_key();
    for n in 1..=2 {
        let response = server
            .client
            .get(format!("{}/orders", server.base))
            .header("idempotency-key", &key)
            .send()
            .await
            .unwrap();
        assert_eq!(response.status(), StatusCode::OK);
        assert!(!replayed(response.headers()));
        assert_eq!(response.text().await.unwrap(), format!("get {n}"));
    }
    // Without a key, too.
    let response = server
        .client
        .get(format!("{}/orders", server.base))
        .send()
        .await
        .unwrap();
    assert_eq!(response.status(), StatusCode::OK);
    assert_eq!(seen.gets.load(Ordering::SeqCst), 3);
    assert_eq!(seen.runs(), 0);
}

async fn body_over_limit_is_413<S: SqlStore>(store: S) {
    let (server, seen) = serve(IdempotencyLayer::new(store).body_limit(1024)).await;
    let key = fresh_key();
    let big = "x".repeat(2048);
    let response = server.post("/orders", &key, &big).send().await.unwrap();
    problem(response, Problem::ContentTooLarge).await;
    assert_eq!(seen.runs(), 0);
    // Nothing was stored: the key is free for a body within the limit.
    let small = server.post("/orders", &key, "small").send().await.unwrap();
    assert_eq!(small.status(), StatusCode::CREATED);
    assert!(!replayed(small.headers()));
    assert_eq!(seen.runs(), 1);
}

async fn store_down_is_503<S: SqlStore>(store: S) {
    let (server, seen) = serve(IdempotencyLayer::new(store.clone())).await;
    store.pool().close().await;
    let response = server
        .post("/orders", &fresh_key(), "2 apples")
        .send()
        .await
        .unwrap();
    assert!(response.headers().contains_key(RETRY_AFTER));
    problem(response, Problem::StoreUnavailable).await;
    assert_eq!(
        seen.runs(),
        0,
        "the request ran without its idempotency record"
    );
}

async fn panicking_handler_releases_the_key<S: SqlStore>(store: S) {
    let (server, seen) = serve(IdempotencyLayer::new(store)).await;
    let key = fresh_key();
    // The panic goes on past the layer: the server drops the connection.
    let first = server.post("/panic", &key, "x").send().await;
    assert!(first.is_err(), "{first:?}");
    let retry = tokio::time::timeout(
        Duration::from_secs(3),
        server.post("/panic", &key, "x").send(),
    )
    .await
    .expect("the retry is not held up by an abandoned claim")
    .unwrap();
    assert_eq!(retry.status(), StatusCode::CREATED);
    assert!(!replayed(retry.headers()));
    assert_eq!(seen.runs(), 2);
}

async fn disconnected_client_outcome_is_saved<S: SqlStore>(store: S) {
    let (server, seen) = serve(IdempotencyLayer::new(store)).await;
    let key = fresh_key();
    let gone = tokio::spawn(
        server
            .post("/gated", &key, "x")
            .timeout(Duration::from_millis(200))
            .send(),
    );
    seen.started.notified().await;
    // The client gives up and closes its connection while the handler runs.
    assert!(gone.await.unwrap().unwrap_err().is_timeout());
    tokio::time::sleep(Duration::from_millis(100)).await;
    seen.release.notify_one();
    // The retry gets the outcome of the run the client walked away from.
    let retry = server.post("/gated", &key, "x").send().await.unwrap();
    assert_eq!(retry.status(), StatusCode::CREATED);
    assert!(replayed(retry.headers()));
    let doc: Value = retry.json().await.unwrap();
    assert_eq!(doc["run"], 1);
    assert_eq!(seen.runs(), 1);
}

// ---------------------------------------------------------------------------
// The contract outside the layer: the key extractor, the engine's errors
// answered as the layer answers them, and the layer on a plain tower
// service.

/// The operation behind `POST /direct`: run by the engine itself, not by
/// the layer, failing fast on a duplicate. The body `gated` holds it until
/// the test releases it.
#[idempotent(key = key, store = store, scope = "POST /direct", fingerprint = body, fail_fast)]
async fn place_directly<S: Store>(
    store: &S,
    seen: &Seen,
    key: &IdempotencyKey,
    body: &str,
) -> Result<String, idem::Error> {
    if body == "gated" {
        seen.started.notify_one();
        seen.release.notified().await;
    }
    Ok(format!("run {}", seen.next()))
}

/// The app behind `layer`, and beside it `POST /direct`, a route without
/// the layer whose handler reads the key with the [`IdempotencyKey`]
/// extractor, runs [`place_directly`] and answers its errors with
/// [`ProblemDetails`].
async fn serve_beside<S: SqlStore>(layer: IdempotencyLayer, store: S) -> (Server, Arc<Seen>) {
    let seen = Arc::new(Seen::default());
    let s = seen.clone();
    let direct = move |key: IdempotencyKey, body: String| {
        let (store, s) = (store.clone(), s.clone());
        async move {
            match place_directly(&store, &s, &key, &body).await {
                Ok(done) => (StatusCode::CREATED, done).into_response(),
                Err(err) => ProblemDetails::from(&err).into_response(),
            }
        }
    };
    let beside = Router::new().route("/direct", post(direct));
    let router = app(&seen).layer(layer).merge(beside);
    (Server::start(router).await, seen)
}

/// Status, `Content-Type`, whether `Retry-After` is set, and the body.
async fn answer(response: reqwest::Response) -> (StatusCode, String, bool, Vec<u8>) {
    let status = response.status();
    let headers = response.headers();
    let content_type = headers["content-type"].to_str().unwrap().to_owned();
    let retry_after = headers.contains_key(RETRY_AFTER);
    let body = response.bytes().await.unwrap().to_vec();
    (status, content_type, retry_after, body)
}

/// A handler that takes an [`IdempotencyKey`] refuses a request without a
/// valid key with the very answer the layer gives, byte for byte, and
/// reads a valid key as the layer does (quoted or bare, the same key).
async fn key_extractor_refuses_as_the_layer_does<S: SqlStore>(store: S) {
    let (server, seen) = serve_beside(IdempotencyLayer::new(store.clone()), store).await;
    let send = |path: &str, values: &[HeaderValue]| server.post_with_keys(path, values).send();
    let mut cases = malformed_key_headers();
    cases.push(("missing", Vec::new()));
    for (what, values) in cases {
        let layer = answer(send("/orders", &values).await.unwrap()).await;
        let extractor = answer(send("/direct", &values).await.unwrap()).await;
        assert_eq!(layer.0, StatusCode::BAD_REQUEST, "{what}");
        assert_eq!(
            extractor,
            layer,
            "{what}: {}",
            String::from_utf8_lossy(&extractor.3)
        );
    }
    assert_eq!(seen.runs(), 0);
    let key = fresh_key();
    let first = send("/direct", &[HeaderValue::from_str(&key).unwrap()]);
    let first = first.await.unwrap();
    assert_eq!(first.status(), StatusCode::CREATED);
    let bare = HeaderValue::from_str(key.trim_matches('"')).unwrap();
    let again = send("/direct", &[bare]).await.unwrap();
    assert_eq!(again.status(), StatusCode::CREATED);
    assert_eq!(
        again.text().await.unwrap(),
        first.text().await.unwrap(),
        "the bare form names another key"
    );
    assert_eq!(seen.runs(), 1);
}

/// `ProblemDetails::from(&error)` answers the engine's errors as the layer
/// answers the same situations: a key reused with another payload (422),
/// a duplicate while the first call runs (409, `Retry-After`), a store
/// that cannot be reached (503, `Retry-After`).
async fn engine_errors_are_answered_as_the_layer_answers_them<S: SqlStore>(store: S) {
    let layer = IdempotencyLayer::new(store.clone()).fail_fast();
    let (server, seen) = serve_beside(layer, store.clone()).await;
    // 422: the same key with another payload, once the first completed.
    let mut reused = Vec::new();
    for path in ["/orders", "/direct"] {
        let key = fresh_key();
        let first = server.post(path, &key, "2 apples").send().await.unwrap();
        assert_eq!(first.status(), StatusCode::CREATED, "{path}");
        let other = server.post(path, &key, "3 pears").send().await.unwrap();
        reused.push(answer(other).await);
    }
    assert_eq!(reused[0].0, StatusCode::UNPROCESSABLE_ENTITY);
    // The same answer, but for its detail: the layer knows the request
    // stored under the key, and names what differs from it.
    let document = |answer: &(StatusCode, String, bool, Vec<u8>)| {
        let mut doc: Value = serde_json::from_slice(&answer.3).unwrap();
        let detail = doc["detail"].take();
        ((answer.0, answer.1.clone(), answer.2, doc), detail)
    };
    let (layer, layer_detail) = document(&reused[0]);
    let (direct, _) = document(&reused[1]);
    assert_eq!(direct, layer);
    assert!(
        layer_detail.as_str().unwrap().contains("the body differs"),
        "{layer_detail}"
    );
    // 409: a duplicate while the first request runs.
    let mut running = Vec::new();
    for path in ["/gated", "/direct"] {
        let key = fresh_key();
        let first = tokio::spawn(server.post(path, &key, "gated").send());
        seen.started.notified().await;
        let duplicate = server.post(path, &key, "gated").send().await.unwrap();
        running.push(answer(duplicate).await);
        seen.release.notify_one();
        assert_eq!(first.await.unwrap().unwrap().status(), StatusCode::CREATED);
    }
    assert_eq!(running[0].0, StatusCode::CONFLICT);
    assert!(running[0].2, "the layer's 409 has a Retry-After");
    assert_eq!(running[1], running[0]);
    // 503: the store is down.
    store.pool().close().await;
    for path in ["/orders", "/direct"] {
        let down = server.post(path, &fresh_key(), "x").send().await.unwrap();
        assert!(down.headers().contains_key(RETRY_AFTER), "{path}");
        problem(down, Problem::StoreUnavailable).await;
    }
    assert_eq!(seen.runs(), 4);
}

/// The layer on a plain tower service, no axum router in front (so no
/// `MatchedPath`), served by hyper through `axum::serve` (its response
/// body, the layer's `ResponseBody`, made axum's `Body`): a `MakeRoute`
/// closure names the route, so two paths of one route share a key's
/// scope; without one, each path is a scope of its own.
async fn plain_tower_service_scoped_by_make_route<S: SqlStore>(store: S) {
    use axum::ServiceExt as _;
    use tower::{service_fn, Layer, ServiceExt as _};

    let runs = Arc::new(AtomicUsize::new(0));
    let serve_plain = |layer: IdempotencyLayer| {
        let runs = runs.clone();
        let service = layer
            .layer(service_fn(move |request: Request| {
                let run = runs.fetch_add(1, Ordering::SeqCst) + 1;
                async move {
                    let path = request.uri().path().to_owned();
                    Ok::<_, std::convert::Infallible>(created(run, &path))
                }
            }))
            .map_response(IntoResponse::into_response);
        async move {
            let listener = tokio::net::TcpListener::bind("127.0.0.1:0").await.unwrap();
            let addr = listener.local_addr().unwrap();
            let make = service.into_make_service();
            tokio::spawn(async move { axum::serve(listener, make).await.unwrap() });
            Server {
                base: format!("http://{addr}"),
                client: reqwest::Client::new(),
            }
        }
    };
    let items = |parts: &axum::http::request::Parts| {
        let id = parts.uri.path().strip_prefix("/items/")?;
        (!id.contains('/')).then(|| "/items/{id}".to_owned())
    };
    let routed = serve_plain(IdempotencyLayer::new(store.clone()).route(items)).await;
    let key = fresh_key();
    let one = routed.post("/items/1", &key, "x").send().await.unwrap();
    assert_eq!(one.status(), StatusCode::CREATED);
    let replay = routed.post("/items/1", &key, "x").send().await.unwrap();
    assert!(replayed(replay.headers()));
    // `/items/2` is the same route: the key is taken, by another payload.
    let two = routed.post("/items/2", &key, "x").send().await.unwrap();
    problem(two, Problem::KeyReused).await;
    // Outside the route the closure names, the path is the route.
    let other = routed.post("/other", &key, "x").send().await.unwrap();
    assert_eq!(other.status(), StatusCode::CREATED);
    assert_eq!(runs.load(Ordering::SeqCst), 2);

    let by_path = serve_plain(IdempotencyLayer::new(store)).await;
    let key = fresh_key();
    for path in ["/items/1", "/items/2"] {
        let response = by_path.post(path, &key, "x").send().await.unwrap();
        assert_eq!(response.status(), StatusCode::CREATED, "{path}");
        assert!(!replayed(response.headers()), "{path}");
    }
    assert_eq!(runs.load(Ordering::SeqCst), 4);
}
