//! The scripts a Redis store sends, for the benchmark's reference (a
//! loop of the same commands on the same connection, without the
//! engine), so that it never drifts from the store.

use std::future::Future;

use super::replies::{array, int, status};
use super::scripts::SCRIPTS;
use super::RedisStore;
use idem_core::error::Error;
use idem_core::record::{BeginRequest, Claim, Outcome};

impl RedisStore {
    /// A first execution in record mode as the store sends it for a key
    /// no record holds: the claim script, then `body` (the caller's own
    /// write), then the completion script with `outcome`, each through the
    /// store's connection as its claim and completion are, and nothing of
    /// the engine around them: no payload fingerprinted, no guard, no
    /// waiters handed the outcome, no metrics, no tracing.
    ///
    /// Fails where the claim finds the key taken or the completion its
    /// claim gone.
    #[cfg_attr(docsrs, doc(cfg(feature = "testing")))]
    pub async fn reference_first_execution<F: Future<Output = ()>>(
        &self,
        request: &BeginRequest<'_>,
        body: F,
        outcome: &Outcome,
    ) -> Result<(), Error> {
        let keys = self.keys(request.scope, request.key);
        let (value, _) = self
            .invoke_replicated(super::records::claim_call(&keys, request))
            .await?;
        let items = array(value)?;
        if status(&items)? != "claimed" {
            return Err(Error::store("the reference's key was taken"));
        }
        let fence = items
            .get(1)
            .and_then(int)
            .ok_or_else(|| Error::store("the claim answered no fence"))?;
        body.await;
        self.complete_once(&Claim::granted(request, fence), outcome, &keys)
            .await
    }

    /// A replay as the store sends it: the read of the record (the `peek`
    /// script), its reply parsed, nothing decided on it.
    #[cfg_attr(docsrs, doc(cfg(feature = "testing")))]
    pub async fn reference_replay(&self, request: &BeginRequest<'_>) -> Result<(), Error> {
        let keys = self.keys(request.scope, request.key);
        let value = self.invoke(SCRIPTS.peek.on(&keys.record)).await?;
        match super::replies::now_and_record(value)? {
            (_, Some(_)) => Ok(()),
            (_, None) => Err(Error::store("the reference's record is gone")),
        }
    }
}
