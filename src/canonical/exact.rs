//! Whether a JSON text can be read into a `serde_json::Value` without
//! losing what tells it apart from another text: the check made before a
//! JSON body ([`crate::http`]) or a consumer's message
//! ([`crate::consumer::content_key_of_json`]) is fingerprinted by its
//! canonical form rather than by its bytes.
//!
//! A JSON value holds a number as a 64-bit integer or as an `f64`, which
//! would merge `100000000000000000001` with `100000000000000000000`; so
//! each number of the text must be an integer of 64 bits, or one that the
//! canonical form writes as a text of its own value (see
//! [`number_is_exact`]: `59.97000000000001` is, `0.10000000000000001`,
//! which reads as 0.1's double, is not). And a JSON value keeps
//! the last member of an object that names one twice, which would merge
//! `{"amount":1,"amount":100}` with `{"amount":100}`, where a reader that
//! keeps the first sees 1. A text with such a number or such an object is
//! to be fingerprinted by its bytes.

use serde_json::Value;

/// The value of `json` when it is a JSON text that `serde_json` reads
/// (nested at most 128 levels) and reading it loses nothing that tells it
/// apart from another text (see the module documentation); `None` when it
/// is to be fingerprinted by its bytes.
pub(crate) fn exact_value(json: &[u8]) -> Option<Value> {
    // serde_json refuses nesting over 128 levels: the walks below are
    // bounded.
    let value: Value = serde_json::from_slice(json).ok()?;
    (numbers_are_exact(json) && members_are_unique(json)).then_some(value)
}

/// Whether every number of `json`, which is valid JSON text, is one that a
/// `serde_json::Value` keeps apart from every other number: see the
/// module documentation.
pub(crate) fn numbers_are_exact(json: &[u8]) -> bool {
    let mut rest = json;
    while let Some((&first, tail)) = rest.split_first() {
        rest = match first {
            b'"' => after_string(tail),
            b'-' | b'0'..=b'9' => {
                let len = rest
                    .iter()
                    .position(|b| !matches!(b, b'0'..=b'9' | b'-' | b'+' | b'.' | b'e' | b'E'))
                    .unwrap_or(rest.len());
                let (number, tail) = rest.split_at(len);
                if !number_is_exact(number) {
                    return false;
                }
                tail
            }
            _ => tail,
        };
    }
    true
}

/// Whether no object of the JSON text `json` names a member twice.
pub(crate) fn members_are_unique(json: &[u8]) -> bool {
    serde_json::from_slice::<UniqueMembers>(json).is_ok()
}

/// A JSON value read only to check that no object in it names a member
/// twice: reading it fails at the first repeated name.
struct UniqueMembers;

impl<'de> serde::Deserialize<'de> for UniqueMembers {
    fn deserialize<D: serde::Deserializer<'de>>(deserializer: D) -> Result<Self, D::Error> {
        deserializer.deserialize_any(UniqueMembers)
    }
}

impl<'de> serde::de::Visitor<'de> for UniqueMembers {
    type Value = UniqueMembers;

    fn expecting(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str("a JSON value")
    }
    fn visit_bool<E>(self, _: bool) -> Result<Self, E> {
        Ok(self)
    }
    fn visit_i64<E>(self, _: i64) -> Result<Self, E> {
        Ok(self)
    }
    fn visit_u64<E>(self, _: u64) -> Result<Self, E> {
        Ok(self)
    }
    fn visit_f64<E>(self, _: f64) -> Result<Self, E> {
        Ok(self)
    }
    fn visit_str<E>(self, _: &str) -> Result<Self, E> {
        Ok(self)
    }
    fn visit_unit<E>(self) -> Result<Self, E> {
        Ok(self)
    }
    fn visit_seq<A: serde::de::SeqAccess<'de>>(self, mut items: A) -> Result<Self, A::Error> {
        while items.next_element::<UniqueMembers>()?.is_some() {}
        Ok(self)
    }
    fn visit_map<A: serde::de::MapAccess<'de>>(self, mut members: A) -> Result<Self, A::Error> {
        let mut names = std::collections::HashSet::new();
        while let Some(name) = members.next_key::<String>()? {
            if !names.insert(name) {
                return Err(serde::de::Error::custom("a member is named twice"));
            }
            members.next_value::<UniqueMembers>()?;
        }
        Ok(self)
    }
}

/// What follows the string whose opening quote precedes `string`.
fn after_string(string: &[u8]) -> &[u8] {
    let mut i = 0;
    while let Some(&b) = string.get(i) {
        match b {
            b'\\' => i += 2,
            b'"' => return string.get(i + 1..).unwrap_or_default(),
            _ => i += 1,
        }
    }
    &[]
}

/// Whether one JSON number (its text) is written in the canonical form
/// as a text of its own value, so that no number of another value is
/// written alike: an integer of 64 bits, which a `serde_json::Value` keeps
/// as one; or a number that `serde_json` reads as a double whose text
/// (the shortest that reads back as that double, such as
/// `59.97000000000001`) has the value of the number's text, in any
/// spelling (`5.997000000000001e1`, `1e+21`, `0.00000015`, `-0.0`).
///
/// Refused: a text with more digits than its double's shortest one
/// (`0.10000000000000001`, another number read as 0.1's double;
/// `18446744073709551616`, written `1.8446744073709552e+19`), a number
/// beyond the doubles (`1e400`, `1e-400`), and one that `serde_json`
/// reads as a neighbour of its nearest double (without its
/// `float_roundtrip` feature, it reads `1945349.4000000001` as the double
/// it writes `1945349.4`).
pub(crate) fn number_is_exact(number: &[u8]) -> bool {
    // JSON numbers are ASCII.
    let Ok(text) = std::str::from_utf8(number) else {
        return false;
    };
    if text.parse::<i64>().is_ok() || text.parse::<u64>().is_ok() {
        return true;
    }
    // The number as the canonical form writes it: read into a value, as
    // the whole text is, and written by serde_json.
    let Ok(value) = serde_json::from_str::<Value>(text) else {
        return false;
    };
    let Ok(written) = serde_json::to_string(&value) else {
        return false;
    };
    decimal(text).is_some_and(|read| decimal(&written) == Some(read))
}

/// The value of a JSON number's text.
#[derive(Debug, PartialEq)]
struct Decimal {
    /// Whether it is below zero.
    negative: bool,
    /// Its significant digits, from the first to the last that is not 0:
    /// none for zero.
    digits: Vec<u8>,
    /// The power of ten of its first significant digit (0 for zero).
    power: i64,
}

/// The value of the JSON number `number`; `None` when it is not one, or
/// its exponent is beyond an `i32`.
fn decimal(number: &str) -> Option<Decimal> {
    let (negative, unsigned) = match number.strip_prefix('-') {
        Some(unsigned) => (true, unsigned),
        None => (false, number),
    };
    let (mantissa, exponent) = match unsigned.split_once(['e', 'E']) {
        Some((mantissa, exponent)) => (mantissa, exponent.parse::<i32>().ok()?),
        None => (unsigned, 0),
    };
    let (int, frac) = mantissa.split_once('.').unwrap_or((mantissa, ""));
    if int.is_empty() || !int.bytes().chain(frac.bytes()).all(|b| b.is_ascii_digit()) {
        return None;
    }
    let mut digits: Vec<u8> = int.bytes().chain(frac.bytes()).collect();
    let Some(first) = digits.iter().position(|&d| d != b'0') else {
        return Some(Decimal {
            negative: false,
            digits: Vec::new(),
            power: 0,
        });
    };
    digits.drain(..first);
    while digits.last() == Some(&b'0') {
        digits.pop();
    }
    Some(Decimal {
        negative,
        digits,
        power: i64::from(exponent) + int.len() as i64 - 1 - first as i64,
    })
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn exact_values_are_those_reading_loses_nothing_of() {
        for exact in [
            r#"{"a":1,"b":[1.5,-2,"x"]}"#,
            " [ 18446744073709551615 ] ",
            r#"[{"a":1},{"a":1}]"#,
            r#""\"1.000000000000000001""#,
        ] {
            assert!(exact_value(exact.as_bytes()).is_some(), "{exact}");
        }
        for lossy in [
            r#"{"amount":1.000000000000000001}"#,
            "18446744073709551616",
            "1e400",
            r#"{"to":"mallory","to":"alice"}"#,
            r#"{"to":"mallory","\u0074o":"alice"}"#,
            // Not JSON, or not read by serde_json.
            "{",
            "",
            r#""\ud800""#,
        ] {
            assert!(exact_value(lossy.as_bytes()).is_none(), "{lossy}");
        }
    }
}
