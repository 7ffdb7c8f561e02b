//! Running a step: [`step`], and [`Step::run`], [`Step::try_run`] and
//! [`Step::in_transaction`]. A step met for the first time that is rerun
//! when in doubt runs its call while its entry is started, and its output
//! is journaled while the body goes on; otherwise the entry is written
//! before the call and the output right after it.

use std::future::Future;

use serde::de::DeserializeOwned;
use serde::Serialize;

use crate::store::TransactionalStore;
use idem_core::error::Error;
use idem_core::journal::{StepBegin, StepRun};

use super::builder::{Failed, InDoubt, Reconcile, Step};
use super::counters::counted;
use super::journaling::{begin, behind, journal_behind, journal_output, take_back_later};
use super::start::{changed, OnConnection, StartOn, Started, ThroughStore};
use super::step_key::StepKey;

/// Runs `f` as the operation's step `name`, rerun with the same key when in
/// doubt: `Step::new(name).run(f)`. See the [module documentation](super).
pub async fn step<T, E, F, Fut>(name: &'static str, f: F) -> Result<T, E>
where
    T: Serialize + DeserializeOwned,
    E: From<Error>,
    F: FnOnce(StepKey) -> Fut,
    Fut: Future<Output = Result<T, E>>,
{
    Step::new(name).run(f).await
}

impl<R> Step<R> {
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
                        let _ = sent.send(begin(&*journal, &current.request(name)).await);
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
                match on.begin(&*journal, &current.request(name)).await? {
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
                .complete_step_on(conn, &current.request(name), &bytes)
                .await?;
            counted(name, "ran", &current);
        }
        Ok(output)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[tokio::test]
    async fn a_step_outside_an_operation_is_refused() {
        let result: Result<u32, Error> = step("charge", |_| async { Ok(1) }).await;
        assert!(matches!(result, Err(Error::Config(message)) if message.contains("outside")));
    }
}
