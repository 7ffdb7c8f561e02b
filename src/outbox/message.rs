//! A message to publish ([`Message`]), checked as it is built, and why
//! one is refused ([`InvalidMessage`]); with its two other forms: its
//! headers as the outbox stores them, and the serialized form kept with a
//! consumer's marker.

use idem_core::error::Error;

/// The header that carries a message's [`MessageId`](super::MessageId) on
/// the broker.
pub const MESSAGE_ID_HEADER: &str = "idem-message-id";

/// The longest topic name (Kafka's limit).
pub const MAX_TOPIC_LEN: usize = 249;

/// The most bytes of key, payload and headers one message carries: under
/// the producer's and the broker's default `message.max.bytes` (a little
/// over a megabyte, counted with the record's framing and the id header),
/// so that a message the outbox accepts is one a relay can produce.
pub const MAX_MESSAGE_BYTES: usize = 900_000;

/// Why a message cannot be published.
#[derive(Debug, thiserror::Error, PartialEq, Eq)]
#[non_exhaustive]
pub enum InvalidMessage {
    /// The topic is not 1 to 249 ASCII letters, digits, `.`, `_` and `-`
    /// (Kafka's rule), or is `.` or `..`.
    #[error("invalid topic {0:?}: use 1 to 249 ASCII letters, digits, '.', '_' and '-'")]
    Topic(String),
    /// Key, payload and headers together exceed [`MAX_MESSAGE_BYTES`].
    #[error("the message carries {0} bytes, over the limit of {MAX_MESSAGE_BYTES}")]
    TooLarge(usize),
    /// A header's name is empty, or is [`MESSAGE_ID_HEADER`], which the
    /// outbox sets itself.
    #[error("invalid header name {0:?}: it must be non-empty and not {MESSAGE_ID_HEADER:?}")]
    Header(String),
    /// A stored message's bytes do not decode.
    #[error("a stored message does not decode: {0}")]
    Encoding(String),
    /// A consumer's outputs, as kept with its marker, would exceed
    /// [`MAX_OUTPUTS_BYTES`].
    #[error("outputs of {0} bytes as kept with the marker, over the limit of {limit}", limit = MAX_OUTPUTS_BYTES)]
    OutputsTooLarge(usize),
}

/// The most bytes the messages a consumer produces for one record
/// (`consumer::kafka::transactions::Outputs`) take as kept with its
/// dedupe marker: under the engine's default largest outcome (4 MiB), so
/// that a redelivery always finds them.
pub const MAX_OUTPUTS_BYTES: usize = 3 * 1024 * 1024;

impl From<InvalidMessage> for Error {
    /// As an [`Error::Config`]: not retryable.
    fn from(err: InvalidMessage) -> Self {
        Error::Config(err.to_string())
    }
}

/// A message to publish: its topic, key, payload and headers. Checked as
/// it is built, so that a message that exists can be published.
///
/// ```
/// use idem::outbox::{InvalidMessage, Message};
///
/// let event = Message::new("payment.created", r#"{"id":"pay-1"}"#)?
///     .with_key("pay-1")?
///     .with_header("content-type", "application/json")?;
/// assert_eq!(event.topic(), "payment.created");
/// assert!(matches!(Message::new("no spaces", "x"), Err(InvalidMessage::Topic(_))));
/// # Ok::<_, InvalidMessage>(())
/// ```
#[derive(Clone, Debug, PartialEq, Eq, serde::Serialize, serde::Deserialize)]
#[serde(into = "wire::Message", try_from = "wire::Message")]
pub struct Message {
    pub(super) topic: String,
    pub(super) key: Option<Vec<u8>>,
    pub(super) payload: Option<Vec<u8>>,
    pub(super) headers: Vec<(String, Vec<u8>)>,
}

impl Message {
    /// A message of `payload` to `topic`.
    ///
    /// # Errors
    ///
    /// [`InvalidMessage`] for an invalid topic or a payload over
    /// [`MAX_MESSAGE_BYTES`].
    pub fn new(topic: &str, payload: impl Into<Vec<u8>>) -> Result<Message, InvalidMessage> {
        Message::tombstone(topic)?.with_payload(Some(payload.into()))
    }

    /// A message without a payload (a tombstone, for a compacted topic).
    ///
    /// # Errors
    ///
    /// [`InvalidMessage::Topic`].
    pub fn tombstone(topic: &str) -> Result<Message, InvalidMessage> {
        check_topic(topic)?;
        Ok(Message {
            topic: topic.to_owned(),
            key: None,
            payload: None,
            headers: Vec::new(),
        })
    }

    fn with_payload(mut self, payload: Option<Vec<u8>>) -> Result<Message, InvalidMessage> {
        self.payload = payload;
        self.checked()
    }

    /// The message with `key`, the record key Kafka partitions by.
    ///
    /// # Errors
    ///
    /// [`InvalidMessage::TooLarge`].
    pub fn with_key(mut self, key: impl Into<Vec<u8>>) -> Result<Message, InvalidMessage> {
        self.key = Some(key.into());
        self.checked()
    }

    /// The message with one more header.
    ///
    /// # Errors
    ///
    /// [`InvalidMessage::Header`] for an empty name or
    /// [`MESSAGE_ID_HEADER`]; [`InvalidMessage::TooLarge`].
    pub fn with_header(
        mut self,
        name: &str,
        value: impl Into<Vec<u8>>,
    ) -> Result<Message, InvalidMessage> {
        if name.is_empty() || name == MESSAGE_ID_HEADER {
            return Err(InvalidMessage::Header(name.to_owned()));
        }
        self.headers.push((name.to_owned(), value.into()));
        self.checked()
    }

    fn checked(self) -> Result<Message, InvalidMessage> {
        let len = self.key.as_ref().map_or(0, Vec::len)
            + self.payload.as_ref().map_or(0, Vec::len)
            + self
                .headers
                .iter()
                .map(|(name, value)| name.len() + value.len())
                .sum::<usize>();
        if len > MAX_MESSAGE_BYTES {
            return Err(InvalidMessage::TooLarge(len));
        }
        Ok(self)
    }

    /// The topic.
    pub fn topic(&self) -> &str {
        &self.topic
    }

    /// The record key, if any.
    pub fn key(&self) -> Option<&[u8]> {
        self.key.as_deref()
    }

    /// The payload; `None` for a tombstone.
    pub fn payload(&self) -> Option<&[u8]> {
        self.payload.as_deref()
    }

    /// The headers, in order (without [`MESSAGE_ID_HEADER`]).
    pub fn headers(&self) -> &[(String, Vec<u8>)] {
        &self.headers
    }
}

fn check_topic(topic: &str) -> Result<(), InvalidMessage> {
    let valid = !topic.is_empty()
        && topic.len() <= MAX_TOPIC_LEN
        && topic != "."
        && topic != ".."
        && topic
            .bytes()
            .all(|b| b.is_ascii_alphanumeric() || matches!(b, b'.' | b'_' | b'-'));
    if valid {
        Ok(())
    } else {
        Err(InvalidMessage::Topic(topic.to_owned()))
    }
}

/// Headers as stored: for each, its name's length (4 bytes, big-endian),
/// its name, its value's length, its value.
pub(super) fn encode_headers(headers: &[(String, Vec<u8>)]) -> Vec<u8> {
    let mut out = Vec::new();
    for (name, value) in headers {
        for part in [name.as_bytes(), value.as_slice()] {
            out.extend_from_slice(&(part.len() as u32).to_be_bytes());
            out.extend_from_slice(part);
        }
    }
    out
}

pub(super) fn decode_headers(mut bytes: &[u8]) -> Result<Vec<(String, Vec<u8>)>, Error> {
    let corrupt = || Error::store("an outbox row's headers are corrupt");
    let part = |bytes: &mut &[u8]| -> Result<Vec<u8>, Error> {
        let (len, rest) = bytes.split_first_chunk::<4>().ok_or_else(corrupt)?;
        let len = u32::from_be_bytes(*len) as usize;
        if rest.len() < len {
            return Err(corrupt());
        }
        let (part, rest) = rest.split_at(len);
        *bytes = rest;
        Ok(part.to_vec())
    };
    let mut headers = Vec::new();
    while !bytes.is_empty() {
        let name = String::from_utf8(part(&mut bytes)?).map_err(|_| corrupt())?;
        let value = part(&mut bytes)?;
        headers.push((name, value));
    }
    Ok(headers)
}

/// A [`Message`] as it is serialized (kept with a consumer's marker, by
/// [`consumer::kafka::transactions`](crate::consumer::kafka)): bytes that
/// are text as text, others in base64, so that the form is at most a
/// third longer than the bytes; checked again when read back.
mod wire {
    use base64::Engine as _;
    use serde::{Deserialize, Serialize};

    #[derive(Serialize, Deserialize)]
    #[serde(untagged)]
    pub(super) enum Bytes {
        Text(String),
        Base64 { base64: String },
    }

    impl From<Vec<u8>> for Bytes {
        fn from(bytes: Vec<u8>) -> Self {
            // Text that JSON escapes at length (control characters take
            // six bytes each) goes as base64 too.
            let escaped = bytes
                .iter()
                .filter(|b| **b < 0x20 || **b == b'"' || **b == b'\\')
                .count();
            if escaped * 16 <= bytes.len() {
                if let Ok(text) = String::from_utf8(bytes.clone()) {
                    return Bytes::Text(text);
                }
            }
            Bytes::Base64 {
                base64: base64::engine::general_purpose::STANDARD.encode(&bytes),
            }
        }
    }

    impl TryFrom<Bytes> for Vec<u8> {
        type Error = super::InvalidMessage;

        fn try_from(bytes: Bytes) -> Result<Self, Self::Error> {
            match bytes {
                Bytes::Text(text) => Ok(text.into_bytes()),
                Bytes::Base64 { base64 } => base64::engine::general_purpose::STANDARD
                    .decode(base64)
                    .map_err(|err| super::InvalidMessage::Encoding(err.to_string())),
            }
        }
    }

    #[derive(Serialize, Deserialize)]
    pub(super) struct Message {
        topic: String,
        #[serde(default, skip_serializing_if = "Option::is_none")]
        key: Option<Bytes>,
        #[serde(default, skip_serializing_if = "Option::is_none")]
        payload: Option<Bytes>,
        #[serde(default, skip_serializing_if = "Vec::is_empty")]
        headers: Vec<(String, Bytes)>,
    }

    impl From<super::Message> for Message {
        fn from(message: super::Message) -> Self {
            Message {
                topic: message.topic,
                key: message.key.map(Bytes::from),
                payload: message.payload.map(Bytes::from),
                headers: message
                    .headers
                    .into_iter()
                    .map(|(name, value)| (name, Bytes::from(value)))
                    .collect(),
            }
        }
    }

    impl TryFrom<Message> for super::Message {
        type Error = super::InvalidMessage;

        fn try_from(wire: Message) -> Result<Self, Self::Error> {
            let mut message = super::Message::tombstone(&wire.topic)?;
            message.key = wire.key.map(Vec::try_from).transpose()?;
            message = message.with_payload(wire.payload.map(Vec::try_from).transpose()?)?;
            for (name, value) in wire.headers {
                message = message.with_header(&name, Vec::try_from(value)?)?;
            }
            Ok(message)
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn topics_follow_kafkas_rule() {
        for good in ["payment.created", "a", "A-b_c.9", &"t".repeat(249)] {
            assert!(Message::new(good, "x").is_ok(), "{good}");
        }
        for bad in ["", ".", "..", "with space", "é", "a/b", &"t".repeat(250)] {
            assert_eq!(
                Message::new(bad, "x"),
                Err(InvalidMessage::Topic(bad.to_owned()))
            );
        }
    }

    #[test]
    fn sizes_and_headers_are_checked() {
        let big = vec![0u8; MAX_MESSAGE_BYTES];
        let message = Message::new("t", big.clone()).unwrap();
        assert_eq!(
            message.clone().with_key("k"),
            Err(InvalidMessage::TooLarge(MAX_MESSAGE_BYTES + 1))
        );
        assert!(Message::new("t", [big, vec![0]].concat()).is_err());
        let small = Message::new("t", "x").unwrap();
        assert!(matches!(
            small.clone().with_header("", "v"),
            Err(InvalidMessage::Header(_))
        ));
        assert!(matches!(
            small.clone().with_header(MESSAGE_ID_HEADER, "v"),
            Err(InvalidMessage::Header(_))
        ));
        assert!(matches!(
            Error::from(InvalidMessage::TooLarge(2)),
            Error::Config(_)
        ));
    }

    #[test]
    fn headers_round_trip_and_corruption_is_an_error() {
        let headers = vec![
            ("content-type".to_owned(), b"application/json".to_vec()),
            ("empty".to_owned(), Vec::new()),
        ];
        let bytes = encode_headers(&headers);
        assert_eq!(decode_headers(&bytes).unwrap(), headers);
        assert!(decode_headers(&[]).unwrap().is_empty());
        assert!(decode_headers(&bytes[..bytes.len() - 1]).is_err());
        assert!(decode_headers(&[0, 0, 0]).is_err());
    }
}
