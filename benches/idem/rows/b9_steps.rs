//! B9: durable steps.

use std::sync::Arc;
use std::time::{Duration, Instant};

use idem::Store;

use crate::harness::calls::Bench;
use crate::harness::goal::Goal;
use crate::harness::measure::{interleave, median, throughput_of, Span};
use crate::harness::{quick, rounds, take, unique, window, CONCURRENCY};
use crate::report::{Report, Row};

/// B9: durable steps. The throughput of a record-mode operation making
/// three downstream calls of 5 ms as steps, against the same three calls
/// without steps; and the replay of a completed 3-step operation against
/// its first execution.
pub async fn b9<B: Bench>(b: &Arc<B>, report: &mut Report) {
    let call = Duration::from_millis(5);
    let store = b.store();
    let of = |steps: bool| {
        let store = store.clone();
        move || {
            throughput_of(CONCURRENCY, Span::For(window()), {
                let store = store.clone();
                move || three_calls(store.clone(), steps, call, None)
            })
        }
    };
    let (ratio, plain, steps) = interleave(of(false), of(true)).await;
    report.rows.push(Row::judged(
        ("B9", b.label()),
        format!(
            "durable steps: 3 steps of 5 ms vs the same 3 calls without steps, record mode \
             (throughput {steps:.0} vs {plain:.0} calls/s, {CONCURRENCY} tasks)"
        ),
        format!("{ratio:.2}"),
        (Goal::AtLeast(0.9), ""),
        (ratio, None),
    ));
    let n = if quick() { 10 } else { 40 };
    let (mut firsts, mut replays) = (Vec::new(), Vec::new());
    for _ in 0..rounds() {
        let keys: Vec<String> = (0..n).map(|_| unique("b9r")).collect();
        for times in [&mut firsts, &mut replays] {
            for k in &keys {
                let t = Instant::now();
                three_calls(store.clone(), true, call, Some(k)).await;
                times.push(t.elapsed().as_secs_f64() * 1e3);
            }
        }
    }
    let (first, replay) = (median(firsts), median(replays));
    report.rows.push(Row::judged(
        ("B9", b.label()),
        format!(
            "durable steps: replay of a completed 3-step operation vs its first execution \
             ({replay:.2} ms vs {first:.2} ms, median, one caller)"
        ),
        format!("{:.3}", replay / first),
        (Goal::None, ""),
        (replay / first, None),
    ));
}

/// One operation of B9: three downstream calls of `call` each, as durable
/// steps or plainly, in record mode under a fresh key (or `key`).
pub async fn three_calls(store: Arc<dyn Store>, steps: bool, call: Duration, key: Option<&str>) {
    let key = key.map_or_else(|| unique("b9"), str::to_owned);
    idem::run(&*store, idem::Call::new("bench.steps", &key, &1), async {
        let mut total = 0u64;
        for name in ["reserve", "charge", "receipt"] {
            let one = || async {
                take(call).await;
                Ok::<_, idem::Error>(1u64)
            };
            total += if steps {
                idem::steps::step(name, |_key| one()).await?
            } else {
                one().await?
            };
        }
        Ok::<_, idem::Error>(total)
    })
    .await
    .unwrap();
}
