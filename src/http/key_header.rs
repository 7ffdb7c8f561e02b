//! Reading the key from the `Idempotency-Key` header.
//!
//! The IETF draft defines the header as an RFC 8941 Structured Field Item
//! whose value is a String: `Idempotency-Key: "8e03978e-40d5-43e8"`. Many
//! clients send the key bare (`Idempotency-Key: 8e03978e-40d5-43e8`), so a
//! value that does not start with a double quote is taken as the key itself.
//! Either way the result must pass the [`Key`] rules: 1 to 255 bytes of
//! visible ASCII.

use std::fmt;

use ::http::header::{HeaderMap, HeaderName};

use crate::key::{Key, KeyError};

/// Why the header did not yield a key.
#[derive(Debug, Clone, PartialEq, Eq)]
pub(crate) enum KeyHeaderError {
    /// The request has no such header.
    Missing,
    /// The header appears more than once.
    Repeated,
    /// The value is not a valid Structured Field String.
    BadString(&'static str),
    /// The decoded key breaks the key rules.
    Key(KeyError),
}

impl fmt::Display for KeyHeaderError {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            KeyHeaderError::Missing => f.write_str("the request has no idempotency key header"),
            KeyHeaderError::Repeated => {
                f.write_str("the idempotency key header is given more than once")
            }
            KeyHeaderError::BadString(why) => {
                write!(f, "the key is not a valid structured field string: {why}")
            }
            KeyHeaderError::Key(err) => err.fmt(f),
        }
    }
}

/// The key carried by the header `name` of `headers`.
pub(crate) fn key_from_headers(
    headers: &HeaderMap,
    name: &HeaderName,
) -> Result<Key, KeyHeaderError> {
    let mut values = headers.get_all(name).iter();
    let value = values.next().ok_or(KeyHeaderError::Missing)?;
    if values.next().is_some() {
        return Err(KeyHeaderError::Repeated);
    }
    parse_key(value.as_bytes())
}

/// Parses one header value: a Structured Field String, or a bare key.
pub(crate) fn parse_key(value: &[u8]) -> Result<Key, KeyHeaderError> {
    // RFC 8941 4.2: leading and trailing spaces are discarded; HTTP also
    // strips tabs around field values.
    let value = trim_ows(value);
    let key = match value.first() {
        Some(b'"') => parse_sf_string(value)?,
        _ => {
            if let Some(offset) = value.iter().position(|b| !(0x21..=0x7e).contains(b)) {
                return Err(KeyHeaderError::Key(KeyError::InvalidByte {
                    offset,
                    byte: value[offset],
                }));
            }
            // Visible ASCII only, so this is valid UTF-8.
            String::from_utf8_lossy(value).into_owned()
        }
    };
    Key::new(key).map_err(KeyHeaderError::Key)
}

fn trim_ows(mut value: &[u8]) -> &[u8] {
    while let [b' ' | b'\t', rest @ ..] = value {
        value = rest;
    }
    while let [rest @ .., b' ' | b'\t'] = value {
        value = rest;
    }
    value
}

/// RFC 8941 4.2.5: `"` then characters 0x20..=0x7e where `"` and `\` are
/// escaped with `\`, then `"`, then nothing. Parameters after the string
/// are not accepted: the draft defines none.
fn parse_sf_string(value: &[u8]) -> Result<String, KeyHeaderError> {
    let bad = KeyHeaderError::BadString;
    let mut out = String::with_capacity(value.len());
    let mut bytes = value[1..].iter();
    loop {
        match bytes.next() {
            None => return Err(bad("the closing double quote is missing")),
            Some(b'\\') => match bytes.next() {
                Some(&c @ (b'"' | b'\\')) => out.push(c as char),
                Some(_) => return Err(bad("a backslash may only escape `\"` or `\\`")),
                None => return Err(bad("the closing double quote is missing")),
            },
            Some(b'"') => break,
            Some(&c @ 0x20..=0x7e) => out.push(c as char),
            Some(_) => {
                return Err(bad(
                    "only printable ASCII (0x20..=0x7e) may appear inside the quotes",
                ))
            }
        }
    }
    if bytes.next().is_some() {
        return Err(bad("nothing may follow the closing double quote"));
    }
    Ok(out)
}

#[cfg(test)]
mod tests {
    use super::*;

    fn key(value: &str) -> Result<String, KeyHeaderError> {
        parse_key(value.as_bytes()).map(|k| k.as_str().to_owned())
    }

    #[test]
    fn structured_string() {
        assert_eq!(key(r#""8e03978e-40d5""#).unwrap(), "8e03978e-40d5");
        assert_eq!(key(r#"  "abc"  "#).unwrap(), "abc");
        assert_eq!(key(r#""a\"b\\c""#).unwrap(), r#"a"b\c"#);
    }

    #[test]
    fn bare_token() {
        assert_eq!(key("8e03978e-40d5").unwrap(), "8e03978e-40d5");
        assert_eq!(key("\tabc ").unwrap(), "abc");
        // A bare value is taken as it is, quotes inside included.
        assert_eq!(key(r#"ab"c"#).unwrap(), r#"ab"c"#);
    }

    #[test]
    fn bad_strings() {
        for value in [
            r#""abc"#,
            r#""abc\"#,
            r#""a\nb""#,
            r#""abc";p=1"#,
            r#""abc" "def""#,
        ] {
            assert!(
                matches!(key(value), Err(KeyHeaderError::BadString(_))),
                "{value}: {:?}",
                key(value)
            );
        }
        assert!(matches!(
            parse_key(b"\"a\x7fb\""),
            Err(KeyHeaderError::BadString(_))
        ));
        assert!(matches!(
            parse_key("\"é\"".as_bytes()),
            Err(KeyHeaderError::BadString(_))
        ));
    }

    #[test]
    fn key_rules_apply_after_decoding() {
        assert_eq!(key(r#""""#), Err(KeyHeaderError::Key(KeyError::Empty)));
        assert_eq!(key(""), Err(KeyHeaderError::Key(KeyError::Empty)));
        assert_eq!(key("   "), Err(KeyHeaderError::Key(KeyError::Empty)));
        // A space is a valid string character but not a valid key byte.
        assert_eq!(
            key(r#""a b""#),
            Err(KeyHeaderError::Key(KeyError::InvalidByte {
                offset: 1,
                byte: b' '
            }))
        );
        assert_eq!(
            key(&format!("\"{}\"", "k".repeat(256))),
            Err(KeyHeaderError::Key(KeyError::TooLong { len: 256 }))
        );
        assert!(key(&format!("\"{}\"", "k".repeat(255))).is_ok());
        assert_eq!(
            key(&"k".repeat(300)),
            Err(KeyHeaderError::Key(KeyError::TooLong { len: 300 }))
        );
        assert_eq!(
            parse_key(b"ab\xffc"),
            Err(KeyHeaderError::Key(KeyError::InvalidByte {
                offset: 2,
                byte: 0xff
            }))
        );
        assert_eq!(
            key("a b"),
            Err(KeyHeaderError::Key(KeyError::InvalidByte {
                offset: 1,
                byte: b' '
            }))
        );
    }

    #[test]
    fn header_presence() {
        let name = HeaderName::from_static("idempotency-key");
        let mut headers = HeaderMap::new();
        assert_eq!(
            key_from_headers(&headers, &name),
            Err(KeyHeaderError::Missing)
        );
        headers.append(&name, "\"k1\"".parse().unwrap());
        assert_eq!(key_from_headers(&headers, &name).unwrap().as_str(), "k1");
        headers.append(&name, "k2".parse().unwrap());
        assert_eq!(
            key_from_headers(&headers, &name),
            Err(KeyHeaderError::Repeated)
        );
    }
}
