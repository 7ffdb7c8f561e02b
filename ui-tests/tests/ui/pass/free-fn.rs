use idem::{idempotent, MemoryStore};
use serde::{Deserialize, Serialize};

#[derive(Serialize)]
struct Charge {
    token: String,
    amount: u64,
}

#[derive(Debug, PartialEq, Serialize, Deserialize)]
struct Receipt {
    amount: u64,
}

// The store is an argument: it is left out of the default fingerprint.
#[idempotent(key = cmd.token, store = store)]
pub async fn charge(store: &MemoryStore, cmd: Charge) -> Result<Receipt, idem::Error> {
    Ok(Receipt { amount: cmd.amount })
}

// A key of an integer type, and no argument besides it.
#[idempotent(key = order_id, store = STORE.with(|s| s.clone()))]
async fn ship(order_id: u64) -> Result<(), idem::Error> {
    Ok(())
}

thread_local! {
    static STORE: MemoryStore = MemoryStore::new();
}

#[tokio::main(flavor = "current_thread")]
async fn main() {
    let store = MemoryStore::new();
    let cmd = || Charge {
        token: "k1".into(),
        amount: 5,
    };
    assert_eq!(charge(&store, cmd()).await.unwrap(), Receipt { amount: 5 });
    assert_eq!(charge(&store, cmd()).await.unwrap(), Receipt { amount: 5 });
    ship(7).await.unwrap();
}
