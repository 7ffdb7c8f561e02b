//! Make retried operations safe.
//!
//! Networks lose responses, brokers redeliver, clients time out and retry.
//! `idem` makes the effect of an operation happen once per idempotency key
//! and gives every retry the original answer back.
//!
//! ```
//! use idem::{idempotent, SqliteStore};
//! use serde::{Deserialize, Serialize};
//!
//! #[derive(Serialize, Deserialize)]
//! struct ChargeCommand { token: String, amount: u64 }
//!
//! #[derive(Clone, Debug, PartialEq, Serialize, Deserialize)]
//! struct Receipt { amount: u64 }
//!
//! #[derive(Debug)]
//! enum PaymentError { Idem(idem::Error) }
//! impl From<idem::Error> for PaymentError {
//!     fn from(e: idem::Error) -> Self { PaymentError::Idem(e) }
//! }
//!
//! struct Payments { store: SqliteStore }
//!
//! impl Payments {
//!     #[idempotent(key = cmd.token, store = self.store)]
//!     async fn charge(&self, cmd: ChargeCommand) -> Result<Receipt, PaymentError> {
//!         // Runs once per token; retries get this receipt back.
//!         Ok(Receipt { amount: cmd.amount })
//!     }
//! }
//!
//! # tokio::runtime::Runtime::new().unwrap().block_on(async {
//! let payments = Payments { store: SqliteStore::connect("sqlite::memory:").await.unwrap() };
//! let first = payments.charge(ChargeCommand { token: "k1".into(), amount: 500 }).await.unwrap();
//! let retry = payments.charge(ChargeCommand { token: "k1".into(), amount: 500 }).await.unwrap();
//! assert_eq!(first, retry);
//! # });
//! ```
//!
//! See the [README](https://github.com/idem-rs/idem) for the whole picture:
//! the state machine, the stores and the policies.
#![warn(missing_docs, unreachable_pub)]
#![cfg_attr(docsrs, feature(doc_cfg))]

pub mod consumer;
pub mod engine;
#[cfg(feature = "_sql")]
#[cfg_attr(
    docsrs,
    doc(cfg(any(feature = "sqlite", feature = "postgres", feature = "mysql")))
)]
pub mod entity;
mod error;
pub mod fingerprint;
#[cfg(feature = "http")]
#[cfg_attr(docsrs, doc(cfg(feature = "http")))]
pub mod http;
mod key;
pub mod metrics;
mod policy;
pub mod record;
pub mod store;
#[cfg(feature = "testing")]
#[cfg_attr(docsrs, doc(cfg(feature = "testing")))]
pub mod testing;

pub use engine::{
    run, run_in_transaction, run_in_transaction_replaying, run_replaying, run_with_codec, Call,
    Codec,
};
#[cfg(feature = "_sql")]
#[cfg_attr(
    docsrs,
    doc(cfg(any(feature = "sqlite", feature = "postgres", feature = "mysql")))
)]
pub use entity::{is_unique_violation, Entity, EntityBind, TokenEntity};
pub use error::Error;
pub use fingerprint::Fingerprint;
pub use key::{AsKey, Key, KeyError, Scope, MAX_KEY_LEN, MAX_SCOPE_LEN};
pub use policy::{InProgressPolicy, Policy};
pub use record::{Begin, Claim, ClaimToken, Outcome, OutcomeKind, Record, State};
#[cfg(feature = "mysql")]
#[cfg_attr(docsrs, doc(cfg(feature = "mysql")))]
pub use store::MySqlStore;
#[cfg(feature = "postgres")]
#[cfg_attr(docsrs, doc(cfg(feature = "postgres")))]
pub use store::PostgresStore;
#[cfg(feature = "sqlite")]
#[cfg_attr(docsrs, doc(cfg(feature = "sqlite")))]
pub use store::SqliteStore;
pub use store::{BeginRequest, MemoryStore, Store, TransactionalStore};

/// Makes an `async fn` idempotent: *find by key, or execute and save*.
///
/// ```text
/// #[idempotent(
///     key = <expr>,            // required: the client's key (str, String, Key, integer, Option of those)
///     store = <expr>,          // required: any idem::Store (also Arc<S>, &S)
///     scope = <expr>,          // default: module path + function name
///     ttl = "24h",             // how long the record is kept
///     lease = "30s",           // how long a claim is held before takeover
///     wait = "5s" | fail_fast, // what a duplicate does while the first call runs
///     fingerprint = <expr>,    // default: all arguments but the receiver
///     replayable = <Fn(&E) -> bool>, // errors stored and replayed like results
///     tx = <argument>,         // transactional mode: claim and completion on that transaction
///     entity,                  // entity mode: `store` is a sqlx pool, the body's entity is the record
/// )]
/// ```
///
/// The function must return `Result<T, E>` with `T: Serialize +
/// DeserializeOwned` and `E: From<idem::Error>`. The first call with a key
/// runs the body and stores its `Ok` value; later calls with that key (and
/// the same payload) return the stored value without running the body;
/// concurrent duplicates wait for it. See [`run`] for the flow.
#[doc(inline)]
pub use idem_macros::idempotent;

#[cfg(any(feature = "sqlite", feature = "postgres", feature = "mysql"))]
#[cfg_attr(
    docsrs,
    doc(cfg(any(feature = "sqlite", feature = "postgres", feature = "mysql")))
)]
#[doc(inline)]
pub use idem_macros::Entity;

/// What `#[idempotent]` expands to. Not a public API: it may change in any
/// release.
#[doc(hidden)]
pub mod __private {
    pub use crate::engine::{run, run_in_transaction, run_in_transaction_replaying, run_replaying};
    pub use crate::{AsKey, Call, Error, Fingerprint, Key, KeyError, Policy, Scope};
    pub use ::core::time::Duration;

    #[cfg(any(feature = "sqlite", feature = "postgres", feature = "mysql"))]
    pub use crate::entity::{
        run as run_entity, sqlx, Entity, EntityBind, RequestHash, TokenEntity,
    };

    /// Validates the key expression's value.
    pub fn key<K: AsKey + ?Sized>(key: &K) -> Result<Key, Error> {
        key.to_key().map_err(Error::from)
    }

    /// Fingerprints the payload expression's value.
    pub fn fingerprint<T: serde::Serialize + ?Sized>(payload: &T) -> Result<Fingerprint, Error> {
        Fingerprint::of(payload)
    }

    /// Converts the scope expression's value.
    pub fn scope(scope: impl Into<Scope>) -> Scope {
        scope.into()
    }
}

/// The README's examples, compiled and run as doctests.
#[cfg(doctest)]
#[doc = include_str!("../README.md")]
pub struct ReadmeDoctests;
