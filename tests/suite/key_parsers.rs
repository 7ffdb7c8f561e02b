//! Bad input: the key rules and the `Idempotency-Key` header parser, fed
//! arbitrary bytes. Neither may panic, and each accepts exactly the valid
//! keys: 1 to 255 bytes of visible ASCII (`0x21..=0x7e`); for the header, a
//! Structured Field String (RFC 8941 4.2.5) or a bare value (optional
//! spaces and tabs around either) whose content is a valid key.

use idem::http::IdempotencyKey;
use idem::key::MAX_KEY_LEN;
use idem::{AsKey, Key, KeyError};
use proptest::collection::vec;
use proptest::prelude::*;

/// The key of one header value, as the layer reads it.
fn parse_key_header(value: &[u8]) -> Option<Key> {
    IdempotencyKey::parse(value).ok().map(Key::from)
}

/// The key rules, written from the documentation.
fn is_valid_key(bytes: &[u8]) -> bool {
    (1..=MAX_KEY_LEN).contains(&bytes.len()) && bytes.iter().all(|b| (0x21..=0x7e).contains(b))
}

/// The header rules, written from RFC 8941 and the module documentation:
/// what key (if any) a header value carries.
fn reference_header(value: &[u8]) -> Option<Vec<u8>> {
    let is_ows = |b: &u8| *b == b' ' || *b == b'\t';
    let start = value.iter().position(|b| !is_ows(b)).unwrap_or(value.len());
    let end = value
        .iter()
        .rposition(|b| !is_ows(b))
        .map_or(start, |i| i + 1);
    let value = &value[start..end];
    let content = if value.first() == Some(&b'"') {
        let mut out = Vec::new();
        let mut i = 1;
        loop {
            let c = *value.get(i)?;
            i += 1;
            match c {
                b'"' => break,
                b'\\' => {
                    let escaped = *value.get(i)?;
                    if escaped != b'"' && escaped != b'\\' {
                        return None;
                    }
                    out.push(escaped);
                    i += 1;
                }
                0x20..=0x7e => out.push(c),
                _ => return None,
            }
        }
        if i != value.len() {
            return None;
        }
        out
    } else {
        value.to_vec()
    };
    is_valid_key(&content).then_some(content)
}

/// Bytes biased towards the interesting ones: the edges of visible ASCII,
/// quotes, backslashes, spaces, tabs, controls and non-ASCII.
fn tricky_byte() -> impl Strategy<Value = u8> {
    prop_oneof![
        4 => 0x21u8..=0x7e,
        1 => prop::sample::select(vec![
            0x00, b'\t', b'\n', b'\r', b' ', b'"', b'\\', 0x7f, 0x80, 0xc3, 0xa9, 0xff, b';', b'=',
        ]),
        1 => any::<u8>(),
    ]
}

/// Lengths around the 255-byte limit as often as short ones.
fn tricky_bytes() -> impl Strategy<Value = Vec<u8>> {
    prop_oneof![vec(tricky_byte(), 0..12), vec(tricky_byte(), 250..260)]
}

/// A valid key, as bytes.
fn valid_key() -> impl Strategy<Value = Vec<u8>> {
    prop_oneof![vec(0x21u8..=0x7e, 1..12), vec(0x21u8..=0x7e, 250..=255)]
}

/// `key` as a Structured Field String.
fn sf_string(key: &[u8]) -> Vec<u8> {
    let mut out = vec![b'"'];
    for &b in key {
        if b == b'"' || b == b'\\' {
            out.push(b'\\');
        }
        out.push(b);
    }
    out.push(b'"');
    out
}

fn ows() -> impl Strategy<Value = Vec<u8>> {
    vec(prop::sample::select(vec![b' ', b'\t']), 0..3)
}

proptest! {
    #![proptest_config(ProptestConfig::with_cases(2_000))]

    #[test]
    fn key_accepts_exactly_the_valid_keys(bytes in tricky_bytes()) {
        let text = String::from_utf8_lossy(&bytes).into_owned();
        let valid = is_valid_key(text.as_bytes());
        let checked = Key::check(&text);
        let made = Key::new(text.clone());
        let via_str = text.as_str().to_key();
        let via_option = Some(text.clone()).to_key();
        prop_assert_eq!(checked.is_ok(), valid, "{:?}: {:?}", text, checked);
        prop_assert_eq!(made.as_ref().ok().map(Key::as_str), valid.then_some(text.as_str()));
        prop_assert_eq!(via_str.ok(), made.clone().ok());
        prop_assert_eq!(via_option.ok(), made.ok());
        // A rejected key names a rule it breaks.
        match checked {
            Ok(()) => {}
            Err(KeyError::Empty) => prop_assert!(text.is_empty()),
            Err(KeyError::TooLong { len }) => {
                prop_assert_eq!(len, text.len());
                prop_assert!(len > MAX_KEY_LEN);
            }
            Err(KeyError::InvalidByte { offset, byte }) => {
                prop_assert_eq!(text.as_bytes()[offset], byte);
                prop_assert!(!(0x21..=0x7e).contains(&byte));
                prop_assert!(text.as_bytes()[..offset].iter().all(|b| (0x21..=0x7e).contains(b)));
            }
            Err(other) => prop_assert!(false, "unexpected {:?}", other),
        }
    }

    #[test]
    fn key_never_panics_on_any_string(text in any::<String>()) {
        let valid = is_valid_key(text.as_bytes());
        prop_assert_eq!(Key::new(text.as_str()).is_ok(), valid);
    }

    #[test]
    fn integers_are_valid_keys(n in any::<i64>(), u in any::<u128>()) {
        prop_assert_eq!(n.to_key().unwrap().as_str().to_owned(), n.to_string());
        prop_assert_eq!(u.to_key().unwrap().as_str().to_owned(), u.to_string());
    }

    #[test]
    fn header_accepts_exactly_the_valid_keys(bytes in tricky_bytes()) {
        let parsed = parse_key_header(&bytes);
        let expected = reference_header(&bytes);
        prop_assert_eq!(
            parsed.as_ref().map(|k| k.as_str().as_bytes().to_vec()),
            expected,
            "header value {:?}",
            String::from_utf8_lossy(&bytes)
        );
    }

    #[test]
    fn header_reads_every_valid_key_in_both_forms(
        key in valid_key(),
        before in ows(),
        after in ows(),
    ) {
        let text = String::from_utf8(key.clone()).unwrap();
        let quoted = [&before[..], &sf_string(&key), &after[..]].concat();
        prop_assert_eq!(parse_key_header(&quoted).map(|k| k.as_str().to_owned()), Some(text.clone()));
        // Bare, a value is the key itself, unless it starts with a quote
        // (then it must be a well-formed string).
        let bare = [&before[..], &key[..], &after[..]].concat();
        let parsed = parse_key_header(&bare).map(|k| k.as_str().to_owned());
        if key[0] == b'"' {
            prop_assert_eq!(parsed, reference_header(&bare).map(|k| String::from_utf8(k).unwrap()));
        } else {
            prop_assert_eq!(parsed, Some(text));
        }
    }

    #[test]
    fn header_never_panics_on_any_bytes(bytes in vec(any::<u8>(), 0..300)) {
        prop_assert_eq!(
            parse_key_header(&bytes).map(|k| k.as_str().as_bytes().to_vec()),
            reference_header(&bytes)
        );
    }
}
