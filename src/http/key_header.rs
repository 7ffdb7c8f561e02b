//! [`IdempotencyKey`]: the key of the `Idempotency-Key` header, read as the
//! layer reads it, and [`KeyHeaderError`] when the header holds none.
//!
//! The IETF draft defines the header as an RFC 8941 Structured Field Item
//! whose value is a String: `Idempotency-Key: "8e03978e-40d5-43e8"`. Many
//! clients send the key bare (`Idempotency-Key: 8e03978e-40d5-43e8`), so a
//! value that does not start with a double quote is taken as the key itself.
//! Either way the result must pass the [`Key`] rules: 1 to 255 bytes of
//! visible ASCII.

use std::fmt;

use ::http::header::{HeaderMap, HeaderName, HeaderValue};
use ::http::Method;

use super::problem::{Problem, ProblemDetails};
use idem_core::key::{AsKey, Key, KeyError};

/// The header of the IETF draft, the layer's default.
pub(crate) const IDEMPOTENCY_KEY: HeaderName = HeaderName::from_static("idempotency-key");

/// The key of a request's `Idempotency-Key` header, read exactly as the
/// [`IdempotencyLayer`](super::IdempotencyLayer) reads it (see the
/// [module documentation](super)): the header must be present once, and
/// hold an RFC 8941 String (`"8e03978e-40d5"`, with `\"` and `\\`
/// escapes) or a bare key (`8e03978e-40d5`), spaces and tabs around it
/// ignored; the decoded key must pass the [`Key`] rules.
///
/// ```
/// use http::HeaderMap;
/// use idem::http::{IdempotencyKey, KeyHeaderError};
///
/// let mut headers = HeaderMap::new();
/// assert_eq!(IdempotencyKey::from_headers(&headers), Err(KeyHeaderError::Missing));
/// headers.insert("idempotency-key", "\"order-1001\"".parse().unwrap());
/// let key = IdempotencyKey::from_headers(&headers).unwrap();
/// assert_eq!(key.as_str(), "order-1001");
/// ```
///
/// The layer puts the key it checked in the request's extensions. With the
/// `axum` feature `IdempotencyKey` is an axum extractor: behind the layer,
/// it is that key, from whatever header the layer reads (see
/// [What the handler sees](super#what-the-handler-sees)); elsewhere it
/// reads the `Idempotency-Key` header, and refuses a request without a
/// valid key with the very answer the layer gives (400,
/// [`Problem::MissingKey`] or [`Problem::InvalidKey`], the same document):
/// a route served without the layer keeps the layer's contract for the
/// key.
///
/// ```
/// # #[cfg(feature = "axum")]
/// # mod example {
/// use axum::{routing::post, Router};
/// use idem::http::IdempotencyKey;
///
/// async fn create_order(key: IdempotencyKey, body: String) -> String {
///     format!("order {key} created for {body}")
/// }
///
/// fn app() -> Router {
///     Router::new().route("/orders", post(create_order))
/// }
/// # }
/// ```
#[derive(Clone, Debug, PartialEq, Eq, Hash)]
#[cfg_attr(docsrs, doc(cfg(feature = "http")))]
pub struct IdempotencyKey(Key);

impl IdempotencyKey {
    /// The key of the `Idempotency-Key` header of `headers`.
    pub fn from_headers(headers: &HeaderMap) -> Result<Self, KeyHeaderError> {
        Self::from_headers_named(headers, &IDEMPOTENCY_KEY)
    }

    /// The key of the header `name` of `headers`, for a layer configured
    /// [`with_header_name`](super::IdempotencyLayer::with_header_name).
    pub fn from_headers_named(
        headers: &HeaderMap,
        name: &HeaderName,
    ) -> Result<Self, KeyHeaderError> {
        let mut values = headers.get_all(name).iter();
        let value = values.next().ok_or(KeyHeaderError::Missing)?;
        if values.next().is_some() {
            return Err(KeyHeaderError::Repeated);
        }
        Self::parse(value.as_bytes())
    }

    /// The key of one header value, given as its bytes. Never
    /// [`KeyHeaderError::Missing`] nor [`KeyHeaderError::Repeated`].
    pub fn parse(value: &[u8]) -> Result<Self, KeyHeaderError> {
        parse_key(value).map(IdempotencyKey)
    }

    /// The key.
    pub fn key(&self) -> &Key {
        &self.0
    }

    /// The key, as text.
    pub fn as_str(&self) -> &str {
        self.0.as_str()
    }

    /// Unwraps the key.
    pub fn into_key(self) -> Key {
        self.0
    }
}

impl TryFrom<&HeaderValue> for IdempotencyKey {
    type Error = KeyHeaderError;

    /// The key of one header value: [`IdempotencyKey::parse`].
    fn try_from(value: &HeaderValue) -> Result<Self, KeyHeaderError> {
        Self::parse(value.as_bytes())
    }
}

impl From<IdempotencyKey> for Key {
    fn from(key: IdempotencyKey) -> Self {
        key.0
    }
}

impl AsKey for IdempotencyKey {
    fn to_key(&self) -> Result<Key, KeyError> {
        Ok(self.0.clone())
    }
}

impl fmt::Display for IdempotencyKey {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        fmt::Display::fmt(&self.0, f)
    }
}

/// Why a request's key header yields no key.
///
/// Each converts into the layer's answer ([`ProblemDetails::from`]): a
/// missing header is [`Problem::MissingKey`], any other error
/// [`Problem::InvalidKey`], both 400.
#[derive(Debug, Clone, PartialEq, Eq)]
#[non_exhaustive]
#[cfg_attr(docsrs, doc(cfg(feature = "http")))]
pub enum KeyHeaderError {
    /// The request has no such header.
    Missing,
    /// The header appears more than once.
    Repeated,
    /// The value starts with a double quote but is not a valid Structured
    /// Field String; the text says why.
    InvalidString(&'static str),
    /// The decoded key breaks the [`Key`] rules.
    InvalidKey(KeyError),
}

impl KeyHeaderError {
    /// Whether the request has no key header at all (the other errors are
    /// a malformed one).
    pub fn is_missing(&self) -> bool {
        matches!(self, KeyHeaderError::Missing)
    }

    /// The layer's answer: [`Problem::MissingKey`] for a missing header,
    /// [`Problem::InvalidKey`] otherwise.
    pub fn problem(&self) -> Problem {
        match self {
            KeyHeaderError::Missing => Problem::MissingKey,
            _ => Problem::InvalidKey,
        }
    }
}

impl fmt::Display for KeyHeaderError {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            KeyHeaderError::Missing => f.write_str("the request has no idempotency key header"),
            KeyHeaderError::Repeated => {
                f.write_str("the idempotency key header is given more than once")
            }
            KeyHeaderError::InvalidString(why) => {
                write!(f, "the key is not a valid structured field string: {why}")
            }
            KeyHeaderError::InvalidKey(err) => err.fmt(f),
        }
    }
}

impl std::error::Error for KeyHeaderError {
    fn source(&self) -> Option<&(dyn std::error::Error + 'static)> {
        match self {
            KeyHeaderError::InvalidKey(err) => Some(err),
            _ => None,
        }
    }
}

impl From<KeyHeaderError> for ProblemDetails {
    /// The layer's answer, [`KeyHeaderError::problem`], with the error as
    /// its detail. (For a missing header the layer words the detail with
    /// the request's method and the header's name, which the error does
    /// not know; the [`IdempotencyKey`] extractor does the same.)
    fn from(err: KeyHeaderError) -> Self {
        ProblemDetails::new(err.problem(), err)
    }
}

/// The layer's answer to a request whose key `header` yields no key.
/// In a request's extensions: the layer (reading `.0`) let the request
/// through without a key (a method it does not cover, or a missing key it
/// does not require), so that a handler's key extractor refuses it rather
/// than read a header the layer did not check or scope.
#[derive(Clone, Debug)]
pub(crate) struct Unkeyed(
    // Read by the axum integration's extractor only.
    #[cfg_attr(not(feature = "axum"), allow(dead_code))] pub(crate) HeaderName,
);

pub(crate) fn refusal(err: KeyHeaderError, method: &Method, header: &HeaderName) -> ProblemDetails {
    match err {
        KeyHeaderError::Missing => ProblemDetails::new(
            Problem::MissingKey,
            format_args!("{method} requests to this resource require an `{header}` header"),
        ),
        other => other.into(),
    }
}

/// Parses one header value: a Structured Field String, or a bare key.
fn parse_key(value: &[u8]) -> Result<Key, KeyHeaderError> {
    // RFC 8941 4.2: leading and trailing spaces are discarded; HTTP also
    // strips tabs around field values.
    let value = trim_ows(value);
    let key = match value.first() {
        Some(b'"') => parse_sf_string(value)?,
        _ => {
            if let Some(offset) = value.iter().position(|b| !(0x21..=0x7e).contains(b)) {
                return Err(KeyHeaderError::InvalidKey(KeyError::InvalidByte {
                    offset,
                    byte: value[offset],
                }));
            }
            // Visible ASCII only, so this is valid UTF-8.
            String::from_utf8_lossy(value).into_owned()
        }
    };
    Key::new(key).map_err(KeyHeaderError::InvalidKey)
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
    let bad = KeyHeaderError::InvalidString;
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
                matches!(key(value), Err(KeyHeaderError::InvalidString(_))),
                "{value}: {:?}",
                key(value)
            );
        }
        assert!(matches!(
            parse_key(b"\"a\x7fb\""),
            Err(KeyHeaderError::InvalidString(_))
        ));
        assert!(matches!(
            parse_key("\"é\"".as_bytes()),
            Err(KeyHeaderError::InvalidString(_))
        ));
    }

    #[test]
    fn key_rules_apply_after_decoding() {
        assert_eq!(
            key(r#""""#),
            Err(KeyHeaderError::InvalidKey(KeyError::Empty))
        );
        assert_eq!(key(""), Err(KeyHeaderError::InvalidKey(KeyError::Empty)));
        assert_eq!(key("   "), Err(KeyHeaderError::InvalidKey(KeyError::Empty)));
        // A space is a valid string character but not a valid key byte.
        assert_eq!(
            key(r#""a b""#),
            Err(KeyHeaderError::InvalidKey(KeyError::InvalidByte {
                offset: 1,
                byte: b' '
            }))
        );
        assert_eq!(
            key(&format!("\"{}\"", "k".repeat(256))),
            Err(KeyHeaderError::InvalidKey(KeyError::TooLong { len: 256 }))
        );
        assert!(key(&format!("\"{}\"", "k".repeat(255))).is_ok());
        assert_eq!(
            key(&"k".repeat(300)),
            Err(KeyHeaderError::InvalidKey(KeyError::TooLong { len: 300 }))
        );
        assert_eq!(
            parse_key(b"ab\xffc"),
            Err(KeyHeaderError::InvalidKey(KeyError::InvalidByte {
                offset: 2,
                byte: 0xff
            }))
        );
        assert_eq!(
            key("a b"),
            Err(KeyHeaderError::InvalidKey(KeyError::InvalidByte {
                offset: 1,
                byte: b' '
            }))
        );
    }

    #[test]
    fn header_presence() {
        let name = HeaderName::from_static("x-key");
        let from = |headers: &HeaderMap| IdempotencyKey::from_headers_named(headers, &name);
        let mut headers = HeaderMap::new();
        assert_eq!(from(&headers), Err(KeyHeaderError::Missing));
        headers.append(&name, "\"k1\"".parse().unwrap());
        assert_eq!(from(&headers).unwrap().as_str(), "k1");
        assert_eq!(
            IdempotencyKey::from_headers(&headers),
            Err(KeyHeaderError::Missing)
        );
        headers.append(&name, "k2".parse().unwrap());
        assert_eq!(from(&headers), Err(KeyHeaderError::Repeated));
    }

    #[test]
    fn refusals_are_the_layers_answers() {
        let missing = refusal(KeyHeaderError::Missing, &Method::POST, &IDEMPOTENCY_KEY);
        assert_eq!(missing.problem(), Problem::MissingKey);
        assert_eq!(
            missing.detail(),
            "POST requests to this resource require an `idempotency-key` header"
        );
        let repeated = refusal(KeyHeaderError::Repeated, &Method::POST, &IDEMPOTENCY_KEY);
        assert_eq!(repeated, ProblemDetails::from(KeyHeaderError::Repeated));
        assert_eq!(repeated.problem(), Problem::InvalidKey);
        assert_eq!(
            ProblemDetails::from(KeyHeaderError::Missing).problem(),
            Problem::MissingKey
        );
    }
}
