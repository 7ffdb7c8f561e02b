//! Responses the layer does not keep, over a real axum server and a real
//! client: a body that never ends, server-sent events, a body of 128 MiB,
//! a body that fails or panics once its head is sent, a duplicate that
//! arrives while the first response is being read, a body still being
//! produced once the layer's wait for its end has passed, and a status
//! that is not stored. Each is sent as it streams, with its head at once;
//! the key then answers `NotReplayable` (410) and the handler never runs
//! twice. Against the last but one: a slow body that ends within the wait
//! is still stored and replayed.

use crate::http_support::{fresh_key, on_each_store, problem_json, replayed, Runs, Server};

use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::Arc;
use std::time::Duration;

use axum::body::{Body, Bytes};
use axum::http::StatusCode;
use axum::response::{IntoResponse, Response};
use axum::routing::post;
use axum::Router;
use idem::http::{IdempotencyLayer, Problem};
use idem::Store;
use serde_json::Value;
use tokio::sync::Notify;

on_each_store!(
    endless_body_is_streamed_and_its_key_is_not_wedged,
    event_stream_head_comes_at_once,
    body_of_128_mib_is_streamed_not_buffered,
    duplicate_while_the_head_is_held_waits_then_is_not_replayable,
    body_failing_after_its_head_is_not_run_again,
    body_panicking_after_its_head_is_not_run_again,
    status_not_stored_streams_and_releases_the_key,
    body_of_known_length_over_the_limit_is_not_replayable,
    body_known_over_the_limit_is_not_waited_for,
    slow_finite_body_within_the_wait_is_stored_and_replayed,
    body_slower_than_the_wait_is_streamed_then_not_replayable,
);

const MIB: u64 = 1024 * 1024;
/// The chunk every generated body is made of.
const CHUNK: usize = 64 * 1024;
/// The bound on waiting for a head: past it, the layer held it back.
const HEAD_WITHIN: Duration = Duration::from_secs(5);

/// How many parts `/slow` sends, and the pause before each after the first.
const SLOW_PARTS: u64 = 3;
const SLOW_PAUSE: Duration = Duration::from_millis(100);

/// Part `n` of `/slow`'s body.
fn slow_part(n: u64) -> Bytes {
    Bytes::from(format!("{{\"part\":{n}}}\n"))
}

/// The whole body of `/slow`.
fn slow_body() -> String {
    (0..SLOW_PARTS)
        .map(|n| String::from_utf8(slow_part(n).to_vec()).unwrap())
        .collect()
}

/// What the handlers did, shared with the test.
#[derive(Default)]
struct Seen {
    runs: Runs,
    /// Bytes (or events) the bodies produced so far.
    produced: AtomicU64,
    gate: Notify,
}

/// The chunk of 64 KiB at `index` of a generated body: every byte is
/// `index % 251`, so that the client can check each byte's place.
fn chunk(index: u64) -> Bytes {
    Bytes::from(vec![(index % 251) as u8; CHUNK])
}

/// A body of numbered chunks, counted as they are produced, that goes on
/// for as long as a client reads it. It stops at [`ENDLESS_CAP`], which no
/// case reads near, so that a layer that buffers it fails the case (its
/// head comes late) rather than exhaust the machine's memory.
fn endless(seen: Arc<Seen>) -> Body {
    Body::from_stream(futures::stream::unfold(0u64, move |index| {
        let seen = seen.clone();
        async move {
            if index * CHUNK as u64 >= ENDLESS_CAP {
                return None;
            }
            seen.produced.fetch_add(CHUNK as u64, Ordering::SeqCst);
            Some((Ok::<_, std::io::Error>(chunk(index)), index + 1))
        }
    }))
}

/// Where [`endless`] stops.
const ENDLESS_CAP: u64 = 256 * MIB;

/// `total` bytes of numbered chunks, then `end` (`None`: the body ends;
/// `Some(true)`: it fails; `Some(false)`: it panics).
fn generated(seen: Arc<Seen>, total: u64, end: Option<bool>) -> Body {
    let chunks = total / CHUNK as u64;
    Body::from_stream(futures::stream::unfold(0u64, move |index| {
        let seen = seen.clone();
        async move {
            if index < chunks {
                seen.produced.fetch_add(CHUNK as u64, Ordering::SeqCst);
                return Some((Ok(chunk(index)), index + 1));
            }
            match end {
                None => None,
                Some(true) if index == chunks => Some((
                    Err(std::io::Error::other("the body's source went away")),
                    index + 1,
                )),
                Some(true) => None,
                Some(false) => panic!("the response body panics after its head"),
            }
        }
    }))
}

fn app(seen: &Arc<Seen>) -> Router {
    let on = |seen: &Arc<Seen>, make: fn(Arc<Seen>) -> Response| {
        let seen = seen.clone();
        post(move || {
            let seen = seen.clone();
            async move {
                seen.runs.next();
                make(seen)
            }
        })
    };
    Router::new()
        .route(
            "/endless",
            on(seen, |seen| {
                let headers = [("content-type", "application/octet-stream")];
                (headers, endless(seen)).into_response()
            }),
        )
        .route(
            "/endless-503",
            on(seen, |seen| {
                (StatusCode::SERVICE_UNAVAILABLE, endless(seen)).into_response()
            }),
        )
        .route(
            "/events",
            on(seen, |seen| {
                let events = futures::stream::unfold(0u64, move |n| {
                    let seen = seen.clone();
                    async move {
                        if n > 0 {
                            tokio::time::sleep(Duration::from_millis(20)).await;
                        }
                        seen.produced.fetch_add(1, Ordering::SeqCst);
                        let event = format!("id: {n}\ndata: tick {n}\n\n");
                        Some((Ok::<_, std::io::Error>(Bytes::from(event)), n + 1))
                    }
                });
                let headers = [("content-type", "text/event-stream; charset=utf-8")];
                (headers, Body::from_stream(events)).into_response()
            }),
        )
        .route(
            "/known",
            on(seen, |_| vec![7u8; 2 * MIB as usize].into_response()),
        )
        .route(
            "/known-gated",
            on(seen, |seen| {
                Body::new(KnownGated::new(seen)).into_response()
            }),
        )
        .route(
            "/big",
            on(seen, |seen| {
                generated(seen, 128 * MIB, None).into_response()
            }),
        )
        .route(
            "/cut",
            on(seen, |seen| {
                (StatusCode::CREATED, generated(seen, 4 * MIB, Some(true))).into_response()
            }),
        )
        .route(
            "/cut-panic",
            on(seen, |seen| {
                (StatusCode::CREATED, generated(seen, 4 * MIB, Some(false))).into_response()
            }),
        )
        .route(
            "/slow",
            on(seen, |seen| {
                // Three short parts, 100 ms apart: a finite body, far
                // under the layer's 1 MiB, that pauses twice.
                let parts = futures::stream::unfold(0u64, move |n| {
                    let seen = seen.clone();
                    async move {
                        if n == SLOW_PARTS {
                            return None;
                        }
                        if n > 0 {
                            tokio::time::sleep(SLOW_PAUSE).await;
                        }
                        seen.produced.fetch_add(1, Ordering::SeqCst);
                        Some((Ok::<_, std::io::Error>(slow_part(n)), n + 1))
                    }
                });
                let headers = [("content-type", "application/x-ndjson")];
                (StatusCode::CREATED, headers, Body::from_stream(parts)).into_response()
            }),
        )
        .route(
            "/gated",
            on(seen, |seen| {
                // Half a MiB, then a wait for the test, then 2 MiB: past
                // the layer's 1 MiB only once the gate opens.
                let body = futures::stream::unfold(0u64, move |index| {
                    let seen = seen.clone();
                    async move {
                        if index == 8 {
                            seen.gate.notified().await;
                        }
                        if index == 40 {
                            return None;
                        }
                        seen.produced.fetch_add(CHUNK as u64, Ordering::SeqCst);
                        Some((Ok::<_, std::io::Error>(chunk(index)), index + 1))
                    }
                });
                (StatusCode::CREATED, Body::from_stream(body)).into_response()
            }),
        )
}

async fn serve<S: Store + 'static>(store: S) -> (Server, Arc<Seen>) {
    serve_with(IdempotencyLayer::new(store)).await
}

async fn serve_with(layer: IdempotencyLayer) -> (Server, Arc<Seen>) {
    let seen = Arc::new(Seen::default());
    (Server::start(app(&seen).layer(layer)).await, seen)
}

/// Sends `request`, and fails if its head does not come within
/// [`HEAD_WITHIN`].
async fn head(request: reqwest::RequestBuilder, what: &str) -> reqwest::Response {
    match tokio::time::timeout(HEAD_WITHIN, request.send()).await {
        Ok(response) => response.unwrap(),
        Err(_) => panic!("no head for {what} within {HEAD_WITHIN:?}: the layer held it back"),
    }
}

/// Checks, once a head came, that its body is still being produced as the
/// client reads it: far less of it was produced than a layer that
/// buffered it would have (all of it, up to [`ENDLESS_CAP`]).
fn assert_streams(seen: &Seen) {
    let produced = seen.produced.load(Ordering::SeqCst);
    assert!(
        produced < 64 * MIB,
        "{} MiB produced before the head came: the response was buffered",
        produced / MIB
    );
}

/// Checks that `response` is the layer's `NotReplayable` answer, given
/// from the record.
async fn assert_not_replayable(response: reqwest::Response) {
    assert_eq!(response.status(), StatusCode::GONE);
    assert!(problem_json(&response));
    assert!(replayed(&response));
    let doc: Value = response.json().await.unwrap();
    assert_eq!(doc["type"], Problem::NotReplayable.type_uri());
    assert_eq!(doc["status"], 410);
    let detail = doc["detail"].as_str().unwrap();
    assert!(detail.contains("not run again"), "{detail}");
}

/// Reads `n` bytes at least of `response`, checking each byte's place in
/// the numbered chunks; the bytes read.
async fn read_at_least(response: &mut reqwest::Response, read: &mut u64, n: u64) {
    while *read < n {
        let got = response.chunk().await.unwrap().expect("the body ended");
        check_place(*read, &got);
        *read += got.len() as u64;
    }
}

/// Whether the first and last bytes of `got`, read at `offset`, are those
/// of the numbered chunks there.
fn check_place(offset: u64, got: &[u8]) {
    let expected = |at: u64| ((at / CHUNK as u64) % 251) as u8;
    let last = offset + got.len() as u64 - 1;
    assert_eq!(got[0], expected(offset), "byte {offset}");
    assert_eq!(got[got.len() - 1], expected(last), "byte {last}");
}

/// A body that never ends: its head comes at once and the client reads
/// it as long as it likes. A duplicate meanwhile is answered 410 from the
/// record, without running the handler; once the client goes away, the
/// body is no longer produced, and the key still answers 410: it is not
/// left claimed.
async fn endless_body_is_streamed_and_its_key_is_not_wedged<S: Store + 'static>(store: S) {
    let (server, seen) = serve(store).await;
    let key = fresh_key();
    let mut first = head(server.post("/endless", &key), "an endless body").await;
    assert_eq!(first.status(), StatusCode::OK);
    assert_streams(&seen);
    assert!(!replayed(&first));
    let mut read = 0;
    read_at_least(&mut first, &mut read, 3 * MIB).await;

    // While the first response still streams.
    let duplicate = head(server.post("/endless", &key), "a duplicate").await;
    assert_not_replayable(duplicate).await;
    assert_eq!(seen.runs.count(), 1);
    let more = read + MIB;
    read_at_least(&mut first, &mut read, more).await;

    // The client goes away: the body stops being produced.
    drop(first);
    tokio::time::sleep(Duration::from_millis(300)).await;
    let stopped = seen.produced.load(Ordering::SeqCst);
    tokio::time::sleep(Duration::from_millis(300)).await;
    assert_eq!(seen.produced.load(Ordering::SeqCst), stopped);

    let retry = head(server.post("/endless", &key), "a retry").await;
    assert_not_replayable(retry).await;
    assert_eq!(seen.runs.count(), 1);
}

/// Server-sent events that never end: sent from the first event, however
/// slowly they come; a duplicate meanwhile gets 410; once the client goes
/// away, no more events are produced and the key still answers 410.
async fn event_stream_head_comes_at_once<S: Store + 'static>(store: S) {
    let (server, seen) = serve(store).await;
    let key = fresh_key();
    let mut events = head(server.post("/events", &key), "an event stream").await;
    assert_eq!(events.status(), StatusCode::OK);
    let mut text = String::new();
    while !text.contains("data: tick 2\n") {
        let got = events.chunk().await.unwrap().expect("the stream ended");
        text.push_str(std::str::from_utf8(&got).unwrap());
    }
    assert!(text.starts_with("id: 0\ndata: tick 0\n\n"), "{text}");
    let duplicate = head(server.post("/events", &key), "a duplicate").await;
    assert_not_replayable(duplicate).await;
    assert_eq!(seen.runs.count(), 1);
    drop(events);
    tokio::time::sleep(Duration::from_millis(200)).await;
    let stopped = seen.produced.load(Ordering::SeqCst);
    tokio::time::sleep(Duration::from_millis(200)).await;
    assert_eq!(seen.produced.load(Ordering::SeqCst), stopped);
    let retry = head(server.post("/events", &key), "a retry").await;
    assert_not_replayable(retry).await;
    assert_eq!(seen.runs.count(), 1);
}

/// 128 MiB in chunks of 64 KiB, of no announced length: the head comes
/// while the body is still being produced, production waits for the
/// client (so the process holds no more than the layer's limit and the
/// connection's buffers), and the client gets every byte, in order.
async fn body_of_128_mib_is_streamed_not_buffered<S: Store + 'static>(store: S) {
    let (server, seen) = serve(store).await;
    let key = fresh_key();
    let mut big = head(server.post("/big", &key), "a body of 128 MiB").await;
    assert_eq!(big.status(), StatusCode::OK);
    let at_head = seen.produced.load(Ordering::SeqCst);
    // The client reads nothing for a while: the body waits for it.
    tokio::time::sleep(Duration::from_millis(300)).await;
    let unread = seen.produced.load(Ordering::SeqCst);
    assert!(
        unread < 48 * MIB,
        "{} MiB produced before the client read any (at the head: {} MiB): \
         the response was buffered",
        unread / MIB,
        at_head / MIB
    );
    let mut read = 0;
    while let Some(got) = big.chunk().await.unwrap() {
        check_place(read, &got);
        read += got.len() as u64;
    }
    assert_eq!(read, 128 * MIB);
    assert_eq!(seen.produced.load(Ordering::SeqCst), 128 * MIB);
    let retry = head(server.post("/big", &key), "a retry").await;
    assert_not_replayable(retry).await;
    assert_eq!(seen.runs.count(), 1);
}

/// The interleaving that would run the handler twice or answer 409 for
/// ever: a duplicate that arrives while the layer still reads the first
/// response's body, before it knows whether to keep it. The claim is held
/// until the answer is recorded, so the duplicate waits (or gets 409 when
/// failing fast); once the body goes past the limit, the answer is
/// recorded before the head goes out, and the duplicates get 410.
async fn duplicate_while_the_head_is_held_waits_then_is_not_replayable<S>(store: S)
where
    S: Store + Clone + 'static,
{
    // The gate is held for a while: the wait for the body is not what
    // this case is about, so it does not pass while the gate is shut.
    let layer = IdempotencyLayer::new(store.clone())
        .wait(HEAD_WITHIN)
        .max_stored_body_wait(Duration::from_secs(60));
    let (server, seen) = serve_with(layer).await;
    // The same routes on the same store, failing fast.
    let (hasty, hasty_seen) = serve_with(IdempotencyLayer::new(store).fail_fast()).await;
    let key = fresh_key();
    let first = tokio::spawn(server.post("/gated", &key).send());
    // The handler answered; the layer read half a MiB and waits for more.
    while seen.produced.load(Ordering::SeqCst) < MIB / 2 {
        tokio::time::sleep(Duration::from_millis(5)).await;
    }
    let fast = head(hasty.post("/gated", &key), "a duplicate failing fast").await;
    assert_eq!(fast.status(), StatusCode::CONFLICT);
    assert!(problem_json(&fast));
    let waiting = tokio::spawn(server.post("/gated", &key).send());
    tokio::time::sleep(Duration::from_millis(200)).await;
    assert!(!waiting.is_finished());
    assert!(!first.is_finished());
    seen.gate.notify_one();
    let mut first = first.await.unwrap().unwrap();
    assert_eq!(first.status(), StatusCode::CREATED);
    assert_not_replayable(waiting.await.unwrap().unwrap()).await;
    let mut read = 0;
    while let Some(got) = first.chunk().await.unwrap() {
        check_place(read, &got);
        read += got.len() as u64;
    }
    assert_eq!(read, 40 * CHUNK as u64);
    assert_eq!(seen.runs.count(), 1);
    assert_eq!(hasty_seen.runs.count(), 0);
}

/// A body that fails (or panics) after its head was sent: the client sees
/// the transfer cut; the handler ran, so the key answers 410 and the retry
/// runs nothing.
async fn body_cut_after_its_head(server: Server, seen: Arc<Seen>, path: &str) {
    let key = fresh_key();
    let mut first = head(server.post(path, &key), "a body cut short").await;
    assert_eq!(first.status(), StatusCode::CREATED);
    let mut read = 0;
    let cut = loop {
        match first.chunk().await {
            Ok(Some(got)) => read += got.len() as u64,
            Ok(None) => break false,
            Err(_) => break true,
        }
    };
    assert!(cut, "the body ended cleanly after {read} bytes");
    assert!(read <= 4 * MIB);
    for _ in 0..2 {
        let retry = head(server.post(path, &key), "a retry").await;
        assert_not_replayable(retry).await;
    }
    assert_eq!(seen.runs.count(), 1);
}

async fn body_failing_after_its_head_is_not_run_again<S: Store + 'static>(store: S) {
    let (server, seen) = serve(store).await;
    body_cut_after_its_head(server, seen, "/cut").await;
}

async fn body_panicking_after_its_head_is_not_run_again<S: Store + 'static>(store: S) {
    let (server, seen) = serve(store).await;
    body_cut_after_its_head(server, seen, "/cut-panic").await;
}

/// A status the layer does not store (503, by default) is sent as it
/// streams too, and releases the key: a retry runs the handler.
async fn status_not_stored_streams_and_releases_the_key<S: Store + 'static>(store: S) {
    let (server, seen) = serve(store).await;
    let key = fresh_key();
    let mut first = head(server.post("/endless-503", &key), "an endless 503").await;
    assert_eq!(first.status(), StatusCode::SERVICE_UNAVAILABLE);
    assert_streams(&seen);
    let mut read = 0;
    read_at_least(&mut first, &mut read, 2 * MIB).await;
    let retry = head(server.post("/endless-503", &key), "a retry").await;
    assert_eq!(retry.status(), StatusCode::SERVICE_UNAVAILABLE);
    assert!(!replayed(&retry));
    assert_eq!(seen.runs.count(), 2);
}

/// A body whose length is known and over the limit (2 MiB of bytes in
/// hand) is sent without being read first, and not stored: the retry
/// gets 410, not a replay.
async fn body_of_known_length_over_the_limit_is_not_replayable<S: Store + 'static>(store: S) {
    let (server, seen) = serve(store).await;
    let key = fresh_key();
    let first = head(server.post("/known", &key), "a body of 2 MiB").await;
    assert_eq!(first.status(), StatusCode::OK);
    let body = first.bytes().await.unwrap();
    assert_eq!(body.len() as u64, 2 * MIB);
    assert!(body.iter().all(|&b| b == 7));
    let retry = head(server.post("/known", &key), "a retry").await;
    assert_not_replayable(retry).await;
    assert_eq!(seen.runs.count(), 1);
}

/// A body of 2 MiB whose length is known from the start (its size hint
/// is exact), and whose first byte comes only once the test opens
/// `seen.gate`.
struct KnownGated {
    seen: Arc<Seen>,
    gate: Option<std::pin::Pin<Box<dyn std::future::Future<Output = ()> + Send>>>,
    left: u64,
}

impl KnownGated {
    fn new(seen: Arc<Seen>) -> Self {
        let opened = seen.clone();
        KnownGated {
            seen,
            gate: Some(Box::pin(async move { opened.gate.notified().await })),
            left: 2 * MIB,
        }
    }
}

impl http_body::Body for KnownGated {
    type Data = Bytes;
    type Error = std::convert::Infallible;

    fn poll_frame(
        mut self: std::pin::Pin<&mut Self>,
        cx: &mut std::task::Context<'_>,
    ) -> std::task::Poll<Option<Result<http_body::Frame<Bytes>, Self::Error>>> {
        if let Some(gate) = self.gate.as_mut() {
            std::task::ready!(gate.as_mut().poll(cx));
            self.gate = None;
        }
        if self.left == 0 {
            return std::task::Poll::Ready(None);
        }
        self.left -= CHUNK as u64;
        self.seen.produced.fetch_add(CHUNK as u64, Ordering::SeqCst);
        std::task::Poll::Ready(Some(Ok(http_body::Frame::data(chunk(0)))))
    }

    fn size_hint(&self) -> http_body::SizeHint {
        http_body::SizeHint::with_exact(self.left)
    }
}

/// A body whose length is known to be over the limit before any of it
/// comes is sent at once: the layer does not wait for bytes it will not
/// keep. Its head comes while the body has produced nothing (the wait for
/// a body's end is a minute here, so a layer that read first would hold
/// the head that long), and the retry gets 410.
async fn body_known_over_the_limit_is_not_waited_for<S: Store + 'static>(store: S) {
    let layer = IdempotencyLayer::new(store).max_stored_body_wait(Duration::from_secs(60));
    let (server, seen) = serve_with(layer).await;
    let key = fresh_key();
    let first = head(
        server.post("/known-gated", &key),
        "a body of 2 MiB, known, not yet produced",
    )
    .await;
    assert_eq!(first.status(), StatusCode::OK);
    assert_eq!(seen.produced.load(Ordering::SeqCst), 0);
    seen.gate.notify_one();
    let body = first.bytes().await.unwrap();
    assert_eq!(body.len() as u64, 2 * MIB);
    let retry = head(server.post("/known-gated", &key), "a retry").await;
    assert_not_replayable(retry).await;
    assert_eq!(seen.runs.count(), 1);
}

/// A finite body that pauses (three parts 100 ms apart, a few dozen
/// bytes), ending well within the default `max_stored_body_wait`, is
/// still read whole and stored: the retry is a replay of the same body,
/// and the handler runs once.
async fn slow_finite_body_within_the_wait_is_stored_and_replayed<S: Store + 'static>(store: S) {
    let (server, seen) = serve(store).await;
    let key = fresh_key();
    let first = head(server.post("/slow", &key), "a slow finite body").await;
    assert_eq!(first.status(), StatusCode::CREATED);
    assert!(!replayed(&first));
    // Held back until the body ended, as a response to store is.
    assert_eq!(seen.produced.load(Ordering::SeqCst), SLOW_PARTS);
    assert_eq!(first.text().await.unwrap(), slow_body());
    let retry = head(server.post("/slow", &key), "a retry").await;
    assert_eq!(retry.status(), StatusCode::CREATED);
    assert!(replayed(&retry));
    assert_eq!(retry.headers()["content-type"], "application/x-ndjson");
    assert_eq!(retry.text().await.unwrap(), slow_body());
    assert_eq!(seen.runs.count(), 1);
}

/// The same body behind a layer that waits 20 ms for a body to end: the
/// wait passes at its first pause, so its head and first part are sent
/// before the rest is produced, the rest streams, and the key answers
/// 410 afterwards without running the handler again.
async fn body_slower_than_the_wait_is_streamed_then_not_replayable<S: Store + 'static>(store: S) {
    let layer = IdempotencyLayer::new(store).max_stored_body_wait(Duration::from_millis(20));
    let (server, seen) = serve_with(layer).await;
    let key = fresh_key();
    let first = head(server.post("/slow", &key), "a body slower than the wait").await;
    assert_eq!(first.status(), StatusCode::CREATED);
    assert!(!replayed(&first));
    let at_head = seen.produced.load(Ordering::SeqCst);
    assert!(
        at_head < SLOW_PARTS,
        "the head came once all {at_head} parts were produced: the layer waited for the end"
    );
    assert_eq!(first.text().await.unwrap(), slow_body());
    for _ in 0..2 {
        let retry = head(server.post("/slow", &key), "a retry").await;
        assert_not_replayable(retry).await;
    }
    assert_eq!(seen.runs.count(), 1);
}
