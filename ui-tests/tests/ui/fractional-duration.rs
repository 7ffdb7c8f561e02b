use idem::{idempotent, MemoryStore};

#[idempotent(key = key, store = store, ttl = "1.5h")]
async fn charge(store: &MemoryStore, key: String) -> Result<usize, idem::Error> {
    Ok(store.len() + key.len())
}

fn main() {}
