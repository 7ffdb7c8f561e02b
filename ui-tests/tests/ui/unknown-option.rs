use idem::{idempotent, MemoryStore};

#[idempotent(key = key, store = store, retries = 3)]
async fn charge(store: &MemoryStore, key: String) -> Result<usize, idem::Error> {
    Ok(store.len() + key.len())
}

fn main() {}
