//! The one error type of the library, and its serialized form.

use std::fmt;
use std::time::Duration;

use serde::{Deserialize, Deserializer, Serialize, Serializer};

use crate::key::KeyError;

/// Everything that can go wrong in an idempotent call.
///
/// A user's error type joins the flow through `From<idem_core::Error>`: the
/// `#[idempotent]` attribute converts these errors into the function's own
/// error type with `?`-like semantics.
///
/// What a caller does with each (the HTTP layer answers the same way):
///
/// ```
/// use std::time::Duration;
///
/// /// The status and the retry hint to answer a client with.
/// fn answer(err: &idem_core::Error) -> (u16, Option<Duration>) {
///     match err {
///         // The client reused its key for another request: its mistake.
///         idem_core::Error::KeyReused => (422, None),
///         // The first call is still running: retry later.
///         idem_core::Error::InProgress { retry_after } => (409, Some(*retry_after)),
///         idem_core::Error::InvalidKey(_) | idem_core::Error::MissingKey => (400, None),
///         // Nothing was decided; the request may be sent again as is.
///         err if err.is_retryable() => (503, Some(Duration::from_secs(1))),
///         // A bug or a misconfiguration: say so in the logs.
///         _ => (500, None),
///     }
/// }
///
/// assert_eq!(answer(&idem_core::Error::KeyReused), (422, None));
/// assert_eq!(answer(&idem_core::Error::LeaseLost).0, 503);
/// assert_eq!(answer(&idem_core::Error::Config("bad table".into())).0, 500);
/// ```
///
/// # Serialized form
///
/// `Error` implements `Serialize` and `Deserialize`, so that an error enum
/// holding one can derive them and be stored by the `replayable` option of
/// `#[idempotent]` (or `idem::Call::replaying`). Its
/// JSON form is an object with the error's `kind` and its `message` (its
/// `Display`), and the fields that variant needs to be rebuilt:
///
/// | variant | form |
/// |---|---|
/// | `KeyReused` | `{"kind": "key_reused", "message": ...}` |
/// | `InProgress` | `{"kind": "in_progress", "message": ..., "retry_after_ms": 1000}` |
/// | `InvalidKey` | `{"kind": "invalid_key", "message": ..., "key_error": {"kind": "too_long", "len": 300}}` (`missing`, `empty`, `too_long` with `len`, `invalid_byte` with `offset` and `byte`, `unserializable` with `reason`) |
/// | `MissingKey` | `{"kind": "missing_key", "message": ...}` |
/// | `LeaseLost` | `{"kind": "lease_lost", "message": ...}` |
/// | `Store` | `{"kind": "store", "message": ..., "source": "<the store error's message>"}` |
/// | `Serialization` | `{"kind": "serialization", "message": ..., "source": ...}` |
/// | `Config` | `{"kind": "config", "message": ..., "source": ...}` |
/// | `Unrecorded` | `{"kind": "unrecorded", "message": ..., "source": "<why the result could not be encoded>"}` |
///
/// Deserializing gives back an equivalent error: the same variant, the
/// same `Display`, the same [`is_retryable`](Error::is_retryable). The
/// `message` is informative; the other fields rebuild the error. A `kind`
/// this version does not know fails to deserialize.
///
/// Two variants come back as their message only: `Store`, whose source
/// (an `sqlx::Error`, an I/O error) cannot be rebuilt, becomes a `Store`
/// error whose source is a plain message, and `Serialization` a
/// `serde_json` error with the same message.
///
/// A replayed error is the first run's answer, not news about the store
/// now: a replayed `Store` error says the store failed *during the first
/// run*, and it is answered again to every retry for as long as the record
/// lives, even though [`is_retryable`](Error::is_retryable) still says
/// `true`. The same goes for `InProgress` and `LeaseLost`. So pick only
/// permanent answers as replayable (a declined card, an invalid request),
/// never these transient ones:
///
/// ```
/// use serde::{Deserialize, Serialize};
///
/// #[derive(Debug, thiserror::Error, Serialize, Deserialize)]
/// enum PaymentError {
///     #[error("card declined")]
///     Declined,
///     #[error(transparent)]
///     Idempotency(#[from] idem_core::Error),
/// }
///
/// // The predicate of `replayable = ...`: the decline only.
/// fn is_final(err: &PaymentError) -> bool {
///     matches!(err, PaymentError::Declined)
/// }
///
/// let err = PaymentError::from(idem_core::Error::KeyReused);
/// let json = serde_json::to_string(&err).unwrap();
/// assert_eq!(
///     json,
///     r#"{"Idempotency":{"kind":"key_reused","message":"idempotency key reused with a different payload"}}"#
/// );
/// let back: PaymentError = serde_json::from_str(&json).unwrap();
/// assert!(matches!(back, PaymentError::Idempotency(idem_core::Error::KeyReused)));
/// assert!(!is_final(&back));
/// ```
#[derive(Debug, thiserror::Error)]
#[non_exhaustive]
pub enum Error {
    /// The key was used before with a different payload (HTTP 422).
    #[error("idempotency key reused with a different payload")]
    KeyReused,
    /// A call with the same key is still running and the wait bound passed,
    /// or the policy is to fail at once (HTTP 409).
    #[error("a call with this idempotency key is still in progress; retry after {retry_after:?}")]
    InProgress {
        /// A hint for when a retry may find the first call finished.
        retry_after: Duration,
    },
    /// The client's key breaks one of the key rules (HTTP 400).
    #[error("invalid idempotency key: {0}")]
    InvalidKey(#[source] KeyError),
    /// No key was given where one is required (HTTP 400).
    #[error("missing idempotency key")]
    MissingKey,
    /// The claim was taken over by another caller after its lease ran out, so
    /// this caller's completion was rejected (fencing).
    #[error("the claim on this idempotency key was lost: its lease expired and another caller took it over")]
    LeaseLost,
    /// The store failed (connection, SQL, migration).
    #[error("idempotency store error: {0}")]
    Store(#[source] Box<dyn std::error::Error + Send + Sync + 'static>),
    /// A payload, an outcome or a stored record could not be (de)serialized.
    #[error("idempotency serialization error: {0}")]
    Serialization(#[from] serde_json::Error),
    /// A configuration value was rejected (table name, policy), or an API
    /// was used where it cannot work (a step outside an operation).
    #[error("invalid idempotency configuration: {0}")]
    Config(String),
    /// A durable step whose policy is to refuse is in doubt: an earlier
    /// attempt started it and journaled no outcome, so whether its effect
    /// happened is unknown (HTTP 502). Every attempt gets this error until
    /// an operator resolves the step (`idem::steps::resolve`).
    #[error(
        "the outcome of step {seq} ({step:?}) is unknown: an earlier attempt started it and \
         journaled no outcome; an operator must resolve it (its downstream key is {step_key})"
    )]
    OutcomeUnknown {
        /// The step's name.
        step: String,
        /// The step's place in the operation, from 0.
        seq: u32,
        /// The key the step gave its downstream.
        step_key: String,
    },
    /// The operation ran for this key, but its result could not be
    /// recorded: the outcome policy's codec failed to encode it, or the
    /// store refused it as one it can never hold (larger than MySQL's
    /// `max_allowed_packet`) (HTTP 410). The caller that ran it got its
    /// result; every later call with the key gets this error, and the
    /// operation is not run again, since its effect happened. The text
    /// says why. A [`Store`](crate::store::Store) returns it from `complete` for
    /// an outcome it can never hold; the engine then stores the answer.
    #[error(
        "this idempotency key's operation ran, but its result could not be recorded ({0}); \
         it is not run again for this key"
    )]
    Unrecorded(String),
    /// The operation called its durable steps in another order, or under
    /// other names, than the attempt that wrote its journal (HTTP 500).
    #[error(
        "step {seq} is journaled as {journaled:?} but this run calls {called:?}: an operation \
         must call the same steps in the same order at every attempt"
    )]
    StepMismatch {
        /// The step's place in the operation, from 0.
        seq: u32,
        /// The name in the journal.
        journaled: String,
        /// The name this run called.
        called: String,
    },
}

impl Error {
    /// Wraps any backend error as [`Error::Store`].
    pub fn store(err: impl Into<Box<dyn std::error::Error + Send + Sync + 'static>>) -> Self {
        Error::Store(err.into())
    }

    /// Whether retrying the same call later may succeed (in progress, store
    /// trouble, lost lease); `false` for client mistakes such as a reused or
    /// invalid key. A deserialized error answers as the original did (see
    /// [the serialized form](Error#serialized-form)).
    pub fn is_retryable(&self) -> bool {
        matches!(
            self,
            Error::InProgress { .. } | Error::Store(_) | Error::LeaseLost
        )
    }
}

impl From<KeyError> for Error {
    /// [`KeyError::Missing`] becomes [`Error::MissingKey`]; the others
    /// [`Error::InvalidKey`].
    fn from(err: KeyError) -> Self {
        match err {
            KeyError::Missing => Error::MissingKey,
            other => Error::InvalidKey(other),
        }
    }
}

#[cfg(feature = "sqlx")]
impl From<sqlx::Error> for Error {
    fn from(err: sqlx::Error) -> Self {
        Error::Store(Box::new(err))
    }
}

#[cfg(feature = "sqlx")]
impl From<sqlx::migrate::MigrateError> for Error {
    fn from(err: sqlx::migrate::MigrateError) -> Self {
        Error::Store(Box::new(err))
    }
}

/// The `kind` of an [`Error`]'s serialized form.
#[derive(Clone, Copy, Serialize, Deserialize)]
#[serde(rename_all = "snake_case")]
enum Kind {
    KeyReused,
    InProgress,
    InvalidKey,
    MissingKey,
    LeaseLost,
    Store,
    Serialization,
    Config,
    OutcomeUnknown,
    StepMismatch,
    Unrecorded,
}

/// The step of an `outcome_unknown` or `step_mismatch` error.
#[derive(Serialize, Deserialize)]
struct StepForm {
    seq: u32,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    step: Option<String>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    step_key: Option<String>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    journaled: Option<String>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    called: Option<String>,
}

/// A [`KeyError`] inside an `invalid_key` error.
#[derive(Serialize, Deserialize)]
#[serde(tag = "kind", rename_all = "snake_case")]
enum KeyErrorForm {
    Missing,
    Empty,
    TooLong { len: usize },
    InvalidByte { offset: usize, byte: u8 },
    Unserializable { reason: String },
}

/// The serialized form of an [`Error`] (see its documentation).
#[derive(Serialize, Deserialize)]
struct Form {
    kind: Kind,
    message: String,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    retry_after_ms: Option<u64>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    key_error: Option<KeyErrorForm>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    source: Option<String>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    step: Option<StepForm>,
}

impl Serialize for Error {
    fn serialize<S: Serializer>(&self, serializer: S) -> Result<S::Ok, S::Error> {
        let mut step = None;
        let (kind, retry_after_ms, key_error, source) = match self {
            Error::KeyReused => (Kind::KeyReused, None, None, None),
            Error::InProgress { retry_after } => {
                let millis = retry_after.as_millis().try_into().unwrap_or(u64::MAX);
                (Kind::InProgress, Some(millis), None, None)
            }
            Error::InvalidKey(err) => {
                let form = match err {
                    KeyError::Missing => KeyErrorForm::Missing,
                    KeyError::Empty => KeyErrorForm::Empty,
                    KeyError::TooLong { len } => KeyErrorForm::TooLong { len: *len },
                    KeyError::InvalidByte { offset, byte } => KeyErrorForm::InvalidByte {
                        offset: *offset,
                        byte: *byte,
                    },
                    KeyError::Unserializable(reason) => KeyErrorForm::Unserializable {
                        reason: reason.clone(),
                    },
                };
                (Kind::InvalidKey, None, Some(form), None)
            }
            Error::MissingKey => (Kind::MissingKey, None, None, None),
            Error::LeaseLost => (Kind::LeaseLost, None, None, None),
            Error::Store(source) => (Kind::Store, None, None, Some(source.to_string())),
            Error::Serialization(source) => {
                (Kind::Serialization, None, None, Some(source.to_string()))
            }
            Error::Config(source) => (Kind::Config, None, None, Some(source.clone())),
            Error::Unrecorded(reason) => (Kind::Unrecorded, None, None, Some(reason.clone())),
            Error::OutcomeUnknown {
                step: name,
                seq,
                step_key,
            } => {
                step = Some(StepForm {
                    seq: *seq,
                    step: Some(name.clone()),
                    step_key: Some(step_key.clone()),
                    journaled: None,
                    called: None,
                });
                (Kind::OutcomeUnknown, None, None, None)
            }
            Error::StepMismatch {
                seq,
                journaled,
                called,
            } => {
                step = Some(StepForm {
                    seq: *seq,
                    step: None,
                    step_key: None,
                    journaled: Some(journaled.clone()),
                    called: Some(called.clone()),
                });
                (Kind::StepMismatch, None, None, None)
            }
        };
        Form {
            kind,
            message: self.to_string(),
            retry_after_ms,
            key_error,
            source,
            step,
        }
        .serialize(serializer)
    }
}

impl<'de> Deserialize<'de> for Error {
    fn deserialize<D: Deserializer<'de>>(deserializer: D) -> Result<Self, D::Error> {
        use serde::de::Error as _;
        let form = Form::deserialize(deserializer)?;
        let missing = |field: &'static str| D::Error::missing_field(field);
        // The message a text-carrying variant was built from; a form
        // written by hand may give the message alone.
        let source = form.source.unwrap_or(form.message);
        Ok(match form.kind {
            Kind::KeyReused => Error::KeyReused,
            Kind::InProgress => Error::InProgress {
                retry_after: Duration::from_millis(
                    form.retry_after_ms
                        .ok_or_else(|| missing("retry_after_ms"))?,
                ),
            },
            Kind::InvalidKey => {
                Error::InvalidKey(match form.key_error.ok_or_else(|| missing("key_error"))? {
                    KeyErrorForm::Missing => KeyError::Missing,
                    KeyErrorForm::Empty => KeyError::Empty,
                    KeyErrorForm::TooLong { len } => KeyError::TooLong { len },
                    KeyErrorForm::InvalidByte { offset, byte } => {
                        KeyError::InvalidByte { offset, byte }
                    }
                    KeyErrorForm::Unserializable { reason } => KeyError::Unserializable(reason),
                })
            }
            Kind::MissingKey => Error::MissingKey,
            Kind::LeaseLost => Error::LeaseLost,
            Kind::Store => Error::Store(Box::new(ReplayedSource(source))),
            Kind::Serialization => {
                Error::Serialization(<serde_json::Error as serde::de::Error>::custom(source))
            }
            Kind::Config => Error::Config(source),
            Kind::Unrecorded => Error::Unrecorded(source),
            Kind::OutcomeUnknown => {
                let step = form.step.ok_or_else(|| missing("step"))?;
                Error::OutcomeUnknown {
                    step: step.step.unwrap_or_default(),
                    seq: step.seq,
                    step_key: step.step_key.unwrap_or_default(),
                }
            }
            Kind::StepMismatch => {
                let step = form.step.ok_or_else(|| missing("step"))?;
                Error::StepMismatch {
                    seq: step.seq,
                    journaled: step.journaled.unwrap_or_default(),
                    called: step.called.unwrap_or_default(),
                }
            }
        })
    }
}

/// The source of a deserialized [`Error::Store`]: the original error's
/// message, all that its serialized form keeps.
#[derive(Debug)]
struct ReplayedSource(String);

impl fmt::Display for ReplayedSource {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(&self.0)
    }
}

impl std::error::Error for ReplayedSource {}
