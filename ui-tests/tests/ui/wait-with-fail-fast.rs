use idem::{idempotent, MemoryStore};

#[idempotent(key = key, store = store, wait = "10s", fail_fast)]
async fn charge(store: &MemoryStore, key: String) -> Result<usize, idem::Error> {
    Ok(store.len() + key.len())
}

fn main() {}
