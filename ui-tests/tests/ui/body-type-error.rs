use idem::{idempotent, MemoryStore};

#[idempotent(key = key, store = store)]
async fn charge(store: &MemoryStore, key: String, amount: u64) -> Result<u64, idem::Error> {
    let cents: u64 = "100";
    Ok(amount + cents)
}

fn main() {}
