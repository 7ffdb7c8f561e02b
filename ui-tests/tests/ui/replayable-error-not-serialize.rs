use idem::{idempotent, MemoryStore};

#[derive(Debug)]
enum PaymentError {
    Declined,
    Idem(idem::Error),
}

impl From<idem::Error> for PaymentError {
    fn from(err: idem::Error) -> Self {
        PaymentError::Idem(err)
    }
}

#[idempotent(
    key = key,
    store = store,
    replayable = |err| matches!(err, PaymentError::Declined),
)]
async fn charge(store: &MemoryStore, key: String, amount: u64) -> Result<u64, PaymentError> {
    if amount == 0 {
        return Err(PaymentError::Declined);
    }
    Ok(amount)
}

fn main() {}
