//! Crash: a process holding a claim is killed with SIGKILL, so nothing of
//! it runs again: no release, no completion, no drop. The lease and the
//! fence must handle it: after the lease, a retry takes over with fence 2
//! and completes once, and a completion (or release) presented with the
//! killed owner's fence 1 is rejected with `LeaseLost` and changes nothing.
//!
//! The owner is this test binary, started again in a child mode: it claims
//! the key through the engine, starts the body, prints a marker line and waits
//! forever inside the body.

use std::process::Stdio;
use std::sync::atomic::{AtomicUsize, Ordering};
use std::sync::Arc;
use std::time::Duration;

use idem::record::now_millis;
use idem::{run, Call, Claim, Error, Outcome, OutcomeKind, Policy, Scope, State, Store};
use tokio::io::{AsyncBufReadExt, BufReader};

use crate::servers::{self, DropTables, Server};

/// Set in the child: `<backend> <location> <key>`, where the location is
/// the SQLite file or the PostgreSQL table.
const CHILD_VAR: &str = "IDEM_RELIABILITY_CRASH_CHILD";
const SCOPE: &str = "reliability.crash";
/// Long enough for the parent to see the dead owner's claim still held;
/// short enough to keep the test quick.
const LEASE: Duration = Duration::from_millis(1_500);
const TTL: Duration = Duration::from_secs(3_600);
const PAYLOAD: &str = "charge 500 EUR";

fn policy() -> Policy {
    Policy::new().lease(LEASE).ttl(TTL).fail_fast()
}

async fn open(backend: &str, location: &str) -> (Arc<dyn Store>, Option<DropTables>) {
    match backend {
        "sqlite" => {
            let store = idem::SqliteStore::connect(&format!("sqlite://{location}"))
                .await
                .expect("open the SQLite file");
            (Arc::new(store), None)
        }
        "postgres" => {
            let db = Server::Postgres.pool(4).await;
            let servers::Db::Postgres(pool) = db else {
                unreachable!()
            };
            let store = idem::PostgresStore::new(pool)
                .with_table_name(location)
                .expect("a valid table name");
            store.migrate().await.expect("migrate the PostgreSQL store");
            (Arc::new(store), None)
        }
        other => panic!("unknown backend {other}"),
    }
}

/// The child: claims, starts the body, says so, and hangs in the body.
async fn owner(spec: &str) {
    let [backend, location, key] = spec.split(' ').collect::<Vec<_>>()[..] else {
        panic!("{CHILD_VAR}={spec:?}: expected 3 fields")
    };
    let (store, _guard) = open(backend, location).await;
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

/// The parent's side of the test `test` on `backend` at `location`.
async fn killed_owner(test: &str, backend: &str, location: &str, store: Arc<dyn Store>) {
    let key = format!("crash-{}-{}", std::process::id(), now_millis());
    let exe = std::env::current_exe().expect("the test binary");
    let mut child = tokio::process::Command::new(exe)
        .args([test, "--exact", "--nocapture", "--test-threads", "1"])
        .env(CHILD_VAR, format!("{backend} {location} {key}"))
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
        run::<_, u64, Error, _>(
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
    assert_eq!(store.get(&scope, &key).await.unwrap().unwrap(), done);

    // Every later retry replays the one run.
    assert_eq!(retry().await.unwrap(), 42);
    assert_eq!(runs.load(Ordering::SeqCst), 1, "the body ran once");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn killed_owner_on_sqlite_file() {
    if let Ok(spec) = std::env::var(CHILD_VAR) {
        return owner(&spec).await;
    }
    let dir = tempfile::tempdir().expect("a temporary directory");
    let file = dir.path().join("idem.db").display().to_string();
    let (store, _) = open("sqlite", &file).await;
    killed_owner("crash::killed_owner_on_sqlite_file", "sqlite", &file, store).await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn killed_owner_on_postgres() {
    if let Ok(spec) = std::env::var(CHILD_VAR) {
        return owner(&spec).await;
    }
    let (store, _db, guard) = servers::postgres_store(4).await;
    let table = store.table_name().to_owned();
    killed_owner(
        "crash::killed_owner_on_postgres",
        "postgres",
        &table,
        Arc::new(store),
    )
    .await;
    drop(guard);
}
