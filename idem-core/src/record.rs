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

use std::time::{Duration, SystemTime, UNIX_EPOCH};

use crate::{Fingerprint, Key, Scope};

/// Milliseconds since the Unix epoch: the time base of every store.
pub type Millis = i64;

/// The current time in [`Millis`].
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
    /// +1 at every claim; a completion must present it.
    pub fence: i64,
    /// While in progress: when the claim may be taken over.
    pub lease_until: Option<Millis>,
    /// The outcome, once completed.
    pub outcome: Option<Outcome>,
    /// When the record was claimed.
    pub created_at: Millis,
    /// When the key becomes free again.
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

/// A caller's hold on a key: proof that it may run the operation and store
/// its outcome, as long as the fence still matches.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Claim {
    /// The operation.
    pub scope: Scope,
    /// The key.
    pub key: Key,
    /// The fence this claim was granted with.
    pub fence: i64,
    /// How long the completed record is kept.
    pub ttl: Duration,
}

impl Claim {
    /// Whether this claim replaced an earlier record (an expired one, or one
    /// whose lease lapsed) rather than inserting a fresh one.
    pub fn is_takeover(&self) -> bool {
        self.fence > 1
    }
}

/// What a store answers to [`Store::begin`](crate::Store::begin).
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
}

/// The state machine's answer to a caller whose claim found `record`.
///
/// - any state, other fingerprint: [`Begin::KeyReused`];
/// - completed, same fingerprint: [`Begin::Replay`];
/// - in progress with a valid lease: [`Begin::InProgress`];
/// - anything free (expired, or a lapsed lease): [`Decision::Retry`], since
///   only the atomic claim may hand out a key.
pub fn decide(record: &Record, fingerprint: &Fingerprint, now: Millis) -> Decision {
    if record.expires_at <= now {
        return Decision::Retry;
    }
    if record.fingerprint != *fingerprint {
        return Decision::Answer(Begin::KeyReused);
    }
    match (record.state, &record.outcome, record.lease_until) {
        (State::Completed, Some(outcome), _) => Decision::Answer(Begin::Replay(outcome.clone())),
        (State::InProgress, _, Some(lease_until)) if lease_until > now => {
            Decision::Answer(Begin::InProgress { lease_until })
        }
        // A completed record without an outcome cannot be written by this
        // library; treat it, like a lapsed lease, as free for the claim.
        _ => Decision::Retry,
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
            Decision::Answer(Begin::InProgress { lease_until: 2_000 })
        );
        assert_eq!(decide(&running, &fp, 2_000), Decision::Retry);
        assert_eq!(decide(&done, &other, 10_000), Decision::Retry);
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
