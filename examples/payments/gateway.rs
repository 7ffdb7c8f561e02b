//! The fake card gateway: the side effect that must happen once per key.
//!
//! A charge takes `--gateway-latency-ms`, fails before charging anything
//! with probability `--gateway-failure-rate` (a transient error: the
//! service answers 503 and the retry charges), and declines cards ending
//! in `0002`. Every charge the gateway makes, declined or not, is written
//! to its ledger, the ground truth that `GET /gateway/charges` answers:
//!
//! - on PostgreSQL and MySQL/MariaDB, the `gateway_charges` table, so
//!   that every instance of the service on one database counts into one
//!   ledger;
//! - on SQLite, the process's memory (writing to the database from inside
//!   an entity-mode call would wait for the very write lock that call
//!   holds).

use std::sync::Mutex;
use std::time::Duration;

use serde::Serialize;

use super::clock::now_rfc3339;
use super::model::{mask_card, STATUS_DECLINED, STATUS_SUCCEEDED};
use super::random::{new_id, random_unit};

/// One charge the gateway made.
#[derive(Clone, Debug, PartialEq, Serialize, sqlx::FromRow)]
pub struct Charge {
    /// `ch_...`.
    pub id: String,
    /// The merchant's reference for it: the payment's idempotency token.
    pub reference: String,
    pub amount: i64,
    pub currency: String,
    /// Masked: `**** 4242`.
    pub card: String,
    /// `succeeded` or `declined`.
    pub status: String,
    pub created_at: String,
}

impl Charge {
    pub fn succeeded(&self) -> bool {
        self.status == STATUS_SUCCEEDED
    }
}

/// What the service asks the gateway to do.
#[derive(Debug)]
pub struct ChargeRequest<'a> {
    pub reference: &'a str,
    pub amount: i64,
    pub currency: &'a str,
    /// The card's digits.
    pub card: &'a str,
}

/// The gateway did not charge: try again later.
#[derive(Debug, thiserror::Error)]
pub enum GatewayError {
    #[error("the card gateway is temporarily unavailable")]
    Unavailable,
    #[error("the gateway's ledger failed: {0}")]
    Ledger(#[from] sqlx::Error),
}

/// Where charges are recorded.
pub enum Ledger {
    Memory(Mutex<Vec<Charge>>),
    #[cfg(feature = "postgres")]
    Postgres(sqlx::PgPool),
    #[cfg(feature = "mysql")]
    MySql(sqlx::MySqlPool),
}

#[cfg(any(feature = "postgres", feature = "mysql"))]
const INSERT: &str = "INSERT INTO gateway_charges \
    (id, reference, amount, currency, card, status, created_at) \
    VALUES ($1, $2, $3, $4, $5, $6, $7)";
#[cfg(any(feature = "postgres", feature = "mysql"))]
const SELECT: &str = "SELECT id, reference, amount, currency, card, status, created_at \
    FROM gateway_charges ORDER BY seq";

impl Ledger {
    async fn record(&self, charge: &Charge) -> Result<(), sqlx::Error> {
        #[cfg(any(feature = "postgres", feature = "mysql"))]
        macro_rules! insert {
            ($sql:expr, $pool:expr) => {
                sqlx::query($sql)
                    .bind(&charge.id)
                    .bind(&charge.reference)
                    .bind(charge.amount)
                    .bind(&charge.currency)
                    .bind(&charge.card)
                    .bind(&charge.status)
                    .bind(&charge.created_at)
                    .execute($pool)
                    .await
                    .map(drop)
            };
        }
        match self {
            Ledger::Memory(charges) => {
                charges.lock().unwrap().push(charge.clone());
                Ok(())
            }
            #[cfg(feature = "postgres")]
            Ledger::Postgres(pool) => insert!(INSERT, pool),
            #[cfg(feature = "mysql")]
            Ledger::MySql(pool) => insert!(&super::db::mysql::params(INSERT), pool),
        }
    }

    async fn charges(&self) -> Result<Vec<Charge>, sqlx::Error> {
        match self {
            Ledger::Memory(charges) => Ok(charges.lock().unwrap().clone()),
            #[cfg(feature = "postgres")]
            Ledger::Postgres(pool) => sqlx::query_as(SELECT).fetch_all(pool).await,
            #[cfg(feature = "mysql")]
            Ledger::MySql(pool) => sqlx::query_as(SELECT).fetch_all(pool).await,
        }
    }
}

/// The fake gateway.
pub struct Gateway {
    pub latency: Duration,
    pub failure_rate: f64,
    pub ledger: Ledger,
}

impl Gateway {
    /// Charges the card, or fails without charging.
    pub async fn charge(&self, request: ChargeRequest<'_>) -> Result<Charge, GatewayError> {
        tokio::time::sleep(self.latency).await;
        if random_unit() < self.failure_rate {
            return Err(GatewayError::Unavailable);
        }
        let status = if request.card.ends_with("0002") {
            STATUS_DECLINED
        } else {
            STATUS_SUCCEEDED
        };
        let charge = Charge {
            id: new_id("ch"),
            reference: request.reference.to_owned(),
            amount: request.amount,
            currency: request.currency.to_owned(),
            card: mask_card(request.card),
            status: status.to_owned(),
            created_at: now_rfc3339(),
        };
        self.ledger.record(&charge).await?;
        Ok(charge)
    }

    /// Every charge made, oldest first.
    pub async fn charges(&self) -> Result<Vec<Charge>, sqlx::Error> {
        self.ledger.charges().await
    }
}
