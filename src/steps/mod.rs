//! Durable steps: effects outside the database that happen once, across
//! crashes, dropped callers and re-runs.
//!
//! An idempotent operation protects what it writes through its store; a
//! call to another system (a card gateway, a mailer, another service) is
//! a different matter: when the process dies after the gateway charged and
//! before the outcome was saved, the retry runs the body again. Inside an
//! operation (an `#[idempotent]` function, or the body given to
//! [`run`](crate::run)), name such a call as a **step**:
//!
//! ```
//! use idem::{run, steps::step, Call, MemoryStore};
//!
//! # async fn charge_card(amount: u64, key: &str) -> Result<String, idem::Error> { Ok(format!("ch_{amount}")) }
//! # #[tokio::main(flavor = "current_thread")]
//! # async fn main() -> Result<(), idem::Error> {
//! let store = MemoryStore::new();
//! let pay = |amount: u64| {
//!     run(&store, Call::new("payments.pay", "order-17", &amount), async move {
//!         // The gateway gets a key derived from the operation and the step:
//!         // the same at every attempt, in every process.
//!         let charge: String = step("charge", |key| async move {
//!             charge_card(amount, key.as_str()).await
//!         })
//!         .await?;
//!         Ok::<_, idem::Error>(charge)
//!     })
//! };
//! assert_eq!(pay(500).await?, "ch_500");
//! # Ok(())
//! # }
//! ```
//!
//! - The step's `Ok` output is **journaled** in the store, fenced by the
//!   operation's claim. When the operation runs again (its body failed, its
//!   caller was dropped, its process crashed and the claim was taken over),
//!   each completed step returns its journaled output without running.
//! - Each step gets a **derived key** ([`StepKey`]) for the downstream
//!   call: stable across attempts, processes and takeovers. A step that
//!   was interrupted runs again with the same key, so a downstream that
//!   dedupes by key (Stripe, most payment APIs, another idem service)
//!   performs its effect once.
//! - Steps are told apart by their place in the operation: an operation
//!   must call the same steps, under the same names, in the same order at
//!   every attempt (as workflow engines require). A run that differs from
//!   the journal is refused with [`Error::StepMismatch`]. A step called
//!   twice under one name is two steps, with two keys: to retry a call,
//!   retry inside the step, where the key stays the same.
//!
//! ## Steps in doubt
//!
//! A step that an earlier attempt started and never journaled (its process
//! died, its caller was dropped, or its call returned an error, which may
//! hide an effect: a timeout) is **in doubt** when the operation runs
//! again. Each step chooses what then happens ([`Step`]):
//!
//! - **rerun** (the default): it runs again with the same derived key.
//!   Right for a downstream that dedupes by key.
//! - **reconcile**: a function of yours asks the downstream, by key, what
//!   happened. Its answer is journaled and returned; when nothing
//!   happened, the step runs (again with the same key).
//! - **refuse**: the operation fails with [`Error::OutcomeUnknown`] (HTTP
//!   502 through the layer), at every attempt, until an operator settles
//!   the step with [`resolve`] (with its output, or allowing a rerun). The
//!   safe choice for a downstream that neither dedupes by key nor can be
//!   asked.
//!
//! A step's call may still be in flight when its attempt ends: the caller
//! was dropped, or the call's own client timed out while the downstream
//! still had the request. Until the step's settle window has passed since
//! that attempt started it ([`Step::settle`]; for `reconcile`, the
//! operation's lease by default), a step in doubt is neither reconciled
//! nor run again: the attempt fails with [`Error::InProgress`], whose
//! `retry_after` says when the window closes. An absent answer from the
//! downstream is trusted only after it.
//!
//! A call that failed **cleanly** leaves no doubt: when the downstream
//! says nothing happened ("503, nothing was charged", a declined card),
//! return [`Failed::Cleanly`] from [`Step::try_run`]. When the body ends,
//! the step's start is taken back, and the next attempt runs it as one
//! never started: no reconcile, no refusal, no settle window, no warning.
//! An error `run` returns, or [`Failed::InDoubt`], leaves the step in
//! doubt as above. Only the body's last step is taken back, and only a
//! start this attempt made afresh: a body that went on to another step
//! (a fallback) may have had its effect there, and a step an earlier
//! attempt left in doubt may have landed then; both stay in doubt.
//!
//! In-doubt steps are logged and counted (`idem_steps_in_doubt_total`, by
//! `resolution`). Completed and replayed steps are counted in
//! `idem_steps_total`, by `decision`.
//!
//! ## What the journal costs
//!
//! The journal is read once per attempt, at its first step. A step that
//! reconciles or refuses writes its entry before its call and its output
//! right after it, so that nothing about it is ever lost. A step that is
//! rerun (the default) may be called again with its key anyway, so its
//! writes leave the call's path: its entry is started while its call
//! runs, and its output is journaled while the body goes on, each on a
//! task of its own. The body's result reaches the engine only once they
//! have landed, and a dropped caller's claim is handed back only after
//! them (except on SQLite, whose writes queue for one lock anyway: there
//! they are made in line, as for the other policies). Two things follow,
//! both within what a rerun step accepts: a
//! process killed right after such a step returned may take its output
//! with it (the next attempt calls it again, with the same key), and an
//! attempt that lost its claim may still start one more such call (with
//! the key its successor uses).
//!
//! ## Atomic phases
//!
//! A step that writes to the database can commit its rows with its
//! journal entry: [`Step::in_transaction`] runs the step on your open
//! transaction, writes the entry there, and commits. A multi-phase
//! operation (create the ride, charge, send the receipt) then resumes
//! after its last committed phase.
//!
//! ## Modes
//!
//! Steps work in record mode and entity mode, whose claims are written on
//! the store's pool. In transactional mode the claim is not committed
//! until the caller commits, so nothing could be journaled beside it: a
//! step there gets its derived key and runs (a rerun after a rollback uses
//! the same key), and `reconcile` and `refuse` are refused with
//! [`Error::Config`]. The journal is written through the store's
//! background handle ([`Detach`](crate::store::Detach)): on a store of your own without
//! one, steps run unjournaled, as in transactional mode. Steps must be
//! called from the operation's own task: a task spawned by the body does
//! not see the operation.

use std::fmt;
use std::future::Future;
use std::sync::{Arc, Mutex};
use std::time::Duration;

use serde::de::DeserializeOwned;
use serde::Serialize;
use sha2::{Digest, Sha256};

use crate::store::{journal_of, Store, TransactionalStore};
use idem_core::error::Error;
use idem_core::fingerprint::Fingerprint;
use idem_core::journal::{StepBegin, StepRequest, StepResolution, StepRun};
use idem_core::key::{AsKey, Key, KeyError, Scope};
use idem_core::record::Claim;

/// The name of the steps counter (`decision`: `ran`, `replayed`,
/// `failed_cleanly` (its call failed with no effect, and its start was
/// taken back)).
pub const STEPS: &str = "idem_steps_total";
/// The name of the in-doubt steps counter (`resolution`: `rerun`,
/// `reconciled`, `reconciled_none` (reconcile found nothing and the step
/// ran), `in_flight` (an earlier attempt's call may still land: the
/// attempt was told to come back), `refused`, `allowed` (an operator allowed a rerun),
/// `operator_completed`, `operator_rerun`).
pub const STEPS_IN_DOUBT: &str = "idem_steps_in_doubt_total";

/// The longest step name.
pub const MAX_STEP_NAME_LEN: usize = 64;

/// How often a journal write whose answer was lost is sent again.
const JOURNAL_ATTEMPTS: u32 = 3;

tokio::task_local! {
    static OPERATION: Operation;
}

/// What an operation's durable steps derive their keys from, and how
/// their journal entries are checked and kept. The journal itself is the
/// claim's: every entry is written, read and kept under the claim's scope
/// and key (see `Operation::new`), the one place that chooses it.
#[derive(Clone, Debug)]
pub(crate) struct StepsAs {
    /// Derives the steps' keys (entity mode: the operation's, not its
    /// per-table claim's).
    pub(crate) scope: Scope,
    /// The payload's: a journal of another payload is refused.
    pub(crate) fingerprint: Fingerprint,
    /// How long journal entries are kept after their last write.
    pub(crate) ttl: Duration,
}

/// The operation a body runs under, as its steps see it: one handle on
/// its state, so that the task-local moves a pointer, not the state, in
/// and out each time the body is polled (moving the state itself cost a
/// first execution over a store in memory some 280 instructions).
/// Cloning shares it: the engine keeps a clone to wait for the journal
/// writes before a dropped caller's claim is handed back.
#[derive(Clone)]
pub(crate) struct Operation(Arc<State>);

struct State {
    /// Where steps are journaled; `None` in transactional mode.
    journal: Option<Arc<dyn Store>>,
    /// The claim that fences the journal.
    claim: Claim,
    /// The operation's scope (for the keys), payload and journal ttl.
    steps: StepsAs,
    /// Where this attempt is among its steps. Only the operation's own
    /// task takes it, between awaits.
    progress: Mutex<Progress>,
    /// Journal writes still on their way, awaited before the body's
    /// result is handed to the engine ([`flushed`]), and before a dropped
    /// caller's claim is handed back.
    pending: Mutex<Vec<tokio::task::JoinHandle<()>>>,
    /// The outbox messages of this attempt: how many of each topic were
    /// published so far, and (entity mode) the messages held until the
    /// entity's transaction writes them.
    #[cfg(feature = "_sql")]
    messages: Mutex<Messages>,
}

/// An attempt's outbox messages (see [`crate::outbox`]).
#[cfg(feature = "_sql")]
#[derive(Default)]
struct Messages {
    /// Entity mode: the messages to write with the entity, in order;
    /// `None` in the other modes, where a message is written on the
    /// body's own transaction.
    held: Option<Vec<Box<dyn std::any::Any + Send + Sync>>>,
}

/// Where an outbox message of the running operation belongs: what its id
/// derives from, and how long it is kept once relayed.
#[cfg(feature = "_sql")]
pub(crate) struct MessageSlot {
    /// The operation's scope (entity mode: the operation's, not its claim's).
    pub(crate) scope: Scope,
    /// The claim, which fences the message's insert.
    pub(crate) claim: Claim,
    /// The operation's payload: a key used again with another payload
    /// (after its ttl) is another operation, whose messages are others.
    pub(crate) fingerprint: Fingerprint,
    /// How long the message is kept after it was written: the records'.
    pub(crate) ttl: Duration,
}

#[derive(Default)]
struct Progress {
    /// The next step's place.
    next: u32,
    /// How many steps of each name were called so far.
    names: Vec<(&'static str, u32)>,
    /// The places that held a journal entry when this attempt first
    /// looked (`None`: not looked yet). Only this attempt adds entries
    /// while it holds the claim, so a place absent then is absent until
    /// this attempt writes it.
    journaled: Option<Vec<u32>>,
    /// The last step, if its call failed cleanly and this attempt began
    /// it afresh: its start is taken back when the body ends, unless
    /// another step begins first ([`take_back_later`]).
    take_back: Option<(Current, &'static str)>,
}

/// Locks `mutex`, whose holders only read or assign plain values: a panic
/// while it was held left nothing half-written.
fn lock<T>(mutex: &Mutex<T>) -> std::sync::MutexGuard<'_, T> {
    mutex.lock().unwrap_or_else(|e| e.into_inner())
}

impl Operation {
    /// The operation of `claim`, journaling in `journal` (`None`: steps
    /// run with their keys, unjournaled).
    pub(crate) fn new(journal: Option<Arc<dyn Store>>, claim: Claim, steps: StepsAs) -> Self {
        Operation(Arc::new(State {
            journal,
            claim,
            steps,
            progress: Mutex::default(),
            pending: Mutex::default(),
            #[cfg(feature = "_sql")]
            messages: Mutex::default(),
        }))
    }

    /// Runs `body` under this operation: its steps are this operation's.
    /// The body's result is handed back once its steps' journal writes
    /// have landed (or given up), so the outcome is stored, or the claim
    /// released for a retry, with the journal complete.
    pub(crate) fn scope<F: Future>(self, body: F) -> impl Future<Output = F::Output> {
        OPERATION.scope(self, flushed(body))
    }

    /// The next step, named `name`.
    fn next_step(&self, name: &'static str) -> Current {
        let state = &*self.0;
        let (seq, occurrence) = {
            let mut progress = lock(&state.progress);
            if let Some((earlier, earlier_name)) = progress.take_back.take() {
                // The body went on past a cleanly failed step: a later
                // attempt that ran that step afresh could take another
                // path than this one took, past steps this one may have
                // had effects in. Its start stays: in doubt.
                tracing::debug!(
                    step = earlier_name,
                    step_key = %earlier.key,
                    "a step failed cleanly and the body went on: it stays in doubt"
                );
            }
            let seq = progress.next;
            progress.next += 1;
            let occurrence = match progress.names.iter_mut().find(|(n, _)| *n == name) {
                Some((_, count)) => {
                    *count += 1;
                    *count - 1
                }
                None => {
                    progress.names.push((name, 1));
                    0
                }
            };
            (seq, occurrence)
        };
        Current {
            journal: state.journal.clone(),
            claim: state.claim.clone(),
            fingerprint: state.steps.fingerprint,
            ttl: state.steps.ttl,
            seq,
            key: StepKey::derive(&state.steps.scope, &state.claim.key, name, occurrence),
        }
    }

    fn push(&self, write: tokio::task::JoinHandle<()>) {
        lock(&self.0.pending).push(write);
    }

    /// Whether journal writes may still be on their way.
    fn writing(&self) -> bool {
        !lock(&self.0.pending).is_empty()
    }

    /// Waits for every journal write on its way.
    ///
    /// Dropped while it waits (the body's own flush, whose caller went
    /// away), it puts the writes that have not landed back where the
    /// engine's guard finds them: the guard then waits for them in turn
    /// before it hands the claim back, as it would have had the body been
    /// dropped before its flush began.
    pub(crate) async fn flush(&self) {
        loop {
            let pending = std::mem::take(&mut *lock(&self.0.pending));
            if pending.is_empty() {
                return;
            }
            let mut awaiting = Awaiting {
                operation: self,
                writes: pending.into(),
            };
            while let Some(write) = awaiting.writes.front_mut() {
                // A write that panicked journaled nothing: the step is in
                // doubt for the next attempt, which reruns it.
                let _ = write.await;
                awaiting.writes.pop_front();
            }
        }
    }
}

/// Journal writes taken out of an operation's list to be awaited, the
/// first one of them being awaited: whatever is left of them when this is
/// dropped goes back to the list.
struct Awaiting<'a> {
    operation: &'a Operation,
    writes: std::collections::VecDeque<tokio::task::JoinHandle<()>>,
}

impl Drop for Awaiting<'_> {
    fn drop(&mut self) {
        if !self.writes.is_empty() {
            lock(&self.operation.0.pending).extend(self.writes.drain(..));
        }
    }
}

/// A step being run, with what it needs across its awaits.
#[derive(Clone)]
struct Current {
    journal: Option<Arc<dyn Store>>,
    claim: Claim,
    fingerprint: Fingerprint,
    ttl: Duration,
    seq: u32,
    key: StepKey,
}

impl Current {
    /// The journal request for this step, named `name`.
    fn request<'a>(&'a self, name: &'a str) -> StepRequest<'a> {
        StepRequest {
            seq: self.seq,
            name,
            fingerprint: &self.fingerprint,
            ttl: self.ttl,
            adopt: false,
            settle: Duration::ZERO,
        }
    }
}

/// A step's derived key: the same for the same operation (scope and key),
/// step name and occurrence, in any attempt, process or takeover.
///
/// It is the lowercase hexadecimal SHA-256 (64 characters, printable
/// ASCII, valid as a Stripe `Idempotency-Key` and as an idem key) of
///
/// ```text
/// idem-step-v1|<len(scope)>:<scope>|<len(key)>:<key>|<len(name)>:<name>|<occurrence>
/// ```
///
/// where lengths are in bytes and written in decimal, `scope` is the
/// operation's scope as stored (`Scope::as_str`: the operation, then
/// a line feed and the principal when there is one), and `occurrence`
/// counts earlier steps of the same name in the operation, from 0. A
/// service receiving the key can recompute it from the same parts, as
/// `printf 'idem-step-v1|12:payments.pay|8:order-17|6:charge|0' | sha256sum`
/// does here:
///
/// ```
/// use idem::steps::StepKey;
/// use idem::{Key, Scope};
///
/// let key = StepKey::derive(&Scope::new("payments.pay"), &Key::new("order-17")?, "charge", 0);
/// assert_eq!(
///     key.as_str(),
///     "67e28a3313a858d6533f53be205f62cea52d576245d954e843a737dbab355184"
/// );
/// # Ok::<(), idem::KeyError>(())
/// ```
#[derive(Clone, PartialEq, Eq, Hash)]
pub struct StepKey(String);

impl StepKey {
    /// The key of the `occurrence`th step named `name` of the operation
    /// `(scope, key)`.
    pub fn derive(scope: &Scope, key: &Key, name: &str, occurrence: u32) -> StepKey {
        let mut hash = Sha256::new();
        hash.update(b"idem-step-v1");
        for part in [scope.as_str(), key.as_str(), name] {
            hash.update(format!("|{}:", part.len()).as_bytes());
            hash.update(part.as_bytes());
        }
        hash.update(format!("|{occurrence}").as_bytes());
        StepKey(Fingerprint::from_digest(hash.finalize().into()).to_hex())
    }

    /// The key's text.
    pub fn as_str(&self) -> &str {
        &self.0
    }
}

impl fmt::Display for StepKey {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(&self.0)
    }
}

impl fmt::Debug for StepKey {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "StepKey({})", self.0)
    }
}

impl AsRef<str> for StepKey {
    fn as_ref(&self) -> &str {
        &self.0
    }
}

impl AsKey for StepKey {
    fn to_key(&self) -> Result<Key, KeyError> {
        Key::new(self.0.as_str())
    }
}

/// What a step does when it finds itself in doubt (see the
/// [module documentation](self#steps-in-doubt)).
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub enum InDoubt {
    /// Run again, with the same derived key.
    #[default]
    Rerun,
    /// Ask the downstream with the step's reconcile function.
    Reconcile,
    /// Fail with [`Error::OutcomeUnknown`] until an operator resolves it.
    Refuse,
}

/// How a step's call failed, for [`Step::try_run`]: whether it may have
/// had its effect downstream.
///
/// `?` on a plain error in the call makes it [`Failed::InDoubt`], the
/// safe default (`From<E>`).
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Failed<E> {
    /// The call certainly had no effect: the downstream refused it before
    /// acting, or said so ("503: nothing was charged", a declined card, a
    /// validation error). The step's start is taken back: the next attempt
    /// runs it as one never started, without asking the downstream, and
    /// with no warning.
    Cleanly(E),
    /// The call may have had its effect (a timeout, a lost answer, an
    /// error the call cannot classify): the step is in doubt at the next
    /// attempt, which follows the step's policy, as after an error from
    /// [`Step::run`].
    InDoubt(E),
}

impl<E> Failed<E> {
    /// The error, whichever way the call failed.
    pub fn into_inner(self) -> E {
        match self {
            Failed::Cleanly(e) | Failed::InDoubt(e) => e,
        }
    }
}

impl<E> From<E> for Failed<E> {
    fn from(e: E) -> Self {
        Failed::InDoubt(e)
    }
}

/// A step with its in-doubt policy; [`step`] is `Step::new(name).run(f)`.
///
/// ```
/// use idem::steps::{Step, StepKey};
///
/// # async fn gateway_charge(key: &str) -> Result<u64, idem::Error> { Ok(1) }
/// # async fn gateway_lookup(key: &str) -> Result<Option<u64>, idem::Error> { Ok(None) }
/// # async fn body() -> Result<u64, idem::Error> {
/// let charge = Step::new("charge")
///     .reconcile(|key: StepKey| async move { gateway_lookup(key.as_str()).await })
///     .run(|key| async move { gateway_charge(key.as_str()).await })
///     .await?;
/// # Ok(charge)
/// # }
/// ```
#[must_use = "a step does nothing until it is run"]
pub struct Step<R = NoReconcile> {
    name: &'static str,
    in_doubt: InDoubt,
    reconcile: R,
    /// How long an earlier attempt's call may still land
    /// ([`Step::settle`]); `None`: the policy's default.
    settle: Option<Duration>,
}

/// The reconcile function of a [`Step`] that has none.
#[derive(Clone, Copy, Debug, Default)]
pub struct NoReconcile;

/// A function that asks the downstream, by the step's key, what became of
/// an in-doubt step: `Some(output)` if its effect happened, `None` if it
/// did not. Implemented by closures `FnOnce(StepKey) -> impl Future<Output
/// = Result<Option<T>, E>>`.
pub trait Reconcile<T, E> {
    /// Asks.
    fn ask(self, key: StepKey) -> impl Future<Output = Result<Option<T>, E>>;
}

impl<T, E> Reconcile<T, E> for NoReconcile {
    async fn ask(self, _: StepKey) -> Result<Option<T>, E> {
        Ok(None)
    }
}

impl<T, E, F, Fut> Reconcile<T, E> for F
where
    F: FnOnce(StepKey) -> Fut,
    Fut: Future<Output = Result<Option<T>, E>>,
{
    fn ask(self, key: StepKey) -> impl Future<Output = Result<Option<T>, E>> {
        self(key)
    }
}

impl Step {
    /// The step `name`, rerun when in doubt. A name is 1 to 64 ASCII
    /// letters, digits, `_`, `-`, `.` and `:`.
    pub fn new(name: &'static str) -> Self {
        Step {
            name,
            in_doubt: InDoubt::Rerun,
            reconcile: NoReconcile,
            settle: None,
        }
    }

    /// In doubt, ask the downstream with `ask` (see [`Reconcile`]).
    pub fn reconcile<F>(self, ask: F) -> Step<F> {
        Step {
            name: self.name,
            in_doubt: InDoubt::Reconcile,
            reconcile: ask,
            settle: self.settle,
        }
    }

    /// In doubt, fail with [`Error::OutcomeUnknown`] until an operator
    /// resolves the step.
    pub fn refuse(self) -> Self {
        Step {
            in_doubt: InDoubt::Refuse,
            ..self
        }
    }
}

impl<R> Step<R> {
    /// The step's policy when in doubt.
    pub fn in_doubt(&self) -> InDoubt {
        self.in_doubt
    }

    /// How long after the step's call starts the downstream may still
    /// perform it: the call's own timeout, or the downstream's settle
    /// window, after which a call that has not landed never will.
    ///
    /// An attempt that ends before its call answered (its caller dropped
    /// it, or the call returned an error such as a timeout) leaves the
    /// call in flight: it may still land after the next attempt has
    /// begun. So a step in doubt is neither reconciled nor run again until
    /// this long after the earlier attempt started it; until then the
    /// next attempt fails with [`Error::InProgress`] (HTTP 409), whose
    /// `retry_after` says when the window closes, by the store's clock.
    ///
    /// - `reconcile`: by default the operation's lease: an absent answer
    ///   is not taken as "nothing happened" sooner. Set it to what your
    ///   client's timeout guarantees.
    /// - `rerun`: by default none (a downstream that dedupes by key
    ///   performs the call once however many arrive); set it for one that
    ///   answers a concurrent duplicate with an error.
    /// - `refuse`: not used: a step in doubt is refused at once.
    pub fn settle(mut self, window: Duration) -> Self {
        self.settle = Some(window);
        self
    }

    /// Runs the step: replays its journaled output if it completed in an
    /// earlier attempt, or calls `f` with its derived key and journals
    /// the `Ok` output. An error from `f` is returned and journals
    /// nothing: the step is then in doubt at the next attempt.
    pub async fn run<T, E, F, Fut>(self, f: F) -> Result<T, E>
    where
        T: Serialize + DeserializeOwned,
        E: From<Error>,
        F: FnOnce(StepKey) -> Fut,
        Fut: Future<Output = Result<T, E>>,
        R: Reconcile<T, E>,
    {
        self.try_run(|key| async move { f(key).await.map_err(Failed::InDoubt) })
            .await
    }

    /// Runs the step as [`run`](Step::run) does, with a call that tells a
    /// clean failure from one in doubt ([`Failed`]). After
    /// [`Failed::Cleanly`] the step's journal entry is taken back when
    /// the body ends (when this attempt started it afresh, or after an
    /// operator's or a reconciliation's "it did not happen"): the next
    /// attempt runs the step as one never started, without reconciling,
    /// refusing or warning. Not when another step begins after it in the
    /// body (a fallback, the same step called again): that step may have
    /// its effect, and a next attempt that ran this one afresh could take
    /// another path, so this one stays in doubt. [`Failed::InDoubt`]
    /// leaves the step in doubt, as an error from `run` does.
    ///
    /// ```
    /// use idem::steps::{Failed, Step};
    ///
    /// # #[derive(Debug)] enum GatewayError { Unavailable, Timeout }
    /// # #[derive(Debug)] enum PayError { Gateway(GatewayError), Idem(idem::Error) }
    /// # impl From<idem::Error> for PayError { fn from(e: idem::Error) -> Self { PayError::Idem(e) } }
    /// # async fn gateway_charge(key: &str) -> Result<u64, GatewayError> { Ok(1) }
    /// # async fn body() -> Result<u64, PayError> {
    /// let charge = Step::new("charge")
    ///     .refuse()
    ///     .try_run(|key| async move {
    ///         gateway_charge(key.as_str()).await.map_err(|e| match e {
    ///             // "503, nothing was charged": the next attempt charges.
    ///             GatewayError::Unavailable => Failed::Cleanly(PayError::Gateway(e)),
    ///             // It may have charged: the step is in doubt.
    ///             GatewayError::Timeout => Failed::InDoubt(PayError::Gateway(e)),
    ///         })
    ///     })
    ///     .await?;
    /// # Ok(charge)
    /// # }
    /// ```
    ///
    /// Take the start back only for a failure the downstream guarantees
    /// had no effect: a step that refuses or reconciles when in doubt is
    /// then run again without asking.
    pub async fn try_run<T, E, F, Fut>(self, f: F) -> Result<T, E>
    where
        T: Serialize + DeserializeOwned,
        E: From<Error>,
        F: FnOnce(StepKey) -> Fut,
        Fut: Future<Output = Result<T, Failed<E>>>,
        R: Reconcile<T, E>,
    {
        let name = self.name;
        let (journal, current, fresh) = match self.start(true, &mut ThroughStore).await? {
            Started::Done(output) => return Ok(output),
            Started::Run(current, fresh) => (current.journal.clone(), current, fresh),
            Started::Beside { current, journal } => {
                // On a task of its own, so that a caller dropped during the
                // call does not cut the write off half way.
                let (sent, started) = tokio::sync::oneshot::channel();
                let marker = {
                    let (journal, current) = (journal.clone(), (*current).clone());
                    async move {
                        let _ = sent
                            .send(begin(&*journal, &current.claim, &current.request(name)).await);
                    }
                };
                behind(marker).await;
                let output = f(current.key.clone()).await;
                let started = started.await.unwrap_or_else(|_| {
                    Err(Error::store("the step's journal write was cancelled"))
                });
                match started {
                    Ok(StepBegin::Run(run)) => {
                        if let Err(Failed::Cleanly(_)) = output {
                            let fresh = matches!(run, StepRun::Fresh | StepRun::Allowed);
                            take_back_later(&current, name, fresh);
                        }
                    }
                    // The store failed: once the call ran, its output is
                    // still used and journaled (as a completed entry).
                    Err(Error::Store(err)) if output.is_ok() => {
                        tracing::warn!(error = %err, step = name, "starting a step's entry failed");
                    }
                    Err(err) => return Err(err.into()),
                    Ok(other) => return Err(changed(name, &other).into()),
                }
                let output = output.map_err(Failed::into_inner)?;
                let bytes = idem_core::canonical::to_vec(&output).map_err(Error::from)?;
                counted(name, "ran", &current);
                // Rerun when in doubt: its output is journaled while the
                // body goes on, and before the operation ends.
                journal_behind(journal, current, name, bytes).await;
                return Ok(output);
            }
        };
        let output = match f(current.key.clone()).await {
            Ok(output) => output,
            Err(Failed::Cleanly(err)) => {
                if journal.is_some() {
                    take_back_later(&current, name, fresh);
                }
                return Err(err);
            }
            Err(Failed::InDoubt(err)) => return Err(err),
        };
        if let Some(journal) = journal {
            let bytes = idem_core::canonical::to_vec(&output).map_err(Error::from)?;
            journal_output(&*journal, &current, &current.request(name), &bytes).await?;
            counted(name, "ran", &current);
        }
        Ok(output)
    }

    /// Runs the step as [`run`](Step::run) does, as an atomic phase: `f`
    /// writes its rows on `conn`, your open transaction, and hands it back
    /// with its result; the step's journal entry is written there too, so
    /// that the rows and the entry commit together when you commit, right
    /// after.
    ///
    /// The step's start is written through the store and committed at
    /// once, before `f` runs: until your commit the step is in doubt for
    /// another attempt, which follows the step's policy (rerun by default,
    /// its rows rolled back with the entry).
    ///
    /// Except on SQLite once your transaction read, wrote or began
    /// `IMMEDIATE`: the store's write would wait for your write lock, or
    /// its commit would leave your transaction's snapshot stale, and your
    /// next write would fail. A step that reruns when in doubt then writes
    /// its start on `conn` (it commits or rolls back with your rows, and a
    /// phase whose transaction never committed runs again), and a step
    /// that refuses or reconciles, whose start must be kept whatever your
    /// transaction does, fails at once with [`Error::Config`]: call it
    /// first in your transaction (a deferred `BEGIN`, nothing read yet).
    ///
    /// Storing the entry fails (and the error is returned) when the
    /// operation's claim was lost: roll the transaction back.
    pub async fn in_transaction<'c, S, C, T, E, F, Fut>(
        self,
        store: &S,
        conn: &'c mut C,
        f: F,
    ) -> Result<T, E>
    where
        S: TransactionalStore<C> + ?Sized,
        C: Send + ?Sized,
        T: Serialize + DeserializeOwned,
        E: From<Error>,
        F: FnOnce(&'c mut C, StepKey) -> Fut,
        Fut: Future<Output = (Result<T, E>, &'c mut C)>,
        R: Reconcile<T, E>,
    {
        let name = self.name;
        // The entry is started before the call: through the store, unless
        // the caller's transaction holds a lock the store would wait for,
        // or a snapshot its commit would break (SQLite, once the
        // transaction read or wrote); then on `conn`, where it commits or rolls
        // back with the phase's rows. A step that refuses or reconciles
        // needs its start kept whatever the transaction does: it cannot
        // be written there.
        let on_conn = store.journals_on(&mut *conn).await?;
        if on_conn && self.in_doubt != InDoubt::Rerun {
            return Err(Error::Config(format!(
                "step {name:?} refuses or reconciles when in doubt, so its start must be kept \
                 whatever becomes of your transaction; but your transaction already read or \
                 wrote (SQLite: the start would wait for its write lock, or leave its snapshot \
                 stale): call the step first in your transaction (a deferred BEGIN, nothing \
                 read yet), or let it rerun when in doubt"
            ))
            .into());
        }
        let mut on = OnConnection {
            store,
            conn: &mut *conn,
            on_conn,
        };
        let current = match self.start(false, &mut on).await? {
            Started::Done(output) => return Ok(output),
            Started::Run(current, _) => current,
            // Not asked for (`start(false)`); started as any other.
            Started::Beside { current, journal } => {
                match on
                    .begin(&*journal, &current.claim, &current.request(name))
                    .await?
                {
                    StepBegin::Run(_) => current,
                    other => return Err(changed(name, &other).into()),
                }
            }
        };
        let (result, conn) = f(conn, current.key.clone()).await;
        let output = result?;
        if current.journal.is_some() {
            let bytes = idem_core::canonical::to_vec(&output).map_err(Error::from)?;
            store
                .complete_step_on(conn, &current.claim, &current.request(name), &bytes)
                .await?;
            counted(name, "ran", &current);
        }
        Ok(output)
    }

    /// Everything before the step's own call: its place, its journal
    /// entry, and what to do when it is in doubt.
    async fn start<T, E, J: StartOn>(self, beside: bool, on: &mut J) -> Result<Started<T>, E>
    where
        T: Serialize + DeserializeOwned,
        E: From<Error>,
        R: Reconcile<T, E>,
    {
        let Step {
            name,
            in_doubt: policy,
            reconcile,
            settle,
        } = self;
        let current = current(name)?;
        let Some(journal) = current.journal.clone() else {
            // Transactional mode: nothing outlives the caller's
            // transaction to journal in.
            if policy != InDoubt::Rerun {
                return Err(Error::Config(format!(
                    "step {name:?} asks to {} when in doubt, which needs a journal that outlives \
                     the attempt: run the operation in record or entity mode (not transactional), \
                     on a store that has a background handle (`Detach`)",
                    if policy == InDoubt::Refuse {
                        "refuse"
                    } else {
                        "reconcile"
                    }
                ))
                .into());
            }
            return Ok(Started::Run(Box::new(current), false));
        };
        if beside
            && policy == InDoubt::Rerun
            && journal.journal().is_some_and(|j| j.writes_beside())
            && unjournaled(&*journal, &current).await?
        {
            // Met for the first time, and rerun if in doubt: its entry is
            // written while its call runs, off the call's path.
            return Ok(Started::Beside {
                current: Box::new(current),
                journal,
            });
        }
        let mut request = current.request(name);
        request.adopt = policy == InDoubt::Rerun;
        request.settle = match policy {
            InDoubt::Rerun => settle.unwrap_or(Duration::ZERO),
            InDoubt::Reconcile => settle.unwrap_or(current.claim.lease),
            InDoubt::Refuse => Duration::ZERO,
        };
        let run = match on.begin(&*journal, &current.claim, &request).await? {
            StepBegin::Run(run) => run,
            StepBegin::Replay(bytes) => {
                counted(name, "replayed", &current);
                return Ok(Started::Done(decode(&bytes)?));
            }
            StepBegin::KeyReused => return Err(Error::KeyReused.into()),
            StepBegin::Mismatch { journaled } => {
                return Err(Error::StepMismatch {
                    seq: current.seq,
                    journaled,
                    called: name.to_owned(),
                }
                .into())
            }
            StepBegin::InFlight { retry_after } => {
                tracing::info!(
                    step = name,
                    seq = current.seq,
                    step_key = %current.key,
                    ?retry_after,
                    "step in doubt, and an earlier attempt's call may still land: try again later"
                );
                in_doubt(&current.claim.scope, name, "in_flight");
                return Err(Error::InProgress { retry_after }.into());
            }
            StepBegin::InDoubt { since } if policy == InDoubt::Refuse => {
                tracing::error!(
                    step = name,
                    seq = current.seq,
                    step_key = %current.key,
                    started_at = since,
                    "step in doubt: an earlier attempt started it and journaled no outcome; \
                     refusing until an operator resolves it"
                );
                in_doubt(&current.claim.scope, name, "refused");
                return Err(Error::OutcomeUnknown {
                    step: name.to_owned(),
                    seq: current.seq,
                    step_key: current.key.0,
                }
                .into());
            }
            StepBegin::InDoubt { .. } => {
                tracing::warn!(
                    step = name,
                    seq = current.seq,
                    step_key = %current.key,
                    "step in doubt: asking the downstream what happened"
                );
                if let Some(output) = reconcile.ask(current.key.clone()).await? {
                    let bytes = idem_core::canonical::to_vec(&output).map_err(Error::from)?;
                    on.complete(&*journal, &current, &request, &bytes).await?;
                    in_doubt(&current.claim.scope, name, "reconciled");
                    return Ok(Started::Done(output));
                }
                request.adopt = true;
                match on.begin(&*journal, &current.claim, &request).await? {
                    StepBegin::Run(_) => {
                        in_doubt(&current.claim.scope, name, "reconciled_none");
                        StepRun::Fresh
                    }
                    StepBegin::Replay(bytes) => return Ok(Started::Done(decode(&bytes)?)),
                    other => return Err(changed(name, &other).into()),
                }
            }
        };
        // Whether nothing of an earlier attempt's call can be pending under
        // the step's key: a clean failure of this attempt's call may then
        // take the start back.
        let fresh = matches!(run, StepRun::Fresh | StepRun::Allowed);
        match run {
            StepRun::Adopted => {
                tracing::warn!(
                    step = name,
                    seq = current.seq,
                    step_key = %current.key,
                    "step in doubt: running it again with the same key"
                );
                in_doubt(&current.claim.scope, name, "rerun");
            }
            StepRun::Allowed => in_doubt(&current.claim.scope, name, "allowed"),
            StepRun::Fresh | StepRun::Again => {}
        }
        Ok(Started::Run(Box::new(current), fresh))
    }
}

/// Where the journal writes before a step's own call go.
trait StartOn {
    /// Begins the step.
    async fn begin(
        &mut self,
        journal: &dyn Store,
        claim: &Claim,
        request: &StepRequest<'_>,
    ) -> Result<StepBegin, Error>;
    /// Journals the output a reconciliation found.
    async fn complete(
        &mut self,
        journal: &dyn Store,
        current: &Current,
        request: &StepRequest<'_>,
        bytes: &[u8],
    ) -> Result<(), Error>;
}

/// Through the store's own connections.
struct ThroughStore;

impl StartOn for ThroughStore {
    async fn begin(
        &mut self,
        journal: &dyn Store,
        claim: &Claim,
        request: &StepRequest<'_>,
    ) -> Result<StepBegin, Error> {
        begin(journal, claim, request).await
    }
    async fn complete(
        &mut self,
        journal: &dyn Store,
        current: &Current,
        request: &StepRequest<'_>,
        bytes: &[u8],
    ) -> Result<(), Error> {
        journal_output(journal, current, request, bytes).await
    }
}

/// On the caller's connection where the store says so
/// ([`TransactionalStore::journals_on`]); through the store otherwise.
struct OnConnection<'a, S: ?Sized, C: ?Sized> {
    store: &'a S,
    conn: &'a mut C,
    /// Whether the journal writes go on the connection.
    on_conn: bool,
}

impl<S, C> StartOn for OnConnection<'_, S, C>
where
    S: TransactionalStore<C> + ?Sized,
    C: Send + ?Sized,
{
    async fn begin(
        &mut self,
        journal: &dyn Store,
        claim: &Claim,
        request: &StepRequest<'_>,
    ) -> Result<StepBegin, Error> {
        if self.on_conn {
            // No retry here: a failed statement may have aborted the
            // caller's transaction, which is the caller's to roll back.
            return self.store.begin_step_on(self.conn, claim, request).await;
        }
        begin(journal, claim, request).await
    }
    async fn complete(
        &mut self,
        journal: &dyn Store,
        current: &Current,
        request: &StepRequest<'_>,
        bytes: &[u8],
    ) -> Result<(), Error> {
        if self.on_conn {
            return self
                .store
                .complete_step_on(self.conn, &current.claim, request, bytes)
                .await;
        }
        journal_output(journal, current, request, bytes).await
    }
}

/// The journal answered a step otherwise than its own earlier answer
/// allows: another writer changed it meanwhile (an operator's resolution).
fn changed(name: &str, answer: &StepBegin) -> Error {
    Error::store(format!(
        "step {name:?}: its journal entry changed while the step ran ({answer:?})"
    ))
}

/// Where a step stands before its own call.
enum Started<T> {
    /// Its output is known (journaled, or reconciled).
    Done(T),
    /// It has no entry, and is rerun when in doubt: run it while its
    /// entry is started, then journal its output.
    Beside {
        current: Box<Current>,
        journal: Arc<dyn Store>,
    },
    /// Run it, then journal its output (when there is a journal); `true`
    /// when no earlier attempt's call may be pending under its key (it
    /// was never started, or was settled as not having happened), so
    /// that a clean failure takes its start back.
    Run(Box<Current>, bool),
}

/// `body`, then the journal writes its steps left on their way.
async fn flushed<F: Future>(body: F) -> F::Output {
    let output = body.await;
    flush_journal().await;
    take_back().await;
    output
}

/// What an outbox message's id and retention derive from in the
/// operation this task's body runs under; `None` outside an operation.
#[cfg(feature = "_sql")]
pub(crate) fn next_message() -> Option<MessageSlot> {
    OPERATION
        .try_with(|operation| {
            let state = &*operation.0;
            MessageSlot {
                scope: state.steps.scope.clone(),
                claim: state.claim.clone(),
                fingerprint: state.steps.fingerprint,
                ttl: state.steps.ttl,
            }
        })
        .ok()
}

/// Entity mode: from now on, the outbox messages of the operation this
/// task's body runs under are held ([`hold_message`]) until the entity's
/// transaction writes them ([`held_messages`]).
#[cfg(feature = "_sql")]
pub(crate) fn hold_messages() {
    let _ = OPERATION.try_with(|operation| {
        lock(&operation.0.messages)
            .held
            .get_or_insert_with(Vec::new);
    });
}

/// Holds `message` for the entity's transaction; hands it back when the
/// operation does not hold messages (not in entity mode, or outside one).
#[cfg(feature = "_sql")]
pub(crate) fn hold_message(
    message: Box<dyn std::any::Any + Send + Sync>,
) -> Result<(), Box<dyn std::any::Any + Send + Sync>> {
    let mut message = Some(message);
    let _ = OPERATION.try_with(|operation| {
        if let Some(held) = lock(&operation.0.messages).held.as_mut() {
            held.extend(message.take());
        }
    });
    match message {
        None => Ok(()),
        Some(message) => Err(message),
    }
}

/// The messages held for the entity's transaction, in order.
#[cfg(feature = "_sql")]
pub(crate) fn held_messages() -> Vec<Box<dyn std::any::Any + Send + Sync>> {
    OPERATION
        .try_with(|operation| {
            lock(&operation.0.messages)
                .held
                .as_mut()
                .map(std::mem::take)
                .unwrap_or_default()
        })
        .unwrap_or_default()
}

/// The claim of the operation this task's body runs under, if any.
#[cfg(feature = "_sql")]
pub(crate) fn running_claim() -> Option<Claim> {
    OPERATION
        .try_with(|operation| operation.0.claim.clone())
        .ok()
}

/// Waits for the journal writes of the operation this task's body runs
/// under: what [`flushed`] does after the body, for a body that completes
/// its own claim.
pub(crate) async fn flush_journal() {
    // Most bodies take no step: they clone nothing and wait for nothing.
    let writing = OPERATION
        .try_with(|operation| operation.writing().then(|| operation.clone()))
        .ok()
        .flatten();
    if let Some(operation) = writing {
        operation.flush().await;
    }
}

/// Journals a step's output on a task of its own, awaited before the
/// operation ends ([`flushed`]). Should the process die first, the step is
/// in doubt for the next attempt and runs again with the same key, as a
/// step that is rerun when in doubt may.
async fn journal_behind(
    journal: Arc<dyn Store>,
    current: Box<Current>,
    name: &'static str,
    bytes: Vec<u8>,
) {
    behind(async move {
        let request = current.request(name);
        if let Err(err) = journal_output(&*journal, &current, &request, &bytes).await {
            tracing::warn!(
                error = %err,
                step = name,
                step_key = %current.key,
                "journaling a step's output failed: the step will be in doubt at the next attempt"
            );
        }
    })
    .await;
}

/// Marks the start of a step whose call failed cleanly to be taken back
/// when the body ends ([`take_back`]), when no earlier attempt's call may
/// be pending under its key (`fresh`). Otherwise the step stays in doubt
/// for the next attempt, which is safe.
fn take_back_later(current: &Current, name: &'static str, fresh: bool) {
    if !fresh {
        tracing::debug!(
            step = name,
            step_key = %current.key,
            "the step's call failed cleanly, but an earlier attempt's call under its key \
             may have landed: the step stays in doubt"
        );
        return;
    }
    let _ = OPERATION.try_with(|operation| {
        lock(&operation.0.progress).take_back = Some((current.clone(), name));
    });
}

/// Takes back the start of the body's last step, when its call failed
/// cleanly and no step began after it: the next attempt runs it as never
/// started. Not sooner: a body that goes on past the failure (to a
/// fallback) may have effects in later steps, and a next attempt that ran
/// the failed step afresh could take another path than this one. Should
/// the store fail, or the body be dropped first, the step stays in doubt.
async fn take_back() {
    let Ok(Some((current, name))) =
        OPERATION.try_with(|operation| lock(&operation.0.progress).take_back.take())
    else {
        return;
    };
    let Some(store) = current.journal.clone() else {
        return;
    };
    let Some(journal) = store.journal() else {
        return;
    };
    match journal
        .undo_step(&current.claim, &current.request(name))
        .await
    {
        Ok(true) => counted(name, "failed_cleanly", &current),
        Ok(false) => tracing::debug!(
            step = name,
            step_key = %current.key,
            "a cleanly failed step's start was not taken back (the store keeps it, or a \
             later attempt took it over): it stays in doubt"
        ),
        Err(err) => tracing::info!(
            error = %err,
            step = name,
            step_key = %current.key,
            "taking back a cleanly failed step's start failed: it will be in doubt at the next \
             attempt"
        ),
    }
}

/// Runs a journal write on a task of its own, which the operation awaits
/// before it ends and a dropped caller's claim waits for before it is
/// handed back; outside an operation, here.
async fn behind(write: impl Future<Output = ()> + Send + 'static) {
    match OPERATION.try_with(Operation::clone) {
        Ok(operation) => operation.push(tokio::spawn(write)),
        Err(_) => write.await,
    }
}

/// Whether the step's place held no journal entry when this attempt first
/// looked (the journal is read once per attempt, at its first step).
async fn unjournaled(journal: &dyn Store, current: &Current) -> Result<bool, Error> {
    let seq = current.seq;
    let known = OPERATION
        .try_with(|operation| {
            let progress = lock(&operation.0.progress);
            progress.journaled.as_ref().map(|seqs| !seqs.contains(&seq))
        })
        .ok()
        .flatten();
    if let Some(absent) = known {
        return Ok(absent);
    }
    let entries = journal_of(journal)?
        .steps(&current.claim.scope, &current.claim.key)
        .await?;
    let seqs: Vec<u32> = entries.iter().map(|entry| entry.seq).collect();
    let absent = !seqs.contains(&seq);
    let _ = OPERATION.try_with(|operation| {
        lock(&operation.0.progress).journaled.get_or_insert(seqs);
    });
    Ok(absent)
}

/// A journaled output.
fn decode<T: DeserializeOwned>(bytes: &[u8]) -> Result<T, Error> {
    Ok(serde_json::from_slice(bytes)?)
}

/// The operation's next step, named `name`.
fn current(name: &'static str) -> Result<Current, Error> {
    check_name(name)?;
    OPERATION
        .try_with(|operation| operation.next_step(name))
        .map_err(|_| {
            Error::Config(format!(
                "step {:?} was called outside an idempotent operation (or from a task the \
                     operation spawned): steps run inside the body of #[idempotent] or run()",
                name
            ))
        })
}

fn counted(name: &'static str, decision: &'static str, current: &Current) {
    tracing::debug!(step = name, seq = current.seq, decision, "step");
    metrics::counter!(
        STEPS,
        "operation" => current.claim.scope.metric_label().to_owned(),
        "step" => name,
        "decision" => decision
    )
    .increment(1);
}

/// Runs `f` as the operation's step `name`, rerun with the same key when in
/// doubt: `Step::new(name).run(f)`. See the [module documentation](self).
pub async fn step<T, E, F, Fut>(name: &'static str, f: F) -> Result<T, E>
where
    T: Serialize + DeserializeOwned,
    E: From<Error>,
    F: FnOnce(StepKey) -> Fut,
    Fut: Future<Output = Result<T, E>>,
{
    Step::new(name).run(f).await
}

/// Settles step `seq` (named `name`) of the operation `(scope, key)`,
/// started and without an outcome: with the `output` its effect had
/// (replayed by the next attempt), or `None` to let the next attempt run
/// it again with the same key. Returns whether there was such a step;
/// [`Journal::steps`](crate::store::Journal::steps) lists an operation's journal.
///
/// Only a step in doubt is settled: one whose starting attempt no longer
/// holds the operation (the attempt is gone, its lease lapsed, or another
/// took over). While it holds it, the step is running, and this returns
/// `false`; so a resolution sent again, or a second operator's, never
/// lands on the step a later attempt is running after the first one.
pub async fn resolve<S, T>(
    store: &S,
    scope: &Scope,
    key: &Key,
    seq: u32,
    name: &str,
    output: Option<&T>,
) -> Result<bool, Error>
where
    S: Store + ?Sized,
    T: Serialize,
{
    let (resolution, label) = match output {
        Some(output) => (
            StepResolution::Completed(idem_core::canonical::to_vec(output)?),
            "operator_completed",
        ),
        None => (StepResolution::Rerun, "operator_rerun"),
    };
    let resolved = journal_of(store)?
        .resolve_step(scope, key, seq, name, &resolution)
        .await?;
    if resolved {
        tracing::info!(%scope, %key, seq, step = name, resolution = label, "step resolved by an operator");
        in_doubt(scope, name.to_owned(), label);
    }
    Ok(resolved)
}

/// Counts a step in doubt of `scope`'s operation, by `resolution`.
fn in_doubt(scope: &Scope, step: impl Into<metrics::SharedString>, resolution: &'static str) {
    metrics::counter!(
        STEPS_IN_DOUBT,
        "operation" => scope.metric_label().to_owned(),
        "step" => step.into(),
        "resolution" => resolution
    )
    .increment(1);
}

/// Checks a step's name.
fn check_name(name: &str) -> Result<(), Error> {
    let valid = !name.is_empty()
        && name.len() <= MAX_STEP_NAME_LEN
        && name
            .bytes()
            .all(|b| b.is_ascii_alphanumeric() || matches!(b, b'_' | b'-' | b'.' | b':'));
    if valid {
        Ok(())
    } else {
        Err(Error::Config(format!(
            "invalid step name {name:?}: 1 to {MAX_STEP_NAME_LEN} ASCII letters, digits, '_', \
             '-', '.' or ':'"
        )))
    }
}

/// Begins a step, sending the request again when its answer was lost
/// (the store recognizes the attempt's own entry).
async fn begin(
    journal: &dyn Store,
    claim: &Claim,
    request: &StepRequest<'_>,
) -> Result<StepBegin, Error> {
    let mut attempt = 1;
    loop {
        match journal_of(journal)?.begin_step(claim, request).await {
            Err(Error::Store(err)) if attempt < JOURNAL_ATTEMPTS => {
                tracing::warn!(error = %err, step = request.name, "beginning a step failed; trying again");
                tokio::time::sleep(Duration::from_millis(10 * u64::from(attempt))).await;
                attempt += 1;
            }
            other => return other,
        }
    }
}

/// Journals a step's output. The step ran, so its effect happened: when
/// the store keeps failing, the output is returned all the same, and the
/// step will be in doubt at the next attempt; an attempt that lost its
/// claim is told so ([`Error::LeaseLost`]).
async fn journal_output(
    journal: &dyn Store,
    current: &Current,
    request: &StepRequest<'_>,
    bytes: &[u8],
) -> Result<(), Error> {
    let mut attempt = 1;
    loop {
        match journal_of(journal)?
            .complete_step(&current.claim, request, bytes)
            .await
        {
            Ok(()) => return Ok(()),
            Err(Error::Store(err)) if attempt < JOURNAL_ATTEMPTS => {
                tracing::warn!(error = %err, step = request.name, "journaling a step failed; trying again");
                tokio::time::sleep(Duration::from_millis(10 * u64::from(attempt))).await;
                attempt += 1;
            }
            Err(Error::Store(err)) => {
                tracing::error!(
                    error = %err,
                    step = request.name,
                    step_key = %current.key,
                    "journaling a step failed: its output is used, and the step will be in doubt \
                     at the next attempt"
                );
                return Ok(());
            }
            Err(err) => return Err(err),
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn keys_are_stable_printable_and_distinct() {
        let (scope, key) = (Scope::new("payments.pay"), Key::new("order-17").unwrap());
        let charge = StepKey::derive(&scope, &key, "charge", 0);
        assert_eq!(charge, StepKey::derive(&scope, &key, "charge", 0));
        assert_eq!(charge.as_str().len(), 64);
        assert!(charge
            .as_str()
            .bytes()
            .all(|b| b.is_ascii_hexdigit() && !b.is_ascii_uppercase()));
        assert!(charge.to_key().is_ok());
        let others = [
            StepKey::derive(&scope, &key, "charge", 1),
            StepKey::derive(&scope, &key, "refund", 0),
            StepKey::derive(&scope, &Key::new("order-18").unwrap(), "charge", 0),
            StepKey::derive(&Scope::new("payments.refund"), &key, "charge", 0),
            // Lengths keep the parts apart.
            StepKey::derive(
                &Scope::new("payments.pa"),
                &Key::new("yorder-17").unwrap(),
                "charge",
                0,
            ),
        ];
        for other in others {
            assert_ne!(charge, other);
        }
    }

    /// The derivation as documented, recomputed by hand.
    #[test]
    fn keys_follow_the_documented_derivation() {
        let (scope, key) = (Scope::new("op"), Key::new("k1").unwrap());
        let text = "idem-step-v1|2:op|2:k1|6:charge|0";
        let expected: String = Sha256::digest(text.as_bytes())
            .iter()
            .map(|b| format!("{b:02x}"))
            .collect();
        assert_eq!(
            StepKey::derive(&scope, &key, "charge", 0).as_str(),
            expected
        );
    }

    #[test]
    fn names_are_checked() {
        for good in ["charge", "send-receipt", "phase.2:commit", "a"] {
            assert!(check_name(good).is_ok(), "{good}");
        }
        let long = "x".repeat(65);
        for bad in ["", "with space", "é", long.as_str()] {
            assert!(matches!(check_name(bad), Err(Error::Config(_))), "{bad}");
        }
    }

    #[tokio::test]
    async fn a_step_outside_an_operation_is_refused() {
        let result: Result<u32, Error> = step("charge", |_| async { Ok(1) }).await;
        assert!(matches!(result, Err(Error::Config(message)) if message.contains("outside")));
    }
}
