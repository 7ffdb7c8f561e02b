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
//! Start with the payments recipe of the
//! [README](https://github.com/idem-rs/idem#the-payments-recipe), a
//! service that stays safe across a crash, then [the guide](_guide): the
//! modes, durable steps, the HTTP layer, consumers, stores and operating.
//! The modules below are the reference.
#![warn(missing_docs, unreachable_pub)]
#![cfg_attr(docsrs, feature(doc_cfg))]

pub mod _guide;
pub mod admin;
pub mod consumer;
pub mod engine;
#[cfg(feature = "_sql")]
#[cfg_attr(
    docsrs,
    doc(cfg(any(feature = "sqlite", feature = "postgres", feature = "mysql")))
)]
pub mod entity;
/// What `#[idempotent]` and `#[derive(Entity)]` expand to. Not a public
/// API: it may change in any release.
#[doc(hidden)]
pub mod expansion;
pub use idem_core::fingerprint;
#[cfg(feature = "http")]
#[cfg_attr(docsrs, doc(cfg(feature = "http")))]
pub mod http;
pub use idem_core::journal;
pub use idem_core::key;
pub mod metrics;
#[cfg(feature = "_sql")]
#[cfg_attr(
    docsrs,
    doc(cfg(any(feature = "sqlite", feature = "postgres", feature = "mysql")))
)]
pub mod outbox;
mod policy;
pub use idem_core::record;
pub mod steps;
pub mod store;
#[cfg(feature = "testing")]
#[cfg_attr(docsrs, doc(cfg(feature = "testing")))]
pub mod testing;
mod tracked;

// The root holds what an application names; what a store author needs
// is under `store`, `record`, `journal`, `fingerprint` and `key`.
pub use engine::{run, run_in_transaction, Call};
#[cfg(feature = "_sql")]
#[cfg_attr(
    docsrs,
    doc(cfg(any(feature = "sqlite", feature = "postgres", feature = "mysql")))
)]
pub use entity::{Entity, TokenEntity};
pub use idem_core::{AsKey, Error, Fingerprint, Key, KeyError, Scope};
pub use policy::{InProgressPolicy, Policy};
#[cfg(feature = "redis")]
#[cfg_attr(docsrs, doc(cfg(feature = "redis")))]
pub use store::redis::RedisStore;
#[cfg(feature = "mysql")]
#[cfg_attr(docsrs, doc(cfg(feature = "mysql")))]
pub use store::sql::mysql::MySqlStore;
#[cfg(feature = "postgres")]
#[cfg_attr(docsrs, doc(cfg(feature = "postgres")))]
pub use store::sql::postgres::PostgresStore;
#[cfg(feature = "sqlite")]
#[cfg_attr(docsrs, doc(cfg(feature = "sqlite")))]
pub use store::sql::sqlite::SqliteStore;
pub use store::{CachedStore, MemoryStore, PassThroughStore, Store};
pub use tracked::Tracked;

// The attribute's documentation is the macro crate's: one introduction,
// its options and its expansion, shown here inline.
#[doc(inline)]
pub use idem_macros::idempotent;

#[cfg(any(feature = "sqlite", feature = "postgres", feature = "mysql"))]
#[cfg_attr(
    docsrs,
    doc(cfg(any(feature = "sqlite", feature = "postgres", feature = "mysql")))
)]
#[doc(inline)]
pub use idem_macros::Entity;

/// The README's examples, compiled and run as doctests.
#[cfg(doctest)]
#[doc = include_str!("../README.md")]
pub struct ReadmeDoctests;
