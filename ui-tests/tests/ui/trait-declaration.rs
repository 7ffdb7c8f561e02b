use idem::{idempotent, MemoryStore};

trait Payments {
    #[idempotent(key = key, store = store)]
    async fn charge(&self, store: &MemoryStore, key: String) -> Result<u64, idem::Error>;
}

fn main() {}
