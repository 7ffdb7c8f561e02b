//! The flow behind `#[idempotent]`: find by key, or execute and save.
//!
//! Two entry points share the flow: [`run`] on the store's own connections,
//! and [`run_in_transaction`] on the caller's transaction. Each takes a
//! store, a [`Call`] (scope, key, fingerprint, policy, and which outcomes
//! are stored) and the operation's body, and:
//!
//! 1. asks the store to [`begin`](Store::begin) (one atomic claim);
//! 2. on a replay, decodes the stored outcome and returns it: the body is
//!    dropped without ever being polled;
//! 3. on a claim, runs the body; an `Ok` value is serialized and stored
//!    (fenced [`complete`](Store::complete)), an error is released so that a
//!    retry runs again, unless the call was built with
//!    [`replaying`](Call::replaying) and the error is replayable; a result
//!    to store that its codec cannot encode is answered to this caller as
//!    it is, and every later call gets [`Error::Unrecorded`] (the body
//!    ran: it is not run again);
//! 4. on a key reused with another payload: [`Error::KeyReused`];
//! 5. on a call in progress: waits for it (woken by the store when it can,
//!    polling with a capped backoff otherwise) up to the policy's bound,
//!    then [`Error::InProgress`]; or fails at once under `fail_fast`.
//!
//! ## Leases, tokens and time
//!
//! Every call draws a random [`ClaimToken`] before it claims. The claim
//! writes it with the record, and every later write of the call (renewing
//! the lease, storing the outcome, releasing the key) names it: whatever
//! happened in between (a takeover, a release, an expiry, a purge that let
//! the fence start again), nothing an earlier claim presents is accepted
//! against a later one. A claim or a completion whose answer was lost is
//! sent again with the same token and recognized as the caller's own.
//!
//! While the body runs, the lease is renewed every third of it, so a body
//! slower than its lease is never taken over while its process lives. A
//! crashed or stopped owner stops renewing and is taken over about one
//! lease after its last renewal. Leases and expiry are decided with the
//! database's clock; this process's clock only measures its own waiting.
//!
//! ## Outcomes that must not be lost
//!
//! Once the body has run, its effect has happened: the caller gets the
//! body's value, whatever happens to the record. Storing the outcome is
//! tried again (renewing the lease meanwhile) while the store fails. A
//! caller waits for that at most two seconds, whatever the store: then it
//! gets its value, and the storing goes on in the background until it
//! lands or another caller took the key over (only possible after an
//! outage longer than the lease). A duplicate arriving meanwhile waits,
//! then replays. A store of your own that cannot work in the background
//! (without [`Detach`](crate::store::Detach)) leaves the key claimed, no longer
//! renewed, once its caller has its value: after the lease a retry runs
//! the operation again (its durable steps replay what they journaled).
//!
//! ## Cancellation
//!
//! A caller may be dropped at any `.await` (a client went away, a timeout
//! fired, a task was aborted):
//!
//! - during the claim: the claim, if it landed, is handed back by its
//!   token, so nothing blocks a retry until the lease;
//! - while the body runs: the body cannot run any more (it is dropped with
//!   the caller), so the claim is handed back at once and the retry runs
//!   without waiting for the lease;
//! - after the body returned, while its outcome is stored: the outcome is
//!   stored in the background.
//!
//! Handing back and storing in the background run on a task of their own
//! ([`Detach`](crate::store::Detach) gives them the store), logged and counted as
//! `idem_abandoned_total{what}`. A re-run after a drop is safe for the
//! database's rows, not by itself for calls to other systems: pass the key
//! on to them. To let a body always run to completion, call the idempotent
//! function from a task of its own (`tokio::spawn`), which outlives the
//! caller.
//!
//! ## Transactional mode
//!
//! [`run_in_transaction`] writes the claim and the completion on the
//! caller's open transaction ([`TransactionalStore`]) and lends that
//! connection to the body, so the business rows and the record commit or
//! roll back together; the caller commits. A concurrent duplicate blocks on
//! the UNIQUE index until the first transaction ends, then replays (or runs,
//! if the first rolled back). A duplicate of a call in progress elsewhere
//! waits with plain reads and claims only once the key looks free; should
//! that claim find the key in progress after all, it fails at once with
//! [`Error::InProgress`] rather than wait while its transaction may hold a
//! lock the owner needs. A body error deletes the claim on the same
//! connection, so a transaction committed anyway does not leave the key in
//! progress; the body's own writes are the transaction's, kept if it
//! commits, so roll it back on an error (as dropping a sqlx `Transaction`
//! does when the error goes up with `?`). When storing the outcome fails,
//! the error is returned: the transaction is to be rolled back, and the
//! business rows with it. On a connection outside a transaction, where
//! every statement commits at once, the claim is seen by all as soon as
//! it is written, and is kept as in record mode: its lease renewed
//! through the store while the body runs, its outcome stored through the
//! store should the connection fail to.
//!
//! ## Outcome policies
//!
//! What is stored is the call's to say, in either mode. By default
//! ([`OkOnly`]) the `Ok` value is stored as JSON ([`Json`]) and errors are
//! released. [`Call::replaying`] stores the errors a predicate picks too,
//! and replays them like results ([`Replaying`]). [`Call::with_codec`]
//! stores the `Ok` value with any [`Codec`], for values that are not serde
//! types or whose JSON form would be wasteful (an HTTP response is stored as
//! framed raw bytes); it composes with `replaying`.
//!
//! ## A missing key
//!
//! A call whose key is missing (an `Option` key that is `None`) fails with
//! [`Error::MissingKey`] before anything runs, unless it was built with
//! [`Call::on_missing_key`]`(`[`MissingKey::Run`]`)`: the body then runs
//! without protection (see [`MissingKey`]).
//!
//! Every call runs in a `tracing` span named `idem` and emits one event per
//! decision; counters go through the `metrics` facade (see [`crate::metrics`]).

use std::convert::Infallible;
use std::fmt;
use std::future::Future;
use std::pin::Pin;
use std::sync::Arc;
use std::task::Poll;
use std::time::Duration;
use tokio::time::Instant;

use serde::de::DeserializeOwned;
use serde::Serialize;
use tracing::Instrument;

use crate::error::Error;
use crate::fingerprint::Fingerprint;
use crate::key::{AsKey, Key, Scope};
use crate::metrics;
use crate::policy::Policy;
use crate::record::{Begin, Claim, ClaimToken, Outcome, OutcomeKind};
use crate::steps::{Operation, StepsAs};
use crate::store::{BeginRequest, Store, TransactionalStore};

/// The longest pause between two looks at an in-progress key when the store
/// cannot wake waiters itself (another process completed it).
const MAX_POLL: Duration = Duration::from_millis(25);
/// The same while the store wakes waiters across processes (PostgreSQL's
/// `LISTEN`): the look only covers a notification that was lost.
const MAX_POLL_NOTIFIED: Duration = Duration::from_millis(500);
const FIRST_POLL: Duration = Duration::from_millis(1);
/// The shortest lease: it is renewed every third of it.
const MIN_LEASE: Duration = Duration::from_millis(30);

/// The longest lease or ttl: a hundred years, past which a deadline may
/// not be representable (an `Instant`, a database timestamp).
const MAX_SPAN: Duration = Duration::from_secs(100 * 365 * 86_400);
/// How often a claim whose answer was lost is sent again (same token).
const BEGIN_ATTEMPTS: u32 = 3;
/// A claim answered after more than a lease divided by this is renewed
/// before the body runs (see `claim_again`).
const LEASE_SPENT: u32 = 10;
/// How long a caller waits for its outcome to be stored while the store
/// fails, before it gets its value and the storing goes on in the
/// background.
const SAVE_IN_LINE: Duration = Duration::from_secs(2);
/// The longest pause between two attempts to store an outcome.
const MAX_SAVE_PAUSE: Duration = Duration::from_secs(1);

/// How many times the release of a claim whose answer never came is sent
/// again when it finds nothing (20 ms apart, then twice as far each time:
/// some 1.3 s in all).
const LATE_CLAIM_LOOKS: u32 = 6;
/// The shortest `Retry-After` hint given with [`Error::InProgress`] (the
/// hint is the lease the key's holder has left).
const MIN_RETRY_AFTER: Duration = Duration::from_millis(100);

/// One idempotent invocation: which operation, which key, which payload,
/// the [`Policy`], and which outcomes are stored (the outcome policy `O`).
/// Key and fingerprint errors are kept and returned by [`run`], so building
/// a `Call` never fails.
///
/// The outcome policy is part of the call:
///
/// - by default ([`OkOnly<Json>`](OkOnly)) the `Ok` value is stored as
///   JSON, and an error releases the key, so a retry runs the body again;
/// - [`replaying`](Call::replaying) also stores the errors a predicate
///   picks (permanent failures such as a declined card) and replays them
///   like results;
/// - [`with_codec`](Call::with_codec) stores the `Ok` value with another
///   [`Codec`] than JSON.
///
/// The two compose, in either order:
///
/// ```
/// use idem::{run, Call, MemoryStore};
/// use serde::{Deserialize, Serialize};
///
/// #[derive(Debug, PartialEq, Serialize, Deserialize)]
/// enum ChargeError { Declined, Unavailable, Idem(String) }
///
/// impl From<idem::Error> for ChargeError {
///     fn from(err: idem::Error) -> Self { ChargeError::Idem(err.to_string()) }
/// }
///
/// # #[tokio::main(flavor = "current_thread")]
/// # async fn main() {
/// let store = MemoryStore::new();
/// let charge = || {
///     Call::new("payments.charge", "k1", &500)
///         .replaying(|err: &ChargeError| *err == ChargeError::Declined)
/// };
/// let first: Result<u64, _> = run(&store, charge(), async { Err(ChargeError::Declined) }).await;
/// // The declined charge is replayed: the body does not run again.
/// let retry = run(&store, charge(), async { Ok(500) }).await;
/// assert_eq!(first, retry);
/// # }
/// ```
pub struct Call<O = OkOnly<Json>> {
    scope: Scope,
    key: Result<Key, Error>,
    fingerprint: Result<Fingerprint, Error>,
    policy: Policy,
    missing_key: MissingKey,
    outcomes: O,
    /// The largest outcome stored, in bytes ([`Call::max_outcome`]).
    max_outcome: usize,
    /// What the body's durable steps journal and derive their keys under,
    /// where it is not the claim's own (entity mode's claim is per table,
    /// for any payload, and kept one lease). On the heap: rare, and the
    /// call is moved (copied whole) as it is built and run.
    steps: Option<Box<StepsAs>>,
}

/// What a [`Call`] does when its key is missing: an `Option` key that is
/// `None` (the `missing_key = reject | run` option of `#[idempotent]`).
///
/// Only a missing key is concerned: an invalid key (empty, too long, not
/// visible ASCII) is always refused with [`Error::InvalidKey`].
///
/// ```
/// use idem::{run, Call, MemoryStore, MissingKey};
///
/// # #[tokio::main(flavor = "current_thread")]
/// # async fn main() {
/// let store = MemoryStore::new();
/// let key: Option<String> = None; // the client sent none
/// let refused: Result<u32, idem::Error> =
///     run(&store, Call::new("emails.send", &key, &"welcome"), async { Ok(1) }).await;
/// assert!(matches!(refused, Err(idem::Error::MissingKey)));
///
/// let call = Call::new("emails.send", &key, &"welcome").on_missing_key(MissingKey::Run);
/// let sent: Result<u32, idem::Error> = run(&store, call, async { Ok(1) }).await;
/// assert_eq!(sent.unwrap(), 1); // ran, and nothing was recorded
/// # }
/// ```
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq, Hash)]
pub enum MissingKey {
    /// Fail with [`Error::MissingKey`] without running the body. The
    /// default.
    #[default]
    Reject,
    /// Run the body without protection: nothing is claimed, recorded or
    /// replayed, so every retry without a key runs the body again, and
    /// concurrent duplicates all run. Choose it only where a client that
    /// sends no key accepts that (an optional key on an operation that was
    /// never protected before); prefer `Reject` where a duplicate costs
    /// money or data.
    Run,
}

impl Call {
    /// A call of `scope` with the client's `key`, fingerprinted by the
    /// canonical JSON of `payload`, under the default [`Policy`] and the
    /// default outcome policy.
    pub fn new<K, P>(scope: impl Into<Scope>, key: &K, payload: &P) -> Self
    where
        K: AsKey + ?Sized,
        P: Serialize + ?Sized,
    {
        Call::from_parts(
            scope.into(),
            key.to_key().map_err(Error::from),
            Fingerprint::of(payload),
            Policy::new(),
        )
    }

    /// A call from already computed parts (what `#[idempotent]` expands
    /// to), under the default outcome policy.
    pub fn from_parts(
        scope: Scope,
        key: Result<Key, Error>,
        fingerprint: Result<Fingerprint, Error>,
        policy: Policy,
    ) -> Self {
        Call {
            scope,
            key,
            fingerprint,
            policy,
            missing_key: MissingKey::Reject,
            outcomes: OkOnly(Json),
            max_outcome: Call::DEFAULT_MAX_OUTCOME,
            steps: None,
        }
    }

    /// The default [`max_outcome`](Call::max_outcome): 4 MiB, which every
    /// built-in store holds at its default configuration (MariaDB's and
    /// MySQL's `max_allowed_packet` of 16 MiB or more carries a completion,
    /// which names its outcome twice; Redis's `proto-max-bulk-len` is
    /// 512 MiB; PostgreSQL's and SQLite's values, 1 GB).
    pub const DEFAULT_MAX_OUTCOME: usize = 4 << 20;
}

impl<O> Call<O> {
    /// Replaces the policy.
    pub fn with_policy(mut self, policy: Policy) -> Self {
        self.policy = policy;
        self
    }

    /// Replaces the fingerprint with one computed elsewhere (for example
    /// over raw bytes with [`Fingerprint::of_bytes`]).
    pub fn with_fingerprint(mut self, fingerprint: Fingerprint) -> Self {
        self.fingerprint = Ok(fingerprint);
        self
    }

    /// What to do when the key is missing: refuse the call (the default),
    /// or run the body without protection. See [`MissingKey`]. Entity
    /// mode's `entity::run` always refuses a missing key: it finds rows by
    /// their key.
    pub fn on_missing_key(mut self, missing_key: MissingKey) -> Self {
        self.missing_key = missing_key;
        self
    }

    /// The largest outcome (the encoded `Ok` value or replayable error)
    /// stored, in bytes; [`DEFAULT_MAX_OUTCOME`](Call::DEFAULT_MAX_OUTCOME)
    /// unless set. It is checked before anything is sent to the store. A
    /// larger one is not stored: its caller gets the body's value as it
    /// is, and every later call with the key gets [`Error::Unrecorded`]
    /// (the body ran: it is not run again), as for a value its codec
    /// cannot encode. Raise it only as far as the store can hold.
    ///
    /// ```
    /// use idem::{run, Call, Error, MemoryStore};
    ///
    /// # #[tokio::main(flavor = "current_thread")]
    /// # async fn main() {
    /// let store = MemoryStore::new();
    /// let call = || Call::new("reports.export", "r-1", &()).max_outcome(1024);
    /// let report = run(&store, call(), async { Ok::<_, Error>("x".repeat(4096)) }).await;
    /// assert_eq!(report.unwrap().len(), 4096); // the caller gets its value
    /// let retry = run(&store, call(), async { Ok::<_, Error>(String::new()) }).await;
    /// assert!(matches!(retry, Err(Error::Unrecorded(_)))); // never run again
    /// # }
    /// ```
    pub fn max_outcome(mut self, bytes: usize) -> Self {
        self.max_outcome = bytes;
        self
    }

    /// The operation.
    pub fn scope(&self) -> &Scope {
        &self.scope
    }

    /// The key, or why it is not one.
    #[cfg(feature = "_sql")]
    pub(crate) fn key(&self) -> Result<Key, Error> {
        match &self.key {
            Ok(key) => Ok(key.clone()),
            Err(Error::InvalidKey(err)) => Err(Error::InvalidKey(err.clone())),
            Err(Error::MissingKey) => Err(Error::MissingKey),
            Err(err) => Err(Error::Config(err.to_string())),
        }
    }

    /// The fingerprint, or why there is none.
    #[cfg(feature = "_sql")]
    pub(crate) fn fingerprint(&self) -> Result<Fingerprint, Error> {
        match &self.fingerprint {
            Ok(fingerprint) => Ok(*fingerprint),
            Err(Error::Serialization(err)) => Err(Error::Serialization(
                <serde_json::Error as serde::de::Error>::custom(err),
            )),
            Err(err) => Err(Error::Config(err.to_string())),
        }
    }

    /// The policy.
    #[cfg(feature = "_sql")]
    pub(crate) fn policy(&self) -> Policy {
        self.policy
    }

    /// The same call, whose body's steps journal as `steps` says.
    #[cfg(feature = "_sql")]
    pub(crate) fn with_steps_as(mut self, steps: StepsAs) -> Self {
        self.steps = Some(Box::new(steps));
        self
    }

    /// The same call under the outcome policy `change` makes of its own.
    fn map_outcomes<P>(self, change: impl FnOnce(O) -> P) -> Call<P> {
        Call {
            scope: self.scope,
            key: self.key,
            fingerprint: self.fingerprint,
            policy: self.policy,
            missing_key: self.missing_key,
            outcomes: change(self.outcomes),
            max_outcome: self.max_outcome,
            steps: self.steps,
        }
    }

    /// Whether the body is to run without protection: the key is missing
    /// and the call says to run anyway. Such a call is traced and counted
    /// here, as no other decision of the flow will be.
    fn unprotected(&self) -> bool {
        let unprotected =
            self.missing_key == MissingKey::Run && matches!(self.key, Err(Error::MissingKey));
        if unprotected {
            tracing::debug!(
                scope = %self.scope,
                decision = "unprotected",
                "no idempotency key: running without protection"
            );
            metrics::unprotected(&self.scope);
        }
        unprotected
    }
}

impl<C> Call<OkOnly<C>> {
    /// Stores the `Ok` value with `codec` instead of JSON: for values that
    /// are not serde types, or whose JSON form would be wasteful (the HTTP
    /// layer stores a response as framed raw bytes).
    pub fn with_codec<D>(self, codec: D) -> Call<OkOnly<D>> {
        self.map_outcomes(|_| OkOnly(codec))
    }

    /// Stores and replays the errors for which `replayable` answers `true`,
    /// as JSON, like results (permanent failures such as a declined card);
    /// other errors still release the key. The `Ok` value keeps its codec.
    ///
    /// A closure needs its argument's type (`|err: &MyError| ...`) unless
    /// its body names it, as `matches!(err, MyError::Declined)` does.
    pub fn replaying<E, P>(self, replayable: P) -> Call<Replaying<C, P, E>>
    where
        E: Serialize + DeserializeOwned,
        P: Fn(&E) -> bool,
    {
        self.map_outcomes(|OkOnly(codec)| Replaying {
            codec,
            replayable,
            errors: JsonErrors::new(),
        })
    }
}

impl<C, P, E> Call<Replaying<C, P, E>> {
    /// Stores the `Ok` value with `codec` instead of JSON; replayable
    /// errors are still stored as JSON. See [`Call::with_codec`].
    pub fn with_codec<D>(self, codec: D) -> Call<Replaying<D, P, E>> {
        self.map_outcomes(
            |Replaying {
                 replayable, errors, ..
             }| Replaying {
                codec,
                replayable,
                errors,
            },
        )
    }
}

impl<O> fmt::Debug for Call<O> {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("Call")
            .field("scope", &self.scope)
            .field("key", &self.key)
            .field("fingerprint", &self.fingerprint)
            .field("policy", &self.policy)
            .field("missing_key", &self.missing_key)
            .finish_non_exhaustive()
    }
}

/// How an operation's `Ok` value becomes the stored outcome bytes, and back.
///
/// A value that `encode` fails on is not stored: the key answers
/// [`Error::Unrecorded`] from then on (its operation ran, and is not run
/// again).
pub trait Codec<T> {
    /// The bytes to store for `value`.
    fn encode(&self, value: &T) -> Result<Vec<u8>, Error>;
    /// The value that `bytes` (written by [`encode`](Codec::encode)) stands for.
    fn decode(&self, bytes: &[u8]) -> Result<T, Error>;
}

/// The default [`Codec`]: the value's JSON form, through `serde_json`.
/// A value holding a non-finite float (NaN, +inf, -inf), which JSON has no
/// form for and `serde_json` would write as `null`, is refused
/// ([`Error::Serialization`]).
#[derive(Clone, Copy, Debug, Default)]
pub struct Json;

impl<T: Serialize + DeserializeOwned> Codec<T> for Json {
    fn encode(&self, value: &T) -> Result<Vec<u8>, Error> {
        // A non-finite float is refused rather than written as `null`,
        // which would be replayed as something else, or not at all.
        Ok(crate::canonical::to_vec(value)?)
    }

    fn decode(&self, bytes: &[u8]) -> Result<T, Error> {
        Ok(serde_json::from_slice(bytes)?)
    }
}

/// Which of a call's results are stored and replayed: the outcome policy
/// of a [`Call`], which [`run`] and [`run_in_transaction`] require for the
/// body's `Result<T, E>`.
///
/// It is implemented by [`OkOnly`] and [`Replaying`], chosen with the
/// call's builder methods, and cannot be implemented outside this crate.
pub trait OutcomePolicy<T, E>: sealed::Outcomes<T, E> {}

/// The default outcome policy: the `Ok` value is stored with the codec `C`
/// ([`Json`] unless [`Call::with_codec`] says otherwise); errors are never
/// stored.
#[derive(Clone, Copy, Debug, Default)]
pub struct OkOnly<C = Json>(C);

impl<T, E, C: Codec<T>> OutcomePolicy<T, E> for OkOnly<C> {}

/// The outcome policy of [`Call::replaying`]: the `Ok` value is stored
/// with the codec `C`, and the errors `E` for which the predicate `P`
/// answers `true` are stored as JSON; other errors are not stored.
pub struct Replaying<C, P, E> {
    codec: C,
    replayable: P,
    errors: JsonErrors<E>,
}

impl<T, E, C, P> OutcomePolicy<T, E> for Replaying<C, P, E>
where
    C: Codec<T>,
    P: Fn(&E) -> bool,
{
}

/// [`Json`] for a replayable error type, taken where the error type is
/// known to be a serde type ([`Call::replaying`]): the one place that
/// requires it, so that a missing `Serialize` is reported once, there.
struct JsonErrors<E> {
    encode: fn(&E) -> Result<Vec<u8>, Error>,
    decode: fn(&[u8]) -> Result<E, Error>,
}

impl<E: Serialize + DeserializeOwned> JsonErrors<E> {
    fn new() -> Self {
        JsonErrors {
            encode: |err| Json.encode(err),
            decode: |bytes| Json.decode(bytes),
        }
    }
}

impl<C: fmt::Debug, P, E> fmt::Debug for Replaying<C, P, E> {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("Replaying")
            .field("codec", &self.codec)
            .finish_non_exhaustive()
    }
}

/// Runs `body` at most once per `(scope, key)` and replays its outcome to
/// every later call: by default its `Ok` value, while an error is released
/// (a retry runs again); the call's outcome policy may store replayable
/// errors too, or store the value with another codec ([`Call`]). See the
/// [module documentation](self).
///
/// The call is checked, and the time it may wait for a duplicate
/// ([`Policy::wait_bound`]) starts, when `run` is called; nothing else
/// happens until the future is polled. `run` is a plain function that returns one
/// future, rather than an `async fn` wrapping the instrumented one: each
/// layer of future is moved (copied whole) as it is built and awaited,
/// a cost a replay from a store in memory would feel.
pub fn run<'s, S, T, E, Fut, O>(
    store: &'s S,
    call: Call<O>,
    body: Fut,
) -> impl Future<Output = Result<T, E>> + 's
where
    S: Store + ?Sized,
    E: From<Error> + 's,
    T: 's,
    Fut: Future<Output = Result<T, E>> + 's,
    O: OutcomePolicy<T, E> + 's,
{
    // Read in place by the future below: moving them out of its captures
    // would make it larger.
    let unprotected = call.unprotected();
    let checked = match unprotected {
        true => Err(Error::MissingKey),
        false => call.check(Instant::now()),
    };
    let span = match &checked {
        Ok((call, _)) => call.span(),
        Err(_) => tracing::Span::none(),
    };
    async move {
        if unprotected {
            return body.await;
        }
        let (call, outcomes) = match checked {
            Ok(ref checked) => (&checked.0, &checked.1),
            Err(err) => return Err(err.into()),
        };
        let request = call.request();
        // From here on, a dropped caller hands back whatever it holds.
        let mut guard = Guard::new(store, &request);
        let mut records = Pooled(store);
        let claim = match claimed(&mut records, call, &request, outcomes, &mut guard).await {
            Ok(claim) => claim,
            Err(answer) => return answer,
        };
        // The execution is a future of its own, on the heap: the state it
        // keeps while the body runs and its outcome is stored is most of a
        // call's, and a replay, which never gets here, would otherwise
        // carry (and copy, as the call's future is moved) all of it.
        // The guard and the claim stay here, lent to it: an `async fn`'s
        // future holds what it owns twice (as argument and as local).
        Box::pin(execute(
            store,
            call,
            outcomes,
            &mut guard,
            &mut records,
            &claim,
            body,
        ))
        .await
    }
    .instrument(span)
}

/// [`run`] once the claim is won: runs the body (renewing the lease),
/// then stores its outcome or releases the key.
async fn execute<'s, S, T, E, Fut, O>(
    store: &'s S,
    call: &Checked,
    outcomes: &O,
    guard: &mut Guard<'s, '_, S>,
    records: &mut Pooled<'s, S>,
    claim: &Claim,
    body: Fut,
) -> Result<T, E>
where
    S: Store + ?Sized,
    E: From<Error>,
    Fut: Future<Output = Result<T, E>>,
    O: OutcomePolicy<T, E>,
{
    // The body's durable steps journal through an owned handle on the
    // store, fenced by this claim; a dropped caller's claim is handed
    // back once their writes on the way have landed.
    guard.running(claim.clone());
    let operation = Operation::new(
        store.capabilities().detached(),
        claim.clone(),
        call.steps_as(),
    );
    guard.journal_first(operation.clone());
    let body = std::pin::pin!(operation.scope(body));
    let result = renewing(store, claim, Some(call), body).await;
    let stored = match outcomes.encode(&result) {
        Some(encoded) => recorded(encoded, call.max_outcome),
        // Nothing to store: release the key. Should that fail, the
        // guard hands it back in the background as it drops.
        None => {
            if release(records, claim).await {
                guard.disarm();
            }
            return result;
        }
    };
    let stored = guard.saving(stored);
    match save(store, claim, stored, SaveFor::Caller).await {
        // Still not stored: the guard keeps trying in the background
        // (when it can) as it drops. The caller gets its value now.
        Saved::NotYet => {}
        Saved::Stored | Saved::Lost => guard.disarm(),
    }
    result
}

/// Transactional mode: like [`run`], but the claim and the completion are
/// written on `conn`, the caller's open transaction. The body borrows the
/// connection to write its own rows, and hands it back with its result:
/// `|conn| async move { let r = ...; (r, conn) }`. The call's outcome
/// policy applies as in [`run`]. The caller commits; see the
/// [module documentation](self#transactional-mode).
///
/// On a connection outside a transaction (one that no `begin` of sqlx's
/// opened: [`TransactionalStore::in_transaction`]), each statement commits
/// as it runs, the claim too, so that everyone sees it: its lease is then
/// renewed through the store while the body runs, as in [`run`], and an
/// outcome that the connection fails to store is stored through the
/// store.
pub async fn run_in_transaction<'c, S, C, T, E, F, Fut, O>(
    store: &S,
    conn: &'c mut C,
    call: Call<O>,
    body: F,
) -> Result<T, E>
where
    S: TransactionalStore<C> + ?Sized,
    C: Send + ?Sized,
    E: From<Error>,
    F: FnOnce(&'c mut C) -> Fut,
    Fut: Future<Output = (Result<T, E>, &'c mut C)>,
    O: OutcomePolicy<T, E>,
{
    if call.unprotected() {
        return body(conn).await.0;
    }
    // Outside a transaction each statement commits as it runs, the claim
    // too: everyone sees it (see below).
    let hidden = store.in_transaction(conn);
    let (call, outcomes) = call.check(Instant::now())?;
    let span = call.span();
    async move {
        let request = call.request();
        let mut guard = Guard::new(store, &request);
        let mut records = OnConnection {
            store,
            conn,
            locked: false,
        };
        let claim = match claimed(&mut records, &call, &request, &outcomes, &mut guard).await {
            Ok(claim) => claim,
            Err(answer) => return answer,
        };
        guard.running(claim.clone());
        // Nothing outlives the caller's transaction to journal steps in:
        // they run with their keys, unjournaled.
        let operation = Operation::new(None, claim.clone(), call.steps_as());
        if !hidden {
            // A claim committed at once: it needs what a claim gets in
            // record mode, its lease renewed while the body runs (on the
            // store's pool), its outcome saved however long the store
            // fails, a dropped caller's claim handed back.
            let body = std::pin::pin!(operation.scope(body(records.conn)));
            // Its steps are not journaled: nothing to keep but the lease.
            let (result, conn) = renewing(store, &claim, None, body).await;
            let records = OnConnection {
                store,
                conn,
                locked: false,
            };
            return settle_committed(
                store,
                records,
                &mut guard,
                &claim,
                &outcomes,
                call.max_outcome,
                result,
            )
            .await;
        }
        // The claim is written in the caller's open transaction: nobody
        // else sees it, and a competing claim waits for the transaction to
        // end, so the lease needs no renewal.
        let (result, conn) = operation.scope(body(records.conn)).await;
        // Whatever happens next happens on the caller's transaction: if it
        // fails, the caller's transaction fails with it and rolls back.
        guard.disarm();
        let mut records = OnConnection {
            store,
            conn,
            locked: false,
        };
        match outcomes.encode(&result) {
            Some(encoded) => match complete_or_refuse(&mut records, &claim, recorded(encoded, call.max_outcome)).await {
                Ok(()) => {}
                Err(err) => {
                    tracing::error!(
                        error = %err,
                        "storing the outcome in the transaction failed; roll the transaction back"
                    );
                    return Err(err.into());
                }
            },
            None => {
                // On the caller's transaction: if this fails, so does the
                // transaction, and the claim rolls back with it.
                release(&mut records, &claim).await;
            }
        }
        result
    }
    .instrument(span)
    .await
}

/// The end of a call in transactional mode whose claim committed at once
/// (on a connection outside a transaction): the outcome is stored (or the
/// key released) on the caller's connection, which needs no connection of
/// the store's pool (a pool of one may have lent it to the caller); should
/// that fail, as record mode does it, through the store, the guard handing
/// on what is left should the caller be dropped.
async fn settle_committed<S, C, T, E, O>(
    store: &S,
    mut records: OnConnection<'_, '_, S, C>,
    guard: &mut Guard<'_, '_, S>,
    claim: &Claim,
    outcomes: &O,
    max_outcome: usize,
    result: Result<T, E>,
) -> Result<T, E>
where
    S: TransactionalStore<C> + ?Sized,
    C: Send + ?Sized,
    E: From<Error>,
    O: OutcomePolicy<T, E>,
{
    let Some(encoded) = outcomes.encode(&result) else {
        // Should that fail, the guard hands the key back through the
        // store in the background as it drops, as in record mode: the
        // caller may hold the pool's only connection.
        if release(&mut records, claim).await {
            guard.disarm();
        }
        return result;
    };
    let outcome = recorded(encoded, max_outcome);
    match complete_or_refuse(&mut records, claim, outcome.clone()).await {
        Ok(()) => guard.disarm(),
        Err(Error::LeaseLost) => {
            lease_lost(claim);
            guard.disarm();
        }
        Err(err) => {
            tracing::warn!(error = %err, "storing the outcome on the connection failed; storing it through the store");
            let outcome = guard.saving(outcome);
            match save(store, claim, outcome, SaveFor::Caller).await {
                Saved::NotYet => {}
                Saved::Stored | Saved::Lost => guard.disarm(),
            }
        }
    }
    result
}

/// The outcome to store for a result the body returned: its encoding, or,
/// when its codec failed or it is longer than `max` bytes
/// ([`Call::max_outcome`]), the [`Outcome::unrecorded`] that answers
/// [`Error::Unrecorded`] to every later call. The body ran, so the key is
/// not handed back for a retry to run it again.
fn recorded(encoded: Result<Outcome, Error>, max: usize) -> Outcome {
    match encoded {
        Ok(outcome) if outcome.body.len() <= max => outcome,
        Ok(outcome) => refused(&format!(
            "an outcome of {} bytes is longer than the call's max_outcome of {max} bytes",
            outcome.body.len()
        )),
        Err(err) => {
            tracing::error!(
                error = %err,
                "the result could not be encoded; the key answers Unrecorded from now on"
            );
            Outcome::unrecorded(&err.to_string())
        }
    }
}

/// The outcome stored in place of one that can never be stored (`reason`
/// says why: over the call's limit, or refused by the store as one it can
/// never hold).
fn refused(reason: &str) -> Outcome {
    tracing::error!(
        reason,
        "the outcome cannot be stored; the key answers Unrecorded from now on"
    );
    Outcome::unrecorded(reason)
}

/// Completes `claim` with `outcome`, or, should the store refuse it as one
/// it can never hold, with the outcome that answers
/// [`Error::Unrecorded`].
async fn complete_or_refuse<R: Records>(
    records: &mut R,
    claim: &Claim,
    outcome: Outcome,
) -> Result<(), Error> {
    match records.complete(claim, &outcome).await {
        Err(Error::Unrecorded(reason)) => records.complete(claim, &refused(&reason)).await,
        done => done,
    }
}

/// A [`Call`] whose key and fingerprint are valid and whose policy is sane.
struct Checked {
    scope: Scope,
    key: Key,
    fingerprint: Fingerprint,
    policy: Policy,
    token: ClaimToken,
    started: Instant,
    max_outcome: usize,
    steps: Option<Box<StepsAs>>,
}

impl<O> Call<O> {
    /// The checked call, and its outcome policy.
    fn check(self, started: Instant) -> Result<(Checked, O), Error> {
        let Call {
            scope,
            key,
            fingerprint,
            policy,
            missing_key: _,
            outcomes,
            max_outcome,
            steps,
        } = self;
        let (key, fingerprint) = (key?, fingerprint?);
        if policy.ttl.is_zero() {
            return Err(Error::Config("the ttl must be longer than zero".into()));
        }
        if policy.lease < MIN_LEASE {
            return Err(Error::Config(format!(
                "the lease must be at least {MIN_LEASE:?}: it is renewed every third of it"
            )));
        }
        // Instants and timestamps a lease or a ttl from now must exist.
        if policy.lease > MAX_SPAN || policy.ttl > MAX_SPAN {
            let what = if policy.lease > MAX_SPAN {
                "lease"
            } else {
                "ttl"
            };
            return Err(Error::Config(format!(
                "the {what} must be at most {} days",
                MAX_SPAN.as_secs() / 86_400
            )));
        }
        let checked = Checked {
            scope,
            key,
            fingerprint,
            policy,
            token: ClaimToken::new(),
            started,
            max_outcome,
            steps,
        };
        Ok((checked, outcomes))
    }
}

impl Checked {
    fn span(&self) -> tracing::Span {
        // Nothing could see the span: no subscriber was ever set, and
        // `log` (where `tracing` writes without one) is off. Building,
        // entering and leaving it anyway costs some 300 instructions a
        // call, a twentieth of a replay from a store in memory.
        if !tracing::dispatcher::has_been_set() && log::max_level() == log::LevelFilter::Off {
            return tracing::Span::none();
        }
        tracing::info_span!("idem", scope = %self.scope, key = %self.key)
    }

    /// What the body's steps journal under: the call's own scope,
    /// fingerprint and ttl (at least a lease, so that an entry outlives a
    /// crashed attempt's lease), unless the call says otherwise.
    fn steps_as(&self) -> StepsAs {
        self.steps.as_deref().cloned().unwrap_or_else(|| StepsAs {
            scope: self.scope.clone(),
            fingerprint: self.fingerprint,
            ttl: self.policy.ttl.max(self.policy.lease),
        })
    }

    fn request(&self) -> BeginRequest<'_> {
        BeginRequest {
            scope: &self.scope,
            key: &self.key,
            fingerprint: &self.fingerprint,
            token: self.token,
            lease: self.policy.lease,
            ttl: self.policy.ttl,
        }
    }
}

mod sealed {
    use crate::error::Error;
    use crate::record::Outcome;

    /// How a result becomes a stored outcome, and back: the methods of
    /// [`OutcomePolicy`](super::OutcomePolicy), out of reach of other
    /// crates.
    pub trait Outcomes<T, E> {
        /// The outcome to store for `result`, or `None` to release the key.
        fn encode(&self, result: &Result<T, E>) -> Option<Result<Outcome, Error>>;
        /// The result a stored outcome stands for.
        fn decode(&self, outcome: &Outcome) -> Result<Result<T, E>, Error>;
    }
}

impl<T, E, C: Codec<T>> sealed::Outcomes<T, E> for OkOnly<C> {
    fn encode(&self, result: &Result<T, E>) -> Option<Result<Outcome, Error>> {
        let value = result.as_ref().ok()?;
        Some(self.0.encode(value).map(|body| Outcome {
            kind: OutcomeKind::Ok,
            body,
        }))
    }

    fn decode(&self, outcome: &Outcome) -> Result<Result<T, E>, Error> {
        if let Some(reason) = outcome.unrecorded_reason() {
            return Err(Error::Unrecorded(reason));
        }
        match outcome.kind {
            OutcomeKind::Ok => Ok(Ok(self.0.decode(&outcome.body)?)),
            OutcomeKind::Err => Err(Error::Config(
                "the stored outcome is an error, but this call does not replay errors \
                 (was `replayable` removed from the operation?)"
                    .into(),
            )),
        }
    }
}

impl<T, E, C, P> sealed::Outcomes<T, E> for Replaying<C, P, E>
where
    C: Codec<T>,
    P: Fn(&E) -> bool,
{
    fn encode(&self, result: &Result<T, E>) -> Option<Result<Outcome, Error>> {
        let (kind, body) = match result {
            Ok(value) => (OutcomeKind::Ok, self.codec.encode(value)),
            Err(err) if (self.replayable)(err) => (OutcomeKind::Err, (self.errors.encode)(err)),
            Err(_) => return None,
        };
        Some(body.map(|body| Outcome { kind, body }))
    }

    fn decode(&self, outcome: &Outcome) -> Result<Result<T, E>, Error> {
        if let Some(reason) = outcome.unrecorded_reason() {
            return Err(Error::Unrecorded(reason));
        }
        Ok(match outcome.kind {
            OutcomeKind::Ok => Ok(self.codec.decode(&outcome.body)?),
            OutcomeKind::Err => Err((self.errors.decode)(&outcome.body)?),
        })
    }
}

/// Where the record statements run: the store's own pool, or the caller's
/// connection in transactional mode.
///
/// Its methods return their futures unboxed (the trait is private and only
/// used generically): a boxed future would be an allocation per
/// statement, on the path of a replay from a store in memory.
trait Records: Send {
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

struct Pooled<'a, S: ?Sized>(&'a S);

impl<S: Store + ?Sized> Records for Pooled<'_, S> {
    async fn begin(&mut self, request: &BeginRequest<'_>) -> Result<Begin, Error> {
        // Answered at once (a store in memory): the lease it wrote starts
        // now, whole. The claim sent to a server is a future of its own,
        // on the heap, so that this future, and the call's, which is moved
        // (copied whole) as it is built and awaited, do not carry it: a
        // round trip dwarfs the allocation.
        let immediate = self.0.capabilities().immediate;
        let answer = match immediate.and_then(|now| now.begin_now(request)) {
            None => return Box::pin(begin_sent(self.0, request)).await,
            Some(answer @ Err(Error::Store(_))) => answer,
            Some(answer) => return answer,
        };
        Box::pin(claim_again(self.0, request, Instant::now(), answer)).await
    }
    async fn peek(&mut self, request: &BeginRequest<'_>) -> Result<Option<Begin>, Error> {
        self.0.peek(request).await
    }
    async fn complete(&mut self, claim: &Claim, outcome: &Outcome) -> Result<(), Error> {
        self.0.complete(claim, outcome).await
    }
    async fn release(&mut self, claim: &Claim) -> Result<(), Error> {
        self.0.release(claim).await
    }
    async fn wait_for_change(
        &mut self,
        request: &BeginRequest<'_>,
        timeout: Duration,
    ) -> Result<Option<Begin>, Error> {
        let waker = self.0.capabilities().waker();
        waker.wait_for_outcome(request, timeout).await
    }
    fn max_poll(&self) -> Duration {
        if self.0.capabilities().waker().wakes_across_processes() {
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

struct OnConnection<'s, 'c, S: ?Sized, C: ?Sized> {
    store: &'s S,
    conn: &'c mut C,
    /// A claim attempt on `conn` found the key in progress: it may have
    /// left a lock in the caller's transaction.
    locked: bool,
}

impl<S, C> Records for OnConnection<'_, '_, S, C>
where
    S: TransactionalStore<C> + ?Sized,
    C: Send + ?Sized,
{
    async fn begin(&mut self, request: &BeginRequest<'_>) -> Result<Begin, Error> {
        if self.store.claim_locks_only_its_own() {
            // A duplicate's claim attempt locks nothing: claim at once.
            return self.store.begin_on(self.conn, request).await;
        }
        // Look first with a plain read: a duplicate of a finished or
        // running call is answered without a claim attempt, so it takes no
        // lock in the caller's transaction.
        if let Some(answer) = self.store.peek_in(self.conn, request).await? {
            return Ok(answer);
        }
        let answer = self.store.begin_on(self.conn, request).await?;
        self.locked = matches!(answer, Begin::InProgress { .. });
        Ok(answer)
    }
    async fn peek(&mut self, request: &BeginRequest<'_>) -> Result<Option<Begin>, Error> {
        self.store.peek_in(self.conn, request).await
    }
    async fn complete(&mut self, claim: &Claim, outcome: &Outcome) -> Result<(), Error> {
        self.store.complete_on(self.conn, claim, outcome).await
    }
    async fn release(&mut self, claim: &Claim) -> Result<(), Error> {
        self.store.release_on(self.conn, claim).await
    }
    async fn wait_for_change(
        &mut self,
        _request: &BeginRequest<'_>,
        timeout: Duration,
    ) -> Result<Option<Begin>, Error> {
        // Polls: a wake-up through the store would take a second connection
        // while the caller's transaction holds one, and pools run dry.
        tokio::time::sleep(timeout).await;
        Ok(None)
    }
    fn max_poll(&self) -> Duration {
        MAX_POLL
    }
    fn may_wait(&self) -> bool {
        !self.locked
    }
}

/// The claim, or the caller's answer (a replay, or an error). A store
/// error leaves the guard armed: the claim may have landed with its answer
/// lost, and the guard hands it back, by its token, as it drops.
async fn claimed<S, R, T, E, O>(
    records: &mut R,
    call: &Checked,
    request: &BeginRequest<'_>,
    outcomes: &O,
    guard: &mut Guard<'_, '_, S>,
) -> Result<Claim, Result<T, E>>
where
    S: Store + ?Sized,
    R: Records,
    E: From<Error>,
    O: OutcomePolicy<T, E>,
{
    match claim_or_replay(records, call, request, outcomes).await {
        Ok(Ok(claim)) => Ok(claim),
        Ok(Err(replayed)) => {
            guard.disarm();
            Err(replayed)
        }
        Err(err @ Error::Store(_)) => Err(Err(err.into())),
        Err(err) => {
            guard.disarm();
            Err(Err(err.into()))
        }
    }
}

/// Claims the key (waiting for an in-progress call as the policy says), or
/// returns the replayed result as `Err`.
async fn claim_or_replay<R, T, E, O>(
    records: &mut R,
    call: &Checked,
    request: &BeginRequest<'_>,
    outcomes: &O,
) -> Result<Result<Claim, Result<T, E>>, Error>
where
    R: Records,
    O: OutcomePolicy<T, E>,
{
    let first = records.begin(request).await?;
    let answer = if let Begin::InProgress { lease_left, .. } = first {
        // Waiting is the rare path, and its state (timers, reads) large:
        // it is a future of its own, on the heap, so that a call that
        // claims or replays at once neither carries nor copies it. The
        // first answer is not reassigned here: a variable the wait's
        // answer was written back into would keep both across the wait,
        // and make this future larger.
        Box::pin(wait_out(records, call, request, lease_left)).await?
    } else {
        first
    };
    let claim = match answer {
        Begin::Claimed(claim) => claim,
        Begin::Replay(outcome) => {
            tracing::debug!(decision = "replayed", "replaying the stored outcome");
            let replayed = outcomes.decode(&outcome)?;
            metrics::replayed(&call.scope, call.started);
            return Ok(Err(replayed));
        }
        Begin::KeyReused => {
            tracing::info!(
                decision = "key reused",
                "the key was used with another payload"
            );
            metrics::key_reused(&call.scope);
            return Err(Error::KeyReused);
        }
        // `wait_out` answers an error rather than this.
        Begin::InProgress { lease_left, .. } => {
            return Err(in_progress(call, true, Held::now(lease_left)))
        }
    };
    if claim.is_takeover() {
        tracing::info!(
            decision = "taken over",
            fence = claim.fence,
            "claimed a lapsed or expired record"
        );
        metrics::taken_over(&call.scope);
    } else {
        tracing::debug!(
            decision = "claimed",
            fence = claim.fence,
            "running the operation"
        );
    }
    metrics::executed(&call.scope);
    Ok(Ok(claim))
}

/// Waits while another call holds the key, up to the call's wait bound:
/// the first answer that is not [`Begin::InProgress`], or
/// [`Error::InProgress`].
///
/// A waiting duplicate only reads ([`Records::peek`]) between wake-ups,
/// and tries the claim again only when the record says the key is free.
async fn wait_out<R: Records>(
    records: &mut R,
    call: &Checked,
    request: &BeginRequest<'_>,
    lease_left: Duration,
) -> Result<Begin, Error> {
    let mut held = Held::now(lease_left);
    // From the call's start, read once for the whole call. `None`: a
    // bound too far to be represented, so no bound.
    let deadline = call.started.checked_add(call.policy.wait_bound());
    let mut step = FIRST_POLL;
    let mut waited = false;
    loop {
        let now = Instant::now();
        let left = deadline.map(|d| d.saturating_duration_since(now));
        if left.is_some_and(|left| left.is_zero()) || !records.may_wait() {
            return Err(in_progress(call, waited, held));
        }
        if !waited {
            tracing::debug!(
                decision = "waiting",
                "another call holds the key; waiting for its outcome"
            );
            waited = true;
        }
        let pause = left.map_or(step, |left| step.min(left));
        // The reads of the wait end with the wait: a store that stops
        // answering (a connection cut without a reset, a primary killed
        // mid-failover) must not keep the caller past its bound. Only
        // reads: a claim that was sent is left to finish, as its answer
        // says whether this caller holds the key.
        let Some(handed) = bounded(left, records.wait_for_change(request, pause)).await else {
            return Err(in_progress(call, waited, held));
        };
        step = (step * 2).min(records.max_poll());
        let answer = match handed? {
            Some(answer) => answer,
            None => {
                let Some(peeked) = bounded(left, records.peek(request)).await else {
                    return Err(in_progress(call, waited, held));
                };
                match peeked? {
                    Some(answer) => answer,
                    None => records.begin(request).await?,
                }
            }
        };
        match answer {
            Begin::InProgress { lease_left, .. } => held = Held::now(lease_left),
            answer => return Ok(answer),
        }
    }
}

/// The lease left on the key's holder, as last read, and when.
#[derive(Clone, Copy)]
struct Held {
    lease_left: Duration,
    read: Instant,
}

impl Held {
    fn now(lease_left: Duration) -> Held {
        Held {
            lease_left,
            read: Instant::now(),
        }
    }

    /// The soonest the key can move: when the holder's lease runs out,
    /// should the holder be gone (a live holder renews it, and a waiting
    /// caller told to come back then finds it running still, or done).
    fn retry_after(self) -> Duration {
        self.lease_left
            .saturating_sub(self.read.elapsed())
            .max(MIN_RETRY_AFTER)
    }
}

/// `op`, given up (`None`) once `left` (and a little more, for the store's
/// own answer to a wait that ends at the bound) has passed; no bound for
/// `None`.
async fn bounded<F: Future>(left: Option<Duration>, op: F) -> Option<F::Output> {
    match left {
        Some(left) => within(left + WAIT_SLACK, op).await,
        None => Some(op.await),
    }
}

/// How long past its wait a waiting caller gives the store to answer.
const WAIT_SLACK: Duration = Duration::from_millis(100);

/// The error of a call that finds the key held by another and may not
/// wait (any longer), traced and counted.
fn in_progress(call: &Checked, waited: bool, held: Held) -> Error {
    tracing::info!(
        decision = "in progress",
        waited,
        "another call holds the key"
    );
    metrics::in_progress(&call.scope);
    Error::InProgress {
        retry_after: held.retry_after(),
    }
}

/// Runs `body` while renewing the claim's lease every third of it, so a
/// body slower than its lease is never taken over while it runs, and with
/// it the live entries of the step journal of `journaled`'s operation.
async fn renewing<S, F>(
    store: &S,
    claim: &Claim,
    journaled: Option<&Checked>,
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
    let mut renew = Box::pin(keep_renewed(store, claim, Renewing::Body(journal_ttl)));
    tokio::select! {
        biased;
        output = &mut body => output,
        never = &mut renew => match never {},
    }
}

/// What a claim's lease is renewed for.
enum Renewing {
    /// The body, which runs, and whose step journal, if any, is kept as
    /// long as the lease: for this long from each renewal. The journal is
    /// the claim's (its scope and key, which every journal write names),
    /// so it is kept under the claim's scope and key, whatever the scope
    /// the steps derive their keys from (entity mode's claim is per table).
    Body(Option<Duration>),
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
async fn keep_renewed<S: Store + ?Sized>(store: &S, claim: &Claim, what: Renewing) -> Infallible {
    let period = (claim.lease / 3).max(Duration::from_millis(1));
    let again = (period / 4).max(Duration::from_millis(1));
    let mut next = Instant::now() + period;
    loop {
        tokio::time::sleep_until(next).await;
        let sent = Instant::now();
        match within(period, store.renew(claim)).await {
            Some(Ok(())) => {
                next = sent + period;
                if let Renewing::Body(Some(ttl)) = &what {
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
                if matches!(what, Renewing::Body(_)) {
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

/// What became of an outcome.
enum Saved {
    Stored,
    /// Another caller took the key over: the outcome cannot be stored.
    Lost,
    /// The store kept failing for as long as the caller may wait.
    NotYet,
}

/// How long [`save`] tries before it gives the caller its value.
enum SaveFor {
    /// The caller waits up to [`SAVE_IN_LINE`], whatever the store, then
    /// gets its value; the rest is done in the background when the store
    /// can be detached.
    Caller,
    /// In the background, until the outcome lands or the claim is lost.
    Background,
}

/// Stores the outcome, fenced by the claim's token, trying again while
/// the store fails, and renewing the lease all along: the key is this
/// caller's until its outcome lands, however long a completion takes or
/// however often it fails. A completion whose answer was lost is accepted
/// when sent again, so a retry never mistakes its own earlier success for
/// a lost lease.
async fn save<S: Store + ?Sized>(
    store: &S,
    claim: &Claim,
    outcome: &Outcome,
    patience: SaveFor,
) -> Saved {
    match complete_now(store, claim, outcome) {
        // Stored at once: a store in memory.
        Some(Ok(())) => Saved::Stored,
        Some(Err(Error::LeaseLost)) => lease_lost(claim),
        // The rest (waiting on the store, timers, retries, renewals) on
        // the heap, so that a call stored at once neither carries nor
        // copies it.
        first => {
            Box::pin(async {
                let saving = save_patiently(store, claim, outcome, patience, first);
                let renewals = keep_renewed(store, claim, Renewing::Save);
                tokio::select! {
                    biased;
                    saved = saving => saved,
                    never = renewals => match never {},
                }
            })
            .await
        }
    }
}

/// [`Store::complete`] done at once by a store that can
/// ([`Immediate`](crate::store::Immediate)).
fn complete_now<S: Store + ?Sized>(
    store: &S,
    claim: &Claim,
    outcome: &Outcome,
) -> Option<Result<(), Error>> {
    store.capabilities().immediate?.complete_now(claim, outcome)
}

/// [`save`] for a store that does not complete at once, or failed to at
/// once (`first`, that attempt's answer, taken as the loop's first).
async fn save_patiently<S: Store + ?Sized>(
    store: &S,
    claim: &Claim,
    outcome: &Outcome,
    patience: SaveFor,
    mut first: Option<Result<(), Error>>,
) -> Saved {
    // Read at the first completion sent.
    let mut started = None;
    let mut pause = Duration::from_millis(20);
    // What is stored instead of an outcome the store can never hold.
    let mut unrecorded = None;
    loop {
        let outcome = unrecorded.as_ref().unwrap_or(outcome);
        let completed = match first.take().or_else(|| complete_now(store, claim, outcome)) {
            // Done (or failed) at once: a store in memory.
            Some(done) => done,
            None => {
                // A completion can block (a lock held on the record, a
                // stalled connection): a waiting caller gives it only what
                // is left of its time in line, then hands the work to the
                // background. Sending the same outcome again later is
                // accepted, so a completion cut short while it was landing
                // does no harm.
                let attempt = store.complete(claim, outcome);
                let left = SAVE_IN_LINE.saturating_sub(since(&mut started));
                match patience {
                    SaveFor::Caller if !left.is_zero() => {
                        within(left, attempt).await.unwrap_or_else(|| {
                            Err(Error::store(
                                "storing the outcome took longer than the caller waits",
                            ))
                        })
                    }
                    SaveFor::Caller => return not_yet(store, None),
                    SaveFor::Background => attempt.await,
                }
            }
        };
        match completed {
            Ok(()) => return Saved::Stored,
            Err(Error::LeaseLost) => return lease_lost(claim),
            // The same outcome would be refused again for ever: the key
            // answers `Unrecorded` instead, sent at once.
            Err(Error::Unrecorded(reason)) if unrecorded.is_none() => {
                unrecorded = Some(refused(&reason));
            }
            Err(err) => {
                metrics::store_retried(&claim.scope);
                let mut nap = pause;
                if let SaveFor::Caller = patience {
                    let left = SAVE_IN_LINE.saturating_sub(since(&mut started));
                    if left.is_zero() {
                        return not_yet(store, Some(&err));
                    }
                    // The caller's wait ends on time, not a pause later.
                    nap = nap.min(left);
                }
                tracing::warn!(error = %err, "storing the outcome failed; trying again");
                // The lease is renewed alongside ([`save`]) meanwhile.
                tokio::time::sleep(nap).await;
                pause = (pause * 2).min(MAX_SAVE_PAUSE);
            }
        }
    }
}

/// A caller's wait for its outcome to be stored is over
/// ([`SAVE_IN_LINE`]): it gets its value now. A store that can work in
/// the background ([`Detach`](crate::store::Detach)) goes on storing it there (the
/// call's guard hands it on); one that cannot leaves the key claimed, no
/// longer renewed, until its lease runs out.
fn not_yet<S: Store + ?Sized>(store: &S, err: Option<&Error>) -> Saved {
    let error = err.map(tracing::field::display);
    if store.capabilities().detach.is_some() {
        tracing::warn!(
            error,
            "the outcome is not stored yet; returning the value and storing it in the background"
        );
    } else {
        tracing::error!(
            error,
            "the outcome is not stored yet and this store cannot store it in the background; \
             returning the value: the key stays claimed until its lease runs out, then a retry \
             runs the operation again"
        );
    }
    Saved::NotYet
}

/// The time since `started`, which is now if it was not set.
fn since(started: &mut Option<Instant>) -> Duration {
    started.get_or_insert_with(Instant::now).elapsed()
}

/// A completion refused because another caller took the key over,
/// traced and counted.
fn lease_lost(claim: &Claim) -> Saved {
    tracing::warn!(
        decision = "lease lost",
        fence = claim.fence,
        "the outcome was not stored: another caller took the key over"
    );
    metrics::lease_lost(&claim.scope);
    Saved::Lost
}

/// `op`'s output, or `None` once `limit` has passed. The timer is armed
/// only when `op` does not finish at once, so an in-memory store costs no
/// timer, and works on a runtime built without one.
async fn within<F: Future>(limit: Duration, op: F) -> Option<F::Output> {
    let mut op = std::pin::pin!(op);
    let at_once = std::future::poll_fn(|cx| {
        std::task::Poll::Ready(match op.as_mut().poll(cx) {
            std::task::Poll::Ready(output) => Some(output),
            std::task::Poll::Pending => None,
        })
    })
    .await;
    match at_once {
        Some(output) => Some(output),
        None => tokio::time::timeout(limit, op).await.ok(),
    }
}

/// Releases the key after a failed operation; answers whether the claim
/// is settled (released, or not ours any more).
async fn release<R: Records>(records: &mut R, claim: &Claim) -> bool {
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
struct Guard<'s, 'r, S: Store + ?Sized> {
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
    fn new(store: &'s S, request: &'r BeginRequest<'r>) -> Self {
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
    fn journal_first(&mut self, operation: Operation) {
        self.operation = Some(operation);
    }

    fn running(&mut self, claim: Claim) {
        self.claim = Some(claim);
        self.holding = Holding::Claim;
    }

    /// Holds `outcome` to store it in the background should the caller
    /// be dropped, and lends it meanwhile: the caller stores it from here.
    fn saving(&mut self, outcome: Outcome) -> &Outcome {
        self.holding = Holding::Outcome(outcome);
        match &self.holding {
            Holding::Outcome(outcome) => outcome,
            _ => unreachable!("just set"),
        }
    }

    fn disarm(&mut self) {
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
