//! The claim, or the answer to a duplicate: a replay, a key reused with
//! another payload, or a call in progress, waited out (woken by the store
//! when it can, polling with a capped backoff otherwise) up to the policy's
//! bound.

use std::future::Future;
use std::time::Duration;
use tokio::time::Instant;

use crate::metrics;
use crate::store::{BeginRequest, Store};
use idem_core::error::Error;
use idem_core::record::{Begin, Claim};

use super::call::Checked;
use super::guard::Guard;
use super::outcome::OutcomePolicy;
use super::pooled::Records;
use super::timeout::within;

const FIRST_POLL: Duration = Duration::from_millis(1);
/// The shortest `Retry-After` hint given with [`Error::InProgress`] (the
/// hint is the lease the key's holder has left).
const MIN_RETRY_AFTER: Duration = Duration::from_millis(100);

/// The claim, or the caller's answer (a replay, or an error). A store
/// error leaves the guard armed: the claim may have landed with its answer
/// lost, and the guard hands it back, by its token, as it drops.
pub(super) async fn claimed<S, R, T, E, O>(
    records: &mut R,
    call: &Checked,
    request: &BeginRequest<'_>,
    outcomes: &O,
    guard: &mut Guard<'_, '_, S>,
) -> Result<Claim, Result<T, E>>
where
    S: Store + ?Sized,
    R: Records,
    E: From<Error>,
    O: OutcomePolicy<T, E>,
{
    match claim_or_replay(records, call, request, outcomes).await {
        Ok(Ok(claim)) => Ok(claim),
        Ok(Err(replayed)) => {
            guard.disarm();
            Err(replayed)
        }
        Err(err @ Error::Store(_)) => Err(Err(err.into())),
        Err(err) => {
            guard.disarm();
            Err(Err(err.into()))
        }
    }
}

/// Claims the key (waiting for an in-progress call as the policy says), or
/// returns the replayed result as `Err`.
async fn claim_or_replay<R, T, E, O>(
    records: &mut R,
    call: &Checked,
    request: &BeginRequest<'_>,
    outcomes: &O,
) -> Result<Result<Claim, Result<T, E>>, Error>
where
    R: Records,
    O: OutcomePolicy<T, E>,
{
    let first = records.begin(request).await?;
    let answer = if let Begin::InProgress { lease_left, .. } = first {
        // Waiting is the rare path, and its state (timers, reads) large:
        // it is a future of its own, on the heap, so that a call that
        // claims or replays at once neither carries nor copies it. The
        // first answer is not reassigned here: a variable the wait's
        // answer was written back into would keep both across the wait,
        // and make this future larger.
        Box::pin(wait_out(records, call, request, lease_left)).await?
    } else {
        first
    };
    let claim = match answer {
        Begin::Claimed(claim) => claim,
        Begin::Replay(outcome) => {
            tracing::debug!(decision = "replayed", "replaying the stored outcome");
            let replayed = outcomes.decode(&outcome)?;
            metrics::replayed(&call.scope, call.started);
            return Ok(Err(replayed));
        }
        Begin::KeyReused => {
            tracing::info!(
                decision = "key reused",
                "the key was used with another payload"
            );
            metrics::key_reused(&call.scope);
            return Err(Error::KeyReused);
        }
        // `wait_out` answers an error rather than this.
        Begin::InProgress { lease_left, .. } => {
            return Err(in_progress(call, true, Held::now(lease_left)))
        }
    };
    if claim.is_takeover() {
        tracing::info!(
            decision = "taken over",
            fence = claim.fence,
            "claimed a lapsed or expired record"
        );
        metrics::taken_over(&call.scope);
    } else {
        tracing::debug!(
            decision = "claimed",
            fence = claim.fence,
            "running the operation"
        );
    }
    metrics::executed(&call.scope);
    Ok(Ok(claim))
}

/// Waits while another call holds the key, up to the call's wait bound:
/// the first answer that is not [`Begin::InProgress`], or
/// [`Error::InProgress`].
///
/// A waiting duplicate only reads ([`Records::peek`]) between wake-ups,
/// and tries the claim again only when the record says the key is free.
async fn wait_out<R: Records>(
    records: &mut R,
    call: &Checked,
    request: &BeginRequest<'_>,
    lease_left: Duration,
) -> Result<Begin, Error> {
    let mut held = Held::now(lease_left);
    // From the call's start, read once for the whole call. `None`: a
    // bound too far to be represented, so no bound.
    let deadline = call.started.checked_add(call.policy.wait_bound());
    let mut step = FIRST_POLL;
    let mut waited = false;
    loop {
        let now = Instant::now();
        let left = deadline.map(|d| d.saturating_duration_since(now));
        if left.is_some_and(|left| left.is_zero()) || !records.may_wait() {
            return Err(in_progress(call, waited, held));
        }
        if !waited {
            tracing::debug!(
                decision = "waiting",
                "another call holds the key; waiting for its outcome"
            );
            waited = true;
        }
        let pause = left.map_or(step, |left| step.min(left));
        // The reads of the wait end with the wait: a store that stops
        // answering (a connection cut without a reset, a primary killed
        // mid-failover) must not keep the caller past its bound. Only
        // reads: a claim that was sent is left to finish, as its answer
        // says whether this caller holds the key.
        let Some(handed) = bounded(left, records.wait_for_change(request, pause)).await else {
            return Err(in_progress(call, waited, held));
        };
        step = (step * 2).min(records.max_poll());
        let answer = match handed? {
            Some(answer) => answer,
            None => {
                let Some(peeked) = bounded(left, records.peek(request)).await else {
                    return Err(in_progress(call, waited, held));
                };
                match peeked? {
                    Some(answer) => answer,
                    None => records.begin(request).await?,
                }
            }
        };
        match answer {
            Begin::InProgress { lease_left, .. } => held = Held::now(lease_left),
            answer => return Ok(answer),
        }
    }
}

/// The lease left on the key's holder, as last read, and when.
#[derive(Clone, Copy)]
struct Held {
    lease_left: Duration,
    read: Instant,
}

impl Held {
    fn now(lease_left: Duration) -> Held {
        Held {
            lease_left,
            read: Instant::now(),
        }
    }

    /// The soonest the key can move: when the holder's lease runs out,
    /// should the holder be gone (a live holder renews it, and a waiting
    /// caller told to come back then finds it running still, or done).
    fn retry_after(self) -> Duration {
        self.lease_left
            .saturating_sub(self.read.elapsed())
            .max(MIN_RETRY_AFTER)
    }
}

/// `op`, given up (`None`) once `left` (and a little more, for the store's
/// own answer to a wait that ends at the bound) has passed; no bound for
/// `None`.
async fn bounded<F: Future>(left: Option<Duration>, op: F) -> Option<F::Output> {
    match left {
        Some(left) => within(left + WAIT_SLACK, op).await,
        None => Some(op.await),
    }
}

/// How long past its wait a waiting caller gives the store to answer.
const WAIT_SLACK: Duration = Duration::from_millis(100);

/// The error of a call that finds the key held by another and may not
/// wait (any longer), traced and counted.
fn in_progress(call: &Checked, waited: bool, held: Held) -> Error {
    tracing::info!(
        decision = "in progress",
        waited,
        "another call holds the key"
    );
    metrics::in_progress(&call.scope);
    Error::InProgress {
        retry_after: held.retry_after(),
    }
}

#[cfg(test)]
mod tests {
    use std::time::Duration;

    use super::{bounded, Held, MIN_RETRY_AFTER, WAIT_SLACK};

    #[tokio::test(start_paused = true)]
    async fn retry_after_is_the_lease_left_counted_from_its_reading() {
        let held = Held::now(Duration::from_secs(5));
        assert_eq!(held.retry_after(), Duration::from_secs(5));
        tokio::time::advance(Duration::from_secs(2)).await;
        assert_eq!(held.retry_after(), Duration::from_secs(3));
        tokio::time::advance(Duration::from_secs(10)).await;
        assert_eq!(held.retry_after(), MIN_RETRY_AFTER);
        assert_eq!(Held::now(Duration::ZERO).retry_after(), MIN_RETRY_AFTER);
    }

    #[tokio::test(start_paused = true)]
    async fn a_bounded_read_gets_the_slack_past_its_bound() {
        let started = tokio::time::Instant::now();
        let never = bounded(Some(Duration::ZERO), std::future::pending::<()>()).await;
        assert_eq!(never, None);
        assert_eq!(started.elapsed(), WAIT_SLACK);
        // An answer at once is taken even with no time left.
        assert_eq!(bounded(Some(Duration::ZERO), async { 3 }).await, Some(3));
        assert_eq!(bounded(None, async { 4 }).await, Some(4));
    }
}
