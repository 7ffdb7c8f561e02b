//! The operations, idempotent by themselves: whatever the HTTP layer above
//! does or does not do, one idempotency token is one gateway charge and one
//! row.
//!
//! `create` and `create_intent` run in entity mode: the business table
//! holds the token in a UNIQUE column. A call finds the row by its token
//! and returns it as stored, or takes the token's lock, charges, and saves
//! the row with an insert that does nothing on a token conflict. A token
//! reused with another command is refused (`KeyReused`), since the rows
//! keep the command's fingerprint. A gateway failure stores nothing, so the
//! retry charges.

use std::sync::Arc;

use idem::entity::EntityDatabase;
use idem::{idempotent, EntityBind};
use serde::Serialize;
use sqlx::{FromRow, Pool};

use super::gateway::{ChargeRequest, Gateway, GatewayError};
use super::model::{mask_card, Subscription, STATUS_SUCCEEDED};
use super::model::{new_id, now_rfc3339, unix_seconds, NewPayment, Payment, PaymentIntent};

/// Why an operation did not give its answer.
#[derive(Debug, thiserror::Error)]
pub enum ServiceError {
    /// Transient: nothing was charged nor stored; retry with the same key.
    #[error(transparent)]
    Gateway(#[from] GatewayError),
    /// The idempotency contract: key reused, in progress, invalid key.
    #[error(transparent)]
    Idempotency(#[from] idem::Error),
    #[error("database error: {0}")]
    Database(#[from] sqlx::Error),
}

/// A confirmed Stripe-style payment intent, before it is stored.
#[derive(Clone, Debug, Serialize)]
pub struct NewIntent {
    /// The token: a hash of the API key and the `Idempotency-Key`.
    pub token: String,
    pub account: String,
    pub amount: i64,
    pub currency: String,
    pub payment_method: Option<String>,
    /// The card the payment method stands for.
    pub card: Option<String>,
    pub confirm: bool,
}

/// The payment operations on one database.
pub struct Payments<DB: sqlx::Database> {
    pub pool: Pool<DB>,
    pub gateway: Arc<Gateway>,
}

impl<DB: sqlx::Database> Payments<DB> {
    pub fn new(pool: Pool<DB>, gateway: Arc<Gateway>) -> Self {
        Payments { pool, gateway }
    }
}

impl<DB> Payments<DB>
where
    DB: EntityDatabase,
    Payment: EntityBind<DB> + for<'r> FromRow<'r, DB::Row>,
    PaymentIntent: EntityBind<DB> + for<'r> FromRow<'r, DB::Row>,
    Subscription: EntityBind<DB> + for<'r> FromRow<'r, DB::Row>,
{
    /// Charges the card once per idempotency key and stores the payment,
    /// `succeeded` or `declined`; a retry gets the stored payment back.
    #[idempotent(key = cmd.idempotency_key, store = self.pool, entity)]
    pub async fn create(&self, cmd: &NewPayment) -> Result<Payment, ServiceError> {
        let charge = self
            .gateway
            .charge(ChargeRequest {
                reference: &cmd.idempotency_key,
                amount: cmd.amount,
                currency: &cmd.currency,
                card: &cmd.card,
            })
            .await?;
        Ok(Payment {
            seq: 0,
            id: new_id("pay"),
            idempotency_token: cmd.idempotency_key.clone(),
            request_hash: None,
            amount: cmd.amount,
            currency: cmd.currency.clone(),
            status: charge.status,
            card: mask_card(&cmd.card),
            description: cmd.description.clone(),
            charge_id: charge.id,
            created_at: now_rfc3339(),
        })
    }

    /// Creates a payment intent once per token, charging it if confirmed.
    #[idempotent(key = cmd.token, store = self.pool, entity)]
    pub async fn create_intent(&self, cmd: &NewIntent) -> Result<PaymentIntent, ServiceError> {
        let (status, latest_charge) = match (&cmd.card, cmd.confirm) {
            (Some(card), true) => {
                let charge = self
                    .gateway
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

    /// Sets a user's plan: creates the row or updates it, in one statement,
    /// so that repeating the request leaves the same state.
    pub async fn put_subscription(
        &self,
        subscription: &Subscription,
    ) -> Result<Subscription, ServiceError> {
        Ok(idem::entity::upsert(&self.pool, subscription, &["user_id"]).await?)
    }
}
