//! The crash-point harness of durable steps: a 3-step operation
//! (reserve, charge, receipt) is interrupted at every step boundary and in
//! the middle of every step, then runs again, on every store.
//!
//! The points, in order: `b0` before the first step, `m1` in the middle of
//! the first step (its downstream effect happened and its answer is on its
//! way), `b1` between the first and the second step, `m2`, `b2`, `m3`, and
//! `b3` after the third step, before the operation's outcome is stored.
//!
//! The ways to interrupt:
//!
//! - a dropped future: the caller stops polling the operation there;
//! - an aborted task: the task running the operation is aborted there;
//! - a killed process: this test binary, started again in a child mode,
//!   runs the operation and is killed with SIGKILL there (not on the
//!   memory stores, whose database is the process).
//!
//! The downstream honours keys, as Stripe does: its effects are files in a
//! directory, one per key, created at most once, and every call is logged.
//! After the interruption the operation runs again to its end, and then:
//!
//! - each step's effect happened once, and every call of a step had the
//!   same key;
//! - the first step (rerun when in doubt) was called again only when it
//!   was interrupted in its middle, or when the killed process took its
//!   journal write on the way with it;
//! - the second step (reconciled) and the third (refused, then settled by
//!   an operator with what the downstream did) were never called again;
//! - the outcome equals an uninterrupted run's, and a further call replays
//!   it without calling anything.

use crate::common;

use std::fs;
use std::io::Write;
use std::path::{Path, PathBuf};
use std::process::Stdio;
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::Arc;
use std::time::Duration;

use idem::steps::{self, step, Step, StepKey};
use idem::{run, Call, Error, Key, Policy, Scope, Store};
use tokio::io::{AsyncBufReadExt, BufReader};
use tokio::sync::Notify;

const SCOPE: &str = "crash_points.checkout";
const PAYLOAD: &str = "7 EUR";
/// Set in the child: `<point> <location> <downstream dir> <key>`.
const CHILD_VAR: &str = "IDEM_STEP_CRASH_CHILD";
/// The points, in the order the operation passes them.
const POINTS: [&str; 7] = ["b0", "m1", "b1", "m2", "b2", "m3", "b3"];
/// The steps, and the point in the middle of each.
const STEPS: [(&str, &str); 3] = [("reserve", "m1"), ("charge", "m2"), ("receipt", "m3")];
const OUTCOME: &str = "reserve:7EUR|charge:7EUR|receipt:7EUR";
/// Short, so that a killed owner's claim lapses soon.
const LEASE: Duration = Duration::from_millis(600);

fn policy() -> Policy {
    Policy::new()
        .lease(LEASE)
        .ttl(Duration::from_secs(3600))
        .wait(Duration::from_secs(20))
}

/// A downstream that dedupes by key: an effect is a file named by the key,
/// created once; a call with a key it has seen answers the first effect.
struct Downstream {
    dir: PathBuf,
}

impl Downstream {
    fn new(dir: &Path) -> Self {
        fs::create_dir_all(dir).unwrap();
        Downstream {
            dir: dir.to_owned(),
        }
    }

    fn log(&self, file: &str, line: &str) {
        let mut log = fs::OpenOptions::new()
            .create(true)
            .append(true)
            .open(self.dir.join(file))
            .unwrap();
        log.write_all(format!("{line}\n").as_bytes()).unwrap();
    }

    /// The step `name`'s call with `key`.
    fn apply(&self, name: &str, key: &StepKey) -> String {
        self.log("calls.log", &format!("{name} {key}"));
        let effect = self.dir.join(key.as_str());
        let output = format!("{name}:{}", PAYLOAD.replace(' ', ""));
        // Written whole, then linked in: the link is created once.
        let draft = self.dir.join(format!("{key}.{}.draft", std::process::id()));
        fs::write(&draft, &output).unwrap();
        match fs::hard_link(&draft, &effect) {
            Ok(()) => self.log("effects.log", name),
            Err(err) if err.kind() == std::io::ErrorKind::AlreadyExists => {}
            Err(err) => panic!("{err}"),
        }
        fs::remove_file(&draft).unwrap();
        fs::read_to_string(&effect).unwrap()
    }

    /// What the call with `key` did, if it did anything: how `reconcile`
    /// asks.
    fn lookup(&self, key: &StepKey) -> Option<String> {
        self.log("lookups.log", key.as_str());
        fs::read_to_string(self.dir.join(key.as_str())).ok()
    }

    fn lines(&self, file: &str) -> Vec<String> {
        fs::read_to_string(self.dir.join(file))
            .unwrap_or_default()
            .lines()
            .map(str::to_owned)
            .collect()
    }

    /// How many effects of `name` happened.
    fn effects(&self, name: &str) -> usize {
        self.lines("effects.log")
            .iter()
            .filter(|l| *l == name)
            .count()
    }

    /// The keys `name` was called with, in order.
    fn calls(&self, name: &str) -> Vec<String> {
        self.lines("calls.log")
            .iter()
            .filter_map(|l| l.strip_prefix(&format!("{name} ")).map(str::to_owned))
            .collect()
    }
}

/// Where the operation stops, once.
struct Crash {
    point: Option<&'static str>,
    armed: AtomicBool,
    reached: Notify,
    /// In a child process: say so on stdout.
    announce: bool,
}

impl Crash {
    fn at_point(point: &'static str, announce: bool) -> Arc<Self> {
        Arc::new(Crash {
            point: Some(point),
            armed: AtomicBool::new(true),
            reached: Notify::new(),
            announce,
        })
    }

    fn never() -> Arc<Self> {
        Arc::new(Crash {
            point: None,
            armed: AtomicBool::new(false),
            reached: Notify::new(),
            announce: false,
        })
    }

    /// Passes `point`: stops there for ever if it is the crash point.
    async fn pass(&self, point: &str) {
        if self.point == Some(point) && self.armed.swap(false, Ordering::SeqCst) {
            if self.announce {
                println!("IDEM-CRASH-POINT {point}");
                std::io::stdout().flush().unwrap();
            }
            self.reached.notify_one();
            std::future::pending::<()>().await;
        }
    }
}

/// The operation: three steps, one per in-doubt policy, passing the crash
/// points: `reserve` is rerun when in doubt (the default), `charge`
/// reconciles by asking the downstream, `receipt` refuses.
async fn checkout(
    store: &dyn Store,
    key: &str,
    downstream: &Downstream,
    crash: &Crash,
) -> Result<String, Error> {
    run(
        store,
        Call::new(SCOPE, key, &PAYLOAD).with_policy(policy()),
        async {
            crash.pass("b0").await;
            let call = |name: &'static str, middle: &'static str| {
                move |key: StepKey| async move {
                    let output = downstream.apply(name, &key);
                    crash.pass(middle).await;
                    Ok::<_, Error>(output)
                }
            };
            let reserved: String = step("reserve", call("reserve", "m1")).await?;
            crash.pass("b1").await;
            let charged: String = Step::new("charge")
                .reconcile(|key: StepKey| async move { Ok(downstream.lookup(&key)) })
                // The downstream performs a call before it answers, or
                // never: nothing is left in flight to wait for.
                .settle(Duration::ZERO)
                .run(call("charge", "m2"))
                .await?;
            crash.pass("b2").await;
            let receipt: String = Step::new("receipt")
                .refuse()
                .run(call("receipt", "m3"))
                .await?;
            crash.pass("b3").await;
            Ok([reserved, charged, receipt].join("|"))
        },
    )
    .await
}

/// What the run after an interruption at `point` must leave. `lost`: the
/// interruption killed the process, so journal writes on their way were
/// lost with it.
async fn check_recovered(
    store: &dyn Store,
    key: &str,
    downstream: &Downstream,
    point: &str,
    lost: bool,
) {
    let mut outcome = checkout(store, key, downstream, &Crash::never()).await;
    if point == "m3" {
        // The receipt refuses when in doubt: an operator settles it with
        // what the downstream did under its key.
        assert!(
            matches!(&outcome, Err(Error::OutcomeUnknown { step, seq: 2, .. }) if step == "receipt"),
            "after m3: {outcome:?}"
        );
        let (scope, k) = (Scope::new(SCOPE), Key::new(key).unwrap());
        let step_key = StepKey::derive(&scope, &k, "receipt", 0);
        let done = downstream.lookup(&step_key).expect("the receipt's effect");
        assert!(steps::resolve(store, &scope, &k, 2, "receipt", Some(&done))
            .await
            .unwrap());
        outcome = checkout(store, key, downstream, &Crash::never()).await;
    }
    let outcome = outcome.unwrap_or_else(|err| panic!("the run after {point} failed: {err}"));
    assert_eq!(outcome, OUTCOME, "after {point}");
    let reached = POINTS.iter().position(|p| *p == point).unwrap();
    for (name, middle) in STEPS {
        assert_eq!(
            downstream.effects(name),
            1,
            "{name}'s effects after {point}"
        );
        let calls = downstream.calls(name);
        assert!(
            calls.iter().all(|k| *k == calls[0]),
            "{name} was called with two keys after {point}: {calls:?}"
        );
        let middle_at = POINTS.iter().position(|p| *p == middle).unwrap();
        let expected = match name {
            // Interrupted in its middle: called again. Journaled behind
            // the body, so a killed process may lose its entry: called
            // again too.
            "reserve" if middle == point => 2,
            "reserve" if lost && middle_at < reached => calls.len().max(1),
            // Reconciled, or settled by the operator: never called again.
            _ => 1,
        };
        assert_eq!(
            calls.len(),
            expected,
            "{name}'s calls after {point}: {calls:?}"
        );
        assert!(
            calls.len() <= 2,
            "{name} called {} times after {point}",
            calls.len()
        );
    }
    // A further call replays, calling nothing.
    let before: usize = STEPS.iter().map(|(n, _)| downstream.calls(n).len()).sum();
    let again = checkout(store, key, downstream, &Crash::never())
        .await
        .unwrap();
    assert_eq!(again, OUTCOME);
    let after: usize = STEPS.iter().map(|(n, _)| downstream.calls(n).len()).sum();
    assert_eq!(
        after, before,
        "the replay after {point} called the downstream"
    );
}

fn fresh_key(kind: &str, point: &str) -> String {
    common::fresh(&format!("crash-{kind}-{point}"))
}

/// Every point, interrupted by dropping the operation's future.
async fn dropped_future(store: Arc<dyn Store>) {
    let dir = tempfile::tempdir().unwrap();
    for point in POINTS {
        let key = fresh_key("drop", point);
        let downstream = Downstream::new(&dir.path().join(&key));
        let crash = Crash::at_point(point, false);
        tokio::select! {
            result = checkout(&*store, &key, &downstream, &crash) => {
                panic!("the operation ended without passing {point}: {result:?}")
            }
            () = crash.reached.notified() => {}
        }
        check_recovered(&*store, &key, &downstream, point, false).await;
    }
}

/// Every point, interrupted by aborting the task that runs the operation.
async fn aborted_task(store: Arc<dyn Store>) {
    let dir = tempfile::tempdir().unwrap();
    for point in POINTS {
        let key = fresh_key("abort", point);
        let downstream = Arc::new(Downstream::new(&dir.path().join(&key)));
        let crash = Crash::at_point(point, false);
        let task = {
            let (store, key, downstream, crash) = (
                store.clone(),
                key.clone(),
                downstream.clone(),
                crash.clone(),
            );
            tokio::spawn(async move { checkout(&*store, &key, &downstream, &crash).await })
        };
        let reached = crash.reached.notified();
        tokio::time::timeout(Duration::from_secs(20), reached)
            .await
            .unwrap_or_else(|_| panic!("{point} was not reached"));
        task.abort();
        assert!(task.await.unwrap_err().is_cancelled());
        check_recovered(&*store, &key, &downstream, point, false).await;
    }
}

/// Every point, interrupted by killing the process that runs the
/// operation (this binary, in its child mode, on the store at `location`).
async fn killed_process(test: &str, location: &str, store: Arc<dyn Store>) {
    let dir = tempfile::tempdir().unwrap();
    for point in POINTS {
        let key = fresh_key("kill", point);
        let ledger = dir.path().join(&key);
        let exe = std::env::current_exe().expect("the test binary");
        let mut child = tokio::process::Command::new(exe)
            .args([test, "--exact", "--nocapture", "--test-threads", "1"])
            .env(
                CHILD_VAR,
                format!("{point} {location} {} {key}", ledger.display()),
            )
            .stdout(Stdio::piped())
            .stderr(Stdio::inherit())
            .kill_on_drop(true)
            .spawn()
            .expect("start the child process");
        let mut lines = BufReader::new(child.stdout.take().unwrap()).lines();
        let announced = tokio::time::timeout(Duration::from_secs(60), async {
            while let Some(line) = lines.next_line().await.unwrap() {
                // The harness may have written the test's name on the
                // same line.
                if let Some(at) = line.find("IDEM-CRASH-POINT") {
                    return line[at..].to_owned();
                }
            }
            panic!("the child ended without reaching {point}")
        })
        .await
        .unwrap_or_else(|_| panic!("the child did not reach {point}"));
        assert_eq!(announced, format!("IDEM-CRASH-POINT {point}"));
        child.start_kill().unwrap();
        let status = child.wait().await.unwrap();
        assert!(!status.success(), "the child was not killed: {status}");
        let downstream = Downstream::new(&ledger);
        check_recovered(&*store, &key, &downstream, point, true).await;
    }
}

/// The child: runs the operation on the store at `location` until the
/// crash point, where it waits to be killed.
async fn child<F>(spec: &str, open: impl FnOnce(String) -> F)
where
    F: std::future::Future<Output = Arc<dyn Store>>,
{
    let [point, location, dir, key] = spec.split(' ').collect::<Vec<_>>()[..] else {
        panic!("{CHILD_VAR}={spec:?}: expected 4 fields")
    };
    let point = POINTS
        .into_iter()
        .find(|p| *p == point)
        .expect("a known point");
    let store = open(location.to_owned()).await;
    let downstream = Downstream::new(Path::new(dir));
    let crash = Crash::at_point(point, true);
    let result = checkout(&*store, key, &downstream, &crash).await;
    panic!("the operation ended without passing {point}: {result:?}");
}

common::backends!(memory, sqlite_memory => {
    #[tokio::test(flavor = "multi_thread", worker_threads = 2)]
    async fn interrupted_by_a_dropped_future_at_every_point() {
        let (store, _guard) = backend::store(4).await;
        dropped_future(Arc::new(store)).await;
    }

    #[tokio::test(flavor = "multi_thread", worker_threads = 2)]
    async fn interrupted_by_an_aborted_task_at_every_point() {
        let (store, _guard) = backend::store(4).await;
        aborted_task(Arc::new(store)).await;
    }
});

common::backends!(sqlite_file, postgres, mysql => {
    async fn open(location: String) -> Arc<dyn Store> {
        Arc::new(backend::store_at(&location, 4).await)
    }

    #[tokio::test(flavor = "multi_thread", worker_threads = 2)]
    async fn interrupted_by_a_dropped_future_at_every_point() {
        let (store, _guard) = backend::store(4).await;
        dropped_future(Arc::new(store)).await;
    }

    #[tokio::test(flavor = "multi_thread", worker_threads = 2)]
    async fn interrupted_by_an_aborted_task_at_every_point() {
        let (store, _guard) = backend::store(4).await;
        aborted_task(Arc::new(store)).await;
    }

    #[tokio::test(flavor = "multi_thread", worker_threads = 2)]
    async fn interrupted_by_a_killed_process_at_every_point() {
        if let Ok(spec) = std::env::var(CHILD_VAR) {
            return child(&spec, open).await;
        }
        let (store, guard) = backend::store(4).await;
        let location = backend::location(&store, &guard);
        let test = concat!(module_path!(), "::interrupted_by_a_killed_process_at_every_point");
        killed_process(common::test_name(test), &location, Arc::new(store)).await;
    }
});
