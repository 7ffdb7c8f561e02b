//! An error enum that holds an `idem::Error` derives serde and is stored by
//! `replayable` as it is: `idem::Error` serializes as its kind and message
//! (and the fields that rebuild it), and deserializes to an equivalent
//! error. A replayed store error is the first run's answer, message and
//! all, not news about the store.

use std::sync::atomic::{AtomicU32, Ordering};
use std::time::Duration;

use idem::{idempotent, Error, KeyError, MemoryStore};
use serde::{Deserialize, Serialize};
use serde_json::json;

#[derive(Debug, thiserror::Error, Serialize, Deserialize)]
enum PaymentError {
    #[error("card declined")]
    Declined,
    #[error("gateway unavailable")]
    Unavailable,
    #[error(transparent)]
    Idempotency(#[from] Error),
}

fn every_error() -> Vec<Error> {
    vec![
        Error::KeyReused,
        Error::InProgress {
            retry_after: Duration::from_millis(1500),
        },
        Error::InvalidKey(KeyError::Missing),
        Error::InvalidKey(KeyError::Empty),
        Error::InvalidKey(KeyError::TooLong { len: 300 }),
        Error::InvalidKey(KeyError::InvalidByte {
            offset: 3,
            byte: b' ',
        }),
        Error::MissingKey,
        Error::LeaseLost,
        Error::store("connection refused"),
        Error::Serialization(serde_json::from_str::<u8>("x").unwrap_err()),
        Error::Config("the ttl must be longer than zero".into()),
        Error::Unrecorded("a receipt cannot be encoded".into()),
    ]
}

#[test]
fn every_idem_error_comes_back_equivalent() {
    for err in every_error() {
        let json = serde_json::to_value(&err).unwrap();
        assert_eq!(json["message"], err.to_string(), "{json}");
        let back: Error = serde_json::from_value(json.clone()).unwrap();
        assert_eq!(back.to_string(), err.to_string(), "{json}");
        assert_eq!(back.is_retryable(), err.is_retryable(), "{json}");
        assert_eq!(
            std::mem::discriminant(&back),
            std::mem::discriminant(&err),
            "{json}"
        );
    }
}

#[test]
fn the_serialized_form_is_kind_message_and_what_rebuilds_the_error() {
    let form = |err: Error| serde_json::to_value(err).unwrap();
    assert_eq!(
        form(Error::KeyReused),
        json!({"kind": "key_reused", "message": "idempotency key reused with a different payload"})
    );
    let in_progress = form(Error::InProgress {
        retry_after: Duration::from_secs(1),
    });
    assert_eq!(in_progress["kind"], "in_progress");
    assert_eq!(in_progress["retry_after_ms"], 1000);
    let invalid = form(Error::InvalidKey(KeyError::TooLong { len: 300 }));
    assert_eq!(
        invalid["key_error"],
        json!({"kind": "too_long", "len": 300})
    );
    let store = form(Error::store("connection refused"));
    assert_eq!(
        store,
        json!({
            "kind": "store",
            "message": "idempotency store error: connection refused",
            "source": "connection refused",
        })
    );

    // A form written by hand may give the message alone.
    let config: Error =
        serde_json::from_value(json!({"kind": "config", "message": "bad table"})).unwrap();
    assert!(matches!(config, Error::Config(ref text) if text == "bad table"));
    // A kind this version does not know is refused, not guessed.
    let unknown = serde_json::from_value::<Error>(json!({"kind": "teapot", "message": "?"}));
    assert!(unknown.is_err());
}

static CHARGES: AtomicU32 = AtomicU32::new(0);

#[idempotent(
    key = key,
    store = store,
    scope = "payments.charge",
    replayable = |err| matches!(err, PaymentError::Declined),
)]
async fn charge(store: &MemoryStore, key: &str, card: &str) -> Result<u64, PaymentError> {
    CHARGES.fetch_add(1, Ordering::SeqCst);
    match card {
        "0002" => Err(PaymentError::Declined),
        "0119" => Err(PaymentError::Unavailable),
        _ => Ok(500),
    }
}

#[tokio::test]
async fn a_thiserror_enum_with_an_idem_error_is_replayable() {
    let store = MemoryStore::new();
    // The decline is stored: the retry gets it without charging again.
    for _ in 0..2 {
        let declined = charge(&store, "c-1", "0002").await;
        assert!(
            matches!(declined, Err(PaymentError::Declined)),
            "{declined:?}"
        );
    }
    assert_eq!(CHARGES.load(Ordering::SeqCst), 1);
    // An error the predicate does not pick releases the key.
    for _ in 0..2 {
        let down = charge(&store, "c-2", "0119").await;
        assert!(matches!(down, Err(PaymentError::Unavailable)), "{down:?}");
    }
    assert_eq!(CHARGES.load(Ordering::SeqCst), 3);
    // The library's own errors still arrive through the enum.
    let reused = charge(&store, "c-1", "4242").await;
    assert!(
        matches!(reused, Err(PaymentError::Idempotency(Error::KeyReused))),
        "{reused:?}"
    );
}

static SETTLEMENTS: AtomicU32 = AtomicU32::new(0);

/// Replays every error, including the store errors of the first run: what
/// the documentation advises against, to show what a retry then gets.
#[idempotent(key = key, store = store, scope = "payments.settle", replayable = |_| true)]
async fn settle(store: &MemoryStore, key: &str) -> Result<u64, PaymentError> {
    SETTLEMENTS.fetch_add(1, Ordering::SeqCst);
    Err(Error::store("the ledger's database refused the connection").into())
}

#[tokio::test]
async fn a_replayed_store_error_is_the_first_runs_answer() {
    let store = MemoryStore::new();
    let first = settle(&store, "s-1").await.unwrap_err();
    let retry = settle(&store, "s-1").await.unwrap_err();
    assert_eq!(SETTLEMENTS.load(Ordering::SeqCst), 1, "the body ran once");
    assert_eq!(retry.to_string(), first.to_string());
    let PaymentError::Idempotency(replayed @ Error::Store(_)) = retry else {
        panic!("{retry:?}");
    };
    // Still described as retryable, as the original was, though the key
    // now answers it to every retry until the record expires.
    assert!(replayed.is_retryable());
    let source = std::error::Error::source(&replayed).unwrap();
    assert_eq!(
        source.to_string(),
        "the ledger's database refused the connection"
    );
}
