//! The public face of a step: [`Step`], built with its name and its
//! policy when in doubt ([`InDoubt`]), an optional reconcile function
//! ([`Reconcile`]) and settle window; and [`Failed`], how its call failed.
//! Running it is in `running`.

use std::future::Future;
use std::time::Duration;

use super::step_key::StepKey;

/// What a step does when it finds itself in doubt (see the
/// [module documentation](super#steps-in-doubt)).
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub enum InDoubt {
    /// Run again, with the same derived key.
    #[default]
    Rerun,
    /// Ask the downstream with the step's reconcile function.
    Reconcile,
    /// Fail with [`Error::OutcomeUnknown`](crate::Error::OutcomeUnknown)
    /// until an operator resolves it.
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

/// A step with its in-doubt policy; [`step`](super::step) is `Step::new(name).run(f)`.
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
    pub(super) name: &'static str,
    pub(super) in_doubt: InDoubt,
    pub(super) reconcile: R,
    /// How long an earlier attempt's call may still land
    /// ([`Step::settle`]); `None`: the policy's default.
    pub(super) settle: Option<Duration>,
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

    /// In doubt, fail with
    /// [`Error::OutcomeUnknown`](crate::Error::OutcomeUnknown) until an
    /// operator resolves the step.
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
    /// next attempt fails with [`Error::InProgress`](crate::Error::InProgress)
    /// (HTTP 409), whose `retry_after` says when the window closes, by the
    /// store's clock.
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
}
