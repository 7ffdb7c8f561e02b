//! The store contract of [idem](https://docs.rs/idem): what a store
//! author needs, and nothing an application needs.
//!
//! - [`store`]: the [`Store`](store::Store) trait (the record
//!   transitions: claim, peek, renew, complete, release, get, forget,
//!   purge), the [`Journal`](store::Journal) of durable steps, and the
//!   optional parts a store may offer ([`Capabilities`](store::Capabilities):
//!   waking, answers without waiting, an owned handle);
//! - [`record`] and [`journal`]: what a store keeps and answers, and the
//!   one place where a stored record or step is turned into a decision
//!   ([`record::decide`], [`journal::decide_step`]);
//! - [`Key`], [`Scope`] and [`Fingerprint`]: what records are keyed and
//!   compared by;
//! - [`testing`] (feature `testing`): the contract conformance suite, for
//!   the tests of a store.
//!
//! An application depends on `idem`, which re-exports all of this and
//! adds the engine, the built-in stores, the HTTP layer and the
//! consumers. A store written outside `idem` depends on this crate alone:
//! `idem-core/tests/user_store.rs` is one, in under 150 lines, that passes
//! the conformance suite.
#![warn(missing_docs, unreachable_pub)]
#![cfg_attr(docsrs, feature(doc_cfg))]

pub mod canonical;
pub mod error;
pub mod fingerprint;
pub mod journal;
pub mod key;
pub mod record;
pub mod store;
#[cfg(feature = "testing")]
#[cfg_attr(docsrs, doc(cfg(feature = "testing")))]
pub mod testing;

pub use error::Error;
pub use fingerprint::{key_of, Fingerprint, HashedKey};
pub use key::{AsKey, Displayed, Key, KeyError, Scope, MAX_KEY_LEN, MAX_SCOPE_LEN};
