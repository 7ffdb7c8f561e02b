//! [`Tracked`]: an operation's value, and whether it was replayed.

use serde::{Deserialize, Deserializer, Serialize, Serializer};

/// An operation's value, and whether it was replayed from a stored record
/// rather than produced by running the body now.
///
/// The common signature, `Result<T, E>`, does not say whether a call was a
/// replay. Where the caller needs to know (to log a retry, to answer
/// `Idempotent-Replayed: true`, to skip a side effect already done), return
/// `Result<Tracked<T>, E>` instead: the body wraps its value with
/// [`Tracked::new`] (or `.into()`), and the caller asks
/// [`is_replayed`](Tracked::is_replayed).
///
/// ```
/// use idem::{idempotent, MemoryStore, Tracked};
/// use serde::{Deserialize, Serialize};
///
/// #[derive(Debug, PartialEq, Serialize, Deserialize)]
/// struct Receipt { amount: u64 }
///
/// #[idempotent(key = key, store = store, scope = "payments.charge")]
/// async fn charge(store: &MemoryStore, key: &str, amount: u64) -> Result<Tracked<Receipt>, idem::Error> {
///     Ok(Tracked::new(Receipt { amount }))
/// }
///
/// # #[tokio::main(flavor = "current_thread")]
/// # async fn main() {
/// let store = MemoryStore::new();
/// let first = charge(&store, "c-1", 500).await.unwrap();
/// assert!(!first.is_replayed()); // the body ran
/// let retry = charge(&store, "c-1", 500).await.unwrap();
/// assert!(retry.is_replayed()); // the stored receipt, the body did not run
/// assert_eq!(retry.value(), first.value());
/// # }
/// ```
///
/// It works wherever an outcome is stored with serde: under the attribute
/// in record and transactional modes, and with [`run`](crate::run) and the
/// default codec. (Entity mode returns the row itself: there, compare the
/// row with what the body would write.) A replayed *error* (`replayable`)
/// is not marked; only the `Ok` value is.
///
/// # How it knows
///
/// A `Tracked<T>` serializes as `T` alone, so switching a return type from
/// `Result<T, E>` to `Result<Tracked<T>, E>` keeps the records written
/// before, and the other way round. Deserializing one marks it replayed: a
/// value that was deserialized came from a record, not from the body.
///
/// Two `Tracked` values are equal when their values and their flags are:
/// compare [`value`](Tracked::value)s to ignore the flag.
#[derive(Clone, Debug, PartialEq, Eq, Hash)]
pub struct Tracked<T> {
    value: T,
    replayed: bool,
}

impl<T> Tracked<T> {
    /// A value the body produced now: not replayed.
    pub fn new(value: T) -> Self {
        Tracked {
            value,
            replayed: false,
        }
    }

    /// Whether the value was replayed from a stored record: the body did
    /// not run for this call.
    pub fn is_replayed(&self) -> bool {
        self.replayed
    }

    /// The value, produced now or replayed.
    pub fn value(&self) -> &T {
        &self.value
    }

    /// The value, produced now or replayed.
    pub fn into_value(self) -> T {
        self.value
    }
}

impl<T> From<T> for Tracked<T> {
    /// A value the body produced now, as [`Tracked::new`].
    fn from(value: T) -> Self {
        Tracked::new(value)
    }
}

impl<T: Serialize> Serialize for Tracked<T> {
    /// Serializes the value alone.
    fn serialize<S: Serializer>(&self, serializer: S) -> Result<S::Ok, S::Error> {
        self.value.serialize(serializer)
    }
}

impl<'de, T: Deserialize<'de>> Deserialize<'de> for Tracked<T> {
    /// Deserializes the value, marked replayed.
    fn deserialize<D: Deserializer<'de>>(deserializer: D) -> Result<Self, D::Error> {
        Ok(Tracked {
            value: T::deserialize(deserializer)?,
            replayed: true,
        })
    }
}
