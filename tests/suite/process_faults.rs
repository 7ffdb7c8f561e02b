//! Owners in other processes that crash, stop or run a skewed clock, on
//! SQLite (a file), PostgreSQL, MariaDB/MySQL, Redis and Redis Cluster.
//!
//! - Killed: a process holding a claim is killed with SIGKILL, so nothing
//!   of it runs again: no release, no completion, no drop. The lease and the
//!   fence must handle it: after the lease, a retry takes over with fence 2
//!   and completes once, and a completion (or release) presented with the
//!   killed owner's fence 1 is rejected with `LeaseLost` and changes nothing.
//! - Stopped: a process stopped (SIGSTOP) while its body runs is taken over
//!   after the lease, and once continued its renewal and completion are
//!   refused.
//! - Skewed clock: a process whose clock runs two hours ahead neither takes
//!   over a live lease nor purges a live record (time is the database's).
//!
//! The other process is this test binary, started again in a child mode:
//! it claims the key through the engine, starts the body, prints a marker
//! line and waits inside the body. Every test is bounded in time.

use crate::common;

use std::process::Stdio;
use std::sync::atomic::{AtomicUsize, Ordering};
use std::sync::Arc;
use std::time::{Duration, SystemTime, UNIX_EPOCH};

use idem::record::{Claim, Outcome, OutcomeKind, State};
use idem::{run, Call, Error, Policy, Scope, Store};
use tokio::io::{AsyncBufReadExt, BufReader};

/// Set in the child: `<mode> <location> <key>`, where the location is the
/// SQLite file or the table on the server.
const CHILD_VAR: &str = "IDEM_PROCESS_FAULTS_CHILD";
const SCOPE: &str = "process_faults";
/// Long enough for the parent to see the dead owner's claim still held;
/// short enough to keep the test quick.
const LEASE: Duration = Duration::from_millis(1_500);
const TTL: Duration = Duration::from_secs(3_600);
const PAYLOAD: &str = "charge 500 EUR";

/// This process's clock in the stores' unit (milliseconds since the epoch).
fn now_millis() -> i64 {
    SystemTime::now()
        .duration_since(UNIX_EPOCH)
        .unwrap()
        .as_millis() as i64
}

fn policy() -> Policy {
    Policy::new().lease(LEASE).ttl(TTL).fail_fast()
}

/// The child, by the mode its spec starts with, on the store `open` opens
/// at the spec's location.
async fn child<F>(spec: &str, open: impl FnOnce(String) -> F)
where
    F: std::future::Future<Output = Arc<dyn Store>>,
{
    let [mode, location, key] = spec.split(' ').collect::<Vec<_>>()[..] else {
        panic!("{CHILD_VAR}={spec:?}: expected 3 fields")
    };
    let store = open(location.to_owned()).await;
    match mode {
        "zombie" => zombie(store, key).await,
        "skewed" => skewed(store, key).await,
        "owner" => owner(store, key).await,
        _ => panic!("{CHILD_VAR}={spec:?}: unknown mode"),
    }
}

fn say(line: &str) {
    use std::io::Write;
    println!("{line}");
    std::io::stdout().flush().unwrap();
}

/// The child that is stopped: claims, says so, and finishes its body two
/// leases later (after the parent stopped and continued it). It prints
/// what its caller got.
async fn zombie(store: Arc<dyn Store>, key: &str) {
    let result: Result<u64, Error> = run(
        &*store,
        Call::new(SCOPE, key, PAYLOAD).with_policy(policy()),
        async {
            say("IDEM-OWNER-CLAIMED");
            tokio::time::sleep(LEASE * 2).await;
            Ok(1)
        },
    )
    .await;
    say(&format!("IDEM-ZOMBIE-GOT {result:?}"));
}

/// The child whose clock runs two hours ahead: it tries the parent's key
/// and purges, and prints what it got.
async fn skewed(store: Arc<dyn Store>, key: &str) {
    let result: Result<u64, Error> = run(
        &*store,
        Call::new(SCOPE, key, PAYLOAD).with_policy(policy()),
        async { Ok(2) },
    )
    .await;
    say(&format!("IDEM-SKEWED-GOT {result:?}"));
    let purged = store.purge_expired(100).await.expect("purge");
    say(&format!("IDEM-SKEWED-PURGED {purged}"));
}

/// The child: claims, starts the body, says so, and hangs in the body.
async fn owner(store: Arc<dyn Store>, key: &str) {
    let result: Result<u64, Error> = run(
        &*store,
        Call::new(SCOPE, key, PAYLOAD).with_policy(policy()),
        async {
            println!("IDEM-OWNER-CLAIMED");
            use std::io::Write;
            std::io::stdout().flush().unwrap();
            std::future::pending::<()>().await;
            Ok(1)
        },
    )
    .await;
    panic!("the owner's body never ends, yet run returned {result:?}");
}

/// The parent's side of the test `test` on the store at `location`.
async fn killed_owner(test: &str, location: &str, store: Arc<dyn Store>) {
    let key = format!("crash-{}-{}", std::process::id(), now_millis());
    let exe = std::env::current_exe().expect("the test binary");
    let mut child = tokio::process::Command::new(exe)
        .args([test, "--exact", "--nocapture", "--test-threads", "1"])
        .env(CHILD_VAR, format!("owner {location} {key}"))
        .stdout(Stdio::piped())
        .stderr(Stdio::inherit())
        .kill_on_drop(true)
        .spawn()
        .expect("start the owner process");
    let mut lines = BufReader::new(child.stdout.take().unwrap()).lines();
    let claimed = tokio::time::timeout(Duration::from_secs(30), async {
        while let Some(line) = lines.next_line().await.expect("read the owner's output") {
            if line.ends_with("IDEM-OWNER-CLAIMED") {
                return true;
            }
        }
        false
    })
    .await
    .expect("the owner did not claim within 30 s");
    assert!(claimed, "the owner exited without claiming");

    // Killed in the middle of its body: SIGKILL, no cleanup of any kind.
    child.start_kill().expect("kill the owner");
    let status = child.wait().await.expect("reap the owner");
    {
        use std::os::unix::process::ExitStatusExt;
        assert_eq!(status.signal(), Some(9), "the owner died of SIGKILL");
    }

    let scope = Scope::new(SCOPE);
    let key = idem::Key::new(key).unwrap();
    let held = store.get(&scope, &key).await.unwrap().expect("the claim");
    assert_eq!((held.state, held.fence), (State::InProgress, 1));
    let lease_until = held.lease_until.expect("a lease");

    let runs = Arc::new(AtomicUsize::new(0));
    let retry = || {
        let runs = runs.clone();
        run::<_, u64, Error, _, _>(
            &*store,
            Call::new(SCOPE, &key, PAYLOAD).with_policy(policy()),
            async move {
                runs.fetch_add(1, Ordering::SeqCst);
                Ok(42)
            },
        )
    };

    // While the dead owner's lease runs, nobody may take over.
    if now_millis() + 200 < lease_until {
        let early = retry().await;
        assert!(
            matches!(early, Err(Error::InProgress { .. })),
            "a retry within the lease: {early:?}"
        );
    }
    let left = (lease_until - now_millis()).max(0) as u64 + 50;
    tokio::time::sleep(Duration::from_millis(left)).await;

    // After it, the retry takes over with fence 2 and completes once.
    assert_eq!(retry().await.unwrap(), 42);
    let done = store.get(&scope, &key).await.unwrap().unwrap();
    assert_eq!((done.state, done.fence), (State::Completed, 2));
    let outcome = done.outcome.clone().expect("the outcome");
    assert_eq!(outcome.body, b"42");

    // The killed owner's fence can neither complete nor release the key.
    let zombie = Claim {
        scope: scope.clone(),
        key: key.clone(),
        fence: 1,
        token: held.token.expect("the owner's claim token"),
        lease: LEASE,
        ttl: TTL,
    };
    let late = Outcome {
        kind: OutcomeKind::Ok,
        body: b"1".to_vec(),
    };
    assert!(matches!(
        store.complete(&zombie, &late).await,
        Err(Error::LeaseLost)
    ));
    assert!(matches!(
        store.release(&zombie).await,
        Err(Error::LeaseLost)
    ));
    assert!(matches!(store.renew(&zombie).await, Err(Error::LeaseLost)));
    assert_eq!(store.get(&scope, &key).await.unwrap().unwrap(), done);

    // Every later retry replays the one run.
    assert_eq!(retry().await.unwrap(), 42);
    assert_eq!(runs.load(Ordering::SeqCst), 1, "the body ran once");
}

/// Starts this test binary again as a child in `mode`, with `env` added.
fn spawn_child(
    test: &str,
    mode: &str,
    location: &str,
    key: &str,
    env: &[(&str, &str)],
) -> tokio::process::Child {
    let exe = std::env::current_exe().expect("the test binary");
    tokio::process::Command::new(exe)
        .args([test, "--exact", "--nocapture", "--test-threads", "1"])
        .env(CHILD_VAR, format!("{mode} {location} {key}"))
        .envs(env.iter().copied())
        .stdout(Stdio::piped())
        .stderr(Stdio::inherit())
        .kill_on_drop(true)
        .spawn()
        .expect("start the child process")
}

/// The next line of the child's output that starts with `marker`.
async fn line_starting<R: tokio::io::AsyncBufRead + Unpin>(
    lines: &mut tokio::io::Lines<R>,
    marker: &str,
) -> String {
    tokio::time::timeout(Duration::from_secs(60), async {
        while let Some(line) = lines.next_line().await.expect("read the child's output") {
            if let Some(at) = line.find(marker) {
                return line[at..].to_owned();
            }
        }
        panic!("the child exited before printing {marker}")
    })
    .await
    .unwrap_or_else(|_| panic!("the child did not print {marker} within 60 s"))
}

fn signal(child: &tokio::process::Child, name: &str) {
    let pid = child.id().expect("the child runs").to_string();
    let status = std::process::Command::new("kill")
        .args([&format!("-{name}"), &pid])
        .status()
        .expect("run kill");
    assert!(status.success(), "kill -{name} {pid}");
}

/// A real zombie: the owner's process is stopped (SIGSTOP) while its body
/// runs, so it stops renewing. A retry takes over after the lease and
/// completes. The owner is then continued (SIGCONT): its body finishes,
/// its renewal and its completion are refused, its caller still gets its
/// own value, and the record keeps the new owner's outcome.
async fn stopped_owner(test: &str, location: &str, store: Arc<dyn Store>) {
    let key = format!("stopped-{}-{}", std::process::id(), now_millis());
    let mut child = spawn_child(test, "zombie", location, &key, &[]);
    let mut lines = BufReader::new(child.stdout.take().unwrap()).lines();
    line_starting(&mut lines, "IDEM-OWNER-CLAIMED").await;
    signal(&child, "STOP");

    let retry = || {
        run::<_, u64, Error, _, _>(
            &*store,
            Call::new(SCOPE, &key, PAYLOAD).with_policy(policy()),
            async { Ok(42) },
        )
    };
    let started = std::time::Instant::now();
    let taken = loop {
        match retry().await {
            Err(Error::InProgress { .. }) => {
                assert!(
                    started.elapsed() < LEASE * 4,
                    "the stopped owner was never taken over"
                );
                tokio::time::sleep(Duration::from_millis(50)).await;
            }
            other => break other.expect("the takeover"),
        }
    };
    assert_eq!(taken, 42);
    signal(&child, "CONT");
    let got = line_starting(&mut lines, "IDEM-ZOMBIE-GOT").await;
    assert_eq!(
        got, "IDEM-ZOMBIE-GOT Ok(1)",
        "the zombie's caller gets its own value"
    );
    let status = child.wait().await.expect("reap the child");
    assert!(status.success(), "the zombie child failed: {status:?}");

    let scope = Scope::new(SCOPE);
    let record = store
        .get(&scope, &idem::Key::new(key.as_str()).unwrap())
        .await
        .unwrap()
        .unwrap();
    assert_eq!((record.state, record.fence), (State::Completed, 2));
    assert_eq!(record.outcome.unwrap().body, b"42");
    assert_eq!(retry().await.unwrap(), 42, "the new owner's outcome stands");
}

/// Where libfaketime lives on Debian (package `faketime`, which `.ci/run`
/// installs).
const LIBFAKETIME: &str = "/usr/lib/x86_64-linux-gnu/faketime/libfaketime.so.1";

/// Time is the database's: a process whose clock runs two hours ahead
/// neither takes over a live lease nor purges a live record.
async fn skewed_clock(test: &str, location: &str, store: Arc<dyn Store>) {
    assert!(
        std::path::Path::new(LIBFAKETIME).exists(),
        "{LIBFAKETIME} is missing: install Debian's `faketime` package (.ci/run does)"
    );
    let key = format!("skewed-{}-{}", std::process::id(), now_millis());
    let (release_tx, release_rx) = tokio::sync::oneshot::channel::<()>();
    let (claimed_tx, claimed_rx) = tokio::sync::oneshot::channel::<()>();
    let owner = {
        let (store, key) = (store.clone(), key.clone());
        tokio::spawn(async move {
            run::<_, u64, Error, _, _>(
                &*store,
                Call::new(SCOPE, &key, PAYLOAD)
                    .with_policy(Policy::new().lease(Duration::from_secs(30)).ttl(TTL)),
                async {
                    claimed_tx.send(()).unwrap();
                    release_rx.await.unwrap();
                    Ok(1)
                },
            )
            .await
        })
    };
    claimed_rx.await.unwrap();
    let mut child = spawn_child(
        test,
        "skewed",
        location,
        &key,
        &[
            ("LD_PRELOAD", LIBFAKETIME),
            ("FAKETIME", "+2h"),
            ("DONT_FAKE_MONOTONIC", "1"),
        ],
    );
    let mut lines = BufReader::new(child.stdout.take().unwrap()).lines();
    let got = line_starting(&mut lines, "IDEM-SKEWED-GOT").await;
    assert!(
        got.starts_with("IDEM-SKEWED-GOT Err(InProgress"),
        "a process two hours ahead got {got:?} for a live claim"
    );
    let purged = line_starting(&mut lines, "IDEM-SKEWED-PURGED").await;
    assert_eq!(purged, "IDEM-SKEWED-PURGED 0", "a live record was purged");
    assert!(child.wait().await.expect("reap the child").success());
    release_tx.send(()).unwrap();
    assert_eq!(owner.await.unwrap().unwrap(), 1);
}

common::backends!(sqlite_file, postgres, mysql, redis, redis_cluster => {
    /// The store at `location`, as the child processes open it.
    async fn open(location: String) -> Arc<dyn Store> {
        Arc::new(backend::store_at(&location, 4).await)
    }

    /// A store, and where the child processes find it.
    async fn store() -> (Arc<dyn Store>, String, common::backend::Guard) {
        let (store, guard) = backend::store(4).await;
        let location = backend::location(&store, &guard);
        (Arc::new(store), location, guard)
    }

    #[tokio::test(flavor = "multi_thread", worker_threads = 2)]
    async fn killed_owner_is_taken_over_and_fenced() {
        if let Ok(spec) = std::env::var(CHILD_VAR) {
            return child(&spec, open).await;
        }
        let (store, location, _guard) = store().await;
        let test = concat!(module_path!(), "::killed_owner_is_taken_over_and_fenced");
        killed_owner(common::test_name(test), &location, store).await;
    }

    #[tokio::test(flavor = "multi_thread", worker_threads = 2)]
    async fn stopped_owner_is_taken_over_and_fenced() {
        if let Ok(spec) = std::env::var(CHILD_VAR) {
            return child(&spec, open).await;
        }
        let (store, location, _guard) = store().await;
        let test = concat!(module_path!(), "::stopped_owner_is_taken_over_and_fenced");
        stopped_owner(common::test_name(test), &location, store).await;
    }

    // The servers and Redis have clocks of their own. SQLite's `'now'` is
    // the clock of the process that runs the statement (its processes
    // share a host, so a clock): faking that process's clock fakes
    // SQLite's too.
    backend::if_own_clock! {
        #[tokio::test(flavor = "multi_thread", worker_threads = 2)]
        async fn skewed_clock_neither_takes_over_nor_purges() {
            if let Ok(spec) = std::env::var(CHILD_VAR) {
                return child(&spec, open).await;
            }
            let (store, location, _guard) = store().await;
            let test = concat!(module_path!(), "::skewed_clock_neither_takes_over_nor_purges");
            skewed_clock(common::test_name(test), &location, store).await;
        }
    }
});
