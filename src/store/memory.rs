//! A store in process memory, for tests and single-process tools.

use std::collections::HashMap;
use std::sync::{Arc, Mutex, MutexGuard};
use std::time::Duration;

use async_trait::async_trait;

use super::{BeginRequest, Look, Store, Waiters};
use crate::error::Error;
use crate::key::{Key, Scope};
use crate::record::{
    decide, duration_millis, now_millis, Begin, Claim, Millis, Outcome, Record, State,
};

/// Records in a map behind a mutex: the claim is atomic because the lookup
/// and the write happen under one lock. Cloning shares the records.
///
/// Nothing survives the process, so this store is for unit tests of code
/// that uses `#[idempotent]`, and for tools that run alone.
#[derive(Clone, Debug, Default)]
pub struct MemoryStore {
    inner: Arc<Inner>,
}

#[derive(Debug, Default)]
struct Inner {
    records: Mutex<HashMap<(String, String), Record>>,
    waiters: Waiters,
}

impl MemoryStore {
    /// An empty store.
    pub fn new() -> Self {
        Self::default()
    }

    /// How many records are held, live or expired.
    pub fn len(&self) -> usize {
        self.records().len()
    }

    /// Whether no record is held.
    pub fn is_empty(&self) -> bool {
        self.len() == 0
    }

    fn records(&self) -> MutexGuard<'_, HashMap<(String, String), Record>> {
        // A panic while holding the lock cannot leave a half-written record:
        // every write is a single insert, remove or field update.
        self.inner.records.lock().unwrap_or_else(|e| e.into_inner())
    }

    fn slot(scope: &Scope, key: &Key) -> (String, String) {
        (scope.as_str().to_owned(), key.as_str().to_owned())
    }

    /// Whether a live claim holds `(scope, key)` now, and which.
    fn look(&self, scope: &Scope, key: &Key) -> Look {
        let now = now_millis();
        match self.records().get(&Self::slot(scope, key)) {
            Some(r) if r.holds_lease(now) => Look::HeldBy(r.token),
            _ => Look::Free,
        }
    }

    /// Runs `write` on the record if it is in progress under `claim`'s
    /// token (or `also` accepts it), then wakes the key's waiters.
    fn fenced(
        &self,
        claim: &Claim,
        also: impl Fn(&Record) -> bool,
        write: impl FnOnce(&mut HashMap<(String, String), Record>, (String, String), Millis),
    ) -> Result<(), Error> {
        let now = now_millis();
        let mut records = self.records();
        let slot = Self::slot(&claim.scope, &claim.key);
        match records.get(&slot) {
            Some(r)
                if r.token == Some(claim.token) && (r.state == State::InProgress || also(r)) =>
            {
                write(&mut records, slot, now);
                Ok(())
            }
            _ => Err(Error::LeaseLost),
        }
    }
}

#[async_trait]
impl Store for MemoryStore {
    async fn begin(&self, req: &BeginRequest<'_>) -> Result<Begin, Error> {
        let now = now_millis();
        let mut records = self.records();
        let slot = Self::slot(req.scope, req.key);
        let fence = match records.get(&slot) {
            None => 1,
            Some(existing) => match decide(req, existing, now).answer()? {
                Some(answer) => return Ok(answer),
                // Free under the lock: this is the atomic takeover.
                None => existing.fence + 1,
            },
        };
        let lease_until = now.saturating_add(duration_millis(req.lease));
        records.insert(
            slot,
            Record {
                scope: req.scope.clone(),
                key: req.key.clone(),
                fingerprint: *req.fingerprint,
                state: State::InProgress,
                fence,
                token: Some(req.token),
                lease_until: Some(lease_until),
                outcome: None,
                created_at: now,
                expires_at: now
                    .saturating_add(duration_millis(req.ttl))
                    .max(lease_until),
            },
        );
        Ok(Begin::Claimed(Claim::granted(req, fence)))
    }

    async fn peek(&self, req: &BeginRequest<'_>) -> Result<Option<Begin>, Error> {
        let now = now_millis();
        match self.records().get(&Self::slot(req.scope, req.key)) {
            None => Ok(None),
            Some(record) => decide(req, record, now).answer(),
        }
    }

    async fn renew(&self, claim: &Claim) -> Result<(), Error> {
        self.fenced(
            claim,
            |_| false,
            |records, slot, now| {
                if let Some(r) = records.get_mut(&slot) {
                    let lease_until = now.saturating_add(duration_millis(claim.lease));
                    r.lease_until = Some(lease_until);
                    r.expires_at = r.expires_at.max(lease_until);
                }
            },
        )
    }

    async fn complete(&self, claim: &Claim, outcome: &Outcome) -> Result<(), Error> {
        self.fenced(
            claim,
            |r| r.outcome.as_ref() == Some(outcome),
            |records, slot, now| {
                if let Some(r) = records.get_mut(&slot) {
                    r.state = State::Completed;
                    r.outcome = Some(outcome.clone());
                    r.lease_until = None;
                    r.expires_at = now.saturating_add(duration_millis(claim.ttl));
                }
            },
        )?;
        self.inner.waiters.hand_over(claim, outcome);
        Ok(())
    }

    async fn release(&self, claim: &Claim) -> Result<(), Error> {
        self.fenced(
            claim,
            |_| false,
            |records, slot, _| {
                records.remove(&slot);
            },
        )?;
        self.inner.waiters.wake(&claim.scope, &claim.key);
        Ok(())
    }

    async fn get(&self, scope: &Scope, key: &Key) -> Result<Option<Record>, Error> {
        Ok(self.records().get(&Self::slot(scope, key)).cloned())
    }

    async fn forget(&self, scope: &Scope, key: &Key) -> Result<bool, Error> {
        let removed = self.records().remove(&Self::slot(scope, key)).is_some();
        self.inner.waiters.wake(scope, key);
        Ok(removed)
    }

    async fn purge_expired(&self, batch: usize) -> Result<u64, Error> {
        let batch = batch.max(1);
        let mut total = 0u64;
        loop {
            let now = now_millis();
            // One lock per batch, like one statement per batch in SQL.
            let mut records = self.records();
            let expired: Vec<_> = records
                .iter()
                .filter(|(_, r)| r.expires_at <= now)
                .map(|(slot, _)| slot.clone())
                .take(batch)
                .collect();
            for slot in &expired {
                records.remove(slot);
            }
            total += expired.len() as u64;
            if expired.len() < batch {
                return Ok(total);
            }
        }
    }

    async fn wait_for_change(
        &self,
        scope: &Scope,
        key: &Key,
        timeout: Duration,
    ) -> Result<(), Error> {
        self.inner
            .waiters
            .wait(scope, key, timeout, || async {
                Ok::<_, Error>(self.look(scope, key))
            })
            .await?;
        Ok(())
    }

    async fn wait_for_outcome(
        &self,
        req: &BeginRequest<'_>,
        timeout: Duration,
    ) -> Result<Option<Begin>, Error> {
        let (scope, key) = (req.scope, req.key);
        let handed = self
            .inner
            .waiters
            .wait(scope, key, timeout, || async {
                Ok::<_, Error>(self.look(scope, key))
            })
            .await?;
        Ok(handed.map(Begin::Replay))
    }

    fn detach(&self) -> Option<Arc<dyn Store>> {
        Some(Arc::new(self.clone()))
    }
}
