//! B8: entity mode, distinct keys at once.

use std::sync::Arc;
use std::time::{Duration, Instant};

use tokio::sync::Barrier;

use crate::harness::calls::Bench;
use crate::harness::goal::Goal;
use crate::harness::measure::percentile;
use crate::harness::{rounds, unique};
use crate::report::{Report, Row};

/// B8: entity mode, 20 distinct keys at once, each body taking 200 ms:
/// the wall time of the 20 against one body. Unrelated tokens must not
/// wait for each other.
pub async fn b8<B: Bench>(b: &Arc<B>, report: &mut Report) {
    const CALLS: usize = 20;
    let body = Duration::from_millis(200);
    // The first call migrates the claims' table.
    b.entity_setup().await;
    b.entity_call(&unique("b8"), Duration::ZERO).await;
    let mut walls = Vec::new();
    for _ in 0..rounds() {
        let barrier = Arc::new(Barrier::new(CALLS));
        let started = Instant::now();
        let tasks: Vec<_> = (0..CALLS)
            .map(|_| {
                let (b, barrier) = (b.clone(), barrier.clone());
                tokio::spawn(async move {
                    barrier.wait().await;
                    b.entity_call(&unique("b8"), body).await;
                })
            })
            .collect();
        for t in tasks {
            t.await.unwrap();
        }
        walls.push(started.elapsed().as_secs_f64() / body.as_secs_f64());
    }
    let ratio = percentile(&mut walls, 0.5);
    report.rows.push(Row::judged(
        ("B8", b.label()),
        format!(
            "entity mode, {CALLS} distinct keys at once, 200 ms body: wall time in bodies (median of {} rounds)",
            rounds()
        ),
        format!("{ratio:.2}"),
        (Goal::AtMost(1.5), ""),
        (ratio, None),
    ));
}
