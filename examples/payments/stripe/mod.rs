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

mod errors;
mod intents;

use std::sync::Arc;

use axum::extract::Request;
use axum::http::request::Parts;
use axum::http::{header, HeaderMap, StatusCode};
use axum::middleware::{self, Next};
use axum::response::Response;
use axum::routing::{get, post};
use axum::Router;
use idem::http::IdempotencyLayer;

use super::app::App;
use errors::error;

/// The `/v1` routes, behind the idempotency layer if one is given.
pub fn router(layer: Option<IdempotencyLayer>) -> Router<Arc<App>> {
    let routes = Router::new()
        .route("/v1/payment_intents", post(intents::create_intent))
        .route("/v1/payment_intents/{id}", get(intents::get_intent));
    let routes = match layer {
        Some(layer) => routes.layer(
            layer
                .require_key(false)
                .principal(|parts: &Parts| Some(parts.extensions.get::<Account>()?.0.clone())),
        ),
        None => routes,
    };
    // Outermost first on the way in: authenticate, then turn the problem
    // documents (the layer's, the operation's) into Stripe errors.
    routes
        .layer(middleware::map_response(errors::stripe_errors))
        .layer(middleware::from_fn(authenticate))
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
