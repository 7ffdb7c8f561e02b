//! A store in process memory, for tests and single-process tools.

use std::sync::{Arc, Mutex, MutexGuard};
use std::time::Duration;
use tokio::time::Instant;

use async_trait::async_trait;

mod records;

use super::{
    wake_by_waiting, BeginRequest, Capabilities, Detach, Immediate, Journal, Look, Store, Waiters,
};
use idem_core::error::Error;
use idem_core::fingerprint::Fingerprint;
use idem_core::journal::{
    decide_step, StepAt, StepBegin, StepDecision, StepRecord, StepRequest, StepResolution,
    StepState,
};
use idem_core::key::{Key, Scope};
use idem_core::record::{
    decide, duration_millis, now_millis, Begin, Claim, Millis, Outcome, Record, State,
};
use records::Records;

/// Records in a map behind a mutex: the claim is atomic because the lookup
/// and the write happen under one lock. Cloning shares the records.
///
/// Nothing survives the process, so this store is for unit tests of code
/// that uses `#[idempotent]`, and for tools that run alone.
#[derive(Clone, Debug, Default)]
pub struct MemoryStore {
    inner: Arc<Shared>,
}

/// The records, which a [`MemoryStore`] and its clones share. It is the
/// store itself: a store handle is an `Arc` of it, so that detaching one
/// ([`Detach`], once per execution) allocates nothing.
#[derive(Debug, Default)]
struct Shared {
    clock: Clock,
    records: Mutex<Records>,
    /// The step journal, by operation, then by `seq`. Taken only under
    /// the records' lock, which fences it.
    journal: Mutex<StepsMap>,
    waiters: Waiters,
}

type StepsMap = std::collections::HashMap<Slot, std::collections::BTreeMap<u32, StepRecord>>;

/// The journal entry of `step`, written by its claim at `now`: started,
/// or completed with `output`.
fn journal_entry(step: &StepRequest<'_>, output: Option<&[u8]>, now: Millis) -> StepRecord {
    let claim = step.claim;
    StepRecord {
        scope: claim.scope.clone(),
        key: claim.key.clone(),
        seq: step.seq,
        name: step.name.to_owned(),
        fingerprint: *step.fingerprint,
        state: match output {
            Some(_) => StepState::Completed,
            None => StepState::Started,
        },
        token: claim.token,
        output: output.map(<[u8]>::to_vec),
        updated_at: now,
        expires_at: now.saturating_add(duration_millis(step.ttl)),
    }
}

/// Whose steps a journal holds: an operation's scope and key, shared with
/// its record (a clone only counts a reference).
#[derive(Clone, Debug, PartialEq, Eq, Hash)]
struct Slot {
    scope: Scope,
    key: Key,
}

impl Slot {
    fn of(scope: &Scope, key: &Key) -> Self {
        Slot {
            scope: scope.clone(),
            key: key.clone(),
        }
    }
}

/// The store's time: this process's wall clock when the store was made,
/// then its monotonic clock.
///
/// A step of the wall clock (a correction by NTP, an operator's `date`)
/// moves neither a lease nor an expiry: read from the wall clock, a step
/// forward past a lease would let a duplicate take over a body still
/// running in this process, and run it twice, and one back would keep a
/// record past its TTL. The records' times stay near the wall clock's
/// (apart by what the wall clock was corrected since).
#[derive(Debug)]
struct Clock {
    /// The wall clock's [`Millis`] at `start`.
    wall: Millis,
    start: Instant,
}

impl Default for Clock {
    fn default() -> Self {
        Clock {
            wall: now_millis(),
            start: Instant::now(),
        }
    }
}

impl Clock {
    fn now(&self) -> Millis {
        self.wall
            .saturating_add(duration_millis(self.start.elapsed()))
    }
}

impl MemoryStore {
    /// An empty store.
    pub fn new() -> Self {
        Self::default()
    }

    /// How many records are held, live or expired.
    pub fn len(&self) -> usize {
        self.inner.records().len()
    }

    /// Whether no record is held.
    pub fn is_empty(&self) -> bool {
        self.len() == 0
    }
}

#[async_trait]
impl Store for MemoryStore {
    async fn begin(&self, req: &BeginRequest<'_>) -> Result<Begin, Error> {
        self.inner.claim(req)
    }
    async fn peek(&self, req: &BeginRequest<'_>) -> Result<Option<Begin>, Error> {
        Store::peek(&*self.inner, req).await
    }
    async fn renew(&self, claim: &Claim) -> Result<(), Error> {
        Store::renew(&*self.inner, claim).await
    }
    async fn complete(&self, claim: &Claim, outcome: &Outcome) -> Result<(), Error> {
        self.inner.completed(claim, outcome)
    }
    async fn release(&self, claim: &Claim) -> Result<(), Error> {
        Store::release(&*self.inner, claim).await
    }
    async fn get(&self, scope: &Scope, key: &Key) -> Result<Option<Record>, Error> {
        Store::get(&*self.inner, scope, key).await
    }
    async fn forget(&self, scope: &Scope, key: &Key) -> Result<bool, Error> {
        Store::forget(&*self.inner, scope, key).await
    }
    async fn purge_expired(&self, batch: usize) -> Result<u64, Error> {
        Store::purge_expired(&*self.inner, batch).await
    }
    fn journal(&self) -> Option<&dyn Journal> {
        Some(&*self.inner)
    }
    fn capabilities(&self) -> Capabilities<'_> {
        Store::capabilities(&*self.inner).with_detach(self)
    }
}

impl Detach for MemoryStore {
    fn detach(&self) -> Option<Arc<dyn Store>> {
        Some(self.inner.clone() as Arc<dyn Store>)
    }
}

impl Shared {
    fn records(&self) -> MutexGuard<'_, Records> {
        // A panic while holding the lock cannot leave a half-written record:
        // every write is a single insert, remove or field update.
        self.records.lock().unwrap_or_else(|e| e.into_inner())
    }

    fn steps_map(&self) -> MutexGuard<'_, StepsMap> {
        self.journal.lock().unwrap_or_else(|e| e.into_inner())
    }

    /// Runs `write` on the journal of `claim`'s operation, under the
    /// records' lock, while the record is in progress under the claim.
    fn journaled<T>(
        &self,
        claim: &Claim,
        write: impl FnOnce(&mut std::collections::BTreeMap<u32, StepRecord>, Millis) -> T,
    ) -> Result<T, Error> {
        let records = self.records();
        match records.get(&claim.scope, &claim.key) {
            Some(r) if r.token == Some(claim.token) && r.state == State::InProgress => {}
            _ => return Err(Error::LeaseLost),
        }
        let mut journal = self.steps_map();
        let steps = journal
            .entry(Slot::of(&claim.scope, &claim.key))
            .or_default();
        Ok(write(steps, self.clock.now()))
    }

    /// The claim: [`Store::begin`], which never waits here.
    fn claim(&self, req: &BeginRequest<'_>) -> Result<Begin, Error> {
        let mut records = self.records();
        // Read under the lock: a lease counts from when it is written, not
        // from before a wait for the lock, which could eat all of it.
        let now = self.clock.now();
        let lease_until = now.saturating_add(duration_millis(req.lease));
        let expires_at = now
            .saturating_add(duration_millis(req.ttl))
            .max(lease_until);
        let claimed = |fence| Record {
            scope: req.scope.clone(),
            key: req.key.clone(),
            fingerprint: *req.fingerprint,
            state: State::InProgress,
            fence,
            token: Some(req.token),
            lease_until: Some(lease_until),
            outcome: None,
            created_at: now,
            expires_at,
        };
        // Hashed once, for the look-up and the insert.
        let hash = records.hash(req.scope, req.key);
        let fence = match records.find(hash, req.scope, req.key) {
            None => {
                records.push(hash, claimed(1))?;
                1
            }
            Some(at) => match decide(req, records.at(at), now).answer()? {
                Some(answer) => return Ok(answer),
                // Free under the lock: this is the atomic takeover.
                None => {
                    let record = records.at_mut(at);
                    let fence = record.fence + 1;
                    *record = claimed(fence);
                    fence
                }
            },
        };
        // The claim joins the operation's journal, if it has one: the
        // record must not outlive the steps it would otherwise run again.
        self.keep_journal(req.scope, req.key, now, expires_at);
        Ok(Begin::Claimed(Claim::granted(req, fence)))
    }

    /// Keeps every live entry of the journal of `(scope, key)` until at
    /// least `until` (an expired one stays expired).
    fn keep_journal(&self, scope: &Scope, key: &Key, now: Millis, until: Millis) {
        if let Some(steps) = self.steps_map().get_mut(&Slot::of(scope, key)) {
            for step in steps.values_mut().filter(|step| step.expires_at > now) {
                step.expires_at = step.expires_at.max(until);
            }
        }
    }

    /// The completion: [`Store::complete`], which never waits here.
    fn completed(&self, claim: &Claim, outcome: &Outcome) -> Result<(), Error> {
        self.fenced(
            claim,
            |r| r.outcome.as_ref() == Some(outcome),
            |records, at, now| {
                let r = records.at_mut(at);
                r.state = State::Completed;
                r.outcome = Some(outcome.clone());
                r.lease_until = None;
                r.expires_at = now.saturating_add(duration_millis(claim.ttl));
            },
        )?;
        self.waiters.hand_over(claim, outcome);
        Ok(())
    }

    /// Whether a live claim of the payload of `fingerprint` (of any
    /// payload: `None`) holds `(scope, key)` now, and which.
    fn look(&self, scope: &Scope, key: &Key, fingerprint: Option<&Fingerprint>) -> Look {
        let records = self.records();
        Look::at(records.get(scope, key), self.clock.now(), fingerprint)
    }

    /// Runs `write` on the record if it is in progress under `claim`'s
    /// token (or `also` accepts it).
    fn fenced(
        &self,
        claim: &Claim,
        also: impl Fn(&Record) -> bool,
        write: impl FnOnce(&mut Records, usize, Millis),
    ) -> Result<(), Error> {
        let mut records = self.records();
        // Under the lock, as in `claim`: a renewal's lease counts from when
        // it is written.
        let now = self.clock.now();
        let hash = records.hash(&claim.scope, &claim.key);
        match records.find(hash, &claim.scope, &claim.key) {
            Some(at)
                if records.at(at).token == Some(claim.token)
                    && (records.at(at).state == State::InProgress || also(records.at(at))) =>
            {
                write(&mut records, at, now);
                Ok(())
            }
            _ => Err(Error::LeaseLost),
        }
    }
}

#[async_trait]
impl Store for Shared {
    async fn begin(&self, req: &BeginRequest<'_>) -> Result<Begin, Error> {
        self.claim(req)
    }

    async fn peek(&self, req: &BeginRequest<'_>) -> Result<Option<Begin>, Error> {
        let records = self.records();
        match records.get(req.scope, req.key) {
            None => Ok(None),
            Some(record) => decide(req, record, self.clock.now()).answer(),
        }
    }

    async fn renew(&self, claim: &Claim) -> Result<(), Error> {
        self.fenced(
            claim,
            |_| false,
            |records, at, now| {
                let r = records.at_mut(at);
                let lease_until = now.saturating_add(duration_millis(claim.lease));
                r.lease_until = Some(lease_until);
                r.expires_at = r.expires_at.max(lease_until);
            },
        )
    }

    async fn complete(&self, claim: &Claim, outcome: &Outcome) -> Result<(), Error> {
        self.completed(claim, outcome)
    }

    async fn release(&self, claim: &Claim) -> Result<(), Error> {
        self.fenced(
            claim,
            |_| false,
            |records, at, _| {
                records.swap_remove(at);
            },
        )?;
        self.waiters.wake(&claim.scope, &claim.key);
        Ok(())
    }

    async fn get(&self, scope: &Scope, key: &Key) -> Result<Option<Record>, Error> {
        Ok(self.records().get(scope, key).cloned())
    }

    async fn forget(&self, scope: &Scope, key: &Key) -> Result<bool, Error> {
        let mut records = self.records();
        let removed = records.remove(scope, key).is_some();
        self.steps_map().remove(&Slot::of(scope, key));
        drop(records);
        self.waiters.wake(scope, key);
        Ok(removed)
    }

    async fn purge_expired(&self, batch: usize) -> Result<u64, Error> {
        let batch = batch.max(1);
        let mut total = 0u64;
        loop {
            // One lock per batch, like one statement per batch in SQL.
            let mut records = self.records();
            let now = self.clock.now();
            let expired: Vec<_> = records
                .iter()
                .filter(|r| r.expires_at <= now)
                .map(|r| Slot::of(&r.scope, &r.key))
                .take(batch)
                .collect();
            for slot in &expired {
                records.remove(&slot.scope, &slot.key);
            }
            total += expired.len() as u64;
            if expired.len() < batch {
                break;
            }
        }
        let now = self.clock.now();
        let mut journal = self.steps_map();
        for steps in journal.values_mut() {
            let before = steps.len();
            steps.retain(|_, step| step.expires_at > now);
            total += (before - steps.len()) as u64;
        }
        journal.retain(|_, steps| !steps.is_empty());
        Ok(total)
    }

    fn journal(&self) -> Option<&dyn Journal> {
        Some(self)
    }

    fn capabilities(&self) -> Capabilities<'_> {
        Capabilities::default().with_wake(self).with_immediate(self)
    }
}

impl Immediate for Shared {
    fn begin_now(&self, req: &BeginRequest<'_>) -> Option<Result<Begin, Error>> {
        Some(self.claim(req))
    }

    fn complete_now(&self, claim: &Claim, outcome: &Outcome) -> Option<Result<(), Error>> {
        Some(self.completed(claim, outcome))
    }
}

#[async_trait]
impl Journal for Shared {
    async fn begin_step(&self, step: &StepRequest<'_>) -> Result<StepBegin, Error> {
        let claim = step.claim;
        self.journaled(claim, |steps, now| {
            let entry = steps.get(&step.seq);
            match decide_step(step, entry, now) {
                StepDecision::Answer(answer) => answer,
                StepDecision::Start(run) => {
                    steps.insert(step.seq, journal_entry(step, None, now));
                    StepBegin::Run(run)
                }
            }
        })
    }

    async fn complete_step(&self, step: &StepRequest<'_>, output: &[u8]) -> Result<(), Error> {
        let claim = step.claim;
        self.journaled(claim, |steps, now| match steps.get_mut(&step.seq) {
            Some(entry) if entry.name == step.name && entry.state != StepState::Completed => {
                entry.state = StepState::Completed;
                entry.token = claim.token;
                entry.output = Some(output.to_vec());
                entry.updated_at = now;
                entry.expires_at = now.saturating_add(duration_millis(step.ttl));
                Ok(())
            }
            Some(entry) if entry.output.as_deref() == Some(output) => Ok(()),
            // Never started (its entry's write failed while the step ran):
            // journaled all the same.
            None => {
                steps.insert(step.seq, journal_entry(step, Some(output), now));
                Ok(())
            }
            _ => Err(super::step_not_journaled(step)),
        })?
    }

    async fn undo_step(&self, step: &StepRequest<'_>) -> Result<bool, Error> {
        let claim = step.claim;
        let mut journal = self.steps_map();
        let slot = Slot::of(&claim.scope, &claim.key);
        let Some(steps) = journal.get_mut(&slot) else {
            return Ok(false);
        };
        let started_by_claim = steps.get(&step.seq).is_some_and(|entry| {
            entry.name == step.name
                && entry.state == StepState::Started
                && entry.token == claim.token
        });
        if started_by_claim {
            steps.remove(&step.seq);
            if steps.is_empty() {
                journal.remove(&slot);
            }
        }
        Ok(started_by_claim)
    }

    async fn keep_steps(&self, scope: &Scope, key: &Key, ttl: Duration) -> Result<(), Error> {
        let _records = self.records();
        let now = self.clock.now();
        self.keep_journal(scope, key, now, now.saturating_add(duration_millis(ttl)));
        Ok(())
    }

    async fn steps(&self, scope: &Scope, key: &Key) -> Result<Vec<StepRecord>, Error> {
        let _records = self.records();
        Ok(self
            .steps_map()
            .get(&Slot::of(scope, key))
            .map(|steps| steps.values().cloned().collect())
            .unwrap_or_default())
    }

    async fn resolve_step(&self, step: &StepAt<'_>, to: &StepResolution) -> Result<bool, Error> {
        let records = self.records();
        let now = self.clock.now();
        let mut journal = self.steps_map();
        // The attempt that started the step, if it still holds the
        // operation: its step is running, not in doubt.
        let running = records
            .get(step.scope, step.key)
            .filter(|r| r.state == State::InProgress && r.lease_until.is_some_and(|l| l > now))
            .and_then(|r| r.token);
        let Some(entry) = journal
            .get_mut(&Slot::of(step.scope, step.key))
            .and_then(|steps| steps.get_mut(&step.seq))
            .filter(|entry| {
                entry.name == step.name
                    && entry.state != StepState::Completed
                    && entry.expires_at > now
                    && running != Some(entry.token)
            })
        else {
            return Ok(false);
        };
        match to {
            StepResolution::Completed(output) => {
                entry.state = StepState::Completed;
                entry.output = Some(output.clone());
            }
            StepResolution::Rerun => entry.state = StepState::RerunAllowed,
        }
        entry.updated_at = now;
        Ok(true)
    }
}

// Duplicates wait through the store's waiters, and look at the record
// under its lock.
wake_by_waiting!(Shared, |store, scope, key, fingerprint, timeout| {
    let look = || async { Ok::<_, Error>(store.look(scope, key, fingerprint)) };
    store.waiters.wait(scope, key, timeout, look).await
});

// `detach` is `MemoryStore`'s, which holds the `Arc` of this.
