//! What a caller holds while its call runs, handed on should the caller
//! be dropped at an `.await`: a claim back to the store, by its token; an
//! outcome into it, in the background (see the module documentation's
//! "Cancellation").

use std::sync::Arc;
use std::time::Duration;
use tokio::time::Instant;

use crate::metrics;
use crate::steps::Operation;
use crate::store::{BeginRequest, Store};
use idem_core::error::Error;
use idem_core::record::{Claim, Outcome};

use super::save::{save, SaveFor, MAX_SAVE_PAUSE};

/// How many times the release of a claim whose answer never came is sent
/// again when it finds nothing (20 ms apart, then twice as far each time:
/// some 1.3 s in all).
const LATE_CLAIM_LOOKS: u32 = 6;

/// What a caller holds, so that dropping it mid-call hands it on.
enum Holding {
    /// Nothing left to do.
    Nothing,
    /// A claim sent (its answer may be lost) or won, whose body has not
    /// finished: it cannot run any more, so it is handed back at once.
    Claim,
    /// An outcome in hand, not yet stored: it is stored in the background.
    Outcome(Outcome),
}

/// Hands on what a dropped (or failed) caller holds, from a task of its
/// own: the claim back to the store (fenced by its token, so a later
/// claim is never touched), or the outcome into it.
///
/// It borrows the store and detaches it ([`Detach`](crate::store::Detach)) only when it
/// has something to hand on, so a call that ends normally pays nothing.
pub(super) struct Guard<'s, 'r, S: Store + ?Sized> {
    store: &'s S,
    /// The claim sent, handed back by its token if its answer is lost.
    request: &'r BeginRequest<'r>,
    /// The claim won, once it is.
    claim: Option<Claim>,
    holding: Holding,
    /// The operation whose journal writes on their way land before the
    /// claim is handed back.
    operation: Option<Operation>,
}

impl<'s, 'r, S: Store + ?Sized> Guard<'s, 'r, S> {
    pub(super) fn new(store: &'s S, request: &'r BeginRequest<'r>) -> Self {
        Guard {
            store,
            request,
            claim: None,
            holding: Holding::Claim,
            operation: None,
        }
    }

    /// Hands the claim back only once `operation`'s journal writes have
    /// landed.
    pub(super) fn journal_first(&mut self, operation: Operation) {
        self.operation = Some(operation);
    }

    pub(super) fn running(&mut self, claim: Claim) {
        self.claim = Some(claim);
        self.holding = Holding::Claim;
    }

    /// Holds `outcome` to store it in the background should the caller
    /// be dropped, and lends it meanwhile: the caller stores it from here.
    pub(super) fn saving(&mut self, outcome: Outcome) -> &Outcome {
        self.holding = Holding::Outcome(outcome);
        match &self.holding {
            Holding::Outcome(outcome) => outcome,
            _ => unreachable!("just set"),
        }
    }

    pub(super) fn disarm(&mut self) {
        self.holding = Holding::Nothing;
    }
}

impl<S: Store + ?Sized> Drop for Guard<'_, '_, S> {
    fn drop(&mut self) {
        let holding = std::mem::replace(&mut self.holding, Holding::Nothing);
        if matches!(holding, Holding::Nothing) {
            return;
        }
        // Built only now: a call that ends normally never needs it. Fence
        // 0: the claim's answer never came (see `hand_back`).
        let claim = match self.claim.take() {
            Some(claim) => claim,
            None => Claim::granted(self.request, 0),
        };
        let runtime = tokio::runtime::Handle::try_current().ok();
        let (Some(runtime), Some(store)) = (runtime, self.store.capabilities().detached()) else {
            tracing::warn!(
                decision = "abandoned",
                fence = claim.fence,
                "the call ended early and its claim cannot be handed back here; \
                 the key stays claimed until its lease runs out"
            );
            metrics::abandoned(&claim.scope, "left");
            return;
        };
        match holding {
            Holding::Nothing => {}
            Holding::Claim => {
                tracing::warn!(
                    decision = "abandoned",
                    fence = claim.fence,
                    "the call ended before its operation finished; handing the key back"
                );
                metrics::abandoned(&claim.scope, "released");
                let operation = self.operation.take();
                runtime.spawn(async move {
                    if let Some(operation) = operation {
                        operation.flush().await;
                    }
                    hand_back(store, claim).await;
                });
            }
            Holding::Outcome(outcome) => {
                tracing::warn!(
                    decision = "abandoned",
                    fence = claim.fence,
                    "the call ended before its outcome was stored; storing it in the background"
                );
                metrics::abandoned(&claim.scope, "saved");
                runtime.spawn(async move {
                    save(&*store, &claim, &outcome, SaveFor::Background).await;
                });
            }
        }
    }
}

/// Releases a claim that nobody will complete, trying again while the store
/// fails, for as long as the lease would have held it anyway.
///
/// A claim whose answer never came (fence 0: the caller was dropped while
/// its claim was on its way) may land after a first release finds nothing:
/// its statement went out on a connection that the drop handed back to
/// the pool, which lets it run to its end. Its release is then sent again,
/// a few times over about a second, before the claim is taken for one
/// that never landed; a later one is left to its lease.
async fn hand_back(store: Arc<dyn Store>, claim: Claim) {
    let until = Instant::now() + claim.lease;
    let mut pause = Duration::from_millis(20);
    let mut late_looks = if claim.fence == 0 {
        LATE_CLAIM_LOOKS
    } else {
        0
    };
    loop {
        match store.release(&claim).await {
            Ok(()) => {
                tracing::debug!(decision = "released", "the key is free for a retry");
                return;
            }
            // Not landed yet, perhaps: once more, a little later.
            Err(Error::LeaseLost) if late_looks > 0 && Instant::now() + pause < until => {
                late_looks -= 1;
                tokio::time::sleep(pause).await;
                pause = (pause * 2).min(MAX_SAVE_PAUSE);
            }
            // Never landed, already gone, or someone else's now.
            Err(Error::LeaseLost) => return,
            Err(err) if Instant::now() + pause < until => {
                tracing::debug!(error = %err, "handing the key back failed; trying again");
                tokio::time::sleep(pause).await;
                pause = (pause * 2).min(MAX_SAVE_PAUSE);
            }
            Err(err) => {
                tracing::warn!(error = %err, "handing the key back failed; it frees itself when the lease runs out");
                return;
            }
        }
    }
}
