//! The fake card gateway: the side effect that must happen once per key.
//!
//! It behaves like Stripe with idempotency keys. A charge names a key:
//!
//! - the same key with the same parameters answers the first charge and
//!   charges nothing;
//! - the same key with other parameters is refused
//!   ([`GatewayError::KeyReused`]);
//! - keys are kept for [`KEY_RETENTION`] (24 h); after that the key is
//!   forgotten (the charge stays in the ledger) and may charge again.
//!
//! [`Gateway::lookup`] answers what became of a key without charging: the
//! question a service asks when it does not know whether its charge went
//! through (see [`Payments::charge`](super::service::Payments::charge)).
//!
//! A call takes `--gateway-latency-ms`, and the charge happens *mid-call*:
//! it is recorded after half of it, and the answer comes back after the
//! other half. An answer can thus be lost after the card was charged, as
//! in life: the caller's process dies, its connection breaks. With
//! probability `--gateway-failure-rate` a charge fails instead, charging
//! nothing (a transient error: the service answers 503 and the retry
//! charges). Cards ending in `0002` are declined.
//!
//! Every charge the gateway makes, declined or not, is written to its
//! ledger, the ground truth that `GET /gateway/charges` answers, with the
//! key it was made under:
//!
//! - on PostgreSQL and MySQL/MariaDB, the `gateway_charges` table, so
//!   that every instance of the service on one database counts into one
//!   ledger, and the keys outlive a crash of the service, as a real
//!   gateway's do;
//! - on SQLite, the process's memory, keys included (the ledger stands for
//!   another system, and SQLite's single writer is the app's).

use std::collections::HashMap;
use std::sync::atomic::{AtomicUsize, Ordering};
use std::sync::Mutex;
use std::time::Duration;

use serde::{Deserialize, Serialize};

use super::clock::{now_rfc3339, unix_now};
use super::model::{mask_card, STATUS_DECLINED, STATUS_SUCCEEDED};
use super::random::{new_id, random_unit};

/// How long the gateway keeps an idempotency key, as Stripe does.
pub const KEY_RETENTION: Duration = Duration::from_secs(24 * 60 * 60);

/// One charge the gateway made. It is the output of the service's
/// `charge` step, so it is journaled and replayed as JSON too.
#[derive(Clone, Debug, PartialEq, Serialize, Deserialize, sqlx::FromRow)]
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
    /// The idempotency key it was made under, while the gateway keeps it
    /// (`null` once forgotten).
    pub idempotency_key: Option<String>,
}

impl Charge {
    pub fn succeeded(&self) -> bool {
        self.status == STATUS_SUCCEEDED
    }
}

/// What the service asks the gateway to do: the parameters that a key
/// binds.
#[derive(Clone, Copy, Debug, Serialize)]
pub struct ChargeRequest<'a> {
    pub reference: &'a str,
    pub amount: i64,
    pub currency: &'a str,
    /// The card's digits.
    pub card: &'a str,
}

impl ChargeRequest<'_> {
    /// What the gateway keeps of the parameters to compare a key's later
    /// requests with: a hash, since the card's digits are not kept.
    fn hash(&self) -> String {
        idem::Fingerprint::of(self)
            .map(|f| f.to_hex())
            .unwrap_or_default()
    }
}

#[derive(Debug, thiserror::Error)]
pub enum GatewayError {
    /// Transient: nothing was charged, try again later.
    #[error("the card gateway is temporarily unavailable")]
    Unavailable,
    /// The key was used with other parameters: nothing was charged, and
    /// the key's charge stands.
    #[error("the idempotency key was used with other parameters")]
    KeyReused,
    #[error("the gateway's ledger failed: {0}")]
    Ledger(#[from] sqlx::Error),
}

/// Where charges, and the keys they were made under, are recorded.
pub enum Ledger {
    Memory(Mutex<Memory>),
    #[cfg(feature = "postgres")]
    Postgres(sqlx::PgPool),
    #[cfg(feature = "mysql")]
    MySql(sqlx::MySqlPool),
}

/// The ledger in the process: the charges, and the keys still kept.
#[derive(Default)]
pub struct Memory {
    charges: Vec<Charge>,
    /// Key -> (the request's hash, the charge's index, kept until (Unix
    /// milliseconds)).
    keys: HashMap<String, (String, usize, i64)>,
}

/// A key's charge as the ledger holds it.
struct Keyed {
    charge: Charge,
    request_hash: String,
}

#[cfg(any(feature = "postgres", feature = "mysql"))]
const INSERT: &str = "INSERT INTO gateway_charges \
    (id, reference, amount, currency, card, status, created_at, idempotency_key, \
     request_hash, key_expires_at) \
    VALUES ($1, $2, $3, $4, $5, $6, $7, $8, $9, $10)";
/// The charge a key holds while it is kept, and the hash of its request.
#[cfg(any(feature = "postgres", feature = "mysql"))]
const KEYED: &str = "SELECT id, reference, amount, currency, card, status, created_at, \
    idempotency_key, request_hash FROM gateway_charges \
    WHERE idempotency_key = $1 AND key_expires_at > $2";
/// A key expired: the gateway forgets it, the charge stays.
#[cfg(any(feature = "postgres", feature = "mysql"))]
const FORGET: &str = "UPDATE gateway_charges SET idempotency_key = NULL \
    WHERE idempotency_key = $1 AND key_expires_at <= $2";
#[cfg(any(feature = "postgres", feature = "mysql"))]
const SELECT: &str = "SELECT id, reference, amount, currency, card, status, created_at, \
    idempotency_key FROM gateway_charges ORDER BY seq";

/// A row of [`KEYED`].
#[cfg(any(feature = "postgres", feature = "mysql"))]
#[derive(sqlx::FromRow)]
struct KeyedRow {
    #[sqlx(flatten)]
    charge: Charge,
    request_hash: String,
}

/// Now, in Unix milliseconds: when keys expire.
fn now_millis() -> i64 {
    unix_now().as_millis() as i64
}

impl Ledger {
    /// A ledger in the process's memory.
    pub fn memory() -> Ledger {
        Ledger::Memory(Mutex::default())
    }

    /// `statement`, written with PostgreSQL's placeholders (`$1`), in this
    /// ledger's SQL.
    #[cfg(any(feature = "postgres", feature = "mysql"))]
    fn sql(&self, statement: &'static str) -> std::borrow::Cow<'static, str> {
        match self {
            #[cfg(feature = "mysql")]
            Ledger::MySql(_) => super::db::mysql::params(statement),
            _ => std::borrow::Cow::Borrowed(statement),
        }
    }

    /// Records `charge` under its key, unless the key holds a charge
    /// already: then answers that one (and records nothing). The key's
    /// UNIQUE column decides between two requests with one key at once.
    async fn record(&self, charge: &Charge, request_hash: &str) -> Result<Keyed, sqlx::Error> {
        let key = charge.idempotency_key.as_deref().unwrap_or_default();
        let now = now_millis();
        let expires = now + KEY_RETENTION.as_millis() as i64;
        #[cfg(any(feature = "postgres", feature = "mysql"))]
        macro_rules! record {
            ($pool:expr) => {{
                if let Some(keyed) = self.keyed(key).await? {
                    return Ok(keyed);
                }
                sqlx::query(&self.sql(FORGET))
                    .bind(key)
                    .bind(now)
                    .execute($pool)
                    .await?;
                let inserted = sqlx::query(&self.sql(INSERT))
                    .bind(&charge.id)
                    .bind(&charge.reference)
                    .bind(charge.amount)
                    .bind(&charge.currency)
                    .bind(&charge.card)
                    .bind(&charge.status)
                    .bind(&charge.created_at)
                    .bind(key)
                    .bind(request_hash)
                    .bind(expires)
                    .execute($pool)
                    .await;
                match inserted {
                    Ok(_) => Ok(Keyed {
                        charge: charge.clone(),
                        request_hash: request_hash.to_owned(),
                    }),
                    // Another request with this key recorded first.
                    Err(err) if idem::entity::is_unique_violation(&err) => {
                        self.keyed(key).await?.ok_or(err)
                    }
                    Err(err) => Err(err),
                }
            }};
        }
        match self {
            Ledger::Memory(memory) => {
                let mut memory = memory.lock().unwrap();
                let Memory { charges, keys } = &mut *memory;
                match keys.get(key) {
                    Some((hash, index, until)) if *until > now => Ok(Keyed {
                        charge: charges[*index].clone(),
                        request_hash: hash.clone(),
                    }),
                    _ => {
                        if let Some((_, index, _)) = keys.remove(key) {
                            charges[index].idempotency_key = None;
                        }
                        keys.insert(
                            key.to_owned(),
                            (request_hash.to_owned(), charges.len(), expires),
                        );
                        charges.push(charge.clone());
                        Ok(Keyed {
                            charge: charge.clone(),
                            request_hash: request_hash.to_owned(),
                        })
                    }
                }
            }
            #[cfg(feature = "postgres")]
            Ledger::Postgres(pool) => record!(pool),
            #[cfg(feature = "mysql")]
            Ledger::MySql(pool) => record!(pool),
        }
    }

    /// The charge made under `key`, while the key is kept.
    async fn keyed(&self, key: &str) -> Result<Option<Keyed>, sqlx::Error> {
        let now = now_millis();
        #[cfg(any(feature = "postgres", feature = "mysql"))]
        macro_rules! keyed {
            ($pool:expr) => {{
                let row: Option<KeyedRow> = sqlx::query_as(&self.sql(KEYED))
                    .bind(key)
                    .bind(now)
                    .fetch_optional($pool)
                    .await?;
                Ok(row.map(|row| Keyed {
                    charge: row.charge,
                    request_hash: row.request_hash,
                }))
            }};
        }
        match self {
            Ledger::Memory(memory) => {
                let memory = memory.lock().unwrap();
                Ok(memory
                    .keys
                    .get(key)
                    .filter(|(_, _, until)| *until > now)
                    .map(|(hash, index, _)| Keyed {
                        charge: memory.charges[*index].clone(),
                        request_hash: hash.clone(),
                    }))
            }
            #[cfg(feature = "postgres")]
            Ledger::Postgres(pool) => keyed!(pool),
            #[cfg(feature = "mysql")]
            Ledger::MySql(pool) => keyed!(pool),
        }
    }

    async fn charges(&self) -> Result<Vec<Charge>, sqlx::Error> {
        match self {
            Ledger::Memory(memory) => Ok(memory.lock().unwrap().charges.clone()),
            #[cfg(feature = "postgres")]
            Ledger::Postgres(pool) => sqlx::query_as(SELECT).fetch_all(pool).await,
            #[cfg(feature = "mysql")]
            Ledger::MySql(pool) => sqlx::query_as(SELECT).fetch_all(pool).await,
        }
    }
}

/// The fake gateway.
pub struct Gateway {
    latency: Duration,
    failure_rate: f64,
    ledger: Ledger,
    /// Charge requests answered with the charge their key already held.
    replayed: AtomicUsize,
    /// Lookups by key.
    looked_up: AtomicUsize,
}

impl Gateway {
    /// A gateway whose calls take `latency`, failing a `failure_rate`
    /// share of its charges, recording in `ledger`.
    pub fn new(latency: Duration, failure_rate: f64, ledger: Ledger) -> Gateway {
        Gateway {
            latency,
            failure_rate,
            ledger,
            replayed: AtomicUsize::new(0),
            looked_up: AtomicUsize::new(0),
        }
    }

    /// Charges the card under the idempotency key `key`, or answers the
    /// charge the key holds (same parameters), or refuses (other
    /// parameters), or fails without charging. The charge is recorded
    /// half way through the call: a caller that is gone by the answer has
    /// charged all the same.
    pub async fn charge(
        &self,
        key: &str,
        request: ChargeRequest<'_>,
    ) -> Result<Charge, GatewayError> {
        let half = self.latency / 2;
        tokio::time::sleep(half).await;
        let charged = if random_unit() < self.failure_rate {
            Err(GatewayError::Unavailable)
        } else {
            self.record(key, &request).await
        };
        tokio::time::sleep(self.latency - half).await;
        charged
    }

    async fn record(&self, key: &str, request: &ChargeRequest<'_>) -> Result<Charge, GatewayError> {
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
            idempotency_key: Some(key.to_owned()),
        };
        let hash = request.hash();
        let keyed = self.ledger.record(&charge, &hash).await?;
        let replayed = keyed.charge.id != charge.id;
        let answer = checked(keyed, &hash)?;
        if replayed {
            self.replayed.fetch_add(1, Ordering::Relaxed);
        }
        Ok(answer)
    }

    /// The charge made under `key` for `request`, if any, without charging:
    /// what [`charge`](Self::charge) would answer, short of charging.
    /// `None` when the key holds no charge (never used, or forgotten);
    /// [`GatewayError::KeyReused`] when it holds one for other parameters.
    pub async fn lookup(
        &self,
        key: &str,
        request: ChargeRequest<'_>,
    ) -> Result<Option<Charge>, GatewayError> {
        self.looked_up.fetch_add(1, Ordering::Relaxed);
        tokio::time::sleep(self.latency).await;
        match self.ledger.keyed(key).await? {
            Some(keyed) => checked(keyed, &request.hash()).map(Some),
            None => Ok(None),
        }
    }

    /// Every charge made, oldest first.
    pub async fn charges(&self) -> Result<Vec<Charge>, sqlx::Error> {
        self.ledger.charges().await
    }

    /// How many charge requests this instance answered with the charge
    /// their key already held: requests sent again after the service lost
    /// track of them, which the key, not the service, kept from charging.
    pub fn replayed(&self) -> usize {
        self.replayed.load(Ordering::Relaxed)
    }

    /// How many lookups this instance answered.
    pub fn looked_up(&self) -> usize {
        self.looked_up.load(Ordering::Relaxed)
    }
}

/// A key's charge, if the request is the one it was made for.
fn checked(keyed: Keyed, request_hash: &str) -> Result<Charge, GatewayError> {
    if keyed.request_hash == request_hash {
        Ok(keyed.charge)
    } else {
        Err(GatewayError::KeyReused)
    }
}
