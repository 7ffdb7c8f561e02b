//! `MemoryStore`'s time does not follow steps of the wall clock.
//!
//! The store is in the process, so its clock is the process's: read from
//! the wall clock, a correction that steps it forward past a lease (NTP,
//! an operator's `date`) would let a duplicate take over a body still
//! running, and run it twice. The test runs its calls in a child process
//! whose wall clock libfaketime runs 3,600 times fast (an hour a second)
//! while its monotonic clock, tokio's timers' and the store's, keeps real
//! time.

use std::sync::atomic::{AtomicUsize, Ordering};
use std::sync::Arc;
use std::time::{Duration, Instant, SystemTime};

use idem::{run, Call, Error, MemoryStore, Policy, Store};

/// Where libfaketime lives on Debian (package `faketime`, which `.ci/run`
/// installs).
const LIBFAKETIME: &str = "/usr/lib/x86_64-linux-gnu/faketime/libfaketime.so.1";

/// Set in the child process.
const CHILD: &str = "IDEM_MEMORY_CLOCK_CHILD";

/// What the child prints once its calls answered as they should.
const DONE: &str = "IDEM-MEMORY-CLOCK-DONE";

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_wall_clock_racing_ahead_neither_takes_over_nor_expires() {
    if std::env::var(CHILD).is_ok() {
        return calls_under_a_racing_wall_clock().await;
    }
    assert!(
        std::path::Path::new(LIBFAKETIME).exists(),
        "{LIBFAKETIME} is missing: install Debian's `faketime` package (.ci/run does)"
    );
    let test = crate::common::test_name(concat!(
        module_path!(),
        "::a_wall_clock_racing_ahead_neither_takes_over_nor_expires"
    ));
    let out = tokio::process::Command::new(std::env::current_exe().expect("the test binary"))
        .args([test, "--exact", "--nocapture", "--test-threads", "1"])
        .env(CHILD, "1")
        .env("LD_PRELOAD", LIBFAKETIME)
        .env("FAKETIME", "+0 x3600")
        // Both spellings: libfaketime's releases read one or the other.
        .env("FAKETIME_DONT_FAKE_MONOTONIC", "1")
        .env("DONT_FAKE_MONOTONIC", "1")
        .output()
        .await
        .expect("run the child process");
    let stdout = String::from_utf8_lossy(&out.stdout);
    assert!(
        out.status.success() && stdout.contains(DONE),
        "the child failed: {}\n{stdout}\n{}",
        out.status,
        String::from_utf8_lossy(&out.stderr)
    );
}

/// In the child: a body runs for 300 ms (five minutes of the wall clock)
/// under a lease of 30 s while a duplicate arrives 100 ms in; then, a
/// second and a bit later (over an hour of the wall clock), a record kept
/// for an hour is still there.
async fn calls_under_a_racing_wall_clock() {
    // libfaketime is in effect, and only on the wall clock.
    let (wall, mono) = (SystemTime::now(), Instant::now());
    tokio::time::sleep(Duration::from_millis(50)).await;
    let wall_passed = wall.elapsed().unwrap_or_default();
    assert!(
        wall_passed > Duration::from_secs(60) && mono.elapsed() < Duration::from_secs(5),
        "the wall clock is not running fast ({wall_passed:?} in {:?})",
        mono.elapsed()
    );

    let store = MemoryStore::new();
    let runs = Arc::new(AtomicUsize::new(0));
    let policy = Policy::new()
        .lease(Duration::from_secs(30))
        .ttl(Duration::from_secs(3600));
    let call = |runs: Arc<AtomicUsize>, store: MemoryStore| async move {
        run::<_, u64, Error, _, _>(
            &store,
            Call::new("memory.clock", "k", &7u64).with_policy(policy),
            async move {
                runs.fetch_add(1, Ordering::SeqCst);
                tokio::time::sleep(Duration::from_millis(300)).await;
                Ok(42)
            },
        )
        .await
    };
    let owner = tokio::spawn(call(runs.clone(), store.clone()));
    tokio::time::sleep(Duration::from_millis(100)).await;
    assert_eq!(runs.load(Ordering::SeqCst), 1, "the owner's body started");
    // Six minutes of the wall clock into a lease of 30 s: a duplicate
    // waits for the owner, and replays its outcome.
    let duplicate = call(runs.clone(), store.clone()).await;
    assert_eq!(duplicate.unwrap(), 42);
    assert_eq!(owner.await.unwrap().unwrap(), 42);
    assert_eq!(
        runs.load(Ordering::SeqCst),
        1,
        "the duplicate ran the body again"
    );

    // Over an hour of the wall clock later, the record kept for an hour
    // (1.2 s of real time) is neither purged nor run again.
    tokio::time::sleep(Duration::from_millis(1200)).await;
    assert_eq!(
        store.purge_expired(100).await.unwrap(),
        0,
        "a live record was purged"
    );
    assert_eq!(call(runs.clone(), store.clone()).await.unwrap(), 42);
    assert_eq!(runs.load(Ordering::SeqCst), 1, "a retry ran the body again");
    println!("{DONE}");
}
