use idem::{idempotent, SqliteStore};

#[idempotent(key = key, store = store, tx = conn)]
async fn charge(store: &SqliteStore, key: String) -> Result<usize, idem::Error> {
    let _ = store;
    Ok(key.len())
}

fn main() {}
