//! The outbox's relay to Kafka.
//!
//! # The relay
//!
//! [`KafkaRelay`] leases a batch of the outbox's oldest waiting messages,
//! produces them with the idempotent producer (each record with its id in
//! the [`MESSAGE_ID_HEADER`] header), waits for the broker's
//! acknowledgements, marks the acknowledged rows relayed and gives the
//! others back; when nothing waits, it sleeps a little and looks again, and
//! now and then it purges relayed rows past their time. Spawn
//! [`run`](KafkaRelay::run) in every process that should relay (several
//! may: see [Relays](super#relays)).
//!
//! | the relay dies | what happens |
//! |---|---|
//! | before producing | its rows are leased until its lease ends, then another relay (or this one, restarted) produces them |
//! | between the broker's acknowledgement and the mark | the same: the next relay produces them again, a second record with the same id, which the consumer's dedupe absorbs |
//! | after the mark | nothing: the rows are relayed |
//!
//! A broker that cannot be reached fails the records' delivery after the
//! producer's `message.timeout.ms`: their rows are given back and produced
//! at a later round. Nothing is marked that the broker did not
//! acknowledge. A record the broker refuses for good (too large, a topic
//! the relay may not write to) is [parked](super#parked-messages), and
//! the relay goes on with the rest.
//!
//! ```no_run
//! use std::sync::Arc;
//! use idem::outbox::kafka::KafkaRelay;
//! use idem::outbox::Outbox;
//! use idem::SqliteStore;
//! use rdkafka::ClientConfig;
//!
//! # #[tokio::main]
//! # async fn main() -> Result<(), idem::Error> {
//! let store = SqliteStore::connect("sqlite://payments.db").await?;
//! let relay = KafkaRelay::new(
//!     Outbox::new(&store),
//!     ClientConfig::new().set("bootstrap.servers", "127.0.0.1:9092"),
//! )?;
//! tokio::spawn(async move { relay.run().await });
//! # Ok(())
//! # }
//! ```

use std::time::Duration;

use rdkafka::error::{KafkaError, KafkaResult};
use rdkafka::message::{Header, OwnedHeaders};
use rdkafka::producer::{DeliveryFuture, FutureProducer, FutureRecord, Producer};
use rdkafka::ClientConfig;

use super::{Lease, Message, MessageId, Outbox, MESSAGE_ID_HEADER};
use crate::store::sql::Backend;
use idem_core::error::Error;

/// What one round of a relay did.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
#[non_exhaustive]
pub struct Relayed {
    /// Messages leased.
    pub leased: usize,
    /// Messages the broker acknowledged.
    pub acknowledged: usize,
    /// Acknowledged messages marked relayed by this round (others were
    /// marked by another relay first).
    pub marked: u64,
    /// Messages the broker did not take: given back for a later round.
    pub failed: usize,
    /// Messages the broker refused for good: parked (see
    /// [Parked messages](super#parked-messages)).
    pub parked: usize,
}

/// A relay from an [`Outbox`] to Kafka. See the [module documentation](self).
pub struct KafkaRelay<DB: Backend> {
    outbox: Outbox<DB>,
    /// The producer, made again from `config` after a fatal error.
    producer: std::sync::Mutex<FutureProducer>,
    config: ClientConfig,
    batch: usize,
    lease: Duration,
    idle: Duration,
    purge_every: Duration,
}

impl<DB: Backend> std::fmt::Debug for KafkaRelay<DB> {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("KafkaRelay")
            .field("outbox", &self.outbox)
            .field("batch", &self.batch)
            .field("lease", &self.lease)
            .finish_non_exhaustive()
    }
}

/// The default lease: how long a relay holds the rows it leased.
pub const DEFAULT_LEASE: Duration = Duration::from_secs(30);

impl<DB: Backend> KafkaRelay<DB> {
    /// A relay of `outbox` producing with a producer made from `config`
    /// (`bootstrap.servers` and whatever else your cluster needs), with
    /// `enable.idempotence=true` and, unless set, a `message.timeout.ms`
    /// of half the lease; batches of 500, a lease of 30 s.
    ///
    /// # Errors
    ///
    /// [`Error::Config`] when `config` turns idempotence off, sets a
    /// `message.timeout.ms` that is not under the lease, or the producer
    /// cannot be created.
    pub fn new(outbox: Outbox<DB>, config: &ClientConfig) -> Result<Self, Error> {
        let relay = KafkaRelay {
            outbox,
            producer: std::sync::Mutex::new(producer(config, DEFAULT_LEASE)?),
            config: config.clone(),
            batch: 500,
            lease: DEFAULT_LEASE,
            idle: Duration::from_millis(50),
            purge_every: Duration::from_secs(60),
        };
        Ok(relay)
    }

    /// A relay with another lease (at least 100 ms); the producer is made
    /// again from `config` so that its delivery timeout stays under it.
    ///
    /// # Errors
    ///
    /// As [`new`](Self::new).
    pub fn with_lease(mut self, config: &ClientConfig, lease: Duration) -> Result<Self, Error> {
        if lease < Duration::from_millis(100) {
            return Err(Error::Config(
                "a relay's lease must last at least 100 ms".into(),
            ));
        }
        self.producer = std::sync::Mutex::new(producer(config, lease)?);
        self.config = config.clone();
        self.lease = lease;
        Ok(self)
    }

    /// At most `batch` messages per round (at least 1, at most
    /// [`MAX_LEASE_BATCH`](super::MAX_LEASE_BATCH)).
    pub fn with_batch(mut self, batch: usize) -> Self {
        self.batch = batch.clamp(1, super::MAX_LEASE_BATCH);
        self
    }

    /// How long [`run`](Self::run) sleeps when nothing waits.
    pub fn with_idle(mut self, idle: Duration) -> Self {
        self.idle = idle;
        self
    }

    /// The outbox.
    pub fn outbox(&self) -> &Outbox<DB> {
        &self.outbox
    }

    /// The producer (a handle on it: the relay makes a new one after a
    /// fatal error).
    pub fn producer(&self) -> FutureProducer {
        self.producer
            .lock()
            .unwrap_or_else(|e| e.into_inner())
            .clone()
    }

    /// Makes a new producer when the current one failed for good: a
    /// fatal error, or a broker that refuses its producer id or epoch (an
    /// idempotent producer whose deliveries timed out asks for a new
    /// epoch, which not every broker grants). The new producer has an id
    /// of its own; the rows the old one failed are produced by it.
    fn renew_producer(&self, refused: bool) {
        let current = self.producer();
        let fatal = current.client().fatal_error();
        if fatal.is_none() && !refused {
            return;
        }
        tracing::warn!(
            ?fatal,
            "the relay's producer cannot go on; making a new one"
        );
        match producer(&self.config, self.lease) {
            Ok(fresh) => *self.producer.lock().unwrap_or_else(|e| e.into_inner()) = fresh,
            Err(err) => tracing::warn!(error = %err, "making a new producer failed"),
        }
    }

    /// One round: lease a batch, produce it, mark what the broker
    /// acknowledged and give the rest back.
    ///
    /// # Errors
    ///
    /// [`Error::Store`] when the outbox cannot be read or marked: what was
    /// leased stays leased until the lease ends, then is produced again.
    pub async fn relay_once(&self) -> Result<Relayed, Error> {
        let lease = self.outbox.lease(self.batch, self.lease).await?;
        if lease.is_empty() {
            return Ok(Relayed::default());
        }
        let mut produced = self.produce(&lease).await;
        // A broker answers a whole produce request (a batch of the
        // partition's records) as too large, or against its policy,
        // however small each record in it: a refused record is produced
        // again alone before it is parked, and parked only if it is
        // refused alone too.
        let refused = std::mem::take(&mut produced.refused);
        let producer = self.producer();
        for (seq, reason) in refused {
            let Some(message) = lease.messages().iter().find(|m| m.seq() == seq) else {
                continue;
            };
            match settled(send(&producer, message.id(), message.message()).await).await {
                None => produced.acknowledged.push(seq),
                Some(err) if refuses_for_good(&err) => {
                    tracing::debug!(seq, first = %reason, "refused again, alone");
                    produced.refused.push((seq, err.to_string()));
                }
                Some(err) => {
                    tracing::warn!(error = %err, seq, "the broker did not take an outbox message");
                    produced.failed.push(seq);
                }
            }
        }
        let marked = self.outbox.mark_relayed(&produced.acknowledged).await?;
        let mut parked = 0;
        for (seq, reason) in &produced.refused {
            if self.outbox.park(&lease, *seq, reason).await? {
                tracing::error!(
                    seq,
                    reason = %reason,
                    "the broker refused an outbox message for good; it is parked until unparked"
                );
                parked += 1;
            }
        }
        if !produced.failed.is_empty() {
            self.renew_producer(produced.producer_refused);
            self.outbox.release(&lease, &produced.failed).await?;
        }
        let table = self.outbox.table().to_owned();
        for (outcome, n) in [
            ("relayed", marked),
            ("failed", produced.failed.len() as u64),
            ("parked", parked as u64),
        ] {
            if n > 0 {
                metrics::counter!(crate::metrics::OUTBOX_MESSAGES, "table" => table.clone(), "outcome" => outcome)
                    .increment(n);
            }
        }
        Ok(Relayed {
            leased: lease.messages().len(),
            acknowledged: produced.acknowledged.len(),
            marked,
            failed: produced.failed.len(),
            parked,
        })
    }

    /// Produces the messages of `lease`, in order, and waits for the
    /// broker's answers: which it acknowledged, which it did not. Marks
    /// nothing: [`relay_once`](Self::relay_once) is this, then
    /// [`Outbox::mark_relayed`] and [`Outbox::release`].
    pub async fn produce(&self, lease: &Lease) -> Produced {
        let producer = self.producer();
        let mut deliveries = Vec::with_capacity(lease.messages().len());
        for message in lease.messages() {
            deliveries.push((
                message.seq(),
                send(&producer, message.id(), message.message()).await,
            ));
        }
        let mut produced = Produced::default();
        for (seq, delivery) in deliveries {
            let refusal = settled(delivery).await;
            if let Some(err) = &refusal {
                produced.producer_refused |= refuses_producer(err);
            }
            match refusal {
                None => produced.acknowledged.push(seq),
                Some(err) if refuses_for_good(&err) => {
                    produced.refused.push((seq, err.to_string()))
                }
                Some(err) => {
                    tracing::warn!(error = %err, seq, "the broker did not take an outbox message");
                    produced.failed.push(seq);
                }
            }
        }
        produced
    }

    /// Relays until dropped: rounds back to back while messages wait, a
    /// pause of the idle time when none do, and a purge of relayed rows
    /// past their time every minute. A round that fails is logged and
    /// tried again after a pause; nothing it leased is lost.
    pub async fn run(&self) {
        let mut purged = tokio::time::Instant::now();
        let mut pause = self.idle;
        loop {
            match self.relay_once().await {
                Ok(round) if round.leased > 0 && round.failed == 0 => {
                    pause = self.idle;
                    continue;
                }
                Ok(round) if round.failed > 0 => {
                    pause = (pause * 2).clamp(self.idle, Duration::from_secs(5));
                }
                Ok(_) => pause = self.idle,
                Err(err) => {
                    tracing::warn!(error = %err, "an outbox relay round failed; trying again");
                    pause = (pause * 2).clamp(self.idle, Duration::from_secs(5));
                }
            }
            if purged.elapsed() >= self.purge_every {
                purged = tokio::time::Instant::now();
                if let Err(err) = self.outbox.purge(1000).await {
                    tracing::warn!(error = %err, "purging the outbox failed");
                }
            }
            tokio::time::sleep(pause).await;
        }
    }
}

/// Queues `body`, with its `id` in the [`MESSAGE_ID_HEADER`] header, in
/// `producer`, waiting while its queue is full. The relay's and a Kafka
/// transaction's (`consumer::kafka::transactions`) way to produce.
pub(crate) async fn send(
    producer: &FutureProducer,
    id: &MessageId,
    body: &Message,
) -> KafkaResult<DeliveryFuture> {
    let mut headers = OwnedHeaders::new_with_capacity(body.headers().len() + 1);
    headers = headers.insert(Header {
        key: MESSAGE_ID_HEADER,
        value: Some(id.as_str()),
    });
    for (name, value) in body.headers() {
        headers = headers.insert(Header {
            key: name.as_str(),
            value: Some(value.as_slice()),
        });
    }
    let mut record: FutureRecord<'_, [u8], [u8]> = FutureRecord::to(body.topic()).headers(headers);
    if let Some(key) = body.key() {
        record = record.key(key);
    }
    if let Some(payload) = body.payload() {
        record = record.payload(payload);
    }
    loop {
        match producer.send_result(record) {
            Ok(delivery) => return Ok(delivery),
            Err((
                KafkaError::MessageProduction(rdkafka::types::RDKafkaErrorCode::QueueFull),
                back,
            )) => {
                record = back;
                tokio::time::sleep(Duration::from_millis(5)).await;
            }
            Err((err, _)) => return Err(err),
        }
    }
}

/// How a sent record ended: `None` when the broker acknowledged it, or
/// why it did not.
pub(crate) async fn settled(sent: KafkaResult<DeliveryFuture>) -> Option<KafkaError> {
    match sent {
        Ok(delivery) => match delivery.await {
            Ok(Ok(_)) => None,
            Ok(Err((err, _))) => Some(err),
            Err(_) => Some(KafkaError::Canceled),
        },
        Err(err) => Some(err),
    }
}

/// What [`KafkaRelay::produce`] got from the broker, by sequence number.
#[derive(Clone, Debug, Default, PartialEq, Eq)]
#[non_exhaustive]
pub struct Produced {
    /// Acknowledged: mark them relayed.
    pub acknowledged: Vec<i64>,
    /// Not taken: give them back.
    pub failed: Vec<i64>,
    /// Refused for good, with the broker's answer: park them.
    pub refused: Vec<(i64, String)>,
    /// The broker refused the producer itself (its id or epoch): the
    /// relay makes a new one.
    producer_refused: bool,
}

/// Whether the broker refused the producer rather than a record.
fn refuses_producer(err: &KafkaError) -> bool {
    use rdkafka::types::RDKafkaErrorCode as Code;
    matches!(
        err.rdkafka_error_code(),
        Some(
            Code::ProducerFenced
                | Code::InvalidProducerEpoch
                | Code::UnknownProducerId
                | Code::InvalidProducerIdMapping
                | Code::OutOfOrderSequenceNumber
        )
    )
}

/// Whether the broker (or the producer, before sending) refused a record
/// in a way that producing it again cannot change. A topic not known yet,
/// a broker away or a timeout may pass, and are not.
fn refuses_for_good(err: &KafkaError) -> bool {
    use rdkafka::types::RDKafkaErrorCode as Code;
    matches!(
        err.rdkafka_error_code(),
        Some(
            Code::MessageSizeTooLarge
                | Code::InvalidMessageSize
                | Code::InvalidTopic
                | Code::TopicAuthorizationFailed
                | Code::UnsupportedForMessageFormat
                | Code::PolicyViolation
                | Code::InvalidRecord
        )
    )
}

/// The relay's producer: idempotent, its delivery timeout under the lease.
fn producer(config: &ClientConfig, lease: Duration) -> Result<FutureProducer, Error> {
    let mut config = config.clone();
    match config.get("enable.idempotence") {
        Some("true") | None => {}
        Some(other) => {
            return Err(Error::Config(format!(
                "the outbox relay produces with the idempotent producer, and the \
                 configuration sets enable.idempotence={other}"
            )))
        }
    }
    config.set("enable.idempotence", "true");
    let lease_ms = u64::try_from(lease.as_millis()).unwrap_or(u64::MAX);
    match config.get("message.timeout.ms").map(str::parse::<u64>) {
        None => {
            config.set("message.timeout.ms", (lease_ms / 2).max(1).to_string());
        }
        Some(Ok(timeout)) if timeout < lease_ms => {}
        Some(_) => {
            return Err(Error::Config(format!(
                "the relay's message.timeout.ms must be a number of milliseconds under its \
                 lease ({lease_ms} ms), so that a delivery ends before another relay may take \
                 its rows"
            )))
        }
    }
    config
        .create()
        .map_err(|err| Error::Config(format!("cannot create the relay's producer: {err}")))
}
