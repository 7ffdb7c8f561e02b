use std::sync::atomic::{AtomicU32, Ordering};

use idem::{idempotent, MemoryStore};
use serde::{Deserialize, Serialize};

#[derive(Debug, PartialEq, Serialize, Deserialize)]
enum PaymentError {
    Declined,
    Timeout,
    Idem(String),
}

impl From<idem::Error> for PaymentError {
    fn from(err: idem::Error) -> Self {
        PaymentError::Idem(err.to_string())
    }
}

impl PaymentError {
    fn is_final(&self) -> bool {
        matches!(self, PaymentError::Declined)
    }
}

static RUNS: AtomicU32 = AtomicU32::new(0);

#[idempotent(key = key, store = store, replayable = |err| matches!(err, PaymentError::Declined))]
async fn charge(store: &MemoryStore, key: String, amount: u64) -> Result<u64, PaymentError> {
    RUNS.fetch_add(1, Ordering::SeqCst);
    match amount {
        0 => Err(PaymentError::Declined),
        1 => Err(PaymentError::Timeout),
        _ => Ok(amount),
    }
}

#[idempotent(key = key, store = store, replayable = PaymentError::is_final)]
async fn refund(store: &MemoryStore, key: String) -> Result<u64, PaymentError> {
    Err(PaymentError::Declined)
}

#[tokio::main(flavor = "current_thread")]
async fn main() {
    let store = MemoryStore::new();
    // A declined charge is saved and replayed without running again.
    assert_eq!(
        charge(&store, "a".into(), 0).await,
        Err(PaymentError::Declined)
    );
    assert_eq!(
        charge(&store, "a".into(), 0).await,
        Err(PaymentError::Declined)
    );
    assert_eq!(RUNS.load(Ordering::SeqCst), 1);
    // A timeout is released: the retry runs again.
    assert_eq!(
        charge(&store, "b".into(), 1).await,
        Err(PaymentError::Timeout)
    );
    assert_eq!(
        charge(&store, "b".into(), 1).await,
        Err(PaymentError::Timeout)
    );
    assert_eq!(RUNS.load(Ordering::SeqCst), 3);
    assert_eq!(
        refund(&store, "r".into()).await,
        Err(PaymentError::Declined)
    );
}
