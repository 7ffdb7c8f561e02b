//! A Stripe-compatible subset, so that Stripe's client libraries can drive
//! the service as a local sandbox with real idempotency:
//!
//! | route | answer |
//! |---|---|
//! | `POST /v1/payment_intents` (form: `amount`, `currency`, `payment_method`, `confirm`) | 200 `payment_intent`; 402 `card_error` when declined; 400 `invalid_request_error` |
//! | `GET /v1/payment_intents/{id}` | 200, or 404 `resource_missing` |
//!
//! Any bearer API key is accepted (`Authorization: Bearer sk_test_...`):
//! the authentication middleware puts the account it stands for in the
//! request's extensions, and that account is the principal that scopes
//! idempotency keys, so two API keys never share a stored response, and an
//! intent is visible to its API key only.
//! As with Stripe, `Idempotency-Key` is optional; with it, a retry is
//! answered the stored response with `Idempotent-Replayed: true`, a key
//! reused with other parameters is a 400 `idempotency_error`, and a
//! request whose parameters were refused is not stored. Test payment
//! methods: `pm_card_visa` (and other `pm_card_*`) succeed,
//! `pm_card_chargeDeclined` is declined; a card number may be given too.

use std::sync::Arc;

use axum::extract::rejection::FormRejection;
use axum::extract::{Extension, Path, Request, State};
use axum::http::{header, HeaderMap, StatusCode};
use axum::middleware::{self, Next};
use axum::response::{IntoResponse, Response};
use axum::routing::{get, post};
use axum::{Form, Json, Router};
use idem::http::{IdempotencyKey, IdempotencyLayer, Problem};
use serde::Deserialize;
use serde_json::{json, Value};

use super::api::service_error;
use super::app::App;
use super::model::{new_id, parse_card, parse_currency, PaymentIntent, STATUS_SUCCEEDED};
use super::service::NewIntent;

/// The `/v1` routes, behind the idempotency layer if one is given.
pub fn router(layer: Option<IdempotencyLayer>) -> Router<Arc<App>> {
    let routes = Router::new()
        .route("/v1/payment_intents", post(create_intent))
        .route("/v1/payment_intents/{id}", get(get_intent));
    let routes = match layer {
        Some(layer) => routes.layer(layer.require_key(false).principal(
            |parts: &axum::http::request::Parts| Some(parts.extensions.get::<Account>()?.0.clone()),
        )),
        None => routes,
    };
    // Outermost first on the way in: authenticate, then turn the problem
    // documents (the layer's, the operation's) into Stripe errors.
    routes
        .layer(middleware::map_response(stripe_errors))
        .layer(middleware::from_fn(authenticate))
}

/// A Stripe error response.
fn error(
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

fn invalid(param: &str, message: &str) -> Response {
    error(
        StatusCode::BAD_REQUEST,
        "invalid_request_error",
        Some("parameter_invalid"),
        Some(param),
        message,
    )
}

/// The bearer API key, if any.
fn api_key(headers: &HeaderMap) -> Option<&str> {
    let value = headers.get(header::AUTHORIZATION)?.to_str().ok()?;
    let key = value.strip_prefix("Bearer ")?.trim();
    (!key.is_empty()).then_some(key)
}

/// The account of the request's API key, put in its extensions by
/// [`authenticate`].
#[derive(Clone)]
struct Account(String);

/// The account an API key stands for: a hash, so that no key is stored.
pub fn account(api_key: &str) -> String {
    let digest = idem::Fingerprint::of(api_key)
        .map(|f| f.to_hex())
        .unwrap_or_default();
    format!("acct_{}", &digest[..16])
}

/// Refuses a request without an API key; otherwise puts the account of its
/// key in its extensions, for the idempotency layer and the handlers.
async fn authenticate(mut request: Request, next: Next) -> Response {
    let Some(key) = api_key(request.headers()) else {
        return error(
            StatusCode::UNAUTHORIZED,
            "invalid_request_error",
            None,
            None,
            "You did not provide an API key. Provide it in the Authorization header, \
             as `Authorization: Bearer YOUR_SECRET_KEY`.",
        );
    };
    let account = Account(account(key));
    request.extensions_mut().insert(account);
    next.run(request).await
}

/// Every `application/problem+json` answer as a Stripe error, keeping its
/// status (but 400 for a reused key, as Stripe) and its `Retry-After`: the
/// idempotency layer's own answers, and those of the operations (which
/// answer their idempotency errors as the layer does). Every other
/// response goes through unchanged.
async fn stripe_errors(response: Response) -> Response {
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

/// The form of `POST /v1/payment_intents`; other parameters are ignored.
#[derive(Deserialize)]
struct IntentForm {
    amount: Option<String>,
    currency: Option<String>,
    payment_method: Option<String>,
    confirm: Option<String>,
}

/// The card a test payment method stands for.
fn card_of(payment_method: &str) -> Option<String> {
    match payment_method {
        "pm_card_chargeDeclined" | "pm_card_visa_chargeDeclined" => {
            Some("4000000000000002".to_owned())
        }
        pm if pm.starts_with("pm_card_") => Some("4242424242424242".to_owned()),
        other => parse_card(other),
    }
}

async fn create_intent(
    State(app): State<Arc<App>>,
    Extension(Account(account)): Extension<Account>,
    headers: HeaderMap,
    form: Result<Form<IntentForm>, FormRejection>,
) -> Response {
    let Form(form) = match form {
        Ok(form) => form,
        Err(rejection) => {
            return error(
                StatusCode::BAD_REQUEST,
                "invalid_request_error",
                None,
                None,
                &format!("Invalid request body: {rejection}"),
            )
        }
    };
    let Some(amount) = form.amount else {
        return error(
            StatusCode::BAD_REQUEST,
            "invalid_request_error",
            Some("parameter_missing"),
            Some("amount"),
            "Missing required param: amount.",
        );
    };
    let Some(amount) = amount.parse::<i64>().ok().filter(|a| *a > 0) else {
        return invalid("amount", "This value must be greater than or equal to 1.");
    };
    let Some(currency) = form.currency else {
        return error(
            StatusCode::BAD_REQUEST,
            "invalid_request_error",
            Some("parameter_missing"),
            Some("currency"),
            "Missing required param: currency.",
        );
    };
    let Some(currency) = parse_currency(&currency).map(|c| c.to_ascii_lowercase()) else {
        return invalid(
            "currency",
            &format!("Invalid currency: {currency}. Use a three-letter ISO code."),
        );
    };
    let confirm = match form.confirm.as_deref() {
        None | Some("false") => false,
        Some("true") => true,
        Some(other) => return invalid("confirm", &format!("Invalid boolean: {other}")),
    };
    let card = match &form.payment_method {
        None => None,
        Some(pm) => match card_of(pm) {
            Some(card) => Some(card),
            None => {
                return error(
                    StatusCode::BAD_REQUEST,
                    "invalid_request_error",
                    Some("resource_missing"),
                    Some("payment_method"),
                    &format!("No such PaymentMethod: '{pm}'"),
                )
            }
        },
    };
    if confirm && card.is_none() {
        return error(
            StatusCode::BAD_REQUEST,
            "invalid_request_error",
            Some("payment_intent_unexpected_state"),
            Some("payment_method"),
            "You cannot confirm this PaymentIntent because it's missing a payment method.",
        );
    }
    // The token scopes the client's key to its API key; without a key,
    // every request is a new intent, as with Stripe.
    let token = match IdempotencyKey::from_headers(&headers) {
        Ok(key) => idem::Fingerprint::of(&(&account, key.as_str()))
            .map(|f| f.to_hex())
            .unwrap_or_default(),
        Err(err) if err.is_missing() => new_id("tok"),
        Err(err) => {
            return error(
                StatusCode::BAD_REQUEST,
                "invalid_request_error",
                None,
                None,
                &err.to_string(),
            )
        }
    };
    let command = NewIntent {
        token,
        account,
        amount,
        currency,
        payment_method: form.payment_method,
        card,
        confirm,
    };
    let created = tokio::spawn(async move { app.db.backend.create_intent(&command).await }).await;
    match created {
        Ok(Ok(intent)) if declined(&intent) => {
            let mut body = json!({
                "error": decline_error(&intent),
            });
            body["error"]["payment_intent"] = object(&intent);
            (StatusCode::PAYMENT_REQUIRED, Json(body)).into_response()
        }
        Ok(Ok(intent)) => Json(object(&intent)).into_response(),
        // Problem documents, which `stripe_errors` words as Stripe does.
        Ok(Err(err)) => service_error(err),
        Err(join) => api_error(&join),
    }
}

fn api_error(err: &dyn std::fmt::Display) -> Response {
    tracing::error!("{err}");
    error(
        StatusCode::INTERNAL_SERVER_ERROR,
        "api_error",
        None,
        None,
        "An unexpected error occurred.",
    )
}

async fn get_intent(
    State(app): State<Arc<App>>,
    Extension(Account(account)): Extension<Account>,
    Path(id): Path<String>,
) -> Response {
    match app.db.backend.payment_intent(&account, &id).await {
        Ok(Some(intent)) => Json(object(&intent)).into_response(),
        Ok(None) => error(
            StatusCode::NOT_FOUND,
            "invalid_request_error",
            Some("resource_missing"),
            Some("intent"),
            &format!("No such payment_intent: '{id}'"),
        ),
        Err(err) => api_error(&err),
    }
}

/// Whether the gateway declined the intent's charge.
fn declined(intent: &PaymentIntent) -> bool {
    intent.status == "requires_payment_method" && intent.latest_charge.is_some()
}

fn decline_error(intent: &PaymentIntent) -> Value {
    json!({
        "type": "card_error",
        "code": "card_declined",
        "decline_code": "generic_decline",
        "message": "Your card was declined.",
        "charge": intent.latest_charge,
    })
}

/// The intent as Stripe writes a `payment_intent` object.
fn object(intent: &PaymentIntent) -> Value {
    let succeeded = intent.status == STATUS_SUCCEEDED;
    json!({
        "id": intent.id,
        "object": "payment_intent",
        "amount": intent.amount,
        "amount_received": if succeeded { intent.amount } else { 0 },
        "currency": intent.currency,
        "status": intent.status,
        "payment_method": intent.payment_method,
        "latest_charge": intent.latest_charge,
        "last_payment_error": if declined(intent) { decline_error(intent) } else { Value::Null },
        "capture_method": "automatic",
        "confirmation_method": "automatic",
        "created": intent.created,
        "livemode": false,
        "metadata": {},
    })
}
