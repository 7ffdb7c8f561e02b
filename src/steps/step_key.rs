//! A step's name, and the key derived from it for the downstream call:
//! the same in every attempt, process and takeover.

use sha2::{Digest, Sha256};

use idem_core::error::Error;
use idem_core::fingerprint::Fingerprint;
use idem_core::key::{Key, Scope};

/// The text, `Display`, `Debug` and [`AsKey`] of an id that is the hex
/// of a digest (a step's key, an outbox message's id): a newtype over its
/// `String`.
macro_rules! hex_id {
    ($id:ident, $text:literal) => {
        impl $id {
            #[doc = $text]
            pub fn as_str(&self) -> &str {
                &self.0
            }
        }

        impl std::fmt::Display for $id {
            fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
                f.write_str(&self.0)
            }
        }

        impl std::fmt::Debug for $id {
            fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
                write!(f, "{}({})", stringify!($id), self.0)
            }
        }

        impl idem_core::key::AsKey for $id {
            fn to_key(&self) -> Result<idem_core::key::Key, idem_core::key::KeyError> {
                idem_core::key::Key::new(self.0.as_str())
            }
        }
    };
}
#[cfg(feature = "_sql")]
pub(crate) use hex_id;

/// The longest step name.
pub const MAX_STEP_NAME_LEN: usize = 64;

/// A step's derived key: the same for the same operation (scope and key),
/// step name and occurrence, in any attempt, process or takeover.
///
/// It is the lowercase hexadecimal SHA-256 (64 characters, printable
/// ASCII, valid as a Stripe `Idempotency-Key` and as an idem key) of
///
/// ```text
/// idem-step-v1|<len(scope)>:<scope>|<len(key)>:<key>|<len(name)>:<name>|<occurrence>
/// ```
///
/// where lengths are in bytes and written in decimal, `scope` is the
/// operation's scope as stored (`Scope::as_str`: the operation, then
/// a line feed and the principal when there is one), and `occurrence`
/// counts earlier steps of the same name in the operation, from 0. A
/// service receiving the key can recompute it from the same parts, as
/// `printf 'idem-step-v1|12:payments.pay|8:order-17|6:charge|0' | sha256sum`
/// does here:
///
/// ```
/// use idem::steps::StepKey;
/// use idem::{Key, Scope};
///
/// let key = StepKey::derive(&Scope::new("payments.pay"), &Key::new("order-17")?, "charge", 0);
/// assert_eq!(
///     key.as_str(),
///     "67e28a3313a858d6533f53be205f62cea52d576245d954e843a737dbab355184"
/// );
/// # Ok::<(), idem::KeyError>(())
/// ```
#[derive(Clone, PartialEq, Eq, Hash)]
pub struct StepKey(pub(super) String);

impl StepKey {
    /// The key of the `occurrence`th step named `name` of the operation
    /// `(scope, key)`.
    pub fn derive(scope: &Scope, key: &Key, name: &str, occurrence: u32) -> StepKey {
        let mut hash = Sha256::new();
        hash.update(b"idem-step-v1");
        for part in [scope.as_str(), key.as_str(), name] {
            hash.update(format!("|{}:", part.len()).as_bytes());
            hash.update(part.as_bytes());
        }
        hash.update(format!("|{occurrence}").as_bytes());
        StepKey(Fingerprint::from_digest(hash.finalize().into()).to_hex())
    }
}

hex_id!(StepKey, "The key's text.");

impl AsRef<str> for StepKey {
    fn as_ref(&self) -> &str {
        &self.0
    }
}

/// Checks a step's name.
pub(super) fn check_name(name: &str) -> Result<(), Error> {
    let valid = !name.is_empty()
        && name.len() <= MAX_STEP_NAME_LEN
        && name
            .bytes()
            .all(|b| b.is_ascii_alphanumeric() || matches!(b, b'_' | b'-' | b'.' | b':'));
    if valid {
        Ok(())
    } else {
        Err(Error::Config(format!(
            "invalid step name {name:?}: 1 to {MAX_STEP_NAME_LEN} ASCII letters, digits, '_', \
             '-', '.' or ':'"
        )))
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use idem_core::key::AsKey;

    #[test]
    fn keys_are_stable_printable_and_distinct() {
        let (scope, key) = (Scope::new("payments.pay"), Key::new("order-17").unwrap());
        let charge = StepKey::derive(&scope, &key, "charge", 0);
        assert_eq!(charge, StepKey::derive(&scope, &key, "charge", 0));
        assert_eq!(charge.as_str().len(), 64);
        assert!(charge
            .as_str()
            .bytes()
            .all(|b| b.is_ascii_hexdigit() && !b.is_ascii_uppercase()));
        assert!(charge.to_key().is_ok());
        let others = [
            StepKey::derive(&scope, &key, "charge", 1),
            StepKey::derive(&scope, &key, "refund", 0),
            StepKey::derive(&scope, &Key::new("order-18").unwrap(), "charge", 0),
            StepKey::derive(&Scope::new("payments.refund"), &key, "charge", 0),
            // Lengths keep the parts apart.
            StepKey::derive(
                &Scope::new("payments.pa"),
                &Key::new("yorder-17").unwrap(),
                "charge",
                0,
            ),
        ];
        for other in others {
            assert_ne!(charge, other);
        }
    }

    /// The derivation as documented, recomputed by hand.
    #[test]
    fn keys_follow_the_documented_derivation() {
        let (scope, key) = (Scope::new("op"), Key::new("k1").unwrap());
        let text = "idem-step-v1|2:op|2:k1|6:charge|0";
        let expected: String = Sha256::digest(text.as_bytes())
            .iter()
            .map(|b| format!("{b:02x}"))
            .collect();
        assert_eq!(
            StepKey::derive(&scope, &key, "charge", 0).as_str(),
            expected
        );
    }

    #[test]
    fn names_are_checked() {
        for good in ["charge", "send-receipt", "phase.2:commit", "a"] {
            assert!(check_name(good).is_ok(), "{good}");
        }
        let long = "x".repeat(65);
        for bad in ["", "with space", "é", long.as_str()] {
            assert!(matches!(check_name(bad), Err(Error::Config(_))), "{bad}");
        }
    }
}
