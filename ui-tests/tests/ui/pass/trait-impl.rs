use std::future::Future;

use idem::{idempotent, MemoryStore};

trait Payments {
    async fn charge(&self, key: String, amount: u64) -> Result<u64, idem::Error>;
}

// A trait that requires a `Send` future.
trait Refunds {
    fn refund(
        &self,
        key: String,
        amount: u64,
    ) -> impl Future<Output = Result<u64, idem::Error>> + Send;
}

struct Gateway {
    store: MemoryStore,
}

impl Payments for Gateway {
    #[idempotent(key = key, store = self.store)]
    async fn charge(&self, key: String, amount: u64) -> Result<u64, idem::Error> {
        Ok(amount)
    }
}

impl Refunds for Gateway {
    #[idempotent(key = key, store = self.store)]
    async fn refund(&self, key: String, amount: u64) -> Result<u64, idem::Error> {
        Ok(amount)
    }
}

#[tokio::main(flavor = "current_thread")]
async fn main() {
    let gateway = Gateway {
        store: MemoryStore::new(),
    };
    assert_eq!(gateway.charge("k".into(), 4).await.unwrap(), 4);
    let refund = tokio::spawn(async move { gateway.refund("k".into(), 4).await });
    assert_eq!(refund.await.unwrap().unwrap(), 4);
}
