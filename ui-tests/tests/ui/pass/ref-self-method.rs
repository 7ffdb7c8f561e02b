use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::Arc;

use idem::{idempotent, MemoryStore};
use serde::Serialize;

#[derive(Serialize)]
struct Charge {
    token: String,
    amount: u64,
}

struct Payments {
    store: Arc<MemoryStore>,
    charged: AtomicU64,
}

impl Payments {
    #[idempotent(key = cmd.token, store = self.store)]
    pub async fn charge(&self, cmd: Charge) -> Result<u64, idem::Error> {
        Ok(self.charged.fetch_add(cmd.amount, Ordering::SeqCst) + cmd.amount)
    }
}

fn assert_send<T: Send>(_: &T) {}

#[tokio::main(flavor = "current_thread")]
async fn main() {
    let payments = Payments {
        store: Arc::new(MemoryStore::new()),
        charged: AtomicU64::new(0),
    };
    let call = payments.charge(Charge {
        token: "k".into(),
        amount: 3,
    });
    assert_send(&call);
    assert_eq!(call.await.unwrap(), 3);
    assert_eq!(
        payments
            .charge(Charge {
                token: "k".into(),
                amount: 3
            })
            .await
            .unwrap(),
        3
    );
    assert_eq!(payments.charged.load(Ordering::SeqCst), 3);
}
