//! [`Idempotency`]: the service, and the flow of one request through it.

use std::collections::VecDeque;
use std::fmt;
use std::future::Future;
use std::pin::Pin;
use std::sync::Arc;
use std::task::{Context, Poll};
use std::time::Duration;

use ::http::header::{self, HeaderMap, HeaderName, HeaderValue};
use ::http::request::Parts;
use ::http::{Request, Response};
use bytes::{Buf, Bytes, BytesMut};
use http_body::Body;
use http_body_util::{BodyExt, LengthLimitError, Limited};
use tokio::time::Sleep;
use tower_service::Service;
use tracing::Instrument;

#[cfg(feature = "axum")]
use super::axum::MatchedPathRoute;
use super::body::ResponseBody;
use super::config::Config;
use super::fingerprint::PartDigests;
use super::future::ResponseFuture;
use super::key_header::{refusal, IdempotencyKey, KeyHeaderError, Unkeyed};
use super::principal::Principal;
use super::problem::{Problem, ProblemDetails};
#[cfg(feature = "axum")]
use super::route::MakeRoute;
use super::route::UNMATCHED;
use super::stored::{ResponseCodec, StoredResponse};
use super::storing::is_stored;
use super::unwind::{panic_message, CatchUnwind, Panic};
use crate::engine::Codec;
use crate::engine::{run, Call};
use crate::store::Store;
use idem_core::error::Error;
use idem_core::key::{Key, Scope};
use idem_core::record::OutcomeKind;

/// What a stored response's status and headers may take beside its body,
/// within the engine's limit on an outcome ([`Call::max_outcome`]).
const RESPONSE_HEAD_ROOM: usize = 64 * 1024;

/// The header that marks a replayed response.
pub(crate) const REPLAYED: HeaderName = HeaderName::from_static("idempotent-replayed");

type BoxError = Box<dyn std::error::Error + Send + Sync>;

/// A service made idempotent by [`IdempotencyLayer`](super::IdempotencyLayer):
/// see the [module documentation](super).
///
/// Its request and response types and its error type are the inner
/// service's. It needs a Tokio runtime: a claimed request runs on a task of
/// its own.
#[derive(Clone)]
#[cfg_attr(docsrs, doc(cfg(feature = "http")))]
pub struct Idempotency<S> {
    inner: S,
    store: Arc<dyn Store>,
    config: Arc<Config>,
}

impl<S> Idempotency<S> {
    pub(crate) fn from_parts(inner: S, store: Arc<dyn Store>, config: Arc<Config>) -> Self {
        Idempotency {
            inner,
            store,
            config,
        }
    }

    /// The inner service.
    pub fn get_ref(&self) -> &S {
        &self.inner
    }

    /// The inner service, mutably.
    pub fn get_mut(&mut self) -> &mut S {
        &mut self.inner
    }

    /// Unwraps the inner service.
    pub fn into_inner(self) -> S {
        self.inner
    }
}

impl<S: fmt::Debug> fmt::Debug for Idempotency<S> {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("Idempotency")
            .field("inner", &self.inner)
            .field("config", &self.config)
            .finish_non_exhaustive()
    }
}

impl<S, ReqBody, ResBody> Service<Request<ReqBody>> for Idempotency<S>
where
    S: Service<Request<ReqBody>, Response = Response<ResBody>> + Clone + Send + 'static,
    S::Future: Send + 'static,
    S::Error: Send + 'static,
    ReqBody: Body + From<Bytes> + Send + 'static,
    ReqBody::Data: Send,
    ReqBody::Error: Into<BoxError>,
    ResBody: Body + Send + 'static,
    ResBody::Data: Send,
    ResBody::Error: Into<BoxError>,
{
    type Response = Response<ResponseBody<ResBody>>;
    type Error = S::Error;
    type Future = ResponseFuture<ResBody, S::Error>;

    fn poll_ready(&mut self, cx: &mut Context<'_>) -> Poll<Result<(), Self::Error>> {
        self.inner.poll_ready(cx)
    }

    fn call(&mut self, mut request: Request<ReqBody>) -> Self::Future {
        if !self.config.methods.contains(request.method()) {
            request
                .extensions_mut()
                .insert(Unkeyed(self.config.header.clone()));
            return untouched(self.inner.call(request));
        }
        let key = match IdempotencyKey::from_headers_named(request.headers(), &self.config.header) {
            Ok(key) => key,
            Err(KeyHeaderError::Missing) if !self.config.require_key => {
                request
                    .extensions_mut()
                    .insert(Unkeyed(self.config.header.clone()));
                return untouched(self.inner.call(request));
            }
            Err(err) => {
                return answer(refusal(err, request.method(), &self.config.header).into());
            }
        };
        let (mut parts, body) = request.into_parts();
        let principal = match &self.config.principal {
            None => None,
            Some(make) => match make.make_principal(&parts) {
                Some(principal) => Some(principal),
                None => {
                    let detail = "this request has no principal to scope its idempotency key to: \
                                  it must be authenticated; it was not processed";
                    return answer(ProblemDetails::new(Problem::MissingPrincipal, detail).into());
                }
            },
        };
        let scope = scope(&self.config, &parts, principal.as_deref());
        // What the layer checked, for the handler's extractors.
        parts.extensions.insert(key.clone());
        if let Some(principal) = principal {
            parts.extensions.insert(Principal::new(principal));
        }
        let key = key.into_key();
        let request = Request::from_parts(parts, body);
        // The service polled ready is the one that must be called; leave a
        // fresh clone in its place.
        let clone = self.inner.clone();
        let inner = std::mem::replace(&mut self.inner, clone);
        ResponseFuture::new(handle(
            inner,
            self.store.clone(),
            self.config.clone(),
            scope,
            key,
            request,
        ))
    }
}

fn answer<B, E>(response: Response<ResponseBody<B>>) -> ResponseFuture<B, E>
where
    B: Send + 'static,
    E: Send + 'static,
{
    ResponseFuture::new(std::future::ready(Ok(response)))
}

/// The inner service's answer to a request the layer does not cover, its
/// body untouched.
fn untouched<F, B, E>(future: F) -> ResponseFuture<B, E>
where
    F: std::future::Future<Output = Result<Response<B>, E>> + Send + 'static,
    B: Send + 'static,
    E: Send + 'static,
{
    ResponseFuture::new(async move { Ok(future.await?.map(ResponseBody::inner)) })
}

/// Buffers the body, then runs the request through the engine on a task of
/// its own, so that a client going away neither abandons a claim nor loses
/// an outcome: the task runs to the end and stores it for the retry.
async fn handle<S, ReqBody, ResBody>(
    inner: S,
    store: Arc<dyn Store>,
    config: Arc<Config>,
    scope: Scope,
    key: Key,
    request: Request<ReqBody>,
) -> Result<Response<ResponseBody<ResBody>>, S::Error>
where
    S: Service<Request<ReqBody>, Response = Response<ResBody>> + Send + 'static,
    S::Future: Send + 'static,
    S::Error: Send + 'static,
    ReqBody: Body + From<Bytes> + Send + 'static,
    ReqBody::Error: Into<BoxError>,
    ResBody: Body + Send + 'static,
    ResBody::Data: Send,
    ResBody::Error: Into<BoxError>,
{
    let (parts, body) = request.into_parts();
    let body = match Limited::new(body, config.body_limit).collect().await {
        Ok(collected) => collected.to_bytes(),
        Err(err) if err.downcast_ref::<LengthLimitError>().is_some() => {
            let detail = format!(
                "the request body is over the limit of {} bytes; nothing was stored",
                config.body_limit
            );
            return Ok(ProblemDetails::new(Problem::ContentTooLarge, detail).into());
        }
        Err(err) => {
            let detail = format!("the request body could not be read: {err}");
            return Ok(ProblemDetails::new(Problem::UnreadableBody, detail).into());
        }
    };
    // A response the layer keeps is at most `max_stored_body` of body,
    // framed with its head: the engine's limit on an outcome follows the
    // layer's, so that raising one raises the other.
    let (fingerprint, digests) = config.fingerprint.of_with_parts(&parts, &body);
    let record = (scope.clone(), key.clone());
    let call = Call::from_parts(scope, Ok(key), Ok(fingerprint), config.policy).max_outcome(
        config
            .max_stored_body
            .saturating_add(RESPONSE_HEAD_ROOM)
            .max(Call::DEFAULT_MAX_OUTCOME),
    );
    let request = Request::from_parts(parts, ReqBody::from(body));
    let task = tokio::spawn(
        execute(inner, store, config, call, request, digests, record)
            .instrument(tracing::Span::current()),
    );
    let ran = match task.await {
        Ok(ran) => ran,
        Err(join) if join.is_panic() => std::panic::resume_unwind(join.into_panic()),
        Err(_) => {
            return Ok(ProblemDetails::new(
                Problem::Internal,
                "the request's task was cancelled (the runtime is shutting down)",
            )
            .into())
        }
    };
    respond(ran)
}

/// The operation of a request: method and route, narrowed to the principal
/// if the layer found one. (A layer with a principal extractor that finds
/// none refuses the request before, rather than give it a scope wider than
/// its principal's.) A route that is not a template labels the scope's
/// metrics with a template, or `METHOD (unmatched)`.
fn scope(config: &Config, parts: &Parts, principal: Option<&str>) -> Scope {
    let route = route(config, parts);
    let scope = Scope::new(format!("{} {}", parts.method, route.name));
    let scope = match route.label {
        None => scope,
        Some(label) => scope.with_metric_label(&format!("{} {label}", parts.method)),
    };
    match principal {
        None => scope,
        Some(principal) => scope.with_principal(principal),
    }
}

/// The route of a request, and the label of its metrics when the route is
/// not one of the application's templates.
struct Route {
    name: String,
    label: Option<String>,
}

/// The route of a request: the layer's [`MakeRoute`], then (with the
/// `axum` feature) axum's `MatchedPath`, then the path
/// ([`RequestPath`](super::route::RequestPath)). A route from a
/// `MakeRoute` that is not a template, or the path, is labelled by axum's
/// template if any, else [`UNMATCHED`].
fn route(config: &Config, parts: &Parts) -> Route {
    #[cfg(feature = "axum")]
    let template = || MatchedPathRoute.make_route(parts);
    #[cfg(not(feature = "axum"))]
    let template = || None::<String>;
    let untemplated = |name: String| Route {
        name,
        label: Some(template().unwrap_or_else(|| UNMATCHED.to_owned())),
    };
    if let Some(make) = &config.route {
        if let Some(name) = make.make_route(parts) {
            return match make.is_template() {
                true => Route { name, label: None },
                false => untemplated(name),
            };
        }
    }
    match template() {
        Some(name) => Route { name, label: None },
        None => untemplated(parts.uri.path().to_owned()),
    }
}

/// Why the engine's body did not hand back a response to store.
enum Failure<B, E> {
    /// The engine answered instead of the body (key reused, in progress,
    /// store trouble).
    Idem(Error),
    /// The response is not to be stored (a 5xx, a refused request, by
    /// default): the key is released and the response still goes to the
    /// client, as it streams.
    NotStored(Response<ResponseBody<B>>),
    /// The inner service failed.
    Inner(E),
    /// The inner service panicked.
    Panicked(Panic),
    /// The layer's answer to an error of the engine, with a detail of its
    /// own (what differed from the key's first request).
    Answered(ProblemDetails),
}

impl<B, E> From<Error> for Failure<B, E> {
    fn from(err: Error) -> Self {
        Failure::Idem(err)
    }
}

/// What the request's task hands back.
struct Ran<B, E> {
    result: Result<StoredResponse, Failure<B, E>>,
    /// The response as the inner service gave it, when it ran here and its
    /// response was to be stored: whole when it was, streamed when what is
    /// stored is the [`Problem::NotReplayable`] answer. `None` with an `Ok`
    /// result: a replay.
    executed: Option<Response<ResponseBody<B>>>,
}

/// How much of a response body the layer read before its head is sent.
enum Read {
    /// All of it, within the limit.
    Whole(Bytes),
    /// The body failed or panicked.
    Failed(BoxError),
    /// Not all of it: the part read so far, sent first. Why it is not
    /// kept for a replay.
    Streamed(VecDeque<Bytes>, String),
}

/// Reads `body` until its end, until it goes past `limit`, or until
/// `wait` has passed since the body was first found with no frame ready.
///
/// The timer is armed only then: a body that is whole when the handler
/// answers (axum's `Json`, a `String`) is read without one.
async fn read_up_to<B>(body: &mut Pin<Box<B>>, limit: usize, wait: Duration) -> Read
where
    B: Body,
    B::Error: Into<BoxError>,
{
    let mut prefix = VecDeque::new();
    let mut read = 0usize;
    let mut timer: Option<Pin<Box<Sleep>>> = None;
    loop {
        if read > limit {
            let why = format!("its body was over the {limit} bytes kept for a replay");
            return Read::Streamed(prefix, why);
        }
        let mut next = CatchUnwind::new(body.frame());
        let polled = std::future::poll_fn(|cx| {
            if let Poll::Ready(polled) = Pin::new(&mut next).poll(cx) {
                return Poll::Ready(Some(polled));
            }
            let timer = timer.get_or_insert_with(|| Box::pin(tokio::time::sleep(wait)));
            timer.as_mut().poll(cx).map(|()| None)
        })
        .await;
        let Some(polled) = polled else {
            let why = format!("its body was still being produced {wait:?} after it first paused");
            return Read::Streamed(prefix, why);
        };
        let frame = match polled {
            Ok(None) => break,
            Ok(Some(Ok(frame))) => frame,
            Ok(Some(Err(err))) => return Read::Failed(err.into()),
            Err(panic) => return Read::Failed(panic_message(&panic).into()),
        };
        // Trailers are not kept, as no header of a transfer is.
        if let Ok(mut data) = frame.into_data() {
            read = read.saturating_add(data.remaining());
            prefix.push_back(data.copy_to_bytes(data.remaining()));
        }
    }
    Read::Whole(match prefix.len() {
        0 => Bytes::new(),
        1 => prefix.pop_front().unwrap_or_default(),
        _ => {
            let mut whole = BytesMut::with_capacity(read);
            prefix
                .iter()
                .for_each(|chunk| whole.extend_from_slice(chunk));
            whole.freeze()
        }
    })
}

/// Whether `headers` name one of `types` as the response's media type.
fn is_stream(headers: &HeaderMap, types: &[String]) -> Option<String> {
    let value = headers.get(header::CONTENT_TYPE)?.to_str().ok()?;
    let essence = value.split(';').next()?.trim().to_ascii_lowercase();
    types.contains(&essence).then_some(essence)
}

async fn execute<S, ReqBody, ResBody>(
    inner: S,
    store: Arc<dyn Store>,
    config: Arc<Config>,
    call: Call,
    request: Request<ReqBody>,
    digests: PartDigests,
    (scope, key): (Scope, Key),
) -> Ran<ResBody, S::Error>
where
    S: Service<Request<ReqBody>, Response = Response<ResBody>>,
    ResBody: Body,
    ResBody::Error: Into<BoxError>,
{
    let mut executed = None;
    let body = async {
        let mut inner = inner;
        let called = CatchUnwind::new(async move { inner.call(request).await }).await;
        let response = match called {
            Ok(Ok(response)) => response,
            Ok(Err(err)) => return Err(Failure::Inner(err)),
            Err(panic) => return Err(Failure::Panicked(panic)),
        };
        // Known from the head: whether the handler's answer is final.
        let storable = is_stored(&response, &*config.store_status);
        let (parts, body) = response.into_parts();
        // Boxed, so that the part read before the head is sent can be
        // followed by the rest.
        let mut body = Box::pin(body);
        if !storable {
            // Released, then streamed: nothing of it is kept.
            let streamed = ResponseBody::streamed(VecDeque::new(), body);
            return Err(Failure::NotStored(Response::from_parts(parts, streamed)));
        }
        let limit = config.max_stored_body;
        let read = if let Some(media_type) = is_stream(&parts.headers, &config.stream_media_types) {
            Read::Streamed(VecDeque::new(), format!("it is a stream ({media_type})"))
        } else if body.size_hint().lower() > limit as u64 {
            let why = format!("its body was over the {limit} bytes kept for a replay");
            Read::Streamed(VecDeque::new(), why)
        } else {
            read_up_to(&mut body, limit, config.max_stored_body_wait).await
        };
        let response = match read {
            Read::Whole(bytes) => Response::from_parts(parts, bytes),
            // The handler answered, with a status to store, so its work is
            // done: a retry must not run it again, and gets this answer.
            Read::Failed(err) => {
                tracing::error!(
                    error = %err,
                    "the response body failed after the handler answered; \
                     the key answers 500 from now on"
                );
                body_failed(&err).into()
            }
            // The head goes out once this answer is stored: a duplicate
            // meanwhile waits for it, and never runs the request again.
            Read::Streamed(prefix, why) => {
                tracing::debug!(
                    why,
                    "the response is sent as it streams; the key answers NotReplayable"
                );
                let answer: Response<Bytes> = not_replayable(&why).into();
                let (head, body_of_answer) = answer.into_parts();
                let mut stored =
                    StoredResponse::new(head.status, &head.headers, body_of_answer, &REPLAYED);
                stored.request = digests.clone();
                let streamed = ResponseBody::streamed(prefix, body);
                executed = Some(Response::from_parts(parts, streamed));
                return Ok(stored);
            }
        };
        let mut stored = StoredResponse::new(
            response.status(),
            response.headers(),
            response.body().clone(),
            &REPLAYED,
        );
        stored.request = digests.clone();
        executed = Some(response.map(ResponseBody::from));
        Ok(stored)
    };
    let mut result = run(&*store, call.with_codec(ResponseCodec), body).await;
    if let Err(Failure::Idem(Error::KeyReused)) = &result {
        if let Some(detail) = what_differed(&*store, &scope, &key, &digests).await {
            result = Err(Failure::Answered(ProblemDetails::new(
                Problem::KeyReused,
                detail,
            )));
        }
    }
    Ran { result, executed }
}

/// The 422's detail naming what differs from the request whose response
/// is stored under the key, when it is stored with its part digests;
/// `None` otherwise (the key's request still runs, a response stored
/// before the digests were kept, the store failed to answer).
async fn what_differed(
    store: &dyn Store,
    scope: &Scope,
    key: &Key,
    digests: &PartDigests,
) -> Option<String> {
    let record = store.get(scope, key).await.ok()??;
    let outcome = record.outcome.filter(|o| o.kind == OutcomeKind::Ok)?;
    let stored = ResponseCodec.decode(&outcome.body).ok()?;
    let differences = digests.differences(&stored.request)?;
    Some(format!(
        "this idempotency key was already used with a different request: {differences}; \
         send the first request again to get its answer, or use a new key"
    ))
}

/// Turns what the task did into the response (or error) for the client.
fn respond<B, E>(ran: Ran<B, E>) -> Result<Response<ResponseBody<B>>, E> {
    match (ran.result, ran.executed) {
        (Ok(_), Some(executed)) => Ok(executed),
        (Ok(stored), None) => Ok(replay(stored)),
        (Err(Failure::NotStored(response)), _) => Ok(response),
        (Err(Failure::Inner(err)), _) => Err(err),
        (Err(Failure::Panicked(panic)), _) => std::panic::resume_unwind(panic),
        (Err(Failure::Idem(err)), None) => Ok(ProblemDetails::from(&err).into()),
        (Err(Failure::Answered(details)), _) => Ok(details.into()),
        // The request ran, but its response could not be stored (the store
        // failed, or the lease was lost): the client still gets it. A retry
        // runs the request again once the claim's lease has passed.
        (Err(Failure::Idem(err)), Some(executed)) => {
            tracing::warn!(error = %err, "the response was sent but not stored");
            Ok(executed)
        }
    }
}

/// The answer stored for a key whose response was streamed, not kept:
/// `why` it was not.
fn not_replayable(why: &str) -> ProblemDetails {
    ProblemDetails::new(
        Problem::NotReplayable,
        format_args!(
            "the request with this idempotency key was processed, but its response was not \
             kept, as {why}: it was sent as it streamed, and cannot be sent again; the \
             request is not run again for this key"
        ),
    )
}

/// The answer, stored for the key, to a request whose response body
/// failed (or panicked) while it was buffered.
fn body_failed(err: &BoxError) -> ProblemDetails {
    ProblemDetails::new(
        Problem::Internal,
        format_args!(
            "the response body failed while it was buffered: {err}; the request was \
             processed, and is not run again for this key"
        ),
    )
}

/// The stored response, marked as a replay.
fn replay<B>(stored: StoredResponse) -> Response<ResponseBody<B>> {
    let mut response = Response::new(ResponseBody::from(stored.body));
    *response.status_mut() = stored.status;
    *response.headers_mut() = stored.headers;
    response
        .headers_mut()
        .insert(REPLAYED, HeaderValue::from_static("true"));
    response
}

#[cfg(test)]
mod tests {
    use std::sync::atomic::{AtomicUsize, Ordering};
    use std::time::Duration;

    use http_body_util::Full;
    use tower::{service_fn, Layer, ServiceExt};

    use super::*;
    use crate::http::IdempotencyLayer;
    use crate::store::MemoryStore;

    type Req = Request<Full<Bytes>>;

    fn post(key: &str) -> Req {
        Request::post("/jobs")
            .header("idempotency-key", key)
            .body(Full::from("job"))
            .unwrap()
    }

    #[derive(Debug, PartialEq)]
    struct Refused;

    /// The inner service fails on its first call, then answers its call
    /// count: the failure must have released the key.
    #[tokio::test]
    async fn inner_error_kept_and_key_released() {
        let calls = Arc::new(AtomicUsize::new(0));
        let counted = calls.clone();
        let svc = IdempotencyLayer::new(MemoryStore::new()).layer(service_fn(move |_: Req| {
            let n = counted.fetch_add(1, Ordering::SeqCst) + 1;
            async move {
                if n == 1 {
                    Err(Refused)
                } else {
                    Ok(Response::new(Full::<Bytes>::from(n.to_string())))
                }
            }
        }));
        assert_eq!(svc.clone().oneshot(post("k")).await.unwrap_err(), Refused);
        let second = svc.clone().oneshot(post("k")).await.unwrap();
        assert!(second.headers().get(&REPLAYED).is_none());
        let third = svc.clone().oneshot(post("k")).await.unwrap();
        assert_eq!(third.headers()[&REPLAYED], "true");
        let body = third.into_body().collect().await.unwrap().to_bytes();
        assert_eq!(body, "2");
        assert_eq!(calls.load(Ordering::SeqCst), 2);
    }

    #[tokio::test]
    async fn optional_key_passes_through() {
        let calls = Arc::new(AtomicUsize::new(0));
        let counted = calls.clone();
        let svc = IdempotencyLayer::new(MemoryStore::new())
            .require_key(false)
            .layer(service_fn(move |_: Req| {
                counted.fetch_add(1, Ordering::SeqCst);
                async { Ok::<_, Refused>(Response::new(Full::<Bytes>::from("ok"))) }
            }));
        let bare = || Request::post("/jobs").body(Full::from("job")).unwrap();
        for _ in 0..2 {
            let response = svc.clone().oneshot(bare()).await.unwrap();
            assert!(response.headers().get(&REPLAYED).is_none());
        }
        assert_eq!(calls.load(Ordering::SeqCst), 2);
        // A malformed key is still refused.
        let bad = svc.clone().oneshot(post("\"open")).await.unwrap();
        assert_eq!(bad.status(), 400);
    }

    /// A body whose chunks are all ready when it is first polled is read
    /// without a timer: on a runtime built without one, where arming a
    /// timer panics.
    #[test]
    fn a_body_ready_at_once_arms_no_timer() {
        let runtime = tokio::runtime::Builder::new_current_thread()
            .build()
            .unwrap();
        let chunks: Vec<Result<http_body::Frame<Bytes>, std::io::Error>> = vec![
            Ok(http_body::Frame::data(Bytes::from_static(b"who"))),
            Ok(http_body::Frame::data(Bytes::from_static(b"le"))),
        ];
        let read = runtime.block_on(async {
            let mut one = Box::pin(Full::<Bytes>::from("whole"));
            let one = read_up_to(&mut one, 1024, Duration::from_secs(1)).await;
            let stream = http_body_util::StreamBody::new(futures::stream::iter(chunks));
            let two = read_up_to(&mut Box::pin(stream), 1024, Duration::ZERO).await;
            [one, two]
        });
        for read in read {
            assert!(matches!(read, Read::Whole(ref body) if body == "whole"));
        }
    }

    #[tokio::test]
    async fn invalid_policy_is_a_500() {
        let svc = IdempotencyLayer::new(MemoryStore::new())
            .ttl(Duration::ZERO)
            .layer(service_fn(|_: Req| async {
                Ok::<_, Refused>(Response::new(Full::<Bytes>::from("ok")))
            }));
        let response = svc.oneshot(post("k")).await.unwrap();
        assert_eq!(response.status(), 500);
    }
}
