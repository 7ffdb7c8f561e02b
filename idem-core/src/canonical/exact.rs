//! Whether a JSON text reads into a `serde_json::Value` without losing
//! what tells it apart from another text: see [JSON numbers and repeated
//! members](super#json-numbers-and-repeated-members).

use serde_json::Value;

/// The value of `json` when it is a JSON text that `serde_json` reads
/// (nested at most 128 levels) and reading it loses nothing that tells it
/// apart from another text (see [JSON numbers and repeated
/// members](super#json-numbers-and-repeated-members)); `None` when it is to
/// be fingerprinted by its bytes.
pub fn exact_value(json: &[u8]) -> Option<Value> {
    // serde_json refuses nesting over 128 levels: the walks below are
    // bounded.
    let value: Value = serde_json::from_slice(json).ok()?;
    (numbers_are_exact(json) && members_are_unique(json)).then_some(value)
}

/// Whether every number of `json`, which is valid JSON text, is one that a
/// `serde_json::Value` keeps apart from every other number.
fn numbers_are_exact(json: &[u8]) -> bool {
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
fn members_are_unique(json: &[u8]) -> bool {
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
/// written alike: an integer of 64 bits, or a number that `serde_json`
/// reads as a double whose shortest text has the value of the number's
/// text, in any spelling (see [JSON numbers and repeated
/// members](super#json-numbers-and-repeated-members) for what is refused,
/// and why).
fn number_is_exact(number: &[u8]) -> bool {
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

    #[test]
    fn exact_numbers() {
        let exact = |n: &str| number_is_exact(n.as_bytes());
        for n in [
            "0",
            "-0",
            "0.0",
            "-0.0e-5",
            "-9223372036854775808",
            "18446744073709551615",
            "19.99",
            "-1.5e3",
            "123456789012345",
            "1.23456789012345",
            "100000000000000000000",
            "0.000000000000001234",
            "1e300",
            "1e-300",
            "1E+2",
        ] {
            assert!(exact(n), "{n}");
        }
        for n in [
            "18446744073709551616",
            "1e99999999999",
            "12345678901234567890123",
        ] {
            assert!(!exact(n), "{n}");
        }
    }

    /// Whether `number` reads back as itself: `serde_json` reads it as
    /// the double nearest to it, and that double's shortest text has the
    /// same value. `serde_json` (without its `float_roundtrip` feature)
    /// reads some numbers as a neighbouring double.
    fn reads_back(number: &str) -> bool {
        let nearest: f64 = number.parse().unwrap();
        let read: f64 = serde_json::from_str(number).unwrap();
        read == nearest && value_of(&format!("{nearest:e}")) == value_of(number)
    }

    /// The canonical text of the JSON number `number`, as a body holding
    /// it is written.
    fn canonical(number: &str) -> String {
        let value: Value = serde_json::from_str(number).unwrap();
        let mut out = Vec::new();
        crate::canonical::write_text(&value, false, &mut out).unwrap();
        String::from_utf8(out).unwrap()
    }

    /// The decimal value of a JSON number: its sign (none for zero), its
    /// significant digits and the power of ten of the first of them.
    fn value_of(number: &str) -> (bool, String, i64) {
        let (negative, unsigned) = match number.strip_prefix('-') {
            Some(unsigned) => (true, unsigned),
            None => (false, number),
        };
        let (mantissa, exponent) = unsigned.split_once(['e', 'E']).unwrap_or((unsigned, "0"));
        let exponent: i64 = exponent.trim_start_matches('+').parse().unwrap();
        let (int, frac) = mantissa.split_once('.').unwrap_or((mantissa, ""));
        let all = format!("{int}{frac}");
        let digits = all.trim_start_matches('0');
        let leading = (all.len() - digits.len()) as i64;
        let digits = digits.trim_end_matches('0');
        if digits.is_empty() {
            return (false, String::new(), 0);
        }
        let power = int.len() as i64 - 1 - leading + exponent;
        (negative, digits.to_owned(), power)
    }

    /// The shortest text that reads back as its double, as `serde_json`
    /// and ryu write it, or JavaScript (`JSON.stringify`, `toString`),
    /// is exact in any spelling of its value.
    #[test]
    fn shortest_round_trip_numbers_are_exact() {
        let exact = |n: &str| number_is_exact(n.as_bytes());
        for n in [
            // 19.99 * 3, 0.1 + 0.2, 0.1 * 7, 10 / 3 in JavaScript.
            "59.97000000000001",
            "5.997000000000001e1",
            "-59.97000000000001",
            "0.30000000000000004",
            "0.7000000000000001",
            "3.3333333333333335",
            // The neighbour of 59.97000000000001's double.
            "59.970000000000006",
            "1234567890123456.5",
            "1.234567890123456",
            // JavaScript's exponent forms, and their plain spellings.
            "1e+21",
            "1E21",
            "1.5e-7",
            "-1.5E-7",
            "0.00000015",
            // 2^64: JavaScript writes it 18446744073709552000.
            "18446744073709552000",
            "1.8446744073709552e+19",
            // The largest double, the smallest normal and subnormal ones.
            "1.7976931348623157e308",
            "2.2250738585072014e-308",
            "5e-324",
            "1e301",
            "-0.0",
        ] {
            assert!(exact(n), "{n}");
            assert_eq!(value_of(&canonical(n)), value_of(n), "{n}");
        }
        for n in [
            // 0.1's double, which is not its shortest text: the same
            // double as 0.1, another number.
            "0.10000000000000001",
            "0.1000000000000000055511151231257827021181583404541015625",
            // 2^64 and its neighbour: one double, written
            // 1.8446744073709552e+19.
            "18446744073709551616",
            "18446744073709551617",
            // 5e-324's double.
            "4e-324",
            // No double: 0 and infinity.
            "1e-400",
            "1e400",
        ] {
            assert!(!exact(n), "{n}");
        }
        // Shortest texts of their doubles, and decimals of at most 15
        // digits: exact only when read back as themselves. serde_json
        // reads 1945349.4000000001 (JavaScript's 1945349.4 + 1e-10) as
        // the double it writes 1945349.4, which would merge the two.
        for n in [
            "1945349.4000000001",
            "123456789012345680000",
            "2220190e-143",
            "1e-301",
            "938.3226829268293",
        ] {
            assert_eq!(exact(n), reads_back(n), "{n}");
        }
    }

    /// Texts of numbers near and far from each other, as the writers of
    /// JSON spell them: shortest texts of random doubles (`1e21` and
    /// `1000000000000000000000`), of their neighbours, texts with one
    /// digit more or fewer, decimals of 15 digits, integers past 2^53 and
    /// 2^64, and amounts computed in cents.
    fn number_texts() -> Vec<String> {
        let mut state: u64 = 0x9E37_79B9_7F4A_7C15;
        let mut next = move || {
            state ^= state << 13;
            state ^= state >> 7;
            state ^= state << 17;
            state
        };
        let mut texts = Vec::new();
        for _ in 0..3000 {
            let bits = next();
            let double = f64::from_bits(bits);
            let cents = (bits % 100_000_000) as f64 / 100.0;
            let amounts = [cents * (1 + bits % 7) as f64, cents / 3.0, cents * 1.21];
            for d in [double, f64::from_bits(bits >> 2)]
                .into_iter()
                .chain(amounts)
            {
                if !d.is_finite() {
                    continue;
                }
                let up = f64::from_bits(d.to_bits() + 1);
                for d in [d, up, -d].into_iter().filter(|d| d.is_finite()) {
                    texts.push(format!("{d:e}"));
                    texts.push(format!("{d:.16e}"));
                    texts.push(format!("{d:.17e}"));
                    texts.push(format!("{d:.14e}"));
                    if d.abs() < 1e30 {
                        texts.push(format!("{d}"));
                    }
                }
            }
            let digits = 1 + next() % 15;
            let mantissa = next() % 10_u64.pow(digits as u32);
            let exponent = (next() % 601) as i64 - 300 - digits as i64;
            texts.push(format!("{mantissa}e{exponent}"));
            let big = next();
            texts.push(format!("{big}"));
            texts.push(format!(
                "{}",
                u128::from(big) * 1000 + u128::from(big % 1000)
            ));
            texts.push(format!("{}", (1_u64 << 53) + big % 1000));
        }
        texts
    }

    /// Every accepted number is written canonically as a text of its
    /// own value, so no two accepted numbers of different values are
    /// written alike.
    #[test]
    fn canonical_numbers_are_the_numbers_accepted() {
        let mut seen = std::collections::HashMap::new();
        let (mut accepted, mut long) = (0, 0);
        for n in number_texts() {
            if !number_is_exact(n.as_bytes()) {
                continue;
            }
            accepted += 1;
            let value = value_of(&n);
            long += usize::from(value.1.len() > 15);
            let written = canonical(&n);
            assert_eq!(value_of(&written), value, "{n} is written {written}");
            if let Some(other) = seen.insert(written.clone(), (n.clone(), value.clone())) {
                assert_eq!(other.1, value, "{n} and {} are written {written}", other.0);
            }
        }
        // Both kinds are there: the property is not vacuous.
        assert!(accepted > 10_000 && long > 1000, "{accepted} {long}");
    }

    #[test]
    fn strings_are_skipped_whatever_they_hold() {
        assert!(numbers_are_exact(br#"["a\"1234567890123456789", "\\", 1]"#));
        assert!(!numbers_are_exact(br#"["\\", 1234567890123456789012]"#));
        // Not valid JSON, but never a panic.
        for text in [&b"\"\\"[..], b"\"", b"-", b"1e", b"\xff"] {
            numbers_are_exact(text);
        }
    }
}
