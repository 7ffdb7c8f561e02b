//! Codecs and outcome policies: how a body's result becomes the outcome
//! stored for its key, and back; and the outcome stored instead of one
//! that can never be ([`recorded`], [`refused`]).
//!
//! ## Outcome policies
//!
//! What is stored is the call's to say, in either mode. By default
//! ([`OkOnly`]) the `Ok` value is stored as JSON ([`Json`]) and errors are
//! released. [`Call::replaying`](super::Call::replaying) stores the errors
//! a predicate picks too, and replays them like results ([`Replaying`]).
//! [`Call::with_codec`](super::Call::with_codec) stores the `Ok` value
//! with any [`Codec`], for values that are not serde types or whose JSON
//! form would be wasteful (an HTTP response is stored as framed raw
//! bytes); it composes with `replaying`.

use std::fmt;

use serde::de::DeserializeOwned;
use serde::Serialize;

use idem_core::error::Error;
use idem_core::record::{Outcome, OutcomeKind};

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
        Ok(idem_core::canonical::to_vec(value)?)
    }

    fn decode(&self, bytes: &[u8]) -> Result<T, Error> {
        Ok(serde_json::from_slice(bytes)?)
    }
}

/// Which of a call's results are stored and replayed: the outcome policy
/// of a [`Call`](super::Call), which [`run`](super::run) and
/// [`run_in_transaction`](super::run_in_transaction) require for the
/// body's `Result<T, E>`.
///
/// It is implemented by [`OkOnly`] and [`Replaying`], chosen with the
/// call's builder methods, and cannot be implemented outside this crate.
pub trait OutcomePolicy<T, E>: sealed::Outcomes<T, E> {}

/// The default outcome policy: the `Ok` value is stored with the codec `C`
/// ([`Json`] unless [`Call::with_codec`](super::Call::with_codec) says
/// otherwise); errors are never stored.
#[derive(Clone, Copy, Debug, Default)]
pub struct OkOnly<C = Json>(pub(super) C);

impl<T, E, C: Codec<T>> OutcomePolicy<T, E> for OkOnly<C> {}

/// The outcome policy of [`Call::replaying`](super::Call::replaying): the
/// `Ok` value is stored with the codec `C`, and the errors `E` for which
/// the predicate `P` answers `true` are stored as JSON; other errors are
/// not stored.
pub struct Replaying<C, P, E> {
    pub(super) codec: C,
    pub(super) replayable: P,
    pub(super) errors: JsonErrors<E>,
}

impl<T, E, C, P> OutcomePolicy<T, E> for Replaying<C, P, E>
where
    C: Codec<T>,
    P: Fn(&E) -> bool,
{
}

/// [`Json`] for a replayable error type, taken where the error type is
/// known to be a serde type ([`Call::replaying`](super::Call::replaying)): the one place that
/// requires it, so that a missing `Serialize` is reported once, there.
pub(super) struct JsonErrors<E> {
    encode: fn(&E) -> Result<Vec<u8>, Error>,
    decode: fn(&[u8]) -> Result<E, Error>,
}

impl<E: Serialize + DeserializeOwned> JsonErrors<E> {
    pub(super) fn new() -> Self {
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

mod sealed {
    use idem_core::error::Error;
    use idem_core::record::Outcome;

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

/// The outcome to store for a result the body returned: its encoding, or,
/// when its codec failed or it is longer than `max` bytes
/// ([`Call::max_outcome`](super::Call::max_outcome)), the [`Outcome::unrecorded`] that answers
/// [`Error::Unrecorded`] to every later call. The body ran, so the key is
/// not handed back for a retry to run it again.
pub(super) fn recorded(encoded: Result<Outcome, Error>, max: usize) -> Outcome {
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
pub(super) fn refused(reason: &str) -> Outcome {
    tracing::error!(
        reason,
        "the outcome cannot be stored; the key answers Unrecorded from now on"
    );
    Outcome::unrecorded(reason)
}

#[cfg(test)]
mod tests {
    use super::sealed::Outcomes;
    use super::{recorded, Codec, Json, JsonErrors, OkOnly, Replaying};
    use idem_core::error::Error;
    use idem_core::record::{Outcome, OutcomeKind};

    type Charge = Result<u32, String>;

    fn ok(body: &[u8]) -> Outcome {
        Outcome {
            kind: OutcomeKind::Ok,
            body: body.to_vec(),
        }
    }

    #[test]
    fn ok_only_stores_the_value_and_releases_errors() {
        let policy = OkOnly(Json);
        let stored = Outcomes::<u32, String>::encode(&policy, &Ok(7)).unwrap();
        assert_eq!(stored.unwrap(), ok(b"7"));
        assert!(Outcomes::<u32, String>::encode(&policy, &Err("busy".into())).is_none());
        let replayed: Charge = policy.decode(&ok(b"7")).unwrap();
        assert_eq!(replayed, Ok(7));
    }

    #[test]
    fn ok_only_refuses_to_replay_a_stored_error() {
        let stored = Outcome {
            kind: OutcomeKind::Err,
            body: br#""declined""#.to_vec(),
        };
        let replayed = Outcomes::<u32, String>::decode(&OkOnly(Json), &stored);
        assert!(matches!(replayed, Err(Error::Config(_))), "{replayed:?}");
    }

    #[test]
    fn replaying_stores_the_errors_it_picks_and_releases_the_rest() {
        let policy = Replaying {
            codec: Json,
            replayable: |err: &String| err == "declined",
            errors: JsonErrors::new(),
        };
        let declined = policy.encode(&Err::<u32, _>("declined".to_string()));
        let declined = declined.unwrap().unwrap();
        assert_eq!(declined.kind, OutcomeKind::Err);
        assert_eq!(declined.body, br#""declined""#);
        assert!(policy.encode(&Err::<u32, _>("busy".to_string())).is_none());
        let replayed: Charge = policy.decode(&declined).unwrap();
        assert_eq!(replayed, Err("declined".to_string()));
        assert_eq!(policy.encode(&Ok(7)).unwrap().unwrap(), ok(b"7"));
    }

    #[test]
    fn an_unrecorded_outcome_replays_as_unrecorded_under_any_policy() {
        let stored = Outcome::unrecorded("too large");
        let under_ok_only = Outcomes::<u32, String>::decode(&OkOnly(Json), &stored);
        assert!(matches!(under_ok_only, Err(Error::Unrecorded(ref r)) if r == "too large"));
        let replaying = Replaying {
            codec: Json,
            replayable: |_: &String| true,
            errors: JsonErrors::new(),
        };
        let under_replaying = Outcomes::<u32, String>::decode(&replaying, &stored);
        assert!(matches!(under_replaying, Err(Error::Unrecorded(ref r)) if r == "too large"));
    }

    #[test]
    fn recorded_keeps_an_outcome_up_to_the_limit_and_refuses_a_longer_one() {
        assert_eq!(recorded(Ok(ok(b"1234")), 4), ok(b"1234"));
        let over = recorded(Ok(ok(b"12345")), 4);
        let reason = over.unrecorded_reason().expect("unrecorded");
        assert_eq!(
            reason,
            "an outcome of 5 bytes is longer than the call's max_outcome of 4 bytes"
        );
    }

    #[test]
    fn recorded_stands_in_for_a_value_its_codec_refused() {
        // JSON has no form for NaN: the value is refused, not written as
        // `null`.
        let encoded = Codec::<f64>::encode(&Json, &f64::NAN).map(|body| ok(&body));
        assert!(encoded.is_err());
        let stored = recorded(encoded, usize::MAX);
        assert!(stored.unrecorded_reason().is_some());
        assert_eq!(stored.kind, OutcomeKind::Err);
    }
}
