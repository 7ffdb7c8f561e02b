//! Keys a user's types become: UUIDs (feature `uuid`), any `Display` type
//! through `idem::key::Displayed`, and keys derived from several fields with
//! `idem::fingerprint::key_of`, each through the `key = ...` of `#[idempotent]`.

use std::sync::atomic::{AtomicU32, Ordering};

use idem::key::Displayed;
use idem::{idempotent, AsKey, KeyError, MemoryStore};
use serde::Serialize;

struct InvoiceNumber(u32);

impl std::fmt::Display for InvoiceNumber {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        write!(f, "INV-{:06}", self.0)
    }
}

#[derive(Serialize)]
struct Statement {
    account: String,
    month: String,
}

struct Billing {
    store: MemoryStore,
    runs: AtomicU32,
}

impl Billing {
    #[idempotent(key = Displayed(&invoice), store = self.store, fingerprint = invoice.0)]
    async fn send_invoice(&self, invoice: InvoiceNumber) -> Result<u32, idem::Error> {
        Ok(self.runs.fetch_add(1, Ordering::SeqCst) + 1)
    }

    #[idempotent(key = idem::fingerprint::key_of(&(&cmd.account, &cmd.month)), store = self.store)]
    async fn close_month(&self, cmd: Statement) -> Result<u32, idem::Error> {
        Ok(self.runs.fetch_add(1, Ordering::SeqCst) + 1)
    }

    #[idempotent(key = id, store = self.store)]
    async fn refund(&self, id: uuid::Uuid) -> Result<u32, idem::Error> {
        Ok(self.runs.fetch_add(1, Ordering::SeqCst) + 1)
    }
}

fn billing() -> Billing {
    Billing {
        store: MemoryStore::new(),
        runs: AtomicU32::new(0),
    }
}

#[tokio::test]
async fn display_types_are_keys_by_their_text() {
    let billing = billing();
    assert_eq!(billing.send_invoice(InvoiceNumber(7)).await.unwrap(), 1);
    assert_eq!(billing.send_invoice(InvoiceNumber(7)).await.unwrap(), 1);
    assert_eq!(billing.send_invoice(InvoiceNumber(8)).await.unwrap(), 2);
    assert_eq!(
        Displayed(&InvoiceNumber(7)).to_key().unwrap().as_str(),
        "INV-000007"
    );
    // Text that breaks the key rules is refused, not mangled.
    assert!(matches!(
        Displayed("two words").to_key(),
        Err(KeyError::InvalidByte { offset: 3, .. })
    ));
}

#[tokio::test]
async fn keys_derived_from_fields_are_stable() {
    let billing = billing();
    let cmd = |account: &str, month: &str| Statement {
        account: account.into(),
        month: month.into(),
    };
    assert_eq!(
        billing.close_month(cmd("acct-1", "2026-11")).await.unwrap(),
        1
    );
    assert_eq!(
        billing.close_month(cmd("acct-1", "2026-11")).await.unwrap(),
        1
    );
    assert_eq!(
        billing.close_month(cmd("acct-1", "2026-12")).await.unwrap(),
        2
    );
    let key = idem::fingerprint::key_of(&("acct-1", "2026-11"))
        .to_key()
        .unwrap();
    assert_eq!(key.as_str().len(), "sha256:".len() + 64);
    // A value that cannot be serialized is a key error, not a panic.
    let mut bad = std::collections::HashMap::new();
    bad.insert((1, 2), 3);
    assert!(matches!(
        idem::fingerprint::key_of(&bad).to_key(),
        Err(KeyError::Unserializable(_))
    ));
}

#[tokio::test]
async fn uuids_are_keys() {
    let billing = billing();
    let id = uuid::Uuid::from_u128(0x67e5_5044_10b1_426f_9247_bb68_0e5f_e0c8);
    assert_eq!(
        id.to_key().unwrap().as_str(),
        "67e55044-10b1-426f-9247-bb680e5fe0c8"
    );
    assert_eq!(billing.refund(id).await.unwrap(), 1);
    assert_eq!(billing.refund(id).await.unwrap(), 1);
}
