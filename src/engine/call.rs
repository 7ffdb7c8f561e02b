//! The public [`Call`] builder and its options, and the call as it runs
//! once checked ([`Checked`]): a valid key and fingerprint, a sane policy,
//! and the token its claim is written with.
//!
//! ## A missing key
//!
//! A call whose key is missing (an `Option` key that is `None`) fails with
//! [`Error::MissingKey`] before anything runs, unless it was built with
//! [`Call::on_missing_key`]`(`[`MissingKey::Run`]`)`: the body then runs
//! without protection (see [`MissingKey`]).

use std::fmt;
use std::time::Duration;
use tokio::time::Instant;

use serde::de::DeserializeOwned;
use serde::Serialize;

use crate::metrics;
use crate::policy::Policy;
use crate::steps::StepsAs;
use crate::store::BeginRequest;
use idem_core::error::Error;
use idem_core::fingerprint::Fingerprint;
use idem_core::key::{AsKey, Key, Scope};
use idem_core::record::ClaimToken;

use super::outcome::{Json, JsonErrors, OkOnly, Replaying};

/// The shortest lease: it is renewed every third of it.
const MIN_LEASE: Duration = Duration::from_millis(30);
/// The longest lease or ttl: a hundred years, past which a deadline may
/// not be representable (an `Instant`, a database timestamp).
const MAX_SPAN: Duration = Duration::from_secs(100 * 365 * 86_400);

/// One idempotent invocation: which operation, which key, which payload,
/// the [`Policy`], and which outcomes are stored (the outcome policy `O`).
/// Key and fingerprint errors are kept and returned by [`run`](super::run),
/// so building a `Call` never fails.
///
/// The outcome policy is part of the call:
///
/// - by default ([`OkOnly<Json>`](OkOnly)) the `Ok` value is stored as
///   JSON, and an error releases the key, so a retry runs the body again;
/// - [`replaying`](Call::replaying) also stores the errors a predicate
///   picks (permanent failures such as a declined card) and replays them
///   like results;
/// - [`with_codec`](Call::with_codec) stores the `Ok` value with another
///   [`Codec`](super::Codec) than JSON.
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
/// use idem::{run, Call, MemoryStore};
/// use idem::engine::MissingKey;
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
    pub(super) fn unprotected(&self) -> bool {
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

/// A [`Call`] whose key and fingerprint are valid and whose policy is sane.
pub(super) struct Checked {
    pub(super) scope: Scope,
    key: Key,
    fingerprint: Fingerprint,
    pub(super) policy: Policy,
    token: ClaimToken,
    pub(super) started: Instant,
    pub(super) max_outcome: usize,
    steps: Option<Box<StepsAs>>,
}

impl<O> Call<O> {
    /// The checked call, and its outcome policy.
    pub(super) fn check(self, started: Instant) -> Result<(Checked, O), Error> {
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
    pub(super) fn span(&self) -> tracing::Span {
        // Nothing could see the span: no subscriber was ever set, and
        // `log` (where `tracing` writes without one) is off. A span is
        // then not built at all: building, entering and leaving it is
        // work on every call that no one reads, and a replay from a store
        // in memory does little else.
        if !tracing::dispatcher::has_been_set() && log::max_level() == log::LevelFilter::Off {
            return tracing::Span::none();
        }
        tracing::info_span!("idem", scope = %self.scope, key = %self.key)
    }

    /// What the body's steps journal under: the call's own scope,
    /// fingerprint and ttl (at least a lease, so that an entry outlives a
    /// crashed attempt's lease), unless the call says otherwise.
    pub(super) fn steps_as(&self) -> StepsAs {
        self.steps.as_deref().cloned().unwrap_or_else(|| StepsAs {
            scope: self.scope.clone(),
            fingerprint: self.fingerprint,
            ttl: self.policy.ttl.max(self.policy.lease),
        })
    }

    pub(super) fn request(&self) -> BeginRequest<'_> {
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

#[cfg(test)]
mod tests {
    use std::time::Duration;
    use tokio::time::Instant;

    use super::{Call, MissingKey, MAX_SPAN, MIN_LEASE};
    use crate::policy::Policy;
    use idem_core::error::Error;

    fn check(call: Call) -> Result<(), Error> {
        call.check(Instant::now()).map(|_| ())
    }

    fn with(policy: Policy) -> Call {
        Call::new("tests.op", "k-1", &1).with_policy(policy)
    }

    /// The message of the `Config` error the call is refused with.
    fn refusal(call: Call) -> String {
        match check(call) {
            Err(Error::Config(message)) => message,
            other => panic!("expected a refusal, got {other:?}"),
        }
    }

    #[test]
    fn sane_policies_are_accepted_up_to_their_bounds() {
        check(with(Policy::new())).unwrap();
        check(with(Policy::new().lease(MIN_LEASE))).unwrap();
        check(with(Policy::new().lease(MAX_SPAN).ttl(MAX_SPAN))).unwrap();
    }

    #[test]
    fn a_zero_ttl_is_refused() {
        let message = refusal(with(Policy::new().ttl(Duration::ZERO)));
        assert!(message.contains("ttl"), "{message}");
    }

    #[test]
    fn a_lease_too_short_to_renew_is_refused() {
        let short = MIN_LEASE - Duration::from_millis(1);
        let message = refusal(with(Policy::new().lease(short)));
        assert!(message.contains("at least 30ms"), "{message}");
    }

    #[test]
    fn a_lease_or_ttl_past_a_hundred_years_is_refused_by_name() {
        let past = MAX_SPAN + Duration::from_secs(1);
        let lease = refusal(with(Policy::new().lease(past)));
        assert!(
            lease.starts_with("the lease must be at most 36500 days"),
            "{lease}"
        );
        let ttl = refusal(with(Policy::new().ttl(past)));
        assert!(ttl.starts_with("the ttl must be at most"), "{ttl}");
    }

    #[test]
    fn a_bad_key_is_answered_before_the_policy_is_looked_at() {
        let call = Call::new("tests.op", "", &1).with_policy(Policy::new().ttl(Duration::ZERO));
        assert!(matches!(check(call), Err(Error::InvalidKey(_))));
    }

    #[test]
    fn only_a_missing_key_with_run_goes_unprotected() {
        let none: Option<String> = None;
        let some = Some("k-1".to_string());
        assert!(!Call::new("tests.op", &none, &1).unprotected());
        let run = |key: &Option<String>| {
            Call::new("tests.op", key, &1)
                .on_missing_key(MissingKey::Run)
                .unprotected()
        };
        assert!(run(&none));
        assert!(!run(&some));
        // An invalid key is refused whatever the call says.
        let empty = Some(String::new());
        assert!(!run(&empty));
    }

    #[test]
    fn steps_journal_for_at_least_a_lease() {
        let ttl = Duration::from_secs(1);
        let lease = Duration::from_secs(5);
        let policy = Policy::new().ttl(ttl).lease(lease);
        let (checked, _) = with(policy).check(Instant::now()).unwrap();
        let steps = checked.steps_as();
        assert_eq!(steps.ttl, lease);
        assert_eq!(steps.scope.as_str(), "tests.op");
        let (checked, _) = with(Policy::new().ttl(lease).lease(ttl))
            .check(Instant::now())
            .unwrap();
        assert_eq!(checked.steps_as().ttl, lease);
    }

    #[test]
    fn every_request_of_a_call_carries_its_one_token() {
        let policy = Policy::new()
            .ttl(Duration::from_secs(60))
            .lease(Duration::from_secs(3));
        let (checked, _) = with(policy).check(Instant::now()).unwrap();
        let (first, again) = (checked.request(), checked.request());
        assert_eq!(first.token, again.token);
        assert_eq!(first.lease, Duration::from_secs(3));
        assert_eq!(first.ttl, Duration::from_secs(60));
        assert_eq!(first.key.as_str(), "k-1");
        let (other, _) = with(policy).check(Instant::now()).unwrap();
        assert_ne!(other.request().token, first.token);
    }
}
