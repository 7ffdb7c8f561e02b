use idem::{idempotent, MemoryStore};

#[idempotent(key = key, store = store, ttl = "24h", ttl = "1h")]
async fn charge(store: &MemoryStore, key: String) -> Result<usize, idem::Error> {
    Ok(store.len() + key.len())
}

fn main() {}
