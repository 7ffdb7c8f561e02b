//! The HTTP layer's edges, over a real axum server and a real client: a
//! client that goes away while the response body is still being produced;
//! a response body that fails, or panics, after the handler did its work;
//! the bounded wait of a duplicate (409 once it passes, then a replay);
//! key headers with bytes the other modules do not send; and a response
//! too large for the store to keep (MariaDB).

use crate::common;
use crate::http_support::{fresh_key, problem_json, replayed, sqlite_store};

use std::sync::atomic::{AtomicUsize, Ordering};
use std::sync::Arc;
use std::time::{Duration, Instant};

use axum::body::{Body, Bytes};
use axum::http::{HeaderValue, StatusCode};
use axum::response::IntoResponse;
use axum::routing::post;
use axum::Router;
use idem::http::IdempotencyLayer;
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

type Chunk = Result<Bytes, std::io::Error>;

fn app(seen: &Arc<Seen>) -> Router {
    // 201 at once; the body's first chunk, then its second once released.
    let s = seen.clone();
    let streaming = move || {
        let s = s.clone();
        async move {
            let run = s.next();
            let stream = futures::stream::unfold(0u8, move |step| {
                let s = s.clone();
                async move {
                    match step {
                        0 => Some((
                            Ok::<_, std::io::Error>(Bytes::from(format!("run {run}; "))),
                            1,
                        )),
                        1 => {
                            s.started.notify_one();
                            s.release.notified().await;
                            Some((Ok(Bytes::from_static(b"the end")), 2))
                        }
                        _ => None,
                    }
                }
            });
            (StatusCode::CREATED, Body::from_stream(stream)).into_response()
        }
    };
    // The handler commits (counts its run), answers 201, and its body
    // fails after its first chunk.
    let s = seen.clone();
    let failing = move || {
        let s = s.clone();
        async move {
            let run = s.next();
            let chunks: Vec<Chunk> = vec![
                Ok(Bytes::from(format!("order {run} created"))),
                Err(std::io::Error::other("the body's source went away")),
            ];
            (
                StatusCode::CREATED,
                Body::from_stream(futures::stream::iter(chunks)),
            )
                .into_response()
        }
    };
    // The same under 503, a status the layer does not store by default.
    let s = seen.clone();
    let failing_503 = move || {
        let s = s.clone();
        async move {
            s.next();
            let chunks: Vec<Chunk> = vec![Err(std::io::Error::other("gone"))];
            (
                StatusCode::SERVICE_UNAVAILABLE,
                Body::from_stream(futures::stream::iter(chunks)),
            )
                .into_response()
        }
    };
    // The same, but the body panics after its first chunk.
    let s = seen.clone();
    let panicking = move || {
        let s = s.clone();
        async move {
            let run = s.next();
            let stream = futures::stream::unfold(0u8, move |step| async move {
                match step {
                    0 => Some((
                        Ok::<_, std::io::Error>(Bytes::from(format!("run {run}"))),
                        1,
                    )),
                    _ if run == 1 => panic!("the response body panics on the first run"),
                    _ => None,
                }
            });
            (StatusCode::CREATED, Body::from_stream(stream)).into_response()
        }
    };
    let s = seen.clone();
    let gated = move || {
        let s = s.clone();
        async move {
            let run = s.next();
            s.started.notify_one();
            s.release.notified().await;
            (StatusCode::CREATED, format!("run {run}"))
        }
    };
    // 200 with a body of 17 MiB, over MariaDB's default max_allowed_packet.
    let s = seen.clone();
    let huge = move || {
        let s = s.clone();
        async move {
            let run = s.next();
            let mut body = vec![b'x'; 17 * 1024 * 1024];
            body[..8].copy_from_slice(format!("run {run:>4}").as_bytes());
            (StatusCode::OK, body)
        }
    };
    Router::new()
        .route("/streaming", post(streaming))
        .route("/failing", post(failing))
        .route("/failing-503", post(failing_503))
        .route("/panicking", post(panicking))
        .route("/gated", post(gated))
        .route("/huge", post(huge))
}

struct Server {
    base: String,
    client: reqwest::Client,
}

async fn serve(layer: IdempotencyLayer) -> (Server, Arc<Seen>) {
    let seen = Arc::new(Seen::default());
    let (base, client) = common::http::serve(app(&seen).layer(layer)).await;
    (Server { base, client }, seen)
}

impl Server {
    fn post(&self, path: &str, key: &str) -> reqwest::RequestBuilder {
        self.client
            .post(format!("{}{path}", self.base))
            .header("idempotency-key", key)
            .body("x")
    }
}

/// The client goes away after the handler returned, while its response
/// body is still being produced: the body is still collected and stored,
/// and the retry replays it whole; the handler ran once.
#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn disconnect_while_the_response_body_streams_then_replay() {
    let (store, _guard) = sqlite_store().await;
    let (server, seen) = serve(IdempotencyLayer::new(store)).await;
    let key = fresh_key();
    let gone = tokio::spawn(
        server
            .post("/streaming", &key)
            .timeout(Duration::from_millis(300))
            .send(),
    );
    seen.started.notified().await;
    assert!(gone.await.unwrap().unwrap_err().is_timeout());
    tokio::time::sleep(Duration::from_millis(100)).await;
    seen.release.notify_one();
    let retry = server.post("/streaming", &key).send().await.unwrap();
    assert_eq!(retry.status(), StatusCode::CREATED);
    assert!(replayed(&retry));
    assert_eq!(retry.text().await.unwrap(), "run 1; the end");
    assert_eq!(seen.runs(), 1);
}

/// The handler did its work and answered 201; its body then fails. The
/// client is answered 500 (the layer's problem document). A retry must
/// not run the handler a second time.
///
/// The answer is stored for the key: retries replay the 500, marked as a
/// replay, and run nothing.
async fn response_body_failure_is_not_run_again(path: &str) {
    let (store, _guard) = sqlite_store().await;
    let (server, seen) = serve(IdempotencyLayer::new(store)).await;
    let key = fresh_key();
    let first = server.post(path, &key).send().await.unwrap();
    assert_eq!(first.status(), StatusCode::INTERNAL_SERVER_ERROR);
    assert!(problem_json(&first));
    assert!(!replayed(&first));
    let said = first.text().await.unwrap();
    assert!(said.contains("not run again"), "{said}");
    assert_eq!(seen.runs(), 1);
    for _ in 0..2 {
        let retry = server.post(path, &key).send().await.unwrap();
        let status = retry.status();
        let was_replayed = replayed(&retry);
        let body = retry.text().await.unwrap();
        assert_eq!(
            seen.runs(),
            1,
            "the handler, whose effect committed on the first request, ran again \
             for the retry (answered {status}: {body})"
        );
        assert_eq!(status, StatusCode::INTERNAL_SERVER_ERROR, "{body}");
        assert!(was_replayed, "{body}");
        assert_eq!(body, said);
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn response_body_error_after_the_handler_committed_does_not_run_it_again() {
    response_body_failure_is_not_run_again("/failing").await;
}

/// A response body that panics (outside the handler's call, which the
/// layer guards) after a 201 is answered the same way: the handler's work
/// is done, so the key keeps the 500 and the retry runs nothing.
#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn response_body_panic_after_the_handler_answered_is_not_run_again() {
    response_body_failure_is_not_run_again("/panicking").await;
}

/// A body that fails under a status the layer does not store (a 5xx, by
/// default) leaves the key free, as the status alone would: the response
/// is sent as it streams, so the client sees the transfer cut by the
/// body's error (here its first frame: hyper sends the head with the
/// first bytes of the body, so the connection closes without one), and
/// the retry runs the handler.
#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn response_body_error_under_a_status_not_stored_frees_the_key() {
    let (store, _guard) = sqlite_store().await;
    let (server, seen) = serve(IdempotencyLayer::new(store)).await;
    let key = fresh_key();
    for run in 1..=2 {
        match server.post("/failing-503", &key).send().await {
            Ok(response) => {
                assert_eq!(response.status(), StatusCode::SERVICE_UNAVAILABLE);
                assert!(!replayed(&response));
                let body = response.bytes().await;
                assert!(body.is_err(), "the body's error was not passed on");
            }
            Err(cut) => assert!(cut.is_request(), "{cut}"),
        }
        assert_eq!(seen.runs(), run);
    }
}

/// A duplicate waits up to the layer's bound, then gets 409 with
/// `Retry-After`; once the first completes, a retry replays it.
#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn duplicate_waits_its_bound_then_409_then_replays() {
    let (store, _guard) = sqlite_store().await;
    let (server, seen) = serve(IdempotencyLayer::new(store).wait(Duration::from_millis(400))).await;
    let key = fresh_key();
    let first = tokio::spawn(server.post("/gated", &key).send());
    seen.started.notified().await;
    let asked = Instant::now();
    let duplicate = server.post("/gated", &key).send().await.unwrap();
    let waited = asked.elapsed();
    assert_eq!(duplicate.status(), StatusCode::CONFLICT);
    assert!(problem_json(&duplicate));
    assert!(duplicate.headers().contains_key("retry-after"));
    assert!(waited >= Duration::from_millis(350), "waited {waited:?}");
    assert!(waited < Duration::from_secs(3), "waited {waited:?}");
    seen.release.notify_one();
    let first = first.await.unwrap().unwrap();
    assert_eq!(first.status(), StatusCode::CREATED);
    let retry = server.post("/gated", &key).send().await.unwrap();
    assert!(replayed(&retry));
    assert_eq!(retry.text().await.unwrap(), "run 1");
    assert_eq!(seen.runs(), 1);
}

/// Key headers with bytes no other module sends: answered 400 with a
/// problem document, nothing run, nothing panics.
#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn odd_key_bytes_are_400_problems() {
    let (store, _guard) = sqlite_store().await;
    let (server, seen) = serve(IdempotencyLayer::new(store)).await;
    let values: Vec<HeaderValue> = vec![
        HeaderValue::from_bytes(b"\"k\xff\"").unwrap(),
        HeaderValue::from_bytes(b"k\x80").unwrap(),
        HeaderValue::from_bytes(b"\"a\tb\"").unwrap(),
        HeaderValue::from_bytes(b"\"").unwrap(),
        HeaderValue::from_bytes(b"\"\\").unwrap(),
        HeaderValue::from_str(&format!("\"{}\"", "\\\\".repeat(256))).unwrap(),
    ];
    for value in values {
        let response = server
            .client
            .post(format!("{}/gated", server.base))
            .header("idempotency-key", value.clone())
            .body("x")
            .send()
            .await
            .unwrap();
        assert_eq!(response.status(), StatusCode::BAD_REQUEST, "{value:?}");
        assert!(problem_json(&response), "{value:?}");
    }
    assert_eq!(seen.runs(), 0);
}

/// A response larger than the store can hold (17 MiB, over MariaDB's
/// default `max_allowed_packet` of 16 MiB, which the server answers by
/// closing the connection), under a layer that keeps bodies that large:
/// the first client gets it, and the key does not stay "in progress"
/// while the completion is sent again and again. The service ran, so
/// retries are answered 410 (the response could not be recorded, so it
/// cannot be replayed) and run nothing.
#[cfg(feature = "mysql")]
#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn unstorable_response_does_not_leave_the_key_in_progress() {
    let (store, _guard) = common::backend::mysql::store(4).await;
    let layer = IdempotencyLayer::new(store)
        .max_stored_body(32 * 1024 * 1024)
        .lease(Duration::from_secs(3))
        .wait(Duration::from_millis(300));
    let (server, seen) = serve(layer).await;
    let key = fresh_key();
    let first = server.post("/huge", &key).send().await.unwrap();
    assert_eq!(first.status(), StatusCode::OK);
    assert_eq!(first.bytes().await.unwrap().len(), 17 * 1024 * 1024);
    for _ in 0..3 {
        let retry = server.post("/huge", &key).send().await.unwrap();
        let status = retry.status();
        let problem = problem_json(&retry);
        let body = retry.text().await.unwrap();
        assert_eq!(
            status,
            StatusCode::GONE,
            "the retry of a request whose response the store cannot hold \
             (handler runs: {}): {body}",
            seen.runs()
        );
        assert!(problem, "{body}");
        assert!(body.contains("max_allowed_packet"), "{body}");
        assert_eq!(seen.runs(), 1, "the handler ran again");
    }
}
