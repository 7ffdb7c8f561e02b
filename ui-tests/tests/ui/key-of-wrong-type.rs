use idem::{idempotent, MemoryStore};
use serde::Serialize;

#[derive(Serialize)]
struct Quote {
    request_id: f64,
    amount: u64,
}

#[idempotent(key = quote.request_id, store = store)]
async fn accept(store: &MemoryStore, quote: Quote) -> Result<u64, idem::Error> {
    Ok(quote.amount)
}

fn main() {}
