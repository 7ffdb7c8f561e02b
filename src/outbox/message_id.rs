//! A message's id ([`MessageId`]): derived from its operation and from the
//! message itself, the same in every attempt, process and takeover.

use sha2::{Digest, Sha256};

use idem_core::fingerprint::Fingerprint;
use idem_core::key::{Key, Scope};

use super::message::Message;
use crate::steps::hex_id;

/// A message's id: the same for the same operation (scope, key and
/// payload) and the same message (topic, key, payload and headers), in any
/// attempt, process or takeover. Carried in the
/// [`MESSAGE_ID_HEADER`](super::MESSAGE_ID_HEADER) header, for consumers
/// to deduplicate on.
///
/// It derives from what the message is, not from when the body published
/// it: an attempt that resumes past work an earlier attempt committed, a
/// step replayed from the journal, a transaction the body retried, all
/// give a message the id it had before. So one message published twice
/// in one operation is one message, written once. A key used again after
/// its ttl with another payload is another operation, whose messages get
/// other ids.
///
/// It is the lowercase hexadecimal SHA-256 (64 characters, a valid idem
/// key) of a framed sequence: the tag `idem-outbox-v2`, then the scope,
/// the key, the operation's payload fingerprint, the topic, the message's
/// key (or its absence), its payload (or its absence), and each header's
/// name and value in order, each field its length then its bytes.
///
/// ```
/// use idem::outbox::{Message, MessageId};
/// use idem::{Fingerprint, Key, Scope};
///
/// let (scope, key) = (Scope::new("payments.create"), Key::new("pay-1")?);
/// let payload = Fingerprint::of(&2500)?;
/// let created = Message::new("payment.created", r#"{"id":"pay-1"}"#)?;
/// let id = MessageId::derive(&scope, &key, &payload, &created);
/// assert_eq!(id.as_str().len(), 64);
/// assert_eq!(id, MessageId::derive(&scope, &key, &payload, &created));
/// let other = Message::new("payment.created", r#"{"id":"pay-2"}"#)?;
/// assert_ne!(id, MessageId::derive(&scope, &key, &payload, &other));
/// assert_ne!(id, MessageId::derive(&scope, &key, &Fingerprint::of(&2600)?, &created));
/// # Ok::<(), Box<dyn std::error::Error>>(())
/// ```
#[derive(Clone, PartialEq, Eq, Hash)]
pub struct MessageId(pub(super) String);

impl MessageId {
    /// The id of `message`, published by the operation `(scope, key)`
    /// whose payload has the fingerprint `payload`.
    pub fn derive(scope: &Scope, key: &Key, payload: &Fingerprint, message: &Message) -> MessageId {
        fn field(hash: &mut Sha256, bytes: Option<&[u8]>) {
            match bytes {
                Some(bytes) => {
                    hash.update((bytes.len() as u64 + 1).to_be_bytes());
                    hash.update(bytes);
                }
                None => hash.update(0u64.to_be_bytes()),
            }
        }
        let mut hash = Sha256::new();
        field(&mut hash, Some(b"idem-outbox-v2"));
        field(&mut hash, Some(scope.as_str().as_bytes()));
        field(&mut hash, Some(key.as_str().as_bytes()));
        field(&mut hash, Some(&payload.as_bytes()[..]));
        field(&mut hash, Some(message.topic.as_bytes()));
        field(&mut hash, message.key.as_deref());
        field(&mut hash, message.payload.as_deref());
        hash.update((message.headers.len() as u64).to_be_bytes());
        for (name, value) in &message.headers {
            field(&mut hash, Some(name.as_bytes()));
            field(&mut hash, Some(value));
        }
        MessageId(Fingerprint::from_digest(hash.finalize().into()).to_hex())
    }
}

hex_id!(MessageId, "The id's text.");

#[cfg(test)]
mod tests {
    use super::*;
    use idem_core::key::AsKey;

    #[test]
    fn ids_follow_the_documented_derivation() {
        let payload = Fingerprint::of(&1).unwrap();
        let message = Message::new("t", "p")
            .unwrap()
            .with_header("h", "v")
            .unwrap();
        let id = MessageId::derive(
            &Scope::new("op"),
            &Key::new("k1").unwrap(),
            &payload,
            &message,
        );
        let mut framed = Vec::new();
        let mut field = |bytes: Option<&[u8]>| match bytes {
            Some(bytes) => {
                framed.extend_from_slice(&(bytes.len() as u64 + 1).to_be_bytes());
                framed.extend_from_slice(bytes);
            }
            None => framed.extend_from_slice(&0u64.to_be_bytes()),
        };
        for part in [
            &b"idem-outbox-v2"[..],
            b"op",
            b"k1",
            &payload.as_bytes()[..],
            b"t",
        ] {
            field(Some(part));
        }
        field(None);
        field(Some(b"p"));
        framed.extend_from_slice(&1u64.to_be_bytes());
        let mut field = |bytes: &[u8]| {
            framed.extend_from_slice(&(bytes.len() as u64 + 1).to_be_bytes());
            framed.extend_from_slice(bytes);
        };
        field(b"h");
        field(b"v");
        let expected: String = Sha256::digest(&framed)
            .iter()
            .map(|b| format!("{b:02x}"))
            .collect();
        assert_eq!(id.as_str(), expected);
        assert!(id.to_key().is_ok());
        // Not a step's key for the same parts.
        let step =
            crate::steps::StepKey::derive(&Scope::new("op"), &Key::new("k1").unwrap(), "t", 0);
        assert_ne!(id.as_str(), step.as_str());
    }
}
