//! A Redis Cluster primary killed (SIGKILL) while calls run, and its
//! replica promoted in its place: what the callers see, with and without
//! `RedisStore::wait_for_replicas`.
//!
//! The test starts a cluster of its own (3 primaries, 3 replicas, on
//! 127.0.0.1:7300-7305 by `.ci/redis-cluster`), so that killing a node
//! disturbs no other test. Workers call fresh keys, each key by two
//! callers at once that retry every retryable error until they get an
//! answer, as real clients do. A second in, the replica of slot 0's
//! primary is stopped (SIGSTOP) and cut off (the primary's `CLIENT KILL
//! TYPE replica`) for half a second, then the primary is killed
//! (SIGKILL); once the replica has taken over, the killed node is started
//! again, empty, and rejoins as a replica. Each scenario prints its
//! figures: keys called, body runs, keys whose body ran more than once,
//! and the errors the callers saw. After the storm every key is called
//! once more, as by a client whose answer was lost in the failover: a key
//! whose record the failover lost runs its body again.
//!
//! - With `wait_for_replicas(1, ..)`, a claim runs its body only once a
//!   replica holds it, and a completion is acknowledged only once a
//!   replica holds it: every key's body runs exactly once, asserted.
//! - Without it, a claim acknowledged by the primary just before it died
//!   may be missing on the promoted replica, and a retry then runs the
//!   body again: reported, not asserted (it depends on the timing).
#![cfg(feature = "redis")]

use std::collections::HashMap;
use std::sync::atomic::{AtomicBool, AtomicUsize, Ordering};
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use idem::{run, Call, Error, Policy, RedisStore};

const FIRST_PORT: u16 = 7300;
const WORKERS: usize = 16;
const SCOPE: &str = "redis_failover.charge";

/// The test's cluster, stopped when dropped.
struct Cluster;

impl Cluster {
    fn script(args: &[&str]) -> std::process::Output {
        let script = concat!(env!("CARGO_MANIFEST_DIR"), "/.ci/redis-cluster");
        let output = std::process::Command::new(script)
            .args(args)
            .env("IDEM_REDIS_CLUSTER_PORT", FIRST_PORT.to_string())
            .output()
            .unwrap_or_else(|err| panic!("run {script}: {err}"));
        assert!(
            output.status.success(),
            "{script} {args:?} failed:\n{}{}",
            String::from_utf8_lossy(&output.stdout),
            String::from_utf8_lossy(&output.stderr)
        );
        output
    }

    fn start() -> Cluster {
        Cluster::script(&["stop"]);
        Cluster::script(&["start"]);
        Cluster
    }

    /// `CLUSTER NODES` as one node sees it.
    async fn nodes(port: u16) -> Option<String> {
        let client = redis::Client::open(format!("redis://127.0.0.1:{port}")).ok()?;
        let mut conn = tokio::time::timeout(
            Duration::from_secs(2),
            client.get_multiplexed_async_connection(),
        )
        .await
        .ok()?
        .ok()?;
        redis::cmd("CLUSTER")
            .arg("NODES")
            .query_async(&mut conn)
            .await
            .ok()
    }

    /// The ports of the primary that serves slot 0 and of its replica.
    async fn slot_zero() -> (u16, u16) {
        let nodes = Cluster::nodes(FIRST_PORT).await.expect("CLUSTER NODES");
        let nodes: Vec<Vec<&str>> = nodes
            .lines()
            .map(|line| line.split_whitespace().collect())
            .collect();
        let port = |fields: &Vec<&str>| -> u16 {
            fields[1]
                .split('@')
                .next()
                .and_then(|addr| addr.rsplit(':').next())
                .and_then(|p| p.parse().ok())
                .expect("a node's port")
        };
        let primary = nodes
            .iter()
            .find(|f| f[2].contains("master") && f[8..].iter().any(|r| r.starts_with("0-")))
            .expect("a primary serving slot 0");
        let replica = nodes
            .iter()
            .find(|f| f[2].contains("slave") && f[3] == primary[0])
            .expect("a replica of slot 0's primary");
        (port(primary), port(replica))
    }

    /// Makes the primary on `port` close its replicas' connections.
    async fn drop_replica_links(port: u16) {
        let client = redis::Client::open(format!("redis://127.0.0.1:{port}")).unwrap();
        let mut conn = client.get_multiplexed_async_connection().await.unwrap();
        let killed: i64 = redis::cmd("CLIENT")
            .arg("KILL")
            .arg("TYPE")
            .arg("replica")
            .query_async(&mut conn)
            .await
            .unwrap();
        assert!(
            killed >= 1,
            "the primary on {port} had no replica link to drop"
        );
    }

    /// Sends `signal` to the node on `port`.
    fn signal(port: u16, signal: &str) {
        let pid_file = format!("/tmp/idem-redis-cluster-{FIRST_PORT}/redis-{port}.pid");
        let pid = std::fs::read_to_string(&pid_file).unwrap_or_else(|e| panic!("{pid_file}: {e}"));
        let status = std::process::Command::new("kill")
            .args([&format!("-{signal}"), pid.trim()])
            .status()
            .expect("run kill");
        assert!(status.success(), "kill -{signal} of the node on {port}");
    }

    /// Waits until a node other than `dead` serves slot 0 as a primary.
    async fn wait_for_failover(dead: u16) -> Duration {
        let started = Instant::now();
        let alive = (FIRST_PORT..FIRST_PORT + 6).find(|p| *p != dead).unwrap();
        loop {
            if let Some(nodes) = Cluster::nodes(alive).await {
                let promoted = nodes.lines().any(|line| {
                    let fields: Vec<&str> = line.split_whitespace().collect();
                    fields.len() > 8
                        && fields[2].contains("master")
                        && !fields[2].contains("fail")
                        && !fields[1].starts_with(&format!("127.0.0.1:{dead}@"))
                        && fields[8..].iter().any(|range| range.starts_with("0-"))
                });
                if promoted {
                    return started.elapsed();
                }
            }
            assert!(
                started.elapsed() < Duration::from_secs(30),
                "no replica took over slot 0 within 30 s"
            );
            tokio::time::sleep(Duration::from_millis(100)).await;
        }
    }
}

impl Drop for Cluster {
    fn drop(&mut self) {
        Cluster::script(&["stop"]);
    }
}

/// What one scenario saw.
#[derive(Debug, Default)]
struct Figures {
    keys: usize,
    runs: usize,
    ran_twice: usize,
    errors: HashMap<String, usize>,
    failover: Duration,
    answers_differ: usize,
}

/// One call of `key` by one caller, retried on every retryable error until
/// it is answered; the errors it saw are counted.
async fn call_until_answered(
    store: &RedisStore,
    key: &str,
    runs: &Mutex<HashMap<String, usize>>,
    errors: &Mutex<HashMap<String, usize>>,
) -> u64 {
    let started = Instant::now();
    loop {
        let answer = run::<_, u64, Error, _, _>(
            store,
            Call::new(SCOPE, key, &1).with_policy(
                Policy::new()
                    .lease(Duration::from_secs(15))
                    .wait(Duration::from_secs(30)),
            ),
            async {
                // Answers the run's number: a key run twice may answer its
                // two callers differently.
                let run = {
                    let mut runs = runs.lock().unwrap();
                    let count = runs.entry(key.to_owned()).or_default();
                    *count += 1;
                    *count as u64
                };
                tokio::time::sleep(Duration::from_millis(20)).await;
                Ok(run)
            },
        )
        .await;
        match answer {
            Ok(value) => return value,
            Err(err) if err.is_retryable() => {
                let kind = match &err {
                    Error::Store(_) => "store error",
                    Error::InProgress { .. } => "in progress",
                    Error::LeaseLost => "lease lost",
                    _ => "other",
                };
                *errors.lock().unwrap().entry(kind.to_owned()).or_default() += 1;
                assert!(
                    started.elapsed() < Duration::from_secs(120),
                    "{key} unanswered after 2 minutes: {err}"
                );
                tokio::time::sleep(Duration::from_millis(50)).await;
            }
            Err(err) => panic!("{key}: a final error: {err}"),
        }
    }
}

async fn scenario(replicas: u32) -> Figures {
    let cluster = Cluster::start();
    let store = RedisStore::connect_cluster([format!("redis://127.0.0.1:{FIRST_PORT}")])
        .await
        .expect("connect to the test's cluster")
        .with_prefix("failover")
        .unwrap()
        .wait_for_replicas(replicas, Duration::from_secs(1));
    let runs = Arc::new(Mutex::new(HashMap::<String, usize>::new()));
    let errors = Arc::new(Mutex::new(HashMap::<String, usize>::new()));
    let next = Arc::new(AtomicUsize::new(0));
    let stop = Arc::new(AtomicBool::new(false));
    let differ = Arc::new(AtomicUsize::new(0));
    let workers: Vec<_> = (0..WORKERS)
        .map(|_| {
            let (store, runs, errors) = (store.clone(), runs.clone(), errors.clone());
            let (next, stop, differ) = (next.clone(), stop.clone(), differ.clone());
            tokio::spawn(async move {
                while !stop.load(Ordering::Relaxed) {
                    let key = format!("key-{}", next.fetch_add(1, Ordering::Relaxed));
                    let (a, b) = tokio::join!(
                        call_until_answered(&store, &key, &runs, &errors),
                        call_until_answered(&store, &key, &runs, &errors),
                    );
                    if a != b {
                        differ.fetch_add(1, Ordering::Relaxed);
                    }
                }
            })
        })
        .collect();
    tokio::time::sleep(Duration::from_secs(1)).await;
    // The replica stops (SIGSTOP) and the primary drops its link to it
    // (`CLIENT KILL TYPE replica`), so that for half a second what the
    // primary acknowledges is on the primary alone; then the primary dies,
    // and the replica, continued, takes over without it.
    let (dead, replica) = Cluster::slot_zero().await;
    Cluster::signal(replica, "STOP");
    Cluster::drop_replica_links(dead).await;
    tokio::time::sleep(Duration::from_millis(500)).await;
    Cluster::script(&["kill-node", &dead.to_string()]);
    Cluster::signal(replica, "CONT");
    let failover = Cluster::wait_for_failover(dead).await;
    // The killed node comes back and rejoins as the new primary's replica
    // (with the option on, the shard's claims wait for it).
    Cluster::script(&["start-node", &dead.to_string()]);
    tokio::time::sleep(Duration::from_secs(3)).await;
    stop.store(true, Ordering::Relaxed);
    for worker in workers {
        tokio::time::timeout(Duration::from_secs(180), worker)
            .await
            .expect("the callers did not finish within 3 minutes")
            .unwrap();
    }
    // Every key is called once more, as a client whose answer was lost in
    // the failover would: its record must be there to replay.
    let keys: Vec<String> = runs.lock().unwrap().keys().cloned().collect();
    for chunk in keys.chunks(64) {
        let retries = chunk
            .iter()
            .map(|key| call_until_answered(&store, key, &runs, &errors));
        futures::future::join_all(retries).await;
    }
    drop(store);
    drop(cluster);
    let runs = runs.lock().unwrap();
    let errors = errors.lock().unwrap().clone();
    Figures {
        keys: runs.len(),
        runs: runs.values().sum(),
        ran_twice: runs.values().filter(|n| **n > 1).count(),
        errors,
        failover,
        answers_differ: differ.load(Ordering::Relaxed),
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn a_primary_killed_while_calls_run() {
    let _failovers = crate::common::FAILOVERS.lock().await;
    let without = scenario(0).await;
    let with = scenario(1).await;
    for (name, figures) in [("without WAIT", &without), ("with WAIT 1", &with)] {
        eprintln!(
            "failover {name}: {} keys, {} body runs, {} keys ran more than once, \
             callers saw {:?}, slot 0 failed over in {:.1} s, {} keys answered differently",
            figures.keys,
            figures.runs,
            figures.ran_twice,
            figures.errors,
            figures.failover.as_secs_f64(),
            figures.answers_differ,
        );
    }
    assert!(without.keys > 0 && with.keys > 0, "no call ran");
    assert_eq!(
        (with.ran_twice, with.answers_differ),
        (0, 0),
        "with WAIT, a body ran again after the failover"
    );
}
