use idem::{idempotent, MemoryStore};

#[idempotent(key = key, store = store, missing_key = skip)]
async fn charge(store: &MemoryStore, key: Option<String>, amount: u64) -> Result<u64, idem::Error> {
    let _ = (store, key);
    Ok(amount)
}

fn main() {}
