//! The flow behind `#[idempotent]`: find by key, or execute and save.
//!
//! [`run`] takes a store, a [`Call`] (scope, key, fingerprint, policy) and
//! the operation's body as a future, and:
//!
//! 1. asks the store to [`begin`](Store::begin) (one atomic claim);
//! 2. on a replay, decodes the stored outcome and returns it: the body is
//!    dropped without ever being polled;
//! 3. on a claim, runs the body; an `Ok` value is serialized and stored
//!    (fenced [`complete`](Store::complete)), an error is released so that a
//!    retry runs again, unless [`run_replaying`] was told it is replayable;
//! 4. on a key reused with another payload: [`Error::KeyReused`];
//! 5. on a call in progress: waits for it (woken by the store when it can,
//!    polling with a capped backoff otherwise) up to the policy's bound,
//!    then [`Error::InProgress`]; or fails at once under `fail_fast`.
//!
//! ## Cancellation
//!
//! The body is polled right after the claim, with no await in between. If
//! the caller drops the future while the body runs, the body may have had
//! side effects that its outcome would have recorded, and its borrowed
//! arguments cannot outlive the caller; the claim is then left to its lease
//! (a warning is logged), and a retry after the lease takes over with a new
//! fence. To make a body always run to completion, call the idempotent
//! function from a task of its own (`tokio::spawn`), which outlives the
//! caller.
//!
//! ## Codecs
//!
//! [`run`] and [`run_replaying`] store `Ok` values as JSON ([`Json`]).
//! [`run_with_codec`] takes any [`Codec`], for values that are not serde
//! types or whose JSON form would be wasteful (an HTTP response is stored as
//! framed raw bytes).
//!
//! Every call runs in a `tracing` span named `idem` and emits one event per
//! decision; counters go through the `metrics` facade (see [`crate::metrics`]).

use std::future::Future;
use std::time::{Duration, Instant};

use serde::de::DeserializeOwned;
use serde::Serialize;
use tracing::Instrument;

use crate::metrics;
use crate::record::{Begin, Claim, Outcome, OutcomeKind, State};
use crate::store::{BeginRequest, Store};
use crate::{AsKey, Error, Fingerprint, Key, Policy, Scope};

/// The longest pause between two looks at an in-progress key when the store
/// cannot wake waiters itself (another process completed it).
const MAX_POLL: Duration = Duration::from_millis(25);
const FIRST_POLL: Duration = Duration::from_millis(1);
/// The `Retry-After` hint given with [`Error::InProgress`].
const RETRY_AFTER: Duration = Duration::from_secs(1);

/// One idempotent invocation: which operation, which key, which payload, and
/// the policy. Key and fingerprint errors are kept and returned by [`run`],
/// so building a `Call` never fails.
#[derive(Debug)]
pub struct Call {
    scope: Scope,
    key: Result<Key, Error>,
    fingerprint: Result<Fingerprint, Error>,
    policy: Policy,
}

impl Call {
    /// A call of `scope` with the client's `key`, fingerprinted by the
    /// canonical JSON of `payload`, under the default [`Policy`].
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

    /// A call from already computed parts (what `#[idempotent]` expands to).
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
        }
    }

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

    /// The operation.
    pub fn scope(&self) -> &Scope {
        &self.scope
    }
}

/// How an operation's `Ok` value becomes the stored outcome bytes, and back.
pub trait Codec<T> {
    /// The bytes to store for `value`.
    fn encode(&self, value: &T) -> Result<Vec<u8>, Error>;
    /// The value that `bytes` (written by [`encode`](Codec::encode)) stands for.
    fn decode(&self, bytes: &[u8]) -> Result<T, Error>;
}

/// The default [`Codec`]: the value's JSON form, through `serde_json`.
#[derive(Clone, Copy, Debug, Default)]
pub struct Json;

impl<T: Serialize + DeserializeOwned> Codec<T> for Json {
    fn encode(&self, value: &T) -> Result<Vec<u8>, Error> {
        Ok(serde_json::to_vec(value)?)
    }

    fn decode(&self, bytes: &[u8]) -> Result<T, Error> {
        Ok(serde_json::from_slice(bytes)?)
    }
}

/// Runs `body` at most once per `(scope, key)` and replays its `Ok` value to
/// every later call; errors are released (a retry runs again). See the
/// [module documentation](self).
pub async fn run<S, T, E, Fut>(store: &S, call: Call, body: Fut) -> Result<T, E>
where
    S: Store + ?Sized,
    T: Serialize + DeserializeOwned,
    E: From<Error>,
    Fut: Future<Output = Result<T, E>>,
{
    run_with_codec(store, call, body, Json).await
}

/// Like [`run`], but the `Ok` value is stored and read back with `codec`
/// instead of JSON.
pub async fn run_with_codec<S, T, E, Fut, C>(
    store: &S,
    call: Call,
    body: Fut,
    codec: C,
) -> Result<T, E>
where
    S: Store + ?Sized,
    E: From<Error>,
    Fut: Future<Output = Result<T, E>>,
    C: Codec<T>,
{
    execute(
        store,
        call,
        body,
        codec,
        |_: &E| None,
        |_| {
            Err(Error::Config(
                "the stored outcome is an error, but this call does not replay errors \
             (was `replayable` removed from the operation?)"
                    .into(),
            ))
        },
    )
    .await
}

/// Like [`run`], but errors for which `replayable` answers `true` are stored
/// and replayed like results (permanent failures such as a declined card);
/// other errors are released.
pub async fn run_replaying<S, T, E, Fut, P>(
    store: &S,
    call: Call,
    body: Fut,
    replayable: P,
) -> Result<T, E>
where
    S: Store + ?Sized,
    T: Serialize + DeserializeOwned,
    E: From<Error> + Serialize + DeserializeOwned,
    Fut: Future<Output = Result<T, E>>,
    P: Fn(&E) -> bool,
{
    execute(
        store,
        call,
        body,
        Json,
        |err: &E| replayable(err).then(|| Json.encode(err)),
        |bytes| Json.decode(bytes),
    )
    .await
}

async fn execute<S, T, E, Fut, C, Enc, Dec>(
    store: &S,
    call: Call,
    body: Fut,
    codec: C,
    encode_err: Enc,
    decode_err: Dec,
) -> Result<T, E>
where
    S: Store + ?Sized,
    E: From<Error>,
    Fut: Future<Output = Result<T, E>>,
    C: Codec<T>,
    Enc: FnOnce(&E) -> Option<Result<Vec<u8>, Error>>,
    Dec: FnOnce(&[u8]) -> Result<E, Error>,
{
    let Call {
        scope,
        key,
        fingerprint,
        policy,
    } = call;
    let key = key?;
    let fingerprint = fingerprint?;
    check_policy(&policy)?;
    let span = tracing::info_span!("idem", scope = %scope, key = %key);
    async move {
        let started = Instant::now();
        let request = BeginRequest {
            scope: &scope,
            key: &key,
            fingerprint: &fingerprint,
            lease: policy.lease,
            ttl: policy.ttl,
        };
        let claim = match acquire(store, &request, &policy).await? {
            Acquired::Claimed(claim) => claim,
            Acquired::Replay(outcome) => {
                tracing::debug!(decision = "replayed", "replaying the stored outcome");
                metrics::replayed(&scope, started.elapsed());
                return match outcome.kind {
                    OutcomeKind::Ok => Ok(codec.decode(&outcome.body)?),
                    OutcomeKind::Err => Err(decode_err(&outcome.body)?),
                };
            }
        };
        if claim.is_takeover() {
            tracing::info!(
                decision = "taken over",
                fence = claim.fence,
                "claimed a lapsed or expired record"
            );
            metrics::taken_over(&scope);
        } else {
            tracing::debug!(
                decision = "claimed",
                fence = claim.fence,
                "running the operation"
            );
        }
        metrics::executed(&scope);

        let mut guard = AbandonGuard(Some(claim.fence));
        let result = body.await;
        guard.0 = None;

        let stored = match &result {
            Ok(value) => Some(codec.encode(value).map(|b| (OutcomeKind::Ok, b))),
            Err(err) => encode_err(err).map(|r| r.map(|b| (OutcomeKind::Err, b))),
        };
        match stored {
            Some(Ok((kind, body))) => {
                save(store, &claim, &Outcome { kind, body }).await?;
            }
            Some(Err(err)) => {
                release(store, &claim).await;
                return Err(err.into());
            }
            None => release(store, &claim).await,
        }
        result
    }
    .instrument(span)
    .await
}

fn check_policy(policy: &Policy) -> Result<(), Error> {
    if policy.ttl.is_zero() {
        return Err(Error::Config("the ttl must be longer than zero".into()));
    }
    if policy.lease.is_zero() {
        return Err(Error::Config("the lease must be longer than zero".into()));
    }
    Ok(())
}

enum Acquired {
    Claimed(Claim),
    Replay(Outcome),
}

async fn acquire<S: Store + ?Sized>(
    store: &S,
    request: &BeginRequest<'_>,
    policy: &Policy,
) -> Result<Acquired, Error> {
    let deadline = Instant::now() + policy.wait_bound();
    let mut step = FIRST_POLL;
    let mut waited = false;
    loop {
        match store.begin(request).await? {
            Begin::Claimed(claim) => return Ok(Acquired::Claimed(claim)),
            Begin::Replay(outcome) => return Ok(Acquired::Replay(outcome)),
            Begin::KeyReused => {
                tracing::info!(
                    decision = "key reused",
                    "the key was used with another payload"
                );
                metrics::key_reused(request.scope);
                return Err(Error::KeyReused);
            }
            Begin::InProgress { .. } => {
                let now = Instant::now();
                if now >= deadline {
                    tracing::info!(
                        decision = "in progress",
                        waited,
                        "another call holds the key"
                    );
                    metrics::in_progress(request.scope);
                    return Err(Error::InProgress {
                        retry_after: RETRY_AFTER,
                    });
                }
                if !waited {
                    tracing::debug!(
                        decision = "waiting",
                        "another call holds the key; waiting for its outcome"
                    );
                    waited = true;
                }
                store
                    .wait_for_change(request.scope, request.key, step.min(deadline - now))
                    .await?;
                step = (step * 2).min(MAX_POLL);
            }
        }
    }
}

/// Stores the outcome. A store error is retried twice; when the first
/// attempt's answer was lost but its write landed, the record shows it.
async fn save<S: Store + ?Sized>(store: &S, claim: &Claim, outcome: &Outcome) -> Result<(), Error> {
    let mut pause = Duration::from_millis(20);
    let mut attempt = 1;
    loop {
        match store.complete(claim, outcome).await {
            Ok(()) => return Ok(()),
            Err(Error::LeaseLost) if attempt > 1 && landed(store, claim).await => return Ok(()),
            Err(Error::LeaseLost) => {
                tracing::warn!(
                    decision = "lease lost",
                    fence = claim.fence,
                    "the outcome was not stored: another caller took the key over"
                );
                return Err(Error::LeaseLost);
            }
            Err(err @ Error::Store(_)) if attempt < 3 => {
                tracing::warn!(error = %err, attempt, "storing the outcome failed; retrying");
                tokio::time::sleep(pause).await;
                pause *= 5;
                attempt += 1;
            }
            Err(err) => {
                tracing::error!(error = %err, "storing the outcome failed; the claim stays until its lease runs out");
                return Err(err);
            }
        }
    }
}

async fn landed<S: Store + ?Sized>(store: &S, claim: &Claim) -> bool {
    matches!(
        store.get(&claim.scope, &claim.key).await,
        Ok(Some(r)) if r.state == State::Completed && r.fence == claim.fence
    )
}

async fn release<S: Store + ?Sized>(store: &S, claim: &Claim) {
    match store.release(claim).await {
        Ok(()) => tracing::debug!(
            decision = "released",
            "the operation failed; the key is free for a retry"
        ),
        Err(err) => {
            tracing::warn!(error = %err, "releasing the key failed; it frees itself when the lease runs out")
        }
    }
}

/// Logs a claim abandoned by a caller dropped while its body ran.
struct AbandonGuard(Option<i64>);

impl Drop for AbandonGuard {
    fn drop(&mut self) {
        if let Some(fence) = self.0 {
            tracing::warn!(
                decision = "abandoned",
                fence,
                "the caller was dropped while the operation ran; the key stays claimed until its lease runs out"
            );
        }
    }
}
