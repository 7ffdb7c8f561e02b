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
//!
//! [`Error::Config`]: crate::Error::Config
//! [`Error::LeaseLost`]: crate::Error::LeaseLost

// The rooms, from the ground up:
// - `message`: a message, checked as it is built, and its stored and
//   serialized forms;
// - `message_id`: the id a message derives from its operation and itself;
// - `publishing`: the outbox of a store, and writing messages into it;
// - `relaying`: a relay's side: lease, mark, give back, park, purge;
// - `kafka`: the relay to Kafka.
mod message;
mod message_id;
mod publishing;
mod relaying;

#[cfg(feature = "kafka")]
#[cfg_attr(docsrs, doc(cfg(feature = "kafka")))]
pub mod kafka;

pub use message::{
    InvalidMessage, Message, MAX_MESSAGE_BYTES, MAX_OUTPUTS_BYTES, MAX_TOPIC_LEN, MESSAGE_ID_HEADER,
};
pub use message_id::MessageId;
pub use publishing::Outbox;
pub use relaying::{Lease, Leased, Parked, MAX_LEASE_BATCH};
