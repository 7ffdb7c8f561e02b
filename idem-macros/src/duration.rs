//! Duration literals such as `"24h"`, `"1h30m"` or `"500ms"`, checked at
//! compile time.
//!
//! A duration is one or more `<integer><unit>` parts written without spaces;
//! the parts add up. The units are `ms`, `s`, `m`, `h` and `d` (a day is
//! 24 hours). The total is a whole number of milliseconds that fits a `u64`.

use std::fmt;

/// Why a duration literal was rejected.
#[derive(Debug, Clone, PartialEq, Eq)]
pub(crate) enum DurationError {
    /// The literal is empty.
    Empty,
    /// A number is not followed by a unit.
    MissingUnit { number: String },
    /// A unit is not preceded by a number.
    MissingNumber { at: String },
    /// A unit other than `ms`, `s`, `m`, `h`, `d`.
    UnknownUnit { unit: String },
    /// A decimal point: fractions are not supported.
    Fraction,
    /// A character that is neither a digit nor a unit letter.
    UnexpectedChar { ch: char },
    /// The total does not fit in a `u64` count of milliseconds.
    Overflow,
    /// The total is zero where zero is not allowed.
    Zero,
}

impl fmt::Display for DurationError {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            DurationError::Empty => f.write_str("the duration is empty"),
            DurationError::MissingUnit { number } => {
                write!(f, "`{number}` has no unit")
            }
            DurationError::MissingNumber { at } => {
                write!(f, "expected a number before `{at}`")
            }
            DurationError::UnknownUnit { unit } => write!(f, "unknown unit `{unit}`"),
            DurationError::Fraction => f.write_str("fractions are not supported"),
            DurationError::UnexpectedChar { ch } => {
                write!(f, "unexpected character {ch:?}")
            }
            DurationError::Overflow => f.write_str("the duration is too long"),
            DurationError::Zero => f.write_str("the duration is zero"),
        }
    }
}

/// Parses `text` into a number of milliseconds.
///
/// A zero total is an error unless `allow_zero` is set.
pub(crate) fn parse_millis(text: &str, allow_zero: bool) -> Result<u64, DurationError> {
    if text.is_empty() {
        return Err(DurationError::Empty);
    }
    // Byte offset of the end of the run of chars matching `pred` from `from`.
    let run_end = |from: usize, pred: fn(char) -> bool| {
        text[from..]
            .char_indices()
            .find(|&(_, c)| !pred(c))
            .map_or(text.len(), |(offset, _)| from + offset)
    };
    let mut total: u64 = 0;
    let mut i = 0;
    while i < text.len() {
        let digits_end = run_end(i, |c| c.is_ascii_digit());
        let number = &text[i..digits_end];
        let unit_end = run_end(digits_end, char::is_alphabetic);
        let unit = &text[digits_end..unit_end];
        let next = text[unit_end..].chars().next();

        if number.is_empty() {
            return Err(match text[i..].chars().next() {
                Some('.') => DurationError::Fraction,
                Some(c) if !c.is_alphabetic() => DurationError::UnexpectedChar { ch: c },
                _ => DurationError::MissingNumber {
                    at: unit.to_owned(),
                },
            });
        }
        if unit.is_empty() {
            return Err(match next {
                Some('.') => DurationError::Fraction,
                Some(c) => DurationError::UnexpectedChar { ch: c },
                None => DurationError::MissingUnit {
                    number: number.to_owned(),
                },
            });
        }
        let per_unit: u64 = match unit {
            "ms" => 1,
            "s" => 1_000,
            "m" => 60_000,
            "h" => 3_600_000,
            "d" => 86_400_000,
            _ => {
                return Err(DurationError::UnknownUnit {
                    unit: unit.to_owned(),
                })
            }
        };
        let value: u64 = number.parse().map_err(|_| DurationError::Overflow)?;
        total = value
            .checked_mul(per_unit)
            .and_then(|part| total.checked_add(part))
            .ok_or(DurationError::Overflow)?;
        i = unit_end;
    }
    if total == 0 && !allow_zero {
        return Err(DurationError::Zero);
    }
    Ok(total)
}

#[cfg(test)]
mod tests {
    use super::*;

    fn ok(text: &str) -> u64 {
        parse_millis(text, false).unwrap_or_else(|e| panic!("{text:?}: {e}"))
    }

    fn err(text: &str) -> DurationError {
        parse_millis(text, false).expect_err(text)
    }

    #[test]
    fn single_units() {
        assert_eq!(ok("500ms"), 500);
        assert_eq!(ok("30s"), 30_000);
        assert_eq!(ok("5m"), 300_000);
        assert_eq!(ok("24h"), 86_400_000);
        assert_eq!(ok("7d"), 604_800_000);
        assert_eq!(ok("007s"), 7_000);
    }

    #[test]
    fn parts_add_up() {
        assert_eq!(ok("1h30m"), 5_400_000);
        assert_eq!(ok("1m1s1ms"), 61_001);
        assert_eq!(ok("1d12h"), 129_600_000);
        assert_eq!(ok("0h1s"), 1_000);
    }

    #[test]
    fn zero() {
        assert_eq!(err("0s"), DurationError::Zero);
        assert_eq!(err("0h0m"), DurationError::Zero);
        assert_eq!(parse_millis("0s", true), Ok(0));
        assert_eq!(parse_millis("0ms", true), Ok(0));
    }

    #[test]
    fn malformed() {
        assert_eq!(err(""), DurationError::Empty);
        assert_eq!(
            err("30"),
            DurationError::MissingUnit {
                number: "30".into()
            }
        );
        assert_eq!(
            err("1h30"),
            DurationError::MissingUnit {
                number: "30".into()
            }
        );
        assert_eq!(err("h"), DurationError::MissingNumber { at: "h".into() });
        assert_eq!(
            err("10sec"),
            DurationError::UnknownUnit { unit: "sec".into() }
        );
        assert_eq!(err("3w"), DurationError::UnknownUnit { unit: "w".into() });
        assert_eq!(err("10S"), DurationError::UnknownUnit { unit: "S".into() });
        assert_eq!(err("1.5h"), DurationError::Fraction);
        assert_eq!(err(".5h"), DurationError::Fraction);
        assert_eq!(err("1h 30m"), DurationError::UnexpectedChar { ch: ' ' });
        assert_eq!(err(" 1h"), DurationError::UnexpectedChar { ch: ' ' });
        assert_eq!(err("-1s"), DurationError::UnexpectedChar { ch: '-' });
        assert_eq!(err("1s-"), DurationError::UnexpectedChar { ch: '-' });
        assert_eq!(err("5µs"), DurationError::UnknownUnit { unit: "µs".into() });
        assert_eq!(err("1h_30m"), DurationError::UnexpectedChar { ch: '_' });
    }

    #[test]
    fn overflow() {
        assert_eq!(ok("18446744073709551615ms"), u64::MAX);
        assert_eq!(err("18446744073709551616ms"), DurationError::Overflow);
        assert_eq!(err("18446744073709551615s"), DurationError::Overflow);
        assert_eq!(err("18446744073709551615ms1ms"), DurationError::Overflow);
        assert_eq!(err("99999999999999999999999999d"), DurationError::Overflow);
    }
}
