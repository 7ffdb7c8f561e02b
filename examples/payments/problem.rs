//! The app's own errors, as RFC 9457 `application/problem+json` documents
//! like the idempotency layer's (which answer a missing or malformed key,
//! a key reused with another body, a request still in progress, and a
//! store that cannot be reached: see `idem::http::Problem`).
//!
//! This app's problem types end in: `#invalid-request` (400),
//! `#card-declined` (402, with the declined `payment`), `#not-found`
//! (404), `#unsupported-media-type` (415), `#gateway-unavailable` (503,
//! with `Retry-After`), `#internal` (500).

use axum::http::{header, HeaderMap, HeaderValue, StatusCode};
use axum::response::{IntoResponse, Response};
use axum::Json;
use idem::http::Final;
use serde::Serialize;

use super::model::Payment;

/// The base of this app's problem types: this file, whose documentation
/// lists them.
const PROBLEM_BASE: &str =
    "https://github.com/idem-rs/idem/blob/main/examples/payments/problem.rs#";

/// An RFC 9457 problem document, members in the RFC's order.
#[derive(Serialize)]
struct Document<'a> {
    r#type: String,
    title: &'a str,
    status: u16,
    detail: String,
    /// The declined payment, with a 402.
    #[serde(skip_serializing_if = "Option::is_none")]
    payment: Option<&'a Payment>,
}

/// A problem response; `slug` names the problem type.
pub fn problem(status: StatusCode, slug: &str, title: &str, detail: impl Into<String>) -> Response {
    problem_with(status, slug, title, detail.into(), None)
}

/// The 402 answering a declined card: the outcome of a charge, marked
/// [`Final`] so that the idempotency layer stores and replays it like a
/// success, whatever statuses it stores by itself.
pub fn declined(payment: &Payment) -> Response {
    Final::mark(problem_with(
        StatusCode::PAYMENT_REQUIRED,
        "card-declined",
        "Card declined",
        format!("the card {} was declined", payment.card),
        Some(payment),
    ))
}

/// A 415 (`Some`) unless the request declares a JSON body (`application/json`, or
/// `type/subtype+json`), as axum's `Json` extractor answers. The layer
/// reads a body as JSON only when it is declared so: one taken as JSON
/// under another type would make the same bytes, sent again declared,
/// "another payload" (422). Not stored by the layer: the client may send
/// it again, declared, with the same key.
pub fn unless_json(headers: &HeaderMap) -> Option<Response> {
    let declared = headers
        .get(header::CONTENT_TYPE)
        .and_then(|value| value.to_str().ok())
        .map(|value| {
            value
                .split(';')
                .next()
                .unwrap_or_default()
                .trim()
                .to_ascii_lowercase()
        })
        .is_some_and(|essence| essence == "application/json" || essence.ends_with("+json"));
    if declared {
        return None;
    }
    Some(problem(
        StatusCode::UNSUPPORTED_MEDIA_TYPE,
        "unsupported-media-type",
        "Unsupported media type",
        "send the body as JSON, with `Content-Type: application/json`",
    ))
}

pub fn not_found(detail: &str) -> Response {
    problem(StatusCode::NOT_FOUND, "not-found", "Not found", detail)
}

/// A failure of the service itself: logged, and answered without details.
pub fn internal(err: &dyn std::fmt::Display) -> Response {
    tracing::error!("{err}");
    problem(
        StatusCode::INTERNAL_SERVER_ERROR,
        "internal",
        "Internal error",
        "the service failed; see its log",
    )
}

fn problem_with(
    status: StatusCode,
    slug: &str,
    title: &str,
    detail: String,
    payment: Option<&Payment>,
) -> Response {
    let document = Document {
        r#type: format!("{PROBLEM_BASE}{slug}"),
        title,
        status: status.as_u16(),
        detail,
        payment,
    };
    let mut response = (status, Json(document)).into_response();
    response.headers_mut().insert(
        header::CONTENT_TYPE,
        HeaderValue::from_static("application/problem+json"),
    );
    if status == StatusCode::SERVICE_UNAVAILABLE {
        response
            .headers_mut()
            .insert(header::RETRY_AFTER, HeaderValue::from_static("1"));
    }
    response
}
