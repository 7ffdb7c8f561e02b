//! The layer's own answers, as RFC 9457 `application/problem+json`.

use std::fmt;
use std::time::Duration;

use ::http::header::{self, HeaderValue};
use ::http::{Response, StatusCode};
use bytes::Bytes;

/// The base of every problem type URI: the documentation of [`Problem`].
const TYPE_BASE: &str = "https://docs.rs/idem/latest/idem/http/enum.Problem.html#variant.";

/// Every answer the [`IdempotencyLayer`](super::IdempotencyLayer) gives on
/// its own instead of the inner service's. Each is sent as an RFC 9457
/// `application/problem+json` document with the members `type` (this
/// variant's [`type_uri`](Problem::type_uri)), `title`, `status` and
/// `detail`. See the [module documentation](super) for when each is sent.
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
    /// 500: the layer itself failed (an invalid policy, a stored response
    /// that cannot be read, a response body that failed while buffered).
    Internal,
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
            Problem::Internal => StatusCode::INTERNAL_SERVER_ERROR,
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
            Problem::Internal => "Idempotency layer failure",
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
            Problem::Internal => "Internal",
        }
    }

    /// The URI sent as `type`: this variant's documentation, for example
    /// `https://docs.rs/idem/latest/idem/http/enum.Problem.html#variant.KeyReused`.
    pub fn type_uri(self) -> String {
        format!("{TYPE_BASE}{}", self.slug())
    }

    /// The response: status, `Content-Type: application/problem+json`,
    /// `Retry-After` in whole seconds (at least 1) when given, and the JSON
    /// document.
    pub(crate) fn response<B: From<Bytes>>(
        self,
        detail: impl fmt::Display,
        retry_after: Option<Duration>,
    ) -> Response<B> {
        // Members in the RFC's order, which a struct keeps and a map sorts.
        #[derive(serde::Serialize)]
        struct Document<'a> {
            r#type: String,
            title: &'a str,
            status: u16,
            detail: String,
        }
        let document = Document {
            r#type: self.type_uri(),
            title: self.title(),
            status: self.status().as_u16(),
            detail: detail.to_string(),
        };
        // Serializing strings and a number cannot fail.
        let json = serde_json::to_vec(&document).unwrap_or_default();
        let mut response = Response::new(B::from(Bytes::from(json)));
        *response.status_mut() = self.status();
        let headers = response.headers_mut();
        headers.insert(
            header::CONTENT_TYPE,
            HeaderValue::from_static("application/problem+json"),
        );
        if let Some(after) = retry_after {
            let secs = after.as_secs() + u64::from(after.subsec_nanos() > 0);
            headers.insert(header::RETRY_AFTER, HeaderValue::from(secs.max(1)));
        }
        response
    }
}

impl fmt::Display for Problem {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "{} {}", self.status().as_u16(), self.title())
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn document_and_headers() {
        let response: Response<Bytes> = Problem::InProgress.response(
            "a request with this key is still running",
            Some(Duration::from_millis(1500)),
        );
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
        let plain: Response<Bytes> = Problem::KeyReused.response("x", None);
        assert!(plain.headers().get(header::RETRY_AFTER).is_none());
        let zero: Response<Bytes> = Problem::StoreUnavailable.response("x", Some(Duration::ZERO));
        assert_eq!(zero.headers()[header::RETRY_AFTER], "1");
    }
}
