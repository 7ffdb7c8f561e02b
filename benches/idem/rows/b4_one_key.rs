//! B4: concurrent calls on one key: the body runs once, and the waiters
//! return soon after the winner.

use std::sync::atomic::{AtomicBool, AtomicUsize, Ordering};
use std::sync::Arc;
use std::time::Duration;

use idem::{idempotent, Store};
use tokio::sync::Barrier;

use crate::harness::calls::{Calls, PayError};
use crate::harness::goal::Goal;
use crate::harness::measure::percentile;
use crate::harness::{rounds, unique, unix_micros};
use crate::report::{Report, Row};

/// B4: 64 calls on one key released at once.
pub async fn b4<B: Calls>(b: &Arc<B>, report: &mut Report) {
    const CALLS: usize = 64;
    let mut found = OneKey::default();
    for _ in 0..rounds() {
        found.add(&calls_on_one_key(b, &unique("b4"), CALLS, None).await);
    }
    found.report(
        ("B4", b.label()),
        format!("{CALLS} concurrent calls on one key"),
        Goal::AtMost(3.0),
        report,
    );
}

/// What rounds of calls on one key found.
#[derive(Default)]
pub struct OneKey {
    /// The most body runs in a round.
    max_runs: usize,
    /// Each waiter's return after the winner's, in ms.
    lags: Vec<f64>,
}

impl OneKey {
    /// One round: each call's answer (whether it ran the body) and the
    /// time it returned (µs of the wall clock).
    pub fn add(&mut self, returns: &[(bool, u64)]) {
        let runs = returns.iter().filter(|(won, _)| *won).count();
        self.max_runs = self.max_runs.max(runs);
        let winner = returns
            .iter()
            .find(|(won, _)| *won)
            .map(|(_, at)| *at)
            .expect("a winner");
        for (won, at) in returns {
            if !won {
                self.lags.push(at.saturating_sub(winner) as f64 / 1e3);
            }
        }
    }

    /// The rows: body runs, and the waiters' p99 against `goal`.
    pub fn report(
        mut self,
        id: (&'static str, &'static str),
        what: String,
        goal: Goal,
        report: &mut Report,
    ) {
        let p50 = percentile(&mut self.lags, 0.5);
        let p99 = percentile(&mut self.lags, 0.99);
        report.rows.push(Row::judged(
            id,
            format!("{what}: body runs per key (max over {} rounds)", rounds()),
            format!("{}", self.max_runs),
            (Goal::Exactly(1.0), ""),
            (self.max_runs as f64, None),
        ));
        report.rows.push(Row::judged(
            id,
            format!(
                "winner's return to each waiter's return: p50 {p50:.2} ms, p99 (n = {})",
                self.lags.len()
            ),
            format!("{p99:.2} ms"),
            (goal, " ms"),
            (p99, None),
        ));
    }
}

/// `calls` calls on `key` released together (at `at`, µs of the wall
/// clock, if given): whether each ran the body, and when it returned.
pub async fn calls_on_one_key<B: Calls>(
    b: &Arc<B>,
    key: &str,
    calls: usize,
    at: Option<u64>,
) -> Vec<(bool, u64)> {
    if let Some(at) = at {
        tokio::time::sleep(Duration::from_micros(at.saturating_sub(unix_micros()))).await;
    }
    let runs = Arc::new(AtomicUsize::new(0));
    let barrier = Arc::new(Barrier::new(calls));
    let store = b.store();
    let tasks: Vec<_> = (0..calls)
        .map(|_| {
            let (store, key, runs, barrier) =
                (store.clone(), key.to_owned(), runs.clone(), barrier.clone());
            tokio::spawn(async move {
                barrier.wait().await;
                let won = duplicate(&*store, &key, &runs).await;
                (won, unix_micros())
            })
        })
        .collect();
    let mut returns = Vec::new();
    for t in tasks {
        returns.push(t.await.unwrap());
    }
    returns
}

/// B4's body: counts its run, and takes 50 ms.
#[idempotent(key = key, store = store, scope = "bench.dup", fingerprint = amount,
             lease = "60s", wait = "30s")]
pub async fn dup(
    store: &dyn Store,
    key: &str,
    amount: i64,
    ran: &AtomicBool,
    runs: &AtomicUsize,
) -> Result<i64, PayError> {
    ran.store(true, Ordering::SeqCst);
    runs.fetch_add(1, Ordering::SeqCst);
    tokio::time::sleep(Duration::from_millis(50)).await;
    Ok(amount)
}

/// One call of B4 on `store`; answers whether it ran the body.
pub async fn duplicate(store: &dyn Store, key: &str, runs: &AtomicUsize) -> bool {
    let ran = AtomicBool::new(false);
    dup(store, key, 1, &ran, runs).await.unwrap();
    ran.load(Ordering::SeqCst)
}
