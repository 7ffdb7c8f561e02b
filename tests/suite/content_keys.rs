//! Messages keyed by their content (`idem::consumer`), on the in-memory
//! store: a JSON message keyed by the bytes it arrived as
//! (`content_key_of_json`) is one message in any member order or
//! whitespace, and two messages that a `serde_json::Value` would read as
//! one stay two; a typed event holding a `HashSet` written with
//! `idem::fingerprint::unordered` gets one key on every redelivery.

use std::collections::HashSet;
use std::sync::atomic::{AtomicUsize, Ordering};

use idem::consumer::{content_key, content_key_of_json, Deduplicator, Handled};
use idem::fingerprint::key_of;
use idem::{idempotent, AsKey, Error, MemoryStore};
use serde::{Deserialize, Serialize};

/// Pairs of distinct transfer messages that a `serde_json::Value` reads as
/// one: 18-decimal token amounts, ids just past `u64`, and a member named
/// twice (a reader keeping the first sees mallory).
const MERGED_BY_A_VALUE: [(&str, &str); 3] = [
    (
        r#"{"transfer":"t-9","amount":1.000000000000000001}"#,
        r#"{"transfer":"t-9","amount":1.000000000000000002}"#,
    ),
    (
        r#"{"order_id":18446744073709551616,"amount":5}"#,
        r#"{"order_id":18446744073709551617,"amount":5}"#,
    ),
    (
        r#"{"transfer":"t-9","to":"mallory","to":"alice"}"#,
        r#"{"transfer":"t-9","to":"alice"}"#,
    ),
];

/// Each message of each pair is processed: none is acknowledged as a
/// duplicate of the other (with `content_key` on a parsed `Value`, the
/// second of each pair was a `Duplicate` and never ran). Copies of each
/// message, byte for byte, are duplicates.
#[tokio::test]
async fn distinct_json_messages_keyed_by_their_bytes_are_each_processed() {
    let dedup = Deduplicator::new(MemoryStore::new(), "transfers.on_requested");
    let runs = AtomicUsize::new(0);
    let handler = || async { Ok::<_, Error>(runs.fetch_add(1, Ordering::SeqCst)) };
    let mut answers = Vec::new();
    for (a, b) in MERGED_BY_A_VALUE {
        for message in [a, b, a, b] {
            let key = content_key_of_json(message.as_bytes()).unwrap();
            let handled = dedup.process(&key, &(), handler()).await.unwrap();
            answers.push((message, handled.is_duplicate()));
        }
    }
    let processed: Vec<_> = answers.iter().filter(|(_, dup)| !dup).collect();
    assert_eq!(processed.len(), 6, "{answers:#?}");
    assert_eq!(runs.load(Ordering::SeqCst), 6);
    for (i, (message, duplicate)) in answers.iter().enumerate() {
        assert_eq!(*duplicate, i % 4 >= 2, "{message}");
    }
}

/// A message that reads exactly is one message in any member order, with
/// any whitespace and any escapes, and has the key `content_key` gives its
/// `Value`; another value is another message.
#[tokio::test]
async fn re_encoded_copies_of_a_json_message_are_duplicates() {
    let dedup = Deduplicator::new(MemoryStore::new(), "orders.reserve");
    let first = r#"{"order_id":"o-1","lines":[{"sku":"apple","qty":2}],"total":19.99}"#;
    let copies = [
        r#"{"total":19.99,"lines":[{"qty":2,"sku":"apple"}],"order_id":"o-1"}"#,
        "{\n  \"order_id\": \"o-\\u0031\",\n  \"lines\": [ { \"sku\": \"apple\", \"qty\": 2 } ],\n  \"total\": 19.99\n}\n",
    ];
    let key = content_key_of_json(first.as_bytes()).unwrap();
    let value: serde_json::Value = serde_json::from_str(first).unwrap();
    assert_eq!(key, content_key(&value).unwrap());
    let ok = |v: u8| async move { Ok::<_, Error>(v) };
    assert_eq!(
        dedup.process(&key, &(), ok(1)).await.unwrap(),
        Handled::Processed(1)
    );
    for copy in copies {
        let key = content_key_of_json(copy.as_bytes()).unwrap();
        assert_eq!(
            dedup.process(&key, &(), ok(2)).await.unwrap(),
            Handled::Duplicate(1),
            "{copy}"
        );
    }
    let other = r#"{"order_id":"o-1","lines":[{"sku":"apple","qty":3}],"total":19.99}"#;
    let key = content_key_of_json(other.as_bytes()).unwrap();
    assert_eq!(
        dedup.process(&key, &(), ok(3)).await.unwrap(),
        Handled::Processed(3)
    );
}

struct Mailer {
    store: MemoryStore,
    sent: AtomicUsize,
}

impl Mailer {
    /// The attribute keyed by the message's bytes; the key is the content,
    /// so there is nothing more to compare.
    #[idempotent(key = content_key_of_json(&body)?, fingerprint = (), store = self.store,
                 scope = "emails.welcome")]
    async fn on_signup(&self, body: Vec<u8>) -> Result<usize, Error> {
        let _event: serde_json::Value = serde_json::from_slice(&body)?;
        Ok(self.sent.fetch_add(1, Ordering::SeqCst) + 1)
    }
}

#[tokio::test]
async fn the_attribute_keys_a_handler_by_the_json_bytes() {
    let mailer = Mailer {
        store: MemoryStore::new(),
        sent: AtomicUsize::new(0),
    };
    let send = |body: &str| mailer.on_signup(body.as_bytes().to_vec());
    let signup = r#"{"email":"ada@example.com","plan":"pro"}"#;
    assert_eq!(send(signup).await.unwrap(), 1);
    let copy = r#"{ "plan": "pro", "email": "ada@example.com" }"#;
    assert_eq!(send(copy).await.unwrap(), 1);
    let (a, b) = MERGED_BY_A_VALUE[2];
    assert_eq!(send(a).await.unwrap(), 2);
    assert_eq!(send(b).await.unwrap(), 3);
    // Not JSON: refused before the handler runs, for the consumer to
    // dead-letter.
    let refused = send("email=ada@example.com").await.unwrap_err();
    assert!(
        matches!(refused, Error::Serialization(_)) && !refused.is_retryable(),
        "{refused:?}"
    );
    assert_eq!(mailer.sent.load(Ordering::SeqCst), 3);
}

#[derive(Clone, Debug, PartialEq, Serialize, Deserialize)]
struct Granted {
    account: String,
    #[serde(serialize_with = "idem::fingerprint::unordered")]
    permissions: HashSet<String>,
}

const PERMISSIONS: [&str; 24] = [
    "read", "write", "admin", "billing", "refund", "export", "import", "invite", "delete", "audit",
    "support", "charge", "payout", "dispute", "report", "webhook", "api", "sso", "mfa", "team",
    "owner", "viewer", "editor", "finance",
];

/// 8 deliveries of one message, each read into a `HashSet` of its own
/// (which iterates in an order of its own): one content key, one
/// `key_of`, and the handler runs once. (Without `unordered` on the field,
/// the deliveries got as many keys as orders, and each was processed.)
#[tokio::test]
async fn a_hash_set_written_unordered_gives_every_redelivery_one_key() {
    let sent = Granted {
        account: "acct-7".into(),
        permissions: PERMISSIONS.iter().map(|p| p.to_string()).collect(),
    };
    let bytes = serde_json::to_vec(&sent).unwrap();
    let dedup = Deduplicator::new(MemoryStore::new(), "grants.on_granted");
    let runs = AtomicUsize::new(0);
    let (mut keys, mut derived, mut orders) = (HashSet::new(), HashSet::new(), HashSet::new());
    for _delivery in 0..8 {
        let event: Granted = serde_json::from_slice(&bytes).unwrap();
        orders.insert(event.permissions.iter().cloned().collect::<Vec<_>>());
        let key = content_key(&event).unwrap();
        keys.insert(key.as_str().to_owned());
        derived.insert(key_of(&event).to_key().unwrap().as_str().to_owned());
        dedup
            .process(&key, &event, async {
                Ok::<_, Error>(runs.fetch_add(1, Ordering::SeqCst))
            })
            .await
            .unwrap();
    }
    assert!(orders.len() > 1, "8 fresh sets iterated in one order");
    assert_eq!(
        (keys.len(), derived.len(), runs.load(Ordering::SeqCst)),
        (1, 1, 1)
    );
    // Another set is another message.
    let mut other = sent.clone();
    other.permissions.remove("admin");
    assert!(!keys.contains(content_key(&other).unwrap().as_str()));
}
