//! A store that never records: every call runs its body.

use async_trait::async_trait;

use super::{BeginRequest, Capabilities, Detach, Immediate, Journal, Store};
use idem_core::error::Error;
use idem_core::journal::{StepAt, StepBegin, StepRecord, StepRequest, StepResolution, StepRun};
use idem_core::key::{Key, Scope};
use idem_core::record::{Begin, Claim, Outcome, Record};

/// A store that never records anything: every call is granted a fresh
/// claim, so every call runs its body, duplicates included, and nothing is
/// ever replayed. Keys and payloads are still checked.
///
/// For unit tests that exercise a service's own logic and do not care
/// about idempotency; never for production, where it silently turns the
/// protection off. Its name says so at every use.
///
/// ```
/// use idem::{idempotent, PassThroughStore};
///
/// struct Mailer { store: PassThroughStore, sent: std::sync::atomic::AtomicU32 }
///
/// impl Mailer {
///     #[idempotent(key = key, store = self.store)]
///     async fn send(&self, key: &str) -> Result<u32, idem::Error> {
///         Ok(self.sent.fetch_add(1, std::sync::atomic::Ordering::SeqCst) + 1)
///     }
/// }
///
/// # tokio::runtime::Runtime::new().unwrap().block_on(async {
/// let mailer = Mailer { store: PassThroughStore, sent: Default::default() };
/// assert_eq!(mailer.send("k").await.unwrap(), 1);
/// assert_eq!(mailer.send("k").await.unwrap(), 2); // ran again: nothing recorded
/// # });
/// ```
#[derive(Clone, Copy, Debug, Default)]
pub struct PassThroughStore;

#[async_trait]
impl Store for PassThroughStore {
    async fn begin(&self, request: &BeginRequest<'_>) -> Result<Begin, Error> {
        Ok(Begin::Claimed(Claim::granted(request, 1)))
    }

    async fn renew(&self, _claim: &Claim) -> Result<(), Error> {
        Ok(())
    }

    async fn complete(&self, _claim: &Claim, _outcome: &Outcome) -> Result<(), Error> {
        Ok(())
    }

    async fn release(&self, _claim: &Claim) -> Result<(), Error> {
        Ok(())
    }

    async fn get(&self, _scope: &Scope, _key: &Key) -> Result<Option<Record>, Error> {
        Ok(None)
    }

    async fn forget(&self, _scope: &Scope, _key: &Key) -> Result<bool, Error> {
        Ok(false)
    }

    async fn purge_expired(&self, _batch: usize) -> Result<u64, Error> {
        Ok(0)
    }

    fn journal(&self) -> Option<&dyn Journal> {
        Some(self)
    }

    fn capabilities(&self) -> Capabilities<'_> {
        Capabilities::default()
            .with_immediate(self)
            .with_detach(self)
    }
}

impl Immediate for PassThroughStore {
    fn begin_now(&self, request: &BeginRequest<'_>) -> Option<Result<Begin, Error>> {
        Some(Ok(Begin::Claimed(Claim::granted(request, 1))))
    }

    fn complete_now(&self, _claim: &Claim, _outcome: &Outcome) -> Option<Result<(), Error>> {
        Some(Ok(()))
    }
}

impl Detach for PassThroughStore {
    fn detach(&self) -> Option<std::sync::Arc<dyn Store>> {
        Some(std::sync::Arc::new(PassThroughStore))
    }
}

/// Every step runs: nothing is journaled.
#[async_trait]
impl Journal for PassThroughStore {
    async fn begin_step(&self, _step: &StepRequest<'_>) -> Result<StepBegin, Error> {
        Ok(StepBegin::Run(StepRun::Fresh))
    }

    async fn complete_step(&self, _step: &StepRequest<'_>, _output: &[u8]) -> Result<(), Error> {
        Ok(())
    }

    async fn steps(&self, _scope: &Scope, _key: &Key) -> Result<Vec<StepRecord>, Error> {
        Ok(Vec::new())
    }

    async fn keep_steps(
        &self,
        _scope: &Scope,
        _key: &Key,
        _ttl: std::time::Duration,
    ) -> Result<(), Error> {
        Ok(())
    }

    async fn resolve_step(&self, _step: &StepAt<'_>, _to: &StepResolution) -> Result<bool, Error> {
        Ok(false)
    }
}
