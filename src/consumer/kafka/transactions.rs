//! Consume, transform, produce: a record's effect in your database once,
//! and its output records and offset in one Kafka transaction.
//!
//! A consumer that writes to its database *and* produces records (an
//! invoice service that reads `order.placed` and emits `invoice.issued`)
//! has two commits to make: the database's and Kafka's. Kafka's
//! transactions put the produced records and the input's offset in one
//! Kafka commit ([`send_offsets`](KafkaTransaction::send_offsets)), and
//! idem puts the effect and the dedupe marker in one database commit
//! ([`Deduplicator::process_in_transaction`]). For each record:
//!
//! 1. [`identify`](super::identify) it, and
//!    [`begin`](TransactionalProducer::begin) a Kafka transaction;
//! 2. `process_in_transaction` on a database transaction: the handler
//!    writes its rows and returns the records to produce, as [`Outputs`];
//!    they are kept with the marker;
//! 3. [`produce`](KafkaTransaction::produce) the outputs (from this run,
//!    or the stored ones of a duplicate) and
//!    [`send_offsets`](KafkaTransaction::send_offsets) in the Kafka
//!    transaction;
//! 4. commit the database transaction, then
//!    [`commit`](KafkaTransaction::commit) the Kafka one.
//!
//! # The boundary
//!
//! Kafka's transaction covers Kafka (the outputs and the offset), idem's
//! covers the database (the effect and the marker). They are two commits,
//! not one distributed commit; what joins them is the marker, which keeps
//! the outputs:
//!
//! | the process dies or a step fails | what follows |
//! |---|---|
//! | before the database commit | both roll back (the broker aborts the open Kafka transaction when the producer's `transaction.timeout.ms` passes, or at once when a producer with the same `transactional.id` starts again); the record is read again and processed afresh |
//! | after the database commit, before Kafka's | the effect and the marker stand; the Kafka transaction is aborted, so the offset is not committed and the record is read again; it is a [`Duplicate`](super::super::Handled::Duplicate) carrying the stored outputs, which are produced again in a new transaction, with the offset |
//! | after Kafka's commit | nothing: the record is done |
//!
//! So the effect happens once, and the outputs are committed to Kafka
//! once per record delivery that gets that far: a record that arrives
//! twice (a producer upstream that sent it twice, or a redelivery after an
//! aborted transaction) has its outputs produced in two transactions.
//! Every output carries a stable id in the
//! [`MESSAGE_ID_HEADER`](crate::outbox::MESSAGE_ID_HEADER) header,
//! derived from the deduplicator's scope, the input's key and fingerprint,
//! and the output itself, the same on every delivery: a downstream
//! consumer that dedupes on it (with [`KeyFrom::header`](super::KeyFrom::header))
//! applies each once. Two identical outputs of one input have one id:
//! they are one message.
//!
//! Give each running instance its own `transactional.id`, the same
//! after its restart. A producer that is fenced (another one started with
//! its id) or fails for good is made again by the next
//! [`begin`](TransactionalProducer::begin); two live instances sharing an
//! id would fence each other in turn, each aborting the other's
//! transaction: every effect stays single (the marker holds), but little
//! gets committed to Kafka until one of them stops.
//!
//! Readers downstream should read with `isolation.level=read_committed`,
//! Kafka's default in most clients but not librdkafka's, so that they do
//! not see the records of an aborted transaction. (The brokers the tests
//! run on, Tansu and librdkafka's mock cluster, do not hide aborted
//! records from `read_committed` readers; with them, the downstream dedupe
//! is what absorbs an aborted copy. That is a limit of those brokers, not
//! of Kafka.)
//!
//! ```no_run
//! use idem::consumer::kafka::transactions::{Outputs, TransactionalProducer};
//! use idem::consumer::kafka::{identify, redeliver, KeyFrom};
//! use idem::consumer::Deduplicator;
//! use idem::outbox::Message;
//! use idem::SqliteStore;
//! use rdkafka::consumer::{Consumer, StreamConsumer};
//! use rdkafka::{ClientConfig, Message as _};
//!
//! #[tokio::main]
//! async fn main() -> Result<(), Box<dyn std::error::Error>> {
//!     let store = SqliteStore::connect("sqlite://invoices.db").await?;
//!     let invoices = Deduplicator::new(store.clone(), "invoices.issue");
//!     let by_event_id = KeyFrom::header("event-id")?;
//!     let consumer: StreamConsumer = ClientConfig::new()
//!         .set("bootstrap.servers", "127.0.0.1:9092")
//!         .set("group.id", "invoices")
//!         .set("enable.auto.commit", "false")
//!         .set("isolation.level", "read_committed")
//!         .create()?;
//!     consumer.subscribe(&["order.placed"])?;
//!     let producer = TransactionalProducer::new(
//!         ClientConfig::new()
//!             .set("bootstrap.servers", "127.0.0.1:9092")
//!             // One per running instance, the same after its restart.
//!             .set("transactional.id", "invoices-0"),
//!     )
//!     .await?;
//!     loop {
//!         let record = consumer.recv().await?;
//!         let Ok(id) = identify(&record, &by_event_id) else {
//!             continue; // never processable: dead-letter it (not shown)
//!         };
//!         let payload = record.payload().unwrap_or_default().to_vec();
//!         let mut kafka = producer.begin().await?;
//!         let mut tx = store.pool().begin_with("BEGIN IMMEDIATE").await?;
//!         let handled = invoices
//!             .process_in_transaction(&mut *tx, id.key(), id.message(), |tx| async move {
//!                 let issued = sqlx::query("INSERT INTO invoices (order_event) VALUES (?)")
//!                     .bind(&payload)
//!                     .execute(&mut *tx)
//!                     .await
//!                     .map_err(idem::Error::store)
//!                     .and_then(|_| Ok(Outputs::one(Message::new("invoice.issued", payload)?)));
//!                 (issued, tx)
//!             })
//!             .await;
//!         let done = match handled {
//!             Ok(handled) => {
//!                 // The outputs of this run, or the stored ones of a duplicate.
//!                 kafka.produce(invoices.scope(), &id, handled.value()).await?;
//!                 kafka.send_offsets(&consumer, &record).await?;
//!                 tx.commit().await?;
//!                 kafka.commit().await.is_ok()
//!             }
//!             Err(_) => {
//!                 tx.rollback().await?;
//!                 kafka.abort().await?;
//!                 false
//!             }
//!         };
//!         if !done {
//!             // Read it again: a duplicate now, if the database committed.
//!             redeliver(&consumer, &record)?;
//!         }
//!     }
//! }
//! ```
//!
//! [`Deduplicator::process_in_transaction`]: crate::consumer::Deduplicator::process_in_transaction

use std::time::Duration;

use rdkafka::consumer::{Consumer, ConsumerContext};
use rdkafka::error::KafkaError;
use rdkafka::message::{BorrowedMessage, Message as _};
use rdkafka::producer::{FutureProducer, Producer};
use rdkafka::{ClientConfig, Offset, TopicPartitionList};
use serde::{Deserialize, Serialize};

use super::Identity;
use crate::outbox::kafka::{send, settled};
use crate::outbox::{InvalidMessage, Message, MessageId, MAX_OUTPUTS_BYTES};
use idem_core::error::Error;
use idem_core::fingerprint::Fingerprint;
use idem_core::key::Scope;

/// The records a handler produces for one input record, kept with its
/// dedupe marker so that a redelivery produces the same ones. At most
/// [`MAX_OUTPUTS_BYTES`] as kept (text as text, other bytes in base64),
/// so that the marker always holds them: a handler with more to say
/// writes it to its database, or to the [outbox](crate::outbox).
///
/// ```
/// use idem::consumer::kafka::transactions::Outputs;
/// use idem::outbox::{InvalidMessage, Message, MAX_MESSAGE_BYTES};
///
/// let outputs = Outputs::one(Message::new("invoice.issued", r#"{"order":"o-1"}"#)?)
///     .with(Message::new("audit", "issued o-1")?)?;
/// assert_eq!(outputs.messages().len(), 2);
/// assert!(Outputs::none().is_empty());
///
/// // Four of the largest messages are more than a marker keeps.
/// let largest = Message::new("reports", "x".repeat(MAX_MESSAGE_BYTES))?;
/// let three = Outputs::one(largest.clone()).with(largest.clone())?.with(largest.clone())?;
/// assert!(matches!(three.with(largest), Err(InvalidMessage::OutputsTooLarge(_))));
/// # Ok::<_, InvalidMessage>(())
/// ```
#[derive(Clone, Debug, Default)]
pub struct Outputs {
    messages: Vec<Message>,
    /// The bytes of `messages` as kept.
    bytes: usize,
}

impl Outputs {
    /// No records: the effect is all.
    pub fn none() -> Self {
        Outputs::default()
    }

    /// One record (one always fits).
    pub fn one(message: Message) -> Self {
        let bytes = kept_bytes(&message) + 2;
        Outputs {
            messages: vec![message],
            bytes,
        }
    }

    /// These records and `message`, produced after them.
    ///
    /// # Errors
    ///
    /// [`InvalidMessage::OutputsTooLarge`] when they would take more than
    /// [`MAX_OUTPUTS_BYTES`] as kept.
    pub fn with(mut self, message: Message) -> Result<Self, InvalidMessage> {
        let bytes = self.bytes.max(2) + kept_bytes(&message) + 1;
        if bytes > MAX_OUTPUTS_BYTES {
            return Err(InvalidMessage::OutputsTooLarge(bytes));
        }
        self.messages.push(message);
        self.bytes = bytes;
        Ok(self)
    }

    /// The records, in the order they are produced.
    pub fn messages(&self) -> &[Message] {
        &self.messages
    }

    /// Whether there are none.
    pub fn is_empty(&self) -> bool {
        self.messages.is_empty()
    }
}

impl PartialEq for Outputs {
    fn eq(&self, other: &Self) -> bool {
        self.messages == other.messages
    }
}

impl Eq for Outputs {}

/// The bytes of `message` as kept with the marker.
fn kept_bytes(message: &Message) -> usize {
    serde_json::to_vec(message).map_or(usize::MAX / 4, |json| json.len())
}

impl TryFrom<Vec<Message>> for Outputs {
    type Error = InvalidMessage;

    fn try_from(messages: Vec<Message>) -> Result<Self, Self::Error> {
        messages
            .into_iter()
            .try_fold(Outputs::none(), Outputs::with)
    }
}

impl Serialize for Outputs {
    fn serialize<S: serde::Serializer>(&self, serializer: S) -> Result<S::Ok, S::Error> {
        self.messages.serialize(serializer)
    }
}

impl<'de> Deserialize<'de> for Outputs {
    fn deserialize<D: serde::Deserializer<'de>>(deserializer: D) -> Result<Self, D::Error> {
        let messages = Vec::<Message>::deserialize(deserializer)?;
        Outputs::try_from(messages).map_err(serde::de::Error::custom)
    }
}

/// The id of an output: what the consumer downstream dedupes on.
///
/// It derives from the deduplicator's `scope`, the input's key and
/// fingerprint, and the output, so every delivery of the input gives each
/// output the same id.
pub fn output_id(scope: &Scope, input: &Identity, output: &Message) -> Result<MessageId, Error> {
    let fingerprint = Fingerprint::of(input.message())?;
    Ok(MessageId::derive(scope, input.key(), &fingerprint, output))
}

/// How long a blocking transactional call may take by default.
pub const DEFAULT_TIMEOUT: Duration = Duration::from_secs(30);

/// A transactional producer: one Kafka transaction at a time, each begun
/// with [`begin`](Self::begin). See the [module documentation](self).
pub struct TransactionalProducer {
    config: ClientConfig,
    timeout: Duration,
    state: tokio::sync::Mutex<State>,
}

struct State {
    producer: FutureProducer,
    /// A transaction was begun and neither committed nor aborted (its
    /// [`KafkaTransaction`] was dropped): the next `begin` aborts it.
    open: bool,
}

impl std::fmt::Debug for TransactionalProducer {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("TransactionalProducer")
            .field("transactional.id", &self.config.get("transactional.id"))
            .field("timeout", &self.timeout)
            .finish_non_exhaustive()
    }
}

impl TransactionalProducer {
    /// A producer made from `config`, which must set `transactional.id`
    /// (one per running instance, kept across its restarts: starting a
    /// producer with the id of one that died aborts the transaction it
    /// left open, and fences it off if it was only stalled), with
    /// `enable.idempotence=true`. Waits until the broker registered it,
    /// at most [`DEFAULT_TIMEOUT`].
    ///
    /// # Errors
    ///
    /// [`Error::Config`] when `config` has no `transactional.id`, turns
    /// idempotence off, or the producer cannot be created;
    /// [`Error::Store`] when the broker does not register it in time.
    pub async fn new(config: &ClientConfig) -> Result<Self, Error> {
        match config.get("transactional.id") {
            Some(id) if !id.is_empty() => {}
            _ => {
                return Err(Error::Config(
                    "a transactional producer needs a transactional.id".to_owned(),
                ))
            }
        }
        if let Some(value) = config.get("enable.idempotence") {
            if value != "true" {
                return Err(Error::Config(format!(
                    "a transactional producer is idempotent, and the configuration sets \
                     enable.idempotence={value}"
                )));
            }
        }
        let mut config = config.clone();
        config.set("enable.idempotence", "true");
        let producer = registered(&config, DEFAULT_TIMEOUT).await?;
        Ok(TransactionalProducer {
            config,
            timeout: DEFAULT_TIMEOUT,
            state: tokio::sync::Mutex::new(State {
                producer,
                open: false,
            }),
        })
    }

    /// Blocking calls (offsets, commit, abort) wait at most `timeout`
    /// (at least 1 s).
    #[must_use]
    pub fn with_timeout(mut self, timeout: Duration) -> Self {
        self.timeout = timeout.max(Duration::from_secs(1));
        self
    }

    /// Begins a Kafka transaction, once the one before it ended (one
    /// transaction at a time). A transaction dropped without
    /// [`commit`](KafkaTransaction::commit) or
    /// [`abort`](KafkaTransaction::abort) is aborted first; a producer
    /// that failed for good is made again.
    ///
    /// # Errors
    ///
    /// [`Error::Store`] when the transaction cannot begin (the broker
    /// cannot be reached to make a producer again, say).
    pub async fn begin(&self) -> Result<KafkaTransaction<'_>, Error> {
        let mut state = self.state.lock().await;
        if state.open {
            let producer = state.producer.clone();
            let aborted = blocking(move || producer.abort_transaction(CLEANUP_TIMEOUT)).await;
            if let Err(err) = aborted {
                tracing::warn!(error = %err, "aborting a dropped Kafka transaction failed; making a new producer");
                state.producer = registered(&self.config, self.timeout).await?;
            }
            state.open = false;
        }
        if state.producer.client().fatal_error().is_some() {
            tracing::warn!("the transactional producer failed for good; making a new one");
            state.producer = registered(&self.config, self.timeout).await?;
        }
        state.producer.begin_transaction().map_err(Error::store)?;
        state.open = true;
        Ok(KafkaTransaction {
            state,
            timeout: self.timeout,
            config: &self.config,
        })
    }
}

/// How long aborting a dropped transaction may take: short, since a new
/// producer follows if it fails.
const CLEANUP_TIMEOUT: Duration = Duration::from_secs(10);

/// A Kafka transaction in progress: produce, send the offsets, then
/// commit or abort. Dropped without either, it is aborted by the next
/// [`begin`](TransactionalProducer::begin) (or by the broker, after the
/// producer's `transaction.timeout.ms`).
pub struct KafkaTransaction<'p> {
    state: tokio::sync::MutexGuard<'p, State>,
    timeout: Duration,
    config: &'p ClientConfig,
}

impl std::fmt::Debug for KafkaTransaction<'_> {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("KafkaTransaction")
            .field("open", &self.state.open)
            .finish_non_exhaustive()
    }
}

impl KafkaTransaction<'_> {
    /// Produces `outputs` in this transaction, in order, each with its
    /// [`output_id`] in the [`MESSAGE_ID_HEADER`](crate::outbox::MESSAGE_ID_HEADER) header, and waits for
    /// the broker's acknowledgements. Returns the ids.
    ///
    /// # Errors
    ///
    /// [`Error::Store`] when a record is not acknowledged: abort the
    /// transaction and read the input again.
    pub async fn produce(
        &mut self,
        scope: &Scope,
        input: &Identity,
        outputs: &Outputs,
    ) -> Result<Vec<MessageId>, Error> {
        let mut ids = Vec::with_capacity(outputs.messages.len());
        let mut deliveries = Vec::with_capacity(outputs.messages.len());
        for output in &outputs.messages {
            let id = output_id(scope, input, output)?;
            deliveries.push(send(&self.state.producer, &id, output).await);
            ids.push(id);
        }
        for delivery in deliveries {
            if let Some(err) = settled(delivery).await {
                return Err(Error::store(err));
            }
        }
        Ok(ids)
    }

    /// Adds the offset past `record` to this transaction, for the group
    /// of `consumer`: it is committed with the outputs, or not at all.
    ///
    /// # Errors
    ///
    /// [`Error::Config`] when `consumer` is in no group; [`Error::Store`]
    /// when the broker does not take the offset (the partition moved in
    /// a rebalance, say): abort, and read the input again.
    pub async fn send_offsets<C, X>(
        &mut self,
        consumer: &C,
        record: &BorrowedMessage<'_>,
    ) -> Result<(), Error>
    where
        C: Consumer<X>,
        X: ConsumerContext,
    {
        let group = consumer.group_metadata().ok_or_else(|| {
            Error::Config("the consumer is in no group: set its group.id".to_owned())
        })?;
        let mut offsets = TopicPartitionList::new();
        offsets
            .add_partition_offset(
                record.topic(),
                record.partition(),
                Offset::Offset(record.offset() + 1),
            )
            .map_err(Error::store)?;
        let producer = self.state.producer.clone();
        let timeout = self.timeout;
        blocking(move || producer.send_offsets_to_transaction(&offsets, &group, timeout)).await
    }

    /// Commits the transaction: its records become visible to
    /// `read_committed` readers, and its offsets are committed. A commit
    /// that fails is aborted (or, when that fails too, the producer is made
    /// again, which aborts it on the broker).
    ///
    /// # Errors
    ///
    /// [`Error::Store`] when the transaction did not commit: read the
    /// input again (a duplicate, if the database committed).
    pub async fn commit(mut self) -> Result<(), Error> {
        let mut tries = 0;
        loop {
            let producer = self.state.producer.clone();
            let timeout = self.timeout;
            let committed =
                tokio::task::spawn_blocking(move || producer.commit_transaction(timeout))
                    .await
                    .map_err(Error::store)?;
            match committed {
                Ok(()) => {
                    self.state.open = false;
                    return Ok(());
                }
                Err(KafkaError::Transaction(err)) if err.is_retriable() && tries < 3 => {
                    tries += 1;
                    tracing::debug!(error = %err, "committing a Kafka transaction: trying again");
                }
                Err(err) => {
                    let failed = Error::store(err);
                    self.end_by_abort().await;
                    return Err(failed);
                }
            }
        }
    }

    /// Aborts the transaction: its records are not committed (hidden from
    /// `read_committed` readers), nor its offsets.
    ///
    /// # Errors
    ///
    /// [`Error::Store`] when the broker did not take the abort; the
    /// producer is then made again, which aborts it on the broker.
    pub async fn abort(mut self) -> Result<(), Error> {
        let producer = self.state.producer.clone();
        let timeout = self.timeout;
        match blocking(move || producer.abort_transaction(timeout)).await {
            Ok(()) => {
                self.state.open = false;
                Ok(())
            }
            Err(err) => {
                self.state.producer = registered(self.config, self.timeout).await?;
                self.state.open = false;
                Err(err)
            }
        }
    }

    /// After a failed commit: abort, or make the producer again.
    async fn end_by_abort(&mut self) {
        let producer = self.state.producer.clone();
        let timeout = self.timeout;
        let aborted = blocking(move || producer.abort_transaction(timeout)).await;
        if aborted.is_err() || self.state.producer.client().fatal_error().is_some() {
            match registered(self.config, self.timeout).await {
                Ok(producer) => self.state.producer = producer,
                Err(err) => {
                    // The next `begin` tries again.
                    tracing::warn!(error = %err, "making a new transactional producer failed");
                    return;
                }
            }
        }
        self.state.open = false;
    }
}

/// A producer made from `config` and registered with the broker
/// (`init_transactions`).
async fn registered(config: &ClientConfig, timeout: Duration) -> Result<FutureProducer, Error> {
    let producer: FutureProducer = config
        .create()
        .map_err(|err| Error::Config(format!("cannot create the transactional producer: {err}")))?;
    let registering = producer.clone();
    blocking(move || registering.init_transactions(timeout)).await?;
    Ok(producer)
}

/// Runs one of librdkafka's blocking transactional calls off the runtime.
async fn blocking<F>(call: F) -> Result<(), Error>
where
    F: FnOnce() -> Result<(), KafkaError> + Send + 'static,
{
    tokio::task::spawn_blocking(call)
        .await
        .map_err(Error::store)?
        .map_err(Error::store)
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::outbox::MESSAGE_ID_HEADER;

    #[test]
    fn outputs_round_trip_through_the_marker() {
        let outputs = Outputs::one(
            Message::new("invoice.issued", r#"{"order":"o-1"}"#)
                .unwrap()
                .with_key("o-1")
                .unwrap()
                .with_header("bin", vec![0xff, 0x00])
                .unwrap(),
        )
        .with(Message::tombstone("invoices.compacted").unwrap())
        .unwrap();
        let json = serde_json::to_string(&outputs).unwrap();
        assert_eq!(serde_json::from_str::<Outputs>(&json).unwrap(), outputs);
        // Text stays text in the marker.
        assert!(json.contains(r#""key":"o-1""#), "{json}");
    }

    #[test]
    fn a_stored_output_is_checked_again() {
        let bad = r#"[{"topic":"no spaces","payload":"x"}]"#;
        assert!(serde_json::from_str::<Outputs>(bad).is_err());
        let reserved = format!(r#"[{{"topic":"t","headers":[["{MESSAGE_ID_HEADER}","x"]]}}]"#);
        assert!(serde_json::from_str::<Outputs>(&reserved).is_err());
    }
}
