//! `payment.created`: the event every new payment publishes, exactly once,
//! through the library's transactional outbox.
//!
//! [`Payments::create`](super::service::Payments::create) runs in entity
//! mode: its body hands [`Events::payment_created`] the payment it is about
//! to return, and the message is held until the payment's row is inserted,
//! then written to the outbox table (`idem_records_outbox`) in that same
//! transaction. The row and its event commit together or not at all; a
//! retry that finds the row runs no body and enqueues nothing.
//!
//! A relay ([`idem::outbox::kafka::KafkaRelay`]) produces what the outbox
//! holds to Kafka, each record keyed by the payment's id (its partition
//! keeps a payment's events in order) and carrying its message id in the
//! `idem-message-id` header, for consumers to deduplicate on. The app runs
//! one when it is built with `--features kafka` and started with
//! `--kafka-brokers` (or `$KAFKA_BROKERS`); otherwise the events wait in
//! the outbox, for a relay started later to produce.

use idem::outbox::{Message, MessageId, Outbox};
use idem::store::{Backend, SqlStore};
use serde_json::json;

use super::model::Payment;

/// The topic payments are announced on, unless `--events-topic` names
/// another.
pub const PAYMENT_CREATED: &str = "payment.created";

/// Where a database's payments announce themselves: its outbox, and the
/// topic.
pub struct Events<DB: Backend> {
    pub outbox: Outbox<DB>,
    pub topic: String,
}

impl<DB: Backend> Events<DB> {
    /// The outbox in the database of `pool`, beside the records table its
    /// migrations created, and the default topic.
    pub fn new(pool: &sqlx::Pool<DB>) -> Self {
        Events {
            outbox: Outbox::new(&SqlStore::new(pool.clone())),
            topic: PAYMENT_CREATED.to_owned(),
        }
    }

    /// Inside the body of an entity-mode operation: holds `payment`'s
    /// `payment.created` for the transaction that inserts it. Answers the
    /// message's id, the one its record carries.
    pub fn payment_created(&self, payment: &Payment) -> Result<MessageId, idem::Error> {
        let payload = json!({
            "payment_id": payment.id,
            "amount": payment.amount,
            "currency": payment.currency,
            "status": payment.status,
            "idempotency_key": payment.idempotency_token,
        });
        let message = Message::new(&self.topic, payload.to_string())?
            .with_key(payment.id.as_str())?
            .with_header("content-type", "application/json")?;
        self.outbox.enqueue(message)
    }

    /// A relay of this outbox to the Kafka cluster at `brokers` (bootstrap
    /// servers), with the relay's defaults: run it on a task of its own.
    #[cfg(feature = "kafka")]
    pub fn relay(&self, brokers: &str) -> Result<idem::outbox::kafka::KafkaRelay<DB>, idem::Error> {
        let mut config = rdkafka::ClientConfig::new();
        config.set("bootstrap.servers", brokers);
        idem::outbox::kafka::KafkaRelay::new(self.outbox.clone(), &config)
    }
}
