//! Client keys and operation scopes.

use std::fmt;

/// The longest key accepted, in bytes.
pub const MAX_KEY_LEN: usize = 255;

/// A validated idempotency key: 1 to 255 bytes of visible ASCII
/// (`0x21..=0x7E`, so no spaces and no control characters).
#[derive(Clone, PartialEq, Eq, Hash, PartialOrd, Ord)]
pub struct Key(String);

/// Which key rule a value broke.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
#[non_exhaustive]
pub enum KeyError {
    /// No key was given (an `Option` key that is `None`).
    #[error("no idempotency key was given")]
    Missing,
    /// The key is the empty string.
    #[error("the key is empty; it must be 1 to 255 bytes of visible ASCII")]
    Empty,
    /// The key is longer than [`MAX_KEY_LEN`].
    #[error("the key is {len} bytes long; at most 255 bytes are allowed")]
    TooLong {
        /// The key's length in bytes.
        len: usize,
    },
    /// The key holds a byte outside visible ASCII.
    #[error("the key has byte 0x{byte:02x} at offset {offset}; only visible ASCII (0x21..=0x7e) is allowed")]
    InvalidByte {
        /// Where the first offending byte is.
        offset: usize,
        /// The offending byte.
        byte: u8,
    },
}

impl Key {
    /// Validates `value` as a key.
    pub fn new(value: impl Into<String>) -> Result<Self, KeyError> {
        let value = value.into();
        Self::check(&value)?;
        Ok(Key(value))
    }

    /// Checks the key rules without allocating.
    pub fn check(value: &str) -> Result<(), KeyError> {
        if value.is_empty() {
            return Err(KeyError::Empty);
        }
        if value.len() > MAX_KEY_LEN {
            return Err(KeyError::TooLong { len: value.len() });
        }
        match value.bytes().position(|b| !(0x21..=0x7e).contains(&b)) {
            Some(offset) => Err(KeyError::InvalidByte {
                offset,
                byte: value.as_bytes()[offset],
            }),
            None => Ok(()),
        }
    }

    /// The key as text.
    pub fn as_str(&self) -> &str {
        &self.0
    }
}

impl fmt::Debug for Key {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        fmt::Debug::fmt(&self.0, f)
    }
}

impl fmt::Display for Key {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(&self.0)
    }
}

impl TryFrom<String> for Key {
    type Error = KeyError;
    fn try_from(value: String) -> Result<Self, KeyError> {
        Key::new(value)
    }
}

impl TryFrom<&str> for Key {
    type Error = KeyError;
    fn try_from(value: &str) -> Result<Self, KeyError> {
        Key::new(value)
    }
}

impl std::str::FromStr for Key {
    type Err = KeyError;
    fn from_str(value: &str) -> Result<Self, KeyError> {
        Key::new(value)
    }
}

/// Values that can serve as an idempotency key: strings, [`Key`] itself,
/// and integers (their decimal form). Used by the `key = ...` argument of
/// `#[idempotent]`, so a field of any of these types can be named directly.
pub trait AsKey {
    /// Validates and converts the value.
    fn to_key(&self) -> Result<Key, KeyError>;
}

impl AsKey for Key {
    fn to_key(&self) -> Result<Key, KeyError> {
        Ok(self.clone())
    }
}

impl AsKey for str {
    fn to_key(&self) -> Result<Key, KeyError> {
        Key::new(self)
    }
}

impl AsKey for String {
    fn to_key(&self) -> Result<Key, KeyError> {
        Key::new(self.as_str())
    }
}

impl<T: AsKey + ?Sized> AsKey for &T {
    fn to_key(&self) -> Result<Key, KeyError> {
        (**self).to_key()
    }
}

impl<T: AsKey> AsKey for Option<T> {
    /// `None` is a missing key: [`KeyError::Missing`].
    fn to_key(&self) -> Result<Key, KeyError> {
        match self {
            Some(value) => value.to_key(),
            None => Err(KeyError::Missing),
        }
    }
}

macro_rules! integer_keys {
    ($($ty:ty),*) => {$(
        impl AsKey for $ty {
            fn to_key(&self) -> Result<Key, KeyError> {
                Ok(Key(self.to_string()))
            }
        }
    )*};
}
integer_keys!(u8, u16, u32, u64, u128, usize, i8, i16, i32, i64, i128, isize);

/// The operation a key belongs to, optionally narrowed to a principal
/// (tenant, account, API key id).
///
/// Records are unique per `(scope, key)`: the same key used for two
/// operations, or by two principals, never shares a result. The operation
/// must not contain a line feed; the principal may be any text.
#[derive(Clone, PartialEq, Eq, Hash, Debug)]
pub struct Scope {
    // `operation` alone, or `operation '\n' principal`: the operation has no
    // line feed, so the split is unambiguous.
    joined: String,
    operation_len: usize,
}

impl Scope {
    /// A scope for `operation`. Line feeds in the operation are replaced by
    /// spaces so the stored form stays unambiguous.
    pub fn new(operation: impl Into<String>) -> Self {
        let mut joined: String = operation.into();
        if joined.contains('\n') {
            joined = joined.replace('\n', " ");
        }
        Scope {
            operation_len: joined.len(),
            joined,
        }
    }

    /// The same operation, narrowed to `principal`.
    pub fn with_principal(mut self, principal: impl AsRef<str>) -> Self {
        self.joined.truncate(self.operation_len);
        self.joined.push('\n');
        self.joined.push_str(principal.as_ref());
        self
    }

    /// The operation part.
    pub fn operation(&self) -> &str {
        &self.joined[..self.operation_len]
    }

    /// The principal part, if any.
    pub fn principal(&self) -> Option<&str> {
        self.joined.get(self.operation_len + 1..)
    }

    /// The stored form: the operation, then a line feed and the principal
    /// when there is one.
    pub fn as_str(&self) -> &str {
        &self.joined
    }

    /// The inverse of [`Scope::as_str`]: splits at the first line feed.
    pub fn from_stored(stored: &str) -> Self {
        match stored.split_once('\n') {
            Some((operation, principal)) => Scope::new(operation).with_principal(principal),
            None => Scope::new(stored),
        }
    }
}

impl fmt::Display for Scope {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self.principal() {
            Some(p) => write!(f, "{} [{}]", self.operation(), p),
            None => f.write_str(self.operation()),
        }
    }
}

impl From<&str> for Scope {
    fn from(value: &str) -> Self {
        Scope::new(value)
    }
}

impl From<String> for Scope {
    fn from(value: String) -> Self {
        Scope::new(value)
    }
}

impl From<&Scope> for Scope {
    fn from(value: &Scope) -> Self {
        value.clone()
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn key_rules() {
        assert!(Key::new("a").is_ok());
        assert!(Key::new("8e03978e-40d5-43e8-bc93-6894a57f9324").is_ok());
        assert_eq!(Key::new(""), Err(KeyError::Empty));
        assert_eq!(Key::new("x".repeat(255)).map(|k| k.as_str().len()), Ok(255));
        assert_eq!(
            Key::new("x".repeat(256)),
            Err(KeyError::TooLong { len: 256 })
        );
        assert_eq!(
            Key::new("ab c"),
            Err(KeyError::InvalidByte {
                offset: 2,
                byte: b' '
            })
        );
        assert_eq!(
            Key::new("é"),
            Err(KeyError::InvalidByte {
                offset: 0,
                byte: 0xc3
            })
        );
        assert_eq!(
            Key::new("a\n"),
            Err(KeyError::InvalidByte {
                offset: 1,
                byte: b'\n'
            })
        );
    }

    #[test]
    fn key_conversions() {
        assert_eq!(42u64.to_key().unwrap().as_str(), "42");
        assert_eq!((-7i32).to_key().unwrap().as_str(), "-7");
        assert_eq!(Some("k").to_key().unwrap().as_str(), "k");
        assert_eq!(None::<String>.to_key(), Err(KeyError::Missing));
        assert_eq!(String::from("k").to_key().unwrap().as_str(), "k");
    }

    #[test]
    fn scope_parts() {
        let s = Scope::new("billing::charge");
        assert_eq!(s.operation(), "billing::charge");
        assert_eq!(s.principal(), None);
        let p = s.clone().with_principal("acct_1");
        assert_eq!(p.operation(), "billing::charge");
        assert_eq!(p.principal(), Some("acct_1"));
        assert_eq!(p.as_str(), "billing::charge\nacct_1");
        assert_ne!(s, p);
        assert_eq!(p.clone().with_principal("b").principal(), Some("b"));
        assert_eq!(Scope::new("a\nb").operation(), "a b");
        assert_eq!(Scope::from_stored(p.as_str()), p);
        assert_eq!(Scope::from_stored(s.as_str()), s);
        let empty = Scope::new("op").with_principal("");
        assert_eq!(Scope::from_stored(empty.as_str()), empty);
    }
}
