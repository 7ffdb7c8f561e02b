use idem::{idempotent, MemoryStore};

#[derive(Debug)]
enum PaymentError {
    Declined,
}

#[idempotent(key = key, store = store)]
async fn charge(store: &MemoryStore, key: String, amount: u64) -> Result<u64, PaymentError> {
    if amount == 0 {
        return Err(PaymentError::Declined);
    }
    Ok(amount)
}

fn main() {}
