//! The step journal: what a store keeps of an operation's durable steps
//! (`idem::steps`), and the one place where a journaled step is turned
//! into a decision.
//!
//! An operation's steps are numbered in the order its body calls them
//! (`seq`, from 0). Each has at most one journal entry per `(scope, key,
//! seq)`:
//!
//! ```text
//!  (none) ── begin ──▶ started(token) ── complete ──▶ completed(output)
//!                        │    ▲
//!   a later attempt:     │    └── adopted by a later attempt (rerun),
//!   in doubt ◀───────────┘        or by an operator's "allow a rerun"
//! ```
//!
//! Every journal write is fenced by the operation's claim: it lands only
//! while the operation's record is in progress under the claim's token, so
//! an attempt that lost its claim (a zombie) writes nothing the attempt
//! that took it over can see. Entries outlive a released claim (a body
//! error, a dropped caller): a retry replays the steps that completed. An
//! entry is kept for the operation's ttl from its last write, and at least
//! as long as the record of each later claim of its operation
//! ([`Store::begin`](crate::store::Store::begin)); it is deleted with its record
//! by a forget.
//!
//! The types here are public for implementations of
//! [`Store`](crate::store::Store) outside this crate, as [`record`](crate::record)'s
//! are: a store answers [`Journal::begin_step`](crate::store::Journal::begin_step)
//! with [`decide_step`], and writes what it says.

use std::time::Duration;

use crate::fingerprint::Fingerprint;
use crate::key::{Key, Scope};
use crate::record::{Claim, ClaimToken, Millis};

/// Where a journal entry is in its life.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum StepState {
    /// The step was started by the attempt whose token the entry carries,
    /// and has no journaled outcome: if that attempt is gone, the step is
    /// in doubt.
    Started,
    /// The step's output is journaled.
    Completed,
    /// An operator allowed an in-doubt step to run again: the next
    /// attempt runs it (with the same derived key) without asking.
    RerunAllowed,
}

impl StepState {
    /// The stored spelling.
    pub fn as_str(self) -> &'static str {
        match self {
            StepState::Started => "started",
            StepState::Completed => "completed",
            StepState::RerunAllowed => "rerun_allowed",
        }
    }

    /// Parses the stored spelling.
    pub fn parse(s: &str) -> Option<Self> {
        match s {
            "started" => Some(StepState::Started),
            "completed" => Some(StepState::Completed),
            "rerun_allowed" => Some(StepState::RerunAllowed),
            _ => None,
        }
    }
}

/// One journal entry: a step of the operation `(scope, key)`.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct StepRecord {
    /// The operation.
    pub scope: Scope,
    /// The operation's key.
    pub key: Key,
    /// The step's place in the operation, from 0.
    pub seq: u32,
    /// The step's name.
    pub name: String,
    /// The fingerprint of the operation's payload.
    pub fingerprint: Fingerprint,
    /// Started, completed, or allowed to run again.
    pub state: StepState,
    /// The attempt that wrote the entry last.
    pub token: ClaimToken,
    /// The step's journaled output, once completed.
    pub output: Option<Vec<u8>>,
    /// When the entry was last written.
    pub updated_at: Millis,
    /// When the entry is forgotten.
    pub expires_at: Millis,
}

/// What an attempt asks of [`Journal::begin_step`](crate::store::Journal::begin_step),
/// and names the step by in the journal's other writes.
#[derive(Clone, Copy, Debug)]
pub struct StepRequest<'a> {
    /// The claim of the attempt that asks, which holds the operation
    /// (`claim.scope`, `claim.key`): every write of the journal is fenced
    /// by it.
    pub claim: &'a Claim,
    /// The step's place in the operation, from 0.
    pub seq: u32,
    /// The step's name.
    pub name: &'a str,
    /// The fingerprint of the operation's payload.
    pub fingerprint: &'a Fingerprint,
    /// How long the entry is kept after each write.
    pub ttl: Duration,
    /// Whether a step in doubt (started by an attempt that is gone) is
    /// taken over by this attempt, to run again; otherwise it is answered
    /// [`StepBegin::InDoubt`] and left as it is.
    pub adopt: bool,
    /// How long after an attempt started the step its downstream call may
    /// still land (`idem::steps::Step::settle`): a step
    /// started by an attempt that is gone, less than this long ago, is
    /// answered [`StepBegin::InFlight`] and neither adopted nor in doubt.
    pub settle: Duration,
}

/// Why a step runs.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum StepRun {
    /// It was never started (or its entry expired).
    Fresh,
    /// This attempt started it already: its begin is sent again.
    Again,
    /// It was in doubt, and this attempt took it over to run again.
    Adopted,
    /// An operator allowed it to run again.
    Allowed,
}

/// What a store answers to [`Journal::begin_step`](crate::store::Journal::begin_step).
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum StepBegin {
    /// The entry now says this attempt started the step: run it.
    Run(StepRun),
    /// The step completed: here is its journaled output.
    Replay(Vec<u8>),
    /// An attempt that is gone started the step and journaled no outcome,
    /// and the request did not adopt it. Nothing was written.
    InDoubt {
        /// When that attempt wrote the entry.
        since: Millis,
    },
    /// An attempt that is gone started the step less than the request's
    /// settle window ago: its downstream call may still land, so neither
    /// its absence downstream nor a second call can be trusted yet.
    /// Nothing was written.
    InFlight {
        /// When the window closes, from the store's now.
        retry_after: Duration,
    },
    /// The journal holds another step at this place: the body calls its
    /// steps in another order, or under other names, than the run that
    /// wrote the journal.
    Mismatch {
        /// The name journaled at this place.
        journaled: String,
    },
    /// The journal was written for another payload under the same key.
    KeyReused,
}

/// What a store must write for a [`StepRequest`]: [`decide_step`]'s
/// answer, which the store applies in the same atomic step in which it
/// read the entry.
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum StepDecision {
    /// Write nothing; answer this.
    Answer(StepBegin),
    /// Write the entry `started` under the request's token (a new entry,
    /// or one replacing what was there), then answer [`StepBegin::Run`].
    Start(StepRun),
}

/// The journal's answer to the attempt of `request.claim` that begins
/// step `request` and finds `entry` at `now` (the database's time).
pub fn decide_step(
    request: &StepRequest<'_>,
    entry: Option<&StepRecord>,
    now: Millis,
) -> StepDecision {
    let Some(entry) = entry.filter(|entry| entry.expires_at > now) else {
        return StepDecision::Start(StepRun::Fresh);
    };
    if entry.fingerprint != *request.fingerprint {
        return StepDecision::Answer(StepBegin::KeyReused);
    }
    if entry.name != request.name {
        return StepDecision::Answer(StepBegin::Mismatch {
            journaled: entry.name.clone(),
        });
    }
    match entry.state {
        StepState::Completed => {
            StepDecision::Answer(StepBegin::Replay(entry.output.clone().unwrap_or_default()))
        }
        StepState::Started if entry.token == request.claim.token => {
            StepDecision::Answer(StepBegin::Run(StepRun::Again))
        }
        StepState::Started if now < settled_at(entry, request) => {
            let left = settled_at(entry, request).saturating_sub(now);
            StepDecision::Answer(StepBegin::InFlight {
                retry_after: Duration::from_millis(u64::try_from(left).unwrap_or(0)),
            })
        }
        StepState::Started if request.adopt => StepDecision::Start(StepRun::Adopted),
        StepState::Started => StepDecision::Answer(StepBegin::InDoubt {
            since: entry.updated_at,
        }),
        StepState::RerunAllowed => StepDecision::Start(StepRun::Allowed),
    }
}

/// When the call that started `entry` can no longer land, by the store's
/// clock: its start plus the request's settle window.
fn settled_at(entry: &StepRecord, request: &StepRequest<'_>) -> Millis {
    entry
        .updated_at
        .saturating_add(crate::record::duration_millis(request.settle))
}

/// A step's place in the journal: the operation `(scope, key)`, and the
/// step's `seq` and `name` in it. What an operator names when settling
/// a step ([`Journal::resolve_step`](crate::store::Journal::resolve_step)),
/// as listed by [`Journal::steps`](crate::store::Journal::steps).
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct StepAt<'a> {
    /// The operation's scope.
    pub scope: &'a Scope,
    /// The operation's key.
    pub key: &'a Key,
    /// The step's place in the operation, from 0.
    pub seq: u32,
    /// The step's name: a step found there under another name is not
    /// this one, and is left alone.
    pub name: &'a str,
}

/// How an operator settles a step in doubt
/// ([`Journal::resolve_step`](crate::store::Journal::resolve_step)).
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum StepResolution {
    /// The step's effect happened, with this output (as the step's codec
    /// writes it: JSON for `idem::steps`): the next attempt replays it.
    Completed(Vec<u8>),
    /// The step's effect did not happen, or may happen again: the next
    /// attempt runs it again, with the same derived key.
    Rerun,
}

#[cfg(test)]
mod tests {
    use super::*;

    /// The claim of the attempt holding `token`.
    fn claim(token: ClaimToken) -> Claim {
        Claim {
            scope: Scope::new("op"),
            key: Key::new("k").unwrap(),
            fence: 1,
            token,
            lease: Duration::from_secs(30),
            ttl: Duration::from_secs(60),
        }
    }

    fn entry(state: StepState, token: ClaimToken, fp: Fingerprint) -> StepRecord {
        StepRecord {
            scope: Scope::new("op"),
            key: Key::new("k").unwrap(),
            seq: 0,
            name: "charge".into(),
            fingerprint: fp,
            state,
            token,
            output: (state == StepState::Completed).then(|| b"1".to_vec()),
            updated_at: 500,
            expires_at: 10_000,
        }
    }

    /// A step started by an attempt that is gone is neither adopted nor in
    /// doubt until its settle window, counted from its start by the
    /// store's clock, has closed; its own attempt runs it again at once.
    #[test]
    fn a_step_in_flight_waits_out_its_settle_window() {
        let fp = Fingerprint::of_bytes(b"a");
        let (mine, theirs) = (ClaimToken::new(), ClaimToken::new());
        let attempt = claim(mine);
        let request = |adopt| StepRequest {
            claim: &attempt,
            seq: 0,
            name: "charge",
            fingerprint: &fp,
            ttl: Duration::from_secs(10),
            adopt,
            settle: Duration::from_millis(300),
        };
        // Started at 500: the window closes at 800.
        let started = entry(StepState::Started, theirs, fp);
        for adopt in [false, true] {
            assert_eq!(
                decide_step(&request(adopt), Some(&started), 600),
                StepDecision::Answer(StepBegin::InFlight {
                    retry_after: Duration::from_millis(200)
                })
            );
        }
        assert_eq!(
            decide_step(&request(false), Some(&started), 800),
            StepDecision::Answer(StepBegin::InDoubt { since: 500 })
        );
        assert_eq!(
            decide_step(&request(true), Some(&started), 800),
            StepDecision::Start(StepRun::Adopted)
        );
        let own = entry(StepState::Started, mine, fp);
        assert_eq!(
            decide_step(&request(true), Some(&own), 600),
            StepDecision::Answer(StepBegin::Run(StepRun::Again))
        );
    }

    #[test]
    fn decisions() {
        let fp = Fingerprint::of_bytes(b"a");
        let (mine, theirs) = (ClaimToken::new(), ClaimToken::new());
        let attempt = claim(mine);
        let request = |name, adopt| StepRequest {
            claim: &attempt,
            seq: 0,
            name,
            fingerprint: &fp,
            ttl: Duration::from_secs(10),
            adopt,
            settle: Duration::ZERO,
        };
        let decide = |request: &StepRequest<'_>, entry: Option<&StepRecord>, now| {
            decide_step(request, entry, now)
        };
        let charge = request("charge", false);
        assert_eq!(
            decide(&charge, None, 1_000),
            StepDecision::Start(StepRun::Fresh)
        );
        let started = entry(StepState::Started, theirs, fp);
        assert_eq!(
            decide(&charge, Some(&started), 1_000),
            StepDecision::Answer(StepBegin::InDoubt { since: 500 })
        );
        assert_eq!(
            decide(&request("charge", true), Some(&started), 1_000),
            StepDecision::Start(StepRun::Adopted)
        );
        assert_eq!(
            decide(&charge, Some(&entry(StepState::Started, mine, fp)), 1_000),
            StepDecision::Answer(StepBegin::Run(StepRun::Again))
        );
        assert_eq!(
            decide(
                &charge,
                Some(&entry(StepState::Completed, theirs, fp)),
                1_000
            ),
            StepDecision::Answer(StepBegin::Replay(b"1".to_vec()))
        );
        assert_eq!(
            decide(
                &charge,
                Some(&entry(StepState::RerunAllowed, theirs, fp)),
                1_000
            ),
            StepDecision::Start(StepRun::Allowed)
        );
        assert_eq!(
            decide(&request("refund", true), Some(&started), 1_000),
            StepDecision::Answer(StepBegin::Mismatch {
                journaled: "charge".into()
            })
        );
        let other = entry(StepState::Completed, theirs, Fingerprint::of_bytes(b"b"));
        assert_eq!(
            decide(&charge, Some(&other), 1_000),
            StepDecision::Answer(StepBegin::KeyReused)
        );
        // An expired entry is no entry, whatever it says.
        assert_eq!(
            decide(&request("refund", false), Some(&other), 10_000),
            StepDecision::Start(StepRun::Fresh)
        );
    }

    #[test]
    fn spellings_round_trip() {
        for s in [
            StepState::Started,
            StepState::Completed,
            StepState::RerunAllowed,
        ] {
            assert_eq!(StepState::parse(s.as_str()), Some(s));
        }
    }
}
