//! A clean step failure (`Step::try_run` with `Failed::Cleanly`) takes
//! the step's journal entry back only when the body ends with no step
//! begun after it: a body that went on past the failure (a fallback, the
//! same step called again) may have had effects in later steps, and a
//! retry that ran the failed step afresh could take another path. The
//! promise of a step that refuses when in doubt holds: "no second effect,
//! unless the store could not keep the journal for longer than the
//! operation's ttl" (the guide's steps chapter).

use crate::common;
use crate::common::journal_of;
use async_trait::async_trait;
use idem::store::{Capabilities, Detach, Journal};

use std::future::Future;
use std::sync::atomic::{AtomicBool, AtomicUsize, Ordering};
use std::sync::{Arc, Mutex};
use std::time::Duration;

use idem::steps::{Failed, Step, StepKey};
use idem::{run, Call, Error, Policy, Store};

#[derive(Debug)]
enum PayError {
    /// "Declined: nothing was charged", the guide's own example of a
    /// clean failure.
    Declined,
    /// Something after the charges failed (the order's row, a lost
    /// connection): the key is released for a retry.
    Later,
    Idem(Error),
}

impl From<Error> for PayError {
    fn from(err: Error) -> Self {
        PayError::Idem(err)
    }
}

/// A card gateway that neither dedupes by key nor can be asked (why the
/// steps refuse when in doubt). Card `A` is declined, cleanly, until
/// `a_funded` (a transient decline: insufficient funds, a 503 "nothing
/// was charged"); card `B` is always charged.
#[derive(Default)]
struct Gateway {
    a_funded: AtomicBool,
    charges: Mutex<Vec<(&'static str, String)>>,
}

impl Gateway {
    async fn charge(&self, card: &'static str, key: &StepKey) -> Result<String, Failed<PayError>> {
        if card == "A" && !self.a_funded.load(Ordering::SeqCst) {
            return Err(Failed::Cleanly(PayError::Declined));
        }
        let mut charges = self.charges.lock().unwrap();
        charges.push((card, key.to_string()));
        Ok(format!("ch_{card}_{}", charges.len()))
    }

    fn charges(&self) -> Vec<(&'static str, String)> {
        self.charges.lock().unwrap().clone()
    }
}

/// How the first attempt ends once its charges are made.
#[derive(Clone, Copy, Debug)]
enum End {
    /// Its body fails after the charges: the key is released.
    BodyFails,
    /// Its caller is dropped after the charges: the claim is handed back.
    Dropped,
}

/// One attempt: charge card `A`; when `A` is declined cleanly, fall back
/// to card `B`. Both steps refuse when in doubt. `end`: how the attempt
/// ends after its charge (`None`: it returns the charge).
fn pay_with_fallback<'s, S: Store>(
    store: &'s S,
    key: &'s str,
    gateway: Arc<Gateway>,
    end: Option<End>,
) -> impl Future<Output = Result<String, PayError>> + 's {
    let call = Call::new("clean_failures.fallback", key, &700u64)
        .with_policy(Policy::new().wait(Duration::from_secs(10)));
    run(store, call, async move {
        let first = {
            let gateway = gateway.clone();
            Step::new("charge-a")
                .refuse()
                .try_run(|key| async move { gateway.charge("A", &key).await })
                .await
        };
        let charge = match first {
            Ok(charge) => charge,
            Err(PayError::Declined) => {
                let gateway = gateway.clone();
                Step::new("charge-b")
                    .refuse()
                    .try_run(|key| async move { gateway.charge("B", &key).await })
                    .await?
            }
            Err(err) => return Err(err),
        };
        match end {
            None => Ok(charge),
            Some(End::BodyFails) => Err(PayError::Later),
            Some(End::Dropped) => std::future::pending().await,
        }
    })
}

/// A body that falls back on a clean decline, interrupted after the
/// fallback's charge, charges once under `refuse`. The interleaving that
/// would charge twice were the start taken back at once:
///
/// 1. Attempt 1: step 0 (`charge-a`) is declined cleanly. The body falls
///    back: step 1 (`charge-b`) charges card B and is journaled
///    `completed`.
/// 2. The attempt ends before its outcome is saved (its body fails
///    later, or its caller is dropped): the key is released.
/// 3. Card A's decline was transient (funds arrived, the 503 passed).
/// 4. Attempt 2: step 0 finds no entry (it was taken back), so it runs as
///    never started and charges card A. The body takes the other branch,
///    never reaches step 1, and completes: card A charged, card B's
///    charge (journaled, completed) orphaned: two charges for one
///    payment, though both steps refuse when in doubt.
///
/// The start is kept since the body went on past step 0: attempt 2 is
/// refused (`OutcomeUnknown`), with one charge.
async fn a_fallback_after_a_clean_decline_keeps_it_in_doubt<S: Store>(store: S) {
    let mut broken = Vec::new();
    for end in [End::BodyFails, End::Dropped] {
        let key = common::fresh("fallback");
        let gateway = Arc::new(Gateway::default());
        match end {
            End::BodyFails => {
                let first = pay_with_fallback(&store, &key, gateway.clone(), Some(end)).await;
                assert!(matches!(first, Err(PayError::Later)), "{first:?}");
            }
            End::Dropped => {
                let attempt = pay_with_fallback(&store, &key, gateway.clone(), Some(end));
                let ended = tokio::time::timeout(Duration::from_millis(500), attempt).await;
                assert!(ended.is_err(), "the attempt ended: {ended:?}");
            }
        }
        assert_eq!(gateway.charges().len(), 1, "{end:?}: card B charged once");
        gateway.a_funded.store(true, Ordering::SeqCst);
        let second = pay_with_fallback(&store, &key, gateway.clone(), None).await;
        let charges = gateway.charges();
        if charges.len() != 1 {
            broken.push(format!(
                "{end:?}: one payment, two charges under steps that refuse when in doubt: \
                 {charges:?}; the retry answered {second:?}"
            ));
        }
    }
    assert!(
        broken.is_empty(),
        "card A's cleanly declined step was taken back, so the retry charged card A and left \
         card B's journaled charge behind:\n{}",
        broken.join("\n")
    );
}

/// The same, through one step name called twice: a body
/// that retries a cleanly declined call by calling the step again (not
/// inside the step, as the steps module asks; but the call is declined,
/// not in doubt, so nothing in the API stops it) gets a new key per
/// occurrence. Attempt 1: occurrence 0 declined, taken back; occurrence
/// 1 charged and journaled; the body fails later. Attempt 2: occurrence
/// 0 runs as never started, under its own key, and is charged: two
/// charges, under `refuse`, were the start taken back at once; kept,
/// attempt 2 is refused.
async fn a_step_called_again_after_a_clean_decline_keeps_it_in_doubt<S: Store>(store: S) {
    let key = common::fresh("again");
    let gateway = Arc::new(Gateway::default());
    let attempt = |fail_after: bool| {
        let (store, key, gateway) = (&store, key.as_str(), gateway.clone());
        let call = Call::new("clean_failures.again", key, &700u64)
            .with_policy(Policy::new().wait(Duration::from_secs(10)));
        run(store, call, async move {
            let mut charge = None;
            for _ in 0..3 {
                let gateway = gateway.clone();
                let result = Step::new("charge")
                    .refuse()
                    .try_run(|key| async move {
                        // Declined the first time only (a 503: nothing
                        // was charged).
                        if !gateway.a_funded.swap(true, Ordering::SeqCst) {
                            return Err(Failed::Cleanly(PayError::Declined));
                        }
                        gateway.charge("A", &key).await
                    })
                    .await;
                match result {
                    Ok(c) => {
                        charge = Some(c);
                        break;
                    }
                    Err(PayError::Declined) => continue,
                    Err(err) => return Err(err),
                }
            }
            if fail_after {
                return Err(PayError::Later);
            }
            Ok(charge.expect("charged within three tries"))
        })
    };
    assert!(matches!(attempt(true).await, Err(PayError::Later)));
    assert_eq!(gateway.charges().len(), 1);
    let second = attempt(false).await;
    let charges = gateway.charges();
    assert!(
        charges.len() == 1,
        "one payment, two charges under a step that refuses when in doubt: {charges:?}; the \
         retry answered {second:?}"
    );
}

/// A store of your own that forwards every method it knew before
/// `undo_step` existed (a decorator: here, one that counts begins).
struct Decorated<S> {
    inner: S,
    begins: AtomicUsize,
}

#[async_trait]
impl<S: Store + Clone + 'static> Store for Decorated<S> {
    async fn begin(
        &self,
        request: &idem::store::BeginRequest<'_>,
    ) -> Result<idem::record::Begin, Error> {
        self.begins.fetch_add(1, Ordering::Relaxed);
        self.inner.begin(request).await
    }
    async fn peek(
        &self,
        request: &idem::store::BeginRequest<'_>,
    ) -> Result<Option<idem::record::Begin>, Error> {
        self.inner.peek(request).await
    }
    async fn renew(&self, claim: &idem::record::Claim) -> Result<(), Error> {
        self.inner.renew(claim).await
    }
    async fn complete(
        &self,
        claim: &idem::record::Claim,
        outcome: &idem::record::Outcome,
    ) -> Result<(), Error> {
        self.inner.complete(claim, outcome).await
    }
    async fn release(&self, claim: &idem::record::Claim) -> Result<(), Error> {
        self.inner.release(claim).await
    }
    async fn get(
        &self,
        scope: &idem::Scope,
        key: &idem::Key,
    ) -> Result<Option<idem::record::Record>, Error> {
        self.inner.get(scope, key).await
    }
    async fn forget(&self, scope: &idem::Scope, key: &idem::Key) -> Result<bool, Error> {
        self.inner.forget(scope, key).await
    }
    async fn purge_expired(&self, batch: usize) -> Result<u64, Error> {
        self.inner.purge_expired(batch).await
    }
    fn journal(&self) -> Option<&dyn Journal> {
        Some(self)
    }
    fn capabilities(&self) -> Capabilities<'_> {
        Capabilities::default().with_detach(self)
    }
}

#[async_trait]
impl<S: Store + Clone + 'static> Journal for Decorated<S> {
    async fn begin_step(
        &self,
        step: &idem::journal::StepRequest<'_>,
    ) -> Result<idem::journal::StepBegin, Error> {
        journal_of(&self.inner).begin_step(step).await
    }
    async fn complete_step(
        &self,
        step: &idem::journal::StepRequest<'_>,
        output: &[u8],
    ) -> Result<(), Error> {
        journal_of(&self.inner).complete_step(step, output).await
    }
    async fn steps(
        &self,
        scope: &idem::Scope,
        key: &idem::Key,
    ) -> Result<Vec<idem::journal::StepRecord>, Error> {
        journal_of(&self.inner).steps(scope, key).await
    }
    async fn resolve_step(
        &self,
        step: &idem::journal::StepAt<'_>,
        to: &idem::journal::StepResolution,
    ) -> Result<bool, Error> {
        journal_of(&self.inner).resolve_step(step, to).await
    }
    async fn keep_steps(
        &self,
        scope: &idem::Scope,
        key: &idem::Key,
        ttl: std::time::Duration,
    ) -> Result<(), Error> {
        journal_of(&self.inner).keep_steps(scope, key, ttl).await
    }
}

impl<S: Store + Clone + 'static> Detach for Decorated<S> {
    fn detach(&self) -> Option<Arc<dyn Store>> {
        Some(Arc::new(Decorated {
            inner: self.inner.clone(),
            begins: AtomicUsize::new(0),
        }))
    }
}

/// A clean failure whose start was not taken back (a store without
/// `undo_step`: the trait's default, as in a decorator that does not
/// forward it; or an entry a successor adopted) is not counted
/// `idem_steps_total{decision="failed_cleanly"}`, which says "its start
/// was taken back": the next attempt is refused (`OutcomeUnknown`), and
/// the dashboard must not say the failure left no doubt.
#[test]
fn only_a_start_taken_back_is_counted_as_a_clean_failure() {
    use metrics_util::debugging::{DebugValue, DebuggingRecorder};

    let recorder = DebuggingRecorder::new();
    let snapshotter = recorder.snapshotter();
    metrics::with_local_recorder(&recorder, || {
        tokio::runtime::Builder::new_current_thread()
            .enable_all()
            .build()
            .unwrap()
            .block_on(async {
                let store = Arc::new(Decorated {
                    inner: idem::MemoryStore::new(),
                    begins: AtomicUsize::new(0),
                });
                let attempt = || {
                    let store = store.clone();
                    async move {
                        run(
                            &*store,
                            Call::new("clean_failures.counted", "k1", &1u32),
                            async {
                                Step::new("charge")
                                    .refuse()
                                    .try_run(|_key| async {
                                        Err::<u32, _>(Failed::Cleanly(PayError::Declined))
                                    })
                                    .await
                            },
                        )
                        .await
                    }
                };
                assert!(matches!(attempt().await, Err(PayError::Declined)));
                let second = attempt().await;
                // The default `undo_step` kept the entry: the step is in
                // doubt, as the trait documents.
                assert!(
                    matches!(second, Err(PayError::Idem(Error::OutcomeUnknown { .. }))),
                    "{second:?}"
                );
            });
    });
    let failed_cleanly: u64 = snapshotter
        .snapshot()
        .into_vec()
        .into_iter()
        .filter(|(key, ..)| {
            key.key().name() == idem::steps::STEPS
                && key
                    .key()
                    .labels()
                    .any(|l| l.key() == "decision" && l.value() == "failed_cleanly")
        })
        .map(|(.., value)| match value {
            DebugValue::Counter(n) => n,
            _ => 0,
        })
        .sum();
    assert_eq!(
        failed_cleanly, 0,
        "a start that was not taken back (the next attempt was refused as in doubt) was counted \
         failed_cleanly, \"its start was taken back\""
    );
}

common::backends!(memory, sqlite_file, postgres, mysql, redis => {
    #[tokio::test(flavor = "multi_thread", worker_threads = 2)]
    async fn a_fallback_after_a_clean_decline_keeps_it_in_doubt() {
        let (store, _guard) = backend::store(8).await;
        super::a_fallback_after_a_clean_decline_keeps_it_in_doubt(store).await;
    }

    #[tokio::test(flavor = "multi_thread", worker_threads = 2)]
    async fn a_step_called_again_after_a_clean_decline_keeps_it_in_doubt() {
        let (store, _guard) = backend::store(8).await;
        super::a_step_called_again_after_a_clean_decline_keeps_it_in_doubt(store).await;
    }
});
