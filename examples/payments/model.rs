//! The rows the service stores and the commands that create them.
//!
//! Each table is described once, by `#[derive(idem::Entity)]` for the
//! writes and `#[derive(sqlx::FromRow)]` for the reads. `payments` and
//! `payment_intents` carry the idempotency token in a UNIQUE column, with
//! the request's fingerprint next to it so that a token reused with
//! another request is refused.

use idem::entity::EntityBind;
use idem::entity::EntityDatabase;
use serde::Serialize;
use sqlx::FromRow;

/// A payment, as stored in `payments` and answered by the JSON API.
#[derive(Clone, Debug, PartialEq, Serialize, sqlx::FromRow, idem::Entity)]
#[idem(table = "payments")]
pub struct Payment {
    /// The insertion order, filled in by the database.
    #[idem(generated)]
    #[serde(skip)]
    pub seq: i64,
    /// `pay_...`.
    pub id: String,
    /// The client's `Idempotency-Key`: UNIQUE in the table.
    #[idem(token)]
    #[serde(skip)]
    pub idempotency_token: String,
    /// The SHA-256 of the command, to refuse a key reused with another one.
    #[idem(request_hash)]
    #[serde(skip)]
    pub request_hash: Option<String>,
    /// In minor units (cents).
    pub amount: i64,
    /// Three upper-case letters (ISO 4217).
    pub currency: String,
    /// `succeeded` or `declined`.
    pub status: String,
    /// The card, masked: `**** 4242`.
    pub card: String,
    #[serde(skip_serializing_if = "Option::is_none")]
    pub description: Option<String>,
    /// The gateway's charge.
    #[serde(skip)]
    pub charge_id: String,
    /// RFC 3339, UTC.
    pub created_at: String,
}

impl Payment {
    pub fn succeeded(&self) -> bool {
        self.status == STATUS_SUCCEEDED
    }
}

pub const STATUS_SUCCEEDED: &str = "succeeded";
pub const STATUS_DECLINED: &str = "declined";

/// What `POST /payments` asks for, once validated. It is the payload that
/// is fingerprinted: a retry must send the same.
#[derive(Clone, Debug, Serialize)]
pub struct NewPayment {
    pub idempotency_key: String,
    pub amount: i64,
    pub currency: String,
    pub card: String,
    pub description: Option<String>,
}

impl NewPayment {
    /// Validates the JSON body of `POST /payments`; the error is the
    /// problem's detail.
    pub fn parse(idempotency_key: String, body: &[u8]) -> Result<NewPayment, String> {
        let value: serde_json::Value =
            serde_json::from_slice(body).map_err(|e| format!("the body is not valid JSON: {e}"))?;
        let object = value.as_object().ok_or("the body must be a JSON object")?;
        let amount = match object.get("amount") {
            None => return Err("`amount` is missing".into()),
            Some(amount) => amount
                .as_i64()
                .filter(|a| *a > 0)
                .ok_or("`amount` must be an integer number of minor units greater than 0")?,
        };
        let currency = match object.get("currency") {
            None => return Err("`currency` is missing".into()),
            Some(currency) => currency
                .as_str()
                .and_then(parse_currency)
                .ok_or("`currency` must be a three-letter ISO 4217 code, such as \"EUR\"")?,
        };
        let card = match object.get("card") {
            None => return Err("`card` is missing".into()),
            Some(card) => card
                .as_str()
                .and_then(parse_card)
                .ok_or("`card` must be a card number: 4 to 19 digits")?,
        };
        let description = match object.get("description") {
            None | Some(serde_json::Value::Null) => None,
            Some(serde_json::Value::String(text)) if text.len() <= 1000 => Some(text.clone()),
            Some(_) => return Err("`description` must be a string of at most 1000 bytes".into()),
        };
        Ok(NewPayment {
            idempotency_key,
            amount,
            currency,
            card,
            description,
        })
    }
}

/// `eur` or `EUR` -> `EUR`.
pub fn parse_currency(code: &str) -> Option<String> {
    (code.len() == 3 && code.bytes().all(|b| b.is_ascii_alphabetic()))
        .then(|| code.to_ascii_uppercase())
}

/// The card's digits (spaces and dashes dropped), if it is 4 to 19 digits.
pub fn parse_card(card: &str) -> Option<String> {
    let digits: String = card.chars().filter(|c| !matches!(c, ' ' | '-')).collect();
    (4..=19)
        .contains(&digits.len())
        .then_some(())
        .filter(|()| digits.bytes().all(|b| b.is_ascii_digit()))
        .map(|()| digits)
}

/// `**** 4242`: the only part of a card number the service keeps.
pub fn mask_card(digits: &str) -> String {
    format!("**** {}", &digits[digits.len().saturating_sub(4)..])
}

/// A subscription: one row per user, written by upsert (PUT).
#[derive(Clone, Debug, PartialEq, Serialize, sqlx::FromRow, idem::Entity)]
#[idem(table = "subscriptions")]
pub struct Subscription {
    pub user_id: String,
    pub plan: String,
}

/// A Stripe-style payment intent, as stored in `payment_intents`.
#[derive(Clone, Debug, PartialEq, sqlx::FromRow, idem::Entity)]
#[idem(table = "payment_intents")]
pub struct PaymentIntent {
    #[idem(generated)]
    pub seq: i64,
    /// `pi_...`.
    pub id: String,
    /// The `Idempotency-Key` scoped to the API key (a hash of both), or a
    /// fresh token for a request without a key.
    #[idem(token)]
    pub idempotency_token: String,
    #[idem(request_hash)]
    pub request_hash: Option<String>,
    /// Who created it: a hash of the API key, never the key.
    pub account: String,
    pub amount: i64,
    /// Lower case, as Stripe writes it.
    pub currency: String,
    pub payment_method: Option<String>,
    /// `succeeded`, `requires_payment_method` (declined, or no payment
    /// method) or `requires_confirmation` (`confirm` was false).
    pub status: String,
    /// The gateway's charge, once confirmed.
    pub latest_charge: Option<String>,
    /// Unix seconds.
    pub created: i64,
}

/// What `POST /v1/payment_intents` asks for, once validated: the payload
/// that is fingerprinted.
#[derive(Clone, Debug, Serialize)]
pub struct NewIntent {
    /// The token: a hash of the account and the `Idempotency-Key`.
    pub token: String,
    pub account: String,
    pub amount: i64,
    pub currency: String,
    pub payment_method: Option<String>,
    /// The card the payment method stands for.
    pub card: Option<String>,
    pub confirm: bool,
}

/// A row type of a table in the database `DB`: what entity mode and
/// `idem::entity::upsert` need to write it and read it back, in one name,
/// so that an operation generic over the database asks `Payment: Table<DB>`.
pub trait Table<DB: EntityDatabase>: EntityBind<DB> + for<'r> FromRow<'r, DB::Row> {}

impl<DB, T> Table<DB> for T
where
    DB: EntityDatabase,
    T: EntityBind<DB> + for<'r> FromRow<'r, DB::Row>,
{
}
