use idem::{idempotent, MemoryStore};

#[idempotent(key = key, store = store)]
fn charge(store: &MemoryStore, key: String) -> Result<usize, idem::Error> {
    Ok(store.len() + key.len())
}

fn main() {}
