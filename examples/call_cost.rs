//! The engine's own cost per call (benchmark B6's loop) over `MemoryStore`,
//! with the allocations it makes, in a form that `valgrind --tool=callgrind`
//! can count:
//!
//! ```text
//! cargo build --release --example call_cost --no-default-features
//! target/release/examples/call_cost 200000 6   # ns and allocations per call
//! valgrind --tool=callgrind --collect-atstart=no \
//!     --toggle-collect=call_cost::replays target/release/examples/call_cost 20000
//! ```
//!
//! The arguments are the number of keys of a round (200 000 by default)
//! and the number of rounds (1), each on a store of its own, as B6 makes
//! them: each key is run once (a first execution), then again (a replay);
//! and how many times the replays are made (1: more to profile them).

use std::alloc::{GlobalAlloc, Layout, System};
use std::sync::atomic::{AtomicUsize, Ordering};
use std::time::Instant;

/// The system allocator, counting allocations (and reallocations).
struct Counting;

static ALLOCATIONS: AtomicUsize = AtomicUsize::new(0);

unsafe impl GlobalAlloc for Counting {
    unsafe fn alloc(&self, layout: Layout) -> *mut u8 {
        ALLOCATIONS.fetch_add(1, Ordering::Relaxed);
        System.alloc(layout)
    }
    unsafe fn dealloc(&self, ptr: *mut u8, layout: Layout) {
        System.dealloc(ptr, layout)
    }
    unsafe fn realloc(&self, ptr: *mut u8, layout: Layout, new_size: usize) -> *mut u8 {
        ALLOCATIONS.fetch_add(1, Ordering::Relaxed);
        System.realloc(ptr, layout, new_size)
    }
}

#[global_allocator]
static GLOBAL: Counting = Counting;

#[inline(never)]
async fn plain(amount: i64) -> Result<i64, idem::Error> {
    Ok(std::hint::black_box(amount))
}

/// One call per key, as B6 makes it.
#[inline(never)]
async fn calls(store: &idem::MemoryStore, keys: &[String]) {
    for k in keys {
        let r: Result<i64, idem::Error> = idem::run(
            store,
            idem::Call::new("bench.mem", k.as_str(), &500i64),
            plain(500),
        )
        .await;
        std::hint::black_box(r.unwrap());
    }
}

/// The first executions, in a function of their own for callgrind's
/// `--toggle-collect`.
#[inline(never)]
fn firsts(runtime: &tokio::runtime::Runtime, store: &idem::MemoryStore, keys: &[String]) {
    runtime.block_on(calls(store, keys))
}

/// The replays, likewise.
#[inline(never)]
fn replays(runtime: &tokio::runtime::Runtime, store: &idem::MemoryStore, keys: &[String]) {
    runtime.block_on(calls(store, keys))
}

/// This thread's CPU time so far, in clock ticks (1/100 s on Linux), or
/// `None` where `/proc` does not tell it: on a busy machine, wall time
/// counts the time other processes had the CPU.
fn cpu_ticks() -> Option<u64> {
    let stat = std::fs::read_to_string("/proc/thread-self/stat").ok()?;
    // Fields 14 and 15 (user and system time), after the command in
    // parentheses.
    let mut fields = stat.rsplit_once(')')?.1.split_whitespace().skip(11);
    Some(fields.next()?.parse::<u64>().ok()? + fields.next()?.parse::<u64>().ok()?)
}

/// Where a phase started.
struct Mark {
    allocations: usize,
    wall: Instant,
    cpu: Option<u64>,
}

impl Mark {
    fn now() -> Self {
        Mark {
            allocations: ALLOCATIONS.load(Ordering::Relaxed),
            wall: Instant::now(),
            cpu: cpu_ticks(),
        }
    }
}

/// What the phases of every round added up to.
#[derive(Default)]
struct Total {
    calls: usize,
    allocations: usize,
    wall: f64,
    cpu: Option<f64>,
}

impl Total {
    fn add(&mut self, mark: Mark, calls: usize) {
        self.calls += calls;
        self.allocations += ALLOCATIONS.load(Ordering::Relaxed) - mark.allocations;
        self.wall += mark.wall.elapsed().as_secs_f64();
        self.cpu = match (mark.cpu, cpu_ticks()) {
            (Some(before), Some(after)) => {
                Some(self.cpu.unwrap_or(0.0) + (after - before) as f64 / 100.0)
            }
            _ => None,
        };
    }

    fn report(&self, what: &str) {
        let per_call = |secs: f64| secs * 1e9 / self.calls as f64;
        let cpu = self
            .cpu
            .map(|cpu| format!(", {:.0} ns of CPU time", per_call(cpu)))
            .unwrap_or_default();
        println!(
            "{what}: {:.0} ns{cpu}, {:.2} allocations per call",
            per_call(self.wall),
            self.allocations as f64 / self.calls as f64
        );
    }
}

fn main() {
    let mut args = std::env::args().skip(1);
    let mut arg = |default: usize| {
        args.next()
            .map(|n| n.parse().expect("a number"))
            .unwrap_or(default)
    };
    // B6: 200 000 keys a round, a store a round.
    let (n, rounds, passes) = (arg(200_000), arg(1), arg(1));
    let runtime = tokio::runtime::Builder::new_current_thread()
        .enable_all()
        .build()
        .unwrap();
    let (mut first, mut replay) = (Total::default(), Total::default());
    for round in 0..rounds {
        let keys: Vec<String> = (0..n).map(|i| format!("m{i}-{round}-call-cost")).collect();
        let store = idem::MemoryStore::new();
        let mark = Mark::now();
        firsts(&runtime, &store, &keys);
        first.add(mark, n);
        let mark = Mark::now();
        for _ in 0..passes {
            replays(&runtime, &store, &keys);
        }
        replay.add(mark, n * passes);
    }
    first.report("first execution");
    replay.report("replay");
}
