use std::collections::HashMap;

use idem::{idempotent, MemoryStore};
use serde::Serialize;

#[derive(Serialize)]
struct Order {
    key: String,
    items: Vec<String>,
}

struct Shop {
    store: MemoryStore,
    prices: HashMap<String, u64>,
}

impl Shop {
    // Borrows of `self` and of the arguments live across `.await`s in the
    // body; the key is borrowed from an argument.
    #[idempotent(key = &order.key, store = self.store)]
    async fn total(&self, order: &Order, discount: &u64) -> Result<u64, idem::Error> {
        let prices = &self.prices;
        let first = order.items.first();
        tokio::task::yield_now().await;
        let total: u64 = order.items.iter().map(|item| prices[item]).sum();
        let _ = first;
        Ok(total - discount)
    }
}

#[tokio::main(flavor = "current_thread")]
async fn main() {
    let shop = Shop {
        store: MemoryStore::new(),
        prices: HashMap::from([("tea".to_owned(), 3), ("cake".to_owned(), 5)]),
    };
    let order = Order {
        key: "o-1".into(),
        items: vec!["tea".into(), "cake".into()],
    };
    assert_eq!(shop.total(&order, &1).await.unwrap(), 7);
    // The order is still usable: the function only borrowed it.
    assert_eq!(order.items.len(), 2);
}
