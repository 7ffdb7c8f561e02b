//! A store written outside `idem`, on `idem-core` alone, as a store author
//! writes one, start to end: records in a map behind a mutex, the claim
//! decided under the lock. It passes the exported conformance suite.

use std::collections::HashMap;
use std::sync::{Arc, Mutex};
use std::time::Duration;

use async_trait::async_trait;
use idem_core::record::{
    decide, duration_millis, now_millis, Begin, BeginRequest, Claim, Outcome, Record, State,
};
use idem_core::store::{Capabilities, Detach, Store};
use idem_core::{Error, Key, Scope};

/// Records by `(scope, key)`; clones share them.
#[derive(Clone, Default)]
pub struct MapStore {
    records: Arc<Mutex<HashMap<(Scope, Key), Record>>>,
}

impl MapStore {
    fn records(&self) -> std::sync::MutexGuard<'_, HashMap<(Scope, Key), Record>> {
        self.records.lock().unwrap_or_else(|e| e.into_inner())
    }

    /// Runs `write` on the record `claim` holds in progress, or fails with
    /// `LeaseLost`; `also` accepts another state of the record.
    fn fenced(
        &self,
        claim: &Claim,
        also: impl Fn(&Record) -> bool,
        write: impl FnOnce(&mut HashMap<(Scope, Key), Record>, (Scope, Key), i64),
    ) -> Result<(), Error> {
        let mut records = self.records();
        let slot = (claim.scope.clone(), claim.key.clone());
        match records.get(&slot) {
            Some(r)
                if r.token == Some(claim.token) && (r.state == State::InProgress || also(r)) =>
            {
                write(&mut records, slot, now_millis());
                Ok(())
            }
            _ => Err(Error::LeaseLost),
        }
    }
}

fn after(now: i64, d: Duration) -> i64 {
    now.saturating_add(duration_millis(d))
}

#[async_trait]
impl Store for MapStore {
    async fn begin(&self, req: &BeginRequest<'_>) -> Result<Begin, Error> {
        let mut records = self.records();
        let now = now_millis();
        let slot = (req.scope.clone(), req.key.clone());
        // A live record answers through the state machine, unless its
        // lease lapsed: then it is taken over, with the next fence.
        let fence = match records.get(&slot) {
            Some(r) if r.expires_at > now => match decide(req, r, now).answer()? {
                Some(answer) => return Ok(answer),
                None => r.fence + 1,
            },
            _ => 1,
        };
        let lease_until = after(now, req.lease);
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
                expires_at: after(now, req.ttl).max(lease_until),
            },
        );
        Ok(Begin::Claimed(Claim::granted(req, fence)))
    }

    async fn renew(&self, claim: &Claim) -> Result<(), Error> {
        self.fenced(
            claim,
            |_| false,
            |records, slot, now| {
                let r = records.get_mut(&slot).expect("held under the lock");
                r.lease_until = Some(after(now, claim.lease));
                r.expires_at = r.expires_at.max(after(now, claim.lease));
            },
        )
    }

    async fn complete(&self, claim: &Claim, outcome: &Outcome) -> Result<(), Error> {
        let same = |r: &Record| r.state == State::Completed && r.outcome.as_ref() == Some(outcome);
        self.fenced(claim, same, |records, slot, now| {
            let r = records.get_mut(&slot).expect("held under the lock");
            r.state = State::Completed;
            r.outcome = Some(outcome.clone());
            r.lease_until = None;
            r.expires_at = after(now, claim.ttl);
        })
    }

    async fn release(&self, claim: &Claim) -> Result<(), Error> {
        self.fenced(
            claim,
            |_| false,
            |records, slot, _| {
                records.remove(&slot);
            },
        )
    }

    async fn get(&self, scope: &Scope, key: &Key) -> Result<Option<Record>, Error> {
        Ok(self.records().get(&(scope.clone(), key.clone())).cloned())
    }

    async fn forget(&self, scope: &Scope, key: &Key) -> Result<bool, Error> {
        let slot = (scope.clone(), key.clone());
        Ok(self.records().remove(&slot).is_some())
    }

    async fn purge_expired(&self, _batch: usize) -> Result<u64, Error> {
        let mut records = self.records();
        let (before, now) = (records.len(), now_millis());
        records.retain(|_, r| r.expires_at > now);
        Ok((before - records.len()) as u64)
    }

    fn capabilities(&self) -> Capabilities<'_> {
        Capabilities::default().with_detach(self)
    }
}

impl Detach for MapStore {
    fn detach(&self) -> Option<Arc<dyn Store>> {
        Some(Arc::new(self.clone()))
    }
}

idem_core::contract_conformance!(map_store, async { (MapStore::default(), ()) });
