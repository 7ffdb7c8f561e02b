//! The fingerprint of an HTTP request: [`RequestFingerprint`].
//!
//! SHA-256 over a framed sequence, so that no two different requests write
//! the same bytes: a tag, then the method, the path with its query, the body,
//! and for each fingerprinted header (sorted by name) its name, its number of
//! values and each value in order. Every field is its length as a big-endian
//! `u64` followed by its bytes.
//!
//! The body field is the body's bytes, under the tag
//! `idem-http-request-v1`; or, for a JSON body, its canonical JSON text
//! (the library's, [`crate::fingerprint`]) with the ignored fields
//! removed, under the tag `idem-http-request-v1-json`. The tags keep the
//! two forms apart, and a raw body hashes as it always did.
//!
//! A JSON body is written canonically only when that cannot make two
//! different bodies equal: see [JSON numbers and repeated
//! members](crate::canonical#json-numbers-and-repeated-members).

use ::http::header::{self, HeaderMap, HeaderName};
use ::http::request::Parts;
use serde_json::Value;
use sha2::{Digest, Sha256};

use idem_core::canonical;
use idem_core::error::Error;
use idem_core::fingerprint::Fingerprint;

const TAG: &[u8] = b"idem-http-request-v1";
const TAG_JSON: &[u8] = b"idem-http-request-v1-json";

/// What the fingerprint of a request covers, as the layer was configured.
#[derive(Clone, Debug)]
pub(crate) struct RequestFingerprint {
    /// Fingerprinted headers, sorted by name, without duplicates.
    headers: Vec<HeaderName>,
    /// Whether JSON bodies are written canonically.
    canonical_json: bool,
    /// JSON pointers of the fields left out of a JSON body, each checked.
    ignored_fields: Vec<String>,
}

impl Default for RequestFingerprint {
    fn default() -> Self {
        RequestFingerprint {
            headers: Vec::new(),
            canonical_json: true,
            ignored_fields: Vec::new(),
        }
    }
}

impl RequestFingerprint {
    pub(crate) fn set_headers(&mut self, names: impl IntoIterator<Item = HeaderName>) {
        let mut names: Vec<HeaderName> = names.into_iter().collect();
        names.sort_unstable_by(|a, b| a.as_str().cmp(b.as_str()));
        names.dedup();
        self.headers = names;
    }

    pub(crate) fn set_canonical_json(&mut self, canonical: bool) {
        self.canonical_json = canonical;
    }

    /// Sets the ignored fields, refusing the first that is not a JSON
    /// pointer to a field (RFC 6901, and not the whole document).
    pub(crate) fn set_ignored_fields<I, P>(&mut self, pointers: I) -> Result<(), Error>
    where
        I: IntoIterator<Item = P>,
        P: Into<String>,
    {
        let pointers = pointers
            .into_iter()
            .map(|pointer| {
                let pointer = pointer.into();
                check_pointer(&pointer).map(|()| pointer)
            })
            .collect::<Result<_, _>>()?;
        self.ignored_fields = pointers;
        Ok(())
    }

    /// The fingerprint of a request with `parts` and `body`.
    #[cfg(test)]
    pub(crate) fn of(&self, parts: &Parts, body: &[u8]) -> Fingerprint {
        self.of_with_parts(parts, body).0
    }

    /// The fingerprint of a request with `parts` and `body`, and the
    /// digests of its parts, which name what differs in a later request
    /// with the same key and another fingerprint.
    pub(crate) fn of_with_parts(&self, parts: &Parts, body: &[u8]) -> (Fingerprint, PartDigests) {
        let canonical = self.canonical_body(&parts.headers, body);
        let (tag, body) = match &canonical {
            Some(json) => (TAG_JSON, json.as_slice()),
            None => (TAG, body),
        };
        let mut digests = PartDigests(Vec::with_capacity(5 + self.headers.len()));
        let mut hasher = Sha256::new();
        field(&mut hasher, tag);
        field(&mut hasher, parts.method.as_str().as_bytes());
        digests.push(Part::Method, &[parts.method.as_str().as_bytes()]);
        let target = parts.uri.path_and_query().map_or("/", |p| p.as_str());
        field(&mut hasher, target.as_bytes());
        digests.push(Part::Path, &[parts.uri.path().as_bytes()]);
        digests.push(
            Part::Query,
            &[parts.uri.query().unwrap_or_default().as_bytes()],
        );
        field(&mut hasher, body);
        digests.push(Part::Body, &[tag, body]);
        digests.push(Part::BodyForm, &[tag]);
        for name in &self.headers {
            field(&mut hasher, name.as_str().as_bytes());
            let values = parts.headers.get_all(name);
            hasher.update((values.iter().count() as u64).to_be_bytes());
            let mut header = Sha256::new();
            for value in values {
                field(&mut hasher, value.as_bytes());
                field(&mut header, value.as_bytes());
            }
            let digest: [u8; 32] = header.finalize().into();
            digests.push(Part::Header(name.as_str()), &[&digest]);
        }
        (Fingerprint::from_digest(hasher.finalize().into()), digests)
    }

    /// The canonical JSON text of `body` without the ignored fields, when
    /// the request says it is JSON, it is, and its numbers are exact;
    /// `None` to hash the bytes.
    fn canonical_body(&self, headers: &HeaderMap, body: &[u8]) -> Option<Vec<u8>> {
        if !self.canonical_json || !is_json(headers) {
            return None;
        }
        let mut value = canonical::exact_value(body)?;
        for pointer in &self.ignored_fields {
            remove(&mut value, pointer);
        }
        let mut out = Vec::with_capacity(body.len());
        canonical::write_text(&value, false, &mut out).ok()?;
        Some(out)
    }
}

/// A part of a request that its fingerprint covers.
enum Part<'a> {
    Method,
    Path,
    Query,
    Body,
    /// Whether the body was read as JSON or as bytes.
    BodyForm,
    Header(&'a str),
}

impl Part<'_> {
    fn name(&self) -> String {
        match self {
            Part::Method => "method".into(),
            Part::Path => "path".into(),
            Part::Query => "query".into(),
            Part::Body => "body".into(),
            Part::BodyForm => "body-form".into(),
            Part::Header(name) => format!("header:{name}"),
        }
    }
}

/// Short digests (8 bytes of SHA-256) of a request's parts, by name: kept
/// with its stored response, so that a later request with the same key
/// and another payload is told what differed (422). They only tell parts
/// apart: the fingerprint is what decides.
#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub(crate) struct PartDigests(pub(crate) Vec<(String, [u8; 8])>);

impl PartDigests {
    fn push(&mut self, part: Part<'_>, fields: &[&[u8]]) {
        let mut hasher = Sha256::new();
        for bytes in fields {
            field(&mut hasher, bytes);
        }
        let digest: [u8; 32] = hasher.finalize().into();
        let mut short = [0; 8];
        short.copy_from_slice(&digest[..8]);
        self.0.push((part.name(), short));
    }

    /// What differs between this request and `earlier`, in words for a
    /// problem's detail; `None` when the digests say nothing (none were
    /// kept, or the configuration changed what is fingerprinted).
    pub(crate) fn differences(&self, earlier: &PartDigests) -> Option<String> {
        let before = |name: &str| earlier.0.iter().find(|(n, _)| n == name).map(|(_, d)| d);
        let mut parts = Vec::new();
        let mut form_differs = false;
        for (name, digest) in &self.0 {
            match before(name) {
                Some(old) if old != digest => {}
                _ => continue,
            }
            match name.as_str() {
                "body-form" => form_differs = true,
                "method" | "path" | "query" | "body" => parts.push(format!("the {name}")),
                header => {
                    let header = header.strip_prefix("header:").unwrap_or(header);
                    parts.push(format!("the `{header}` header"));
                }
            }
        }
        if parts.is_empty() {
            return None;
        }
        let mut words = match parts.len() {
            1 => format!("{} differs", parts[0]),
            n => format!("{} and {} differ", parts[..n - 1].join(", "), parts[n - 1]),
        };
        if form_differs {
            words.push_str(
                " (the body was read as JSON one time and as bytes the other: a body is \
                 compared as JSON only when sent with a JSON `Content-Type`)",
            );
        }
        Some(words)
    }
}

fn field(hasher: &mut Sha256, bytes: &[u8]) {
    hasher.update((bytes.len() as u64).to_be_bytes());
    hasher.update(bytes);
}

/// Whether the request has one `Content-Type`, of a JSON media type:
/// `application/json` or any `type/subtype+json`, whatever its parameters
/// and case.
fn is_json(headers: &HeaderMap) -> bool {
    let mut values = headers.get_all(header::CONTENT_TYPE).iter();
    let (Some(value), None) = (values.next(), values.next()) else {
        return false;
    };
    let Ok(value) = value.to_str() else {
        return false;
    };
    let essence = value.split(';').next().unwrap_or_default().trim();
    let Some((kind, subtype)) = essence.split_once('/') else {
        return false;
    };
    let suffixed = subtype.len() > 5
        && subtype
            .get(subtype.len() - 5..)
            .is_some_and(|suffix| suffix.eq_ignore_ascii_case("+json"));
    !kind.is_empty()
        && (suffixed
            || kind.eq_ignore_ascii_case("application") && subtype.eq_ignore_ascii_case("json"))
}

/// A JSON pointer (RFC 6901) to a field: `/` then tokens separated by
/// `/`, in which `~` only starts `~0` (a `~`) or `~1` (a `/`).
fn check_pointer(pointer: &str) -> Result<(), Error> {
    let refuse = |why: &str| {
        Err(Error::Config(format!(
            "`{pointer}` is not a JSON pointer to a field: {why}"
        )))
    };
    if !pointer.starts_with('/') {
        return refuse("it must start with `/`, as in `/timestamp`");
    }
    let mut chars = pointer.chars();
    while let Some(c) = chars.next() {
        if c == '~' && !matches!(chars.next(), Some('0' | '1')) {
            return refuse("`~` must be followed by `0` (for `~`) or `1` (for `/`)");
        }
    }
    Ok(())
}

/// Leaves the field at `pointer` out of `value`: a member is removed from
/// its object, an element of an array becomes `null` (the others keep
/// their places). Nothing happens when there is no such field.
fn remove(value: &mut Value, pointer: &str) {
    let Some((parent, last)) = pointer.rsplit_once('/') else {
        return;
    };
    match value.pointer_mut(parent) {
        Some(Value::Object(members)) => {
            members.remove(&last.replace("~1", "/").replace("~0", "~"));
        }
        Some(Value::Array(items)) => {
            // RFC 6901's array index: digits, without a leading zero.
            let index = (last == "0" || !last.starts_with(['0', '+']))
                .then(|| last.parse::<usize>().ok())
                .flatten();
            if let Some(item) = index.and_then(|i| items.get_mut(i)) {
                *item = Value::Null;
            }
        }
        _ => {}
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use ::http::Request;

    fn parts(method: &str, uri: &str, headers: &[(&str, &str)]) -> Parts {
        let mut request = Request::builder().method(method).uri(uri);
        for (name, value) in headers {
            request = request.header(*name, *value);
        }
        request.body(()).unwrap().into_parts().0
    }

    fn with_content_type() -> RequestFingerprint {
        let mut fingerprint = RequestFingerprint::default();
        fingerprint.set_headers([header::CONTENT_TYPE]);
        fingerprint
    }

    fn fp(method: &str, uri: &str, body: &[u8], headers: &[(&str, &str)]) -> Fingerprint {
        with_content_type().of(&parts(method, uri, headers), body)
    }

    fn json(fingerprint: &RequestFingerprint, body: &str) -> Fingerprint {
        let parts = parts("POST", "/orders", &[("content-type", "application/json")]);
        fingerprint.of(&parts, body.as_bytes())
    }

    /// That the JSON bodies of each pair are two payloads.
    fn distinct<const N: usize>(fingerprint: &RequestFingerprint, pairs: [(&str, &str); N]) {
        for (a, b) in pairs {
            assert_ne!(json(fingerprint, a), json(fingerprint, b), "{a} ~ {b}");
        }
    }

    #[test]
    fn every_part_counts() {
        let base = fp("POST", "/orders", b"{}", &[]);
        assert_eq!(base, fp("POST", "/orders", b"{}", &[("x-other", "1")]));
        assert_ne!(base, fp("PATCH", "/orders", b"{}", &[]));
        assert_ne!(base, fp("POST", "/orders/", b"{}", &[]));
        assert_ne!(base, fp("POST", "/orders?dry_run=1", b"{}", &[]));
        assert_ne!(base, fp("POST", "/orders", b"{ }", &[]));
        assert_ne!(
            base,
            fp("POST", "/orders", b"{}", &[("content-type", "text/plain")])
        );
        assert_ne!(
            fp("POST", "/orders", b"{}", &[("content-type", "a")]),
            fp("POST", "/orders", b"{}", &[("content-type", "b")])
        );
    }

    #[test]
    fn differences_are_named() {
        let f = with_content_type();
        let digests = |method, uri, body: &[u8], headers| {
            f.of_with_parts(&parts(method, uri, headers), body).1
        };
        let base = digests("POST", "/orders?a=1", b"{}", &[]);
        assert_eq!(base.differences(&base), None);
        assert_eq!(
            digests("POST", "/orders?a=2", b"{}", &[]).differences(&base),
            Some("the query differs".into())
        );
        assert_eq!(
            digests(
                "PUT",
                "/other?a=1",
                b"{}",
                &[("content-type", "text/plain")]
            )
            .differences(&base),
            Some("the method, the path and the `content-type` header differ".into())
        );
        let json = digests(
            "POST",
            "/orders?a=1",
            b"{}",
            &[("content-type", "application/json")],
        );
        let words = json.differences(&base).unwrap();
        assert!(
            words.starts_with(
                "the body and the `content-type` header differ (the body was read as JSON"
            ),
            "{words}"
        );
        // Nothing kept (a response stored before the digests were): no words.
        assert_eq!(base.differences(&PartDigests::default()), None);
    }

    #[test]
    fn framing_is_unambiguous() {
        // Moving bytes from the path to the body must change the digest.
        assert_ne!(fp("POST", "/ab", b"c", &[]), fp("POST", "/a", b"bc", &[]));
        // One header value with a comma is not two values.
        assert_ne!(
            fp("POST", "/", b"", &[("content-type", "a,b")]),
            fp(
                "POST",
                "/",
                b"",
                &[("content-type", "a"), ("content-type", "b")]
            )
        );
    }

    /// A raw body hashes as it did before JSON bodies were canonical, so
    /// a request sent before an upgrade still matches its retry after it.
    #[test]
    fn raw_bodies_keep_their_digest() {
        let parts = parts("POST", "/orders", &[]);
        let mut hasher = Sha256::new();
        for bytes in [TAG, b"POST", b"/orders", b"2 apples"] {
            field(&mut hasher, bytes);
        }
        let digest: [u8; 32] = hasher.finalize().into();
        assert_eq!(
            RequestFingerprint::default().of(&parts, b"2 apples"),
            Fingerprint::from_digest(digest)
        );
    }

    #[test]
    fn json_bodies_are_canonical() {
        let f = RequestFingerprint::default();
        let base = json(
            &f,
            r#"{"amount":100,"currency":"eur","items":[{"a":1,"b":2}]}"#,
        );
        let same = [
            r#"{"currency":"eur","items":[{"b":2,"a":1}],"amount":100}"#,
            "{\n  \"amount\": 100,\n  \"currency\": \"eur\",\n  \"items\": [ { \"a\": 1, \"b\": 2 } ]\n}\n",
            r#"{"amount":100,"currency":"\u0065ur","items":[{"a":1,"b":2}]}"#,
        ];
        for body in same {
            assert_eq!(json(&f, body), base, "{body}");
        }
        let other = [
            r#"{"amount":101,"currency":"eur","items":[{"a":1,"b":2}]}"#,
            r#"{"amount":"100","currency":"eur","items":[{"a":1,"b":2}]}"#,
            r#"{"amount":100,"currency":"eur","items":[{"a":1,"b":2}],"x":null}"#,
            r#"{"amount":100,"currency":"eur","items":[{"a":2,"b":1}]}"#,
            // A member named twice, which a JSON value keeps the last of.
            r#"{"amount":1,"amount":100,"currency":"eur","items":[{"a":1,"b":2}]}"#,
            r#"{"amount":100,"currency":"eur","items":[{"a":1,"b":2,"b":2}]}"#,
        ];
        for body in other {
            assert_ne!(json(&f, body), base, "{body}");
        }
        // Hashed raw, as it was sent: the two orders of the names differ.
        assert_ne!(
            json(&f, r#"{"amount":1,"amount":100}"#),
            json(&f, r#"{"amount":100,"amount":1}"#)
        );
        // A name repeated in sibling objects is no repetition.
        assert_eq!(
            json(&f, r#"[{"a":1},{"a":1}]"#),
            json(&f, r#"[ {"a":1}, {"a":1} ]"#)
        );
    }

    #[test]
    fn json_media_types() {
        let f = RequestFingerprint::default();
        let of = |content_types: &[&str], body: &str| {
            let headers: Vec<(&str, &str)> =
                content_types.iter().map(|c| ("content-type", *c)).collect();
            f.of(&parts("POST", "/", &headers), body.as_bytes())
        };
        let canonical = of(&["application/json"], r#"{"a":1}"#);
        for content_type in [
            "application/json; charset=utf-8",
            "Application/JSON",
            "application/merge-patch+json",
            "application/vnd.api+JSON ; ext=x",
        ] {
            assert_eq!(
                of(&[content_type], r#"{ "a": 1 }"#),
                canonical,
                "{content_type}"
            );
        }
        for content_types in [
            &["text/plain"][..],
            &["application/jsonx"],
            &["application/x-www-form-urlencoded"],
            &["+json"],
            &[],
            &["application/json", "application/json"],
        ] {
            assert_eq!(
                of(content_types, r#"{ "a": 1 }"#),
                of(content_types, r#"{ "a": 1 }"#),
            );
            assert_ne!(
                of(content_types, r#"{ "a": 1 }"#),
                of(content_types, r#"{"a":1}"#),
                "{content_types:?}"
            );
        }
    }

    #[test]
    fn invalid_json_is_hashed_raw() {
        let f = RequestFingerprint::default();
        for body in ["{", "", "{\"a\":1} x", "[1,]"] {
            let raw =
                RequestFingerprint::default().of(&parts("POST", "/orders", &[]), body.as_bytes());
            assert_eq!(json(&f, body), raw, "{body}");
        }
        // Nested deeper than serde_json reads: raw, and no stack overflow.
        let deep = format!("{}{}", "[".repeat(10_000), "]".repeat(10_000));
        assert_ne!(json(&f, &deep), json(&f, &format!(" {deep}")));
    }

    #[test]
    fn canonical_json_can_be_turned_off() {
        let mut f = RequestFingerprint::default();
        f.set_canonical_json(false);
        assert_ne!(json(&f, r#"{"a":1,"b":2}"#), json(&f, r#"{"b":2,"a":1}"#));
    }

    #[test]
    fn ignored_fields_do_not_count() {
        let mut f = RequestFingerprint::default();
        f.set_ignored_fields(["/sent_at", "/meta/trace", "/lines/1", "/a~1b", "/absent/x"])
            .unwrap();
        let base = json(
            &f,
            r#"{"amount":1,"sent_at":"10:00","meta":{"trace":"t1","v":1},"lines":[1,2,3],"a/b":0}"#,
        );
        let same = [
            r#"{"amount":1,"sent_at":"10:01","meta":{"trace":"t2","v":1},"lines":[1,9,3],"a/b":7}"#,
            r#"{"amount":1,"meta":{"v":1},"lines":[1,null,3]}"#,
        ];
        for body in same {
            assert_eq!(json(&f, body), base, "{body}");
        }
        let other = [
            r#"{"amount":2,"sent_at":"10:00","meta":{"trace":"t1","v":1},"lines":[1,2,3],"a/b":0}"#,
            r#"{"amount":1,"sent_at":"10:00","meta":{"trace":"t1","v":2},"lines":[1,2,3],"a/b":0}"#,
            r#"{"amount":1,"sent_at":"10:00","meta":{"trace":"t1","v":1},"lines":[1,2],"a/b":0}"#,
        ];
        for body in other {
            assert_ne!(json(&f, body), base, "{body}");
        }
        // A document that is not an object ignores nothing, and fails nothing.
        assert_ne!(json(&f, "[1,2]"), json(&f, "[1,3]"));
        assert_eq!(json(&f, "7"), json(&f, " 7 "));
    }

    #[test]
    fn pointers_are_checked() {
        let mut f = RequestFingerprint::default();
        for good in ["/a", "/a/0/b", "/", "/a~0b~1c", "/ü"] {
            assert!(f.set_ignored_fields([good]).is_ok(), "{good}");
        }
        for bad in ["", "a", "timestamp", "/a~", "/a~2", "$.a"] {
            assert!(
                matches!(f.set_ignored_fields(["/ok", bad]), Err(Error::Config(_))),
                "{bad}"
            );
        }
    }

    #[test]
    fn inexact_numbers_are_hashed_raw() {
        let f = RequestFingerprint::default();
        // Two numbers that one f64 would merge: never the same payload.
        distinct(
            &f,
            [
                (
                    r#"{"a":100000000000000000001}"#,
                    r#"{"a":100000000000000000000}"#,
                ),
                (r#"{"a":0.10000000000000000001}"#, r#"{"a":0.1}"#),
                (r#"{"a":1e-400}"#, r#"{"a":2e-400}"#),
            ],
        );
        // Numbers inside strings are text.
        assert_eq!(
            json(&f, r#"{"b":"100000000000000000001","a":1}"#),
            json(&f, r#"{"a":1,"b":"100000000000000000001"}"#)
        );
    }

    /// A body with a number JavaScript writes for a computed amount is
    /// canonical: its ignored fields and member order do not count; its
    /// amount does.
    #[test]
    fn shortest_doubles_keep_bodies_canonical() {
        let mut f = RequestFingerprint::default();
        f.set_ignored_fields(["/sent_at"]).unwrap();
        let base = json(&f, r#"{"total":59.97000000000001,"sent_at":"10:00:00"}"#);
        for same in [
            r#"{"total":59.97000000000001,"sent_at":"10:00:05"}"#,
            r#"{"sent_at":"10:00:00","total":59.97000000000001}"#,
            r#"{"total":5.997000000000001e1}"#,
        ] {
            assert_eq!(json(&f, same), base, "{same}");
        }
        for other in [
            r#"{"total":59.97,"sent_at":"10:00:00"}"#,
            r#"{"total":59.970000000000006,"sent_at":"10:00:00"}"#,
            r#"{"total":59.97000000000002,"sent_at":"10:00:00"}"#,
        ] {
            assert_ne!(json(&f, other), base, "{other}");
        }
        distinct(
            &f,
            [
                (r#"{"a":1945349.4000000001}"#, r#"{"a":1945349.4}"#),
                (r#"{"a":0.10000000000000001}"#, r#"{"a":0.1}"#),
            ],
        );
    }
}
