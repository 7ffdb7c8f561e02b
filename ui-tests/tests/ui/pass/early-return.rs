use idem::{idempotent, MemoryStore};
use serde::{Deserialize, Serialize};

#[derive(Debug, Serialize, Deserialize)]
enum PaymentError {
    Declined,
    Parse(String),
    Idem(String),
}

impl From<idem::Error> for PaymentError {
    fn from(err: idem::Error) -> Self {
        PaymentError::Idem(err.to_string())
    }
}

impl From<std::num::ParseIntError> for PaymentError {
    fn from(err: std::num::ParseIntError) -> Self {
        PaymentError::Parse(err.to_string())
    }
}

#[idempotent(key = key, store = store)]
async fn charge(store: &MemoryStore, key: String, amount: String) -> Result<u64, PaymentError> {
    // `?` converts through the declared error type.
    let amount: u64 = amount.parse()?;
    if amount == 0 {
        return Err(PaymentError::Declined);
    }
    if amount > 1_000 {
        return Ok(1_000);
    }
    Ok(amount)
}

#[tokio::main(flavor = "current_thread")]
async fn main() {
    let store = MemoryStore::new();
    assert_eq!(
        charge(&store, "a".into(), "5000".into()).await.unwrap(),
        1_000
    );
    assert!(matches!(
        charge(&store, "b".into(), "0".into()).await,
        Err(PaymentError::Declined)
    ));
    assert!(matches!(
        charge(&store, "c".into(), "x".into()).await,
        Err(PaymentError::Parse(_))
    ));
}
