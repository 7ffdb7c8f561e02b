//! `#[idempotent]` end to end: the expanded functions against real stores.

use crate::common;

use std::collections::HashMap;
use std::sync::atomic::{AtomicUsize, Ordering};
use std::sync::Arc;
use std::time::Duration;

use common::backend::sqlite_file;
use idem::{idempotent, Error, Key, MemoryStore, Scope, Store};
use serde::{Deserialize, Serialize};
use tokio::sync::Barrier;

#[derive(Debug, thiserror::Error, Serialize, Deserialize)]
enum PaymentError {
    #[error("declined: {0}")]
    Declined(String),
    #[error("gateway unavailable")]
    Unavailable,
    #[error("invalid amount")]
    InvalidAmount,
    #[error(transparent)]
    #[serde(skip)]
    Idem(#[from] Error),
}

#[derive(Debug, Clone, Serialize, Deserialize)]
struct PaymentCommand {
    token: String,
    amount: u64,
    card: String,
    tenant: String,
}

#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
struct Payment {
    charge: usize,
    amount: u64,
}

struct Service<S> {
    store: S,
    gateway_calls: AtomicUsize,
    fail_next: std::sync::Mutex<bool>,
}

impl<S: Store> Service<S> {
    fn new(store: S) -> Self {
        Service {
            store,
            gateway_calls: AtomicUsize::new(0),
            fail_next: std::sync::Mutex::new(false),
        }
    }

    fn calls(&self) -> usize {
        self.gateway_calls.load(Ordering::SeqCst)
    }

    async fn gateway(&self, amount: u64, card: &str) -> Result<usize, PaymentError> {
        let n = self.gateway_calls.fetch_add(1, Ordering::SeqCst) + 1;
        tokio::time::sleep(Duration::from_millis(5)).await;
        if std::mem::take(&mut *self.fail_next.lock().unwrap()) {
            return Err(PaymentError::Unavailable);
        }
        if card.ends_with("0002") {
            return Err(PaymentError::Declined(format!("card {card} for {amount}")));
        }
        Ok(n)
    }

    #[idempotent(
        key = cmd.token,
        store = self.store,
        replayable = |e| matches!(e, PaymentError::Declined(_)),
    )]
    async fn pay(&self, cmd: PaymentCommand) -> Result<Payment, PaymentError> {
        if cmd.amount == 0 {
            // Early return keeps its meaning: an error, released.
            return Err(PaymentError::InvalidAmount);
        }
        let charge = self.gateway(cmd.amount, &cmd.card).await?;
        Ok(Payment {
            charge,
            amount: cmd.amount,
        })
    }

    #[idempotent(
        key = cmd.token,
        store = self.store,
        scope = Scope::new("payments.tenant").with_principal(&cmd.tenant),
        fail_fast,
        lease = "10s",
        ttl = "1h",
    )]
    async fn pay_for_tenant(&self, cmd: &PaymentCommand) -> Result<Payment, PaymentError> {
        let charge = self.gateway(cmd.amount, &cmd.card).await?;
        Ok(Payment {
            charge,
            amount: cmd.amount,
        })
    }
}

fn cmd(token: &str, amount: u64) -> PaymentCommand {
    PaymentCommand {
        token: token.into(),
        amount,
        card: "4242".into(),
        tenant: "acme".into(),
    }
}

#[tokio::test]
async fn runs_once_and_replays() {
    let (store, _guard) = sqlite_file::store(8).await;
    let service = Service::new(store);
    let first = service.pay(cmd("t-1", 100)).await.unwrap();
    let again = service.pay(cmd("t-1", 100)).await.unwrap();
    assert_eq!(first, again);
    assert_eq!(service.calls(), 1);
    // The default scope is the module path and the function name.
    let scope = Scope::new(concat!(module_path!(), "::", "pay"));
    let record = service
        .store
        .get(&scope, &Key::new("t-1").unwrap())
        .await
        .unwrap();
    assert!(record.is_some(), "no record under {scope}");
}

#[tokio::test]
async fn reused_key_other_payload_is_refused() {
    let service = Service::new(MemoryStore::new());
    service.pay(cmd("t-2", 100)).await.unwrap();
    let err = service.pay(cmd("t-2", 200)).await.unwrap_err();
    assert!(
        matches!(err, PaymentError::Idem(Error::KeyReused)),
        "{err:?}"
    );
    assert_eq!(service.calls(), 1);
}

#[tokio::test]
async fn errors_release_unless_replayable() {
    let service = Service::new(MemoryStore::new());
    // Early return: released, so the retry runs.
    let err = service.pay(cmd("t-3", 0)).await.unwrap_err();
    assert!(matches!(err, PaymentError::InvalidAmount));
    // `?` on a transient gateway error: released.
    *service.fail_next.lock().unwrap() = true;
    let err = service.pay(cmd("t-4", 10)).await.unwrap_err();
    assert!(matches!(err, PaymentError::Unavailable));
    let ok = service.pay(cmd("t-4", 10)).await.unwrap();
    assert_eq!(service.pay(cmd("t-4", 10)).await.unwrap(), ok);
    assert_eq!(service.calls(), 2);
    // A declined card is replayable: stored and replayed.
    let mut declined = cmd("t-5", 10);
    declined.card = "4000000000000002".into();
    for _ in 0..3 {
        let err = service.pay(declined.clone()).await.unwrap_err();
        assert!(matches!(err, PaymentError::Declined(_)), "{err:?}");
    }
    assert_eq!(service.calls(), 3);
}

#[tokio::test]
async fn invalid_and_missing_keys_are_typed_errors() {
    let service = Service::new(MemoryStore::new());
    let err = service.pay(cmd("has space", 1)).await.unwrap_err();
    assert!(
        matches!(err, PaymentError::Idem(Error::InvalidKey(_))),
        "{err:?}"
    );
    let err = service.pay(cmd("", 1)).await.unwrap_err();
    assert!(
        matches!(err, PaymentError::Idem(Error::InvalidKey(_))),
        "{err:?}"
    );
    assert_eq!(service.calls(), 0);

    #[idempotent(key = token, store = store)]
    async fn optional(store: &MemoryStore, token: Option<String>) -> Result<u32, Error> {
        Ok(1)
    }
    let store = MemoryStore::new();
    assert!(matches!(
        optional(&store, None).await,
        Err(Error::MissingKey)
    ));
    assert_eq!(optional(&store, Some("k".into())).await.unwrap(), 1);
}

#[tokio::test]
async fn principals_scope_keys_and_fail_fast_applies() {
    let service = Arc::new(Service::new(MemoryStore::new()));
    let a = service.pay_for_tenant(&cmd("t-6", 5)).await.unwrap();
    let mut other_tenant = cmd("t-6", 5);
    other_tenant.tenant = "globex".into();
    let b = service.pay_for_tenant(&other_tenant).await.unwrap();
    assert_ne!(a, b, "two principals never share a result");
    assert_eq!(service.pay_for_tenant(&cmd("t-6", 5)).await.unwrap(), a);
    assert_eq!(service.calls(), 2);

    // fail_fast: a duplicate during the first call fails at once.
    let (s1, s2) = (service.clone(), service.clone());
    let first = tokio::spawn(async move { s1.pay_for_tenant(&cmd("t-7", 5)).await });
    while s2.calls() < 3 {
        tokio::task::yield_now().await;
    }
    let err = s2.pay_for_tenant(&cmd("t-7", 5)).await.unwrap_err();
    assert!(
        matches!(err, PaymentError::Idem(Error::InProgress { .. })),
        "{err:?}"
    );
    first.await.unwrap().unwrap();
}

trait Mailer {
    async fn send(&self, to: &str, template: &str) -> Result<u64, Error>;
}

struct Outbox {
    store: Arc<dyn Store>,
    sent: AtomicUsize,
}

impl Mailer for Outbox {
    #[idempotent(key = format!("{to}:{template}"), store = self.store, ttl = "7d")]
    async fn send(&self, to: &str, template: &str) -> Result<u64, Error> {
        Ok(self.sent.fetch_add(1, Ordering::SeqCst) as u64 + 1)
    }
}

#[tokio::test]
async fn trait_impl_methods_and_dyn_stores() {
    let (store, _guard) = sqlite_file::store(8).await;
    let outbox = Outbox {
        store: Arc::new(store),
        sent: AtomicUsize::new(0),
    };
    assert_eq!(outbox.send("ada@example.com", "welcome").await.unwrap(), 1);
    assert_eq!(outbox.send("ada@example.com", "welcome").await.unwrap(), 1);
    assert_eq!(outbox.send("bob@example.com", "welcome").await.unwrap(), 2);
    assert_eq!(outbox.sent.load(Ordering::SeqCst), 2);
}

/// 200 concurrent calls over 20 keys through the attribute on a file-backed
/// SQLite database: 20 gateway calls, one answer per key.
#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn storm_through_the_attribute() {
    let (store, _guard) = sqlite_file::store(8).await;
    let service = Arc::new(Service::new(store));
    let barrier = Arc::new(Barrier::new(200));
    let mut tasks = Vec::new();
    for i in 0..200 {
        let (service, barrier) = (service.clone(), barrier.clone());
        tasks.push(tokio::spawn(async move {
            let token = format!("storm-{}", i % 20);
            barrier.wait().await;
            let payment = service.pay(cmd(&token, 42)).await.unwrap();
            (token, payment)
        }));
    }
    let mut by_key: HashMap<String, Vec<Payment>> = HashMap::new();
    for task in tasks {
        let (token, payment) = task.await.unwrap();
        by_key.entry(token).or_default().push(payment);
    }
    assert_eq!(service.calls(), 20);
    for payments in by_key.values() {
        assert_eq!(payments.len(), 10);
        assert!(payments.iter().all(|p| p == &payments[0]));
    }
}
