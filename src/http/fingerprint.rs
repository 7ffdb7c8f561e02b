//! The fingerprint of an HTTP request.
//!
//! SHA-256 over a framed sequence, so that no two different requests write
//! the same bytes: a tag, then the method, the path with its query, the body,
//! and for each fingerprinted header (sorted by name) its name, its number of
//! values and each value in order. Every field is its length as a big-endian
//! `u64` followed by its bytes.

use ::http::header::HeaderName;
use ::http::request::Parts;
use sha2::{Digest, Sha256};

use crate::fingerprint::Fingerprint;

const TAG: &[u8] = b"idem-http-request-v1";

fn field(hasher: &mut Sha256, bytes: &[u8]) {
    hasher.update((bytes.len() as u64).to_be_bytes());
    hasher.update(bytes);
}

/// The fingerprint of a request with `parts` and `body`, including the
/// values of `headers` (sorted and without duplicates).
pub(crate) fn of_request(parts: &Parts, body: &[u8], headers: &[HeaderName]) -> Fingerprint {
    let mut hasher = Sha256::new();
    field(&mut hasher, TAG);
    field(&mut hasher, parts.method.as_str().as_bytes());
    let target = parts.uri.path_and_query().map_or("/", |p| p.as_str());
    field(&mut hasher, target.as_bytes());
    field(&mut hasher, body);
    for name in headers {
        field(&mut hasher, name.as_str().as_bytes());
        let values = parts.headers.get_all(name);
        hasher.update((values.iter().count() as u64).to_be_bytes());
        for value in values {
            field(&mut hasher, value.as_bytes());
        }
    }
    Fingerprint::from_digest(hasher.finalize().into())
}

#[cfg(test)]
mod tests {
    use super::*;
    use ::http::Request;

    fn fp(method: &str, uri: &str, body: &[u8], headers: &[(&str, &str)]) -> Fingerprint {
        let mut request = Request::builder().method(method).uri(uri);
        for (name, value) in headers {
            request = request.header(*name, *value);
        }
        let (parts, ()) = request.body(()).unwrap().into_parts();
        of_request(&parts, body, &[HeaderName::from_static("content-type")])
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
}
