//! The Redis store under real concurrency and real faults, on a single
//! Redis and on the local Redis Cluster:
//!
//! - 500 concurrent calls over 25 keys through 16 connections (16 stores,
//!   each on a connection of its own) run each body exactly once (counted
//!   with `INCR` on a key the body writes), and every caller of a key gets
//!   that run's result;
//! - the same storm from 4 OS processes (this binary, started again in a
//!   child mode) runs each key once;
//! - a waiter on another connection (as in another process) is woken by
//!   the completion's message on the record's channel, not by its poll;
//! - connections killed by the server (`CLIENT KILL`) while bodies run:
//!   every caller gets its own body's value, and each body ran once.
#![cfg(feature = "redis")]

use crate::common;
use crate::common::journal_of;

use std::collections::HashMap;
use std::sync::Arc;
use std::time::{Duration, Instant, SystemTime, UNIX_EPOCH};

use common::redis::{unique_prefix, DeleteKeys, Redis};
use idem::{run, Call, Error, Key, Policy, RedisStore, Scope, Store};
use tokio::sync::Barrier;

const CALLS: usize = 500;
const KEYS: usize = 25;
const CONNECTIONS: usize = 16;
const PROCESSES: usize = 4;
const SCOPE: &str = "redis_store.charge";

/// Set in the children of a storm across processes: `<redis> <prefix>
/// <start_at_millis> <child>`.
const CHILD_VAR: &str = "IDEM_REDIS_STORM_CHILD";

fn policy() -> Policy {
    Policy::new().wait(Duration::from_secs(60))
}

/// One call: the body counts its run on `<prefix>:runs:<key>` (outside the
/// store's keys) and answers the run's number.
async fn charge(store: &RedisStore, redis: Redis, key: &str) -> Result<i64, Error> {
    let counter = format!("{}:runs:{key}", store.prefix());
    run(
        store,
        Call::new(SCOPE, key, &1).with_policy(policy()),
        async move {
            let mut conn = redis.conn().await;
            redis::cmd("INCR")
                .arg(&counter)
                .query_async::<i64>(&mut conn)
                .await
                .map_err(Error::store)
        },
    )
    .await
}

/// Fires `calls` calls over `KEYS` keys at once, spread over the stores;
/// answers each call's key and result.
async fn storm(stores: &[RedisStore], redis: Redis, calls: usize) -> Vec<(String, i64)> {
    let barrier = Arc::new(Barrier::new(calls));
    let tasks: Vec<_> = (0..calls)
        .map(|i| {
            let (store, barrier) = (stores[i % stores.len()].clone(), barrier.clone());
            let key = format!("storm-{}", i % KEYS);
            tokio::spawn(async move {
                barrier.wait().await;
                let result = charge(&store, redis, &key).await;
                (key, result)
            })
        })
        .collect();
    let mut results = Vec::with_capacity(calls);
    for task in tasks {
        let (key, result) = task.await.expect("a call panicked");
        let result = result.unwrap_or_else(|err| panic!("call on {key} failed: {err:?}"));
        results.push((key, result));
    }
    results
}

/// Every key's body ran once, and every caller got that run (1).
async fn assert_one_run_per_key(redis: Redis, prefix: &str, results: &[(String, i64)]) {
    let mut conn = redis.conn().await;
    for k in 0..KEYS {
        let runs: Option<i64> = redis::cmd("GET")
            .arg(format!("{prefix}:runs:storm-{k}"))
            .query_async(&mut conn)
            .await
            .unwrap();
        assert_eq!(runs, Some(1), "runs of storm-{k}");
    }
    let mut by_key: HashMap<&str, Vec<i64>> = HashMap::new();
    for (key, run) in results {
        by_key.entry(key).or_default().push(*run);
    }
    assert_eq!(by_key.len(), KEYS);
    for (key, seen) in &by_key {
        assert!(
            seen.iter().all(|r| *r == 1),
            "callers of {key} got other runs: {seen:?}"
        );
    }
}

async fn stores(redis: Redis, prefix: &str, n: usize) -> Vec<RedisStore> {
    let mut stores = Vec::with_capacity(n);
    for _ in 0..n {
        stores.push(redis.store(prefix).await);
    }
    stores
}

async fn storm_in_one_process(redis: Redis) {
    let prefix = unique_prefix("storm");
    let _keys = DeleteKeys {
        redis,
        prefix: prefix.clone(),
    };
    let stores = stores(redis, &prefix, CONNECTIONS).await;
    let results = storm(&stores, redis, CALLS).await;
    assert_eq!(results.len(), CALLS);
    assert_one_run_per_key(redis, &prefix, &results).await;
}

fn now_millis() -> i64 {
    SystemTime::now()
        .duration_since(UNIX_EPOCH)
        .unwrap()
        .as_millis() as i64
}

/// The parent: starts the children of `test` with a common start time,
/// collects the results they print, and checks the runs.
async fn storm_across_processes(redis: Redis, test: &str) {
    let prefix = unique_prefix("procs");
    let _keys = DeleteKeys {
        redis,
        prefix: prefix.clone(),
    };
    let start_at = now_millis() + 3_000;
    let exe = std::env::current_exe().expect("the test binary");
    let redis_name = match redis {
        Redis::Single => "single",
        Redis::Cluster => "cluster",
    };
    let children = (0..PROCESSES).map(|child| {
        tokio::process::Command::new(&exe)
            .args([test, "--exact", "--nocapture", "--test-threads", "1"])
            .env(
                CHILD_VAR,
                format!("{redis_name} {prefix} {start_at} {child}"),
            )
            .kill_on_drop(true)
            .output()
    });
    let outputs = tokio::time::timeout(
        Duration::from_secs(180),
        futures::future::join_all(children),
    )
    .await
    .expect("the children did not finish within 180 s");
    let mut results = Vec::new();
    for (child, output) in outputs.into_iter().enumerate() {
        let output = output.expect("start a child process");
        let stdout = String::from_utf8_lossy(&output.stdout);
        assert!(
            output.status.success(),
            "child {child} failed ({}):\n{stdout}\n{}",
            output.status,
            String::from_utf8_lossy(&output.stderr)
        );
        for line in stdout.lines() {
            // The first may share its line with the test harness's own.
            if let Some(at) = line.find("IDEM-RESULT ") {
                let result = &line[at + "IDEM-RESULT ".len()..];
                let (key, run) = result.split_once(' ').expect("a result line");
                results.push((key.to_owned(), run.parse().expect("a run number")));
            }
        }
    }
    assert_eq!(results.len(), CALLS, "every child reported its calls");
    assert_one_run_per_key(redis, &prefix, &results).await;
}

/// A child: 4 stores of its own, its share of the storm at the common
/// start, each result printed for the parent.
async fn storm_child(spec: &str) {
    let parts: Vec<&str> = spec.split(' ').collect();
    let [redis, prefix, start_at, _child] = parts[..] else {
        panic!("{CHILD_VAR}={spec:?}: expected 4 fields")
    };
    let redis = match redis {
        "single" => Redis::Single,
        _ => Redis::Cluster,
    };
    let stores = stores(redis, prefix, CONNECTIONS / PROCESSES).await;
    let wait = start_at.parse::<i64>().unwrap() - now_millis();
    assert!(wait > 0, "the child started after the common start time");
    tokio::time::sleep(Duration::from_millis(wait as u64)).await;
    for (key, run) in storm(&stores, redis, CALLS / PROCESSES).await {
        println!("IDEM-RESULT {key} {run}");
    }
}

/// A duplicate waiting on a store of its own (another connection, as in
/// another process) hears the completion at once: with a poll of a
/// minute, it would wait a minute.
async fn a_waiter_elsewhere_is_woken(redis: Redis) {
    let prefix = unique_prefix("wake");
    let _keys = DeleteKeys {
        redis,
        prefix: prefix.clone(),
    };
    let (owner, waiter) = (redis.store(&prefix).await, redis.store(&prefix).await);
    let (scope, key) = (Scope::new(SCOPE), Key::new("wake-1").unwrap());
    let (claimed_tx, claimed_rx) = tokio::sync::oneshot::channel();
    let (finish_tx, finish_rx) = tokio::sync::oneshot::channel::<()>();
    let running = {
        let owner = owner.clone();
        tokio::spawn(async move {
            run::<_, i64, Error, _, _>(&owner, Call::new(SCOPE, "wake-1", &1), async {
                claimed_tx.send(()).unwrap();
                finish_rx.await.unwrap();
                Ok(7)
            })
            .await
        })
    };
    claimed_rx.await.unwrap();
    let waiting = {
        let waiter = waiter.clone();
        let (scope, key) = (scope.clone(), key.clone());
        tokio::spawn(async move {
            let started = Instant::now();
            waiter
                .capabilities()
                .waker()
                .wait_for_change(&scope, &key, Duration::from_secs(60))
                .await
                .unwrap();
            started.elapsed()
        })
    };
    // The waiter subscribed and looked: the record says it waits.
    tokio::time::sleep(Duration::from_millis(300)).await;
    assert!(
        waiter.capabilities().waker().wakes_across_processes(),
        "the waiter's store is not listening"
    );
    finish_tx.send(()).unwrap();
    assert_eq!(running.await.unwrap().unwrap(), 7);
    let waited = tokio::time::timeout(Duration::from_secs(20), waiting)
        .await
        .expect("the waiter was not woken by the completion")
        .unwrap();
    assert!(waited < Duration::from_secs(20), "woken after {waited:?}");
    // And a duplicate now replays.
    let replayed = run::<_, i64, Error, _, _>(&waiter, Call::new(SCOPE, "wake-1", &1), async {
        panic!("the body ran again")
    })
    .await
    .unwrap();
    assert_eq!(replayed, 7);
}

/// The local ports of this process's TCP connections to `port` on
/// 127.0.0.1, from /proc: the sockets of its file descriptors, looked up
/// in the kernel's table of TCP connections.
fn own_connections_to(port: u16) -> Vec<u16> {
    let mut inodes = std::collections::HashSet::new();
    for fd in std::fs::read_dir("/proc/self/fd")
        .expect("/proc/self/fd")
        .flatten()
    {
        if let Ok(target) = std::fs::read_link(fd.path()) {
            let target = target.to_string_lossy().into_owned();
            if let Some(inode) = target
                .strip_prefix("socket:[")
                .and_then(|s| s.strip_suffix(']'))
            {
                inodes.insert(inode.to_owned());
            }
        }
    }
    let table = std::fs::read_to_string("/proc/net/tcp").expect("/proc/net/tcp");
    let mut ports = Vec::new();
    for line in table.lines().skip(1) {
        let fields: Vec<&str> = line.split_whitespace().collect();
        let (Some(local), Some(remote), Some(inode)) =
            (fields.get(1), fields.get(2), fields.get(9))
        else {
            continue;
        };
        let port_of = |addr: &str| {
            addr.split_once(':')
                .and_then(|(_, p)| u16::from_str_radix(p, 16).ok())
        };
        if inodes.contains(*inode) && port_of(remote) == Some(port) {
            if let Some(local) = port_of(local) {
                ports.push(local);
            }
        }
    }
    ports
}

/// The ports of the servers a store of `redis` talks to.
async fn server_ports(redis: Redis) -> Vec<u16> {
    match redis {
        Redis::Single => {
            let url = redis.url();
            let port = url
                .rsplit(':')
                .next()
                .and_then(|p| p.trim_end_matches('/').parse().ok())
                .unwrap_or(6379);
            vec![port]
        }
        Redis::Cluster => {
            let mut conn = redis.conn().await;
            let nodes: String = redis::cmd("CLUSTER")
                .arg("NODES")
                .query_async(&mut conn)
                .await
                .unwrap();
            nodes
                .lines()
                .filter_map(|line| line.split_whitespace().nth(1))
                .filter_map(|addr| addr.split('@').next()?.rsplit(':').next()?.parse().ok())
                .collect()
        }
    }
}

/// Kills, on every server, each connection this process has to it
/// (`CLIENT KILL ADDR`), from a connection opened for it and closed after.
/// Answers how many were killed.
async fn kill_own_connections(redis: Redis) -> usize {
    let mut killed = 0;
    for port in server_ports(redis).await {
        let mut admin = redis::Client::open(format!("redis://127.0.0.1:{port}"))
            .unwrap()
            .get_multiplexed_async_connection()
            .await
            .unwrap();
        let own = own_connections_to(port);
        for local in own {
            let answer: Result<(), _> = redis::cmd("CLIENT")
                .arg("KILL")
                .arg("ADDR")
                .arg(format!("127.0.0.1:{local}"))
                .query_async(&mut admin)
                .await;
            // The admin connection itself, or one closed meanwhile.
            if answer.is_ok() {
                killed += 1;
            }
        }
    }
    killed
}

/// Bodies running while the server kills every connection of this
/// process, twice: each caller gets its own body's value, the outcomes
/// are stored once the connections are back, and retries replay them.
async fn killed_connections(redis: Redis) {
    const KEYS_KILLED: usize = 8;
    let prefix = unique_prefix("kill");
    let _keys = DeleteKeys {
        redis,
        prefix: prefix.clone(),
    };
    let store = redis.store(&prefix).await;
    let runs = Arc::new(std::sync::atomic::AtomicUsize::new(0));
    let (go_tx, _) = tokio::sync::broadcast::channel::<()>(1);
    let started = Arc::new(Barrier::new(KEYS_KILLED + 1));
    let calls: Vec<_> = (0..KEYS_KILLED)
        .map(|k| {
            let (store, runs, started) = (store.clone(), runs.clone(), started.clone());
            let mut go = go_tx.subscribe();
            tokio::spawn(async move {
                let key = format!("kill-{k}");
                run::<_, usize, Error, _, _>(
                    &store,
                    Call::new(SCOPE, &key, &k).with_policy(policy().lease(Duration::from_secs(20))),
                    async move {
                        runs.fetch_add(1, std::sync::atomic::Ordering::SeqCst);
                        started.wait().await;
                        let _ = go.recv().await;
                        Ok(k * 10)
                    },
                )
                .await
            })
        })
        .collect();
    started.wait().await;
    let killed = kill_own_connections(redis).await;
    assert!(
        killed > 0,
        "no connection of this process was found to kill"
    );
    go_tx.send(()).unwrap();
    // The completions race the reconnection; kill again while they run.
    tokio::time::sleep(Duration::from_millis(5)).await;
    kill_own_connections(redis).await;
    for (k, call) in calls.into_iter().enumerate() {
        let value = call
            .await
            .unwrap()
            .unwrap_or_else(|err| panic!("caller {k} got an error though its body ran: {err}"));
        assert_eq!(value, k * 10);
    }
    // Retries, on a connection of their own, replay every outcome once it
    // is stored (within the lease).
    let other = redis.store(&prefix).await;
    for k in 0..KEYS_KILLED {
        let key = format!("kill-{k}");
        let replayed = run::<_, usize, Error, _, _>(
            &other,
            Call::new(SCOPE, &key, &k).with_policy(policy()),
            async { panic!("a body ran twice") },
        )
        .await
        .unwrap();
        assert_eq!(replayed, k * 10);
    }
    assert_eq!(runs.load(std::sync::atomic::Ordering::SeqCst), KEYS_KILLED);
}

/// Scripts the server forgot (`SCRIPT FLUSH`, as after a restart or a
/// failover) are loaded again by the next call, which succeeds.
async fn flushed_scripts_are_loaded_again(redis: Redis) {
    let prefix = unique_prefix("flush");
    let _keys = DeleteKeys {
        redis,
        prefix: prefix.clone(),
    };
    let store = redis.store(&prefix).await;
    assert_eq!(charge(&store, redis, "flush-1").await.unwrap(), 1);
    let mut conn = redis.conn().await;
    // On a cluster, SCRIPT FLUSH goes to every primary.
    redis::cmd("SCRIPT")
        .arg("FLUSH")
        .query_async::<()>(&mut conn)
        .await
        .unwrap();
    assert_eq!(charge(&store, redis, "flush-1").await.unwrap(), 1);
    assert_eq!(charge(&store, redis, "flush-2").await.unwrap(), 1);
}

/// With replicas asked for and none to acknowledge (a single Redis has
/// none), a claim is handed back and fails with a store error: the body
/// does not run, and the key is free for a call without the option.
async fn an_unreplicated_claim_runs_nothing(redis: Redis) {
    let prefix = unique_prefix("unreplicated");
    let _keys = DeleteKeys {
        redis,
        prefix: prefix.clone(),
    };
    let durable = redis
        .store(&prefix)
        .await
        .wait_for_replicas(3, Duration::from_millis(50));
    let ran = Arc::new(std::sync::atomic::AtomicBool::new(false));
    let flag = ran.clone();
    let err = run::<_, i64, Error, _, _>(&durable, Call::new(SCOPE, "lonely", &1), async move {
        flag.store(true, std::sync::atomic::Ordering::SeqCst);
        Ok(1)
    })
    .await
    .unwrap_err();
    assert!(
        matches!(err, Error::Store(_)) && err.to_string().contains("replica"),
        "{err}"
    );
    assert!(!ran.load(std::sync::atomic::Ordering::SeqCst));
    let plain = redis.store(&prefix).await;
    assert!(plain
        .get(&Scope::new(SCOPE), &Key::new("lonely").unwrap())
        .await
        .unwrap()
        .is_none());
    assert_eq!(charge(&plain, redis, "lonely").await.unwrap(), 1);
}

/// With replicas asked for and none to acknowledge, every write that a
/// later decision reads fails with a store error, though the primary has
/// it: a release, a forget, a step's start, a step's completion and an
/// operator's resolution (`wait_for_replicas` lists them). A step's start
/// not acknowledged is put back as the entry was: a fresh one is gone.
async fn unreplicated_writes_fail(redis: Redis) {
    use idem::journal::{StepAt, StepBegin, StepResolution, StepRun};
    use idem::record::{Begin, ClaimToken};
    use idem::store::BeginRequest;
    use idem::Fingerprint;

    let prefix = unique_prefix("unreplicated-writes");
    let _keys = DeleteKeys {
        redis,
        prefix: prefix.clone(),
    };
    let plain = redis.store(&prefix).await;
    let durable = redis
        .store(&prefix)
        .await
        .wait_for_replicas(3, Duration::from_millis(50));
    let scope = Scope::new(SCOPE);
    let fingerprint = Fingerprint::of_bytes(b"payload");
    let (key, other) = (Key::new("writes").unwrap(), Key::new("released").unwrap());
    let claim = |key| {
        let plain = &plain;
        let (scope, fingerprint) = (&scope, &fingerprint);
        async move {
            let request = BeginRequest {
                scope,
                key,
                fingerprint,
                token: ClaimToken::new(),
                lease: Duration::from_millis(300),
                ttl: Duration::from_secs(60),
            };
            match plain.begin(&request).await {
                Ok(Begin::Claimed(claim)) => claim,
                other => panic!("a claim: {other:?}"),
            }
        }
    };
    let step = |claim, seq, name| {
        common::step_request(
            claim,
            (seq, name),
            &fingerprint,
            Duration::from_secs(60),
            false,
        )
    };
    let unreplicated = |what: &str, result: Result<(), Error>| {
        assert!(
            matches!(&result, Err(Error::Store(e)) if e.to_string().contains("replica")),
            "{what}, which no replica acknowledged: {result:?}"
        );
    };
    let held = claim(&key).await;
    unreplicated(
        "a step's start",
        journal_of(&durable)
            .begin_step(&step(&held, 0, "charge"))
            .await
            .map(drop),
    );
    // Put back: the entry is fresh again, not this attempt's start.
    assert_eq!(
        journal_of(&plain)
            .begin_step(&step(&held, 0, "charge"))
            .await
            .unwrap(),
        StepBegin::Run(StepRun::Fresh),
        "a start no replica acknowledged was left in the journal"
    );
    unreplicated(
        "a step's completion",
        journal_of(&durable)
            .complete_step(&step(&held, 0, "charge"), b"1")
            .await,
    );
    assert_eq!(
        journal_of(&plain)
            .begin_step(&step(&held, 1, "email"))
            .await
            .unwrap(),
        StepBegin::Run(StepRun::Fresh)
    );
    // The attempt is gone (its lease ran out): the step is in doubt, for
    // an operator.
    tokio::time::sleep(Duration::from_millis(400)).await;
    unreplicated(
        "an operator's resolution",
        journal_of(&durable)
            .resolve_step(
                &StepAt {
                    scope: &scope,
                    key: &key,
                    seq: 1,
                    name: "email",
                },
                &StepResolution::Rerun,
            )
            .await
            .map(drop),
    );
    let released = claim(&other).await;
    unreplicated("a release", durable.release(&released).await);
    unreplicated("a forget", durable.forget(&scope, &key).await.map(drop));
}

/// A step's start that no replica acknowledged is undone only while the
/// entry is still that start: not once the journal was forgotten
/// meanwhile (nothing comes back), nor once another attempt took the step
/// over (its start stays).
async fn an_unreplicated_start_is_undone_only_while_it_is_its_own(redis: Redis) {
    use idem::journal::StepState;
    use idem::record::{Begin, Claim, ClaimToken};
    use idem::store::BeginRequest;
    use idem::Fingerprint;

    let prefix = unique_prefix("unreplicated-undo");
    let _keys = DeleteKeys {
        redis,
        prefix: prefix.clone(),
    };
    let plain = redis.store(&prefix).await;
    // A `WAIT` long enough for the other writes to land meanwhile.
    let durable = redis
        .store(&prefix)
        .await
        .wait_for_replicas(3, Duration::from_millis(400));
    let scope = Scope::new(SCOPE);
    let fingerprint = Fingerprint::of_bytes(b"payload");
    let claim = |key: &'static str| {
        let plain = &plain;
        let (scope, fingerprint) = (&scope, &fingerprint);
        async move {
            let key = Key::new(key).unwrap();
            let request = BeginRequest {
                scope,
                key: &key,
                fingerprint,
                token: ClaimToken::new(),
                lease: Duration::from_millis(100),
                ttl: Duration::from_secs(60),
            };
            match plain.begin(&request).await {
                Ok(Begin::Claimed(claim)) => claim,
                other => panic!("a claim: {other:?}"),
            }
        }
    };
    let ttl = Duration::from_secs(60);
    let fingerprint = &fingerprint;
    // An attempt that started the step and is gone; the next one adopts
    // the step through the store that waits for replicas.
    let adopting = |key: &'static str| {
        let (plain, claim) = (&plain, &claim);
        async move {
            let gone = claim(key).await;
            journal_of(&plain)
                .begin_step(&common::step_request(
                    &gone,
                    (0, "charge"),
                    fingerprint,
                    ttl,
                    false,
                ))
                .await
                .unwrap();
            tokio::time::sleep(Duration::from_millis(150)).await;
            let next: Claim = claim(key).await;
            (gone, next)
        }
    };

    // The journal is forgotten while the start waits for its replicas.
    let (_, next) = adopting("forgotten").await;
    let adopt = common::step_request(&next, (0, "charge"), fingerprint, ttl, true);
    let started = journal_of(&durable).begin_step(&adopt);
    let forget = async {
        tokio::time::sleep(Duration::from_millis(100)).await;
        plain.forget(&scope, &next.key).await.unwrap();
    };
    let (started, ()) = tokio::join!(started, forget);
    assert!(matches!(started, Err(Error::Store(_))), "{started:?}");
    let steps = journal_of(&plain).steps(&scope, &next.key).await;
    assert!(
        matches!(&steps, Ok(steps) if steps.is_empty()),
        "a forgotten journal came back: {steps:?}"
    );

    // Another attempt takes the step over while the start waits.
    let (_, next) = adopting("taken-over").await;
    let adopt = common::step_request(&next, (0, "charge"), fingerprint, ttl, true);
    let started = journal_of(&durable).begin_step(&adopt);
    let take_over = async {
        tokio::time::sleep(Duration::from_millis(200)).await;
        let third = claim("taken-over").await;
        journal_of(&plain)
            .begin_step(&common::step_request(
                &third,
                (0, "charge"),
                fingerprint,
                ttl,
                true,
            ))
            .await
            .unwrap();
        third
    };
    let (started, third) = tokio::join!(started, take_over);
    assert!(matches!(started, Err(Error::Store(_))), "{started:?}");
    let steps = journal_of(&plain).steps(&scope, &third.key).await.unwrap();
    assert_eq!(steps.len(), 1);
    assert_eq!(steps[0].state, StepState::Started);
    assert_eq!(
        steps[0].token, third.token,
        "the start of the attempt that took the step over was undone"
    );
}

/// The benchmark's reference sends the store's own scripts: the record a
/// reference first execution writes is one the store replays (the body
/// does not run again, and its outcome comes back), and the reference's
/// replay reads it; a second reference claim of the key is refused.
async fn the_reference_writes_what_the_store_reads(redis: Redis) {
    let prefix = unique_prefix("reference");
    let _keys = DeleteKeys {
        redis,
        prefix: prefix.clone(),
    };
    let store = redis.store(&prefix).await;
    let (scope, key) = (Scope::new(SCOPE), Key::new("ref-1").unwrap());
    let fingerprint = idem::Fingerprint::of(&1).unwrap();
    let request = || idem::store::BeginRequest {
        scope: &scope,
        key: &key,
        fingerprint: &fingerprint,
        token: idem::record::ClaimToken::new(),
        lease: Policy::DEFAULT_LEASE,
        ttl: Policy::DEFAULT_TTL,
    };
    assert!(store.reference_replay(&request()).await.is_err());
    let outcome = idem::record::Outcome {
        kind: idem::record::OutcomeKind::Ok,
        body: b"41".to_vec(),
    };
    let mut ran = false;
    store
        .reference_first_execution(&request(), async { ran = true }, &outcome)
        .await
        .unwrap();
    assert!(ran);
    store.reference_replay(&request()).await.unwrap();
    assert!(store
        .reference_first_execution(&request(), async {}, &outcome)
        .await
        .is_err());
    let replayed = run::<_, i64, Error, _, _>(&store, Call::new(SCOPE, "ref-1", &1), async {
        panic!("the reference's record was not replayed")
    })
    .await
    .unwrap();
    assert_eq!(replayed, 41);
}

/// The tests that kill this process's connections run one at a time, and
/// not beside the others of this binary, whose connections they would
/// kill too.
static EXCLUSIVE: tokio::sync::RwLock<()> = tokio::sync::RwLock::const_new(());

macro_rules! on_redis {
    ($($name:ident: $redis:expr;)*) => {$(
        mod $name {
            use super::*;

            const REDIS: Redis = $redis;

            #[tokio::test(flavor = "multi_thread", worker_threads = 4)]
            async fn storm_runs_each_key_once() {
                let _shared = EXCLUSIVE.read().await;
                storm_in_one_process(REDIS).await;
            }

            #[tokio::test(flavor = "multi_thread", worker_threads = 4)]
            async fn storm_across_processes_runs_each_key_once() {
                if let Ok(spec) = std::env::var(CHILD_VAR) {
                    return storm_child(&spec).await;
                }
                let _shared = EXCLUSIVE.read().await;
                let test = concat!(module_path!(), "::storm_across_processes_runs_each_key_once");
                storm_across_processes(REDIS, common::test_name(test)).await;
            }

            #[tokio::test(flavor = "multi_thread", worker_threads = 2)]
            async fn a_waiter_elsewhere_is_woken_by_the_completion() {
                let _shared = EXCLUSIVE.read().await;
                a_waiter_elsewhere_is_woken(REDIS).await;
            }

            #[tokio::test(flavor = "multi_thread", worker_threads = 2)]
            async fn flushed_scripts_are_loaded_again() {
                let _alone = EXCLUSIVE.write().await;
                super::flushed_scripts_are_loaded_again(REDIS).await;
            }

            #[tokio::test(flavor = "multi_thread", worker_threads = 2)]
            async fn an_unreplicated_claim_runs_nothing() {
                let _shared = EXCLUSIVE.read().await;
                super::an_unreplicated_claim_runs_nothing(REDIS).await;
            }

            #[tokio::test(flavor = "multi_thread", worker_threads = 2)]
            async fn unreplicated_writes_fail() {
                let _shared = EXCLUSIVE.read().await;
                super::unreplicated_writes_fail(REDIS).await;
            }

            #[tokio::test(flavor = "multi_thread", worker_threads = 2)]
            async fn an_unreplicated_start_is_undone_only_while_it_is_its_own() {
                let _shared = EXCLUSIVE.read().await;
                super::an_unreplicated_start_is_undone_only_while_it_is_its_own(REDIS).await;
            }

            #[tokio::test(flavor = "multi_thread", worker_threads = 2)]
            async fn the_benchmark_reference_writes_what_the_store_reads() {
                let _shared = EXCLUSIVE.read().await;
                the_reference_writes_what_the_store_reads(REDIS).await;
            }

            #[tokio::test(flavor = "multi_thread", worker_threads = 2)]
            async fn killed_connections_lose_no_outcome_and_run_nothing_twice() {
                let _alone = EXCLUSIVE.write().await;
                killed_connections(REDIS).await;
            }
        }
    )*};
}

on_redis! {
    single: Redis::Single;
    cluster: Redis::Cluster;
}
