//! A tower layer for the `Idempotency-Key` header (IETF
//! draft-ietf-httpapi-idempotency-key-header): a retry gets the first
//! response back, a duplicate waits for it, a key reused with another
//! request is refused.
//!
//! **What the layer alone guarantees after a crash.** The response is
//! stored once the inner service produced it. If the process dies while
//! the inner service runs, nothing is stored, and once the layer's
//! [`lease`](IdempotencyLayer::lease) passes (30 s by default), a retry
//! runs the inner service again; until then a retry gets 409 with
//! `Retry-After`. That is safe for rows written in one transaction, not
//! for an effect outside the database (a card charge). For those, the
//! handler passes the key to an `#[idempotent(..., entity)]` operation
//! that makes the outside call a durable [`Step`](crate::steps::Step) on
//! its derived key: the payments recipe of the README and of
//! `examples/payments/service.rs`. The guide's
//! [HTTP chapter](crate::_guide::http#after-a-crash) gives the timeline
//! of such a request after a crash, held by two records.
//!
//! The `http` feature is the layer, on any tower service of `http` 1.x
//! requests and responses (axum, hyper with tower, tonic's HTTP): it does
//! not depend on axum. The `axum` feature (which enables `http`, and is a
//! default) adds axum's route templates as the scope of keys
//! ([`MatchedPathRoute`]), extractors for the key and the principal that
//! the layer checked ([`IdempotencyKey`], [`Principal`]), the [`Final`]
//! mark as a response part, and `IntoResponse` for the layer's answers
//! ([`ProblemDetails`]).
//!
//! ```
//! use axum::{routing::post, Router};
//! use idem::http::IdempotencyLayer;
//! use idem::MemoryStore;
//! use tower::ServiceExt;
//!
//! async fn create_order(body: String) -> String {
//!     format!("order created for {body}")
//! }
//!
//! # #[tokio::main(flavor = "current_thread")]
//! # async fn main() {
//! let app = Router::new()
//!     .route("/orders", post(create_order))
//!     .layer(IdempotencyLayer::new(MemoryStore::new()));
//!
//! let request = || {
//!     http::Request::post("/orders")
//!         .header("Idempotency-Key", "\"8e03978e-40d5-43e8-bc93-6894a57f9324\"")
//!         .body(axum::body::Body::from("2 apples"))
//!         .unwrap()
//! };
//! let first = app.clone().oneshot(request()).await.unwrap();
//! let retry = app.clone().oneshot(request()).await.unwrap();
//! assert!(first.headers().get("idempotent-replayed").is_none());
//! assert_eq!(retry.headers()["idempotent-replayed"], "true");
//! # }
//! ```
//!
//! # Behaviour
//!
//! **Which requests.** POST and PATCH ([`methods`](IdempotencyLayer::methods)
//! changes the set). Requests with other methods pass through untouched.
//!
//! **The key** is read from the `Idempotency-Key` header
//! ([`with_header_name`](IdempotencyLayer::with_header_name) changes it),
//! in the draft's Structured Field String form (`"8e03978e-..."`, with `\"`
//! and `\\` escapes) or, for compatibility, bare (`8e03978e-...`). It must be
//! present once and be 1 to 255 bytes of visible ASCII once decoded. A
//! request without a key is refused, or passed through untouched with
//! [`require_key(false)`](IdempotencyLayer::require_key).
//!
//! **The payload.** The body is buffered, up to 2 MiB
//! ([`body_limit`](IdempotencyLayer::body_limit)). The fingerprint is the
//! SHA-256 of the method, the path with its query, the body and the
//! values of the headers named by
//! [`fingerprint_headers`](IdempotencyLayer::fingerprint_headers) (none by
//! default), framed so that no two requests hash the same bytes.
//!
//! A JSON body (one `Content-Type` header, `application/json` or any
//! `type/subtype+json`, whatever its parameters) counts by its canonical
//! JSON, the one `#[idempotent]` compares ([`crate::fingerprint`]):
//! object members sorted by name at every depth, no whitespace, strings
//! escaped as `serde_json` escapes them. A retry whose members come in
//! another order, or with other whitespace, is the same payload. The
//! fields named by [`ignore_fields`](IdempotencyLayer::ignore_fields)
//! (JSON pointers such as `/sent_at`) are left out, so a retry in which
//! only they differ is the same payload too. A JSON body counts by its
//! bytes instead, as every other body does, when it is not valid JSON,
//! nests deeper than 128 levels, names a member twice in one object, or
//! holds a number that a 64-bit float could confuse with another; and
//! with
//! [`canonical_json(false)`](IdempotencyLayer::canonical_json). A number
//! keeps the body canonical when it is a 64-bit integer, or when its
//! double's shortest text (the one serde_json, ryu and JavaScript's
//! `JSON.stringify` write, such as `59.97000000000001` for `19.99 * 3`)
//! has its value, in any spelling (`1e+21`, `1.5E-7`, `0.00000015`):
//! the canonical JSON then writes it as that shortest text, which no
//! other number is written as. `0.10000000000000001`, another text of
//! 0.1's double, and `18446744073709551616`, past 64 bits and not its
//! double's shortest text, make a body count by its bytes.
//!
//! **The scope** of a key is the method plus the route
//! (`POST /orders/{id}`). The route is the first answer of:
//!
//! 1. the [`MakeRoute`] given to [`route`](IdempotencyLayer::route), if
//!    any and if it answers `Some`;
//! 2. with the `axum` feature, axum's `MatchedPath`, when the request went
//!    through a route of an axum 0.8 router ([`MatchedPathRoute`]);
//! 3. the request's path, without its query ([`RequestPath`]).
//!
//! So without the `axum` feature, a request routed by axum is scoped to
//! its path (`POST /orders/17`), unless a [`MakeRoute`] names its route. A
//! long scope (a raw path) is stored as a prefix and a digest, as every
//! [`Scope`](crate::Scope) is.
//!
//! **The principal.** The scope is narrowed to a principal when the layer
//! has a [`principal`](IdempotencyLayer::principal) extractor
//! ([`MakePrincipal`]): the same key sent by two principals never shares a
//! response. The extractor reads what authentication established, such as
//! an extension that the authentication middleware in front of the layer
//! inserted once it verified the request's token; never a header or a
//! parameter that a client may set to anything. A request in which the
//! extractor finds no principal is refused with 401: the inner service
//! does not run and nothing is stored. **Without an extractor, keys are
//! global to the route**: any client sending another client's key with the
//! same payload is answered that client's response. Set one whenever
//! requests come from more than one tenant, account or user.
//!
//! **The flow** is the engine's ([`crate::engine`]), on the store given to
//! [`IdempotencyLayer::new`]:
//!
//! - first request with a key: the inner service runs; its response is
//!   buffered whole and stored (unless it is one that is not stored: see
//!   [below](#which-responses-are-stored)), then sent; a response that
//!   is not stored, is a stream, whose body is over 1 MiB, or whose body
//!   is still being produced a second after it first paused is sent as it
//!   streams instead (see [Bodies](#bodies));
//! - same key, same payload, after it completed: the stored response is
//!   sent again, marked `Idempotent-Replayed: true`; the inner service does
//!   not run;
//! - same key, same payload, while it runs: the duplicate waits for the
//!   first response (5 seconds at most, [`wait`](IdempotencyLayer::wait)),
//!   then is answered as above; past the bound, or at once with
//!   [`fail_fast`](IdempotencyLayer::fail_fast), it gets 409, with
//!   `Retry-After` the time left on the first request's lease;
//! - same key, another payload: 422, whatever the state. Once the first
//!   request's response is stored, the 422's detail names what differs
//!   from it (the method, the path, the query, the body, a fingerprinted
//!   header), and says when the body was compared as JSON one time and as
//!   bytes the other; the response is stored with short digests of the
//!   request's parts for this.
//!
//! **What is stored**: status, headers and body. Hop-by-hop headers
//! (`Connection` and those it names, `Keep-Alive`, `Transfer-Encoding`,
//! `TE`, `Trailer`, `Upgrade`, `Proxy-*`) and per-response ones (`Date`,
//! `Age`, `Content-Length`, which the server sets anew) are not replayed.
//! Nor are per-client ones, which are never stored: `Set-Cookie` (and the
//! obsolete `Set-Cookie2`), `WWW-Authenticate`, `Authentication-Info` and
//! `Proxy-Authentication-Info`. A cookie or a step of an authentication
//! exchange belongs to the client that got the first response, which still
//! receives them; a replay may go to another client (always so when keys
//! are global to the route). Which responses are stored at all: see
//! [below](#which-responses-are-stored).
//!
//! **Answers of the layer's own**, each an RFC 9457
//! `application/problem+json` document with `type`, `title`, `status` and
//! `detail` (see [`Problem`] and [`ProblemDetails`]):
//!
//! | status | when |
//! |---|---|
//! | 400 | key missing (on a method that requires one), repeated, empty, over 255 bytes, not visible ASCII, not a valid structured string; or the body could not be read |
//! | 401 | the layer has a principal extractor and it finds no principal in the request; nothing is run or stored |
//! | 413 | the body is over the limit; nothing is stored |
//! | 422 | the key was used with another payload |
//! | 409 + `Retry-After` | a request with the key is still running and the wait bound passed, or the layer fails fast; `Retry-After` is the time left on the lease of the record that holds the key, in whole seconds, rounded up, at least 1 |
//! | 503 + `Retry-After` | the store cannot be reached; the request is not executed |
//! | 410 | the request with the key was processed, but its response was not kept: it was streamed (a stream's media type, a body over [`max_stored_body`](IdempotencyLayer::max_stored_body), or one that had not ended within [`max_stored_body_wait`](IdempotencyLayer::max_stored_body_wait): see [Bodies](#bodies)), or the store could not hold it ([`Error::Unrecorded`](crate::Error::Unrecorded)); nothing runs again for the key |
//! | 500 | the layer failed: an invalid policy (zero ttl or lease), a stored response that cannot be read, a response body that failed while buffered (kept for the key when its status is one that is stored: see below) |
//!
//! **Failures of the inner service.** Its error type is kept: an error is
//! returned as it is, and the key is released. A panic releases the key,
//! then continues unwinding into the caller (add tower-http's
//! `CatchPanicLayer` outside this layer to turn it into a 500). If the
//! response cannot be stored after the request ran (the store failed, or the
//! claim's lease ran out and another request took the key over), the client
//! still gets it, and a warning is logged. A response body that fails or
//! panics while it is buffered (within
//! [`max_stored_body`](IdempotencyLayer::max_stored_body) and
//! [`max_stored_body_wait`](IdempotencyLayer::max_stored_body_wait)), after the
//! inner service answered with a status that is stored, is answered 500,
//! and that 500 is stored for the key: the service did its work, so a
//! retry replays the 500 rather than run it again. A body that fails or
//! panics once its head was sent (a response streamed, see
//! [Bodies](#bodies)) ends the transfer with an error, as it would
//! without the layer (hyper closes the connection; a panic is caught and
//! becomes that error), and the key answers what it answers for that
//! response: 410 under a status that is stored, nothing under one that
//! is not.
//!
//! **Cancellation.** A claimed request runs on a Tokio task of its own, with
//! a clone of the inner service: when the client disconnects and the server
//! drops the response future, the request still runs to the end and its
//! response is stored, so the client's retry gets it. The layer therefore
//! needs a Tokio runtime, as axum has.
//!
//! **Bodies.** The request body type stays the inner service's, and must
//! be buildable from `Bytes` (axum's `Body` and http-body-util's `Full`
//! are). The response body is a [`ResponseBody`] over the inner service's
//! body type, which axum turns into its `Body` (behind a `Router`, nothing
//! changes; a plain tower service served by `axum::serve` maps it with
//! `IntoResponse::into_response`). See [Bodies](#bodies) for when it
//! streams.
//!
//! The store can be any [`Store`](crate::Store); it is shared by every
//! service the layer makes.
//!
//! # Which responses are stored
//!
//! A result is stored only once the request ran: as with Stripe, a
//! request refused as it was sent (no `Content-Type`, malformed JSON, a
//! failed validation) leaves no record, so the client may correct it and
//! send it again with the same key, and that request runs. The layer
//! decides by the first row that matches the inner service's response:
//!
//! | response | stored and replayed | why |
//! |---|---|---|
//! | marked [`Final`] by the handler, any status | yes | the handler says that the request ran and this is its answer (a `402` declined card, a `422` from a business rule) |
//! | 2xx | yes | the request ran |
//! | 3xx | yes | a `303 See Other` after a POST means the POST did its work |
//! | 400, 403, 404, 405, 406, 411, 412, 413, 414, 415, 417, 421, 422, 426, 428, 431 | no | the request was not acceptable as sent, and did not run. axum's extractor rejections are among them: `415` for a JSON body without `Content-Type`, `400` for malformed JSON, `422` for JSON of the wrong shape, `413` for a body over axum's limit, `400` for a bad path or query |
//! | 401, 407 | no | the answer to the credentials, not to the request: the client authenticates and retries with the same key (and a 401 is nothing without its `WWW-Authenticate` challenge, which belongs to one client and is never stored) |
//! | 408, 409, 425, 429 | no | "try again later" |
//! | every other 4xx (402, 410, 424, 451, ...) | yes | the answer of a request that ran |
//! | 1xx, 5xx | no | not a final answer; the server failed, and a retry runs again |
//!
//! A response that is not stored still goes to the client; the key is
//! released, so the next request with it runs, whatever its payload (the
//! refused one was never recorded). The rows by status are
//! [`stored_by_default`]; [`store_status`](IdempotencyLayer::store_status)
//! replaces them with a predicate of its own, and the [`Final`] row stays
//! first. A handler whose refusal is the outcome of work it did (a `422`
//! once its business rule ran) marks the response [`Final`]:
//!
//! ```
//! use axum::http::StatusCode;
//! use axum::response::IntoResponse;
//! use axum::{routing::post, Json, Router};
//! use idem::http::{Final, IdempotencyLayer};
//! use idem::MemoryStore;
//! use serde_json::Value;
//! use tower::ServiceExt;
//!
//! async fn create_order(Json(order): Json<Value>) -> impl IntoResponse {
//!     if order["quantity"].as_u64() > Some(10) {
//!         // The stock was checked: the same answer for every retry.
//!         return (StatusCode::UNPROCESSABLE_ENTITY, Final, "out of stock").into_response();
//!     }
//!     (StatusCode::CREATED, "created").into_response()
//! }
//!
//! # #[tokio::main(flavor = "current_thread")]
//! # async fn main() {
//! let app = Router::new()
//!     .route("/orders", post(create_order))
//!     .layer(IdempotencyLayer::new(MemoryStore::new()));
//! let send = |key: &str, content_type: Option<&str>, body: &'static str| {
//!     let mut request = http::Request::post("/orders").header("Idempotency-Key", key);
//!     if let Some(content_type) = content_type {
//!         request = request.header("Content-Type", content_type);
//!     }
//!     app.clone().oneshot(request.body(axum::body::Body::from(body)).unwrap())
//! };
//! let replayed = |response: &http::Response<_>| response.headers().contains_key("idempotent-replayed");
//!
//! // Sent without its Content-Type: axum's 415, not stored...
//! let refused = send("k1", None, r#"{"quantity": 2}"#).await.unwrap();
//! assert_eq!(refused.status(), StatusCode::UNSUPPORTED_MEDIA_TYPE);
//! // ...so the corrected request, with the same key, runs.
//! let created = send("k1", Some("application/json"), r#"{"quantity": 2}"#).await.unwrap();
//! assert_eq!(created.status(), StatusCode::CREATED);
//! assert!(!replayed(&created));
//!
//! // A final 422 is stored: its retry is a replay.
//! let json = Some("application/json");
//! let out = send("k2", json, r#"{"quantity": 50}"#).await.unwrap();
//! assert_eq!(out.status(), StatusCode::UNPROCESSABLE_ENTITY);
//! let again = send("k2", json, r#"{"quantity": 50}"#).await.unwrap();
//! assert!(replayed(&again));
//! # }
//! ```
//!
//! # Bodies
//!
//! The layer holds at most
//! [`max_stored_body`](IdempotencyLayer::max_stored_body) bytes of a
//! response body (1 MiB by default), plus the chunk that crosses it, and
//! the request body up to [`body_limit`](IdempotencyLayer::body_limit).
//! It waits for a response body to end for at most
//! [`max_stored_body_wait`](IdempotencyLayer::max_stored_body_wait) (1
//! second by default), counted from the first time the body has no chunk
//! ready: a handler that returns a whole body (axum's `Json`, a `String`)
//! ends it at once, and never starts that wait (no timer is armed for
//! it); a body still being produced a second after it paused is taken for
//! a stream, whatever its media type (a feed, an export fed by a slow
//! cursor), which may never end. So bytes and time both bound how long
//! the head is held back. What happens to the response depends on what
//! the inner service answered, in this order:
//!
//! | response | sent | the key answers afterwards |
//! |---|---|---|
//! | a status that is not stored ([below](#which-responses-are-stored)) | at once, as it streams | nothing: it is released before the head is sent, and the next request runs |
//! | a `Content-Type` among [`stream_media_types`](IdempotencyLayer::stream_media_types) (`text/event-stream` by default) | at once, as it streams | [`Problem::NotReplayable`], 410 |
//! | a body whose size hint says it is over the limit (a body of known length) | at once, as it streams | [`Problem::NotReplayable`], 410 |
//! | a body that ends within the limit and the wait | once it is read and stored | the stored response, replayed |
//! | a body that goes past the limit | once it goes past: the part read, then the rest as it streams | [`Problem::NotReplayable`], 410 |
//! | a body that has not ended when the wait passes | once the wait passes: the part read, then the rest as it streams | [`Problem::NotReplayable`], 410 |
//!
//! A stream's outcome is recorded **when its head is sent, before it
//! goes out**, not when it ends: the head waits for the store's write of
//! the [`Problem::NotReplayable`] answer (as a stored response waits for
//! its own), then the body streams with no claim held. A stream may never
//! end (server-sent events), so a record kept in progress until its end
//! would leave every retry waiting, then 409, for as long as it flows,
//! and its lease renewed for ever; and once the head is out, the request
//! has run, so no retry may run it again. So a duplicate that arrives
//! while the layer still reads the first part of the body waits for the
//! record (or gets 409 with [`fail_fast`](IdempotencyLayer::fail_fast)
//! or past its wait), then gets 410; one that arrives while the body
//! streams gets 410 at once. With the default bounds (a wait of 1 second
//! for the body's end, 5 seconds for a duplicate) a duplicate that
//! arrives while the layer waits for a slow body gets the 410, not a 409. None runs the inner service. If the client
//! goes away, or the body fails or panics once its head is sent, the
//! answer stays 410: the request ran, and what it answered is lost.
//! Should the record fail to be written (the store down), the response is
//! still sent, as any response that could not be stored is.
//!
//! The 410 is an `application/problem+json` document, stored for the key
//! and replayed as a stored response is (`Idempotent-Replayed: true`),
//! whose `detail` says why the response was not kept. Stripe stores every
//! response of a request that ran and replays it; the IETF draft leaves
//! open what a resource that cannot replay answers. A stream cannot be
//! replayed, and running the request again would break the key's
//! promise, so the retry gets a final answer that says so: 410 Gone, the
//! response is gone for good. It is a 4xx, so a client's automatic retries
//! stop (a 5xx invites them), and neither 409 (the draft's "in progress,
//! retry later") nor 422 (the key reused with another request) is true of
//! it. A client that needs the effect again sends a new key, knowing the
//! first request ran.
//!
//! # What the handler sees
//!
//! The layer puts what it checked in the request's extensions: the key
//! ([`IdempotencyKey`]) and, with a
//! [`principal`](IdempotencyLayer::principal) extractor, the principal
//! it found ([`Principal`]). With the `axum` feature both are
//! extractors: behind the layer, `IdempotencyKey` is the key the layer
//! checked, from whatever header it reads, without parsing it again (a
//! request the layer let through without a key, a method it does not
//! cover or a key it does not require, has none: the extractor refuses
//! it, whatever other header the request carries);
//! `Principal` is the layer's principal (`Option<Principal>` where there
//! may be none). A handler that also runs an `#[idempotent]` function, a
//! second line of defence, passes it that key (and narrows its scope to
//! that principal), so both lines guard the same key. Give that function
//! a scope of its own (its default, or any `scope` but the layer's
//! `METHOD /route`): the layer holds the claim of its own scope while the
//! handler runs.
//!
//! ```
//! use axum::{routing::post, Router};
//! use http::header::HeaderName;
//! use idem::http::{IdempotencyKey, IdempotencyLayer};
//! use idem::MemoryStore;
//! use tower::ServiceExt;
//!
//! async fn create_order(key: IdempotencyKey) -> String {
//!     format!("order {key}")
//! }
//!
//! # #[tokio::main(flavor = "current_thread")]
//! # async fn main() {
//! let app = Router::new().route("/orders", post(create_order)).layer(
//!     IdempotencyLayer::new(MemoryStore::new())
//!         .with_header_name(HeaderName::from_static("x-request-key")),
//! );
//! let request = http::Request::post("/orders")
//!     .header("x-request-key", "\"o-17\"")
//!     .body(axum::body::Body::empty())
//!     .unwrap();
//! let response = app.oneshot(request).await.unwrap();
//! let body = axum::body::to_bytes(response.into_body(), 1024).await.unwrap();
//! assert_eq!(body, "order o-17");
//! # }
//! ```
//!
//! # The contract outside the layer
//!
//! A handler that reads the key itself, or calls the engine itself
//! (`#[idempotent]`, [`run`](crate::engine::run)) on a route without the
//! layer, keeps the layer's contract with two pieces:
//!
//! - [`IdempotencyKey`] reads the key header as the layer does
//!   ([`from_headers`](IdempotencyKey::from_headers)), and as an axum
//!   extractor (where no layer checked the key before it) refuses a
//!   request without a valid key with the layer's own 400; a
//!   [`KeyHeaderError`] converts into that answer;
//! - `ProblemDetails::from(&error)` answers an [`Error`](crate::Error) of
//!   the engine as the layer does: 422 for a reused key, 409 with
//!   `Retry-After` while the first call runs, 503 with `Retry-After` when
//!   the store fails, 400 for a missing or invalid key, 500 otherwise.
//!   It converts into an `http::Response`, and with the `axum` feature it
//!   is an `IntoResponse`.
//!
//! ```
//! # #[cfg(feature = "axum")]
//! # mod example {
//! use axum::extract::State;
//! use axum::response::{IntoResponse, Response};
//! use idem::http::{IdempotencyKey, ProblemDetails};
//! use idem::{idempotent, MemoryStore};
//!
//! #[idempotent(key = key, store = store, fingerprint = item)]
//! async fn place(store: &MemoryStore, key: &IdempotencyKey, item: &str) -> Result<String, idem::Error> {
//!     Ok(format!("placed {item}"))
//! }
//!
//! /// `POST /orders`, on a router without the layer.
//! async fn create_order(
//!     State(store): State<MemoryStore>,
//!     key: IdempotencyKey,
//!     item: String,
//! ) -> Response {
//!     match place(&store, &key, &item).await {
//!         Ok(order) => order.into_response(),
//!         Err(err) => ProblemDetails::from(&err).into_response(),
//!     }
//! }
//! # }
//! ```

#[cfg(feature = "axum")]
mod axum;
mod body;
mod config;
mod fingerprint;
mod future;
mod key_header;
mod layer;
mod principal;
mod problem;
mod route;
mod service;
pub(crate) mod stored;
mod storing;
mod unwind;

#[cfg(feature = "axum")]
pub use self::axum::MatchedPathRoute;
pub use body::ResponseBody;
pub use future::ResponseFuture;
pub use key_header::{IdempotencyKey, KeyHeaderError};
pub use layer::IdempotencyLayer;
pub use principal::{MakePrincipal, Principal};
pub use problem::{Problem, ProblemDetails};
pub use route::{MakeRoute, RequestPath};
pub use service::Idempotency;
pub use storing::{stored_by_default, Final};

/// A response stored by the layer, as a replay
/// gives it back.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct StoredHttpResponse {
    /// The status code.
    pub status: u16,
    /// The headers replayed, in order, with their raw values.
    pub headers: Vec<(String, Vec<u8>)>,
    /// The body.
    pub body: Vec<u8>,
}

/// Decodes an outcome's body stored by the HTTP layer; an error for bytes
/// the layer did not write (an outcome of record mode is JSON, which this
/// framing never reads as a response: its first byte is a version, `1` or
/// `2`).
pub fn decode_http_response(body: &[u8]) -> Result<StoredHttpResponse, crate::Error> {
    use crate::engine::Codec;
    let stored = stored::ResponseCodec.decode(body)?;
    Ok(StoredHttpResponse {
        status: stored.status.as_u16(),
        headers: stored
            .headers
            .iter()
            .map(|(name, value)| (name.as_str().to_owned(), value.as_bytes().to_vec()))
            .collect(),
        body: stored.body.to_vec(),
    })
}
