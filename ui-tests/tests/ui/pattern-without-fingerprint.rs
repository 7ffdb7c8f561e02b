use idem::{idempotent, MemoryStore};

#[idempotent(key = key, store = store)]
async fn transfer(
    store: &MemoryStore,
    key: String,
    (from, to): (usize, usize),
) -> Result<usize, idem::Error> {
    Ok(store.len() + key.len() + from + to)
}

fn main() {}
