//! Stripe's errors: `{"error": {"type", "message", "code", "param"}}`, and
//! the problem documents of the idempotency layer (and of the operations)
//! turned into them.

use axum::http::{header, StatusCode};
use axum::response::{IntoResponse, Response};
use axum::Json;
use idem::http::Problem;
use serde_json::{json, Value};

/// A Stripe error response.
pub fn error(
    status: StatusCode,
    kind: &str,
    code: Option<&str>,
    param: Option<&str>,
    message: &str,
) -> Response {
    let mut error = json!({ "type": kind, "message": message });
    if let Some(code) = code {
        error["code"] = json!(code);
    }
    if let Some(param) = param {
        error["param"] = json!(param);
    }
    (status, Json(json!({ "error": error }))).into_response()
}

/// A parameter with a value Stripe would refuse.
pub fn invalid(param: &str, message: &str) -> Response {
    error(
        StatusCode::BAD_REQUEST,
        "invalid_request_error",
        Some("parameter_invalid"),
        Some(param),
        message,
    )
}

/// A failure of the service itself: logged, and answered without details.
pub fn api_error(err: &dyn std::fmt::Display) -> Response {
    tracing::error!("{err}");
    error(
        StatusCode::INTERNAL_SERVER_ERROR,
        "api_error",
        None,
        None,
        "An unexpected error occurred.",
    )
}

/// Every `application/problem+json` answer as a Stripe error, keeping its
/// status (but 400 for a reused key, as Stripe) and its `Retry-After`: the
/// idempotency layer's own answers, and those of the operations (which
/// answer their idempotency errors as the layer does). Every other
/// response goes through unchanged.
pub async fn stripe_errors(response: Response) -> Response {
    let is_problem = response
        .headers()
        .get(header::CONTENT_TYPE)
        .is_some_and(|v| v.as_bytes() == b"application/problem+json");
    if !is_problem {
        return response;
    }
    let (parts, body) = response.into_parts();
    let bytes = axum::body::to_bytes(body, 64 * 1024)
        .await
        .unwrap_or_default();
    let document: Value = serde_json::from_slice(&bytes).unwrap_or_default();
    let kind = document["type"].as_str().unwrap_or_default();
    let is = |problem: Problem| kind == problem.type_uri();
    let detail = document["detail"].as_str().unwrap_or_default();
    let client_errors = [
        Problem::InvalidKey,
        Problem::MissingKey,
        Problem::UnreadableBody,
        Problem::ContentTooLarge,
    ];
    let mut mapped = if is(Problem::KeyReused) {
        error(
            StatusCode::BAD_REQUEST,
            "idempotency_error",
            None,
            None,
            "Keys for idempotent requests can only be used with the same parameters \
             they were first used with. Try using a key other than this one if you \
             meant to execute a different request.",
        )
    } else if is(Problem::InProgress) {
        error(
            StatusCode::CONFLICT,
            "idempotency_error",
            None,
            None,
            "There is currently another in-progress request using this Idempotent Key \
             (that probably means you submitted twice, and the other request is still \
             going through). Please try again later.",
        )
    } else if client_errors.into_iter().any(is) {
        error(parts.status, "invalid_request_error", None, None, detail)
    } else {
        error(parts.status, "api_error", None, None, detail)
    };
    if let Some(retry_after) = parts.headers.get(header::RETRY_AFTER) {
        mapped
            .headers_mut()
            .insert(header::RETRY_AFTER, retry_after.clone());
    }
    mapped
}
