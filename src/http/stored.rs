//! A buffered response as it is stored and replayed, and its byte framing.
//!
//! The stored form is raw bytes, not JSON, so a body costs its own size:
//!
//! ```text
//! u8   version (2)
//! u16  status
//! u32  header count, then per header:
//!        u32 name length, name bytes, u32 value length, value bytes
//! u32  request part count, then per part (version 2 only):
//!        u32 name length, name bytes, 8 bytes of the part's digest
//! ...  the body, to the end
//! ```
//!
//! The request's part digests ([`PartDigests`]) let a later request with
//! the key and another payload be told what differed. A response stored
//! as version 1 (before them) still replays.
//!
//! Integers are big-endian.

use ::http::header::{self, HeaderMap, HeaderName, HeaderValue};
use ::http::StatusCode;
use bytes::Bytes;

use super::fingerprint::PartDigests;
use crate::engine::Codec;
use idem_core::error::Error;

const VERSION: u8 = 2;

/// The parts of a response that a replay gives back.
#[derive(Clone, Debug, PartialEq)]
pub(crate) struct StoredResponse {
    pub(crate) status: StatusCode,
    pub(crate) headers: HeaderMap,
    pub(crate) body: Bytes,
    /// The digests of the request's parts (none in a version 1 record).
    pub(crate) request: PartDigests,
}

/// Headers that describe one transfer or one moment, not the response:
/// hop-by-hop headers (RFC 9110 7.6.1), `Date` and `Age`, and the lengths
/// that the server computes again for the replayed body.
const NOT_REPLAYED: [HeaderName; 12] = [
    header::CONNECTION,
    HeaderName::from_static("keep-alive"),
    HeaderName::from_static("proxy-connection"),
    header::PROXY_AUTHENTICATE,
    header::PROXY_AUTHORIZATION,
    header::TE,
    header::TRAILER,
    header::TRANSFER_ENCODING,
    header::UPGRADE,
    header::DATE,
    header::AGE,
    header::CONTENT_LENGTH,
];

/// Headers that belong to the client that got the first response: a
/// cookie it is given, or a step of its authentication exchange (a
/// challenge, the next nonce). A replay may go to another client (always,
/// when keys are global to the route), so they are never stored.
/// `Proxy-Authenticate` is one too, but hop-by-hop already.
const PER_CLIENT: [HeaderName; 5] = [
    header::SET_COOKIE,
    HeaderName::from_static("set-cookie2"),
    header::WWW_AUTHENTICATE,
    HeaderName::from_static("authentication-info"),
    HeaderName::from_static("proxy-authentication-info"),
];

impl StoredResponse {
    /// Keeps the headers worth replaying: drops those in [`NOT_REPLAYED`]
    /// and [`PER_CLIENT`], those that `Connection` names, and
    /// `replay_header` (set on replays only).
    pub(crate) fn new(
        status: StatusCode,
        headers: &HeaderMap,
        body: Bytes,
        replay_header: &HeaderName,
    ) -> Self {
        let named_by_connection: Vec<HeaderName> = headers
            .get_all(header::CONNECTION)
            .iter()
            .filter_map(|v| v.to_str().ok())
            .flat_map(|v| v.split(','))
            .filter_map(|name| HeaderName::from_bytes(name.trim().as_bytes()).ok())
            .collect();
        let mut kept = HeaderMap::with_capacity(headers.len());
        for (name, value) in headers {
            if NOT_REPLAYED.contains(name)
                || PER_CLIENT.contains(name)
                || named_by_connection.contains(name)
                || name == replay_header
            {
                continue;
            }
            kept.append(name.clone(), value.clone());
        }
        StoredResponse {
            status,
            headers: kept,
            body,
            request: PartDigests::default(),
        }
    }
}

/// The framing described in the module documentation.
#[derive(Clone, Copy, Debug, Default)]
pub(crate) struct ResponseCodec;

fn corrupt(what: &str) -> Error {
    Error::Serialization(<serde_json::Error as serde::de::Error>::custom(format!(
        "corrupt stored response: {what}"
    )))
}

fn put_len(out: &mut Vec<u8>, len: usize) -> Result<(), Error> {
    let len = u32::try_from(len).map_err(|_| corrupt("a header is over 4 GiB"))?;
    out.extend_from_slice(&len.to_be_bytes());
    Ok(())
}

struct Reader<'a>(&'a [u8]);

impl<'a> Reader<'a> {
    fn take(&mut self, n: usize) -> Result<&'a [u8], Error> {
        if self.0.len() < n {
            return Err(corrupt("truncated"));
        }
        let (head, rest) = self.0.split_at(n);
        self.0 = rest;
        Ok(head)
    }

    fn u32(&mut self) -> Result<usize, Error> {
        let b = self.take(4)?;
        Ok(u32::from_be_bytes([b[0], b[1], b[2], b[3]]) as usize)
    }

    fn field(&mut self) -> Result<&'a [u8], Error> {
        let len = self.u32()?;
        self.take(len)
    }
}

impl Codec<StoredResponse> for ResponseCodec {
    fn encode(&self, value: &StoredResponse) -> Result<Vec<u8>, Error> {
        let headers_len: usize = value
            .headers
            .iter()
            .map(|(n, v)| 8 + n.as_str().len() + v.len())
            .sum();
        let mut out = Vec::with_capacity(7 + headers_len + value.body.len());
        out.push(VERSION);
        out.extend_from_slice(&value.status.as_u16().to_be_bytes());
        put_len(&mut out, value.headers.len())?;
        for (name, v) in &value.headers {
            put_len(&mut out, name.as_str().len())?;
            out.extend_from_slice(name.as_str().as_bytes());
            put_len(&mut out, v.len())?;
            out.extend_from_slice(v.as_bytes());
        }
        put_len(&mut out, value.request.0.len())?;
        for (name, digest) in &value.request.0 {
            put_len(&mut out, name.len())?;
            out.extend_from_slice(name.as_bytes());
            out.extend_from_slice(digest);
        }
        out.extend_from_slice(&value.body);
        Ok(out)
    }

    fn decode(&self, bytes: &[u8]) -> Result<StoredResponse, Error> {
        let mut r = Reader(bytes);
        let version = r.take(1)?[0];
        if version != 1 && version != VERSION {
            return Err(corrupt("unknown version"));
        }
        let status = r.take(2)?;
        let status = StatusCode::from_u16(u16::from_be_bytes([status[0], status[1]]))
            .map_err(|_| corrupt("invalid status"))?;
        let count = r.u32()?;
        let mut headers = HeaderMap::with_capacity(count.min(64));
        for _ in 0..count {
            let name =
                HeaderName::from_bytes(r.field()?).map_err(|_| corrupt("invalid header name"))?;
            let value =
                HeaderValue::from_bytes(r.field()?).map_err(|_| corrupt("invalid header value"))?;
            headers.append(name, value);
        }
        let mut request = PartDigests::default();
        if version == VERSION {
            let count = r.u32()?;
            for _ in 0..count {
                let name = std::str::from_utf8(r.field()?)
                    .map_err(|_| corrupt("invalid request part name"))?
                    .to_owned();
                let mut digest = [0; 8];
                digest.copy_from_slice(r.take(8)?);
                request.0.push((name, digest));
            }
        }
        Ok(StoredResponse {
            status,
            headers,
            body: Bytes::copy_from_slice(r.0),
            request,
        })
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn replayed() -> HeaderName {
        HeaderName::from_static("idempotent-replayed")
    }

    /// The names of the headers a response with `headers` is stored with.
    fn stored_names(headers: &HeaderMap) -> Vec<String> {
        let stored = StoredResponse::new(StatusCode::OK, headers, Bytes::new(), &replayed());
        stored
            .headers
            .keys()
            .map(|n| n.as_str().to_owned())
            .collect()
    }

    #[test]
    fn round_trip() {
        let mut headers = HeaderMap::new();
        headers.insert(header::CONTENT_TYPE, "application/json".parse().unwrap());
        headers.append(header::LINK, "</a>; rel=next".parse().unwrap());
        headers.append(header::LINK, "</b>; rel=prev".parse().unwrap());
        headers.insert(header::LOCATION, "/orders/7".parse().unwrap());
        let stored = StoredResponse::new(
            StatusCode::CREATED,
            &headers,
            Bytes::from_static(b"{\"id\":7}\x00\xff"),
            &replayed(),
        );
        let bytes = ResponseCodec.encode(&stored).unwrap();
        assert_eq!(ResponseCodec.decode(&bytes).unwrap(), stored);
        assert_eq!(stored.headers.get_all(header::LINK).iter().count(), 2);

        let empty = StoredResponse::new(
            StatusCode::NO_CONTENT,
            &HeaderMap::new(),
            Bytes::new(),
            &replayed(),
        );
        let bytes = ResponseCodec.encode(&empty).unwrap();
        assert_eq!(bytes.len(), 11);
        assert_eq!(ResponseCodec.decode(&bytes).unwrap(), empty);

        let mut with_parts = stored.clone();
        with_parts.request = PartDigests(vec![
            ("method".into(), [1; 8]),
            ("header:x-tenant".into(), [2; 8]),
        ]);
        let bytes = ResponseCodec.encode(&with_parts).unwrap();
        assert_eq!(ResponseCodec.decode(&bytes).unwrap(), with_parts);
    }

    /// A response stored before the request's part digests were kept
    /// (version 1) replays as it was stored.
    #[test]
    fn version_1_still_replays() {
        let mut bytes = vec![1, 0, 201, 0, 0, 0, 1];
        for field in [&b"location"[..], b"/orders/7"] {
            bytes.extend_from_slice(&(field.len() as u32).to_be_bytes());
            bytes.extend_from_slice(field);
        }
        bytes.extend_from_slice(b"{\"id\":7}");
        let stored = ResponseCodec.decode(&bytes).unwrap();
        assert_eq!(stored.status, StatusCode::CREATED);
        assert_eq!(stored.headers[header::LOCATION], "/orders/7");
        assert_eq!(&stored.body[..], b"{\"id\":7}");
        assert_eq!(stored.request, PartDigests::default());
        assert!(ResponseCodec.decode(&[3, 0, 200, 0, 0, 0, 0]).is_err());
    }

    #[test]
    fn per_response_headers_dropped() {
        let mut headers = HeaderMap::new();
        headers.insert(
            header::DATE,
            "Tue, 01 Jul 2025 10:00:00 GMT".parse().unwrap(),
        );
        headers.insert(header::CONNECTION, "close, x-hop".parse().unwrap());
        headers.insert("x-hop", "1".parse().unwrap());
        headers.insert(header::TRANSFER_ENCODING, "chunked".parse().unwrap());
        headers.insert(header::CONTENT_LENGTH, "2".parse().unwrap());
        headers.insert(replayed(), "true".parse().unwrap());
        headers.insert("x-request-total", "9".parse().unwrap());
        assert_eq!(stored_names(&headers), ["x-request-total"]);
    }

    /// A cookie or an authentication step given to one client is never
    /// stored, so no replay hands it to another.
    #[test]
    fn per_client_headers_are_not_stored() {
        let mut headers = HeaderMap::new();
        headers.append(header::SET_COOKIE, "session=a1; HttpOnly".parse().unwrap());
        headers.append(header::SET_COOKIE, "csrf=b2".parse().unwrap());
        headers.insert("set-cookie2", "old=1".parse().unwrap());
        headers.insert(
            header::WWW_AUTHENTICATE,
            "Bearer error=\"invalid_token\"".parse().unwrap(),
        );
        headers.insert("authentication-info", "nextnonce=\"n1\"".parse().unwrap());
        headers.insert(
            header::PROXY_AUTHENTICATE,
            "Basic realm=\"p\"".parse().unwrap(),
        );
        headers.insert(
            "proxy-authentication-info",
            "nextnonce=\"n2\"".parse().unwrap(),
        );
        headers.insert(header::CONTENT_TYPE, "application/json".parse().unwrap());
        assert_eq!(stored_names(&headers), ["content-type"]);
    }

    #[test]
    fn corrupt_bytes_rejected() {
        for bytes in [
            &b""[..],
            b"\x02\x00\xc8",
            b"\x01\x00",
            b"\x01\x00\xc8\x00\x00\x00\x01\x00",
        ] {
            assert!(matches!(
                ResponseCodec.decode(bytes),
                Err(Error::Serialization(_))
            ));
        }
    }
}
