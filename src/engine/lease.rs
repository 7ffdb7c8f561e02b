//! The lease of a claim, renewed while its body runs (and while its
//! outcome is stored), a third of a lease apart, so
//! that a body slower than its lease is never taken over while its process
//! lives; the body's step journal is kept alive alongside.
//!
//! A crashed or stopped owner stops renewing and is taken over about one
//! lease after its last renewal (see the module documentation's "Leases,
//! tokens and time").

use std::convert::Infallible;
use std::future::Future;
use std::pin::Pin;
use std::task::Poll;
use std::time::Duration;
use tokio::time::Instant;

use crate::metrics;
use crate::store::rows::Completion;
use crate::store::Store;
use idem_core::error::Error;
use idem_core::record::Claim;

use super::call::Checked;
use super::timeout::within;

/// Runs `body` while renewing the claim's lease every third of it, so a
/// body slower than its lease is never taken over while it runs, and with
/// it the live entries of the step journal of `journaled`'s operation.
/// Where the body completes the claim with its rows (`completion`), a
/// renewal that finds the completion landed is no news.
pub(super) async fn renewing<S, F>(
    store: &S,
    claim: &Claim,
    journaled: Option<&Checked>,
    completion: Option<&Completion<'_>>,
    mut body: Pin<&mut F>,
) -> F::Output
where
    S: Store + ?Sized,
    F: Future,
{
    // A body that finishes at its first poll needs no renewal: the timer
    // is set only once the body waits.
    let first = std::future::poll_fn(|cx| Poll::Ready(body.as_mut().poll(cx))).await;
    if let Poll::Ready(output) = first {
        return output;
    }
    // On the heap: a call whose body finishes at once (a store in
    // memory, a cached answer) neither carries nor copies the renewals'
    // timer.
    let journal_ttl = journaled.map(|call| call.steps_as().ttl);
    let what = Renewing::Body {
        journal_ttl,
        completion,
    };
    let mut renew = Box::pin(keep_renewed(store, claim, what));
    tokio::select! {
        biased;
        output = &mut body => output,
        never = &mut renew => match never {},
    }
}

/// What a claim's lease is renewed for.
pub(super) enum Renewing<'a> {
    /// The body, which runs, and whose step journal, if any, is kept as
    /// long as the lease: for this long (`journal_ttl`) from each renewal.
    /// The journal is the claim's (its scope and key, which every journal
    /// write names), so it is kept under the claim's scope and key,
    /// whatever the scope the steps derive their keys from (entity mode's
    /// claim is per table).
    Body {
        journal_ttl: Option<Duration>,
        /// The claim's completion with the body's rows, where the body
        /// writes one.
        completion: Option<&'a Completion<'a>>,
    },
    /// Its outcome, on its way to the store: a renewal that finds the
    /// record completed by it is no news (the save says what became of
    /// the claim).
    Save,
}

/// Renews the lease for ever, a third of a lease apart. A renewal that
/// fails is tried again sooner, and so is one that has not answered
/// within a third of a lease (a stalled connection): another is sent,
/// which the pool gives another connection, so that the lease never
/// lapses behind one renewal that hangs. A claim found taken over is no
/// longer renewed (its outcome will be refused, and the caller still gets
/// its value).
pub(super) async fn keep_renewed<S: Store + ?Sized>(
    store: &S,
    claim: &Claim,
    what: Renewing<'_>,
) -> Infallible {
    let (period, again) = renewal_periods(claim.lease);
    let completion = match &what {
        Renewing::Body { completion, .. } => *completion,
        Renewing::Save => None,
    };
    let mut next = Instant::now() + period;
    loop {
        tokio::time::sleep_until(next).await;
        let sent = Instant::now();
        let renewed = match within(period, store.renew(claim)).await {
            // Completed with the body's rows while the renewal waited for
            // the record's lock: not lost. (Had that transaction rolled
            // back, the renewal would have found the claim in progress.)
            Some(Err(Error::LeaseLost)) if completion.is_some_and(|c| c.is_written()) => {
                Some(Ok(()))
            }
            renewed => renewed,
        };
        match renewed {
            Some(Ok(())) => {
                next = sent + period;
                if let Renewing::Body {
                    journal_ttl: Some(ttl),
                    ..
                } = &what
                {
                    // Entries are kept for a ttl from their last write: a
                    // body that runs longer must keep them, or an attempt
                    // taking over after a crash would find them expired,
                    // and run completed steps again.
                    let Some(journal) = store.journal() else {
                        continue;
                    };
                    let kept = journal.keep_steps(&claim.scope, &claim.key, *ttl);
                    match within(period, kept).await {
                        Some(Ok(())) => {}
                        Some(Err(err)) => {
                            tracing::warn!(error = %err, "keeping the step journal failed; trying again at the next renewal");
                        }
                        None => tracing::warn!(
                            "keeping the step journal took longer than a third of the lease"
                        ),
                    }
                }
            }
            Some(Err(Error::LeaseLost)) => {
                if matches!(what, Renewing::Body { .. }) {
                    tracing::warn!(
                        decision = "lease lost",
                        fence = claim.fence,
                        "the claim was taken over while the operation ran"
                    );
                    metrics::lease_lost(&claim.scope);
                }
                return std::future::pending().await;
            }
            Some(Err(err)) => {
                tracing::warn!(error = %err, "renewing the lease failed; trying again");
                next = Instant::now() + again;
            }
            None => {
                tracing::warn!(
                    "renewing the lease took longer than a third of it; sending another"
                );
                next = Instant::now();
            }
        }
    }
}

/// How far apart a lease is renewed (a third of it), and how soon a
/// renewal that failed or stalled is tried again (a quarter of that); at
/// least a millisecond each, so that a tiny lease cannot spin.
fn renewal_periods(lease: Duration) -> (Duration, Duration) {
    let period = (lease / 3).max(Duration::from_millis(1));
    let again = (period / 4).max(Duration::from_millis(1));
    (period, again)
}

#[cfg(test)]
mod tests {
    use std::time::Duration;

    use super::renewal_periods;

    const MS: Duration = Duration::from_millis(1);

    #[test]
    fn a_lease_is_renewed_every_third_of_it() {
        let (period, again) = renewal_periods(Duration::from_secs(30));
        assert_eq!(period, Duration::from_secs(10));
        assert_eq!(again, Duration::from_millis(2_500));
    }

    #[test]
    fn the_shortest_lease_a_call_accepts_is_renewed_every_10_ms() {
        let (period, again) = renewal_periods(30 * MS);
        assert_eq!(period, 10 * MS);
        assert_eq!(again, 2_500 * Duration::from_micros(1));
    }

    #[test]
    fn a_tiny_lease_is_renewed_no_faster_than_every_millisecond() {
        assert_eq!(renewal_periods(2 * MS), (MS, MS));
        assert_eq!(renewal_periods(Duration::ZERO), (MS, MS));
        assert_eq!(renewal_periods(6 * MS), (2 * MS, MS));
    }
}
