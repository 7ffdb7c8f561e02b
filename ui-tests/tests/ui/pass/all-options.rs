use std::sync::Arc;

use idem::{idempotent, MemoryStore, Scope};
use serde::{Deserialize, Serialize};

#[derive(Serialize)]
struct Transfer {
    idempotency_key: Option<String>,
    tenant: String,
    from: String,
    to: String,
    cents: u64,
    note: String,
}

#[derive(Debug, Serialize, Deserialize)]
enum TransferError {
    Insufficient,
    Idem(String),
}

impl From<idem::Error> for TransferError {
    fn from(err: idem::Error) -> Self {
        TransferError::Idem(err.to_string())
    }
}

struct Bank {
    store: Arc<MemoryStore>,
}

impl Bank {
    #[idempotent(
        key = cmd.idempotency_key,
        store = self.store,
        scope = Scope::new("bank.transfer").with_principal(&cmd.tenant),
        ttl = "7d",
        lease = "1m30s",
        fail_fast,
        // The free-text note does not make a retry a different request.
        fingerprint = (&cmd.from, &cmd.to, cmd.cents),
        replayable = |err: &TransferError| matches!(err, TransferError::Insufficient),
    )]
    pub async fn transfer(&self, cmd: Transfer) -> Result<u64, TransferError> {
        if cmd.cents > 10_000 {
            return Err(TransferError::Insufficient);
        }
        Ok(cmd.cents)
    }

    #[idempotent(key = key, store = self.store, scope = String::from("bank.ping"), wait = "250ms")]
    pub async fn ping(&self, key: u64) -> Result<(), TransferError> {
        Ok(())
    }
}

// A pattern argument is fine once the fingerprint is explicit.
#[idempotent(key = key, store = store, fingerprint = (from, to), wait = "0s")]
async fn pair(store: &MemoryStore, key: &str, (from, to): (u32, u32)) -> Result<u32, idem::Error> {
    Ok(from + to)
}

#[tokio::main(flavor = "current_thread")]
async fn main() {
    let bank = Bank {
        store: Arc::new(MemoryStore::new()),
    };
    let transfer = |note: &str| Transfer {
        idempotency_key: Some("t-1".into()),
        tenant: "acme".into(),
        from: "a".into(),
        to: "b".into(),
        cents: 500,
        note: note.into(),
    };
    assert_eq!(bank.transfer(transfer("first")).await.unwrap(), 500);
    assert_eq!(bank.transfer(transfer("retry")).await.unwrap(), 500);
    bank.ping(1).await.unwrap();
    assert_eq!(pair(&MemoryStore::new(), "p", (1, 2)).await.unwrap(), 3);
}
