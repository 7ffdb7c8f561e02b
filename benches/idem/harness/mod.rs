//! The harness: what every row shares. The run's knobs (`IDEM_BENCH_QUICK`,
//! `IDEM_BENCH_CASES`, `IDEM_BENCH_ONLY`, the wait for a quiet machine),
//! keys of their own, the measuring and the side-by-side ratios
//! ([`measure`], [`compared`]), the goals ([`goal`]), and the backends:
//! the calls the rows make ([`calls`]), on SQL ([`sql`], with the
//! reference's statements in [`reference`]) and on Redis ([`redis`]).

pub mod calls;
pub mod compared;
pub mod dialect;
pub mod goal;
pub mod measure;
pub mod redis;
pub mod reference;
pub mod sql;

use std::sync::atomic::{AtomicUsize, Ordering};
use std::time::{Duration, Instant, SystemTime, UNIX_EPOCH};

/// The tasks of a throughput measurement.
pub const CONCURRENCY: usize = 4;

/// `IDEM_BENCH_QUICK=1`: every measurement shortened, for trying the
/// harness, not for figures.
pub fn quick() -> bool {
    std::env::var("IDEM_BENCH_QUICK").is_ok_and(|v| v == "1")
}

/// Rounds of each interleaved comparison.
pub fn rounds() -> usize {
    if quick() {
        2
    } else {
        6
    }
}

/// How long one throughput measurement of B1 (and a reference loop) runs.
/// pgbench counts in whole seconds: it runs for this rounded up.
pub fn window() -> Duration {
    Duration::from_millis(if quick() { 100 } else { 250 })
}

/// A key or name no other call of this run, nor of another run, uses.
pub fn unique(tag: &str) -> String {
    static N: AtomicUsize = AtomicUsize::new(0);
    format!(
        "{tag}-{}-{}-{}",
        std::process::id(),
        unix_micros() / 1000,
        N.fetch_add(1, Ordering::Relaxed)
    )
}

/// The wall clock, shared by the processes of B4'.
pub fn unix_micros() -> u64 {
    SystemTime::now()
        .duration_since(UNIX_EPOCH)
        .unwrap()
        .as_micros() as u64
}

/// A body that takes `time` (nothing when it is zero), as a call to
/// another service does: it ends when its time is up. A tokio sleep would
/// not: the runtime's timer rounds every deadline up to its next
/// millisecond tick, so a fraction of a millisecond of idem's work before
/// it would show as a whole millisecond or none, by where the tick falls.
/// A thread's sleep ends within the kernel's timer slack, as pgbench's
/// `\sleep`, the reference's, does.
pub async fn take(time: Duration) {
    if !time.is_zero() {
        tokio::task::spawn_blocking(move || std::thread::sleep(time))
            .await
            .unwrap();
    }
}

/// `n` keys of their own for each round.
pub fn keys_per_round(tag: &str, n: usize) -> Vec<Vec<String>> {
    (0..rounds())
        .map(|_| (0..n).map(|_| unique(tag)).collect())
        .collect()
}

/// Whether `IDEM_BENCH_CASES` (comma-separated, e.g. `B4,B4'`) asks for
/// the measurement `id`; all of them when it is unset.
pub fn case(id: &str) -> bool {
    let cases = std::env::var("IDEM_BENCH_CASES").unwrap_or_default();
    cases.trim().is_empty() || cases.split(',').any(|c| c.trim().eq_ignore_ascii_case(id))
}

/// Whether this run measures less than the whole table.
pub fn narrowed() -> bool {
    ["IDEM_BENCH_ONLY", "IDEM_BENCH_CASES"]
        .iter()
        .any(|v| std::env::var(v).is_ok_and(|v| !v.trim().is_empty()))
}

/// The one-minute load average at or below which a whole run starts.
pub const QUIET_LOAD: f64 = 1.5;
/// How long a whole run waits for it.
pub const QUIET_WAIT: Duration = Duration::from_secs(300);

/// The one-minute load average, where `/proc` tells it.
pub fn load_now() -> Option<f64> {
    std::fs::read_to_string("/proc/loadavg")
        .ok()?
        .split_whitespace()
        .next()?
        .parse()
        .ok()
}

/// Waits, up to [`QUIET_WAIT`], for the one-minute load average to fall
/// to [`QUIET_LOAD`] or below, so that a whole run does not start on the
/// tail of other work (a build, the previous run's servers catching up);
/// answers whether it did (or the load cannot be read).
pub async fn wait_for_quiet() -> bool {
    let until = Instant::now() + QUIET_WAIT;
    loop {
        match load_now() {
            Some(load) if load > QUIET_LOAD => {
                if Instant::now() >= until {
                    eprintln!(
                        "the load average is still {load:.2} after {} s: measuring anyway",
                        QUIET_WAIT.as_secs()
                    );
                    return false;
                }
                eprintln!("load average {load:.2}, above {QUIET_LOAD}: waiting for it to fall");
                tokio::time::sleep(Duration::from_secs(10)).await;
            }
            _ => return true,
        }
    }
}
