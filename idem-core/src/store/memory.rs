//! A store in process memory, for tests and single-process tools.

use std::collections::HashMap;
use std::sync::{Arc, Mutex, MutexGuard};
use std::time::Duration;

use async_trait::async_trait;

use super::{BeginRequest, Store, Waiters};
use crate::record::{
    decide, duration_millis, now_millis, Begin, Claim, Decision, Outcome, Record, State,
};
use crate::{Error, Key, Scope};

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
        // every write is a single insert or remove.
        self.inner.records.lock().unwrap_or_else(|e| e.into_inner())
    }

    fn slot(scope: &Scope, key: &Key) -> (String, String) {
        (scope.as_str().to_owned(), key.as_str().to_owned())
    }

    fn remove_claim(&self, claim: &Claim) -> Result<(), Error> {
        let mut records = self.records();
        let slot = Self::slot(&claim.scope, &claim.key);
        match records.get(&slot) {
            Some(r) if r.state == State::InProgress && r.fence == claim.fence => {
                records.remove(&slot);
                drop(records);
                self.inner.waiters.wake(&claim.scope, &claim.key);
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
            Some(existing) => match decide(existing, req.fingerprint, now) {
                Decision::Answer(answer) => return Ok(answer),
                // Free under the lock: this is the atomic takeover.
                Decision::Retry => existing.fence + 1,
            },
        };
        records.insert(
            slot,
            Record {
                scope: req.scope.clone(),
                key: req.key.clone(),
                fingerprint: *req.fingerprint,
                state: State::InProgress,
                fence,
                lease_until: Some(now.saturating_add(duration_millis(req.lease))),
                outcome: None,
                created_at: now,
                expires_at: now.saturating_add(duration_millis(req.ttl)),
            },
        );
        Ok(Begin::Claimed(Claim {
            scope: req.scope.clone(),
            key: req.key.clone(),
            fence,
            ttl: req.ttl,
        }))
    }

    async fn complete(&self, claim: &Claim, outcome: &Outcome) -> Result<(), Error> {
        let now = now_millis();
        let mut records = self.records();
        match records.get_mut(&Self::slot(&claim.scope, &claim.key)) {
            Some(r) if r.state == State::InProgress && r.fence == claim.fence => {
                r.state = State::Completed;
                r.outcome = Some(outcome.clone());
                r.lease_until = None;
                r.expires_at = now.saturating_add(duration_millis(claim.ttl));
            }
            _ => return Err(Error::LeaseLost),
        }
        drop(records);
        self.inner.waiters.wake(&claim.scope, &claim.key);
        Ok(())
    }

    async fn release(&self, claim: &Claim) -> Result<(), Error> {
        self.remove_claim(claim)
    }

    async fn get(&self, scope: &Scope, key: &Key) -> Result<Option<Record>, Error> {
        Ok(self.records().get(&Self::slot(scope, key)).cloned())
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
        let waiters = &self.inner.waiters;
        waiters
            .wait(scope, key, timeout, || async {
                Ok::<_, Error>(self.records().get(&Self::slot(scope, key)).cloned())
            })
            .await
    }
}
