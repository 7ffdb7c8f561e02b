use idem::{idempotent, MemoryStore};

#[idempotent(key = key, store = store)]
async fn charge(store: &MemoryStore, key: String) -> Option<usize> {
    Some(store.len() + key.len())
}

fn main() {}
