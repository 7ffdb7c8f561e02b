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
//! ## Transactional mode
//!
//! [`run_in_transaction`] writes the claim and the completion on the
//! caller's open transaction ([`TransactionalStore`]) and lends that
//! connection to the body, so the business rows and the record commit or
//! roll back together; the caller commits. A concurrent duplicate blocks on
//! the UNIQUE index until the first transaction ends, then replays (or runs,
//! if the first rolled back). A body error deletes the claim on the same
//! connection, so a transaction committed anyway does not leave the key in
//! progress.
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
use crate::record::{Begin, Claim, Outcome, OutcomeKind, Record, State};
use crate::store::{BeginRequest, Store, TransactionalStore};
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

    /// The parts, for the flows outside this module (entity mode).
    #[cfg(feature = "_sql")]
    pub(crate) fn into_parts(
        self,
    ) -> (
        Scope,
        Result<Key, Error>,
        Result<Fingerprint, Error>,
        Policy,
    ) {
        (self.scope, self.key, self.fingerprint, self.policy)
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
    on_pool(store, call, body, OkOnly(codec)).await
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
    on_pool(store, call, body, Replaying(replayable)).await
}

/// Transactional mode: like [`run`], but the claim and the completion are
/// written on `conn`, the caller's open transaction (or connection). The
/// body borrows the connection to write its own rows, and hands it back
/// with its result: `|conn| async move { let r = ...; (r, conn) }`. The
/// caller commits; see the [module documentation](self#transactional-mode).
pub async fn run_in_transaction<'c, S, C, T, E, F, Fut>(
    store: &S,
    conn: &'c mut C,
    call: Call,
    body: F,
) -> Result<T, E>
where
    S: TransactionalStore<C> + ?Sized,
    C: Send + ?Sized,
    T: Serialize + DeserializeOwned,
    E: From<Error>,
    F: FnOnce(&'c mut C) -> Fut,
    Fut: Future<Output = (Result<T, E>, &'c mut C)>,
{
    on_connection(store, conn, call, body, OkOnly(Json)).await
}

/// [`run_in_transaction`] with errors stored and replayed when `replayable`
/// says so, as in [`run_replaying`].
pub async fn run_in_transaction_replaying<'c, S, C, T, E, F, Fut, P>(
    store: &S,
    conn: &'c mut C,
    call: Call,
    body: F,
    replayable: P,
) -> Result<T, E>
where
    S: TransactionalStore<C> + ?Sized,
    C: Send + ?Sized,
    T: Serialize + DeserializeOwned,
    E: From<Error> + Serialize + DeserializeOwned,
    F: FnOnce(&'c mut C) -> Fut,
    Fut: Future<Output = (Result<T, E>, &'c mut C)>,
    P: Fn(&E) -> bool,
{
    on_connection(store, conn, call, body, Replaying(replayable)).await
}

async fn on_pool<S, T, E, Fut, O>(store: &S, call: Call, body: Fut, outcomes: O) -> Result<T, E>
where
    S: Store + ?Sized,
    E: From<Error>,
    Fut: Future<Output = Result<T, E>>,
    O: Outcomes<T, E>,
{
    let call = call.check()?;
    let span = call.span();
    async move {
        let mut records = Pooled(store);
        let claim = match claim_or_replay(&mut records, &call, &outcomes).await? {
            Ok(claim) => claim,
            Err(replayed) => return replayed,
        };
        let mut guard = AbandonGuard(Some(claim.fence));
        let result = body.await;
        guard.0 = None;
        finish(&mut records, &claim, result, &outcomes).await
    }
    .instrument(span)
    .await
}

async fn on_connection<'c, S, C, T, E, F, Fut, O>(
    store: &S,
    conn: &'c mut C,
    call: Call,
    body: F,
    outcomes: O,
) -> Result<T, E>
where
    S: TransactionalStore<C> + ?Sized,
    C: Send + ?Sized,
    E: From<Error>,
    F: FnOnce(&'c mut C) -> Fut,
    Fut: Future<Output = (Result<T, E>, &'c mut C)>,
    O: Outcomes<T, E>,
{
    let call = call.check()?;
    let span = call.span();
    async move {
        let mut records = OnConnection { store, conn };
        let claim = match claim_or_replay(&mut records, &call, &outcomes).await? {
            Ok(claim) => claim,
            Err(replayed) => return replayed,
        };
        let mut guard = AbandonGuard(Some(claim.fence));
        let (result, conn) = body(records.conn).await;
        guard.0 = None;
        let mut records = OnConnection { store, conn };
        finish(&mut records, &claim, result, &outcomes).await
    }
    .instrument(span)
    .await
}

/// A [`Call`] whose key and fingerprint are valid and whose policy is sane.
struct Checked {
    scope: Scope,
    key: Key,
    fingerprint: Fingerprint,
    policy: Policy,
    started: Instant,
}

impl Call {
    fn check(self) -> Result<Checked, Error> {
        let started = Instant::now();
        let Call {
            scope,
            key,
            fingerprint,
            policy,
        } = self;
        let (key, fingerprint) = (key?, fingerprint?);
        if policy.ttl.is_zero() {
            return Err(Error::Config("the ttl must be longer than zero".into()));
        }
        if policy.lease.is_zero() {
            return Err(Error::Config("the lease must be longer than zero".into()));
        }
        Ok(Checked {
            scope,
            key,
            fingerprint,
            policy,
            started,
        })
    }
}

impl Checked {
    fn span(&self) -> tracing::Span {
        tracing::info_span!("idem", scope = %self.scope, key = %self.key)
    }

    fn request(&self) -> BeginRequest<'_> {
        BeginRequest {
            scope: &self.scope,
            key: &self.key,
            fingerprint: &self.fingerprint,
            lease: self.policy.lease,
            ttl: self.policy.ttl,
        }
    }
}

/// How a result becomes a stored outcome, and back.
trait Outcomes<T, E> {
    /// The outcome to store for `result`, or `None` to release the key.
    fn encode(&self, result: &Result<T, E>) -> Option<Result<Outcome, Error>>;
    /// The result a stored outcome stands for.
    fn decode(&self, outcome: &Outcome) -> Result<Result<T, E>, Error>;
}

/// `Ok` values through a codec; errors are never stored.
struct OkOnly<C>(C);

impl<T, E, C: Codec<T>> Outcomes<T, E> for OkOnly<C> {
    fn encode(&self, result: &Result<T, E>) -> Option<Result<Outcome, Error>> {
        let value = result.as_ref().ok()?;
        Some(self.0.encode(value).map(|body| Outcome {
            kind: OutcomeKind::Ok,
            body,
        }))
    }

    fn decode(&self, outcome: &Outcome) -> Result<Result<T, E>, Error> {
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

/// `Ok` values and the errors the predicate accepts, as JSON.
struct Replaying<P>(P);

impl<T, E, P> Outcomes<T, E> for Replaying<P>
where
    T: Serialize + DeserializeOwned,
    E: Serialize + DeserializeOwned,
    P: Fn(&E) -> bool,
{
    fn encode(&self, result: &Result<T, E>) -> Option<Result<Outcome, Error>> {
        let (kind, body) = match result {
            Ok(value) => (OutcomeKind::Ok, Json.encode(value)),
            Err(err) if (self.0)(err) => (OutcomeKind::Err, Json.encode(err)),
            Err(_) => return None,
        };
        Some(body.map(|body| Outcome { kind, body }))
    }

    fn decode(&self, outcome: &Outcome) -> Result<Result<T, E>, Error> {
        Ok(match outcome.kind {
            OutcomeKind::Ok => Ok(Json.decode(&outcome.body)?),
            OutcomeKind::Err => Err(Json.decode(&outcome.body)?),
        })
    }
}

/// Where the record statements run: the store's own pool, or the caller's
/// connection in transactional mode.
#[async_trait::async_trait]
trait Records: Send {
    async fn begin(&mut self, request: &BeginRequest<'_>) -> Result<Begin, Error>;
    async fn complete(&mut self, claim: &Claim, outcome: &Outcome) -> Result<(), Error>;
    async fn release(&mut self, claim: &Claim) -> Result<(), Error>;
    /// The record, when the answer to a completion was lost.
    async fn get(&mut self, claim: &Claim) -> Result<Option<Record>, Error>;
    async fn wait_for_change(
        &mut self,
        request: &BeginRequest<'_>,
        timeout: Duration,
    ) -> Result<(), Error>;
    /// Whether a failed completion may be tried again: not inside a
    /// transaction, where the failed statement may have aborted it.
    fn retries_completion(&self) -> bool;
}

struct Pooled<'a, S: ?Sized>(&'a S);

#[async_trait::async_trait]
impl<S: Store + ?Sized> Records for Pooled<'_, S> {
    async fn begin(&mut self, request: &BeginRequest<'_>) -> Result<Begin, Error> {
        self.0.begin(request).await
    }
    async fn complete(&mut self, claim: &Claim, outcome: &Outcome) -> Result<(), Error> {
        self.0.complete(claim, outcome).await
    }
    async fn release(&mut self, claim: &Claim) -> Result<(), Error> {
        self.0.release(claim).await
    }
    async fn get(&mut self, claim: &Claim) -> Result<Option<Record>, Error> {
        self.0.get(&claim.scope, &claim.key).await
    }
    async fn wait_for_change(
        &mut self,
        request: &BeginRequest<'_>,
        timeout: Duration,
    ) -> Result<(), Error> {
        self.0
            .wait_for_change(request.scope, request.key, timeout)
            .await
    }
    fn retries_completion(&self) -> bool {
        true
    }
}

struct OnConnection<'s, 'c, S: ?Sized, C: ?Sized> {
    store: &'s S,
    conn: &'c mut C,
}

#[async_trait::async_trait]
impl<S, C> Records for OnConnection<'_, '_, S, C>
where
    S: TransactionalStore<C> + ?Sized,
    C: Send + ?Sized,
{
    async fn begin(&mut self, request: &BeginRequest<'_>) -> Result<Begin, Error> {
        self.store.begin_on(self.conn, request).await
    }
    async fn complete(&mut self, claim: &Claim, outcome: &Outcome) -> Result<(), Error> {
        self.store.complete_on(self.conn, claim, outcome).await
    }
    async fn release(&mut self, claim: &Claim) -> Result<(), Error> {
        self.store.release_on(self.conn, claim).await
    }
    async fn get(&mut self, _claim: &Claim) -> Result<Option<Record>, Error> {
        Ok(None)
    }
    async fn wait_for_change(
        &mut self,
        _request: &BeginRequest<'_>,
        timeout: Duration,
    ) -> Result<(), Error> {
        // Another transaction's in-progress claim (a record-mode call on the
        // same table) is only visible once committed: poll.
        tokio::time::sleep(timeout).await;
        Ok(())
    }
    fn retries_completion(&self) -> bool {
        false
    }
}

/// Claims the key (waiting for an in-progress call as the policy says), or
/// returns the replayed result as `Err`.
async fn claim_or_replay<R, T, E, O>(
    records: &mut R,
    call: &Checked,
    outcomes: &O,
) -> Result<Result<Claim, Result<T, E>>, Error>
where
    R: Records,
    O: Outcomes<T, E>,
{
    let request = call.request();
    let deadline = Instant::now() + call.policy.wait_bound();
    let mut step = FIRST_POLL;
    let mut waited = false;
    let claim = loop {
        match records.begin(&request).await? {
            Begin::Claimed(claim) => break claim,
            Begin::Replay(outcome) => {
                tracing::debug!(decision = "replayed", "replaying the stored outcome");
                let replayed = outcomes.decode(&outcome)?;
                metrics::replayed(&call.scope, call.started.elapsed());
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
            Begin::InProgress { .. } => {
                let now = Instant::now();
                if now >= deadline {
                    tracing::info!(
                        decision = "in progress",
                        waited,
                        "another call holds the key"
                    );
                    metrics::in_progress(&call.scope);
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
                records
                    .wait_for_change(&request, step.min(deadline - now))
                    .await?;
                step = (step * 2).min(MAX_POLL);
            }
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

/// Stores the body's result (or releases the key) and returns it.
async fn finish<R, T, E, O>(
    records: &mut R,
    claim: &Claim,
    result: Result<T, E>,
    outcomes: &O,
) -> Result<T, E>
where
    R: Records,
    E: From<Error>,
    O: Outcomes<T, E>,
{
    match outcomes.encode(&result) {
        Some(Ok(outcome)) => save(records, claim, &outcome).await?,
        Some(Err(err)) => {
            release(records, claim).await;
            return Err(err.into());
        }
        None => release(records, claim).await,
    }
    result
}

/// Stores the outcome. Outside a transaction a store error is retried
/// twice; when an attempt's answer was lost but its write landed, the record
/// shows it.
async fn save<R: Records>(records: &mut R, claim: &Claim, outcome: &Outcome) -> Result<(), Error> {
    let mut pause = Duration::from_millis(20);
    let mut attempt = 1;
    loop {
        match records.complete(claim, outcome).await {
            Ok(()) => return Ok(()),
            Err(Error::LeaseLost) if attempt > 1 && landed(records, claim).await => return Ok(()),
            Err(Error::LeaseLost) => {
                tracing::warn!(
                    decision = "lease lost",
                    fence = claim.fence,
                    "the outcome was not stored: another caller took the key over"
                );
                return Err(Error::LeaseLost);
            }
            Err(err @ Error::Store(_)) if attempt < 3 && records.retries_completion() => {
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

async fn landed<R: Records>(records: &mut R, claim: &Claim) -> bool {
    matches!(
        records.get(claim).await,
        Ok(Some(r)) if r.state == State::Completed && r.fence == claim.fence
    )
}

async fn release<R: Records>(records: &mut R, claim: &Claim) {
    match records.release(claim).await {
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
