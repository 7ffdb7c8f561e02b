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

use serde::{ser, Serialize, Serializer};
use serde_json::Value;
use sha2::{Digest, Sha256};

use crate::canonical;
use crate::error::Error;
use crate::key::{AsKey, Key, KeyError};

/// The SHA-256 digest of a canonical payload.
///
/// Equal payloads must serialize alike: object members are sorted, but
/// array order counts, and a `HashSet` serializes as an array in an order
/// of its own that differs between two equal sets. Make such a field a
/// `BTreeSet`, or mark it `#[serde(serialize_with =
/// "idem_core::fingerprint::unordered")]` (see [`unordered`]); otherwise an
/// equal retry fails with [`Error::KeyReused`].
#[derive(Clone, Copy, PartialEq, Eq, Hash)]
pub struct Fingerprint([u8; 32]);

impl Fingerprint {
    /// The fingerprint of `payload`'s canonical JSON form (see the module
    /// documentation).
    pub fn of<T: Serialize + ?Sized>(payload: &T) -> Result<Self, Error> {
        let (value, marked) = canonical::to_value(payload)?;
        Self::of_value(&value, marked)
    }

    /// The fingerprint of a value built by [`canonical::to_value`].
    pub fn of_value(value: &Value, marked: bool) -> Result<Self, Error> {
        // Hashed as it is written: no text is kept.
        let mut hasher = Sha256::new();
        canonical::write_text(value, marked, &mut hasher)?;
        Ok(Fingerprint(hasher.finalize().into()))
    }

    /// The canonical JSON text of `payload`, as hashed by [`Fingerprint::of`]
    /// (for a payload holding a non-finite float or an integer beyond 64
    /// bits, the marked form the module documentation describes, which is
    /// not JSON).
    pub fn canonical_json<T: Serialize + ?Sized>(payload: &T) -> Result<String, Error> {
        let (value, marked) = canonical::to_value(payload)?;
        let mut buf = Vec::with_capacity(128);
        canonical::write_text(&value, marked, &mut buf)?;
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

/// A key derived from several fields, or from any serializable value:
/// `sha256:` and the 64 hex digits of its canonical JSON's digest, so the
/// same fields always give the same key, in any process, whatever the
/// field order of a map. For a message or a command that carries no key of
/// its own but is identified by what it holds.
///
/// Array order is part of the key, and a `HashSet` serializes as an array
/// in an order of its own, which differs between two equal sets: a value
/// holding one gets another key each time it is built. Make it a
/// `BTreeSet`, or write it with [`unordered`]. (A `HashMap` is safe: its
/// members are sorted.)
///
/// ```
/// use idem_core::{key_of, AsKey};
///
/// let key = key_of(&("acct-7", "2026-11", 1200)).to_key().unwrap();
/// assert!(key.as_str().starts_with("sha256:"));
/// assert_eq!(key, key_of(&("acct-7", "2026-11", 1200)).to_key().unwrap());
/// // In the attribute: #[idempotent(key = idem_core::key_of(&(cmd.account, cmd.month)), ...)]
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

/// Serializes a collection whose order means nothing, such as a `HashSet`,
/// as a sequence sorted by each item's canonical JSON
/// ([`Fingerprint::canonical_json`]), so that equal collections always
/// serialize alike. For a field:
/// `#[serde(serialize_with = "idem_core::fingerprint::unordered")]`.
///
/// The fingerprint of a payload keeps the order of its arrays, as it
/// should for a list. But a `HashSet` serializes as an array in its
/// iteration order, which differs from one set to another equal one (each
/// set has a hasher of its own, and every process new ones): two equal
/// payloads then have different fingerprints, and the retry of a call
/// fails with [`Error::KeyReused`], or a message keyed by its content gets
/// another key and is processed again. Nothing in `serde` tells a set from
/// a list, so a payload holding a hash-ordered collection must say so:
/// make it a `BTreeSet` (an `IndexSet` keeps insertion order, so two equal
/// sets are alike only when built in one order), or write it with this
/// function. A `HashMap` needs neither: the members of an object are
/// sorted.
///
/// Items are sorted by their canonical text, whatever they hold:
/// non-finite floats and other values in the marked forms of the
/// [module documentation](self) have a text too. An item that cannot be
/// serialized fails the serialization, as it would unsorted.
///
/// ```
/// use std::collections::HashSet;
///
/// use idem_core::{key_of, AsKey, Fingerprint};
/// use serde::Serialize;
///
/// #[derive(Serialize)]
/// struct Grant {
///     account: String,
///     #[serde(serialize_with = "idem_core::fingerprint::unordered")]
///     permissions: HashSet<String>,
/// }
///
/// let grant = |permissions: &[&str]| Grant {
///     account: "acct-7".into(),
///     permissions: permissions.iter().map(|p| p.to_string()).collect(),
/// };
/// let a = grant(&["read", "write", "admin", "billing", "refund", "export"]);
/// let b = grant(&["export", "refund", "billing", "admin", "write", "read"]);
/// assert_eq!(Fingerprint::of(&a)?, Fingerprint::of(&b)?);
/// assert_eq!(key_of(&a).to_key()?, key_of(&b).to_key()?);
/// assert_eq!(
///     Fingerprint::canonical_json(&grant(&["write", "read"]))?,
///     r#"{"account":"acct-7","permissions":["read","write"]}"#
/// );
/// # Ok::<_, idem_core::Error>(())
/// ```
///
/// The attribute applies to the field's own collection: a set inside an
/// `Option`, a `Vec` or another type is written by a newtype whose
/// `Serialize` calls this function, or is a `BTreeSet`.
pub fn unordered<'c, C, S>(collection: &'c C, serializer: S) -> Result<S::Ok, S::Error>
where
    C: ?Sized,
    &'c C: IntoIterator,
    <&'c C as IntoIterator>::Item: Serialize,
    S: Serializer,
{
    let mut items = collection
        .into_iter()
        .map(|item| {
            let text = Fingerprint::canonical_json(&item).map_err(ser::Error::custom)?;
            Ok((text, item))
        })
        .collect::<Result<Vec<_>, S::Error>>()?;
    // Equal texts are equal items as far as a fingerprint goes: their
    // relative order does not matter.
    items.sort_unstable_by(|a, b| a.0.cmp(&b.0));
    serializer.collect_seq(items.iter().map(|(_, item)| item))
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

    #[derive(Serialize)]
    #[serde(bound(
        serialize = "for<'a> &'a T: IntoIterator, for<'a> <&'a T as IntoIterator>::Item: Serialize"
    ))]
    struct Unordered<T> {
        #[serde(serialize_with = "unordered")]
        items: T,
    }

    #[test]
    fn unordered_collections_serialize_sorted_by_canonical_text() {
        use std::collections::HashSet;
        let set = |items: &[&'static str]| Unordered {
            items: items.iter().copied().collect::<HashSet<_>>(),
        };
        assert_eq!(
            Fingerprint::canonical_json(&set(&["b", "a", "10", "9"])).unwrap(),
            r#"{"items":["10","9","a","b"]}"#
        );
        // Items sorted by their canonical text: object members sorted first.
        let maps = Unordered {
            items: vec![json!({"z": 1, "a": 2}), json!({"a": 1, "z": 2})],
        };
        assert_eq!(
            Fingerprint::canonical_json(&maps).unwrap(),
            r#"{"items":[{"a":1,"z":2},{"a":2,"z":1}]}"#
        );
        // Whatever the order of the items.
        let list = |items: Vec<i64>| Fingerprint::of(&Unordered { items }).unwrap();
        assert_eq!(list(vec![3, 1, 2]), list(vec![2, 3, 1]));
        assert_ne!(list(vec![3, 1, 2]), list(vec![3, 1, 1]));
        assert_ne!(list(vec![3, 1, 2]), list(vec![3, 1]));
    }

    #[test]
    fn unordered_items_with_non_finite_floats_have_one_order() {
        let of = |items: Vec<(f64, &str)>| Fingerprint::of(&Unordered { items }).unwrap();
        let nan = f64::NAN;
        let inf = f64::INFINITY;
        let a = of(vec![(nan, "a"), (1.5, "b"), (inf, "c"), (-inf, "\0x")]);
        assert_eq!(
            a,
            of(vec![(-inf, "\0x"), (inf, "c"), (nan, "a"), (1.5, "b")])
        );
        assert_ne!(
            a,
            of(vec![(nan, "a"), (1.5, "b"), (-inf, "c"), (-inf, "\0x")])
        );
        assert_ne!(a, of(vec![(nan, "a"), (1.5, "b"), (inf, "c")]));
        // Serializing them elsewhere refuses them as before.
        let items = vec![nan];
        assert!(crate::canonical::to_vec(&Unordered { items }).is_err());
    }

    #[test]
    fn unordered_fails_on_an_unserializable_item() {
        use std::collections::BTreeMap;
        let mut item = BTreeMap::new();
        item.insert((1, 2), 3);
        assert!(Fingerprint::of(&Unordered { items: vec![item] }).is_err());
    }

    #[test]
    fn hex_round_trip() {
        let f = Fingerprint::of_bytes(b"abc");
        assert_eq!(Fingerprint::from_hex(&f.to_hex()), Some(f));
        assert_eq!(Fingerprint::from_hex("zz"), None);
        assert_eq!(Fingerprint::from_hex(&"g".repeat(64)), None);
    }
}
