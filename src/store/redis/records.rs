//! The record transitions of the Redis store ([`Store`]): each one
//! script, its claim answered by [`decide`] when it finds the key taken.

use std::time::Duration;

use async_trait::async_trait;
use redis::Value;

use super::calls::millis;
use super::replies::{array, corrupt, int, now_and_record, parse_record, status};
use super::scripts::{Invocation, Lua, SCRIPTS};
use super::{Keys, RedisStore};
use crate::store::{Capabilities, Journal, Store};
use idem_core::error::Error;
use idem_core::key::{Key, Scope};
use idem_core::record::{decide, Begin, BeginRequest, Claim, Outcome, Record};

/// The claim script's call for `request` on the record at `keys`.
pub(super) fn claim_call(keys: &Keys, request: &BeginRequest<'_>) -> Invocation<'static> {
    SCRIPTS
        .claim
        .on(&keys.record)
        .key(&keys.journal)
        .arg(request.scope.as_str())
        .arg(request.key.as_str())
        .arg(&request.fingerprint.as_bytes()[..])
        .arg(&request.token.as_bytes()[..])
        .arg(millis(request.lease))
        .arg(millis(request.ttl))
}

#[async_trait]
impl Store for RedisStore {
    async fn begin(&self, request: &BeginRequest<'_>) -> Result<Begin, Error> {
        let keys = self.keys(request.scope, request.key);
        // A record found free that the script did not claim changed in
        // between: impossible in one script, so a few rounds at most.
        for _ in 0..3 {
            let (value, acknowledged) = self.invoke_replicated(claim_call(&keys, request)).await?;
            let mut items = array(value)?;
            match status(&items)? {
                "claimed" => {
                    let fence = items.get(1).and_then(int).ok_or_else(|| corrupt("fence"))?;
                    let claim = Claim::granted(request, fence);
                    if !acknowledged {
                        // Not durable: hand it back, so that no body runs
                        // on a claim a failover may lose.
                        let _ = self.release_then(&claim, None).await;
                        return Err(self.not_replicated("claim"));
                    }
                    return Ok(Begin::Claimed(claim));
                }
                "found" => {
                    let now = items
                        .get(1)
                        .and_then(int)
                        .ok_or_else(|| corrupt("no time"))?;
                    let fields = array(items.pop().unwrap_or(Value::Nil))?;
                    let record = parse_record(fields)?.ok_or_else(|| corrupt("no record"))?;
                    if let Some(answer) = decide(request, &record, now).answer()? {
                        return Ok(answer);
                    }
                }
                other => return Err(Error::store(format!("unexpected claim answer {other:?}"))),
            }
        }
        Err(Error::store(
            "the Redis claim script and record::decide disagree on whether the key is free",
        ))
    }

    async fn peek(&self, request: &BeginRequest<'_>) -> Result<Option<Begin>, Error> {
        let keys = self.keys(request.scope, request.key);
        let value = self.invoke(SCRIPTS.peek.on(&keys.record)).await?;
        match now_and_record(value)? {
            (_, None) => Ok(None),
            (now, Some(record)) => decide(request, &record, now).answer(),
        }
    }

    async fn renew(&self, claim: &Claim) -> Result<(), Error> {
        let keys = self.keys(&claim.scope, &claim.key);
        // Not waited for (`wait_for_replicas` says why).
        let value = self
            .invoke(
                SCRIPTS
                    .renew
                    .on(&keys.record)
                    .arg(&claim.token.as_bytes()[..])
                    .arg(millis(claim.lease)),
            )
            .await?;
        match int(&value) {
            Some(1) => Ok(()),
            _ => Err(Error::LeaseLost),
        }
    }

    async fn complete(&self, claim: &Claim, outcome: &Outcome) -> Result<(), Error> {
        let keys = self.keys(&claim.scope, &claim.key);
        let complete = self.complete_once(claim, outcome, &keys);
        self.shared.waiters.complete(claim, outcome, complete).await
    }

    async fn release(&self, claim: &Claim) -> Result<(), Error> {
        self.release_then(claim, self.replicas).await
    }

    async fn get(&self, scope: &Scope, key: &Key) -> Result<Option<Record>, Error> {
        let keys = self.keys(scope, key);
        let value = self.invoke(SCRIPTS.peek.on(&keys.record)).await?;
        Ok(now_and_record(value)?.1)
    }

    async fn forget(&self, scope: &Scope, key: &Key) -> Result<bool, Error> {
        let keys = self.keys(scope, key);
        let (value, acknowledged) = self
            .invoke_replicated(
                SCRIPTS
                    .forget
                    .on(&keys.record)
                    .key(&keys.journal)
                    .arg(self.publish())
                    .arg(&keys.channel),
            )
            .await?;
        self.shared.waiters.wake(scope, key);
        self.replicated(acknowledged, "forget")?;
        Ok(int(&value) == Some(1))
    }

    /// Nothing to do: Redis deletes expired records and journals itself.
    async fn purge_expired(&self, batch: usize) -> Result<u64, Error> {
        let _ = batch;
        Ok(0)
    }

    fn journal(&self) -> Option<&dyn Journal> {
        Some(self)
    }

    fn capabilities(&self) -> Capabilities<'_> {
        Capabilities::default()
            .with_wake(self)
            .with_detach(self)
            .deleting_expired_itself()
    }
}

impl RedisStore {
    /// A call of `lua`, a script that ends `claim` on the record at `keys`
    /// and publishes on its channel: the record, then how to publish, the
    /// channel and the claim's token.
    fn fenced_call<'a>(&self, lua: &'a Lua, keys: &Keys, claim: &Claim) -> Invocation<'a> {
        lua.on(&keys.record)
            .arg(self.publish())
            .arg(&keys.channel)
            .arg(&claim.token.as_bytes()[..])
    }

    /// The completion script, and `WAIT` if asked for.
    pub(super) async fn complete_once(
        &self,
        claim: &Claim,
        outcome: &Outcome,
        keys: &Keys,
    ) -> Result<(), Error> {
        self.check_length(&keys.record, outcome.body.len(), "an outcome")
            .await?;
        let (value, acknowledged) = self
            .invoke_replicated(
                self.fenced_call(&SCRIPTS.complete, keys, claim)
                    .arg(outcome.kind.code())
                    .arg(&outcome.body[..])
                    .arg(millis(claim.ttl)),
            )
            .await?;
        if int(&value) != Some(1) {
            return Err(Error::LeaseLost);
        }
        self.replicated(acknowledged, "completion")
    }

    /// The release of `claim`, then `WAIT` for `replicas` if asked for.
    /// A release that no replica acknowledged is done on the primary
    /// (the key is free there) and fails with a store error: a failover
    /// may bring the claim back, to be taken over once its lease runs
    /// out.
    pub(super) async fn release_then(
        &self,
        claim: &Claim,
        replicas: Option<(u32, Duration)>,
    ) -> Result<(), Error> {
        let keys = self.keys(&claim.scope, &claim.key);
        let (value, acknowledged) = self
            .invoke_then(self.fenced_call(&SCRIPTS.release, &keys, claim), replicas)
            .await?;
        if int(&value) != Some(1) {
            return Err(Error::LeaseLost);
        }
        self.shared.waiters.wake(&claim.scope, &claim.key);
        self.replicated(acknowledged, "release")
    }
}
