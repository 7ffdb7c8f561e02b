//! A transactional outbox: messages published exactly once with an
//! operation's effect.
//!
//! An operation that changes the database and announces it to a broker
//! ("the payment was created", then `payment.created`) cannot write both
//! in one transaction: a crash between the commit and the send loses the
//! event, a send before the commit announces what may roll back. The
//! outbox writes the message into a table of the same database, in the
//! transaction that holds the effect; a relay ([`kafka::KafkaRelay`]) then
//! produces what the outbox holds, in order, and marks what the broker
//! acknowledged.
//!
//! ```
//! use idem::outbox::{Message, Outbox};
//! use idem::{run, Call, SqliteStore};
//!
//! # #[tokio::main(flavor = "current_thread")]
//! # async fn main() -> Result<(), Box<dyn std::error::Error>> {
//! let store = SqliteStore::connect("sqlite::memory:").await?;
//! sqlx::query("CREATE TABLE payments (id TEXT PRIMARY KEY, amount INTEGER)")
//!     .execute(store.pool())
//!     .await?;
//! let outbox = Outbox::new(&store);
//! let pay = |id: &'static str, amount: i64| {
//!     let (store, outbox) = (store.clone(), outbox.clone());
//!     async move {
//!         run(&store, Call::new("payments.create", id, &amount), async {
//!             let mut tx = store.pool().begin_with("BEGIN IMMEDIATE").await.map_err(idem::Error::store)?;
//!             sqlx::query("INSERT INTO payments VALUES (?, ?)")
//!                 .bind(id)
//!                 .bind(amount)
//!                 .execute(&mut *tx)
//!                 .await
//!                 .map_err(idem::Error::store)?;
//!             // Written in the transaction of the payment: both, or neither.
//!             let event = Message::new("payment.created", format!(r#"{{"id":"{id}"}}"#))?
//!                 .with_key(id)?;
//!             let message_id = outbox.publish(&mut tx, &event).await?;
//!             tx.commit().await.map_err(idem::Error::store)?;
//!             Ok::<_, idem::Error>(message_id.to_string())
//!         })
//!         .await
//!     }
//! };
//! let first = pay("pay-1", 500).await?;
//! // A retry replays the outcome: the body does not run, nothing is enqueued.
//! assert_eq!(pay("pay-1", 500).await?, first);
//! assert_eq!(outbox.waiting().await?, 1);
//!
//! // A relay leases what waits, produces it, and marks what was acknowledged.
//! let lease = outbox.lease(100, std::time::Duration::from_secs(30)).await?;
//! assert_eq!(lease.messages()[0].id().as_str(), first);
//! # let acknowledged: Vec<i64> = lease.messages().iter().map(|m| m.seq()).collect();
//! outbox.mark_relayed(&acknowledged).await?;
//! assert_eq!(outbox.waiting().await?, 0);
//! # Ok(())
//! # }
//! ```
//!
//! # Exactly once, end to end
//!
//! - **Enqueued once.** A message is written on your transaction, with
//!   your rows ([`Outbox::publish`]): it commits or rolls back with them.
//!   A replay does not run the body, so it enqueues nothing. A message
//!   is written only while the operation's claim holds its record (the
//!   same check as a step's journal entry): an attempt that lost its claim
//!   gets [`Error::LeaseLost`] and should roll back.
//! - **A stable id.** Each message gets a [`MessageId`] derived from the
//!   operation (its scope, key and payload's fingerprint) and from the
//!   message itself (topic, key, payload, headers), not from when it was
//!   published. An attempt that runs again after a crash (its claim taken
//!   over) derives the same ids, and a message whose id the outbox holds
//!   already is not written again: the first attempt's message stands.
//!   Two identical messages of one operation are one message.
//! - **Produced at least once.** The relay produces with Kafka's
//!   idempotent producer (`enable.idempotence=true`: the broker drops the
//!   producer's own retries) and marks a row relayed only after the broker
//!   acknowledged it. A relay that dies between the two leaves the row
//!   leased; after the lease another relay (or the same, restarted)
//!   produces it again. That copy is a second record on the broker.
//! - **Processed once.** Every record carries its id in the
//!   [`MESSAGE_ID_HEADER`] header; a consumer deduplicates on it with
//!   [`KeyFrom::header`](crate::consumer::kafka::KeyFrom::header)
//!   and [`Deduplicator`](crate::consumer::Deduplicator), so a copy
//!   produced twice has one effect.
//!
//! # Modes
//!
//! | mode | how the message is written |
//! |---|---|
//! | record | [`Outbox::publish`] on the body's own transaction, the one that writes the effect; the operation runs on the outbox's store |
//! | transactional | [`Outbox::publish`] on the transaction the claim is written on |
//! | entity | [`Outbox::enqueue`] in the body: held, then written in the transaction that inserts the entity and completes its claim |
//!
//! In record mode, the check that the claim holds reads the operation's
//! record in the outbox's store (`Outbox::new(&store)`, the store the
//! operation runs on). Publishing outside an operation, or enqueuing
//! outside entity mode, is refused with [`Error::Config`].
//!
//! # Relays
//!
//! Several relays may run on one outbox, in one process or many. A relay
//! [leases](Outbox::lease) a batch of the oldest rows that are neither
//! relayed nor leased, in one short transaction: the rows another relay is
//! leasing at that moment are skipped (`FOR UPDATE SKIP LOCKED` on
//! PostgreSQL and MariaDB; SQLite's transaction holds the whole
//! database), and the lease is a column decided by the database's clock,
//! so each row is relayed by one relay at a time. A relay that stops holds
//! its rows until its lease ends; then another takes them over.
//!
//! A relay that is only slow (a broker that answers late) may see its
//! lease end while it still produces: the next relay produces the rows
//! too, and both copies reach the broker with one id. Marking is by row
//! and never undone, whoever marks first: no row is marked that the broker
//! did not acknowledge, and none is lost. Keep the producer's delivery
//! timeout (`message.timeout.ms`) under the lease, as
//! [`KafkaRelay`](kafka::KafkaRelay) does by default.
//!
//! Order: one relay produces the rows in the order they were written
//! (their sequence), which keeps the order of each Kafka key. Several
//! relays share the rows out in batches, and the batches of two relays may
//! interleave on the broker; run one relay where the order across
//! operations matters (the others wait as standbys: a dead relay's rows
//! are taken over after its lease). A row that failed to produce is given
//! back and produced again later, after rows behind it.
//!
//! # Parked messages
//!
//! A message the broker refuses for good (larger than the broker or the
//! producer takes, a topic the relay may not write to, a record the
//! broker's policy rejects) would fail at every round. The relay
//! [parks](Outbox::park) it instead, logs an error, and goes on with the
//! messages behind it: a parked message is kept, counted apart from the
//! waiting ones ([`Outbox::parked_count`]), never purged, and listed with
//! the broker's answer by [`Outbox::parked`]. Once the cause is fixed
//! (the topic's `max.message.bytes` raised, an ACL granted),
//! [`Outbox::unpark`] puts it back in its place. A refusal that may pass
//! (a broker away, a topic not yet known, a timeout) is never a reason to
//! park: the message is given back and produced again later.
//!
//! # Retention
//!
//! A relayed row is kept as long as the operation's records (the call's
//! `ttl`, counted from the write), so that an attempt run again within
//! that time finds its message's id and does not enqueue it twice; then
//! [`Outbox::purge`] deletes it (the relay purges now and then). A row not
//! yet relayed is never purged.
//!
//! # Stores
//!
//! SQLite, PostgreSQL and MySQL/MariaDB, in the table
//! `<records table>_outbox` that the store's migrations create. The Redis
//! store has no outbox yet: Redis holds no transaction of your own
//! effects to write the message in.

use std::fmt;
use std::sync::Arc;
use std::time::Duration;

use sha2::{Digest, Sha256};

use crate::steps;
use crate::store::sql::outbox::{lease_millis, LeasedRow, OutboxStatements, Row};
use crate::store::sql::{Backend, SqlStore};
use idem_core::error::Error;
use idem_core::fingerprint::Fingerprint;
use idem_core::key::{AsKey, Key, KeyError, Scope};
use idem_core::record::{duration_millis, ClaimToken};

#[cfg(feature = "kafka")]
#[cfg_attr(docsrs, doc(cfg(feature = "kafka")))]
pub mod kafka;

/// The header that carries a message's [`MessageId`] on the broker.
pub const MESSAGE_ID_HEADER: &str = "idem-message-id";

/// The longest topic name (Kafka's limit).
pub const MAX_TOPIC_LEN: usize = 249;

/// The most bytes of key, payload and headers one message carries: under
/// the producer's and the broker's default `message.max.bytes` (a little
/// over a megabyte, counted with the record's framing and the id header),
/// so that a message the outbox accepts is one a relay can produce.
pub const MAX_MESSAGE_BYTES: usize = 900_000;

/// The most messages one lease takes (and one mark or give-back sends in
/// a statement), whatever batch is asked for: every message is a bound
/// parameter, which databases limit (SQLite to 32,766 per statement).
pub const MAX_LEASE_BATCH: usize = 1_000;

/// Why a message cannot be published.
#[derive(Debug, thiserror::Error, PartialEq, Eq)]
#[non_exhaustive]
pub enum InvalidMessage {
    /// The topic is not 1 to 249 ASCII letters, digits, `.`, `_` and `-`
    /// (Kafka's rule), or is `.` or `..`.
    #[error("invalid topic {0:?}: use 1 to 249 ASCII letters, digits, '.', '_' and '-'")]
    Topic(String),
    /// Key, payload and headers together exceed [`MAX_MESSAGE_BYTES`].
    #[error("the message carries {0} bytes, over the limit of {MAX_MESSAGE_BYTES}")]
    TooLarge(usize),
    /// A header's name is empty, or is [`MESSAGE_ID_HEADER`], which the
    /// outbox sets itself.
    #[error("invalid header name {0:?}: it must be non-empty and not {MESSAGE_ID_HEADER:?}")]
    Header(String),
    /// A stored message's bytes do not decode.
    #[error("a stored message does not decode: {0}")]
    Encoding(String),
    /// A consumer's outputs, as kept with its marker, would exceed
    /// [`MAX_OUTPUTS_BYTES`].
    #[error("outputs of {0} bytes as kept with the marker, over the limit of {limit}", limit = MAX_OUTPUTS_BYTES)]
    OutputsTooLarge(usize),
}

/// The most bytes the messages a consumer produces for one record
/// (`consumer::kafka::transactions::Outputs`) take as kept with its
/// dedupe marker: under the engine's default largest outcome (4 MiB), so
/// that a redelivery always finds them.
pub const MAX_OUTPUTS_BYTES: usize = 3 * 1024 * 1024;

impl From<InvalidMessage> for Error {
    /// As an [`Error::Config`]: not retryable.
    fn from(err: InvalidMessage) -> Self {
        Error::Config(err.to_string())
    }
}

/// A message to publish: its topic, key, payload and headers. Checked as
/// it is built, so that a message that exists can be published.
///
/// ```
/// use idem::outbox::{InvalidMessage, Message};
///
/// let event = Message::new("payment.created", r#"{"id":"pay-1"}"#)?
///     .with_key("pay-1")?
///     .with_header("content-type", "application/json")?;
/// assert_eq!(event.topic(), "payment.created");
/// assert!(matches!(Message::new("no spaces", "x"), Err(InvalidMessage::Topic(_))));
/// # Ok::<_, InvalidMessage>(())
/// ```
#[derive(Clone, Debug, PartialEq, Eq, serde::Serialize, serde::Deserialize)]
#[serde(into = "wire::Message", try_from = "wire::Message")]
pub struct Message {
    topic: String,
    key: Option<Vec<u8>>,
    payload: Option<Vec<u8>>,
    headers: Vec<(String, Vec<u8>)>,
}

impl Message {
    /// A message of `payload` to `topic`.
    ///
    /// # Errors
    ///
    /// [`InvalidMessage`] for an invalid topic or a payload over
    /// [`MAX_MESSAGE_BYTES`].
    pub fn new(topic: &str, payload: impl Into<Vec<u8>>) -> Result<Message, InvalidMessage> {
        Message::tombstone(topic)?.with_payload(Some(payload.into()))
    }

    /// A message without a payload (a tombstone, for a compacted topic).
    ///
    /// # Errors
    ///
    /// [`InvalidMessage::Topic`].
    pub fn tombstone(topic: &str) -> Result<Message, InvalidMessage> {
        check_topic(topic)?;
        Ok(Message {
            topic: topic.to_owned(),
            key: None,
            payload: None,
            headers: Vec::new(),
        })
    }

    fn with_payload(mut self, payload: Option<Vec<u8>>) -> Result<Message, InvalidMessage> {
        self.payload = payload;
        self.checked()
    }

    /// The message with `key`, the record key Kafka partitions by.
    ///
    /// # Errors
    ///
    /// [`InvalidMessage::TooLarge`].
    pub fn with_key(mut self, key: impl Into<Vec<u8>>) -> Result<Message, InvalidMessage> {
        self.key = Some(key.into());
        self.checked()
    }

    /// The message with one more header.
    ///
    /// # Errors
    ///
    /// [`InvalidMessage::Header`] for an empty name or
    /// [`MESSAGE_ID_HEADER`]; [`InvalidMessage::TooLarge`].
    pub fn with_header(
        mut self,
        name: &str,
        value: impl Into<Vec<u8>>,
    ) -> Result<Message, InvalidMessage> {
        if name.is_empty() || name == MESSAGE_ID_HEADER {
            return Err(InvalidMessage::Header(name.to_owned()));
        }
        self.headers.push((name.to_owned(), value.into()));
        self.checked()
    }

    fn checked(self) -> Result<Message, InvalidMessage> {
        let len = self.key.as_ref().map_or(0, Vec::len)
            + self.payload.as_ref().map_or(0, Vec::len)
            + self
                .headers
                .iter()
                .map(|(name, value)| name.len() + value.len())
                .sum::<usize>();
        if len > MAX_MESSAGE_BYTES {
            return Err(InvalidMessage::TooLarge(len));
        }
        Ok(self)
    }

    /// The topic.
    pub fn topic(&self) -> &str {
        &self.topic
    }

    /// The record key, if any.
    pub fn key(&self) -> Option<&[u8]> {
        self.key.as_deref()
    }

    /// The payload; `None` for a tombstone.
    pub fn payload(&self) -> Option<&[u8]> {
        self.payload.as_deref()
    }

    /// The headers, in order (without [`MESSAGE_ID_HEADER`]).
    pub fn headers(&self) -> &[(String, Vec<u8>)] {
        &self.headers
    }
}

fn check_topic(topic: &str) -> Result<(), InvalidMessage> {
    let valid = !topic.is_empty()
        && topic.len() <= MAX_TOPIC_LEN
        && topic != "."
        && topic != ".."
        && topic
            .bytes()
            .all(|b| b.is_ascii_alphanumeric() || matches!(b, b'.' | b'_' | b'-'));
    if valid {
        Ok(())
    } else {
        Err(InvalidMessage::Topic(topic.to_owned()))
    }
}

/// Headers as stored: for each, its name's length (4 bytes, big-endian),
/// its name, its value's length, its value.
fn encode_headers(headers: &[(String, Vec<u8>)]) -> Vec<u8> {
    let mut out = Vec::new();
    for (name, value) in headers {
        for part in [name.as_bytes(), value.as_slice()] {
            out.extend_from_slice(&(part.len() as u32).to_be_bytes());
            out.extend_from_slice(part);
        }
    }
    out
}

fn decode_headers(mut bytes: &[u8]) -> Result<Vec<(String, Vec<u8>)>, Error> {
    let corrupt = || Error::store("an outbox row's headers are corrupt");
    let part = |bytes: &mut &[u8]| -> Result<Vec<u8>, Error> {
        let (len, rest) = bytes.split_first_chunk::<4>().ok_or_else(corrupt)?;
        let len = u32::from_be_bytes(*len) as usize;
        if rest.len() < len {
            return Err(corrupt());
        }
        let (part, rest) = rest.split_at(len);
        *bytes = rest;
        Ok(part.to_vec())
    };
    let mut headers = Vec::new();
    while !bytes.is_empty() {
        let name = String::from_utf8(part(&mut bytes)?).map_err(|_| corrupt())?;
        let value = part(&mut bytes)?;
        headers.push((name, value));
    }
    Ok(headers)
}

/// A message's id: the same for the same operation (scope, key and
/// payload) and the same message (topic, key, payload and headers), in any
/// attempt, process or takeover. Carried in the [`MESSAGE_ID_HEADER`]
/// header, for consumers to deduplicate on.
///
/// It derives from what the message is, not from when the body published
/// it: an attempt that resumes past work an earlier attempt committed, a
/// step replayed from the journal, a transaction the body retried, all
/// give a message the id it had before. So one message published twice
/// in one operation is one message, written once. A key used again after
/// its ttl with another payload is another operation, whose messages get
/// other ids.
///
/// It is the lowercase hexadecimal SHA-256 (64 characters, a valid idem
/// key) of a framed sequence: the tag `idem-outbox-v2`, then the scope,
/// the key, the operation's payload fingerprint, the topic, the message's
/// key (or its absence), its payload (or its absence), and each header's
/// name and value in order, each field its length then its bytes.
///
/// ```
/// use idem::outbox::{Message, MessageId};
/// use idem::{Fingerprint, Key, Scope};
///
/// let (scope, key) = (Scope::new("payments.create"), Key::new("pay-1")?);
/// let payload = Fingerprint::of(&2500)?;
/// let created = Message::new("payment.created", r#"{"id":"pay-1"}"#)?;
/// let id = MessageId::derive(&scope, &key, &payload, &created);
/// assert_eq!(id.as_str().len(), 64);
/// assert_eq!(id, MessageId::derive(&scope, &key, &payload, &created));
/// let other = Message::new("payment.created", r#"{"id":"pay-2"}"#)?;
/// assert_ne!(id, MessageId::derive(&scope, &key, &payload, &other));
/// assert_ne!(id, MessageId::derive(&scope, &key, &Fingerprint::of(&2600)?, &created));
/// # Ok::<(), Box<dyn std::error::Error>>(())
/// ```
#[derive(Clone, PartialEq, Eq, Hash)]
pub struct MessageId(String);

impl MessageId {
    /// The id of `message`, published by the operation `(scope, key)`
    /// whose payload has the fingerprint `payload`.
    pub fn derive(scope: &Scope, key: &Key, payload: &Fingerprint, message: &Message) -> MessageId {
        fn field(hash: &mut Sha256, bytes: Option<&[u8]>) {
            match bytes {
                Some(bytes) => {
                    hash.update((bytes.len() as u64 + 1).to_be_bytes());
                    hash.update(bytes);
                }
                None => hash.update(0u64.to_be_bytes()),
            }
        }
        let mut hash = Sha256::new();
        field(&mut hash, Some(b"idem-outbox-v2"));
        field(&mut hash, Some(scope.as_str().as_bytes()));
        field(&mut hash, Some(key.as_str().as_bytes()));
        field(&mut hash, Some(&payload.as_bytes()[..]));
        field(&mut hash, Some(message.topic.as_bytes()));
        field(&mut hash, message.key.as_deref());
        field(&mut hash, message.payload.as_deref());
        hash.update((message.headers.len() as u64).to_be_bytes());
        for (name, value) in &message.headers {
            field(&mut hash, Some(name.as_bytes()));
            field(&mut hash, Some(value));
        }
        MessageId(Fingerprint::from_digest(hash.finalize().into()).to_hex())
    }

    /// The id's text.
    pub fn as_str(&self) -> &str {
        &self.0
    }
}

impl fmt::Display for MessageId {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(&self.0)
    }
}

impl fmt::Debug for MessageId {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "MessageId({})", self.0)
    }
}

impl AsKey for MessageId {
    fn to_key(&self) -> Result<Key, KeyError> {
        Key::new(self.0.as_str())
    }
}

/// The outbox of a store: the table `<records table>_outbox` in its
/// database. Cloning shares it. See the [module documentation](self).
pub struct Outbox<DB: Backend> {
    store: SqlStore<DB>,
    sql: Arc<OutboxStatements>,
}

impl<DB: Backend> Clone for Outbox<DB> {
    fn clone(&self) -> Self {
        Outbox {
            store: self.store.clone(),
            sql: self.sql.clone(),
        }
    }
}

impl<DB: Backend> fmt::Debug for Outbox<DB> {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("Outbox")
            .field("table", &self.sql.table)
            .finish_non_exhaustive()
    }
}

/// A message held for the entity's transaction (entity mode).
pub(crate) struct Held<DB: Backend> {
    pub(crate) sql: Arc<OutboxStatements>,
    pub(crate) id: MessageId,
    pub(crate) message: Message,
    pub(crate) headers: Vec<u8>,
    pub(crate) ttl: i64,
    pub(crate) db: std::marker::PhantomData<fn() -> DB>,
}

impl<DB: Backend> Held<DB> {
    /// Writes the message on `conn` (the entity's transaction).
    pub(crate) async fn write(&self, conn: &mut DB::Connection) -> Result<(), Error> {
        SqlStore::<DB>::outbox_insert(&self.sql, conn, &self.row()).await
    }

    fn row(&self) -> Row<'_> {
        Row {
            id: self.id.as_str(),
            topic: &self.message.topic,
            key: self.message.key.as_deref(),
            payload: self.message.payload.as_deref(),
            headers: &self.headers,
            ttl: self.ttl,
        }
    }
}

impl<DB: Backend> Outbox<DB> {
    /// The outbox beside `store`'s records table; the store's migrations
    /// create it.
    pub fn new(store: &SqlStore<DB>) -> Self {
        Outbox {
            store: store.clone(),
            sql: Arc::new(OutboxStatements::new::<DB>(&store.sql.table)),
        }
    }

    /// The outbox table's name.
    pub fn table(&self) -> &str {
        &self.sql.table
    }

    /// The store.
    pub fn store(&self) -> &SqlStore<DB> {
        &self.store
    }

    /// Writes `message` on `conn`, your open transaction (record mode: the
    /// one writing the operation's effect; transactional mode: the one its
    /// claim is on), and returns its id. Call it inside the body of an
    /// idempotent operation running on this outbox's store.
    ///
    /// A message whose id the outbox holds already (an earlier attempt of
    /// this operation committed it) is not written again.
    ///
    /// # Errors
    ///
    /// - [`Error::Config`] outside an operation (or from a task the
    ///   operation spawned);
    /// - [`Error::LeaseLost`] when the operation's claim no longer holds
    ///   its record (or the operation runs on another store): roll back;
    /// - [`Error::Store`] when the database failed; the transaction is
    ///   then yours to roll back.
    pub async fn publish(
        &self,
        conn: &mut DB::Connection,
        message: &Message,
    ) -> Result<MessageId, Error> {
        let slot = steps::next_message().ok_or_else(|| outside("publish"))?;
        let id = MessageId::derive(&slot.scope, &slot.claim.key, &slot.fingerprint, message);
        let headers = encode_headers(&message.headers);
        let row = Row {
            id: id.as_str(),
            topic: &message.topic,
            key: message.key.as_deref(),
            payload: message.payload.as_deref(),
            headers: &headers,
            ttl: duration_millis(slot.ttl),
        };
        SqlStore::<DB>::outbox_insert_fenced(&self.sql, conn, &slot.claim, &row).await?;
        Ok(id)
    }

    /// Entity mode: holds `message` until the operation's entity is
    /// inserted, and writes it in that transaction (so the message is
    /// committed exactly when the entity is); returns its id. The outbox
    /// must be in the entity's database.
    ///
    /// # Errors
    ///
    /// [`Error::Config`] outside the body of an entity-mode operation.
    pub fn enqueue(&self, message: Message) -> Result<MessageId, Error> {
        let slot = steps::next_message().ok_or_else(|| outside("enqueue"))?;
        let id = MessageId::derive(&slot.scope, &slot.claim.key, &slot.fingerprint, &message);
        let held: Held<DB> = Held {
            sql: self.sql.clone(),
            id: id.clone(),
            headers: encode_headers(&message.headers),
            message,
            ttl: duration_millis(slot.ttl),
            db: std::marker::PhantomData,
        };
        steps::hold_message(Box::new(held)).map_err(|_| {
            Error::Config(
                "Outbox::enqueue holds a message for an entity-mode operation's transaction, \
                 and this operation is not in entity mode: publish on your transaction with \
                 Outbox::publish"
                    .to_owned(),
            )
        })?;
        Ok(id)
    }

    /// Leases at most `batch` (at most [`MAX_LEASE_BATCH`]) of the oldest
    /// messages that wait (neither
    /// relayed nor leased) for `lease`: no other relay gets them until it
    /// ends. For a relay of your own; [`kafka::KafkaRelay`] does this.
    ///
    /// # Errors
    ///
    /// [`Error::Store`]; [`Error::Config`] for a lease under a millisecond.
    pub async fn lease(&self, batch: usize, lease: Duration) -> Result<Lease, Error> {
        if lease < Duration::from_millis(1) {
            return Err(Error::Config(
                "an outbox lease must last at least 1 ms".into(),
            ));
        }
        let token = ClaimToken::new();
        let batch = batch.clamp(1, MAX_LEASE_BATCH);
        let rows = self
            .store
            .outbox_lease(&self.sql, batch, lease_millis(lease), &token)
            .await?;
        let messages = rows
            .into_iter()
            .map(Leased::from_row)
            .collect::<Result<_, _>>()?;
        Ok(Lease { token, messages })
    }

    /// Marks the messages `seqs` ([`Leased::seq`]) relayed: call it with
    /// those the broker acknowledged, and only those. Marking holds
    /// whoever leases them now. Returns how many were not marked yet.
    ///
    /// # Errors
    ///
    /// [`Error::Store`]: they stay leased, and are produced again after
    /// the lease.
    pub async fn mark_relayed(&self, seqs: &[i64]) -> Result<u64, Error> {
        let mut marked = 0;
        for seqs in seqs.chunks(MAX_LEASE_BATCH) {
            marked += self.store.outbox_mark(&self.sql, seqs).await?;
        }
        Ok(marked)
    }

    /// Gives the messages `seqs` of `lease` back, for the next lease (a
    /// produce that failed); those that another relay leases now are left
    /// alone. Returns how many were given back.
    ///
    /// # Errors
    ///
    /// [`Error::Store`]: they are given back when the lease ends.
    pub async fn release(&self, lease: &Lease, seqs: &[i64]) -> Result<u64, Error> {
        let mut released = 0;
        for seqs in seqs.chunks(MAX_LEASE_BATCH) {
            released += self
                .store
                .outbox_release(&self.sql, &lease.token, seqs)
                .await?;
        }
        Ok(released)
    }

    /// Deletes at most `batch` relayed messages kept past their time (see
    /// [Retention](self#retention)); returns how many.
    ///
    /// # Errors
    ///
    /// [`Error::Store`].
    pub async fn purge(&self, batch: usize) -> Result<u64, Error> {
        self.store.outbox_purge(&self.sql, batch).await
    }

    /// How many messages wait to be relayed (parked ones do not).
    ///
    /// # Errors
    ///
    /// [`Error::Store`].
    pub async fn waiting(&self) -> Result<u64, Error> {
        self.store.outbox_waiting(&self.sql).await
    }

    /// Parks the message `seq` of `lease`, which the broker refused for
    /// good (too large for it, a topic it will not take): it is kept, no
    /// relay leases it again, and it is never purged, until
    /// [`unpark`](Self::unpark)ed. Returns whether it was parked (not if
    /// it was relayed meanwhile, or its lease ended and another relay took
    /// it). See [Parked messages](self#parked-messages).
    ///
    /// # Errors
    ///
    /// [`Error::Store`].
    pub async fn park(&self, lease: &Lease, seq: i64, reason: &str) -> Result<bool, Error> {
        // Kept short: the reason is the broker's error, not a payload.
        let reason = match reason.char_indices().nth(1000) {
            Some((end, _)) => &reason[..end],
            None => reason,
        };
        self.store
            .outbox_park(&self.sql, &lease.token, seq, reason)
            .await
    }

    /// The oldest `limit` parked messages (at most [`MAX_LEASE_BATCH`]),
    /// with why each was parked.
    ///
    /// # Errors
    ///
    /// [`Error::Store`].
    pub async fn parked(&self, limit: usize) -> Result<Vec<Parked>, Error> {
        let rows = self
            .store
            .outbox_parked(&self.sql, limit.min(MAX_LEASE_BATCH))
            .await?;
        rows.into_iter()
            .map(|(row, reason)| {
                Ok(Parked {
                    message: Leased::from_row(row)?,
                    reason,
                })
            })
            .collect()
    }

    /// How many messages are parked.
    ///
    /// # Errors
    ///
    /// [`Error::Store`].
    pub async fn parked_count(&self) -> Result<u64, Error> {
        self.store.outbox_parked_count(&self.sql).await
    }

    /// Unparks the messages `seqs`: they wait to be relayed again, in
    /// their place. Returns how many were parked.
    ///
    /// # Errors
    ///
    /// [`Error::Store`].
    pub async fn unpark(&self, seqs: &[i64]) -> Result<u64, Error> {
        let mut unparked = 0;
        for seqs in seqs.chunks(MAX_LEASE_BATCH) {
            unparked += self.store.outbox_unpark(&self.sql, seqs).await?;
        }
        Ok(unparked)
    }
}

/// A parked message ([`Outbox::parked`]) and why it was parked.
#[derive(Clone, Debug)]
pub struct Parked {
    message: Leased,
    reason: String,
}

impl Parked {
    /// The message, as it was last leased.
    pub fn message(&self) -> &Leased {
        &self.message
    }

    /// Why it was parked: the broker's error.
    pub fn reason(&self) -> &str {
        &self.reason
    }
}

fn outside(what: &str) -> Error {
    Error::Config(format!(
        "Outbox::{what} was called outside an idempotent operation (or from a task the \
         operation spawned): a message's id derives from its operation, so publish inside the \
         body of #[idempotent] or run()"
    ))
}

/// Messages a relay leased ([`Outbox::lease`]), in the order they were
/// written.
#[derive(Debug)]
pub struct Lease {
    token: ClaimToken,
    messages: Vec<Leased>,
}

impl Lease {
    /// The messages.
    pub fn messages(&self) -> &[Leased] {
        &self.messages
    }

    /// Whether the lease holds no message.
    pub fn is_empty(&self) -> bool {
        self.messages.is_empty()
    }
}

/// A leased message.
#[derive(Clone, Debug)]
pub struct Leased {
    seq: i64,
    id: MessageId,
    message: Message,
    attempts: i64,
}

impl Leased {
    fn from_row(row: LeasedRow) -> Result<Leased, Error> {
        Ok(Leased {
            seq: row.seq,
            id: MessageId(row.id),
            message: Message {
                topic: row.topic,
                key: row.key,
                payload: row.payload,
                headers: decode_headers(&row.headers)?,
            },
            attempts: row.attempts,
        })
    }

    /// Its place in the outbox: the order it was written in.
    pub fn seq(&self) -> i64 {
        self.seq
    }

    /// Its id, for the [`MESSAGE_ID_HEADER`] header.
    pub fn id(&self) -> &MessageId {
        &self.id
    }

    /// The message.
    pub fn message(&self) -> &Message {
        &self.message
    }

    /// How many leases it has had, this one included: more than one means
    /// an earlier relay may have produced it.
    pub fn attempts(&self) -> i64 {
        self.attempts
    }
}

/// A [`Message`] as it is serialized (kept with a consumer's marker, by
/// [`consumer::kafka::transactions`](crate::consumer::kafka)): bytes that
/// are text as text, others in base64, so that the form is at most a
/// third longer than the bytes; checked again when read back.
mod wire {
    use base64::Engine as _;
    use serde::{Deserialize, Serialize};

    #[derive(Serialize, Deserialize)]
    #[serde(untagged)]
    pub(super) enum Bytes {
        Text(String),
        Base64 { base64: String },
    }

    impl From<Vec<u8>> for Bytes {
        fn from(bytes: Vec<u8>) -> Self {
            // Text that JSON escapes at length (control characters take
            // six bytes each) goes as base64 too.
            let escaped = bytes
                .iter()
                .filter(|b| **b < 0x20 || **b == b'"' || **b == b'\\')
                .count();
            if escaped * 16 <= bytes.len() {
                if let Ok(text) = String::from_utf8(bytes.clone()) {
                    return Bytes::Text(text);
                }
            }
            Bytes::Base64 {
                base64: base64::engine::general_purpose::STANDARD.encode(&bytes),
            }
        }
    }

    impl TryFrom<Bytes> for Vec<u8> {
        type Error = super::InvalidMessage;

        fn try_from(bytes: Bytes) -> Result<Self, Self::Error> {
            match bytes {
                Bytes::Text(text) => Ok(text.into_bytes()),
                Bytes::Base64 { base64 } => base64::engine::general_purpose::STANDARD
                    .decode(base64)
                    .map_err(|err| super::InvalidMessage::Encoding(err.to_string())),
            }
        }
    }

    #[derive(Serialize, Deserialize)]
    pub(super) struct Message {
        topic: String,
        #[serde(default, skip_serializing_if = "Option::is_none")]
        key: Option<Bytes>,
        #[serde(default, skip_serializing_if = "Option::is_none")]
        payload: Option<Bytes>,
        #[serde(default, skip_serializing_if = "Vec::is_empty")]
        headers: Vec<(String, Bytes)>,
    }

    impl From<super::Message> for Message {
        fn from(message: super::Message) -> Self {
            Message {
                topic: message.topic,
                key: message.key.map(Bytes::from),
                payload: message.payload.map(Bytes::from),
                headers: message
                    .headers
                    .into_iter()
                    .map(|(name, value)| (name, Bytes::from(value)))
                    .collect(),
            }
        }
    }

    impl TryFrom<Message> for super::Message {
        type Error = super::InvalidMessage;

        fn try_from(wire: Message) -> Result<Self, Self::Error> {
            let mut message = super::Message::tombstone(&wire.topic)?;
            message.key = wire.key.map(Vec::try_from).transpose()?;
            message = message.with_payload(wire.payload.map(Vec::try_from).transpose()?)?;
            for (name, value) in wire.headers {
                message = message.with_header(&name, Vec::try_from(value)?)?;
            }
            Ok(message)
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn topics_follow_kafkas_rule() {
        for good in ["payment.created", "a", "A-b_c.9", &"t".repeat(249)] {
            assert!(Message::new(good, "x").is_ok(), "{good}");
        }
        for bad in ["", ".", "..", "with space", "é", "a/b", &"t".repeat(250)] {
            assert_eq!(
                Message::new(bad, "x"),
                Err(InvalidMessage::Topic(bad.to_owned()))
            );
        }
    }

    #[test]
    fn sizes_and_headers_are_checked() {
        let big = vec![0u8; MAX_MESSAGE_BYTES];
        let message = Message::new("t", big.clone()).unwrap();
        assert_eq!(
            message.clone().with_key("k"),
            Err(InvalidMessage::TooLarge(MAX_MESSAGE_BYTES + 1))
        );
        assert!(Message::new("t", [big, vec![0]].concat()).is_err());
        let small = Message::new("t", "x").unwrap();
        assert!(matches!(
            small.clone().with_header("", "v"),
            Err(InvalidMessage::Header(_))
        ));
        assert!(matches!(
            small.clone().with_header(MESSAGE_ID_HEADER, "v"),
            Err(InvalidMessage::Header(_))
        ));
        assert!(matches!(
            Error::from(InvalidMessage::TooLarge(2)),
            Error::Config(_)
        ));
    }

    #[test]
    fn headers_round_trip_and_corruption_is_an_error() {
        let headers = vec![
            ("content-type".to_owned(), b"application/json".to_vec()),
            ("empty".to_owned(), Vec::new()),
        ];
        let bytes = encode_headers(&headers);
        assert_eq!(decode_headers(&bytes).unwrap(), headers);
        assert!(decode_headers(&[]).unwrap().is_empty());
        assert!(decode_headers(&bytes[..bytes.len() - 1]).is_err());
        assert!(decode_headers(&[0, 0, 0]).is_err());
    }

    #[test]
    fn ids_follow_the_documented_derivation() {
        let payload = Fingerprint::of(&1).unwrap();
        let message = Message::new("t", "p")
            .unwrap()
            .with_header("h", "v")
            .unwrap();
        let id = MessageId::derive(
            &Scope::new("op"),
            &Key::new("k1").unwrap(),
            &payload,
            &message,
        );
        let mut framed = Vec::new();
        let mut field = |bytes: Option<&[u8]>| match bytes {
            Some(bytes) => {
                framed.extend_from_slice(&(bytes.len() as u64 + 1).to_be_bytes());
                framed.extend_from_slice(bytes);
            }
            None => framed.extend_from_slice(&0u64.to_be_bytes()),
        };
        for part in [
            &b"idem-outbox-v2"[..],
            b"op",
            b"k1",
            &payload.as_bytes()[..],
            b"t",
        ] {
            field(Some(part));
        }
        field(None);
        field(Some(b"p"));
        framed.extend_from_slice(&1u64.to_be_bytes());
        let mut field = |bytes: &[u8]| {
            framed.extend_from_slice(&(bytes.len() as u64 + 1).to_be_bytes());
            framed.extend_from_slice(bytes);
        };
        field(b"h");
        field(b"v");
        let expected: String = Sha256::digest(&framed)
            .iter()
            .map(|b| format!("{b:02x}"))
            .collect();
        assert_eq!(id.as_str(), expected);
        assert!(id.to_key().is_ok());
        // Not a step's key for the same parts.
        let step =
            crate::steps::StepKey::derive(&Scope::new("op"), &Key::new("k1").unwrap(), "t", 0);
        assert_ne!(id.as_str(), step.as_str());
    }

    #[cfg(feature = "sqlite")]
    #[tokio::test]
    async fn publishing_outside_an_operation_is_refused() {
        let store = crate::SqliteStore::connect("sqlite::memory:")
            .await
            .unwrap();
        let outbox = Outbox::new(&store);
        let message = Message::new("t", "x").unwrap();
        let mut conn = store.pool().acquire().await.unwrap();
        let err = outbox.publish(&mut conn, &message).await.unwrap_err();
        assert!(
            matches!(&err, Error::Config(m) if m.contains("outside")),
            "{err}"
        );
        // The database's one connection, back to the pool.
        drop(conn);
        let err = outbox.enqueue(message).unwrap_err();
        assert!(
            matches!(&err, Error::Config(m) if m.contains("outside")),
            "{err}"
        );
        assert_eq!(outbox.waiting().await.unwrap(), 0);
    }
}
