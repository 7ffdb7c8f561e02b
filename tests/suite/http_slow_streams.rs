//! A slow stream of any media type gets its head: the layer waits a bounded
//! time for a body to end, not only a bounded size, before it answers.

use crate::http_support::{fresh_key, on_each_store, Runs, Server};

use std::sync::Arc;
use std::time::Duration;

use axum::body::{Body, Bytes};
use axum::http::StatusCode;
use axum::response::IntoResponse;
use axum::routing::post;
use axum::Router;
use idem::http::IdempotencyLayer;
use idem::Store;

on_each_store!(a_slow_endless_stream_of_another_media_type_gets_its_head);

/// How long a client waits for a head before it gives up.
const HEAD_WITHIN: Duration = Duration::from_secs(5);

/// A handler that streams an export as newline-delimited JSON
/// (`application/x-ndjson`, not in the layer's default
/// `stream_media_types`): a small line every 50 ms, for as long as the
/// client reads (a live feed, or an export fed by a slow cursor). It
/// never ends and never comes near the layer's `max_stored_body` (1 MiB
/// takes hours at this rate).
///
/// Expected (issue 35 item 4: "a streaming response ... never answers,
/// its claim is renewed for ever, and duplicates get 409" is what the
/// fix closes; ARCHITECTURE invariant 10: "a caller's wait ... bounded
/// ..., never a wedge"): the client gets the head, and the body as it
/// streams, within a few seconds.
///
/// Actual: the layer reads the body, waiting for its end or for 1 MiB,
/// before it sends the head; the client gets nothing (and a duplicate gets
/// 409) for as long as the stream flows, its claim renewed all along. Only
/// `text/event-stream` streams by default, so every other kind of live
/// response keeps the wedge that item 4 describes.
async fn a_slow_endless_stream_of_another_media_type_gets_its_head<S: Store + 'static>(store: S) {
    let runs = Arc::new(Runs::default());
    let app = Router::new().route(
        "/feed",
        post({
            let runs = runs.clone();
            move || {
                let runs = runs.clone();
                async move {
                    runs.next();
                    let lines = futures::stream::unfold(0u64, |n| async move {
                        if n > 0 {
                            tokio::time::sleep(Duration::from_millis(50)).await;
                        }
                        // Ends long after any test: no layer reads it whole.
                        if n > 1_000_000 {
                            return None;
                        }
                        let line = format!("{{\"tick\":{n}}}\n");
                        Some((Ok::<_, std::io::Error>(Bytes::from(line)), n + 1))
                    });
                    let headers = [("content-type", "application/x-ndjson")];
                    (headers, Body::from_stream(lines)).into_response()
                }
            }
        }),
    );
    let server = Server::start(app.layer(IdempotencyLayer::new(store))).await;
    let key = fresh_key();
    let first = tokio::time::timeout(HEAD_WITHIN, server.post("/feed", &key).send()).await;
    let duplicate = server.post("/feed", &key).send().await.unwrap();
    let duplicate_status = duplicate.status();
    let first = first.unwrap_or_else(|_| {
        panic!(
            "no head within {HEAD_WITHIN:?} for a never-ending application/x-ndjson stream \
             (the layer holds it back until 1 MiB); a duplicate meanwhile got \
             {duplicate_status}; the handler ran {} time(s)",
            runs.count()
        )
    });
    assert_eq!(first.unwrap().status(), StatusCode::OK);
}
