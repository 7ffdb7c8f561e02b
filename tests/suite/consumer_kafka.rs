//! Exactly-once effects for Kafka consumers, on a real Kafka-protocol
//! broker and real databases, under process faults.
//!
//! The consumers are this test binary started again in a child mode: each
//! is a member of the test's consumer group that, for each record, writes
//! one effect row and the "processed" marker in one transaction
//! (`Deduplicator::process_in_transaction`, keyed by the record's
//! `event-id` header) and commits the record's offset only after it. The
//! effects table has no unique index: an event handled twice would show
//! as two rows.
//!
//! - Killed: a consumer is SIGKILLed after an effect committed and before
//!   its offset commit; a consumer started in its place reads the record
//!   again, answers it `Duplicate`, and every event has one effect.
//! - Rebalanced: two members of one group wait between each effect's
//!   commit and its offset commit, the second joining in the middle: the
//!   group rebalances, the two share the partitions, and every event has
//!   one effect. librdkafka serves a rebalance in the consumer's poll,
//!   after the offset commit of the record in hand, so a live member
//!   loses no record between the two commits; a member lost there is the
//!   killed case. (A member that stalls past `max.poll.interval.ms`
//!   leaves the group, which Tansu 0.6, the test broker, does not take
//!   in: the member stays the group's leader and the group assigns
//!   nothing more. That case is not tested here.)
//! - Sent twice: a producer that sends the same event again (the same
//!   bytes, or re-encoded) has one effect per event; the same id with
//!   another payload and a record without an id are refused, no effect.
//!
//! The broker is `IDEM_KAFKA_BROKERS` (bootstrap servers), or the local
//! `127.0.0.1:9092` that `.ci/kafka-broker start` runs; one that cannot be
//! reached fails the test, naming the variable. PostgreSQL is
//! `IDEM_POSTGRES_URL`. Each test has a topic, a group and tables of its
//! own, and every wait is bounded.

use crate::common;

use std::collections::{BTreeMap, BTreeSet};
use std::process::Stdio;
use std::time::{Duration, Instant};

use common::backend::Guard;
use common::kafka::{brokers, Topic};
use common::servers::Server;
use idem::consumer::kafka::{commit_offset, identify, KeyFrom};
use idem::consumer::{Deduplicator, Handled};
use idem::{PostgresStore, SqliteStore};
use rdkafka::client::ClientContext;
use rdkafka::consumer::{BaseConsumer, Consumer, ConsumerContext, Rebalance, StreamConsumer};
use rdkafka::message::{Header, OwnedHeaders};
use rdkafka::producer::{FutureProducer, FutureRecord};
use rdkafka::{ClientConfig, Message};
use tokio::io::{AsyncBufReadExt, BufReader};

/// Set in a child: its spec, fields separated by `|`.
const CHILD_VAR: &str = "IDEM_KAFKA_CONSUMER_CHILD";
const EVENT_ID: &str = "event-id";
/// The group's bounds: a member that stops polling for this long is out of
/// the group, and so is one whose heartbeats stop (a killed process).
const POLL_BOUND_MS: &str = "6000";
/// The longest a test waits for its consumers.
const WAIT: Duration = Duration::from_secs(90);

/// A record to produce: its event id (`None`: no header) and payload.
struct Event {
    id: Option<String>,
    payload: Vec<u8>,
}

fn event(n: usize) -> Event {
    Event {
        id: Some(format!("evt-{n:03}")),
        payload: format!(r#"{{"order_id":"order-{n:03}","amount":{}}}"#, 100 + n).into_bytes(),
    }
}

/// Produces `events` with the idempotent producer, each acknowledged.
async fn produce(topic: &Topic, events: &[Event]) {
    let producer: FutureProducer = ClientConfig::new()
        .set("bootstrap.servers", brokers())
        .set("enable.idempotence", "true")
        .create()
        .expect("a producer");
    for (n, event) in events.iter().enumerate() {
        let mut headers = OwnedHeaders::new();
        if let Some(id) = &event.id {
            headers = headers.insert(Header {
                key: EVENT_ID,
                value: Some(id.as_str()),
            });
        }
        // Keys spread the events over the partitions.
        let key = format!("k{n}");
        producer
            .send(
                FutureRecord::to(&topic.name)
                    .key(&key)
                    .payload(&event.payload)
                    .headers(headers),
                Duration::from_secs(10),
            )
            .await
            .map_err(|(err, _)| err)
            .unwrap_or_else(|err| panic!("the broker at {} refused a record: {err}", brokers()));
    }
}

/// Where the consumers keep their effects and markers.
#[derive(Clone, Debug)]
enum Db {
    /// A SQLite file.
    Sqlite(String),
    /// PostgreSQL: the records table and the effects table.
    Postgres(String, String),
}

impl Db {
    fn spec(&self) -> String {
        match self {
            Db::Sqlite(path) => format!("sqlite|{path}|effects"),
            Db::Postgres(records, effects) => format!("postgres|{records}|{effects}"),
        }
    }

    fn parse(db: &str, first: &str, second: &str) -> Db {
        match db {
            "sqlite" => Db::Sqlite(first.to_owned()),
            "postgres" => Db::Postgres(first.to_owned(), second.to_owned()),
            other => panic!("unknown database {other:?}"),
        }
    }

    /// The database of a test: a SQLite file or tables on PostgreSQL, with
    /// the effects table created, and the guard that removes them.
    async fn create(postgres: bool) -> (Db, Guard) {
        if postgres {
            let mut guard = Guard::tables(Server::Postgres);
            let db = Db::Postgres(guard.table("kafka_records"), guard.table("kafka_effects"));
            let shop = Shop::open(&db).await;
            shop.create_effects().await;
            (db, guard)
        } else {
            let guard = Guard::temp_dir();
            let db = Db::Sqlite(guard.path("shop.db").display().to_string());
            let shop = Shop::open(&db).await;
            shop.create_effects().await;
            (db, guard)
        }
    }
}

/// The consumers' database: the deduplicator and the effects table.
enum Shop {
    Sqlite(Deduplicator<SqliteStore>),
    Postgres(Deduplicator<PostgresStore>, String),
}

const SCOPE: &str = "payments.capture";

impl Shop {
    async fn open(db: &Db) -> Shop {
        match db {
            Db::Sqlite(path) => {
                let store = SqliteStore::connect(&format!("sqlite://{path}"))
                    .await
                    .expect("the SQLite file");
                Shop::Sqlite(Deduplicator::new(store, SCOPE))
            }
            Db::Postgres(records, effects) => {
                let url = Server::Postgres.url();
                let pool = sqlx::postgres::PgPoolOptions::new()
                    .max_connections(4)
                    .connect(&url)
                    .await
                    .unwrap_or_else(|err| {
                        panic!(
                            "cannot reach PostgreSQL at {url} (set {}): {err}",
                            Server::Postgres.var()
                        )
                    });
                let store = PostgresStore::new(pool)
                    .with_table_name(records)
                    .expect("a table name");
                store.migrate().await.expect("migrate");
                Shop::Postgres(Deduplicator::new(store, SCOPE), effects.clone())
            }
        }
    }

    async fn create_effects(&self) {
        let sql = "CREATE TABLE {effects} (event_id VARCHAR(255) NOT NULL, \
                   consumer VARCHAR(64) NOT NULL)";
        match self {
            Shop::Sqlite(dedup) => {
                sqlx::query(&sql.replace("{effects}", "effects"))
                    .execute(dedup.store().pool())
                    .await
                    .unwrap();
            }
            Shop::Postgres(dedup, effects) => {
                sqlx::query(&sql.replace("{effects}", effects))
                    .execute(dedup.store().pool())
                    .await
                    .unwrap();
            }
        }
    }

    /// The effect and the marker, in one transaction, committed.
    async fn handle(
        &self,
        key: &idem::Key,
        message: &idem::consumer::kafka::Digest,
        consumer: &str,
    ) -> Result<Handled<()>, idem::Error> {
        let insert = "INSERT INTO {effects} (event_id, consumer) VALUES ($1, $2)";
        match self {
            Shop::Sqlite(dedup) => {
                let sql = insert.replace("{effects}", "effects");
                let pool = dedup.store().pool();
                let mut tx = pool.begin_with("BEGIN IMMEDIATE").await.map_err(store)?;
                let handled = dedup
                    .process_in_transaction(&mut tx, key, message, |tx| async {
                        let done = sqlx::query(&sql)
                            .bind(key.as_str())
                            .bind(consumer)
                            .execute(&mut **tx)
                            .await
                            .map(drop)
                            .map_err(store);
                        (done, tx)
                    })
                    .await;
                finish(tx, handled).await
            }
            Shop::Postgres(dedup, effects) => {
                let sql = insert.replace("{effects}", effects);
                let mut tx = dedup.store().pool().begin().await.map_err(store)?;
                let handled = dedup
                    .process_in_transaction(&mut tx, key, message, |tx| async {
                        let done = sqlx::query(&sql)
                            .bind(key.as_str())
                            .bind(consumer)
                            .execute(&mut **tx)
                            .await
                            .map(drop)
                            .map_err(store);
                        (done, tx)
                    })
                    .await;
                finish(tx, handled).await
            }
        }
    }

    /// Each event's effects: (event id, consumer) rows.
    async fn effects(&self) -> Vec<(String, String)> {
        let sql = "SELECT event_id, consumer FROM {effects} ORDER BY event_id";
        match self {
            Shop::Sqlite(dedup) => sqlx::query_as(&sql.replace("{effects}", "effects"))
                .fetch_all(dedup.store().pool())
                .await
                .unwrap(),
            Shop::Postgres(dedup, effects) => sqlx::query_as(&sql.replace("{effects}", effects))
                .fetch_all(dedup.store().pool())
                .await
                .unwrap(),
        }
    }
}

fn store(err: sqlx::Error) -> idem::Error {
    idem::Error::Store(Box::new(err))
}

async fn finish<DB: sqlx::Database>(
    tx: sqlx::Transaction<'_, DB>,
    handled: Result<Handled<()>, idem::Error>,
) -> Result<Handled<()>, idem::Error> {
    match handled {
        Ok(handled) => {
            tx.commit().await.map_err(store)?;
            Ok(handled)
        }
        Err(err) => {
            tx.rollback().await.map_err(store)?;
            Err(err)
        }
    }
}

fn say(line: &str) {
    use std::io::Write;
    println!("{line}");
    std::io::stdout().flush().unwrap();
}

/// Says each partition assignment the member gets.
struct SayAssignments;

impl ClientContext for SayAssignments {}

impl ConsumerContext for SayAssignments {
    fn post_rebalance(&self, _consumer: &BaseConsumer<Self>, rebalance: &Rebalance<'_>) {
        if let Rebalance::Assign(partitions) = rebalance {
            say(&format!("IDEM-KAFKA-ASSIGNED {}", partitions.count()));
        }
    }
}

/// The child: a member of `group` consuming `topic` until killed.
///
/// Modes: `run` (no fault); `pause N` (after the Nth effect committed,
/// hang before its offset commit, to be killed there); `slow MS` (wait MS
/// milliseconds between each effect's commit and its offset commit).
async fn child(spec: &str) {
    let fields: Vec<&str> = spec.split('|').collect();
    let [name, mode, arg, topic, group, db, first, second] = fields[..] else {
        panic!("{CHILD_VAR}={spec:?}: expected 8 fields")
    };
    let at: usize = arg.parse().expect("a count");
    let shop = Shop::open(&Db::parse(db, first, second)).await;
    let by_event_id = KeyFrom::header(EVENT_ID).unwrap();
    let consumer: StreamConsumer<SayAssignments> = ClientConfig::new()
        .set("bootstrap.servers", brokers())
        .set("group.id", group)
        .set("client.id", name)
        .set("enable.auto.commit", "false")
        .set("auto.offset.reset", "earliest")
        .set("session.timeout.ms", POLL_BOUND_MS)
        .set("max.poll.interval.ms", POLL_BOUND_MS)
        .set("heartbeat.interval.ms", "500")
        .create_with_context(SayAssignments)
        .expect("a consumer");
    consumer.subscribe(&[topic]).expect("subscribe");
    say("IDEM-KAFKA-STARTED");
    let mut processed = 0;
    loop {
        let record = match consumer.recv().await {
            Ok(record) => record,
            Err(err) => {
                say(&format!("IDEM-KAFKA-ERROR {err}"));
                continue;
            }
        };
        let place = format!("{} {}", record.partition(), record.offset());
        let identity = match identify(&record, &by_event_id) {
            Ok(identity) => identity,
            Err(err) => {
                // Never processable: dead-lettered (here, said), then
                // its offset committed.
                say(&format!("IDEM-KAFKA rejected - {place} {err}"));
                commit_offset(&consumer, &record).expect("commit a rejected record's offset");
                continue;
            }
        };
        let key = identity.key().as_str().to_owned();
        match shop.handle(identity.key(), identity.message(), name).await {
            Ok(Handled::Processed(())) => {
                processed += 1;
                say(&format!("IDEM-KAFKA processed {key} {place}"));
                if mode == "pause" && processed == at {
                    say(&format!("IDEM-KAFKA-PAUSED {key}"));
                    std::future::pending::<()>().await;
                }
                if mode == "slow" {
                    // Long enough for a rebalance to land between the
                    // effect's commit and the offset's, now and then.
                    tokio::time::sleep(Duration::from_millis(at as u64)).await;
                }
            }
            Ok(Handled::Duplicate(())) => say(&format!("IDEM-KAFKA duplicate {key} {place}")),
            Err(idem::Error::KeyReused) => {
                say(&format!("IDEM-KAFKA rejected {key} {place} key reused"));
            }
            Err(err) => {
                // The database failed: nothing committed. Exit, and let
                // the record be read again by the group.
                say(&format!("IDEM-KAFKA-ERROR {key} {err}"));
                panic!("the shop failed: {err}");
            }
        }
        if let Err(err) = commit_offset(&consumer, &record) {
            say(&format!("IDEM-KAFKA-COMMIT-REFUSED {key} {err}"));
        }
    }
}

/// A consumer process and the lines it printed so far.
struct Member {
    child: tokio::process::Child,
    lines: tokio::sync::mpsc::UnboundedReceiver<String>,
    seen: Vec<String>,
}

impl Member {
    fn start(test: &str, name: &str, mode: &str, topic: &Topic, group: &str, db: &Db) -> Member {
        let exe = std::env::current_exe().expect("the test binary");
        let spec = format!("{name}|{mode}|{}|{group}|{}", topic.name, db.spec());
        let mut child = tokio::process::Command::new(exe)
            .args([test, "--exact", "--nocapture", "--test-threads", "1"])
            .env(CHILD_VAR, spec)
            .stdout(Stdio::piped())
            .stderr(Stdio::inherit())
            .kill_on_drop(true)
            .spawn()
            .expect("start a consumer process");
        let mut out = BufReader::new(child.stdout.take().unwrap()).lines();
        let (tx, lines) = tokio::sync::mpsc::unbounded_channel();
        tokio::spawn(async move {
            while let Ok(Some(line)) = out.next_line().await {
                if let Some(at) = line.find("IDEM-KAFKA") {
                    if tx.send(line[at..].to_owned()).is_err() {
                        break;
                    }
                }
            }
        });
        Member {
            child,
            lines,
            seen: Vec::new(),
        }
    }

    /// Waits for a line starting with `prefix`, and returns it.
    async fn wait_for(&mut self, prefix: &str, deadline: Instant) -> String {
        if let Some(line) = self.seen.iter().find(|l| l.starts_with(prefix)) {
            return line.clone();
        }
        loop {
            let left = deadline.saturating_duration_since(Instant::now());
            match tokio::time::timeout(left, self.lines.recv()).await {
                Ok(Some(line)) => {
                    self.seen.push(line.clone());
                    if line.starts_with(prefix) {
                        return line;
                    }
                }
                Ok(None) => panic!(
                    "the consumer exited before printing {prefix:?}: {:?}",
                    self.seen
                ),
                Err(_) => panic!("no {prefix:?} within the bound; printed: {:?}", self.seen),
            }
        }
    }

    /// Waits for the next line.
    async fn next_line(&mut self, deadline: Instant) {
        let left = deadline.saturating_duration_since(Instant::now());
        match tokio::time::timeout(left, self.lines.recv()).await {
            Ok(Some(line)) => self.seen.push(line),
            Ok(None) => panic!("the consumer exited: {:?}", self.seen),
            Err(_) => panic!("no line within the bound; printed: {:?}", self.seen),
        }
    }

    /// Takes in what was printed so far.
    fn drain(&mut self) {
        while let Ok(line) = self.lines.try_recv() {
            self.seen.push(line);
        }
    }

    /// The keys it printed with `what` (`processed`, `duplicate`, `rejected`).
    fn keys(&self, what: &str) -> Vec<String> {
        let prefix = format!("IDEM-KAFKA {what} ");
        self.seen
            .iter()
            .filter_map(|l| l.strip_prefix(&prefix))
            .map(|rest| rest.split(' ').next().unwrap().to_owned())
            .collect()
    }

    async fn kill(&mut self) {
        self.child.start_kill().expect("kill the consumer");
        let status = self.child.wait().await.expect("reap the consumer");
        use std::os::unix::process::ExitStatusExt;
        assert_eq!(status.signal(), Some(9), "the consumer died of SIGKILL");
        self.drain();
    }
}

/// Waits until the effects cover `ids` (each at least once), and a little
/// longer for late doubles, then returns each event's number of effects.
async fn effects_of(
    shop: &Shop,
    ids: &BTreeSet<String>,
    deadline: Instant,
) -> BTreeMap<String, usize> {
    loop {
        let mut counts = BTreeMap::new();
        for (id, _) in shop.effects().await {
            *counts.entry(id).or_insert(0) += 1;
        }
        if ids.iter().all(|id| counts.contains_key(id)) {
            return counts;
        }
        assert!(
            Instant::now() < deadline,
            "the effects of {} of {} events within the bound: {counts:?}",
            counts.len(),
            ids.len()
        );
        tokio::time::sleep(Duration::from_millis(200)).await;
    }
}

fn once_each(ids: &BTreeSet<String>) -> BTreeMap<String, usize> {
    ids.iter().map(|id| (id.clone(), 1)).collect()
}

/// Killed after an effect committed and before its offset commit: the
/// record comes back to the member started in its place, as a duplicate.
async fn killed_between_effect_and_offset_commit(test: &str, postgres: bool) {
    let (db, _guard) = Db::create(postgres).await;
    let shop = Shop::open(&db).await;
    let topic = Topic::create("killed", &brokers()).await;
    let group = common::fresh("idem-test-killed");
    let events: Vec<Event> = (0..12).map(event).collect();
    let ids: BTreeSet<String> = events.iter().filter_map(|e| e.id.clone()).collect();
    produce(&topic, &events).await;
    let deadline = Instant::now() + WAIT;

    let mut first = Member::start(test, "first", "pause|5", &topic, &group, &db);
    let paused = first.wait_for("IDEM-KAFKA-PAUSED", deadline).await;
    let paused_key = paused.rsplit(' ').next().unwrap().to_owned();
    first.kill().await;
    assert_eq!(first.keys("processed").len(), 5);
    // The effect is in: committed before the kill.
    let before: Vec<String> = shop.effects().await.into_iter().map(|(id, _)| id).collect();
    assert!(
        before.contains(&paused_key),
        "{paused_key} not in {before:?}"
    );

    let mut second = Member::start(test, "second", "run|0", &topic, &group, &db);
    let effects = effects_of(&shop, &ids, deadline).await;
    let redelivered = format!("IDEM-KAFKA duplicate {paused_key} ");
    second.wait_for(&redelivered, deadline).await;
    tokio::time::sleep(Duration::from_millis(500)).await;
    second.drain();
    let effects_now = effects_of(&shop, &ids, deadline).await;
    second.kill().await;

    assert_eq!(effects, once_each(&ids), "one effect per event");
    assert_eq!(effects_now, effects);
    // Only the record whose offset was never committed came back.
    assert_eq!(second.keys("duplicate"), vec![paused_key.clone()]);
    let mut processed: Vec<String> = first.keys("processed");
    processed.extend(second.keys("processed"));
    processed.sort();
    assert_eq!(processed, ids.iter().cloned().collect::<Vec<_>>());
}

/// Two members in one group, each waiting between an effect's commit and
/// its offset commit, the second joining in the middle: the group
/// rebalances, and every event has one effect.
async fn rebalance_in_the_middle(test: &str, postgres: bool) {
    let (db, _guard) = Db::create(postgres).await;
    let shop = Shop::open(&db).await;
    let topic = Topic::create("rebalance", &brokers()).await;
    let group = common::fresh("idem-test-rebalance");
    let events: Vec<Event> = (0..60).map(event).collect();
    let ids: BTreeSet<String> = events.iter().filter_map(|e| e.id.clone()).collect();
    produce(&topic, &events).await;
    let deadline = Instant::now() + WAIT;

    let mut first = Member::start(test, "first", "slow|150", &topic, &group, &db);
    // Some records in, then a second member joins.
    while first.keys("processed").len() < 5 {
        first.next_line(deadline).await;
    }
    let mut second = Member::start(test, "second", "slow|150", &topic, &group, &db);
    second.wait_for("IDEM-KAFKA-ASSIGNED", deadline).await;
    let effects = effects_of(&shop, &ids, deadline).await;
    tokio::time::sleep(Duration::from_millis(1_000)).await;
    let effects_now = effects_of(&shop, &ids, deadline).await;
    first.kill().await;
    second.kill().await;

    assert_eq!(effects, once_each(&ids), "one effect per event");
    assert_eq!(effects_now, effects);
    // The first member's assignment changed in the middle: it had all the
    // partitions, then a share.
    let assignments: Vec<&String> = first
        .seen
        .iter()
        .filter(|l| l.starts_with("IDEM-KAFKA-ASSIGNED"))
        .collect();
    assert!(
        assignments.len() >= 2,
        "the first member was assigned partitions {assignments:?}"
    );
    let (by_first, by_second) = (first.keys("processed"), second.keys("processed"));
    assert!(
        !by_first.is_empty() && !by_second.is_empty(),
        "the events went {} to the first member and {} to the second",
        by_first.len(),
        by_second.len()
    );
    assert_eq!(by_first.len() + by_second.len(), ids.len());
    let duplicates = first.keys("duplicate").len() + second.keys("duplicate").len();
    println!(
        "rebalance: {} events, {} processed by the first member, {} by the second, \
         {duplicates} redelivered as duplicates",
        ids.len(),
        by_first.len(),
        by_second.len()
    );
}

/// A producer sends events again: one effect per event; the same id with
/// another payload, and a record without an id, are refused.
async fn duplicate_sends_have_one_effect(test: &str, postgres: bool) {
    let (db, _guard) = Db::create(postgres).await;
    let shop = Shop::open(&db).await;
    let topic = Topic::create("sent-twice", &brokers()).await;
    let group = common::fresh("idem-test-sent-twice");
    let mut records = Vec::new();
    for n in 0..10 {
        let original = event(n);
        let id = original.id.clone();
        // The same bytes again (a producer's retry), then the same event
        // re-encoded, members in another order (a relay's copy).
        let again = Event {
            id: id.clone(),
            payload: original.payload.clone(),
        };
        let re_encoded = Event {
            id,
            payload: format!(r#"{{ "amount": {}, "order_id": "order-{n:03}" }}"#, 100 + n)
                .into_bytes(),
        };
        records.extend([original, again, re_encoded]);
    }
    // The same id with another payload: a producer bug, refused.
    records.push(Event {
        id: Some("evt-003".to_owned()),
        payload: br#"{"order_id":"order-003","amount":999}"#.to_vec(),
    });
    // No id at all.
    records.push(Event {
        id: None,
        payload: br#"{"order_id":"order-x","amount":1}"#.to_vec(),
    });
    produce(&topic, &records).await;
    let ids: BTreeSet<String> = (0..10).filter_map(|n| event(n).id).collect();
    let deadline = Instant::now() + WAIT;

    let mut member = Member::start(test, "only", "run|0", &topic, &group, &db);
    let effects = effects_of(&shop, &ids, deadline).await;
    // Every record answered.
    while member.keys("processed").len()
        + member.keys("duplicate").len()
        + member.keys("rejected").len()
        < records.len()
    {
        member.next_line(deadline).await;
    }
    member.kill().await;

    assert_eq!(effects, once_each(&ids), "one effect per event");
    assert_eq!(effects_of(&shop, &ids, deadline).await, effects);
    let mut processed = member.keys("processed");
    processed.sort();
    assert_eq!(processed, ids.iter().cloned().collect::<Vec<_>>());
    assert_eq!(member.keys("duplicate").len(), 20);
    let mut rejected = member.keys("rejected");
    rejected.sort();
    assert_eq!(rejected, vec!["-".to_owned(), "evt-003".to_owned()]);
}

macro_rules! on {
    ($($db:ident: $postgres:expr => [$($case:ident),*];)*) => {$(
        mod $db {
            use super::*;
            $(
                #[tokio::test(flavor = "multi_thread", worker_threads = 2)]
                async fn $case() {
                    if let Ok(spec) = std::env::var(CHILD_VAR) {
                        return child(&spec).await;
                    }
                    let test = concat!(module_path!(), "::", stringify!($case));
                    super::$case(common::test_name(test), $postgres).await;
                }
            )*
        }
    )*};
}

on! {
    sqlite: false => [killed_between_effect_and_offset_commit, duplicate_sends_have_one_effect];
    postgres: true => [
        killed_between_effect_and_offset_commit,
        rebalance_in_the_middle,
        duplicate_sends_have_one_effect
    ];
}
