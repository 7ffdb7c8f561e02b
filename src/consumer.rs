//! Exactly-once effects for at-least-once message consumers.
//!
//! Brokers (RabbitMQ, Kafka, SQS, NATS) deliver a message at least once: a
//! consumer that crashes after doing the work but before acknowledging gets
//! the same message again, and producers that retry a publish send it twice.
//! A [`Deduplicator`] runs a message's handler once per key and tells every
//! later delivery of that key that it is a [`Handled::Duplicate`], so the
//! consumer acknowledges it without doing the work again.
//!
//! It is the engine of `#[idempotent]` ([`run`] and [`run_in_transaction`])
//! under a consumer's names: the record is the "processed" marker, the
//! scope names the queue or handler, and the policy's ttl is how long
//! markers are kept.
//!
//! ## Keys
//!
//! - a natural id the message carries (`order_id`, an event id, the broker's
//!   message id): anything [`AsKey`], such as a `String` or an integer;
//! - when messages have none, their content. Key a JSON message by the
//!   bytes it arrived as, with [`content_key_of_json`]: the SHA-256 of its
//!   canonical JSON (object members sorted at every depth, see
//!   [`Fingerprint`]), so two encodings of one event, with their members
//!   in another order or other whitespace, are one message. That form is
//!   taken only when reading the text loses nothing: a message holding a
//!   number that a `serde_json::Value` cannot keep apart from its
//!   neighbours (an integer past 64 bits, a decimal with more digits than
//!   the double it reads as, such as `1.000000000000000001`), or an
//!   object naming a member twice, is keyed by the SHA-256 of its bytes
//!   as they are (in a domain of their own), so that two distinct
//!   messages never share a key; its copies are then one message only
//!   when they are the same bytes. Bytes that are not JSON are refused.
//!   Numbers are not brought to one form: `100`, `100.0` and `1e2` read
//!   as an integer and as floats, which are written back as `100` and
//!   `100.0`, so a relay that rewrites a number's form makes another
//!   message. Key such messages by an id, or by [`key_of`](crate::fingerprint::key_of)
//!   on the fields that identify them, parsed into their own types first.
//!
//! [`content_key`] keys any `Serialize` value by its canonical JSON: a
//! typed event, to make only the fields it models part of its identity.
//! Do not give it a `serde_json::Value` parsed from the message: the parse
//! has already merged distinct messages (`1.000000000000000001` and
//! `1.000000000000000002` read as one `f64`, and so do
//! `18446744073709551616` and `18446744073709551617`;
//! `{"to":"mallory","to":"alice"}` reads as `{"to":"alice"}`), and the
//! second of two such messages would be acknowledged as a
//! [`Handled::Duplicate`] without ever being processed. A value holding a
//! hash-ordered collection (a `HashSet`) must make it a `BTreeSet`, or
//! write it with [`unordered`](crate::fingerprint::unordered)
//! (`#[serde(serialize_with = "idem::fingerprint::unordered")]`): a
//! `HashSet` serializes in an order of its own, which differs from one
//! set to an equal one, so a redelivery would get another key and be
//! processed again. (A `HashMap` is safe: object members are sorted.)
//!
//! The message itself is fingerprinted too. A key that comes back with
//! another payload is [`Error::KeyReused`]: a producer bug to dead-letter
//! rather than a duplicate to drop silently. Pass `&()` as the message to
//! compare keys only, as a content key wants (the key already is the
//! content; the raw bytes as the message would make a copy re-encoded in
//! another member order a `KeyReused`).
//!
//! ## What the consumer does with the answer
//!
//! | [`process`](Deduplicator::process) returns | meaning | the consumer |
//! |---|---|---|
//! | `Ok(Handled::Processed(v))` | the handler ran for this delivery | acks |
//! | `Ok(Handled::Duplicate(v))` | processed before (`v` is that run's value); the handler did not run | acks |
//! | `Err(e)`, the handler's error | the marker was released: a redelivery runs the handler again | nacks with requeue (or dead-letters a poison message) |
//! | `Err(e)` from [`Error::InProgress`] | another consumer is processing the same message right now, past the wait bound | nacks with requeue, after a pause |
//! | `Err(e)` from [`Error::KeyReused`], [`Error::InvalidKey`] | the message cannot be processed as sent | dead-letters |
//! | `Err(e)` from [`Error::Store`] | the database failed before the handler ran (with [`process`](Deduplicator::process), a handler that ran always returns its value: its marker is stored with retries, in the background if it takes long); with [`process_in_transaction`](Deduplicator::process_in_transaction), storing the marker failed and the transaction, handler's rows included, is to be rolled back | nacks with requeue |
//!
//! [`Error::is_retryable`] tells the requeue cases from the dead-letter ones.
//!
//! ## Two ways to hold the marker
//!
//! [`process`](Deduplicator::process) keeps the marker in the store's own
//! table, beside effects anywhere (an email, an HTTP call, another
//! database). It closes every gap but one: a crash *after* the handler's
//! effect and *before* the marker is completed leaves the marker in
//! progress, and once its lease lapses the redelivery runs the handler again.
//! A `process` future dropped while its handler runs (a timeout put around
//! it, a consumer shut down) is the same gap, sooner: its marker is handed
//! back at once, for the redelivery to run the handler again. Run each
//! `process` to its end (on a task of its own, if the consumer may stop),
//! and bound the handler's own calls rather than `process`.
//!
//! [`process_in_transaction`](Deduplicator::process_in_transaction) closes
//! that gap for effects in the store's database: the marker is written on
//! the caller's open transaction, beside the handler's own rows, and commits
//! or rolls back with them. A handler that fails leaves neither marker nor
//! rows (the caller rolls back), so the redelivery processes the message
//! again; a handler whose transaction committed makes every redelivery a
//! duplicate, however late the crash came. Commit *before* acknowledging:
//! a crash between the two is then only a redelivery, answered `Duplicate`.
//!
//! ## Retention
//!
//! Markers are kept for [`Deduplicator::DEFAULT_RETENTION`] (14 days) unless
//! [`retention`](Deduplicator::retention) says otherwise, counted from the
//! claim and again from the completion. A duplicate can only arrive while
//! the broker still holds a copy or a producer still retries, so the
//! retention must outlast both; once a marker expires, its key is free and
//! a late copy is processed again. Expired markers are deleted like every
//! record, by [`Store::purge_expired`] (also [`Deduplicator::purge_expired`]).
//!
//! ## Example
//!
//! ```
//! use idem::consumer::{content_key_of_json, Deduplicator, Handled};
//! use idem::MemoryStore;
//! use serde::{Deserialize, Serialize};
//!
//! #[derive(Serialize, Deserialize)]
//! struct OrderPlaced { order_id: String, sku: String, quantity: u32 }
//!
//! /// The work: reserve the stock (here, just say how much).
//! async fn reserve(event: &OrderPlaced) -> Result<u32, idem::Error> {
//!     Ok(event.quantity)
//! }
//!
//! # tokio::runtime::Runtime::new().unwrap().block_on(async {
//! let orders = Deduplicator::new(MemoryStore::new(), "orders.reserve-stock");
//! let event = OrderPlaced { order_id: "o-1".into(), sku: "apple".into(), quantity: 3 };
//!
//! // The first delivery runs the handler...
//! let first = orders.process(&event.order_id, &event, reserve(&event)).await?;
//! assert_eq!(first, Handled::Processed(3));
//!
//! // ...a redelivery does not, and is acknowledged all the same.
//! let again = orders.process(&event.order_id, &event, reserve(&event)).await?;
//! assert_eq!(again, Handled::Duplicate(3));
//!
//! // Keyed by content, from the bytes received: the same event encoded in
//! // another member order is a duplicate...
//! let pears = Deduplicator::new(MemoryStore::new(), "pears.ship");
//! let first = br#"{"sku":"pear","qty":1}"#;
//! let copy = br#"{ "qty": 1, "sku": "pear" }"#;
//! let ship = || async { Ok::<_, idem::Error>(1) };
//! let key = content_key_of_json(first)?;
//! assert_eq!(pears.process(&key, &(), ship()).await?, Handled::Processed(1));
//! let key = content_key_of_json(copy)?;
//! assert_eq!(pears.process(&key, &(), ship()).await?, Handled::Duplicate(1));
//! // ...and messages that only a lossy parse would merge are not.
//! assert_ne!(
//!     content_key_of_json(br#"{"sku":"pear","qty":1.000000000000000001}"#)?,
//!     content_key_of_json(br#"{"sku":"pear","qty":1.000000000000000002}"#)?,
//! );
//! # Ok::<_, idem::Error>(())
//! # }).unwrap();
//! ```
//!
//! The `#[idempotent]` attribute of the `idem` crate works on a consumer's
//! handler too, with `key = event.order_id` or, since the key expression is
//! evaluated in the function, `key = idem::consumer::content_key_of_json(&body)?`
//! (with `fingerprint = ()`, as the key is the content); it does not say
//! whether the call was a duplicate, which `Deduplicator` does.

#[cfg(feature = "kafka")]
#[cfg_attr(docsrs, doc(cfg(feature = "kafka")))]
pub mod kafka;

use std::future::Future;
use std::sync::atomic::{AtomicBool, Ordering};
use std::time::Duration;

use serde::de::{DeserializeOwned, IgnoredAny};
use serde::Serialize;
use sha2::{Digest, Sha256};

use crate::engine::Call;
use crate::engine::{run, run_in_transaction};
use crate::policy::Policy;
use crate::store::{Store, TransactionalStore};
use idem_core::canonical;
use idem_core::error::Error;
use idem_core::fingerprint::Fingerprint;
use idem_core::key::{AsKey, Key, Scope};

/// The key of a message without a natural id, from the JSON bytes it
/// arrived as: the SHA-256 of its canonical JSON, as 64 lowercase hex
/// digits, when reading the text loses nothing; otherwise the SHA-256 of
/// the bytes themselves (see the [module documentation](self)). This is how
/// to key a JSON message by its content.
///
/// Two encodings of one message (members in another order, other
/// whitespace, other string escapes) get one key, the key [`content_key`]
/// gives the parsed `serde_json::Value`. A message holding a number that
/// such a value cannot hold exactly (an integer past 64 bits, a decimal
/// with more digits than the double it reads as), or an object that names
/// a member twice, is keyed by its bytes,
/// prefixed by a tag that starts no canonical text: distinct messages
/// never share a key, and copies of such a message share one only when
/// they are byte for byte the same.
///
/// # Errors
///
/// [`Error::Serialization`] when `message` is not one JSON text (as
/// `serde_json` reads it: UTF-8 without a byte order mark, whitespace
/// around it allowed), for the consumer to dead-letter
/// ([`Error::is_retryable`] is `false`). Key other formats by an id, or by
/// [`Fingerprint::of_bytes`]. A JSON text nested deeper than a
/// `serde_json::Value` is read (128 levels) is keyed by its bytes.
///
/// ```
/// use idem::consumer::content_key_of_json;
///
/// let key = content_key_of_json(br#"{"sku":"pear","qty":1}"#)?;
/// assert_eq!(key, content_key_of_json(b"{ \"qty\": 1, \"sku\": \"pear\" }\n")?);
/// // Kept apart, though a `serde_json::Value` reads them as one.
/// assert_ne!(
///     content_key_of_json(br#"{"to":"mallory","to":"alice"}"#)?,
///     content_key_of_json(br#"{"to":"alice"}"#)?,
/// );
/// assert!(content_key_of_json(b"not json").is_err());
/// # Ok::<_, idem::Error>(())
/// ```
pub fn content_key_of_json(message: &[u8]) -> Result<Key, Error> {
    if let Some(value) = canonical::exact_value(message) {
        return content_key(&value);
    }
    // Not read exactly: whether it is JSON at all, reading numbers of any
    // size.
    serde_json::from_slice::<IgnoredAny>(message)?;
    let digest = Sha256::new()
        .chain_update(RAW_JSON)
        .chain_update(message)
        .finalize();
    Ok(Key::new(Fingerprint::from_digest(digest.into()).to_hex())?)
}

/// What precedes the bytes of a JSON message keyed by its bytes: no JSON
/// text starts with NUL, and a canonical text marked by
/// [`Fingerprint`] (which starts with NUL) does not start with these bytes.
const RAW_JSON: &[u8] = b"\0raw-json\0";

/// The key of a message without a natural id: the SHA-256 of its canonical
/// JSON, as 64 lowercase hex digits (see the [module documentation](self)).
///
/// Pass the typed event to make the fields it models its identity. For a
/// JSON message keyed by all it holds, use [`content_key_of_json`] on the
/// bytes received, not this function on a `serde_json::Value` parsed from
/// them: the parse loses what tells some distinct messages apart (numbers
/// past 64 bits or past a double's digits, a member named twice), and the
/// second of two such messages would be acknowledged as a duplicate
/// without being processed.
///
/// A hash-ordered collection in `message` (a `HashSet`) must be a
/// `BTreeSet` or be written with
/// `#[serde(serialize_with = "idem::fingerprint::unordered")]`: otherwise
/// equal sets serialize in different orders, and a redelivery gets another
/// key (see [`unordered`](crate::fingerprint::unordered)).
pub fn content_key<M: Serialize + ?Sized>(message: &M) -> Result<Key, Error> {
    Ok(Key::new(Fingerprint::of(message)?.to_hex())?)
}

/// What [`Deduplicator::process`] did with a message. Either way the
/// message is done with: acknowledge it.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
pub enum Handled<T> {
    /// The handler ran for this delivery; here is its value.
    Processed(T),
    /// The message was processed before (by this consumer or another); the
    /// handler did not run. Here is the value of the run that processed it.
    Duplicate(T),
}

impl<T> Handled<T> {
    /// Whether the handler did not run because the message was processed
    /// before.
    pub fn is_duplicate(&self) -> bool {
        matches!(self, Handled::Duplicate(_))
    }

    /// The handler's value, from this run or the one that processed the
    /// message first.
    pub fn into_value(self) -> T {
        match self {
            Handled::Processed(value) | Handled::Duplicate(value) => value,
        }
    }

    /// A reference to the handler's value.
    pub fn value(&self) -> &T {
        match self {
            Handled::Processed(value) | Handled::Duplicate(value) => value,
        }
    }
}

/// Processes each message once per key, for one queue or handler: a
/// [`Store`], the scope the markers are kept under, and the policy (see the
/// [module documentation](self)).
///
/// Cheap to share: wrap it in an `Arc`, or build it on an `Arc` or a
/// reference to the store, for many consumer tasks.
///
/// ```
/// use idem::consumer::{Deduplicator, Handled};
/// use idem::MemoryStore;
///
/// # tokio::runtime::Runtime::new().unwrap().block_on(async {
/// let dedup = Deduplicator::new(MemoryStore::new(), "emails::welcome");
/// let message = serde_json::json!({"user": 7});
/// // The broker delivers the message twice: the handler runs once.
/// for delivery in 0..2 {
///     let handled = dedup
///         .process("msg-7f3a", &message, async { Ok::<_, idem::Error>("sent".to_owned()) })
///         .await
///         .unwrap();
///     match handled {
///         Handled::Processed(v) => assert_eq!((delivery, v.as_str()), (0, "sent")),
///         Handled::Duplicate(v) => assert_eq!((delivery, v.as_str()), (1, "sent")),
///     }
/// }
/// # });
/// ```
#[derive(Clone, Debug)]
pub struct Deduplicator<S> {
    store: S,
    scope: Scope,
    policy: Policy,
}

impl<S> Deduplicator<S> {
    /// How long markers are kept by default: 14 days.
    ///
    /// A duplicate arrives while the broker still holds a copy or a
    /// producer still retries. RabbitMQ redelivers unacknowledged messages
    /// when the consumer's channel closes, within seconds of a crash, but a
    /// queue may hold them for as long as consumers are down; SQS keeps a
    /// message up to 14 days (its longest retention), Kafka replays from a
    /// log kept 7 days by default. 14 days outlasts all of these, at the
    /// cost of one small row per message; set a shorter
    /// [`retention`](Self::retention) for a high-volume queue whose
    /// duplicates can only come from prompt redeliveries.
    pub const DEFAULT_RETENTION: Duration = Duration::from_secs(14 * 24 * 60 * 60);

    /// Markers kept in `store` under `scope` (the queue or handler name),
    /// for [`DEFAULT_RETENTION`](Self::DEFAULT_RETENTION), with the rest of
    /// the default [`Policy`]: a claim leased for 30 seconds, and a
    /// duplicate delivered while the first is processed waiting up to 5
    /// seconds for its outcome.
    pub fn new(store: S, scope: impl Into<Scope>) -> Self {
        Deduplicator {
            store,
            scope: scope.into(),
            policy: Policy::new().ttl(Self::DEFAULT_RETENTION),
        }
    }

    /// Keeps markers this long (see [`DEFAULT_RETENTION`](Self::DEFAULT_RETENTION)).
    pub fn retention(mut self, retention: Duration) -> Self {
        self.policy.ttl = retention;
        self
    }

    /// Sets the policy: `lease` is how long a handler may run before a
    /// redelivery may take the message over (outside a transaction),
    /// `in_progress` what a concurrent duplicate does, and `ttl` the
    /// retention, unless it is [`Policy`]'s default (24 hours, what
    /// [`Policy::new`] carries): the retention then stays as it is
    /// ([`DEFAULT_RETENTION`](Self::DEFAULT_RETENTION), or what
    /// [`retention`](Self::retention) set, before or after), so that a
    /// policy set for its lease does not cut the markers' life to a day.
    pub fn policy(mut self, policy: Policy) -> Self {
        let retention = match policy.ttl {
            Policy::DEFAULT_TTL => self.policy.ttl,
            ttl => ttl,
        };
        self.policy = Policy {
            ttl: retention,
            ..policy
        };
        self
    }

    /// The store.
    pub fn store(&self) -> &S {
        &self.store
    }

    /// The scope the markers are kept under.
    pub fn scope(&self) -> &Scope {
        &self.scope
    }

    fn call<K, M>(&self, key: &K, message: &M) -> Call
    where
        K: AsKey + ?Sized,
        M: Serialize + ?Sized,
    {
        Call::new(&self.scope, key, message).with_policy(self.policy)
    }

    /// Runs `handler` unless the message with `key` was processed before,
    /// keeping the marker in the store's own table.
    ///
    /// The handler's `Ok` value is stored with the marker and handed to
    /// every duplicate. A handler error releases the marker and is
    /// returned: nack the message so that its redelivery processes it
    /// again. `message` is fingerprinted: the same key with another message
    /// is [`Error::KeyReused`]. See the [module documentation](self) for
    /// every answer and the one gap that
    /// [`process_in_transaction`](Self::process_in_transaction) closes.
    pub async fn process<K, M, T, E, Fut>(
        &self,
        key: &K,
        message: &M,
        handler: Fut,
    ) -> Result<Handled<T>, E>
    where
        S: Store,
        K: AsKey + ?Sized,
        M: Serialize + ?Sized,
        T: Serialize + DeserializeOwned,
        E: From<Error>,
        Fut: Future<Output = Result<T, E>>,
    {
        // The engine polls the body only when it claimed the key; a
        // duplicate's body is dropped unpolled.
        let ran = AtomicBool::new(false);
        let value = run(&self.store, self.call(key, message), async {
            ran.store(true, Ordering::Relaxed);
            handler.await
        })
        .await?;
        Ok(handled(ran.load(Ordering::Relaxed), value))
    }

    /// Like [`process`](Self::process), but the marker is written on
    /// `conn`, the caller's open transaction, where the handler writes its
    /// own rows: both commit or roll back together.
    ///
    /// The handler borrows the connection and hands it back with its
    /// result: `|tx| async move { let r = ...; (r, tx) }`. The caller
    /// commits on `Ok` (a `Duplicate` has nothing to commit, but committing
    /// is harmless) and then acknowledges; on `Err` it rolls back and nacks.
    /// A concurrent duplicate blocks on the marker's UNIQUE index until the
    /// first transaction ends, then is a `Duplicate` (or runs, if the first
    /// rolled back).
    pub async fn process_in_transaction<'c, C, K, M, T, E, F, Fut>(
        &self,
        conn: &'c mut C,
        key: &K,
        message: &M,
        handler: F,
    ) -> Result<Handled<T>, E>
    where
        S: TransactionalStore<C>,
        C: Send + ?Sized,
        K: AsKey + ?Sized,
        M: Serialize + ?Sized,
        T: Serialize + DeserializeOwned,
        E: From<Error>,
        F: FnOnce(&'c mut C) -> Fut,
        Fut: Future<Output = (Result<T, E>, &'c mut C)>,
    {
        // The engine calls the handler only when it claimed the key.
        let ran = AtomicBool::new(false);
        let value = run_in_transaction(&self.store, conn, self.call(key, message), |conn| {
            ran.store(true, Ordering::Relaxed);
            handler(conn)
        })
        .await?;
        Ok(handled(ran.load(Ordering::Relaxed), value))
    }

    /// Deletes the expired markers (and every other expired record of the
    /// store's table), at most `batch` per statement; see
    /// [`Store::purge_expired`]. Run it periodically.
    pub async fn purge_expired(&self, batch: usize) -> Result<u64, Error>
    where
        S: Store,
    {
        self.store.purge_expired(batch).await
    }
}

fn handled<T>(ran: bool, value: T) -> Handled<T> {
    if ran {
        Handled::Processed(value)
    } else {
        Handled::Duplicate(value)
    }
}

#[cfg(test)]
mod tests {
    use std::sync::atomic::AtomicUsize;
    use std::sync::Arc;

    use serde_json::json;

    use super::*;
    use crate::store::MemoryStore;
    use idem_core::record::State;

    #[derive(Debug, PartialEq)]
    enum Failure {
        Handler,
        Idem(String),
    }

    impl From<Error> for Failure {
        fn from(err: Error) -> Self {
            Failure::Idem(err.to_string())
        }
    }

    #[test]
    fn content_key_is_the_canonical_digest_in_hex() {
        let a: serde_json::Value =
            serde_json::from_str(r#"{"order":{"id":7,"lines":[{"sku":"a","qty":2}]},"v":1}"#)
                .unwrap();
        let b: serde_json::Value = serde_json::from_str(
            r#"{ "v": 1, "order": { "lines": [ { "qty": 2, "sku": "a" } ], "id": 7 } }"#,
        )
        .unwrap();
        let key = content_key(&a).unwrap();
        assert_eq!(key, content_key(&b).unwrap());
        assert_eq!(key.as_str(), Fingerprint::of(&a).unwrap().to_hex());
        assert_eq!(key.as_str().len(), 64);
        // Array order and values are part of the content.
        assert_ne!(key, content_key(&json!({"order": {"id": 8}})).unwrap());
        assert_ne!(
            content_key(&json!([1, 2])).unwrap(),
            content_key(&json!([2, 1])).unwrap()
        );
    }

    #[test]
    fn content_key_of_json_is_the_content_key_of_what_reads_exactly() {
        let a = br#"{"order":{"id":7,"lines":[{"sku":"a","qty":2.5}]},"v":"\u0065"}"#;
        let b = b"{ \"v\": \"e\", \"order\": { \"lines\": [ { \"qty\": 2.5, \"sku\": \"a\" } ], \"id\": 7 } }\n";
        let key = content_key_of_json(a).unwrap();
        assert_eq!(key, content_key_of_json(b).unwrap());
        let value: serde_json::Value = serde_json::from_slice(a).unwrap();
        assert_eq!(key, content_key(&value).unwrap());
        assert_ne!(key, content_key_of_json(br#"{"order":{"id":8}}"#).unwrap());
        assert_ne!(
            content_key_of_json(b"[1,2]").unwrap(),
            content_key_of_json(b"[2,1]").unwrap()
        );
    }

    #[test]
    fn content_key_of_json_keeps_apart_what_a_value_merges() {
        let pairs: [(&[u8], &[u8]); 5] = [
            (
                br#"{"amount":1.000000000000000001}"#,
                br#"{"amount":1.000000000000000002}"#,
            ),
            (
                br#"{"id":18446744073709551616}"#,
                br#"{"id":18446744073709551617}"#,
            ),
            (br#"{"to":"mallory","to":"alice"}"#, br#"{"to":"alice"}"#),
            (
                br#"{"to":"alice","to":"mallory"}"#,
                br#"{"to":"mallory","to":"alice"}"#,
            ),
            (b"[1e400]", b"[2e400]"),
        ];
        for (a, b) in pairs {
            let (key_a, key_b) = (
                content_key_of_json(a).unwrap(),
                content_key_of_json(b).unwrap(),
            );
            assert_ne!(key_a, key_b, "{}", String::from_utf8_lossy(a));
            // The same bytes, the same key.
            assert_eq!(key_a, content_key_of_json(a).unwrap());
            // Keyed by the bytes, in a domain of their own.
            assert_ne!(key_a.as_str(), Fingerprint::of_bytes(a).to_hex());
        }
    }

    #[test]
    fn content_key_of_json_refuses_what_is_not_json() {
        for bytes in [
            &b"not json"[..],
            b"",
            b"{",
            b"{\"a\":1} x",
            b"[1,]",
            b"\xef\xbb\xbf{}",
        ] {
            let err = content_key_of_json(bytes).unwrap_err();
            assert!(matches!(err, Error::Serialization(_)), "{err:?}");
            assert!(!err.is_retryable());
        }
        // Nested deeper than a `Value` is read: keyed by its bytes, and no
        // stack overflow.
        let deep = format!("{}{}", "[".repeat(100_000), "]".repeat(100_000));
        let key = content_key_of_json(deep.as_bytes()).unwrap();
        assert_eq!(key, content_key_of_json(deep.as_bytes()).unwrap());
        assert_ne!(
            key,
            content_key_of_json(format!(" {deep}").as_bytes()).unwrap()
        );
    }

    #[tokio::test]
    async fn processed_once_then_duplicates_with_the_first_value() {
        let dedup = Deduplicator::new(MemoryStore::new(), "q");
        let runs = AtomicUsize::new(0);
        let handler = || async { Ok::<_, Failure>(runs.fetch_add(1, Ordering::SeqCst) + 1) };
        let first = dedup.process("m-1", &"body", handler()).await.unwrap();
        assert_eq!(first, Handled::Processed(1));
        assert!(!first.is_duplicate());
        for _ in 0..3 {
            let again = dedup.process("m-1", &"body", handler()).await.unwrap();
            assert_eq!(again, Handled::Duplicate(1));
            assert!(again.is_duplicate());
            assert_eq!(again.into_value(), 1);
        }
        assert_eq!(runs.load(Ordering::SeqCst), 1);
        // Another key, another scope: processed.
        let other = dedup.process("m-2", &"body", handler()).await.unwrap();
        assert_eq!(other, Handled::Processed(2));
        let elsewhere = Deduplicator::new(dedup.store().clone(), "another-queue");
        let other = elsewhere.process("m-1", &"body", handler()).await.unwrap();
        assert_eq!(*other.value(), 3);
    }

    #[tokio::test]
    async fn a_failed_handler_leaves_no_marker_and_the_redelivery_runs() {
        let dedup = Deduplicator::new(MemoryStore::new(), "q");
        let failed = dedup
            .process("m", &1, async { Err::<u8, _>(Failure::Handler) })
            .await;
        assert_eq!(failed, Err(Failure::Handler));
        let key = Key::new("m").unwrap();
        assert!(dedup
            .store()
            .get(dedup.scope(), &key)
            .await
            .unwrap()
            .is_none());
        let redelivered = dedup
            .process("m", &1, async { Ok::<_, Failure>(7u8) })
            .await;
        assert_eq!(redelivered, Ok(Handled::Processed(7)));
    }

    #[tokio::test]
    async fn the_same_key_with_another_message_is_key_reused() {
        let dedup = Deduplicator::new(MemoryStore::new(), "q");
        let ok = |v: u8| async move { Ok::<_, Failure>(v) };
        dedup
            .process(&42u64, &json!({"qty": 1}), ok(1))
            .await
            .unwrap();
        let err = dedup
            .process(&42u64, &json!({"qty": 2}), ok(2))
            .await
            .unwrap_err();
        assert_eq!(err, Failure::Idem(Error::KeyReused.to_string()));
        // Keys alone, when the message is `()`.
        dedup.process(&43u64, &(), ok(1)).await.unwrap();
        let again = dedup.process(&43u64, &(), ok(2)).await.unwrap();
        assert_eq!(again, Handled::Duplicate(1));
    }

    #[tokio::test]
    async fn concurrent_duplicates_run_the_handler_once() {
        let dedup = Arc::new(Deduplicator::new(MemoryStore::new(), "q"));
        let runs = Arc::new(AtomicUsize::new(0));
        let tasks: Vec<_> = (0..16)
            .map(|_| {
                let (dedup, runs) = (dedup.clone(), runs.clone());
                tokio::spawn(async move {
                    dedup
                        .process("storm", &"body", async {
                            runs.fetch_add(1, Ordering::SeqCst);
                            tokio::time::sleep(Duration::from_millis(20)).await;
                            Ok::<_, Failure>(())
                        })
                        .await
                        .unwrap()
                })
            })
            .collect();
        let mut duplicates = 0;
        for task in tasks {
            duplicates += usize::from(task.await.unwrap().is_duplicate());
        }
        assert_eq!((runs.load(Ordering::SeqCst), duplicates), (1, 15));
    }

    #[tokio::test]
    async fn markers_are_kept_for_the_retention_then_purged() {
        let dedup = Deduplicator::new(MemoryStore::new(), "q");
        assert!(Deduplicator::<()>::DEFAULT_RETENTION > Duration::from_secs(7 * 24 * 3600));
        let kept = Deduplicator::new(dedup.store().clone(), "q");
        let short =
            Deduplicator::new(dedup.store().clone(), "q").retention(Duration::from_millis(50));
        let ok = || async { Ok::<_, Failure>(()) };
        kept.process("long", &(), ok()).await.unwrap();
        short.process("short", &(), ok()).await.unwrap();
        let record = kept
            .store()
            .get(kept.scope(), &Key::new("long").unwrap())
            .await
            .unwrap()
            .unwrap();
        assert_eq!(record.state, State::Completed);
        let kept_for = record.expires_at - record.created_at;
        assert!(kept_for >= 14 * 24 * 3600 * 1000 - 1_000, "{kept_for}");

        tokio::time::sleep(Duration::from_millis(80)).await;
        assert_eq!(short.purge_expired(100).await.unwrap(), 1);
        let store = short.store();
        assert!(store
            .get(short.scope(), &Key::new("short").unwrap())
            .await
            .unwrap()
            .is_none());
        // Once its marker is gone, a late copy is processed again.
        let late = short.process("short", &(), ok()).await.unwrap();
        assert_eq!(late, Handled::Processed(()));
        assert_eq!(
            kept.process("long", &(), ok()).await.unwrap(),
            Handled::Duplicate(())
        );
    }
}
