//! B2: the latency of a replay against its first execution.

use std::sync::Arc;
use std::time::{Duration, Instant};

use crate::harness::calls::{Calls, Mode};
use crate::harness::goal::Goal;
use crate::harness::measure::{interleave_all, measure, median};
use crate::harness::reference::{reference_note, Script};
use crate::harness::{keys_per_round, quick, window};
use crate::report::{Report, Row};

/// B2: replay latency vs first execution (record mode, one caller).
pub async fn b2<B: Calls>(b: &Arc<B>, report: &mut Report) {
    let (ratio, firsts, replays) = replay_vs_first(b, Mode::Record).await;
    // The reference's replay, one read, against its first execution, one
    // client each: the ratio of their latencies.
    let reference = match b.reference_status() {
        None => None,
        Some(Err(why)) => Some(Err(why)),
        Some(Ok(())) => {
            let found = interleave_all(&[
                measure(|| b.reference(Script::Replay, 1, window())),
                measure(|| b.reference(Script::Record(Duration::ZERO), 1, window())),
            ])
            .await;
            Some(Ok(found[1].0))
        }
    };
    report.rows.push(Row::judged(
        ("B2", b.label()),
        format!(
            "replay latency vs first execution, record mode ({replays:.2} ms vs {firsts:.2} ms, median)"
        ),
        format!("{ratio:.2}{}", reference_note(reference)),
        (b.goals().replay, ""),
        (ratio, None),
    ));
    let (ratio, firsts, replays) = replay_vs_first(b, Mode::Cached).await;
    report.rows.push(Row::judged(
        ("B2", b.label()),
        format!(
            "replay latency vs first execution, record mode with the local replay cache \
             (`CachedStore`; {:.3} ms vs {:.2} ms, median)",
            replays, firsts
        ),
        format!("{ratio:.3}"),
        (CACHED_REPLAY_GOAL, ""),
        (ratio, None),
    ));
}

/// B2's goal with the local replay cache.
pub const CACHED_REPLAY_GOAL: Goal = Goal::AtMost(0.02);

/// Median latencies of first executions and of their replays in `mode`,
/// one caller, and the median of the per-round ratios.
pub async fn replay_vs_first<B: Calls>(b: &Arc<B>, mode: Mode) -> (f64, f64, f64) {
    let n = if quick() { 20 } else { 100 };
    let mut ratios = Vec::new();
    let (mut firsts, mut replays) = (Vec::new(), Vec::new());
    for keys in keys_per_round("b2", n) {
        let mut first = Vec::new();
        for k in &keys {
            let t = Instant::now();
            b.call_key(mode, k).await;
            first.push(t.elapsed().as_secs_f64() * 1e3);
        }
        let mut replay = Vec::new();
        for k in &keys {
            let t = Instant::now();
            b.call_key(mode, k).await;
            replay.push(t.elapsed().as_secs_f64() * 1e3);
        }
        let (f, r) = (median(first), median(replay));
        ratios.push(r / f);
        firsts.push(f);
        replays.push(r);
    }
    (median(ratios), median(firsts), median(replays))
}
