//! The record statements as the flow sends them ([`Records`]): on the
//! store's own pool ([`Pooled`]), or on the caller's connection in
//! transactional mode (`transactional::OnConnection`). On the pool, a
//! claim whose answer was lost is sent again with its token, and one
//! granted late is renewed before the body runs ([`claim_again`]).

use std::future::Future;
use std::time::Duration;
use tokio::time::Instant;

use crate::store::{BeginRequest, Store};
use idem_core::error::Error;
use idem_core::record::{Begin, Claim, Outcome};

/// The longest pause between two looks at an in-progress key when the store
/// cannot wake waiters itself (another process completed it).
pub(super) const MAX_POLL: Duration = Duration::from_millis(25);
/// The same while the store wakes waiters across processes (PostgreSQL's
/// `LISTEN`): the look only covers a notification that was lost.
const MAX_POLL_NOTIFIED: Duration = Duration::from_millis(500);
/// How often a claim whose answer was lost is sent again (same token).
const BEGIN_ATTEMPTS: u32 = 3;
/// A claim answered after more than a lease divided by this is renewed
/// before the body runs (see `claim_again`).
const LEASE_SPENT: u32 = 10;

/// Where the record statements run: the store's own pool, or the caller's
/// connection in transactional mode.
///
/// Its methods return their futures unboxed (the trait is private and only
/// used generically): a boxed future would be an allocation per
/// statement, on the path of a replay from a store in memory.
pub(super) trait Records: Send {
    /// The claim, or the answer to a duplicate.
    fn begin(
        &mut self,
        request: &BeginRequest<'_>,
    ) -> impl Future<Output = Result<Begin, Error>> + Send;
    /// A plain read: the answer to a duplicate, or `None` to claim.
    fn peek(
        &mut self,
        request: &BeginRequest<'_>,
    ) -> impl Future<Output = Result<Option<Begin>, Error>> + Send;
    fn complete(
        &mut self,
        claim: &Claim,
        outcome: &Outcome,
    ) -> impl Future<Output = Result<(), Error>> + Send;
    fn release(&mut self, claim: &Claim) -> impl Future<Output = Result<(), Error>> + Send;
    /// Waits for the key to change, or `timeout`: the answer when the
    /// change hands it over (the outcome the holder completed with), or
    /// `None` to look at the record.
    fn wait_for_change(
        &mut self,
        request: &BeginRequest<'_>,
        timeout: Duration,
    ) -> impl Future<Output = Result<Option<Begin>, Error>> + Send;
    /// The longest pause between two looks at an in-progress key.
    fn max_poll(&self) -> Duration;
    /// Whether waiting is allowed: not while a claim attempt may have left
    /// a lock in the caller's transaction, which the owner could need.
    fn may_wait(&self) -> bool;
}

pub(super) struct Pooled<'a, S: ?Sized> {
    pub(super) store: &'a S,
    /// Duplicates poll rather than wait for the store to wake them
    /// (entity mode: a wake-up could come as the completion is written,
    /// before the transaction that writes it with the row commits).
    pub(super) polling: bool,
}

impl<'a, S: ?Sized> Pooled<'a, S> {
    /// Duplicates wait as the store wakes them, where it can.
    pub(super) fn waking(store: &'a S) -> Self {
        Pooled {
            store,
            polling: false,
        }
    }
}

impl<S: Store + ?Sized> Records for Pooled<'_, S> {
    async fn begin(&mut self, request: &BeginRequest<'_>) -> Result<Begin, Error> {
        // Answered at once (a store in memory): the lease it wrote starts
        // now, whole. The claim sent to a server is a future of its own,
        // on the heap, so that this future, and the call's, which is moved
        // (copied whole) as it is built and awaited, do not carry it: a
        // round trip dwarfs the allocation.
        let immediate = self.store.capabilities().immediate;
        let answer = match immediate.and_then(|now| now.begin_now(request)) {
            None => return Box::pin(begin_sent(self.store, request)).await,
            Some(answer @ Err(Error::Store(_))) => answer,
            Some(answer) => return answer,
        };
        Box::pin(claim_again(self.store, request, Instant::now(), answer)).await
    }
    async fn peek(&mut self, request: &BeginRequest<'_>) -> Result<Option<Begin>, Error> {
        self.store.peek(request).await
    }
    async fn complete(&mut self, claim: &Claim, outcome: &Outcome) -> Result<(), Error> {
        self.store.complete(claim, outcome).await
    }
    async fn release(&mut self, claim: &Claim) -> Result<(), Error> {
        self.store.release(claim).await
    }
    async fn wait_for_change(
        &mut self,
        request: &BeginRequest<'_>,
        timeout: Duration,
    ) -> Result<Option<Begin>, Error> {
        if self.polling {
            tokio::time::sleep(timeout).await;
            return Ok(None);
        }
        let waker = self.store.capabilities().waker();
        waker.wait_for_outcome(request, timeout).await
    }
    fn max_poll(&self) -> Duration {
        if !self.polling && self.store.capabilities().waker().wakes_across_processes() {
            MAX_POLL_NOTIFIED
        } else {
            MAX_POLL
        }
    }
    fn may_wait(&self) -> bool {
        true
    }
}

/// The claim sent to the store, and sent again or renewed where its
/// answer was lost or came late ([`claim_again`]).
async fn begin_sent<S: Store + ?Sized>(
    store: &S,
    request: &BeginRequest<'_>,
) -> Result<Begin, Error> {
    let sent = Instant::now();
    match store.begin(request).await {
        Ok(Begin::Claimed(claim)) if sent.elapsed() < request.lease / LEASE_SPENT => {
            Ok(Begin::Claimed(claim))
        }
        // Rare, and its timers large: on the heap.
        answer @ (Ok(Begin::Claimed(_)) | Err(Error::Store(_))) => {
            Box::pin(claim_again(store, request, sent, answer)).await
        }
        answer => answer,
    }
}

/// A claim sent at `sent` whose first answer (`first`) was lost (a store
/// error) or came back granted late: sends it again with the same token
/// while the store fails (a claim that landed is recognized as ours),
/// pausing longer each time, up to [`BEGIN_ATTEMPTS`] sends in all; and
/// renews a claim granted late before it is used.
///
/// A store writes a claim's lease from its clock when the statement runs,
/// and a claim sent again answers the lease its first landing wrote: a
/// claim that waited (behind a caller's open transaction holding the key's
/// row, or for a lost answer) can be granted with little of its lease
/// left, or none, and a duplicate could take the lapsed lease over before
/// the first renewal, while the body runs. So a claim answered more than a
/// tenth of its lease after it was sent is renewed first, fenced by its
/// token: once that lands, the lease is whole again; should another caller
/// have taken the key over meanwhile, the renewal finds the claim gone,
/// and the claim is asked for again, which answers for the new holder.
async fn claim_again<S: Store + ?Sized>(
    store: &S,
    request: &BeginRequest<'_>,
    sent: Instant,
    first: Result<Begin, Error>,
) -> Result<Begin, Error> {
    let mut answer = first;
    let mut pause = Duration::from_millis(10);
    let (mut sends, mut renewals) = (1, 0);
    loop {
        match answer {
            Ok(Begin::Claimed(claim)) if sent.elapsed() < request.lease / LEASE_SPENT => {
                return Ok(Begin::Claimed(claim));
            }
            Ok(Begin::Claimed(claim)) => {
                tracing::debug!(
                    waited = ?sent.elapsed(),
                    "the claim was granted late; renewing its lease before the body runs"
                );
                renewals += 1;
                match store.renew(&claim).await {
                    Ok(()) => return Ok(Begin::Claimed(claim)),
                    // Taken over while the answer was on its way: the key
                    // is another caller's, whose answer the claim gets.
                    Err(Error::LeaseLost) if renewals < BEGIN_ATTEMPTS => {}
                    Err(Error::LeaseLost) => return Err(Error::LeaseLost),
                    Err(err) => return Err(err),
                }
            }
            Err(err @ Error::Store(_)) if sends < BEGIN_ATTEMPTS => {
                tracing::warn!(error = %err, attempt = sends, "claiming failed; trying again");
                tokio::time::sleep(pause).await;
                pause *= 4;
                sends += 1;
            }
            answer => return answer,
        }
        answer = store.begin(request).await;
    }
}

/// Releases the key after a failed operation; answers whether the claim
/// is settled (released, or not ours any more).
pub(super) async fn release<R: Records>(records: &mut R, claim: &Claim) -> bool {
    match records.release(claim).await {
        Ok(()) => {
            tracing::debug!(
                decision = "released",
                "the operation failed; the key is free for a retry"
            );
            true
        }
        Err(Error::LeaseLost) => true,
        Err(err) => {
            tracing::warn!(error = %err, "releasing the key failed; handing it back in the background");
            false
        }
    }
}
