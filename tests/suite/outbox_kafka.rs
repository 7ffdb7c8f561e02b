//! The outbox relayed to a real Kafka-protocol broker, under faults. A
//! consumer on the other side deduplicates on the `idem-message-id`
//! header (`idem::consumer`) and counts both sides: the records the broker
//! holds, and the effects.
//!
//! - App killed: a process commits orders (each with its message in the
//!   outbox) and is SIGKILLed before any relay produced; a relay started
//!   after it produces every message once: one record, one effect each.
//! - Relay killed between produce and mark: a relay process produces a
//!   batch, the broker acknowledges it, and the process is SIGKILLed
//!   before it marks; after its lease, the next relay produces the batch
//!   again. The broker holds two records per message, the consumer's
//!   dedupe answers the second a duplicate: one effect each.
//! - Broker connection broken: the relay reaches a broker of the test's
//!   own through a TCP proxy that cuts every connection and refuses new
//!   ones for a while as messages are relayed; every message reaches the
//!   broker, one effect each.
//! - Two relays race on one outbox (PostgreSQL and MariaDB): each message
//!   is produced once (one record each: no row was relayed by both), and
//!   nothing is lost.
//!
//! The broker is `IDEM_KAFKA_BROKERS` or the local `127.0.0.1:9092` (run
//! by `.ci/kafka-broker start`); the broker of the connection test is
//! the Tansu binary `.ci/kafka-broker install` caches
//! (`IDEM_KAFKA_CACHE`, default `/var/cache/idem-kafka`).

use crate::common;
use common::kafka::{brokers, Topic};

use std::collections::BTreeMap;
use std::net::SocketAddr;
use std::process::Stdio;
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::Arc;
use std::time::{Duration, Instant};

use idem::consumer::kafka::{identify, KeyFrom};
use idem::consumer::{Deduplicator, Handled};
use idem::outbox::kafka::KafkaRelay;
use idem::outbox::{Message as OutboxMessage, Outbox, MESSAGE_ID_HEADER};
use idem::store::SqlStore;
use idem::{run, Call, Error, MemoryStore};
use rdkafka::consumer::{Consumer, StreamConsumer};
use rdkafka::ClientConfig;
use tokio::io::{AsyncBufReadExt, BufReader};
use tokio::net::{TcpListener, TcpStream};
use tokio::sync::watch;

const CHILD_VAR: &str = "IDEM_OUTBOX_CHILD";
const SCOPE: &str = "shop.order";
/// The longest a test waits for the broker and its processes.
const WAIT: Duration = Duration::from_secs(60);

fn config(bootstrap: &str) -> ClientConfig {
    let mut config = ClientConfig::new();
    config.set("bootstrap.servers", bootstrap);
    config
}

/// Commits the orders `range`, each with its `order.created` message in
/// the outbox, in the transaction of its row.
async fn place_orders<DB: idem::store::Backend>(
    store: &SqlStore<DB>,
    outbox: &Outbox<DB>,
    topic: &str,
    range: std::ops::Range<usize>,
    mut committed: impl FnMut(usize),
) where
    SqlStore<DB>: idem::Store,
    for<'c> &'c mut DB::Connection: sqlx::Executor<'c, Database = DB>,
{
    for n in range {
        let key = format!("order-{n}");
        run(store, Call::new(SCOPE, &key, &n), async {
            let mut tx = store.pool().begin().await.map_err(Error::store)?;
            let message =
                OutboxMessage::new(topic, format!(r#"{{"order":{n}}}"#))?.with_key(key.as_str())?;
            outbox.publish(&mut tx, &message).await?;
            tx.commit().await.map_err(Error::store)?;
            Ok::<_, Error>(())
        })
        .await
        .unwrap_or_else(|err| panic!("order {n}: {err}"));
        committed(n);
    }
}

/// What the consumer saw: records on the broker, and effects per message
/// id after its dedupe.
#[derive(Debug, Default)]
struct Seen {
    records: usize,
    duplicates: usize,
    effects: BTreeMap<String, usize>,
}

/// Reads `topic` from its start through a deduplicating consumer until
/// `expected` ids had their effect and `records` records arrived (at
/// least), then a little longer for late copies.
async fn consume(topic: &Topic, expected: usize, records: usize) -> Seen {
    let consumer: StreamConsumer = config(&topic.bootstrap)
        .set("group.id", common::fresh("idem-test-outbox"))
        .set("enable.auto.commit", "false")
        .set("auto.offset.reset", "earliest")
        .create()
        .expect("a consumer");
    // Assigned, not subscribed: no group to join, which takes the test
    // broker seconds.
    let mut partitions = rdkafka::TopicPartitionList::new();
    for partition in 0..3 {
        partitions
            .add_partition_offset(&topic.name, partition, rdkafka::Offset::Beginning)
            .unwrap();
    }
    consumer.assign(&partitions).expect("assign");
    let dedupe = Deduplicator::new(MemoryStore::new(), "outbox.count");
    let by_id = KeyFrom::header(MESSAGE_ID_HEADER).unwrap();
    let mut seen = Seen::default();
    let deadline = Instant::now() + WAIT;
    loop {
        let done = seen.effects.len() >= expected && seen.records >= records;
        let wait = if done {
            Duration::from_millis(1500)
        } else {
            deadline.saturating_duration_since(Instant::now())
        };
        let record = match tokio::time::timeout(wait, consumer.recv()).await {
            Ok(record) => record.expect("a record"),
            Err(_) if done => return seen,
            Err(_) => panic!(
                "{} of {expected} messages and {} of {records} records within the bound",
                seen.effects.len(),
                seen.records
            ),
        };
        seen.records += 1;
        let id = identify(&record, &by_id).expect("every record carries its id");
        let key = id.key().as_str().to_owned();
        let handled = dedupe
            .process(id.key(), id.message(), async { Ok::<_, Error>(()) })
            .await
            .expect("dedupe");
        match handled {
            Handled::Processed(()) => *seen.effects.entry(key).or_default() += 1,
            Handled::Duplicate(()) => seen.duplicates += 1,
        }
    }
}

fn say(line: &str) {
    use std::io::Write;
    println!("{line}");
    std::io::stdout().flush().unwrap();
}

/// The child processes: `app|<db file>|<topic>|<orders>` commits the
/// orders and hangs; `relay|<db file>|<lease ms>` leases a batch,
/// produces it, and hangs before marking.
async fn child(spec: &str) {
    let fields: Vec<&str> = spec.split('|').collect();
    let store = idem::SqliteStore::connect(&format!("sqlite://{}", fields[1]))
        .await
        .expect("the SQLite file");
    let outbox = Outbox::new(&store);
    match fields[0] {
        "app" => {
            let orders: usize = fields[3].parse().unwrap();
            place_orders(&store, &outbox, fields[2], 0..orders, |n| {
                say(&format!("IDEM-OUTBOX committed {n}"))
            })
            .await;
        }
        "relay" => {
            let lease = Duration::from_millis(fields[2].parse().unwrap());
            let relay = KafkaRelay::new(outbox.clone(), &config(&brokers()))
                .unwrap()
                .with_lease(&config(&brokers()), lease)
                .unwrap();
            let leased = outbox.lease(100, lease).await.unwrap();
            let produced = relay.produce(&leased).await;
            say(&format!(
                "IDEM-OUTBOX produced {}",
                produced.acknowledged.len()
            ));
        }
        other => panic!("unknown child {other}"),
    }
    say("IDEM-OUTBOX-PAUSED");
    std::future::pending::<()>().await;
}

/// Starts this test again as a child process with `spec`, waits for it to
/// pause, and SIGKILLs it; returns what it printed.
async fn run_and_kill(test: &str, spec: &str) -> Vec<String> {
    let exe = std::env::current_exe().expect("the test binary");
    let mut child = tokio::process::Command::new(exe)
        .args([test, "--exact", "--nocapture", "--test-threads", "1"])
        .env(CHILD_VAR, spec)
        .stdout(Stdio::piped())
        .stderr(Stdio::inherit())
        .kill_on_drop(true)
        .spawn()
        .expect("start a child process");
    let mut out = BufReader::new(child.stdout.take().unwrap()).lines();
    let mut lines = Vec::new();
    let deadline = Instant::now() + WAIT;
    loop {
        let left = deadline.saturating_duration_since(Instant::now());
        match tokio::time::timeout(left, out.next_line()).await {
            Ok(Ok(Some(line))) => {
                if let Some(at) = line.find("IDEM-OUTBOX") {
                    let line = line[at..].to_owned();
                    let paused = line == "IDEM-OUTBOX-PAUSED";
                    lines.push(line);
                    if paused {
                        break;
                    }
                }
            }
            Ok(_) => panic!("the child exited before pausing: {lines:?}"),
            Err(_) => panic!("the child did not pause within the bound: {lines:?}"),
        }
    }
    child.start_kill().expect("kill the child");
    let status = child.wait().await.expect("reap the child");
    use std::os::unix::process::ExitStatusExt;
    assert_eq!(status.signal(), Some(9), "the child died of SIGKILL");
    lines
}

/// Relays until the outbox is empty.
async fn relay_all<DB: idem::store::Backend>(relay: &KafkaRelay<DB>) {
    let deadline = Instant::now() + WAIT;
    while relay.outbox().waiting().await.unwrap() > 0 {
        assert!(
            Instant::now() < deadline,
            "the outbox was not relayed within the bound"
        );
        let round = relay.relay_once().await.unwrap();
        if round.leased == 0 || round.failed > 0 {
            tokio::time::sleep(Duration::from_millis(100)).await;
        }
    }
}

fn once_each(n: usize, seen: &Seen) {
    println!(
        "outbox figures: {} messages, {} records on the broker, {} duplicates absorbed, {} effects",
        n,
        seen.records,
        seen.duplicates,
        seen.effects.values().sum::<usize>()
    );
    assert_eq!(seen.effects.len(), n, "{seen:?}");
    assert!(
        seen.effects.values().all(|&effects| effects == 1),
        "{seen:?}"
    );
}

async fn app_killed_after_commit_before_relay(test: &str) {
    let topic = Topic::create("outbox-app-killed", &brokers()).await;
    let dir = tempfile::tempdir().unwrap();
    let db = dir.path().join("shop.db").display().to_string();
    const ORDERS: usize = 8;
    let lines = run_and_kill(test, &format!("app|{db}|{}|{ORDERS}", topic.name)).await;
    assert_eq!(lines.len(), ORDERS + 1, "{lines:?}");
    let store = idem::SqliteStore::connect(&format!("sqlite://{db}"))
        .await
        .unwrap();
    let outbox = Outbox::new(&store);
    assert_eq!(outbox.waiting().await.unwrap(), ORDERS as u64);
    let relay = KafkaRelay::new(outbox, &config(&brokers())).unwrap();
    relay_all(&relay).await;
    let seen = consume(&topic, ORDERS, ORDERS).await;
    once_each(ORDERS, &seen);
    assert_eq!((seen.records, seen.duplicates), (ORDERS, 0), "{seen:?}");
}

async fn relay_killed_between_produce_and_mark(test: &str) {
    let topic = Topic::create("outbox-relay-killed", &brokers()).await;
    let dir = tempfile::tempdir().unwrap();
    let db = dir.path().join("shop.db").display().to_string();
    const ORDERS: usize = 6;
    let store = idem::SqliteStore::connect(&format!("sqlite://{db}"))
        .await
        .unwrap();
    let outbox = Outbox::new(&store);
    place_orders(&store, &outbox, &topic.name, 0..ORDERS, drop).await;
    // Its delivery timeout, half of it, stays long on a loaded machine.
    let lease = Duration::from_secs(4);
    let lines = run_and_kill(test, &format!("relay|{db}|{}", lease.as_millis())).await;
    let acknowledged: usize = lines
        .iter()
        .find_map(|line| line.strip_prefix("IDEM-OUTBOX produced "))
        .expect("the relay said what it produced")
        .parse()
        .unwrap();
    assert!(acknowledged > 0, "{lines:?}");
    // Produced, never marked: they wait, leased by the dead relay.
    assert_eq!(outbox.waiting().await.unwrap(), ORDERS as u64);
    let relay = KafkaRelay::new(outbox.clone(), &config(&brokers()))
        .unwrap()
        .with_lease(&config(&brokers()), lease)
        .unwrap();
    assert_eq!(
        relay.relay_once().await.unwrap().leased,
        0,
        "the dead relay's lease holds"
    );
    relay_all(&relay).await;
    let seen = consume(&topic, ORDERS, ORDERS + acknowledged).await;
    once_each(ORDERS, &seen);
    // Both sides: what the killed relay produced is on the broker twice
    // (a delivery it saw fail may have landed too), and in effect once.
    assert_eq!(seen.records, ORDERS + seen.duplicates, "{seen:?}");
    assert!(seen.duplicates >= acknowledged, "{seen:?}");
}

/// A TCP proxy to `upstream` with a switch: closed, it cuts every live
/// connection and refuses new ones.
struct Proxy {
    addr: SocketAddr,
    open: Arc<AtomicBool>,
    cuts: watch::Sender<u64>,
}

impl Proxy {
    async fn start(listener: TcpListener, upstream: SocketAddr) -> Proxy {
        let addr = listener.local_addr().unwrap();
        let open = Arc::new(AtomicBool::new(true));
        let (cuts, _) = watch::channel(0u64);
        tokio::spawn({
            let (open, cuts) = (open.clone(), cuts.clone());
            async move {
                loop {
                    let Ok((mut client, _)) = listener.accept().await else {
                        continue;
                    };
                    if !open.load(Ordering::SeqCst) {
                        continue;
                    }
                    let mut cut = cuts.subscribe();
                    tokio::spawn(async move {
                        let Ok(mut server) = TcpStream::connect(upstream).await else {
                            return;
                        };
                        tokio::select! {
                            _ = tokio::io::copy_bidirectional(&mut client, &mut server) => {}
                            _ = cut.changed() => {}
                        }
                    });
                }
            }
        });
        Proxy { addr, open, cuts }
    }

    fn cut(&self) {
        self.open.store(false, Ordering::SeqCst);
        self.cuts.send_modify(|n| *n += 1);
    }

    fn reopen(&self) {
        self.open.store(true, Ordering::SeqCst);
    }
}

/// A Tansu broker of the test's own on a free port, that advertises
/// `advertised` (the proxy) to its clients; killed when dropped.
async fn own_broker(advertised: SocketAddr) -> (tokio::process::Child, SocketAddr) {
    let cache =
        std::env::var("IDEM_KAFKA_CACHE").unwrap_or_else(|_| "/var/cache/idem-kafka".into());
    let bin = std::fs::read_dir(&cache)
        .ok()
        .and_then(|dir| {
            dir.filter_map(Result::ok)
                .map(|entry| entry.path())
                .find(|path| {
                    path.file_name()
                        .is_some_and(|n| n.to_string_lossy().starts_with("tansu-"))
                })
        })
        .unwrap_or_else(|| {
            panic!("no Tansu binary in {cache} (IDEM_KAFKA_CACHE): run `.ci/kafka-broker install`")
        });
    let port = TcpListener::bind("127.0.0.1:0")
        .await
        .unwrap()
        .local_addr()
        .unwrap();
    let child = tokio::process::Command::new(bin)
        .args([
            "broker",
            "--listener-url",
            &format!("tcp://{port}"),
            "--advertised-listener-url",
            &format!("tcp://{advertised}"),
            "--storage-engine",
            "memory://tansu/",
        ])
        .stdout(Stdio::null())
        .stderr(Stdio::null())
        .kill_on_drop(true)
        .spawn()
        .expect("start Tansu");
    let deadline = Instant::now() + Duration::from_secs(20);
    while TcpStream::connect(port).await.is_err() {
        assert!(
            Instant::now() < deadline,
            "the test's own broker did not come up"
        );
        tokio::time::sleep(Duration::from_millis(50)).await;
    }
    (child, port)
}

async fn broker_connection_broken_while_relaying() {
    let listener = TcpListener::bind("127.0.0.1:0").await.unwrap();
    let advertised = listener.local_addr().unwrap();
    let (_broker, upstream) = own_broker(advertised).await;
    let proxy = Proxy::start(listener, upstream).await;
    let bootstrap = proxy.addr.to_string();
    let topic = Topic::create("outbox-cut", &bootstrap).await;
    let dir = tempfile::tempdir().unwrap();
    let store = idem::SqliteStore::connect(&format!(
        "sqlite://{}",
        dir.path().join("shop.db").display()
    ))
    .await
    .unwrap();
    let outbox = Outbox::new(&store);
    const ORDERS: usize = 30;
    let relay = Arc::new(
        KafkaRelay::new(outbox.clone(), &config(&bootstrap))
            .unwrap()
            .with_lease(&config(&bootstrap), Duration::from_secs(2))
            .unwrap()
            .with_batch(4),
    );
    let relaying = tokio::spawn({
        let relay = relay.clone();
        async move { relay.run().await }
    });
    place_orders(&store, &outbox, &topic.name, 0..ORDERS / 3, drop).await;
    proxy.cut();
    place_orders(&store, &outbox, &topic.name, ORDERS / 3..ORDERS, drop).await;
    tokio::time::sleep(Duration::from_millis(2500)).await;
    assert!(
        outbox.waiting().await.unwrap() > 0,
        "the cut held messages back"
    );
    proxy.reopen();
    let deadline = Instant::now() + WAIT;
    while outbox.waiting().await.unwrap() > 0 {
        assert!(
            Instant::now() < deadline,
            "the outbox was not relayed after the cut"
        );
        tokio::time::sleep(Duration::from_millis(100)).await;
    }
    relaying.abort();
    let seen = consume(&topic, ORDERS, ORDERS).await;
    once_each(ORDERS, &seen);
    assert_eq!(seen.records, ORDERS + seen.duplicates, "{seen:?}");
}

/// Two relays on one outbox, without faults: every message is produced by
/// exactly one of them (one record each), and all are.
async fn two_relays_race<DB: idem::store::Backend>(store: SqlStore<DB>)
where
    SqlStore<DB>: idem::Store,
    for<'c> &'c mut DB::Connection: sqlx::Executor<'c, Database = DB>,
{
    let topic = Topic::create("outbox-race", &brokers()).await;
    let outbox = Outbox::new(&store);
    const ORDERS: usize = 40;
    place_orders(&store, &outbox, &topic.name, 0..ORDERS, drop).await;
    let relays: Vec<_> = (0..2)
        .map(|_| {
            let relay = KafkaRelay::new(outbox.clone(), &config(&brokers()))
                .unwrap()
                .with_batch(3);
            tokio::spawn(async move {
                let mut acknowledged = 0;
                while relay.outbox().waiting().await.unwrap() > 0 {
                    let round = relay.relay_once().await.unwrap();
                    assert_eq!(round.failed, 0);
                    acknowledged += round.acknowledged;
                    if round.leased == 0 {
                        tokio::time::sleep(Duration::from_millis(20)).await;
                    }
                }
                acknowledged
            })
        })
        .collect();
    let mut produced = Vec::new();
    for relay in relays {
        produced.push(relay.await.unwrap());
    }
    assert_eq!(produced.iter().sum::<usize>(), ORDERS, "{produced:?}");
    let seen = consume(&topic, ORDERS, ORDERS).await;
    once_each(ORDERS, &seen);
    assert_eq!((seen.records, seen.duplicates), (ORDERS, 0), "{seen:?}");
}

macro_rules! child_tests {
    ($($case:ident),*) => {$(
        #[tokio::test(flavor = "multi_thread", worker_threads = 2)]
        async fn $case() {
            if let Ok(spec) = std::env::var(CHILD_VAR) {
                return child(&spec).await;
            }
            let test = concat!(module_path!(), "::", stringify!($case));
            super::$case(common::test_name(test)).await;
        }
    )*};
}

mod killed {
    use super::*;
    child_tests!(
        app_killed_after_commit_before_relay,
        relay_killed_between_produce_and_mark
    );
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn broker_connection_broken() {
    broker_connection_broken_while_relaying().await;
}

#[cfg(feature = "postgres")]
#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn two_relays_race_on_postgres() {
    let (store, _guard) = common::backend::postgres::store(8).await;
    two_relays_race(store).await;
}

#[cfg(feature = "mysql")]
#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn two_relays_race_on_mysql() {
    let (store, _guard) = common::backend::mysql::store(8).await;
    two_relays_race(store).await;
}

/// A message the broker refuses for good (larger than the relay's
/// producer takes) is parked, the messages around it are relayed, and once
/// unparked it is relayed in its turn.
async fn a_refused_message_is_parked<DB: idem::store::Backend>(store: SqlStore<DB>)
where
    SqlStore<DB>: idem::Store,
    for<'c> &'c mut DB::Connection: sqlx::Executor<'c, Database = DB>,
{
    let topic = Topic::create("outbox-parked", &brokers()).await;
    let outbox = Outbox::new(&store);
    let sizes = [10, 5_000, 10];
    for (n, size) in sizes.iter().enumerate() {
        let key = format!("order-{n}");
        run(&store, Call::new(SCOPE, &key, &n), async {
            let mut tx = store.pool().begin().await.map_err(Error::store)?;
            let message =
                OutboxMessage::new(&topic.name, "x".repeat(*size))?.with_key(key.as_str())?;
            outbox.publish(&mut tx, &message).await?;
            tx.commit().await.map_err(Error::store)?;
            Ok::<_, Error>(())
        })
        .await
        .unwrap();
    }
    // A producer that takes no record over 2,000 bytes.
    let small = config(&brokers()).set("message.max.bytes", "2000").clone();
    let relay = KafkaRelay::new(outbox.clone(), &small).unwrap();
    // The round runs on this thread: its counters reach this recorder.
    let recorder = metrics_util::debugging::DebuggingRecorder::new();
    let snapshotter = recorder.snapshotter();
    let guard = metrics::set_default_local_recorder(&recorder);
    let round = relay.relay_once().await.unwrap();
    drop(guard);
    assert_eq!(
        (round.leased, round.acknowledged, round.failed, round.parked),
        (3, 2, 0, 1),
        "{round:?}"
    );
    let mut counted = BTreeMap::new();
    for (key, _, _, value) in snapshotter.snapshot().into_vec() {
        let key = key.key();
        if key.name() != idem::metrics::OUTBOX_MESSAGES {
            continue;
        }
        let label = |name: &str| {
            key.labels()
                .find(|l| l.key() == name)
                .map(|l| l.value().to_owned())
        };
        assert_eq!(label("table"), Some(outbox.table().to_owned()));
        if let metrics_util::debugging::DebugValue::Counter(n) = value {
            counted.insert(label("outcome").unwrap(), n);
        }
    }
    assert_eq!(
        counted,
        BTreeMap::from([("relayed".to_owned(), 2), ("parked".to_owned(), 1)])
    );
    assert_eq!(outbox.waiting().await.unwrap(), 0);
    assert_eq!(outbox.parked_count().await.unwrap(), 1);
    let parked = outbox.parked(10).await.unwrap();
    assert_eq!(parked.len(), 1);
    assert_eq!(
        parked[0].message().message().payload().map(<[u8]>::len),
        Some(5_000)
    );
    assert!(
        parked[0].reason().contains("too large"),
        "{}",
        parked[0].reason()
    );
    // Parked: not leased again, not purged.
    assert_eq!(relay.relay_once().await.unwrap().leased, 0);
    assert_eq!(outbox.purge(100).await.unwrap(), 0);

    // The topic's limit was raised (here: a producer that takes it).
    assert_eq!(
        outbox.unpark(&[parked[0].message().seq()]).await.unwrap(),
        1
    );
    assert_eq!(
        outbox.unpark(&[parked[0].message().seq()]).await.unwrap(),
        0
    );
    assert_eq!(
        (
            outbox.waiting().await.unwrap(),
            outbox.parked_count().await.unwrap()
        ),
        (1, 0)
    );
    let relay = KafkaRelay::new(outbox.clone(), &config(&brokers())).unwrap();
    let round = relay.relay_once().await.unwrap();
    assert_eq!((round.acknowledged, round.parked), (1, 0), "{round:?}");
    let seen = consume(&topic, 3, 3).await;
    once_each(3, &seen);
    assert_eq!((seen.records, seen.duplicates), (3, 0), "{seen:?}");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_refused_message_is_parked_on_sqlite() {
    let (store, _guard) = common::backend::sqlite_file::store(4).await;
    a_refused_message_is_parked(store).await;
}

#[cfg(feature = "postgres")]
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_refused_message_is_parked_on_postgres() {
    let (store, _guard) = common::backend::postgres::store(4).await;
    a_refused_message_is_parked(store).await;
}

#[cfg(feature = "mysql")]
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_refused_message_is_parked_on_mysql() {
    let (store, _guard) = common::backend::mysql::store(4).await;
    a_refused_message_is_parked(store).await;
}

/// A broker answers MESSAGE_TOO_LARGE for a whole produce request (a batch
/// over the topic's `max.message.bytes`, however small each record in
/// it): the relay produces each refused message again alone, and parks
/// none of those that go through alone.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_batch_refused_as_too_large_parks_nothing_that_fits() {
    use rdkafka::mocking::MockCluster;
    use rdkafka::types::{RDKafkaApiKey, RDKafkaRespErr};

    let cluster = MockCluster::new(1).expect("a mock cluster");
    cluster.create_topic("small.events", 1, 1).unwrap();
    let (store, _guard) = common::backend::sqlite_file::store(4).await;
    let outbox = Outbox::new(&store);
    for n in 0..5 {
        let key = format!("op-{n}");
        run(&store, Call::new(SCOPE, &key, &n), async {
            let mut tx = store.pool().begin().await.map_err(Error::store)?;
            let message =
                OutboxMessage::new("small.events", format!("event {n}"))?.with_key("k")?;
            outbox.publish(&mut tx, &message).await?;
            tx.commit().await.map_err(Error::store)?;
            Ok::<_, Error>(())
        })
        .await
        .unwrap();
    }
    let relay = KafkaRelay::new(outbox.clone(), &config(&cluster.bootstrap_servers())).unwrap();
    // The next produce request, the batch of the five, is refused.
    cluster.request_errors(
        RDKafkaApiKey::Produce,
        &[RDKafkaRespErr::RD_KAFKA_RESP_ERR_MSG_SIZE_TOO_LARGE],
    );
    let round = relay.relay_once().await.unwrap();
    assert_eq!(
        (round.acknowledged, round.parked, round.failed),
        (5, 0, 0),
        "{round:?}"
    );
    assert_eq!(
        (
            outbox.waiting().await.unwrap(),
            outbox.parked_count().await.unwrap()
        ),
        (0, 0)
    );
}
