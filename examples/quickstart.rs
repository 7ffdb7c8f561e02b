//! The smallest useful service: a payment charged once per idempotency key,
//! however often and however concurrently the request is retried.
//!
//! Run it with `cargo run --example quickstart`. It uses an embedded SQLite
//! database in memory; pass a path (`cargo run --example quickstart --
//! payments.db`) to keep the records in a file across runs.

use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::Arc;
use std::time::Duration;

use idem::{idempotent, SqliteStore};
use serde::{Deserialize, Serialize};

#[derive(Debug, Serialize, Deserialize)]
struct PaymentCommand {
    idempotency_token: String,
    amount: u64,
    card: String,
}

#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
struct Payment {
    id: String,
    amount: u64,
    status: String,
}

#[derive(Debug, thiserror::Error, Serialize, Deserialize)]
enum PaymentError {
    #[error("the card was declined")]
    Declined,
    #[error(transparent)]
    #[serde(skip)]
    Idempotency(#[from] idem::Error),
}

/// A stand-in for a card gateway: counts the requests it gets and the
/// charges it really makes.
#[derive(Default)]
struct Gateway {
    requests: AtomicU64,
    charges: AtomicU64,
}

impl Gateway {
    async fn charge(&self, amount: u64, card: &str) -> Result<String, PaymentError> {
        self.requests.fetch_add(1, Ordering::SeqCst);
        tokio::time::sleep(Duration::from_millis(50)).await;
        if card.ends_with("0002") {
            return Err(PaymentError::Declined);
        }
        let n = self.charges.fetch_add(1, Ordering::SeqCst) + 1;
        Ok(format!("ch_{n}_{amount}"))
    }
}

struct PaymentService {
    store: SqliteStore,
    gateway: Gateway,
}

impl PaymentService {
    /// Charged once per token; a declined card is a permanent answer, stored
    /// and replayed like a success.
    #[idempotent(
        key = cmd.idempotency_token,
        store = self.store,
        fingerprint = (cmd.amount, &cmd.card),
        replayable = |e| matches!(e, PaymentError::Declined),
    )]
    async fn process_payment(&self, cmd: PaymentCommand) -> Result<Payment, PaymentError> {
        let charge = self.gateway.charge(cmd.amount, &cmd.card).await?;
        Ok(Payment {
            id: charge,
            amount: cmd.amount,
            status: "succeeded".into(),
        })
    }
}

fn command(token: &str, amount: u64, card: &str) -> PaymentCommand {
    PaymentCommand {
        idempotency_token: token.into(),
        amount,
        card: card.into(),
    }
}

#[tokio::main]
async fn main() -> Result<(), Box<dyn std::error::Error>> {
    let url = match std::env::args().nth(1) {
        Some(path) => format!("sqlite://{path}"),
        None => "sqlite::memory:".to_owned(),
    };
    let service = Arc::new(PaymentService {
        store: SqliteStore::connect(&url).await?,
        gateway: Gateway::default(),
    });

    // A client retries after a lost response: the second call replays.
    let first = service
        .process_payment(command("order-1001", 2500, "4242424242424242"))
        .await?;
    let retry = service
        .process_payment(command("order-1001", 2500, "4242424242424242"))
        .await?;
    println!("first call:  {first:?}");
    println!("retry:       {retry:?} (replayed: {})", first == retry);

    // Ten concurrent duplicates: one charge, ten identical answers.
    let mut tasks = Vec::new();
    for _ in 0..10 {
        let service = service.clone();
        tasks.push(tokio::spawn(async move {
            service
                .process_payment(command("order-1002", 990, "4000056655665556"))
                .await
        }));
    }
    let mut answers = Vec::new();
    for task in tasks {
        answers.push(task.await??);
    }
    let identical = answers.iter().all(|a| a == &answers[0]);
    println!(
        "10 concurrent duplicates -> {:?}, all identical: {identical}",
        answers[0].id
    );

    // The same key with another amount is refused, not charged.
    match service
        .process_payment(command("order-1001", 9999, "4242424242424242"))
        .await
    {
        Err(PaymentError::Idempotency(idem::Error::KeyReused)) => {
            println!("reused key with another amount: refused (KeyReused)")
        }
        other => return Err(format!("expected KeyReused, got {other:?}").into()),
    }

    // A declined card is stored and replayed: the gateway is asked once.
    for _ in 0..2 {
        let declined = service
            .process_payment(command("order-1003", 100, "4000000000000002"))
            .await;
        println!("declined card: {declined:?}");
    }

    let requests = service.gateway.requests.load(Ordering::SeqCst);
    let charges = service.gateway.charges.load(Ordering::SeqCst);
    println!("gateway requests: {requests} (expected 3), charges: {charges} (expected 2)");
    if (requests, charges) != (3, 2) {
        return Err("the gateway was called more than once for a key".into());
    }
    Ok(())
}
