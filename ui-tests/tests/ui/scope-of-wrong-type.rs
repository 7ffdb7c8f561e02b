use idem::{idempotent, MemoryStore};

#[idempotent(key = key, store = store, scope = 42)]
async fn charge(store: &MemoryStore, key: String, amount: u64) -> Result<u64, idem::Error> {
    Ok(amount)
}

fn main() {}
