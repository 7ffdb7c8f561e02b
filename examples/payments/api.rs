//! The JSON API's other routes: the reads, the subscriptions (an upsert,
//! idempotent by itself), the gateway's ledger and `/metrics`. `POST
//! /payments` is in [`service`](super::service).

use std::sync::Arc;

use axum::body::Bytes;
use axum::extract::{Path, State};
use axum::http::{header, HeaderMap, HeaderValue, StatusCode};
use axum::response::{IntoResponse, Response};
use axum::Json;
use serde_json::json;

use super::app::App;
use super::model::Subscription;
use super::problem::{internal, not_found, problem, unless_json};

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
    headers: HeaderMap,
    body: Bytes,
) -> Response {
    if let Some(unsupported) = unless_json(&headers) {
        return unsupported;
    }
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
