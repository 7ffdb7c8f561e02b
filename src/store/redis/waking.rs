//! The waits of duplicates on the Redis store ([`Wake`](crate::store::Wake)):
//! a waiter subscribes to its record's channel
//! ([`subscriptions`](super::subscriptions)) before it looks, and a
//! completion or release publishes there.

use std::sync::atomic::Ordering;

use super::replies::now_and_record;
use super::scripts::SCRIPTS;
use super::{Keys, RedisStore};
use crate::store::{wake_by_waiting, Look};
use idem_core::error::Error;
use idem_core::fingerprint::Fingerprint;

impl RedisStore {
    /// Answers whether the record is held by a live lease (and whose),
    /// marking it waited: a waiter's look, after it subscribed.
    /// Only a claim of the payload of `fingerprint` (of any payload:
    /// `None`) is taken for the holder.
    async fn look(&self, keys: &Keys, fingerprint: Option<&Fingerprint>) -> Result<Look, Error> {
        let value = self.invoke(SCRIPTS.look.on(&keys.record)).await?;
        let (now, record) = now_and_record(value)?;
        Ok(Look::at(record.as_ref(), now, fingerprint))
    }
}

// A waiter subscribes to the record's channel before it looks, so that a
// completion after the look is heard; the subscription lives as long as
// the wait, and a failed one leaves the poll.
wake_by_waiting!(
    RedisStore,
    |store, scope, key, fingerprint, timeout| {
        let keys = store.keys(scope, key);
        let shared = &store.shared;
        let mut subscription = None;
        let held = &mut subscription;
        let look = move || async move {
            *held = Some(shared.subscriptions.subscribe(&keys.channel).await);
            store.look(&keys, fingerprint).await
        };
        let handed = shared.waiters.wait(scope, key, timeout, look).await;
        drop(subscription);
        handed
    },
    across: |store: &RedisStore| store.shared.listening.load(Ordering::Relaxed),
);
