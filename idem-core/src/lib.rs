//! The engine, record state machine and stores behind the
//! [`idem`](https://docs.rs/idem) crate. Use `idem`, which re-exports all of
//! this together with the `#[idempotent]` attribute.
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
