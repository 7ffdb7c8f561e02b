//! A call whose outcome is rows of the caller's tables, its claim
//! completed inside the transaction that writes them ([`run_within`]):
//! entity mode's flow (see [`crate::entity`]). The rows' side is the
//! contract of [`Rows`].

use std::future::Future;
use tokio::time::Instant;

use tracing::Instrument;

use crate::metrics;
use crate::steps::{self, Operation, StepsAs};
use crate::store::rows::{Asked, Completion, Rows};
use idem_core::error::Error;
use idem_core::fingerprint::Fingerprint;

use super::call::Call;
use super::claim::claimed;
use super::guard::Guard;
use super::lease::renewing;
use super::outcome::{Codec, OkOnly};
use super::pooled::{release, Pooled};
use super::save::{save, SaveFor, Saved};

/// Returns the row stored for the call's key, or runs `body` once per key
/// and has `rows` write the value it produces, completing the call's claim
/// in the same transaction.
///
/// The flow (see [`crate::entity`] for what it guarantees):
/// 1. a row found under the key is the answer; the body does not run;
/// 2. otherwise the key is claimed in the records store of
///    [`Rows::claims`], under [`Rows::claims_scope`]: a claim as record
///    mode's (a lease renewed while the body runs, a token that fences
///    every later write), whose duplicates wait, polling, and then read
///    the row;
/// 3. under the claim the row is looked for again (an owner before this
///    one may have written it, then stopped), then the body runs;
/// 4. [`Rows::write`] writes its value and completes the claim in one
///    transaction, the lease renewed until it commits;
/// 5. a body error hands the claim back, so a retry runs the body again.
pub(crate) async fn run_within<R, T, E, Fut>(call: Call, rows: &R, body: Fut) -> Result<T, E>
where
    R: Rows<T>,
    E: From<Error>,
    Fut: Future<Output = Result<T, E>>,
{
    let asked = asked(&call)?;
    let span = tracing::info_span!("idem", scope = %asked.scope, key = %asked.key, mode = "entity");
    async move {
        let entry = match rows.find(&asked.key).await? {
            Some(found) => Entry::Found(found),
            // The claimed flow on the heap: a call answered by its row
            // neither carries nor copies it.
            None => Box::pin(claimed_flow(call, rows, &asked, body)).await?,
        };
        Ok(answer(rows, &asked, entry).await?)
    }
    .instrument(span)
    .await
}

/// The key claimed (or a duplicate's answer), the body run under the
/// claim and its row written, the claim settled.
async fn claimed_flow<R, T, E, Fut>(
    call: Call,
    rows: &R,
    asked: &Asked,
    body: Fut,
) -> Result<Entry<T>, E>
where
    R: Rows<T>,
    E: From<Error>,
    Fut: Future<Output = Result<T, E>>,
{
    let claims = rows.claims().await?;
    let (checked, outcomes) = claim_call(call, rows, asked).check(Instant::now())?;
    // The claim's own span (its per-table scope), inside the operation's.
    let span = checked.span();
    async move {
        let request = checked.request();
        // From here on, a dropped caller hands back whatever it holds.
        let mut guard = Guard::new(&claims, &request);
        // Duplicates poll: a store's wake-up could come as the completion is
        // written, before the transaction that writes it with the row commits,
        // and a duplicate would then look for a row not yet visible.
        let mut records = Pooled {
            store: &claims,
            polling: true,
        };
        let claim = match claimed::<_, _, Entry<T>, E, _>(
            &mut records,
            &checked,
            &request,
            &outcomes,
            &mut guard,
        )
        .await
        {
            Ok(claim) => claim,
            // The claim was completed by another call: its row is stored.
            Err(Ok(_)) => return Ok(Entry::Stored),
            Err(Err(err)) => return Err(err),
        };
        // Once the claim is won: look for the row again, run the body and
        // write its row (the lease renewed all along), then settle the claim:
        // completed with the row, or completed here, or handed back.
        guard.running(claim.clone());
        let operation = Operation::on(&claims, claim.clone(), checked.steps_as());
        guard.journal_first(operation.clone());
        let completion = Completion::new(&claim);
        let work = async {
            // An owner before this one may have inserted its row, then stopped
            // before its claim was completed.
            if let Some(found) = rows.find(&asked.key).await? {
                return Ok(Entry::Found(found));
            }
            // The body's outbox messages wait for the row's transaction.
            steps::hold_messages();
            let value = body.await?;
            // The body's journal writes land first, as they do before record
            // mode completes a claim.
            steps::flush_journal().await;
            let held = steps::held_messages();
            Ok(Entry::Saved(
                rows.write(&claims, value, asked, &completion, held).await?,
            ))
        };
        let work = std::pin::pin!(operation.scope(work));
        let result = renewing(&claims, &claim, Some(&checked), Some(&completion), work).await;
        if completion.is_committed() {
            guard.disarm();
            return result;
        }
        if result.is_err() {
            // Nothing to store: hand the key back. Should that fail, the guard
            // hands it back in the background as it drops.
            if release(&mut records, &claim).await {
                guard.disarm();
            }
            return result;
        }
        // A row found under the claim, or written while the claim was taken
        // over: the claim is completed here, as record mode completes one.
        let stored = guard.saving(Completion::outcome());
        match save(&claims, &claim, stored, SaveFor::Caller).await {
            // Still not stored: the guard keeps trying in the background as
            // it drops. The caller gets its row now.
            Saved::NotYet => {}
            Saved::Stored | Saved::Lost => guard.disarm(),
        }
        result
    }
    .instrument(span)
    .await
}

/// The call's key and fingerprint, checked; its scope must name no
/// principal, as rows are found by their token alone.
fn asked(call: &Call) -> Result<Asked, Error> {
    let scope = call.scope().clone();
    if let Some(principal) = scope.principal() {
        return Err(Error::Config(format!(
            "entity mode finds rows by their token alone, so the principal {principal:?} \
             of scope {:?} would not separate them: put the principal into the token, \
             or use record mode",
            scope.operation()
        )));
    }
    Ok(Asked {
        key: call.key()?,
        fingerprint: call.fingerprint()?,
        scope,
        started: Instant::now(),
    })
}

/// The claim's call: per table and token, whatever the operation. Every
/// payload claims alike: whether a reused token is refused is the row's
/// request hash to say.
///
/// The body's durable steps are the operation's own: their keys derive
/// from its scope, a journal of another payload is refused, and their
/// entries are kept for the policy's ttl, not the claim's.
fn claim_call<R: Rows<T>, T>(call: Call, rows: &R, asked: &Asked) -> Call<OkOnly<Marker>> {
    let policy = call.policy();
    Call::from_parts(
        rows.claims_scope(),
        Ok(asked.key.clone()),
        Ok(Fingerprint::of_bytes(b"idem.entity")),
        // A completed claim is only needed until the row is visible.
        policy.ttl(policy.lease),
    )
    .with_steps_as(StepsAs {
        scope: asked.scope.clone(),
        fingerprint: asked.fingerprint,
        ttl: policy.ttl.max(policy.lease),
    })
    .with_codec(Marker)
}

/// The caller's answer: the row this call wrote; a row found under the
/// key, unless it says another payload made it; or the row of a claim
/// another call completed.
async fn answer<R: Rows<T>, T>(rows: &R, asked: &Asked, entry: Entry<T>) -> Result<T, Error> {
    match entry {
        Entry::Saved(row) => Ok(row),
        Entry::Found(found) => {
            rows.answers(&found, asked)?;
            tracing::debug!(decision = "replayed", "returning the stored row");
            metrics::replayed(&asked.scope, asked.started);
            Ok(found)
        }
        Entry::Stored => match rows.find(&asked.key).await? {
            Some(found) => rows.answers(&found, asked).map(|()| found),
            None => Err(Error::store(format!(
                "the claim on key {:?} of {} was completed, but no row holds it \
                 (was it deleted?)",
                asked.key,
                rows.claims_scope()
            ))),
        },
    }
}

/// What the claimed flow ends with.
enum Entry<T> {
    /// The row this call wrote.
    Saved(T),
    /// A row found under the key once claimed.
    Found(T),
    /// The claim was completed by another call: read its row.
    Stored,
}

/// The codec of a claim completed with its rows: it stores nothing but
/// the fact ([`Completion::outcome`]).
struct Marker;

impl<T> Codec<Entry<T>> for Marker {
    fn encode(&self, _: &Entry<T>) -> Result<Vec<u8>, Error> {
        Ok(Completion::outcome().body)
    }

    fn decode(&self, _: &[u8]) -> Result<Entry<T>, Error> {
        Ok(Entry::Stored)
    }
}
