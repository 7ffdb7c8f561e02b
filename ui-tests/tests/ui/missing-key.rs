use idem::{idempotent, MemoryStore};

#[idempotent(store = store)]
async fn charge(store: &MemoryStore, key: String) -> Result<usize, idem::Error> {
    Ok(store.len() + key.len())
}

fn main() {}
