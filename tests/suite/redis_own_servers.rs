//! The Redis store on Redis servers the tests start themselves (on
//! 127.0.0.1:7310-7319, no persistence, killed when the test ends, even
//! when it fails), where a test kills, promotes or reconfigures a server:
//!
//! - a replica promoted in place of its primary (`REPLICAOF NO ONE`, the
//!   old primary then killed with SIGKILL): with
//!   `RedisStore::wait_for_replicas`, a refusing step's start marker is on
//!   the replica before the step's call runs, so a retry on the promoted
//!   replica never charges a second time;
//! - a claim, a step's start or a completion sent again (its answer lost)
//!   on another connection is not taken for durable while no replica
//!   acknowledged it;
//! - an outcome larger than the server's `proto-max-bulk-len`: the first
//!   caller gets its value, and the key answers `Unrecorded` at once
//!   instead of staying in progress.
#![cfg(feature = "redis")]

use crate::common::journal_of;
use std::sync::atomic::{AtomicBool, AtomicUsize, Ordering};
use std::time::{Duration, Instant};

use crate::common::own_redis::{primary_and_replica, promote, Server};

use idem::steps::Step;
use idem::{run, Call, Error, Policy, RedisStore};

/// The downstream of the steps: counts its charges.
#[derive(Default)]
struct Gateway {
    charges: AtomicUsize,
}

const LEASE: Duration = Duration::from_millis(600);

/// One attempt of a payment whose body is one refusing step "charge";
/// `during` runs inside the step's call, after the charge.
async fn pay(
    store: &RedisStore,
    key: &str,
    gateway: &Gateway,
    during: impl std::future::Future<Output = ()> + Send,
) -> Result<String, Error> {
    let call = Call::new("own_servers.pay", key, &500u64)
        .with_policy(Policy::new().lease(LEASE).wait(Duration::from_secs(5)));
    run(store, call, async move {
        Step::new("charge")
            .refuse()
            .run(|_key| async move {
                let n = gateway.charges.fetch_add(1, Ordering::SeqCst) + 1;
                during.await;
                Ok::<_, Error>(format!("ch_{n}"))
            })
            .await
    })
    .await
}

/// The retry of a client whose first attempt's primary failed over: on
/// the promoted replica, once the first attempt's lease has passed.
async fn retry_on(promoted: &Server, key: &str, gateway: &Gateway) -> Result<String, Error> {
    tokio::time::sleep(LEASE + Duration::from_millis(200)).await;
    let store = RedisStore::connect(&promoted.url())
        .await
        .expect("connect to the promoted replica");
    pay(&store, key, gateway, async {}).await
}

/// `wait_for_replicas(1, ..)` promised that a step's start marker, as a
/// claim and a completion, is on a replica before the store answers; the
/// marker alone was written without `WAIT`, so a failover right after a
/// refusing step had started could lose it, and the retry on the promoted
/// replica, finding no entry, charged again: two charges where the policy
/// promises `OutcomeUnknown`.
///
/// 1. The claim lands and reaches the replica (`WAIT`).
/// 2. The replica is promoted in place of the primary before the step
///    begins: the primary's later writes are on the primary alone.
/// 3. The step begins on the old primary; once the attempt has ended, the
///    old primary is killed (SIGKILL), with whatever only it had.
/// 4. Once the lease has passed, the client retries on the promoted
///    replica.
///
/// Expected: exactly one charge. The step's start is not acknowledged by
/// any replica, so its call does not run on the first attempt (which
/// fails with a store error), and the retry, which finds no entry,
/// charges once. (Before the fix, the call ran on the unreplicated
/// marker, and the retry charged again.)
///
/// And with the replica promoted only after the marker (inside the
/// step's call, after the charge): the marker is there, and the retry
/// gets `OutcomeUnknown`, with one charge.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_failover_never_loses_a_started_step() {
    let _failovers = crate::common::FAILOVERS.lock().await;
    // The replica promoted before the step begins.
    {
        let (mut primary, replica) = primary_and_replica(7310).await;
        let store = RedisStore::connect(&primary.url())
            .await
            .expect("connect to the test's primary")
            .wait_for_replicas(1, Duration::from_millis(300));
        let gateway = Gateway::default();
        let key = "promoted-before-the-step";
        let promoted = AtomicBool::new(false);
        let first = {
            let call = Call::new("own_servers.pay", key, &500u64)
                .with_policy(Policy::new().lease(LEASE).wait(Duration::from_secs(5)));
            let (replica, gateway, promoted) = (&replica, &gateway, &promoted);
            run(&store, call, async move {
                // The claim is on the replica: promote it now.
                promote(replica).await;
                promoted.store(true, Ordering::SeqCst);
                Step::new("charge")
                    .refuse()
                    .run(|_key| async move {
                        let n = gateway.charges.fetch_add(1, Ordering::SeqCst) + 1;
                        Ok::<_, Error>(format!("ch_{n}"))
                    })
                    .await
            })
            .await
        };
        assert!(promoted.load(Ordering::SeqCst), "the body did not run");
        primary.kill();
        drop(store);
        let retry = retry_on(&replica, key, &gateway).await;
        assert_eq!(
            gateway.charges.load(Ordering::SeqCst),
            1,
            "charged twice across a failover (first attempt: {first:?}, retry: {retry:?})"
        );
        // The first attempt's step never started: the retry charged, and
        // got its value.
        assert!(
            matches!(first, Err(Error::Store(_))),
            "the first attempt: {first:?}"
        );
        assert_eq!(retry.ok().as_deref(), Some("ch_1"));
    }
    // The replica promoted after the marker, inside the step's call.
    {
        let (mut primary, replica) = primary_and_replica(7312).await;
        let store = RedisStore::connect(&primary.url())
            .await
            .expect("connect to the test's primary")
            .wait_for_replicas(1, Duration::from_millis(300));
        let gateway = Gateway::default();
        let key = "promoted-after-the-marker";
        let first = pay(&store, key, &gateway, promote(&replica)).await;
        primary.kill();
        drop(store);
        let retry = retry_on(&replica, key, &gateway).await;
        assert_eq!(
            gateway.charges.load(Ordering::SeqCst),
            1,
            "charged twice across a failover (first attempt: {first:?}, retry: {retry:?})"
        );
        assert!(
            matches!(retry, Err(Error::OutcomeUnknown { .. })),
            "the retry after a failover that kept the marker: {retry:?}"
        );
    }
}

/// An outcome larger than the server takes (`proto-max-bulk-len`) was
/// refused as if the connection had failed: the completion was sent
/// again every second for ever, the lease renewed, and every retry got
/// `InProgress`. The store classifies the server's refusal as permanent
/// (`Error::Unrecorded`), so the engine stores the small outcome that
/// answers `Unrecorded` instead.
///
/// Expected: the first caller gets its 2 MiB value, the record is
/// completed (not in progress), a retry gets `Unrecorded` at once, and
/// the body ran once.
///
/// The server answers `CONFIG GET`: the store asks it first and never
/// sends the outcome, so the server never closes the store's connection
/// (a refusal for length closes it, failing every command on it).
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn an_outcome_too_large_for_the_server_is_unrecorded() {
    let _failovers = crate::common::FAILOVERS.lock().await;
    let server = Server::start(7314, &["--proto-max-bulk-len", "1mb"]).await;
    let store = RedisStore::connect(&server.url())
        .await
        .expect("connect to the test's Redis");
    let before = connections_received(&server).await;
    too_large_is_unrecorded(&store).await;
    // Only the connection that asks this was opened since.
    assert_eq!(
        connections_received(&server).await - before,
        1,
        "the server closed the store's connection: the outcome was sent"
    );
}

/// As above, on a server that does not answer `CONFIG` (renamed away, as
/// managed services do): the store cannot ask first, sends the outcome,
/// and recognizes the server's refusal as permanent.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn an_outcome_too_large_for_a_server_without_config_is_unrecorded() {
    let _failovers = crate::common::FAILOVERS.lock().await;
    let server = Server::start(
        7318,
        &[
            "--proto-max-bulk-len",
            "1mb",
            "--rename-command",
            "CONFIG",
            "",
        ],
    )
    .await;
    let store = RedisStore::connect(&server.url())
        .await
        .expect("connect to the test's Redis");
    too_large_is_unrecorded(&store).await;
}

/// How many connections the server has accepted since it started.
async fn connections_received(server: &Server) -> u64 {
    let stats = server.info("stats").await;
    stats
        .lines()
        .find_map(|line| line.strip_prefix("total_connections_received:"))
        .and_then(|n| n.trim().parse().ok())
        .unwrap_or_else(|| panic!("no total_connections_received in {stats}"))
}

/// A 2 MiB outcome on a server that takes at most 1 MiB: the first caller
/// gets its value, the key answers `Unrecorded` at once, the body ran
/// once, and the store goes on working.
async fn too_large_is_unrecorded(store: &RedisStore) {
    let runs = AtomicUsize::new(0);
    let big = "x".repeat(2 << 20);
    let call = |key: &'static str| {
        Call::new("own_servers.export", key, &1u64).with_policy(
            Policy::new()
                .lease(Duration::from_secs(2))
                .wait(Duration::from_secs(1)),
        )
    };
    let body = || async {
        runs.fetch_add(1, Ordering::SeqCst);
        Ok::<_, Error>(big.clone())
    };
    let started = Instant::now();
    let first = tokio::time::timeout(
        Duration::from_secs(30),
        run(store, call("too-large"), body()),
    )
    .await
    .expect("the first caller did not get its value within 30 s");
    assert_eq!(first.as_ref().map(String::len).ok(), Some(big.len()));
    let first_took = started.elapsed();
    let retried = Instant::now();
    let retry = run(store, call("too-large"), body()).await;
    assert!(
        matches!(retry, Err(Error::Unrecorded(_))),
        "the retry of a key whose outcome the server refused: {retry:?} \
         (the first caller took {first_took:?})"
    );
    assert!(
        retried.elapsed() < Duration::from_millis(500),
        "the retry took {:?}",
        retried.elapsed()
    );
    let record = idem::Store::get(
        store,
        &idem::Scope::new("own_servers.export"),
        &idem::Key::new("too-large").unwrap(),
    )
    .await
    .expect("read the record");
    assert_eq!(
        record.map(|r| r.state),
        Some(idem::record::State::Completed),
        "the key is not completed"
    );
    assert_eq!(runs.load(Ordering::SeqCst), 1, "the body ran again");
    // The connection the refusal dropped is back: a small outcome is
    // stored as usual.
    let small = run(store, call("small"), async {
        Ok::<_, Error>("ok".to_owned())
    })
    .await;
    assert_eq!(small.ok().as_deref(), Some("ok"));
}

/// A write sent again after its answer was lost (here: by another store,
/// on a connection of its own, as after a reconnection) finds its record
/// or entry already written by the same attempt and writes nothing. A
/// step's start sent again was answered "run" without `WAIT`, though no
/// replica had the marker; a claim and a completion sent again must not
/// be taken for durable either.
///
/// The replica is stopped (SIGSTOP: still connected, acknowledging
/// nothing); the first sending of each write goes through a store
/// without `WAIT`, the second through one with `WAIT 1`.
///
/// Expected: each second sending fails with a store error (not
/// acknowledged).
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_write_sent_again_waits_for_its_replica() {
    let _failovers = crate::common::FAILOVERS.lock().await;
    use idem::journal::{StepBegin, StepRequest};
    use idem::record::BeginRequest;
    use idem::record::{Begin, ClaimToken, Outcome, OutcomeKind};
    use idem::{Fingerprint, Key, Scope, Store};

    let (primary, replica) = primary_and_replica(7316).await;
    let once = RedisStore::connect(&primary.url())
        .await
        .expect("connect to the test's primary");
    let again = RedisStore::connect(&primary.url())
        .await
        .expect("connect to the test's primary")
        .wait_for_replicas(1, Duration::from_millis(300));
    let scope = Scope::new("own_servers.again");
    let fingerprint = Fingerprint::of_bytes(b"payload");
    let (first, second) = (Key::new("first").unwrap(), Key::new("second").unwrap());
    let request = |key| BeginRequest {
        scope: &scope,
        key,
        fingerprint: &fingerprint,
        token: ClaimToken::new(),
        lease: Duration::from_secs(30),
        ttl: Duration::from_secs(60),
    };
    let (first, second) = (request(&first), request(&second));
    let claim = |begin| match begin {
        Ok(Begin::Claimed(claim)) => claim,
        other => panic!("a claim: {other:?}"),
    };
    let claim_first = claim(once.begin(&first).await);
    replica.signal("STOP");
    // A claim sent again.
    let claimed = once.begin(&second).await;
    assert!(matches!(claimed, Ok(Begin::Claimed(_))), "{claimed:?}");
    let claimed_again = again.begin(&second).await;
    // A step's start sent again.
    let step = StepRequest {
        claim: &claim_first,
        seq: 0,
        name: "charge",
        fingerprint: &fingerprint,
        ttl: Duration::from_secs(60),
        adopt: false,
        settle: Duration::ZERO,
    };
    let started = journal_of(&once).begin_step(&step).await;
    assert!(matches!(started, Ok(StepBegin::Run(_))), "{started:?}");
    let started_again = journal_of(&again).begin_step(&step).await;
    // A completion sent again.
    let outcome = Outcome {
        kind: OutcomeKind::Ok,
        body: b"42".to_vec(),
    };
    let completed = once.complete(&claim_first, &outcome).await;
    assert!(completed.is_ok(), "{completed:?}");
    let completed_again = again.complete(&claim_first, &outcome).await;
    replica.signal("CONT");
    assert!(
        matches!(claimed_again, Err(Error::Store(_))),
        "a claim sent again, which no replica has: {claimed_again:?}"
    );
    assert!(
        matches!(started_again, Err(Error::Store(_))),
        "a step's start sent again, which no replica has: {started_again:?}"
    );
    assert!(
        matches!(completed_again, Err(Error::Store(_))),
        "a completion sent again, which no replica has: {completed_again:?}"
    );
}
