//! `/v1/payment_intents`: the operation that creates an intent once per
//! token, its handlers, and the intent as Stripe writes it.

use std::sync::Arc;

use axum::extract::rejection::FormRejection;
use axum::extract::{Extension, Path, State};
use axum::http::{HeaderMap, StatusCode};
use axum::response::{IntoResponse, Response};
use axum::{Form, Json};
use idem::entity::EntityDatabase;
use idem::http::{Final, IdempotencyKey};
use idem::idempotent;
use serde::Deserialize;
use serde_json::{json, Value};

use super::super::app::App;
use super::super::clock::unix_seconds;
use super::super::gateway::ChargeRequest;
use super::super::model::STATUS_SUCCEEDED;
use super::super::model::{parse_card, parse_currency, NewIntent, PaymentIntent, Table};
use super::super::random::new_id;
use super::super::service::{Payments, ServiceError};
use super::errors::{api_error, error, invalid};
use super::Account;

impl<DB: EntityDatabase> Payments<DB>
where
    PaymentIntent: Table<DB>,
{
    /// Creates a payment intent once per token, charging it if confirmed,
    /// as [`Payments::create`] creates a payment (through the same durable
    /// step, [`Payments::charge`]).
    #[idempotent(key = cmd.token, store = self.pool, entity)]
    pub async fn create_intent(&self, cmd: &NewIntent) -> Result<PaymentIntent, ServiceError> {
        let (status, latest_charge) = match (&cmd.card, cmd.confirm) {
            (Some(card), true) => {
                let charge = self
                    .charge(ChargeRequest {
                        reference: &cmd.token,
                        amount: cmd.amount,
                        currency: &cmd.currency,
                        card,
                    })
                    .await?;
                let status = if charge.succeeded() {
                    STATUS_SUCCEEDED
                } else {
                    "requires_payment_method"
                };
                (status, Some(charge.id))
            }
            (Some(_), false) => ("requires_confirmation", None),
            (None, _) => ("requires_payment_method", None),
        };
        Ok(PaymentIntent {
            seq: 0,
            id: new_id("pi"),
            idempotency_token: cmd.token.clone(),
            request_hash: None,
            account: cmd.account.clone(),
            amount: cmd.amount,
            currency: cmd.currency.clone(),
            payment_method: cmd.payment_method.clone(),
            status: status.to_owned(),
            latest_charge,
            created: unix_seconds(),
        })
    }
}

/// The form of `POST /v1/payment_intents`; other parameters are ignored.
#[derive(Deserialize)]
pub struct IntentForm {
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

/// `POST /v1/payment_intents`.
pub async fn create_intent(
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
            // The charge's outcome: stored and replayed (`Final`).
            (StatusCode::PAYMENT_REQUIRED, Final, Json(body)).into_response()
        }
        Ok(Ok(intent)) => Json(object(&intent)).into_response(),
        // Problem documents, which `stripe_errors` words as Stripe does.
        Ok(Err(err)) => err.into_response(),
        Err(join) => api_error(&join),
    }
}

/// `GET /v1/payment_intents/{id}`.
pub async fn get_intent(
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
