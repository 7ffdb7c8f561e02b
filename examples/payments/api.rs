//! The JSON API: payments, subscriptions, the gateway's ledger.
//!
//! | route | answer |
//! |---|---|
//! | `POST /payments` (`Idempotency-Key` required) | 201 payment; 402 declined (stored and replayed); 400 invalid body (nothing stored, nothing charged); 503 gateway down (the key is released) |
//! | `GET /payments/{id}` | 200, or 404 |
//! | `GET /payments` | `{"count": N, "payments": [the latest 100, newest first]}` |
//! | `PUT /subscriptions/{user_id}` `{"plan": ".."}` | 200: created or updated, the same state however often it is sent |
//! | `GET /subscriptions/{user_id}` | 200, or 404 |
//! | `GET /gateway/charges` | `{"count": N, "charges": [...]}`: every charge the gateway made |
//!
//! Errors are RFC 9457 `application/problem+json` documents. The
//! idempotency contract is answered with the library's own
//! (`idem::http::ProblemDetails`: 400 for a missing or malformed key, 409
//! while the first request with a key runs, 422 for a key reused with
//! another body, 503 when the store is down), by the layer before the
//! handler or, without the layer, by the handler in the same words. This
//! app's problem types end in: `#invalid-request` (400), `#card-declined`
//! (402, with the declined `payment`), `#not-found` (404),
//! `#gateway-unavailable` (503), `#internal` (500).

use std::sync::Arc;

use axum::body::Bytes;
use axum::extract::{Path, State};
use axum::http::{header, HeaderValue, StatusCode};
use axum::response::{IntoResponse, Response};
use axum::Json;
use idem::http::{IdempotencyKey, ProblemDetails};
use serde::Serialize;
use serde_json::json;

use super::app::App;
use super::model::{NewPayment, Payment, Subscription};
use super::service::ServiceError;

/// The base of this app's problem types: this file, whose documentation
/// lists them.
const PROBLEM_BASE: &str = "https://github.com/idem-rs/idem/blob/main/examples/payments/api.rs#";

/// An RFC 9457 problem document, members in the RFC's order.
#[derive(Serialize)]
struct Problem<'a> {
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

fn problem_with(
    status: StatusCode,
    slug: &str,
    title: &str,
    detail: String,
    payment: Option<&Payment>,
) -> Response {
    let document = Problem {
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

/// `POST /payments`.
pub async fn create_payment(
    State(app): State<Arc<App>>,
    key: IdempotencyKey,
    body: Bytes,
) -> Response {
    let command = match NewPayment::parse(key.as_str().to_owned(), &body) {
        Ok(command) => command,
        Err(detail) => {
            return problem(
                StatusCode::BAD_REQUEST,
                "invalid-request",
                "Invalid payment request",
                detail,
            )
        }
    };
    // On a task of its own: a client that hangs up must not cancel a
    // payment between the charge and the row that records it.
    let created = tokio::spawn(async move { app.db.backend.create(&command).await }).await;
    match created {
        Ok(Ok(payment)) if payment.succeeded() => {
            (StatusCode::CREATED, Json(payment)).into_response()
        }
        Ok(Ok(payment)) => problem_with(
            StatusCode::PAYMENT_REQUIRED,
            "card-declined",
            "Card declined",
            format!("the card {} was declined", payment.card),
            Some(&payment),
        ),
        Ok(Err(err)) => service_error(err),
        Err(join) => internal(&join),
    }
}

/// The problem answering a failed operation.
pub fn service_error(err: ServiceError) -> Response {
    match err {
        ServiceError::Gateway(err) => problem(
            StatusCode::SERVICE_UNAVAILABLE,
            "gateway-unavailable",
            "Card gateway unavailable",
            format!("{err}; nothing was charged, retry with the same Idempotency-Key"),
        ),
        // 422, 409 with Retry-After, 503...: the layer's own answers.
        ServiceError::Idempotency(err) => ProblemDetails::from(&err).into_response(),
        ServiceError::Database(err) => internal(&err),
    }
}

pub fn internal(err: &dyn std::fmt::Display) -> Response {
    tracing::error!("{err}");
    problem(
        StatusCode::INTERNAL_SERVER_ERROR,
        "internal",
        "Internal error",
        "the service failed; see its log",
    )
}

/// `GET /payments/{id}`.
pub async fn get_payment(State(app): State<Arc<App>>, Path(id): Path<String>) -> Response {
    match app.db.backend.payment(&id).await {
        Ok(Some(payment)) => Json(payment).into_response(),
        Ok(None) => not_found(&format!("no payment {id}")),
        Err(err) => internal(&err),
    }
}

/// `GET /payments`.
pub async fn list_payments(State(app): State<Arc<App>>) -> Response {
    match app.db.backend.payments(100).await {
        Ok((count, payments)) => {
            Json(json!({ "count": count, "payments": payments })).into_response()
        }
        Err(err) => internal(&err),
    }
}

/// `PUT /subscriptions/{user_id}`.
pub async fn put_subscription(
    State(app): State<Arc<App>>,
    Path(user_id): Path<String>,
    body: Bytes,
) -> Response {
    let plan = serde_json::from_slice::<serde_json::Value>(&body)
        .ok()
        .and_then(|v| v.get("plan")?.as_str().map(str::to_owned))
        .filter(|plan| (1..=64).contains(&plan.len()));
    let Some(plan) = plan else {
        return problem(
            StatusCode::BAD_REQUEST,
            "invalid-request",
            "Invalid subscription request",
            "the body must be a JSON object with `plan`: a string of 1 to 64 bytes",
        );
    };
    if user_id.len() > 255 {
        return problem(
            StatusCode::BAD_REQUEST,
            "invalid-request",
            "Invalid subscription request",
            "the user id is over 255 bytes",
        );
    }
    let subscription = Subscription { user_id, plan };
    match app.db.backend.put_subscription(&subscription).await {
        Ok(stored) => Json(stored).into_response(),
        Err(err) => internal(&err),
    }
}

/// `GET /subscriptions/{user_id}`.
pub async fn get_subscription(
    State(app): State<Arc<App>>,
    Path(user_id): Path<String>,
) -> Response {
    match app.db.backend.subscription(&user_id).await {
        Ok(Some(subscription)) => Json(subscription).into_response(),
        Ok(None) => not_found(&format!("no subscription for user {user_id}")),
        Err(err) => internal(&err),
    }
}

/// `GET /gateway/charges`.
pub async fn gateway_charges(State(app): State<Arc<App>>) -> Response {
    match app.db.backend.gateway().charges().await {
        Ok(charges) => Json(json!({ "count": charges.len(), "charges": charges })).into_response(),
        Err(err) => internal(&err),
    }
}

/// `GET /metrics`.
pub async fn metrics(State(app): State<Arc<App>>) -> Response {
    (
        [(
            header::CONTENT_TYPE,
            HeaderValue::from_static("text/plain; version=0.0.4"),
        )],
        app.metrics.render(),
    )
        .into_response()
}

fn not_found(detail: &str) -> Response {
    problem(StatusCode::NOT_FOUND, "not-found", "Not found", detail)
}
