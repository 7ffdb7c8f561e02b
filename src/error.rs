//! The one error type of the library.

use std::time::Duration;

use crate::key::KeyError;

/// Everything that can go wrong in an idempotent call.
///
/// A user's error type joins the flow through `From<idem::Error>`: the
/// `#[idempotent]` attribute converts these errors into the function's own
/// error type with `?`-like semantics.
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
    /// A configuration value was rejected (table name, policy).
    #[error("invalid idempotency configuration: {0}")]
    Config(String),
}

impl Error {
    /// Wraps any backend error as [`Error::Store`].
    pub fn store(err: impl Into<Box<dyn std::error::Error + Send + Sync + 'static>>) -> Self {
        Error::Store(err.into())
    }

    /// Whether retrying the same call later may succeed (in progress, store
    /// trouble, lost lease); `false` for client mistakes such as a reused or
    /// invalid key.
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

#[cfg(feature = "_sql")]
impl From<sqlx::Error> for Error {
    fn from(err: sqlx::Error) -> Self {
        Error::Store(Box::new(err))
    }
}

#[cfg(feature = "_sql")]
impl From<sqlx::migrate::MigrateError> for Error {
    fn from(err: sqlx::migrate::MigrateError) -> Self {
        Error::Store(Box::new(err))
    }
}
