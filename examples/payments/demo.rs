//! `payments demo`: the service in this process, a client that behaves
//! like the real world (answers lost to timeouts, retries, duplicates sent
//! at once, a key reused by mistake, a flaky gateway), and a table of what
//! happened. The run fails (exit status 1) unless every accepted key was
//! charged exactly once and stored exactly once.

use std::collections::HashSet;
use std::fmt;
use std::sync::atomic::{AtomicUsize, Ordering};
use std::sync::{Arc, Mutex};
use std::time::Duration;

use serde_json::{json, Value};

use super::app::{self, Config};
use super::random::new_id;

/// What the client saw.
#[derive(Default)]
struct Tally {
    requests: AtomicUsize,
    replays: AtomicUsize,
    conflicts: AtomicUsize,
    in_progress: AtomicUsize,
    transient: AtomicUsize,
    dropped: AtomicUsize,
    keys: Mutex<HashSet<String>>,
    /// Keys answered with a final outcome: 201 created or 402 declined.
    accepted: Mutex<HashSet<String>>,
}

/// The client's side of the run.
struct Client {
    http: reqwest::Client,
    url: String,
    tally: Tally,
}

/// How long a dropped request waits for its answer: shorter than the
/// gateway's latency, so the answer is lost while the charge goes on.
const DROP_AFTER: Duration = Duration::from_millis(20);
const MAX_ATTEMPTS: usize = 50;

impl Client {
    /// One `POST /payments`; `None` when the client gave up waiting.
    async fn send(&self, key: &str, body: &Value, timeout: Option<Duration>) -> Option<u16> {
        self.tally.requests.fetch_add(1, Ordering::Relaxed);
        self.tally.keys.lock().unwrap().insert(key.to_owned());
        let mut request = self
            .http
            .post(format!("{}/payments", self.url))
            .header("Idempotency-Key", key)
            .json(body);
        if let Some(timeout) = timeout {
            request = request.timeout(timeout);
        }
        let response = match request.send().await {
            Ok(response) => response,
            Err(_) => {
                self.tally.dropped.fetch_add(1, Ordering::Relaxed);
                return None;
            }
        };
        let status = response.status().as_u16();
        if response.headers().get("idempotent-replayed").is_some() {
            self.tally.replays.fetch_add(1, Ordering::Relaxed);
        }
        match status {
            201 | 402 => {
                self.tally.accepted.lock().unwrap().insert(key.to_owned());
            }
            409 => {
                self.tally.in_progress.fetch_add(1, Ordering::Relaxed);
            }
            422 => {
                self.tally.conflicts.fetch_add(1, Ordering::Relaxed);
            }
            503 => {
                self.tally.transient.fetch_add(1, Ordering::Relaxed);
            }
            _ => {}
        }
        Some(status)
    }

    /// Sends until a final answer, as a well-behaved client does: the same
    /// key after a lost answer, a 503 or a 409. The first attempt may be
    /// dropped on purpose.
    async fn pay(&self, key: &str, body: &Value, drop_first: bool) -> Option<u16> {
        for attempt in 0..MAX_ATTEMPTS {
            let timeout = (attempt == 0 && drop_first).then_some(DROP_AFTER);
            match self.send(key, body, timeout).await {
                Some(status @ (201 | 402 | 400 | 422)) => return Some(status),
                _ => tokio::time::sleep(Duration::from_millis(50)).await,
            }
        }
        None
    }

    async fn count(&self, path: &str) -> Result<usize, String> {
        let url = format!("{}{path}", self.url);
        let body: Value = self
            .http
            .get(&url)
            .send()
            .await
            .map_err(|e| format!("GET {url}: {e}"))?
            .json()
            .await
            .map_err(|e| format!("GET {url}: {e}"))?;
        body["count"]
            .as_u64()
            .map(|n| n as usize)
            .ok_or_else(|| format!("GET {url}: no count in {body}"))
    }
}

fn payment(amount: i64, card: &str) -> Value {
    json!({ "amount": amount, "currency": "EUR", "card": card, "description": "demo" })
}

/// The numbers of a run.
#[derive(Debug, Default, PartialEq)]
pub struct Report {
    pub requests: usize,
    pub distinct_keys: usize,
    pub accepted_keys: usize,
    pub charges: usize,
    pub payments: usize,
    pub replays: usize,
    pub conflicts: usize,
    pub in_progress: usize,
    pub transient: usize,
    pub dropped: usize,
}

impl Report {
    /// Whether every accepted key was charged once and stored once.
    pub fn exactly_once(&self) -> bool {
        self.charges == self.accepted_keys && self.payments == self.accepted_keys
    }

    /// The process's exit status: 0 when exactly once held, 1 otherwise.
    pub fn exit_status(&self) -> u8 {
        u8::from(!self.exactly_once())
    }
}

impl fmt::Display for Report {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        let rows = [
            ("requests sent", self.requests),
            ("distinct keys", self.distinct_keys),
            ("accepted keys (201 or 402)", self.accepted_keys),
            ("gateway charges", self.charges),
            ("payments stored", self.payments),
            ("replays (Idempotent-Replayed)", self.replays),
            ("conflicts (422 key reused)", self.conflicts),
            ("in progress (409)", self.in_progress),
            ("transient failures (503)", self.transient),
            ("dropped responses", self.dropped),
        ];
        writeln!(f, "  {:<32}{:>6}", "", "count")?;
        for (name, value) in rows {
            writeln!(f, "  {name:<32}{value:>6}")?;
        }
        Ok(())
    }
}

/// Runs the demo against a service started from `config`; the answer is
/// the exit status.
pub async fn run(config: &Config) -> u8 {
    let server = match app::start(config).await {
        Ok(server) => server,
        Err(err) => {
            eprintln!("payments demo: {err}");
            return 1;
        }
    };
    println!(
        "payments demo on {} ({}; {}; gateway latency {} ms, failure rate {})\n",
        server.url(),
        server.app.db.description,
        if config.http_layer {
            "idempotency layer on"
        } else {
            "no idempotency layer"
        },
        config.gateway_latency.as_millis(),
        config.gateway_failure_rate,
    );
    let client = Arc::new(Client {
        http: reqwest::Client::new(),
        url: server.url(),
        tally: Tally::default(),
    });
    let report = match scenario(&client).await {
        Ok(report) => report,
        Err(err) => {
            eprintln!("payments demo: {err}");
            let _ = server.stop().await;
            return 1;
        }
    };
    let _ = server.stop().await;
    println!("\n{report}");
    if report.exactly_once() {
        println!(
            "OK: {} accepted keys, {} gateway charges, {} payments: each key charged exactly once.",
            report.accepted_keys, report.charges, report.payments
        );
    } else {
        println!(
            "FAILED: {} accepted keys, but {} gateway charges and {} payments.",
            report.accepted_keys, report.charges, report.payments
        );
    }
    report.exit_status()
}

async fn scenario(client: &Arc<Client>) -> Result<Report, String> {
    let charges_before = client.count("/gateway/charges").await?;
    let payments_before = client.count("/payments").await?;
    let run = new_id("demo");
    let step = |name: &str| println!("  - {name}");

    step("10 payments, each sent once (retried only after a 503)");
    for i in 0..10 {
        client
            .pay(
                &format!("{run}-plain-{i}"),
                &payment(1000 + i, "4242424242424242"),
                false,
            )
            .await;
    }

    step("5 payments whose first answer is lost (client timeout), then retried");
    for i in 0..5 {
        client
            .pay(
                &format!("{run}-dropped-{i}"),
                &payment(2000 + i, "5555555555554444"),
                true,
            )
            .await;
    }

    step("20 concurrent duplicates of one payment");
    let key = format!("{run}-storm");
    let body = payment(3000, "4242424242424242");
    let tasks: Vec<_> = (0..20)
        .map(|_| {
            let (client, key, body) = (client.clone(), key.clone(), body.clone());
            tokio::spawn(async move { client.pay(&key, &body, false).await })
        })
        .collect();
    for task in tasks {
        task.await.map_err(|e| e.to_string())?;
    }

    step("a key reused with another amount (refused)");
    let key = format!("{run}-plain-0");
    client
        .pay(&key, &payment(9999, "4242424242424242"), false)
        .await;

    step("a declined card, and its retry (the decline is replayed)");
    let key = format!("{run}-declined");
    for _ in 0..2 {
        client
            .pay(&key, &payment(4000, "4000000000000002"), false)
            .await;
    }

    // The lost answers' requests may still be finishing.
    tokio::time::sleep(Duration::from_millis(200)).await;
    let charges = client.count("/gateway/charges").await? - charges_before;
    let payments = client.count("/payments").await? - payments_before;
    let tally = &client.tally;
    let distinct_keys = tally.keys.lock().unwrap().len();
    let accepted_keys = tally.accepted.lock().unwrap().len();
    Ok(Report {
        requests: tally.requests.load(Ordering::Relaxed),
        distinct_keys,
        accepted_keys,
        charges,
        payments,
        replays: tally.replays.load(Ordering::Relaxed),
        conflicts: tally.conflicts.load(Ordering::Relaxed),
        in_progress: tally.in_progress.load(Ordering::Relaxed),
        transient: tally.transient.load(Ordering::Relaxed),
        dropped: tally.dropped.load(Ordering::Relaxed),
    })
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_exit_status_says_whether_each_key_was_charged_once() {
        let good = Report {
            accepted_keys: 3,
            charges: 3,
            payments: 3,
            ..Report::default()
        };
        assert_eq!(good.exit_status(), 0);
        let double_charge = Report { charges: 4, ..good };
        assert_eq!(double_charge.exit_status(), 1);
        let lost_row = Report {
            accepted_keys: 3,
            charges: 3,
            payments: 2,
            ..Report::default()
        };
        assert_eq!(lost_row.exit_status(), 1);
    }
}
