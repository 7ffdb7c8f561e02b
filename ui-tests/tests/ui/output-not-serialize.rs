use idem::{idempotent, MemoryStore};

struct Receipt {
    amount: u64,
}

#[idempotent(key = key, store = store)]
async fn charge(store: &MemoryStore, key: String, amount: u64) -> Result<Receipt, idem::Error> {
    Ok(Receipt { amount })
}

fn main() {}
