//! In-process wake-ups for duplicates waiting on a key.

use std::collections::HashMap;
use std::sync::{Arc, Mutex};
use std::time::Duration;

use tokio::sync::Notify;

use crate::key::{Key, Scope};

type Slot = (String, String);

/// The duplicates of this process waiting on each key, so that a completion
/// or release in this process wakes them at once instead of at their next
/// poll.
#[derive(Debug, Default)]
pub(crate) struct Waiters {
    slots: Mutex<HashMap<Slot, Arc<Notify>>>,
}

impl Waiters {
    /// Wakes every waiter of `(scope, key)`. Cheap when nobody waits.
    pub(crate) fn wake(&self, scope: &Scope, key: &Key) {
        let slots = self.slots.lock().unwrap_or_else(|e| e.into_inner());
        if slots.is_empty() {
            return;
        }
        if let Some(notify) = slots.get(&(scope.as_str().to_owned(), key.as_str().to_owned())) {
            notify.notify_waiters();
        }
    }

    /// Wakes every waiter of every key (the notifications of a lost
    /// connection may be lost too: each waiter looks again).
    #[cfg_attr(not(feature = "postgres"), allow(dead_code))]
    pub(crate) fn wake_all(&self) {
        let slots = self.slots.lock().unwrap_or_else(|e| e.into_inner());
        for notify in slots.values() {
            notify.notify_waiters();
        }
    }

    /// Waits for a wake-up of `(scope, key)` or `timeout`, whichever comes
    /// first, while another caller holds the key. `held` looks at the record
    /// (with the database's clock) after the waiter is registered, so a wake
    /// between the caller's last look and the registration is not lost: if
    /// the key is no longer held (completed, released, lapsed) this returns
    /// at once.
    pub(crate) async fn wait<F, Fut, E>(
        &self,
        scope: &Scope,
        key: &Key,
        timeout: Duration,
        held: F,
    ) -> Result<(), E>
    where
        F: FnOnce() -> Fut,
        Fut: std::future::Future<Output = Result<bool, E>>,
    {
        let slot: Slot = (scope.as_str().to_owned(), key.as_str().to_owned());
        let notify = {
            let mut slots = self.slots.lock().unwrap_or_else(|e| e.into_inner());
            slots.entry(slot.clone()).or_default().clone()
        };
        let _cleanup = Cleanup {
            waiters: self,
            slot,
            notify: &notify,
        };
        let notified = notify.notified();
        tokio::pin!(notified);
        notified.as_mut().enable();
        if !held().await? {
            return Ok(());
        }
        let _ = tokio::time::timeout(timeout, notified).await;
        Ok(())
    }
}

/// Removes a slot when its last waiter leaves.
struct Cleanup<'a> {
    waiters: &'a Waiters,
    slot: Slot,
    notify: &'a Arc<Notify>,
}

impl Drop for Cleanup<'_> {
    fn drop(&mut self) {
        let mut slots = self.waiters.slots.lock().unwrap_or_else(|e| e.into_inner());
        // The map's handle and ours: nobody else waits.
        if Arc::strong_count(self.notify) <= 2 {
            if let Some(existing) = slots.get(&self.slot) {
                if Arc::ptr_eq(existing, self.notify) {
                    slots.remove(&self.slot);
                }
            }
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::time::Instant;

    #[tokio::test]
    async fn wake_is_prompt_and_slots_are_cleaned() {
        let waiters = Arc::new(Waiters::default());
        let scope = Scope::new("op");
        let key = Key::new("k").unwrap();
        let w = waiters.clone();
        let (s2, k2) = (scope.clone(), key.clone());
        let start = Instant::now();
        let task = tokio::spawn(async move {
            w.wait(&s2, &k2, Duration::from_secs(10), || async {
                Ok::<_, ()>(true)
            })
            .await
        });
        while waiters.slots.lock().unwrap().is_empty() {
            tokio::task::yield_now().await;
        }
        waiters.wake(&scope, &key);
        task.await.unwrap().unwrap();
        assert!(start.elapsed() < Duration::from_secs(5));
        assert!(waiters.slots.lock().unwrap().is_empty());
    }

    #[tokio::test]
    async fn changed_record_returns_at_once() {
        let waiters = Waiters::default();
        let scope = Scope::new("op");
        let key = Key::new("k").unwrap();
        let start = Instant::now();
        waiters
            .wait(&scope, &key, Duration::from_secs(10), || async {
                Ok::<_, ()>(false)
            })
            .await
            .unwrap();
        assert!(start.elapsed() < Duration::from_secs(5));
    }
}
