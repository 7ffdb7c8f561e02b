//! A relay's side of the outbox: leasing the oldest waiting messages,
//! marking what the broker acknowledged, giving back what failed, parking
//! what the broker refuses for good, and purging what was kept its time.

use std::time::Duration;

use crate::store::sql::outbox::{lease_millis, LeasedRow};
use crate::store::sql::Backend;
use idem_core::error::Error;
use idem_core::record::ClaimToken;

use super::message::{decode_headers, Message};
use super::message_id::MessageId;
use super::publishing::Outbox;

/// The most messages one lease takes (and one mark or give-back sends in
/// a statement), whatever batch is asked for: every message is a bound
/// parameter, which databases limit (SQLite to 32,766 per statement).
pub const MAX_LEASE_BATCH: usize = 1_000;

impl<DB: Backend> Outbox<DB> {
    /// Leases at most `batch` (at most [`MAX_LEASE_BATCH`]) of the oldest
    /// messages that wait (neither
    /// relayed nor leased) for `lease`: no other relay gets them until it
    /// ends. For a relay of your own;
    /// [`kafka::KafkaRelay`](super::kafka::KafkaRelay) does this.
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
        (self.store)
            .outbox_on_seqs(&self.sql.mark, None, seqs, MAX_LEASE_BATCH)
            .await
    }

    /// Gives the messages `seqs` of `lease` back, for the next lease (a
    /// produce that failed); those that another relay leases now are left
    /// alone. Returns how many were given back.
    ///
    /// # Errors
    ///
    /// [`Error::Store`]: they are given back when the lease ends.
    pub async fn release(&self, lease: &Lease, seqs: &[i64]) -> Result<u64, Error> {
        let token = Some(&lease.token);
        (self.store)
            .outbox_on_seqs(&self.sql.release, token, seqs, MAX_LEASE_BATCH)
            .await
    }

    /// Deletes at most `batch` relayed messages kept past their time (see
    /// [Retention](super#retention)); returns how many.
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
    /// it). See [Parked messages](super#parked-messages).
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
        (self.store)
            .outbox_on_seqs(&self.sql.unpark, None, seqs, MAX_LEASE_BATCH)
            .await
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

    /// Its id, for the [`MESSAGE_ID_HEADER`](super::MESSAGE_ID_HEADER) header.
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
