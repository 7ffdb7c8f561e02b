//! The step transitions of the Redis store ([`Journal`]): a record's
//! journal is a hash beside it (`<prefix>:{<tag>}:j`), written by scripts
//! that check the record's claim, so that its fence holds for its steps.

use std::time::Duration;

use async_trait::async_trait;
use redis::Value;

use super::calls::{millis, store_error, unrecorded_as_store};
use super::replies::{array, bytes, corrupt, int, status, text};
use super::scripts::{self, Invocation, SCRIPTS};
use super::{Keys, RedisStore};
use crate::store::Journal;
use idem_core::error::Error;
use idem_core::fingerprint::Fingerprint;
use idem_core::journal::{
    decide_step, StepAt, StepBegin, StepDecision, StepRecord, StepRequest, StepResolution, StepRun,
    StepState,
};
use idem_core::key::{Key, Scope};
use idem_core::record::{duration_millis, ClaimToken};

#[async_trait]
impl Journal for RedisStore {
    async fn keep_steps(&self, scope: &Scope, key: &Key, ttl: Duration) -> Result<(), Error> {
        let keys = self.keys(scope, key);
        // Not waited for, as renewals are not (`wait_for_replicas`).
        self.invoke(
            SCRIPTS
                .keep_steps
                .on(&keys.record)
                .key(&keys.journal)
                .arg(duration_millis(ttl)),
        )
        .await?;
        Ok(())
    }

    async fn undo_step(&self, step: &StepRequest<'_>) -> Result<bool, Error> {
        let claim = step.claim;
        // Not waited for by a replica: a delete lost in a failover leaves
        // the step in doubt, the state it was in before.
        let keys = self.keys(&claim.scope, &claim.key);
        self.abandon_step(&keys, step, &[]).await
    }

    async fn begin_step(&self, step: &StepRequest<'_>) -> Result<StepBegin, Error> {
        let claim = step.claim;
        let keys = self.keys(&claim.scope, &claim.key);
        let (value, acknowledged) = self
            .invoke_replicated(
                step_call(&SCRIPTS.begin_step, &keys, step)
                    .arg(u8::from(step.adopt))
                    .arg(millis(step.settle)),
            )
            .await?;
        let items = array(value)?;
        match status(&items)? {
            "lost" => Err(Error::LeaseLost),
            "run" => {
                let run = match items.get(1).and_then(text) {
                    Some("fresh") => StepRun::Fresh,
                    Some("adopted") => StepRun::Adopted,
                    Some("allowed") => StepRun::Allowed,
                    other => return Err(Error::store(format!("unexpected step run {other:?}"))),
                };
                if !acknowledged {
                    // The marker may be lost in a failover: the step's
                    // call must not run on it. Put back what the entry
                    // held, so that the step is not taken for one in
                    // doubt.
                    let _ = self.abandon_step(&keys, step, &items[2..]).await;
                    return Err(self.not_replicated("step's start"));
                }
                Ok(StepBegin::Run(run))
            }
            "found" => {
                let now = items
                    .get(1)
                    .and_then(int)
                    .ok_or_else(|| corrupt("no time"))?;
                let entry = parse_step(&claim.scope, &claim.key, step.seq, &items[2..])?;
                match decide_step(step, Some(&entry), now) {
                    // This attempt's start, sent again after its answer
                    // was lost: its call runs only once a replica has it.
                    // Not acknowledged, it is left started (what it
                    // replaced is not known any more): in doubt, which
                    // refuses rather than runs twice.
                    StepDecision::Answer(StepBegin::Run(StepRun::Again)) if !acknowledged => {
                        Err(self.not_replicated("step's start"))
                    }
                    StepDecision::Answer(answer) => Ok(answer),
                    StepDecision::Start(_) => Err(Error::store(
                        "the Redis journal script and journal::decide_step disagree",
                    )),
                }
            }
            other => Err(Error::store(format!("unexpected step answer {other:?}"))),
        }
    }

    async fn complete_step(&self, step: &StepRequest<'_>, output: &[u8]) -> Result<(), Error> {
        let claim = step.claim;
        let keys = self.keys(&claim.scope, &claim.key);
        // A step's output the server cannot take is a store error, not
        // `Unrecorded`: the step's effect happened, so its output is used
        // all the same, and the step is in doubt at the next attempt.
        self.check_length(&keys.record, output.len(), "a step's output")
            .await
            .map_err(unrecorded_as_store)?;
        let (value, acknowledged) = self
            .invoke_replicated(step_call(&SCRIPTS.complete_step, &keys, step).arg(output))
            .await
            .map_err(unrecorded_as_store)?;
        let items = array(value)?;
        match status(&items)? {
            "ok" if acknowledged => Ok(()),
            "ok" => Err(self.not_replicated("step's completion")),
            "lost" => Err(Error::LeaseLost),
            _ => Err(crate::store::step_not_journaled(step)),
        }
    }

    async fn steps(&self, scope: &Scope, key: &Key) -> Result<Vec<StepRecord>, Error> {
        let keys = self.keys(scope, key);
        let mut conn = self.shared.conn.clone();
        let fields: Vec<(Vec<u8>, Value)> = redis::cmd("HGETALL")
            .arg(&keys.journal)
            .query_async(&mut conn)
            .await
            .map_err(store_error)?;
        // `<seq>:<field>` → the entry's fields in parse_step's order.
        const ORDER: [&str; 7] = ["n", "fp", "st", "tok", "out", "u", "e"];
        let mut entries = std::collections::BTreeMap::<u32, Vec<Value>>::new();
        for (name, value) in fields {
            let name = std::str::from_utf8(&name).map_err(|_| corrupt("a journal field"))?;
            let (seq, field) = name
                .split_once(':')
                .ok_or_else(|| corrupt("a journal field"))?;
            let seq: u32 = seq.parse().map_err(|_| corrupt("a journal field"))?;
            let Some(at) = ORDER.iter().position(|f| *f == field) else {
                continue;
            };
            entries
                .entry(seq)
                .or_insert_with(|| vec![Value::Nil; ORDER.len()])[at] = value;
        }
        entries
            .into_iter()
            .map(|(seq, fields)| parse_step(scope, key, seq, &fields))
            .collect()
    }

    async fn resolve_step(&self, step: &StepAt<'_>, to: &StepResolution) -> Result<bool, Error> {
        let keys = self.keys(step.scope, step.key);
        let invocation = SCRIPTS
            .resolve_step
            .on(&keys.record)
            .key(&keys.journal)
            .arg(step.seq)
            .arg(step.name);
        let invocation = match to {
            StepResolution::Completed(output) => {
                self.check_length(&keys.record, output.len(), "a step's output")
                    .await
                    .map_err(unrecorded_as_store)?;
                invocation.arg("completed").arg(&output[..])
            }
            StepResolution::Rerun => invocation.arg("rerun").arg(""),
        };
        let (value, acknowledged) = self
            .invoke_replicated(invocation)
            .await
            .map_err(unrecorded_as_store)?;
        self.replicated(acknowledged, "step's resolution")?;
        Ok(int(&value) == Some(1))
    }
}

impl RedisStore {
    /// Undoes a step's start that no replica acknowledged (`before`: what
    /// the begin script answered the entry held; nothing: the entry is
    /// deleted), unless the entry changed since. Answers whether it did.
    async fn abandon_step(
        &self,
        keys: &Keys,
        step: &StepRequest<'_>,
        before: &[Value],
    ) -> Result<bool, Error> {
        let field = |i: usize| before.get(i).and_then(bytes).unwrap_or_default();
        let undone = self
            .invoke(
                SCRIPTS
                    .abandon_step
                    .on(&keys.record)
                    .key(&keys.journal)
                    .arg(&step.claim.token.as_bytes()[..])
                    .arg(step.seq)
                    .arg(step.name)
                    .arg(field(0))
                    .arg(field(1))
                    .arg(field(2)),
            )
            .await?;
        Ok(int(&undone) == Some(1))
    }
}

/// A journal script's call for `step`: the record and the journal, then
/// the claim's token, seq, name, fingerprint and ttl.
fn step_call<'a>(lua: &'a scripts::Lua, keys: &Keys, step: &StepRequest<'_>) -> Invocation<'a> {
    lua.on(&keys.record)
        .key(&keys.journal)
        .arg(&step.claim.token.as_bytes()[..])
        .arg(step.seq)
        .arg(step.name)
        .arg(&step.fingerprint.as_bytes()[..])
        .arg(millis(step.ttl))
}

/// A journal entry from `name, fp, state, token, output, updated, expires`.
fn parse_step(scope: &Scope, key: &Key, seq: u32, fields: &[Value]) -> Result<StepRecord, Error> {
    let get = |i: usize| fields.get(i).filter(|v| !matches!(v, Value::Nil));
    Ok(StepRecord {
        scope: scope.clone(),
        key: key.clone(),
        seq,
        name: get(0)
            .and_then(text)
            .ok_or_else(|| corrupt("a step without a name"))?
            .to_owned(),
        fingerprint: Fingerprint::from_digest(
            get(1)
                .and_then(bytes)
                .and_then(|b| b.try_into().ok())
                .ok_or_else(|| corrupt("a step without a fingerprint"))?,
        ),
        state: get(2)
            .and_then(text)
            .and_then(StepState::parse)
            .ok_or_else(|| corrupt("a step without a state"))?,
        token: ClaimToken::from_bytes(
            get(3)
                .and_then(bytes)
                .and_then(|b| b.try_into().ok())
                .ok_or_else(|| corrupt("a step without a token"))?,
        ),
        output: get(4).and_then(bytes).map(<[u8]>::to_vec),
        updated_at: get(5)
            .and_then(int)
            .ok_or_else(|| corrupt("a step without a time"))?,
        expires_at: get(6)
            .and_then(int)
            .ok_or_else(|| corrupt("a step without an expiry"))?,
    })
}
