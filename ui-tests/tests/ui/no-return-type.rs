use idem::{idempotent, MemoryStore};

#[idempotent(key = key, store = store)]
async fn charge(store: &MemoryStore, key: String) {
    println!("charged {key} ({} records)", store.len());
}

fn main() {}
