use idem::{idempotent, MemoryStore};

struct Card {
    number: String,
}

#[idempotent(key = key, store = store)]
async fn charge(store: &MemoryStore, key: String, card: Card) -> Result<usize, idem::Error> {
    Ok(card.number.len())
}

fn main() {}
