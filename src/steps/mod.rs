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
//! background handle ([`Detach`](crate::store::Detach)): on a store of your own that
//! keeps a journal and offers no such handle, steps are refused with
//! [`Error::Config`] (run unjournaled, a retry would run them again); on
//! one that keeps no journal, steps fail as not journaled. Steps must be
//! called from the operation's own task: a task spawned by the body does
//! not see the operation.
//!
//! [`Error::Config`]: crate::Error::Config
//! [`Error::InProgress`]: crate::Error::InProgress
//! [`Error::OutcomeUnknown`]: crate::Error::OutcomeUnknown
//! [`Error::StepMismatch`]: crate::Error::StepMismatch

// The rooms, from the ground up:
// - `step_key`: a step's name, and the key derived from it;
// - `builder`: the public `Step`, its policy when in doubt and its
//   options, and `Failed`;
// - `operation`: the task-local state of the operation a body runs under,
//   and the step being run (`Current`);
// - `messages`: what the outbox and entity mode read from that state;
// - `counters`: the steps' counters;
// - `journaling`: the journal writes around a step's call, and taking a
//   cleanly failed step's start back;
// - `start`: everything before a step's call, decided from the journal;
// - `running`: the step's call, beside or between its journal writes;
// - `resolve`: an operator's settlement of a step in doubt.
mod builder;
mod counters;
mod journaling;
#[cfg(feature = "_sql")]
mod messages;
mod operation;
mod resolve;
mod running;
mod start;
mod step_key;

pub use builder::{Failed, InDoubt, NoReconcile, Reconcile, Step};
pub use counters::{STEPS, STEPS_IN_DOUBT};
pub use resolve::resolve;
pub use running::step;
#[cfg(feature = "_sql")]
pub(crate) use step_key::hex_id;
pub use step_key::{StepKey, MAX_STEP_NAME_LEN};

pub(crate) use operation::{Operation, StepsAs};

// For the outbox and entity mode.
#[cfg(feature = "_sql")]
pub(crate) use messages::{held_messages, hold_message, hold_messages, next_message};
#[cfg(feature = "_sql")]
pub(crate) use operation::flush_journal;
