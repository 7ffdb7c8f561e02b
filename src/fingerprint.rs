//! Canonical payload fingerprints.
//!
//! A [`Fingerprint`] is the SHA-256 digest of a payload's *canonical JSON*
//! form, so that two encodings of the same request compare equal:
//!
//! - the payload is serialized with `serde` into a JSON value;
//! - object members are written sorted by key, comparing the keys' UTF-8
//!   bytes, at every depth; array order is kept;
//! - no whitespace is written; strings are escaped as `serde_json` escapes
//!   them (`"`, `\`, and control characters only; other characters as UTF-8);
//! - numbers are written as `serde_json` prints them (integers in decimal,
//!   floats in their shortest round-trip form).
//!
//! The sorting is done here, at write time, so the digest is the same whether
//! or not `serde_json`'s `preserve_order` feature is enabled in the final
//! build.
//!
//! A payload holding a value that JSON (as `serde_json` builds it) has no
//! form for, a non-finite float (NaN, +inf, -inf, which `serde_json`
//! writes as `null`) or an integer beyond 64 bits (a `u128` amount), is
//! fingerprinted in a form of its own, so that it compares equal to no
//! payload that differs from it: each non-finite float is written as the
//! string `"\u0000NaN"`, `"\u0000inf"` or `"\u0000-inf"`, each such
//! integer as `"\u0000int:"` and its digits, every string that starts with
//! NUL gets one more NUL in front, and the text is preceded by the bytes
//! `\0marked\0` (which start no JSON text). Every other payload keeps the
//! canonical text above.

use std::fmt;
use std::io::Write;

use serde::Serialize;
use serde_json::Value;
use sha2::{Digest, Sha256};

use crate::error::Error;
use crate::finite;
use crate::key::{AsKey, Key, KeyError};

/// What precedes the canonical text of a payload holding a value marked
/// (see the module documentation): no JSON text starts with NUL.
const MARKED: &[u8] = b"\0marked\0";

/// The SHA-256 digest of a canonical payload.
#[derive(Clone, Copy, PartialEq, Eq, Hash)]
pub struct Fingerprint([u8; 32]);

impl Fingerprint {
    /// The fingerprint of `payload`'s canonical JSON form (see the module
    /// documentation).
    pub fn of<T: Serialize + ?Sized>(payload: &T) -> Result<Self, Error> {
        let (value, marked) = finite::to_value(payload)?;
        Self::of_value(&value, marked)
    }

    /// The fingerprint of a value built by [`finite::to_value`].
    pub(crate) fn of_value(value: &Value, marked: bool) -> Result<Self, Error> {
        // Hashed as it is written: no text is kept.
        let mut hasher = Sha256::new();
        if marked {
            hasher.update(MARKED);
        }
        write_canonical(value, &mut hasher)?;
        Ok(Fingerprint(hasher.finalize().into()))
    }

    /// The canonical JSON text of `payload`, as hashed by [`Fingerprint::of`]
    /// (for a payload holding a non-finite float or an integer beyond 64
    /// bits, the marked form the module documentation describes, which is
    /// not JSON).
    pub fn canonical_json<T: Serialize + ?Sized>(payload: &T) -> Result<String, Error> {
        let (value, marked) = finite::to_value(payload)?;
        let mut buf = Vec::with_capacity(128);
        if marked {
            buf.extend_from_slice(MARKED);
        }
        write_canonical(&value, &mut buf)?;
        // Every byte came from serde_json's writer or from UTF-8 keys.
        String::from_utf8(buf).map_err(|e| Error::Config(e.to_string()))
    }

    /// The fingerprint of raw bytes (for payloads that are bytes already,
    /// such as an HTTP body).
    pub fn of_bytes(bytes: &[u8]) -> Self {
        Fingerprint(Sha256::digest(bytes).into())
    }

    /// Wraps a digest computed elsewhere.
    pub const fn from_digest(digest: [u8; 32]) -> Self {
        Fingerprint(digest)
    }

    /// The 32 digest bytes.
    pub fn as_bytes(&self) -> &[u8; 32] {
        &self.0
    }

    /// The digest as 64 lowercase hex digits.
    pub fn to_hex(&self) -> String {
        self.to_string()
    }

    /// Parses 64 hex digits (either case).
    pub fn from_hex(hex: &str) -> Option<Self> {
        if hex.len() != 64 {
            return None;
        }
        let mut out = [0u8; 32];
        for (i, pair) in hex.as_bytes().chunks(2).enumerate() {
            let hi = (pair[0] as char).to_digit(16)?;
            let lo = (pair[1] as char).to_digit(16)?;
            out[i] = (hi * 16 + lo) as u8;
        }
        Some(Fingerprint(out))
    }
}

impl fmt::Display for Fingerprint {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        for b in self.0 {
            write!(f, "{b:02x}")?;
        }
        Ok(())
    }
}

impl fmt::Debug for Fingerprint {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "Fingerprint({self})")
    }
}

/// Writes `value`'s canonical JSON text (see the module documentation) to
/// `out`: a buffer, or a hasher.
pub(crate) fn write_canonical<W: Write>(value: &Value, out: &mut W) -> Result<(), Error> {
    match value {
        Value::Object(map) => {
            let mut entries: Vec<(&String, &Value)> = map.iter().collect();
            entries.sort_unstable_by(|a, b| a.0.as_bytes().cmp(b.0.as_bytes()));
            put(out, b"{")?;
            for (i, (k, v)) in entries.into_iter().enumerate() {
                if i > 0 {
                    put(out, b",")?;
                }
                serde_json::to_writer(&mut *out, k)?;
                put(out, b":")?;
                write_canonical(v, out)?;
            }
            put(out, b"}")?;
        }
        Value::Array(items) => {
            put(out, b"[")?;
            for (i, v) in items.iter().enumerate() {
                if i > 0 {
                    put(out, b",")?;
                }
                write_canonical(v, out)?;
            }
            put(out, b"]")?;
        }
        scalar => serde_json::to_writer(&mut *out, scalar)?,
    }
    Ok(())
}

fn put<W: Write>(out: &mut W, bytes: &[u8]) -> Result<(), Error> {
    Ok(out.write_all(bytes).map_err(serde_json::Error::io)?)
}

/// A key derived from several fields, or from any serializable value:
/// `sha256:` and the 64 hex digits of its canonical JSON's digest, so the
/// same fields always give the same key, in any process, whatever the
/// field order of a map. For a message or a command that carries no key of
/// its own but is identified by what it holds.
///
/// ```
/// use idem::{key_of, AsKey};
///
/// let key = key_of(&("acct-7", "2026-11", 1200)).to_key().unwrap();
/// assert!(key.as_str().starts_with("sha256:"));
/// assert_eq!(key, key_of(&("acct-7", "2026-11", 1200)).to_key().unwrap());
/// // In the attribute: #[idempotent(key = idem::key_of(&(cmd.account, cmd.month)), ...)]
/// ```
pub fn key_of<T: Serialize + ?Sized>(value: &T) -> HashedKey {
    HashedKey(
        Fingerprint::of(value)
            .map_err(|err| err.to_string())
            .and_then(|f| Key::new(format!("sha256:{}", f.to_hex())).map_err(|e| e.to_string())),
    )
}

/// The key [`key_of`] derived, or why the value could not be serialized
/// (reported as [`KeyError::Unserializable`] when the key is used).
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct HashedKey(Result<Key, String>);

impl AsKey for HashedKey {
    fn to_key(&self) -> Result<Key, KeyError> {
        self.0.clone().map_err(KeyError::Unserializable)
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use serde_json::json;

    #[test]
    fn keys_sorted_at_every_depth() {
        let a: Value =
            serde_json::from_str(r#"{"b":1,"a":{"y":[{"d":1,"c":2}],"x":null}}"#).unwrap();
        let b: Value =
            serde_json::from_str(r#"{"a":{"x":null,"y":[{"c":2,"d":1}]},"b":1}"#).unwrap();
        assert_eq!(Fingerprint::of(&a).unwrap(), Fingerprint::of(&b).unwrap());
        assert_eq!(
            Fingerprint::canonical_json(&a).unwrap(),
            r#"{"a":{"x":null,"y":[{"c":2,"d":1}]},"b":1}"#
        );
    }

    #[test]
    fn differences_matter() {
        let a = Fingerprint::of(&json!({"amount": 100})).unwrap();
        assert_ne!(a, Fingerprint::of(&json!({"amount": 101})).unwrap());
        assert_ne!(a, Fingerprint::of(&json!({"amount": "100"})).unwrap());
        assert_ne!(
            Fingerprint::of(&json!([1, 2])).unwrap(),
            Fingerprint::of(&json!([2, 1])).unwrap()
        );
    }

    #[test]
    fn known_digest() {
        // sha256 of the three bytes `{}` and of `"é"` written as UTF-8.
        assert_eq!(
            Fingerprint::of(&json!({})).unwrap().to_hex(),
            "44136fa355b3678a1146ad16f7e8649e94fb4fc21fe77e8310c060f61caaff8a"
        );
        assert_eq!(Fingerprint::canonical_json("é\n").unwrap(), "\"é\\n\"");
    }

    #[test]
    fn hex_round_trip() {
        let f = Fingerprint::of_bytes(b"abc");
        assert_eq!(Fingerprint::from_hex(&f.to_hex()), Some(f));
        assert_eq!(Fingerprint::from_hex("zz"), None);
        assert_eq!(Fingerprint::from_hex(&"g".repeat(64)), None);
    }
}
