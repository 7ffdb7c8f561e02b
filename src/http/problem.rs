//! The layer's own answers, as RFC 9457 `application/problem+json`: which
//! [`Problem`] it is, and the [`ProblemDetails`] document sent for it.

use std::fmt;
use std::time::Duration;

use ::http::header::{self, HeaderValue};
use ::http::{Response, StatusCode};
use bytes::Bytes;

use idem_core::error::Error;

/// The base of every problem type URI: the documentation of [`Problem`].
const TYPE_BASE: &str = "https://docs.rs/idem/latest/idem/http/enum.Problem.html#variant.";

/// Every answer the [`IdempotencyLayer`](super::IdempotencyLayer) gives on
/// its own instead of the inner service's. Each is sent as an RFC 9457
/// `application/problem+json` document ([`ProblemDetails`]) with the
/// members `type` (this variant's [`type_uri`](Problem::type_uri)),
/// `title`, `status` and `detail`. See the [module documentation](super)
/// for when each is sent.
///
/// `Problem::from(&error)` names the answer to an [`idem::Error`](Error) as
/// the layer gives it; [`ProblemDetails::from`] builds the whole answer.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
#[non_exhaustive]
pub enum Problem {
    /// 400: the method requires a key and the request has none.
    MissingKey,
    /// 400: the key header is malformed: repeated, empty, over 255 bytes,
    /// not visible ASCII, or not a valid Structured Field String.
    InvalidKey,
    /// 401: the layer scopes keys to a principal
    /// ([`MakePrincipal`](super::MakePrincipal)) and the request has none:
    /// it was not authenticated. The request is neither run nor stored.
    /// No `WWW-Authenticate` challenge is sent, as the layer does not know
    /// the authentication scheme: the authentication in front of the layer
    /// should refuse such requests first, with its own challenge.
    MissingPrincipal,
    /// 400: the request body could not be read (the client went away or
    /// sent a broken body).
    UnreadableBody,
    /// 413: the request body is over the layer's body limit; nothing is
    /// stored.
    ContentTooLarge,
    /// 422: the key was used before with another request (method, path,
    /// query, body or fingerprinted headers).
    KeyReused,
    /// 409 with `Retry-After`: a request with this key is still running and
    /// the wait bound passed (or the layer fails fast).
    InProgress,
    /// 503 with `Retry-After`: the store could not be reached; the request
    /// was not executed.
    StoreUnavailable,
    /// 502: a durable step of the operation is in doubt and its policy is
    /// to refuse ([`Error::OutcomeUnknown`]): an earlier attempt started a
    /// call to another system and its answer was lost, so whether its
    /// effect happened is unknown. Every retry gets this answer, and runs
    /// nothing, until an operator resolves the step
    /// ([`steps::resolve`](crate::steps::resolve)); it is never stored.
    OutcomeUnknown,
    /// 500: the layer itself failed (an invalid policy, a stored response
    /// that cannot be read, a response body that failed while buffered).
    Internal,
    /// 410: the request with this key was processed, but its response was
    /// not kept, so it cannot be sent again: it was streamed to the first
    /// client (a streaming media type such as `text/event-stream`, or a
    /// body over [`max_stored_body`](super::IdempotencyLayer::max_stored_body)),
    /// or the store could not hold it ([`Error::Unrecorded`]). Every
    /// retry with the key gets this answer, marked `Idempotent-Replayed:
    /// true`, and runs nothing; a new key runs the request again.
    ///
    /// 410 because the answer is final and the same for every retry: the
    /// response the key stands for is gone for good. A 4xx ends a client's
    /// automatic retries, which a 5xx invites, and neither 409 (the
    /// draft's "in progress, retry later") nor 422 (the key reused with
    /// another request) is true of it.
    NotReplayable,
}

impl Problem {
    /// The HTTP status sent with this problem.
    pub fn status(self) -> StatusCode {
        match self {
            Problem::MissingKey | Problem::InvalidKey | Problem::UnreadableBody => {
                StatusCode::BAD_REQUEST
            }
            Problem::MissingPrincipal => StatusCode::UNAUTHORIZED,
            Problem::ContentTooLarge => StatusCode::PAYLOAD_TOO_LARGE,
            Problem::KeyReused => StatusCode::UNPROCESSABLE_ENTITY,
            Problem::InProgress => StatusCode::CONFLICT,
            Problem::StoreUnavailable => StatusCode::SERVICE_UNAVAILABLE,
            Problem::OutcomeUnknown => StatusCode::BAD_GATEWAY,
            Problem::Internal => StatusCode::INTERNAL_SERVER_ERROR,
            Problem::NotReplayable => StatusCode::GONE,
        }
    }

    /// The short, fixed summary sent as `title`.
    pub fn title(self) -> &'static str {
        match self {
            Problem::MissingKey => "Idempotency key missing",
            Problem::InvalidKey => "Idempotency key malformed",
            Problem::MissingPrincipal => "Authentication required",
            Problem::UnreadableBody => "Request body unreadable",
            Problem::ContentTooLarge => "Request body too large",
            Problem::KeyReused => "Idempotency key reused",
            Problem::InProgress => "Request in progress",
            Problem::StoreUnavailable => "Idempotency store unavailable",
            Problem::OutcomeUnknown => "Outcome of a downstream call unknown",
            Problem::Internal => "Idempotency layer failure",
            Problem::NotReplayable => "Response not replayable",
        }
    }

    fn slug(self) -> &'static str {
        match self {
            Problem::MissingKey => "MissingKey",
            Problem::InvalidKey => "InvalidKey",
            Problem::MissingPrincipal => "MissingPrincipal",
            Problem::UnreadableBody => "UnreadableBody",
            Problem::ContentTooLarge => "ContentTooLarge",
            Problem::KeyReused => "KeyReused",
            Problem::InProgress => "InProgress",
            Problem::StoreUnavailable => "StoreUnavailable",
            Problem::OutcomeUnknown => "OutcomeUnknown",
            Problem::Internal => "Internal",
            Problem::NotReplayable => "NotReplayable",
        }
    }

    /// The URI sent as `type`: this variant's documentation, for example
    /// `https://docs.rs/idem/latest/idem/http/enum.Problem.html#variant.KeyReused`.
    pub fn type_uri(self) -> String {
        format!("{TYPE_BASE}{}", self.slug())
    }
}

impl fmt::Display for Problem {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "{} {}", self.status().as_u16(), self.title())
    }
}

impl From<&Error> for Problem {
    /// The layer's answer to an error of the engine:
    ///
    /// | error | problem |
    /// |---|---|
    /// | [`KeyReused`](Error::KeyReused) | [`KeyReused`](Problem::KeyReused), 422 |
    /// | [`InProgress`](Error::InProgress) | [`InProgress`](Problem::InProgress), 409 |
    /// | [`Store`](Error::Store) | [`StoreUnavailable`](Problem::StoreUnavailable), 503 |
    /// | [`MissingKey`](Error::MissingKey) | [`MissingKey`](Problem::MissingKey), 400 |
    /// | [`InvalidKey`](Error::InvalidKey) | [`InvalidKey`](Problem::InvalidKey), 400 |
    /// | [`OutcomeUnknown`](Error::OutcomeUnknown) | [`OutcomeUnknown`](Problem::OutcomeUnknown), 502 |
    /// | [`Unrecorded`](Error::Unrecorded) | [`NotReplayable`](Problem::NotReplayable), 410 |
    /// | any other | [`Internal`](Problem::Internal), 500 |
    fn from(err: &Error) -> Self {
        match err {
            Error::KeyReused => Problem::KeyReused,
            Error::InProgress { .. } => Problem::InProgress,
            Error::Store(_) => Problem::StoreUnavailable,
            Error::MissingKey => Problem::MissingKey,
            Error::InvalidKey(_) => Problem::InvalidKey,
            Error::OutcomeUnknown { .. } => Problem::OutcomeUnknown,
            Error::Unrecorded(_) => Problem::NotReplayable,
            _ => Problem::Internal,
        }
    }
}

/// The `Retry-After` sent with [`Problem::StoreUnavailable`].
const STORE_RETRY_AFTER: Duration = Duration::from_secs(1);

/// One answer of the layer as it goes on the wire: a [`Problem`], the
/// `detail` that explains this occurrence of it, and, for 409 and 503, how
/// long the client should wait before it retries.
///
/// It converts into an `http::Response` whose body type is built from
/// `Bytes` (`Response::from(details)`, for a plain tower service) and, with
/// the `axum` feature, is an axum `IntoResponse`. The response has the
/// problem's status, `Content-Type: application/problem+json`,
/// `Retry-After` in whole seconds (rounded up, at least 1) when set, and
/// the JSON document `{"type", "title", "status", "detail"}`, members in
/// that order.
///
/// A handler that calls the engine itself (`#[idempotent]`,
/// [`run`](crate::engine::run)) answers its errors as the layer does with
/// `ProblemDetails::from(&error)`:
///
/// ```
/// use idem::http::{Problem, ProblemDetails};
///
/// let answer = ProblemDetails::from(&idem::Error::KeyReused);
/// assert_eq!(answer.problem(), Problem::KeyReused);
/// let response: http::Response<bytes::Bytes> = answer.into();
/// assert_eq!(response.status(), 422);
/// assert_eq!(response.headers()["content-type"], "application/problem+json");
/// ```
#[derive(Clone, Debug, PartialEq, Eq)]
#[cfg_attr(docsrs, doc(cfg(feature = "http")))]
pub struct ProblemDetails {
    problem: Problem,
    detail: String,
    retry_after: Option<Duration>,
}

impl ProblemDetails {
    /// The answer `problem`, explained by `detail`, without `Retry-After`.
    pub fn new(problem: Problem, detail: impl fmt::Display) -> Self {
        ProblemDetails {
            problem,
            detail: detail.to_string(),
            retry_after: None,
        }
    }

    /// Sends `Retry-After` with the answer: `after` in whole seconds,
    /// rounded up, at least 1.
    pub fn with_retry_after(mut self, after: Duration) -> Self {
        self.retry_after = Some(after);
        self
    }

    /// Which answer this is.
    pub fn problem(&self) -> Problem {
        self.problem
    }

    /// The `detail` member: what went wrong with this request.
    pub fn detail(&self) -> &str {
        &self.detail
    }

    /// The wait sent as `Retry-After`, if any.
    pub fn retry_after(&self) -> Option<Duration> {
        self.retry_after
    }
}

impl From<&Error> for ProblemDetails {
    /// The layer's answer to an error of the engine: the [`Problem`] that
    /// [`Problem::from`] names, the layer's detail, and `Retry-After` with
    /// 409 (the error's hint) and 503 (one second).
    ///
    /// The layer answers a store error only when the request did not run
    /// (a request that ran gets its own response), so the 503's detail
    /// says that the request was not processed.
    fn from(err: &Error) -> Self {
        let problem = Problem::from(err);
        match err {
            Error::KeyReused => ProblemDetails::new(
                problem,
                "this idempotency key was already used with a different request \
                 (method, path, query, body or fingerprinted headers)",
            ),
            Error::InProgress { retry_after } => ProblemDetails::new(
                problem,
                "a request with this idempotency key is still being processed",
            )
            .with_retry_after(*retry_after),
            Error::Store(source) => ProblemDetails::new(
                problem,
                format_args!(
                    "the idempotency store could not be reached, so the request was not \
                     processed: {source}"
                ),
            )
            .with_retry_after(STORE_RETRY_AFTER),
            other => ProblemDetails::new(problem, other),
        }
    }
}

impl fmt::Display for ProblemDetails {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "{}: {}", self.problem, self.detail)
    }
}

impl<B: From<Bytes>> From<ProblemDetails> for Response<B> {
    fn from(details: ProblemDetails) -> Self {
        // Members in the RFC's order, which a struct keeps and a map sorts.
        #[derive(serde::Serialize)]
        struct Document<'a> {
            r#type: String,
            title: &'a str,
            status: u16,
            detail: &'a str,
        }
        let problem = details.problem;
        let document = Document {
            r#type: problem.type_uri(),
            title: problem.title(),
            status: problem.status().as_u16(),
            detail: &details.detail,
        };
        // Serializing strings and a number cannot fail.
        let json = serde_json::to_vec(&document).unwrap_or_default();
        let mut response = Response::new(B::from(Bytes::from(json)));
        *response.status_mut() = problem.status();
        let headers = response.headers_mut();
        headers.insert(
            header::CONTENT_TYPE,
            HeaderValue::from_static("application/problem+json"),
        );
        if let Some(after) = details.retry_after {
            let secs = after.as_secs() + u64::from(after.subsec_nanos() > 0);
            headers.insert(header::RETRY_AFTER, HeaderValue::from(secs.max(1)));
        }
        response
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn document_and_headers() {
        let details = ProblemDetails::new(
            Problem::InProgress,
            "a request with this key is still running",
        )
        .with_retry_after(Duration::from_millis(1500));
        let response: Response<Bytes> = details.into();
        assert_eq!(response.status(), StatusCode::CONFLICT);
        assert_eq!(
            response.headers()[header::CONTENT_TYPE],
            "application/problem+json"
        );
        assert_eq!(response.headers()[header::RETRY_AFTER], "2");
        assert!(response.body().starts_with(br#"{"type":"#));
        let doc: serde_json::Value = serde_json::from_slice(response.body()).unwrap();
        assert_eq!(
            doc,
            serde_json::json!({
                "type": "https://docs.rs/idem/latest/idem/http/enum.Problem.html#variant.InProgress",
                "title": "Request in progress",
                "status": 409,
                "detail": "a request with this key is still running",
            })
        );
        let plain: Response<Bytes> = ProblemDetails::new(Problem::KeyReused, "x").into();
        assert!(plain.headers().get(header::RETRY_AFTER).is_none());
        let zero: Response<Bytes> = ProblemDetails::new(Problem::StoreUnavailable, "x")
            .with_retry_after(Duration::ZERO)
            .into();
        assert_eq!(zero.headers()[header::RETRY_AFTER], "1");
    }

    #[test]
    fn engine_errors_are_answered_as_the_layer_answers_them() {
        let cases = [
            (Error::KeyReused, Problem::KeyReused, None),
            (
                Error::InProgress {
                    retry_after: Duration::from_millis(2500),
                },
                Problem::InProgress,
                Some(Duration::from_millis(2500)),
            ),
            (
                Error::store("connection refused"),
                Problem::StoreUnavailable,
                Some(STORE_RETRY_AFTER),
            ),
            (Error::MissingKey, Problem::MissingKey, None),
            (
                Error::InvalidKey(idem_core::key::KeyError::Empty),
                Problem::InvalidKey,
                None,
            ),
            (Error::LeaseLost, Problem::Internal, None),
            (
                Error::OutcomeUnknown {
                    step: "charge".into(),
                    seq: 0,
                    step_key: "k".into(),
                },
                Problem::OutcomeUnknown,
                None,
            ),
            (
                Error::StepMismatch {
                    seq: 1,
                    journaled: "a".into(),
                    called: "b".into(),
                },
                Problem::Internal,
                None,
            ),
            (Error::Config("ttl is zero".into()), Problem::Internal, None),
            (
                Error::Unrecorded("a float is not finite".into()),
                Problem::NotReplayable,
                None,
            ),
        ];
        for (err, problem, retry_after) in cases {
            assert_eq!(Problem::from(&err), problem, "{err}");
            let details = ProblemDetails::from(&err);
            assert_eq!(details.problem(), problem, "{err}");
            assert_eq!(details.retry_after(), retry_after, "{err}");
            assert!(!details.detail().is_empty(), "{err}");
        }
        let store = ProblemDetails::from(&Error::store("connection refused"));
        assert!(store
            .detail()
            .ends_with("not processed: connection refused"));
    }
}
