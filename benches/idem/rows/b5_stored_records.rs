//! B5: replays among many stored records, and the purge of expired ones.

use std::sync::atomic::{AtomicBool, AtomicUsize, Ordering};
use std::sync::Arc;
use std::time::{Duration, Instant};

use idem::Fingerprint;

use crate::harness::calls::{Bench, Mode};
use crate::harness::goal::Goal;
use crate::harness::measure::{interleave, median};
use crate::harness::{quick, CONCURRENCY};
use crate::report::{Report, Row};

/// B5: replay latency with 10 thousand vs 1 million stored records, and
/// the purge rate while claims run.
pub async fn b5<B: Bench>(b: &Arc<B>, report: &mut Report) {
    let (small, large) = if quick() {
        (10_000, 100_000)
    } else {
        (10_000, 1_000_000)
    };
    let fp = Fingerprint::of(&500i64).unwrap();
    let t = Instant::now();
    let small_b = Arc::new(b.fresh("b5s").await);
    small_b.fill("bench.pay", &fp, small, i64::MAX / 2).await;
    let large_b = Arc::new(b.fresh("b5l").await);
    large_b.fill("bench.pay", &fp, large, i64::MAX / 2).await;
    let load = t.elapsed().as_secs_f64();
    let n = if quick() { 50 } else { 200 };
    let replay = |bb: Arc<B>, count: usize| async move {
        let mut lat = Vec::new();
        for i in 0..n {
            let k = format!("k{}", 1 + (i * 7919 + 13) % count);
            let t = Instant::now();
            bb.call_key(Mode::Record, &k).await;
            lat.push(t.elapsed().as_secs_f64() * 1e3);
        }
        median(lat)
    };
    let (ratio, a, s) = interleave(
        || replay(small_b.clone(), small),
        || replay(large_b.clone(), large),
    )
    .await;
    report.rows.push(Row::judged(
        ("B5", b.label()),
        format!(
            "replay latency with {large} vs {small} stored records ({s:.2} vs {a:.2} ms; bulk-loaded in {load:.0} s by one INSERT ... SELECT)"
        ),
        format!("{ratio:.2}"),
        (Goal::AtMost(1.5), ""),
        (ratio, None),
    ));

    // Purge: expired records, while 4 tasks claim new keys.
    let expired = if quick() { 20_000 } else { 200_000 };
    let purge_b = Arc::new(b.fresh("b5p").await);
    purge_b.fill("bench.old", &fp, expired, 1).await;
    let stop = Arc::new(AtomicBool::new(false));
    let claims = Arc::new(AtomicUsize::new(0));
    let claimers: Vec<_> = (0..CONCURRENCY)
        .map(|_| {
            let (pb, stop, claims) = (purge_b.clone(), stop.clone(), claims.clone());
            tokio::spawn(async move {
                while !stop.load(Ordering::Relaxed) {
                    pb.call(Mode::Record, Duration::ZERO).await;
                    claims.fetch_add(1, Ordering::Relaxed);
                }
            })
        })
        .collect();
    let store = purge_b.store();
    let t = Instant::now();
    let purged = store.purge_expired(1_000).await.unwrap();
    let secs = t.elapsed().as_secs_f64();
    stop.store(true, Ordering::Relaxed);
    for c in claimers {
        c.await.unwrap();
    }
    let rate = purged as f64 / secs;
    report.rows.push(Row::judged(
        ("B5", b.label()),
        format!(
            "purge of {purged} expired records in batches of 1000 while {CONCURRENCY} tasks claim ({:.0} claims/s meanwhile)",
            claims.load(Ordering::Relaxed) as f64 / secs
        ),
        format!("{rate:.0} records/s"),
        (Goal::None, ""),
        (rate, None),
    ));
    for bb in [small_b, large_b, purge_b] {
        bb.drop_tables().await;
    }
}
