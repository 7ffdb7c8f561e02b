//! The rows the service stores and the commands that create them.
//!
//! Each table is described once, by `#[derive(idem::Entity)]` for the
//! writes and `#[derive(sqlx::FromRow)]` for the reads. `payments` and
//! `payment_intents` carry the idempotency token in a UNIQUE column, with
//! the request's fingerprint next to it so that a token reused with
//! another request is refused.

use std::hash::{BuildHasher, Hasher};
use std::sync::atomic::{AtomicU64, Ordering};
use std::time::{SystemTime, UNIX_EPOCH};

use serde::Serialize;

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

/// A random identifier with a prefix: `pay_4fJ2...` (22 characters of
/// base 62, from the standard library's randomly keyed hasher).
pub fn new_id(prefix: &str) -> String {
    const ALPHABET: &[u8] = b"0123456789ABCDEFGHIJKLMNOPQRSTUVWXYZabcdefghijklmnopqrstuvwxyz";
    let mut id = format!("{prefix}_");
    for _ in 0..2 {
        let mut bits = random_u64();
        for _ in 0..11 {
            id.push(ALPHABET[(bits % 62) as usize] as char);
            bits /= 62;
        }
    }
    id
}

/// 64 random bits: `RandomState` is keyed randomly per thread and its keys
/// change with every instance; a counter and the clock make each call
/// distinct.
pub fn random_u64() -> u64 {
    static COUNTER: AtomicU64 = AtomicU64::new(0);
    let mut hasher = std::hash::RandomState::new().build_hasher();
    hasher.write_u64(COUNTER.fetch_add(1, Ordering::Relaxed));
    hasher.write_u128(unix_now().as_nanos());
    hasher.finish()
}

/// A uniform draw in `[0, 1)`.
pub fn random_unit() -> f64 {
    (random_u64() >> 11) as f64 / (1u64 << 53) as f64
}

fn unix_now() -> std::time::Duration {
    SystemTime::now()
        .duration_since(UNIX_EPOCH)
        .unwrap_or_default()
}

/// Now, in Unix seconds.
pub fn unix_seconds() -> i64 {
    unix_now().as_secs() as i64
}

/// Now, as RFC 3339 in UTC with milliseconds: `2025-01-31T09:26:03.123Z`.
pub fn now_rfc3339() -> String {
    let now = unix_now();
    let secs = now.as_secs() as i64;
    let (year, month, day) = civil_from_days(secs.div_euclid(86_400));
    let time = secs.rem_euclid(86_400);
    format!(
        "{year:04}-{month:02}-{day:02}T{:02}:{:02}:{:02}.{:03}Z",
        time / 3600,
        time % 3600 / 60,
        time % 60,
        now.subsec_millis()
    )
}

/// The proleptic Gregorian date of a day count since 1970-01-01 (Howard
/// Hinnant's `civil_from_days`).
fn civil_from_days(days: i64) -> (i64, u32, u32) {
    let z = days + 719_468;
    let era = z.div_euclid(146_097);
    let doe = z.rem_euclid(146_097);
    let yoe = (doe - doe / 1460 + doe / 36_524 - doe / 146_096) / 365;
    let doy = doe - (365 * yoe + yoe / 4 - yoe / 100);
    let mp = (5 * doy + 2) / 153;
    let day = (doy - (153 * mp + 2) / 5 + 1) as u32;
    let month = if mp < 10 { mp + 3 } else { mp - 9 } as u32;
    let year = yoe + era * 400 + i64::from(month <= 2);
    (year, month, day)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn dates() {
        assert_eq!(civil_from_days(0), (1970, 1, 1));
        assert_eq!(civil_from_days(19_723), (2024, 1, 1));
        assert_eq!(civil_from_days(19_782), (2024, 2, 29));
        assert_eq!(civil_from_days(-1), (1969, 12, 31));
    }
}
