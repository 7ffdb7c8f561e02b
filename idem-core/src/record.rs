//! The record, its two states, and the one place where a stored record is
//! turned into a decision.
//!
//! ```text
//!                 begin: no live record, or expired
//!  (none) ───────────────────────────────────────────▶ in_progress(fence = f+1)
//!                                                          │   │
//!        begin, same fingerprint, lease expired: takeover ─┘   │ complete(fence f)
//!                                                              ▼
//!  release(fence f): row deleted ◀── in_progress          completed ── begin, same
//!                                                              fingerprint: Replay
//! ```
//!
//! A store performs the *claim* (insert, or take over an expired record or a
//! lapsed lease) as one atomic conditional write. When the write does not
//! claim, the store hands the record it found to [`decide`], so every backend
//! answers a duplicate in exactly the same way.
//!
//! The types and functions here are public on purpose, for implementations
//! of [`Store`](crate::store::Store) outside this crate: a store grants claims with
//! [`Claim::granted`], answers duplicates with [`decide`] (and
//! [`Record::holds_lease`] while it waits), and may keep [`State`],
//! [`OutcomeKind`] and [`ClaimToken`] in the same stored forms as the
//! built-in stores ([`State::as_str`], [`OutcomeKind::code`],
//! [`ClaimToken::as_bytes`]). Time is the store's: [`Millis`] read from its
//! database's clock.

use std::collections::hash_map::RandomState;
use std::hash::{BuildHasher, Hasher};
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::OnceLock;
use std::time::{Duration, SystemTime, UNIX_EPOCH};

use crate::fingerprint::Fingerprint;
use crate::key::{Key, Scope};

/// Milliseconds since the Unix epoch: the time base of every store. The SQL
/// stores read it from the database's clock, never from the process's.
pub type Millis = i64;

/// This process's wall clock in [`Millis`]: where the in-memory store's
/// time starts (the process is its database; it counts on from there on
/// the monotonic clock). The SQL stores never use it for a lease or an
/// expiry.
pub fn now_millis() -> Millis {
    SystemTime::now()
        .duration_since(UNIX_EPOCH)
        .map(|d| d.as_millis() as Millis)
        .unwrap_or(0)
}

/// A duration in [`Millis`], saturating.
pub fn duration_millis(d: Duration) -> Millis {
    Millis::try_from(d.as_millis()).unwrap_or(Millis::MAX)
}

/// The identity of one claim attempt: sixteen bytes that no other attempt
/// uses, for any key, in any process.
///
/// Every fenced statement (renewal, completion, release) names the token,
/// so nothing presented by an earlier claim is ever accepted against a
/// later one, whatever happened in between: a takeover, a release, an
/// expiry or a purge that deleted the row and let the fence start again.
/// The token is drawn before the claim is sent, so a claim whose answer was
/// lost can still be recognized (and handed back) by its token.
#[derive(Clone, Copy, PartialEq, Eq, Hash)]
pub struct ClaimToken([u8; 16]);

impl ClaimToken {
    /// A token no other attempt uses: a random number drawn once per
    /// process from the operating system's randomness, then a counter.
    pub fn new() -> Self {
        static PROCESS: OnceLock<u64> = OnceLock::new();
        static COUNTER: AtomicU64 = AtomicU64::new(0);
        let process = *PROCESS.get_or_init(|| {
            // `RandomState` is seeded from the operating system's randomness.
            let mut hasher = RandomState::new().build_hasher();
            hasher.write_u32(std::process::id());
            hasher.write_u128(
                SystemTime::now()
                    .duration_since(UNIX_EPOCH)
                    .map(|d| d.as_nanos())
                    .unwrap_or(0),
            );
            hasher.finish()
        });
        let mut token = [0; 16];
        token[..8].copy_from_slice(&process.to_be_bytes());
        token[8..].copy_from_slice(&COUNTER.fetch_add(1, Ordering::Relaxed).to_be_bytes());
        ClaimToken(token)
    }

    /// A token as stored.
    pub fn from_bytes(bytes: [u8; 16]) -> Self {
        ClaimToken(bytes)
    }

    /// The stored form.
    pub fn as_bytes(&self) -> &[u8; 16] {
        &self.0
    }
}

impl Default for ClaimToken {
    fn default() -> Self {
        Self::new()
    }
}

impl std::fmt::Debug for ClaimToken {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        for b in &self.0 {
            write!(f, "{b:02x}")?;
        }
        Ok(())
    }
}

/// Where a record is in its life.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum State {
    /// A caller holds the claim and is running the operation.
    InProgress,
    /// The operation finished and its outcome is stored.
    Completed,
}

impl State {
    /// The stored spelling.
    pub fn as_str(self) -> &'static str {
        match self {
            State::InProgress => "in_progress",
            State::Completed => "completed",
        }
    }

    /// Parses the stored spelling.
    pub fn parse(s: &str) -> Option<Self> {
        match s {
            "in_progress" => Some(State::InProgress),
            "completed" => Some(State::Completed),
            _ => None,
        }
    }
}

/// Whether a stored outcome is a success or a replayable error.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum OutcomeKind {
    /// The operation's `Ok` value.
    Ok,
    /// An error the caller marked replayable.
    Err,
}

impl OutcomeKind {
    /// The stored code (`0` ok, `1` error).
    pub fn code(self) -> i16 {
        match self {
            OutcomeKind::Ok => 0,
            OutcomeKind::Err => 1,
        }
    }

    /// Parses the stored code.
    pub fn from_code(code: i64) -> Option<Self> {
        match code {
            0 => Some(OutcomeKind::Ok),
            1 => Some(OutcomeKind::Err),
            _ => None,
        }
    }
}

/// A stored result: its kind and its serialized bytes (JSON in record mode).
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Outcome {
    /// Success or replayable error.
    pub kind: OutcomeKind,
    /// The serialized value.
    pub body: Vec<u8>,
}

/// How an [`Error::Unrecorded`](crate::Error::Unrecorded) outcome's body
/// begins, the reason following as UTF-8. It is an error outcome, whose
/// other bodies are always a replayable error's JSON (the engine's own
/// codec for errors), which never begins with a NUL byte: a user's codec
/// writes only `Ok` outcomes, which are never read for it.
const UNRECORDED: &[u8] = b"\0idem:unrecorded\0";

impl Outcome {
    /// The outcome stored in place of a result that could not be encoded
    /// (`reason` says why): its replays answer
    /// [`Error::Unrecorded`](crate::Error::Unrecorded).
    pub fn unrecorded(reason: &str) -> Outcome {
        Outcome {
            kind: OutcomeKind::Err,
            body: [UNRECORDED, reason.as_bytes()].concat(),
        }
    }

    /// Why the result this outcome stands in for could not be encoded, if
    /// it is [`Outcome::unrecorded`]'s.
    #[inline]
    pub fn unrecorded_reason(&self) -> Option<String> {
        match self.kind {
            OutcomeKind::Err => self
                .body
                .strip_prefix(UNRECORDED)
                .map(|reason| String::from_utf8_lossy(reason).into_owned()),
            OutcomeKind::Ok => None,
        }
    }
}

/// One idempotency record, unique per `(scope, key)`.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Record {
    /// The operation (and principal).
    pub scope: Scope,
    /// The client's key.
    pub key: Key,
    /// The fingerprint of the payload that claimed the key.
    pub fingerprint: Fingerprint,
    /// In progress or completed.
    pub state: State,
    /// +1 at every takeover, 1 for a fresh row: how many times the key was
    /// claimed since the row was inserted (for logs and metrics; the
    /// [`token`](Record::token) is what fenced writes check).
    pub fence: i64,
    /// The claim that wrote the record (`None` for rows written before
    /// tokens were stored).
    pub token: Option<ClaimToken>,
    /// While in progress: when the claim may be taken over.
    pub lease_until: Option<Millis>,
    /// The outcome, once completed.
    pub outcome: Option<Outcome>,
    /// When the record was claimed.
    pub created_at: Millis,
    /// When the key becomes free again. While in progress, never before the
    /// lease runs out.
    pub expires_at: Millis,
}

impl Record {
    /// Whether the record is in progress under a lease that has not run
    /// out at `now`: a duplicate must wait (or fail fast) rather than claim.
    pub fn holds_lease(&self, now: Millis) -> bool {
        self.state == State::InProgress
            && self.expires_at > now
            && self.lease_until.is_some_and(|lease| lease > now)
    }
}

/// What a caller asks of [`Store::begin`](crate::store::Store::begin).
#[derive(Clone, Copy, Debug)]
pub struct BeginRequest<'a> {
    /// The operation.
    pub scope: &'a Scope,
    /// The client's key.
    pub key: &'a Key,
    /// The payload's fingerprint.
    pub fingerprint: &'a Fingerprint,
    /// This attempt's identity: written with the claim, and recognized when
    /// the same request is sent again after its answer was lost.
    pub token: ClaimToken,
    /// How long the claim is held before it may be taken over, unless
    /// renewed.
    pub lease: Duration,
    /// How long the completed record is kept. An in-progress record is kept
    /// at least as long as its lease.
    pub ttl: Duration,
}

/// A caller's hold on a key: proof that it may run the operation, renew
/// its lease and store its outcome, as long as the record still carries
/// its token.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Claim {
    /// The operation.
    pub scope: Scope,
    /// The key.
    pub key: Key,
    /// The fence this claim was granted with (1 for a fresh row).
    pub fence: i64,
    /// The attempt's identity, checked by every fenced write.
    pub token: ClaimToken,
    /// How long a renewal extends the lease.
    pub lease: Duration,
    /// How long the completed record is kept.
    pub ttl: Duration,
}

impl Claim {
    /// The claim that `request` was granted with `fence`.
    pub fn granted(request: &BeginRequest<'_>, fence: i64) -> Self {
        Claim {
            scope: request.scope.clone(),
            key: request.key.clone(),
            fence,
            token: request.token,
            lease: request.lease,
            ttl: request.ttl,
        }
    }

    /// Whether this claim replaced an earlier record (an expired one, or one
    /// whose lease lapsed) rather than inserting a fresh one.
    pub fn is_takeover(&self) -> bool {
        self.fence > 1
    }
}

/// What a store answers to [`Store::begin`](crate::store::Store::begin).
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum Begin {
    /// The caller holds the key: run the operation, then complete or release.
    Claimed(Claim),
    /// The operation already completed with the same payload: here is its outcome.
    Replay(Outcome),
    /// The key was claimed with a different payload.
    KeyReused,
    /// Another caller holds a valid lease on the key.
    InProgress {
        /// When that lease runs out.
        lease_until: Millis,
        /// How long that lease had left when the record was read: the
        /// soonest the key can move should its holder be gone.
        lease_left: Duration,
    },
}

/// What the existing record means for a new caller; see [`decide`].
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum Decision {
    /// Answer the caller with this.
    Answer(Begin),
    /// The record is free (expired, or its lease lapsed) but the atomic claim
    /// did not take it: the record changed between the write and the read.
    /// Try the claim again.
    Retry,
    /// The record cannot have been written by this library.
    Corrupt(&'static str),
}

impl Decision {
    /// The answer, or `None` to claim again; a corrupt record is a store
    /// error naming what is wrong.
    pub fn answer(self) -> Result<Option<Begin>, crate::error::Error> {
        match self {
            Decision::Answer(answer) => Ok(Some(answer)),
            Decision::Retry => Ok(None),
            Decision::Corrupt(what) => Err(crate::error::Error::store(format!(
                "corrupt idempotency record: {what}"
            ))),
        }
    }
}

/// The state machine's answer to a caller whose claim found `record` at
/// `now` (the database's time, read with the record).
///
/// - in progress under the caller's own token (a claim whose answer was
///   lost, sent again): [`Begin::Claimed`];
/// - any state, other fingerprint: [`Begin::KeyReused`];
/// - completed, same fingerprint: [`Begin::Replay`];
/// - in progress with a valid lease: [`Begin::InProgress`];
/// - anything free (expired, or a lapsed lease): [`Decision::Retry`], since
///   only the atomic claim may hand out a key.
pub fn decide(request: &BeginRequest<'_>, record: &Record, now: Millis) -> Decision {
    if record.state == State::InProgress && record.token == Some(request.token) {
        return Decision::Answer(Begin::Claimed(Claim::granted(request, record.fence)));
    }
    if record.expires_at <= now {
        return Decision::Retry;
    }
    let fingerprint = request.fingerprint;
    if record.fingerprint != *fingerprint {
        return Decision::Answer(Begin::KeyReused);
    }
    match (record.state, &record.outcome, record.lease_until) {
        (State::Completed, Some(outcome), _) => Decision::Answer(Begin::Replay(outcome.clone())),
        (State::InProgress, _, Some(lease_until)) if lease_until > now => {
            Decision::Answer(Begin::InProgress {
                lease_until,
                lease_left: Duration::from_millis(
                    u64::try_from(lease_until.saturating_sub(now)).unwrap_or(0),
                ),
            })
        }
        (State::InProgress, _, Some(_)) => Decision::Retry,
        // A completed record without an outcome, or one in progress without
        // a lease, cannot be written by this library: say so rather than
        // claim it again and again.
        (State::Completed, None, _) => Decision::Corrupt("a completed record without an outcome"),
        (State::InProgress, _, None) => Decision::Corrupt("a record in progress without a lease"),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn record(state: State, fp: &Fingerprint) -> Record {
        Record {
            scope: Scope::new("op"),
            key: Key::new("k").unwrap(),
            fingerprint: *fp,
            state,
            fence: 1,
            token: Some(ClaimToken::new()),
            lease_until: (state == State::InProgress).then_some(2_000),
            outcome: (state == State::Completed).then(|| Outcome {
                kind: OutcomeKind::Ok,
                body: b"1".to_vec(),
            }),
            created_at: 0,
            expires_at: 10_000,
        }
    }

    #[test]
    fn decisions() {
        let fp = Fingerprint::of_bytes(b"a");
        let other = Fingerprint::of_bytes(b"b");
        let (scope, key) = (Scope::new("op"), Key::new("k").unwrap());
        let request = |fingerprint| BeginRequest {
            scope: &scope,
            key: &key,
            fingerprint,
            token: ClaimToken::new(),
            lease: Duration::from_secs(1),
            ttl: Duration::from_secs(10),
        };
        let decide = |record: &Record, fp, now| decide(&request(fp), record, now);
        let done = record(State::Completed, &fp);
        let running = record(State::InProgress, &fp);
        assert!(matches!(
            decide(&done, &fp, 1_000),
            Decision::Answer(Begin::Replay(_))
        ));
        assert_eq!(
            decide(&done, &other, 1_000),
            Decision::Answer(Begin::KeyReused)
        );
        assert_eq!(
            decide(&running, &other, 1_000),
            Decision::Answer(Begin::KeyReused)
        );
        assert_eq!(
            decide(&running, &fp, 1_000),
            Decision::Answer(Begin::InProgress {
                lease_until: 2_000,
                lease_left: Duration::from_millis(1_000),
            })
        );
        assert_eq!(decide(&running, &fp, 2_000), Decision::Retry);
        assert_eq!(decide(&done, &other, 10_000), Decision::Retry);
    }

    #[test]
    fn a_claim_sent_again_finds_itself() {
        let fp = Fingerprint::of_bytes(b"a");
        let (scope, key) = (Scope::new("op"), Key::new("k").unwrap());
        let mut running = record(State::InProgress, &fp);
        let request = BeginRequest {
            scope: &scope,
            key: &key,
            fingerprint: &fp,
            token: running.token.unwrap(),
            lease: Duration::from_secs(1),
            ttl: Duration::from_secs(10),
        };
        assert!(matches!(
            decide(&request, &running, 1_000),
            Decision::Answer(Begin::Claimed(c)) if c.token == request.token
        ));
        running.token = Some(ClaimToken::new());
        assert!(matches!(
            decide(&request, &running, 1_000),
            Decision::Answer(Begin::InProgress { .. })
        ));
    }

    #[test]
    fn corrupt_records_are_errors_not_loops() {
        let fp = Fingerprint::of_bytes(b"a");
        let (scope, key) = (Scope::new("op"), Key::new("k").unwrap());
        let request = BeginRequest {
            scope: &scope,
            key: &key,
            fingerprint: &fp,
            token: ClaimToken::new(),
            lease: Duration::from_secs(1),
            ttl: Duration::from_secs(10),
        };
        let mut no_lease = record(State::InProgress, &fp);
        no_lease.lease_until = None;
        let mut no_outcome = record(State::Completed, &fp);
        no_outcome.outcome = None;
        for corrupt in [no_lease, no_outcome] {
            assert!(decide(&request, &corrupt, 1_000).answer().is_err());
        }
    }

    #[test]
    fn tokens_never_repeat() {
        let tokens: std::collections::HashSet<_> = (0..10_000).map(|_| ClaimToken::new()).collect();
        assert_eq!(tokens.len(), 10_000);
    }

    #[test]
    fn spellings_round_trip() {
        for s in [State::InProgress, State::Completed] {
            assert_eq!(State::parse(s.as_str()), Some(s));
        }
        for k in [OutcomeKind::Ok, OutcomeKind::Err] {
            assert_eq!(OutcomeKind::from_code(k.code().into()), Some(k));
        }
    }
}
