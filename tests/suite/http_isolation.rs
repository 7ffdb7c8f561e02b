//! The HTTP layer's isolation and fingerprinting, over a real axum server,
//! a real client and a SQLite file store: different requests never share
//! a fingerprint, a handler never gets a key the layer did not check, and
//! principals never share or block each other's keys.

use crate::common;
use crate::http_support::{fresh_key, replayed, sqlite_store};

use std::sync::atomic::{AtomicUsize, Ordering};
use std::sync::Arc;
use std::time::Duration;

use axum::extract::{Request, State};
use axum::http::header::HeaderName;
use axum::http::request::Parts;
use axum::http::StatusCode;
use axum::middleware::{self, Next};
use axum::response::Response;
use axum::routing::post;
use axum::Router;
use idem::http::{IdempotencyKey, IdempotencyLayer, Principal, ProblemDetails};
use tokio::sync::Notify;

#[derive(Default)]
struct Seen {
    runs: AtomicUsize,
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

/// The principal that authentication verified.
#[derive(Clone)]
struct Tenant(String);

/// Stands for an authentication middleware: the bearer token names an
/// entry of a table of principals (so that principals may hold bytes a
/// header cannot: line feeds, hundreds of bytes).
async fn authenticate(mut request: Request, next: Next) -> Response {
    let token = request
        .headers()
        .get("authorization")
        .and_then(|v| v.to_str().ok())
        .and_then(|v| v.strip_prefix("Bearer "))
        .map(str::to_owned);
    if let Some(principal) = token.as_deref().and_then(principal_of) {
        request.extensions_mut().insert(Tenant(principal));
    }
    next.run(request).await
}

/// The principal of each token.
fn principal_of(token: &str) -> Option<String> {
    let long = "t".repeat(300);
    Some(match token {
        "acme" => "acme".to_owned(),
        "globex" => "globex".to_owned(),
        // Two principals that share their first 300 bytes: both are stored
        // shortened, as a prefix and a digest.
        "long-1" => format!("{long}1"),
        "long-2" => format!("{long}2"),
        // A principal with a line feed, the separator of the stored scope.
        "lf" => "acme\nglobex".to_owned(),
        "lf-2" => "acme\n".to_owned(),
        _ => return None,
    })
}

fn by_tenant(parts: &Parts) -> Option<String> {
    Some(parts.extensions.get::<Tenant>()?.0.clone())
}

fn app(seen: &Arc<Seen>) -> Router {
    async fn orders(State(s): State<Arc<Seen>>, body: String) -> (StatusCode, String) {
        let run = s.next();
        (StatusCode::CREATED, format!("run {run}: {body}"))
    }
    async fn gated(State(s): State<Arc<Seen>>, body: String) -> (StatusCode, String) {
        s.started.notify_one();
        s.release.notified().await;
        let run = s.next();
        (StatusCode::CREATED, format!("run {run}: {body}"))
    }
    Router::new()
        .route("/orders", post(orders))
        .route("/gated", post(gated))
        .with_state(seen.clone())
}

struct Server {
    base: String,
    client: reqwest::Client,
}

impl Server {
    fn post(&self, path: &str, key: &str, body: &str) -> reqwest::RequestBuilder {
        self.client
            .post(format!("{}{path}", self.base))
            .header("idempotency-key", key)
            .body(body.to_owned())
    }
}

async fn serve(layer: IdempotencyLayer) -> (Server, Arc<Seen>) {
    let seen = Arc::new(Seen::default());
    let router = app(&seen)
        .layer(layer)
        .layer(middleware::from_fn(authenticate));
    let (base, client) = common::http::serve(router).await;
    (Server { base, client }, seen)
}

/// Two JSON bodies that are different requests, one of
/// which repeats a member name, must not count as the same payload. The
/// canonical form parses into a `serde_json::Value`, where the last
/// duplicate wins, so `{"amount":1,"amount":100}` hashes as
/// `{"amount":100}`: the retry is answered the first response instead of
/// 422, although a first-wins reader (many JSON parsers, a proxied
/// payment API) reads an amount of 1. Such a body is now hashed raw
/// (this failed before).
#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn json_duplicate_member_names_are_not_the_same_payload() {
    let (store, _guard) = sqlite_store().await;
    let (server, seen) = serve(IdempotencyLayer::new(store)).await;
    let key = fresh_key();
    let send = |body: &str| {
        server
            .post("/orders", &key, body)
            .header("content-type", "application/json")
            .send()
    };
    let first = send(r#"{"amount":100}"#).await.unwrap();
    assert_eq!(first.status(), StatusCode::CREATED);
    let other = send(r#"{"amount":1,"amount":100}"#).await.unwrap();
    let status = other.status();
    let was_replayed = replayed(&other);
    let body = other.text().await.unwrap();
    assert_eq!(
        status,
        StatusCode::UNPROCESSABLE_ENTITY,
        "a body with another (duplicated) member was answered as the same payload \
         (replayed: {was_replayed}): {body}"
    );
    assert_eq!(seen.runs(), 1);
}

/// Behind a layer that reads `X-Idem-Key` with
/// `require_key(false)`, a request without `X-Idem-Key` passes through
/// unchecked; but the handler's `IdempotencyKey` extractor then answers
/// the key of the request's `Idempotency-Key` header, which the layer
/// never read, never scoped to a principal, and never guarded, while the
/// documentation says that behind the layer the extractor is "the key the
/// layer checked, from whatever header the layer reads". A handler that
/// passes it to an `#[idempotent]` function (the documented second line
/// of defence) with `Option<Principal>` (None here: the layer put no
/// principal) guards an unscoped key that any tenant can send. The layer
/// now marks what it let through without a key, and the extractor
/// refuses it (this failed before).
#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn key_extractor_never_reads_a_header_the_layer_does_not_read() {
    async fn echo(
        key: Result<IdempotencyKey, ProblemDetails>,
        principal: Option<Principal>,
    ) -> String {
        match key {
            Ok(key) => format!("key {key} principal {principal:?}"),
            Err(_) => "no key".to_owned(),
        }
    }
    let (store, _guard) = sqlite_store().await;
    let layer = IdempotencyLayer::new(store)
        .with_header_name(HeaderName::from_static("x-idem-key"))
        .require_key(false)
        .principal(by_tenant);
    let router = Router::new()
        .route("/echo", post(echo))
        .layer(layer)
        .layer(middleware::from_fn(authenticate));
    let (base, client) = common::http::serve(router).await;
    let answer = client
        .post(format!("{base}/echo"))
        .bearer_auth("acme")
        .header("idempotency-key", "\"victims-key\"")
        .body("x")
        .send()
        .await
        .unwrap()
        .text()
        .await
        .unwrap();
    assert_eq!(
        answer, "no key",
        "the handler got a key the layer neither read nor guarded"
    );
}

/// A request that one
/// principal has in flight never blocks another principal's request with
/// the same key and payload: with `fail_fast`, the second is not a 409,
/// and it runs at once, while the first is still held.
#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn another_principals_request_in_flight_never_blocks_the_key() {
    let (store, _guard) = sqlite_store().await;
    let layer = IdempotencyLayer::new(store)
        .principal(by_tenant)
        .fail_fast();
    let (server, seen) = serve(layer).await;
    let server = Arc::new(server);
    let key = fresh_key();
    let started = seen.started.notified();
    let (s, k) = (server.clone(), key.clone());
    let acme = tokio::spawn(async move {
        s.post("/gated", &k, "2 apples")
            .bearer_auth("acme")
            .send()
            .await
            .unwrap()
    });
    started.await;
    // acme's request holds its key; globex sends the same key.
    let globex = tokio::spawn({
        let (s, k) = (server.clone(), key.clone());
        async move {
            s.post("/gated", &k, "2 apples")
                .bearer_auth("globex")
                .send()
                .await
                .unwrap()
        }
    });
    // globex's handler starts while acme's is still held: it was not
    // refused (409) nor made to wait for acme's.
    tokio::time::timeout(Duration::from_secs(10), seen.started.notified())
        .await
        .expect("the other principal's request was blocked by the key in flight");
    // Release both handlers (each waits on `release` once it started).
    let releaser = tokio::spawn({
        let seen = seen.clone();
        async move {
            loop {
                seen.release.notify_waiters();
                tokio::time::sleep(Duration::from_millis(20)).await;
            }
        }
    });
    let (acme, globex) = (acme.await.unwrap(), globex.await.unwrap());
    releaser.abort();
    assert_eq!(acme.status(), StatusCode::CREATED);
    assert_eq!(globex.status(), StatusCode::CREATED);
    assert!(!replayed(&acme) && !replayed(&globex));
    assert_ne!(acme.text().await.unwrap(), globex.text().await.unwrap());
    assert_eq!(seen.runs(), 2);
}

/// Principals that
/// are stored shortened (over 255 bytes, sharing their first 300), and
/// principals holding the scope's separator (a line feed), each keep
/// their own record: no replay crosses between them.
#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn shortened_and_line_feed_principals_never_share_a_response() {
    let (store, _guard) = sqlite_store().await;
    let (server, seen) = serve(IdempotencyLayer::new(store).principal(by_tenant)).await;
    let key = fresh_key();
    let tokens = ["long-1", "long-2", "lf", "lf-2", "acme"];
    let mut firsts = Vec::new();
    for token in tokens {
        let response = server
            .post("/orders", &key, "2 apples")
            .bearer_auth(token)
            .send()
            .await
            .unwrap();
        assert_eq!(response.status(), StatusCode::CREATED, "{token}");
        assert!(
            !replayed(&response),
            "{token} was answered another's response"
        );
        firsts.push(response.text().await.unwrap());
    }
    assert_eq!(seen.runs(), tokens.len());
    for (token, first) in tokens.iter().zip(&firsts) {
        let again = server
            .post("/orders", &key, "2 apples")
            .bearer_auth(*token)
            .send()
            .await
            .unwrap();
        assert!(replayed(&again), "{token}");
        assert_eq!(&again.text().await.unwrap(), first, "{token}");
    }
    assert_eq!(seen.runs(), tokens.len());
}
