//! Kafka consumers: keys read off a Kafka record, and the offset committed
//! only after the effect.
//!
//! A Kafka consumer acknowledges by committing its partition's offset, and
//! a consumer that dies (or loses its partition in a rebalance) after the
//! effect and before that commit has the record delivered again, to itself
//! or to the partition's next owner. Deduplicated with
//! [`Deduplicator::process_in_transaction`](super::Deduplicator::process_in_transaction),
//! that redelivery is a [`Handled::Duplicate`](super::Handled::Duplicate):
//!
//! 1. [`identify`] the record: its key, by a header, a member of its JSON
//!    payload, or its content ([`KeyFrom`]), and what is fingerprinted;
//! 2. open a transaction on the store's database, and
//!    `process_in_transaction(&mut tx, id.key(), id.message(), handler)`:
//!    the handler's rows and the marker are written on it;
//! 3. commit the transaction;
//! 4. only then [`commit_offset`] (synchronously).
//!
//! | what went wrong | what to do |
//! |---|---|
//! | [`identify`] refused the record ([`MessageError`]) | it can never be processed as sent: dead-letter it, then commit its offset |
//! | the handler failed or [`Error::is_retryable`] | roll back, then [`redeliver`]: the record is read again from its offset |
//! | [`Error::KeyReused`] | roll back, dead-letter, commit its offset |
//! | [`commit_offset`] failed | nothing to undo: the effect is committed, and the next owner of the partition gets a `Duplicate` |
//!
//! A crash anywhere is safe: before step 3 nothing was kept and the record
//! comes back; after it, the record comes back as a `Duplicate` whose offset
//! is then committed. Committing offsets asynchronously, or letting the
//! client commit them on a timer (`enable.auto.commit`, Kafka's default),
//! is safe too for the effects, since the marker holds whatever the offsets
//! say, but an automatic commit can run ahead of a record that then fails
//! and is lost to this consumer: set `enable.auto.commit=false`.
//!
//! The record key (the one Kafka partitions by) is usually the entity's id
//! (an order), shared by all of its events, so it is not offered as the
//! idempotency key: key by an event id header or member, or by content.
//!
//! ```no_run
//! use idem::consumer::kafka::{commit_offset, identify, redeliver, KeyFrom};
//! use idem::consumer::Deduplicator;
//! use idem::SqliteStore;
//! use rdkafka::consumer::{Consumer, StreamConsumer};
//! use rdkafka::ClientConfig;
//!
//! # async fn charge(tx: &mut sqlx::SqliteConnection, payload: &[u8]) -> Result<(), idem::Error> { Ok(()) }
//! # async fn dead_letter(record: &rdkafka::message::BorrowedMessage<'_>) {}
//! #[tokio::main]
//! async fn main() -> Result<(), Box<dyn std::error::Error>> {
//!     let store = SqliteStore::connect("sqlite://payments.db").await?;
//!     let payments = Deduplicator::new(store.clone(), "payments.charge");
//!     let by_event_id = KeyFrom::header("event-id")?;
//!     let consumer: StreamConsumer = ClientConfig::new()
//!         .set("bootstrap.servers", "127.0.0.1:9092")
//!         .set("group.id", "payments")
//!         .set("enable.auto.commit", "false")
//!         .create()?;
//!     consumer.subscribe(&["payment.requested"])?;
//!     loop {
//!         let record = consumer.recv().await?;
//!         let id = match identify(&record, &by_event_id) {
//!             Ok(id) => id,
//!             Err(_) => {
//!                 dead_letter(&record).await;
//!                 commit_offset(&consumer, &record)?;
//!                 continue;
//!             }
//!         };
//!         let payload = record.payload().unwrap_or_default();
//!         let mut tx = store.pool().begin_with("BEGIN IMMEDIATE").await?;
//!         let handled = payments
//!             .process_in_transaction(&mut tx, id.key(), id.message(), |tx| async move {
//!                 (charge(tx, payload).await, tx)
//!             })
//!             .await;
//!         match handled {
//!             Ok(_) => {
//!                 tx.commit().await?;
//!                 // Only now: a crash before this line redelivers the
//!                 // record, and it is then a duplicate.
//!                 if let Err(err) = commit_offset(&consumer, &record) {
//!                     eprintln!("offset not committed ({err}): the next owner sees a duplicate");
//!                 }
//!             }
//!             Err(_) => {
//!                 tx.rollback().await?;
//!                 redeliver(&consumer, &record)?;
//!             }
//!         }
//!     }
//! }
//! # use rdkafka::Message;
//! ```

use std::time::Duration;

#[cfg(feature = "_sql")]
#[cfg_attr(
    docsrs,
    doc(cfg(any(feature = "sqlite", feature = "postgres", feature = "mysql")))
)]
pub mod transactions;

use rdkafka::consumer::{CommitMode, Consumer, ConsumerContext};
use rdkafka::error::KafkaResult;
use rdkafka::message::{BorrowedMessage, Headers, Message};
use rdkafka::{Offset, TopicPartitionList};
use serde::Serialize;

use super::content_key_of_json;
use idem_core::canonical;
use idem_core::error::Error;
use idem_core::fingerprint::Fingerprint;
use idem_core::key::{Key, KeyError};

/// Where a Kafka record's idempotency key comes from.
///
/// ```
/// use idem::consumer::kafka::KeyFrom;
///
/// let by_header = KeyFrom::header("event-id")?;
/// let by_member = KeyFrom::field("order_id")?;
/// let by_content = KeyFrom::content();
/// assert!(KeyFrom::header("").is_err());
/// # Ok::<_, idem::Error>(())
/// ```
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct KeyFrom(Source);

#[derive(Clone, Debug, PartialEq, Eq)]
enum Source {
    Header(String),
    Field(String),
    Content,
}

impl KeyFrom {
    /// The value of the record's header `name`, as the key (visible ASCII,
    /// 1 to 255 bytes, as every key). The payload is fingerprinted: the
    /// same id with another payload is [`Error::KeyReused`].
    ///
    /// # Errors
    ///
    /// [`Error::Config`] when `name` is empty.
    pub fn header(name: impl Into<String>) -> Result<Self, Error> {
        let name = name.into();
        if name.is_empty() {
            return Err(Error::Config("a Kafka header's name is empty".to_owned()));
        }
        Ok(KeyFrom(Source::Header(name)))
    }

    /// The member `name` of the record's payload, a JSON object: a string
    /// is the key as it is, an integer its decimal digits. The payload is
    /// fingerprinted, as with [`header`](Self::header).
    ///
    /// # Errors
    ///
    /// [`Error::Config`] when `name` is empty.
    pub fn field(name: impl Into<String>) -> Result<Self, Error> {
        let name = name.into();
        if name.is_empty() {
            return Err(Error::Config(
                "a Kafka payload member's name is empty".to_owned(),
            ));
        }
        Ok(KeyFrom(Source::Field(name)))
    }

    /// The record's JSON payload, by [`content_key_of_json`]: copies of one
    /// event written with their members in another order or other
    /// whitespace are one record.
    pub fn content() -> Self {
        KeyFrom(Source::Content)
    }
}

/// Why a record has no idempotency key: it cannot be processed as sent, by
/// any consumer. Dead-letter it and commit its offset.
#[derive(Debug, thiserror::Error)]
#[non_exhaustive]
pub enum MessageError {
    /// The record has no header of this name.
    #[error("the record has no {0:?} header")]
    MissingHeader(String),
    /// The record carries the header several times, with different values.
    #[error("the record carries the {0:?} header several times, with different values")]
    AmbiguousHeader(String),
    /// The record has no payload (a tombstone), where its key or its
    /// fingerprint is read from the payload.
    #[error("the record has no payload")]
    NoPayload,
    /// The payload is not one JSON text, where the key is read from it.
    #[error("the record's payload is not JSON: {0}")]
    NotJson(#[source] serde_json::Error),
    /// The payload is not a JSON object with this member.
    #[error("the record's payload has no {0:?} member")]
    MissingField(String),
    /// The member is neither a string nor an integer.
    #[error("the record's {0:?} member is neither a string nor an integer")]
    NotAnId(String),
    /// The id is no valid key (empty, too long, not visible ASCII).
    #[error("the record's id is no valid key: {0}")]
    InvalidKey(#[source] KeyError),
}

impl From<MessageError> for Error {
    /// As an [`Error::InvalidKey`], or an [`Error::Serialization`] for a
    /// payload that is not JSON; neither is retryable.
    fn from(err: MessageError) -> Self {
        match err {
            MessageError::InvalidKey(err) => Error::InvalidKey(err),
            MessageError::NotJson(err) => Error::Serialization(err),
            other => Error::InvalidKey(KeyError::Unserializable(other.to_string())),
        }
    }
}

/// A record's idempotency key and what is fingerprinted with it, for
/// [`Deduplicator::process`](super::Deduplicator::process) and
/// [`process_in_transaction`](super::Deduplicator::process_in_transaction).
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Identity {
    key: Key,
    message: Digest,
}

/// The fingerprinted part of a record: its payload's content, or nothing
/// when the key already is the content.
#[derive(Clone, Debug, PartialEq, Eq, Serialize)]
#[serde(transparent)]
pub struct Digest(Option<String>);

impl Identity {
    /// The key.
    pub fn key(&self) -> &Key {
        &self.key
    }

    /// What to fingerprint: pass it as `process`'s message. For a key read
    /// from a header or a member, the payload's content (its canonical
    /// JSON when it is JSON, so that a copy re-encoded in another member
    /// order is the same message; its bytes otherwise); for a content key,
    /// nothing, as the key is the content.
    pub fn message(&self) -> &Digest {
        &self.message
    }
}

/// The idempotency key of `record`, read as `from` says.
///
/// # Errors
///
/// A [`MessageError`] when the record has no valid key: it can never be
/// processed as sent, by any consumer. With [`KeyFrom::content`], a payload
/// that is not JSON is [`MessageError::NotJson`].
pub fn identify<M: Message>(record: &M, from: &KeyFrom) -> Result<Identity, MessageError> {
    match &from.0 {
        Source::Header(name) => {
            let key = header_key(record, name)?;
            Ok(Identity {
                key,
                message: payload_digest(record.payload()),
            })
        }
        Source::Field(name) => {
            let payload = record.payload().ok_or(MessageError::NoPayload)?;
            let key = field_key(payload, name)?;
            Ok(Identity {
                key,
                message: payload_digest(Some(payload)),
            })
        }
        Source::Content => {
            let payload = record.payload().ok_or(MessageError::NoPayload)?;
            let key = content_key_of_json(payload).map_err(|err| match err {
                Error::Serialization(err) => MessageError::NotJson(err),
                other => MessageError::InvalidKey(KeyError::Unserializable(other.to_string())),
            })?;
            Ok(Identity {
                key,
                message: Digest(None),
            })
        }
    }
}

fn header_key<M: Message>(record: &M, name: &str) -> Result<Key, MessageError> {
    let mut found: Option<&[u8]> = None;
    if let Some(headers) = record.headers() {
        for header in headers.iter() {
            if header.key != name {
                continue;
            }
            let value = header.value.unwrap_or_default();
            match found {
                Some(seen) if seen != value => {
                    return Err(MessageError::AmbiguousHeader(name.to_owned()))
                }
                _ => found = Some(value),
            }
        }
    }
    let value = found.ok_or_else(|| MessageError::MissingHeader(name.to_owned()))?;
    key_from_bytes(value)
}

/// A key from an id's bytes: the key rules refuse what is not visible
/// ASCII, so no other decoding is needed.
fn key_from_bytes(value: &[u8]) -> Result<Key, MessageError> {
    if let Some((offset, &byte)) = value
        .iter()
        .enumerate()
        .find(|(_, byte)| !(0x21..=0x7e).contains(*byte))
    {
        return Err(MessageError::InvalidKey(KeyError::InvalidByte {
            offset,
            byte,
        }));
    }
    let text = std::str::from_utf8(value).expect("visible ASCII is UTF-8");
    Key::new(text).map_err(MessageError::InvalidKey)
}

fn field_key(payload: &[u8], name: &str) -> Result<Key, MessageError> {
    let value: serde_json::Value =
        serde_json::from_slice(payload).map_err(MessageError::NotJson)?;
    match value.get(name) {
        None => Err(MessageError::MissingField(name.to_owned())),
        Some(serde_json::Value::String(id)) => key_from_bytes(id.as_bytes()),
        Some(serde_json::Value::Number(n)) if n.is_i64() || n.is_u64() => {
            // An integer past 64 bits reads as a float: not an id.
            key_from_bytes(n.to_string().as_bytes())
        }
        Some(_) => Err(MessageError::NotAnId(name.to_owned())),
    }
}

/// The payload's content: its canonical JSON's digest when reading it
/// loses nothing, its bytes' digest otherwise (in a domain of their own),
/// nothing for a record without a payload.
fn payload_digest(payload: Option<&[u8]>) -> Digest {
    let Some(payload) = payload else {
        return Digest(None);
    };
    let digest = match canonical::exact_value(payload) {
        Some(value) => match Fingerprint::of(&value) {
            Ok(fingerprint) => format!("json:{}", fingerprint.to_hex()),
            Err(_) => format!("bytes:{}", Fingerprint::of_bytes(payload).to_hex()),
        },
        None => format!("bytes:{}", Fingerprint::of_bytes(payload).to_hex()),
    };
    Digest(Some(digest))
}

/// Commits the offset after `record` in its partition, synchronously: call
/// it after the transaction holding the effect and the marker committed.
///
/// # Errors
///
/// The broker's refusal, such as a partition that a rebalance gave to
/// another member. Nothing is to be undone then: the effect is committed,
/// and the record's next delivery is a duplicate.
pub fn commit_offset<C, X>(consumer: &C, record: &BorrowedMessage<'_>) -> KafkaResult<()>
where
    C: Consumer<X>,
    X: ConsumerContext,
{
    consumer.commit_message(record, CommitMode::Sync)
}

/// Reads `record` again: moves its partition's position back to the
/// record's offset, for a handler that failed (after its transaction was
/// rolled back). Records of the partition already fetched are dropped and
/// fetched again.
///
/// # Errors
///
/// The client's refusal, such as a partition no longer assigned to this
/// consumer (its next owner reads from the last committed offset, which is
/// at or before this record).
pub fn redeliver<C, X>(consumer: &C, record: &BorrowedMessage<'_>) -> KafkaResult<()>
where
    C: Consumer<X>,
    X: ConsumerContext,
{
    let mut position = TopicPartitionList::new();
    position.add_partition_offset(
        record.topic(),
        record.partition(),
        Offset::Offset(record.offset()),
    )?;
    consumer.seek_partitions(position, Duration::from_secs(10))?;
    Ok(())
}

#[cfg(test)]
mod tests {
    use rdkafka::message::{Header, OwnedHeaders, OwnedMessage, Timestamp};

    use super::*;

    /// A record's headers: names and values.
    type Headers<'a> = &'a [(&'a str, Option<&'a [u8]>)];

    fn record(payload: Option<&[u8]>, headers: Headers<'_>) -> OwnedMessage {
        let mut owned = OwnedHeaders::new();
        for (key, value) in headers {
            owned = owned.insert(Header { key, value: *value });
        }
        OwnedMessage::new(
            payload.map(<[u8]>::to_vec),
            Some(b"order-1".to_vec()),
            "orders".to_owned(),
            Timestamp::NotAvailable,
            0,
            7,
            Some(owned),
        )
    }

    #[test]
    fn a_header_is_the_key_and_the_payload_content_is_fingerprinted() {
        let by_header = KeyFrom::header("event-id").unwrap();
        let a = record(
            Some(br#"{"order_id":"o-1","qty":2}"#),
            &[("trace", Some(b"x")), ("event-id", Some(b"evt-1"))],
        );
        let id = identify(&a, &by_header).unwrap();
        assert_eq!(id.key().as_str(), "evt-1");
        // Another encoding of the same payload: the same message.
        let b = record(
            Some(b"{ \"qty\": 2, \"order_id\": \"o-1\" }"),
            &[("event-id", Some(b"evt-1"))],
        );
        assert_eq!(identify(&b, &by_header).unwrap(), id);
        // Another payload: the same key, another message (a KeyReused).
        let c = record(
            Some(br#"{"order_id":"o-1","qty":3}"#),
            &[("event-id", Some(b"evt-1"))],
        );
        let other = identify(&c, &by_header).unwrap();
        assert_eq!(other.key(), id.key());
        assert_ne!(other.message(), id.message());
        // Not JSON: fingerprinted by its bytes.
        let d = record(Some(b"\x00\x01"), &[("event-id", Some(b"evt-2"))]);
        let bytes = identify(&d, &by_header).unwrap();
        assert_ne!(bytes.message(), &Digest(None));
    }

    #[test]
    fn a_header_that_cannot_be_a_key_is_refused() {
        let by_header = KeyFrom::header("event-id").unwrap();
        let cases: [(Headers<'_>, &str); 5] = [
            (&[], "no \"event-id\" header"),
            (&[("event-id", None)], "empty"),
            (&[("event-id", Some(b"two words"))], "byte 0x20"),
            (&[("event-id", Some("é".as_bytes()))], "byte 0xc3"),
            (
                &[("event-id", Some(b"a")), ("event-id", Some(b"b"))],
                "several times",
            ),
        ];
        for (headers, says) in cases {
            let err = identify(&record(Some(b"{}"), headers), &by_header).unwrap_err();
            assert!(err.to_string().contains(says), "{err} / {says}");
            assert!(!Error::from(err).is_retryable());
        }
        // The same value twice is one id.
        let twice = record(
            Some(b"{}"),
            &[("event-id", Some(b"a")), ("event-id", Some(b"a"))],
        );
        assert_eq!(identify(&twice, &by_header).unwrap().key().as_str(), "a");
        let long = vec![b'k'; 256];
        let err = identify(
            &record(Some(b"{}"), &[("event-id", Some(&long))]),
            &by_header,
        )
        .unwrap_err();
        assert!(matches!(
            err,
            MessageError::InvalidKey(KeyError::TooLong { len: 256 })
        ));
    }

    #[test]
    fn a_member_is_the_key_when_it_is_a_string_or_an_integer() {
        let by_member = KeyFrom::field("order_id").unwrap();
        let id = |payload: &[u8]| identify(&record(Some(payload), &[]), &by_member);
        assert_eq!(id(br#"{"order_id":"o-9"}"#).unwrap().key().as_str(), "o-9");
        assert_eq!(id(br#"{"order_id":42}"#).unwrap().key().as_str(), "42");
        assert_eq!(id(br#"{"order_id":-3}"#).unwrap().key().as_str(), "-3");
        for (payload, says) in [
            (&br#"{"id":1}"#[..], "no \"order_id\" member"),
            (br#"[1,2]"#, "no \"order_id\" member"),
            (br#"{"order_id":1.5}"#, "neither a string"),
            (br#"{"order_id":18446744073709551616}"#, "neither a string"),
            (br#"{"order_id":null}"#, "neither a string"),
            (br#"{"order_id":""}"#, "empty"),
            (b"{", "not JSON"),
        ] {
            let err = id(payload).unwrap_err();
            assert!(err.to_string().contains(says), "{err} / {says}");
        }
        let tombstone = identify(&record(None, &[]), &by_member).unwrap_err();
        assert!(matches!(tombstone, MessageError::NoPayload));
    }

    #[test]
    fn content_keys_are_the_content_key_of_the_json_payload() {
        let by_content = KeyFrom::content();
        let a = record(Some(br#"{"sku":"pear","qty":1}"#), &[]);
        let b = record(Some(b"{ \"qty\": 1, \"sku\": \"pear\" }"), &[]);
        let id = identify(&a, &by_content).unwrap();
        assert_eq!(id, identify(&b, &by_content).unwrap());
        assert_eq!(
            id.key(),
            &content_key_of_json(br#"{"sku":"pear","qty":1}"#).unwrap()
        );
        assert_eq!(id.message(), &Digest(None));
        let err = identify(&record(Some(b"not json"), &[]), &by_content).unwrap_err();
        assert!(matches!(err, MessageError::NotJson(_)));
        assert!(matches!(Error::from(err), Error::Serialization(_)));
        let err = identify(&record(None, &[]), &by_content).unwrap_err();
        assert!(matches!(err, MessageError::NoPayload));
    }

    #[test]
    fn names_are_validated() {
        assert!(matches!(KeyFrom::header(""), Err(Error::Config(_))));
        assert!(matches!(KeyFrom::field(""), Err(Error::Config(_))));
        assert_ne!(
            KeyFrom::header("id").unwrap(),
            KeyFrom::field("id").unwrap()
        );
    }
}
