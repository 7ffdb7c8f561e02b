//! A soak of the payments example app publishing `payment.created` through
//! the transactional outbox, while its process is killed and restarted and
//! its database connections are killed; a deduplicating consumer on the
//! other side of a real Kafka-protocol broker counts.
//!
//! The app is this test binary started again as `payments serve` (see
//! `payments_app`), on PostgreSQL in a schema of its own, with
//! `--kafka-brokers` and a topic of the test's own: each process serves
//! HTTP and runs the outbox's relay. During the load phase:
//!
//! - customers arrive at random, each payment with its own
//!   `Idempotency-Key`, and their clients retry timeouts, broken
//!   connections, 409 and 5xx with the same key and body, on whichever
//!   process is up; now and then one asks again for an answer it had;
//! - the app's process is SIGKILLed at random every few seconds and
//!   started again on the same database: nothing of it runs on (no
//!   release, no mark, no flush of the producer). Most kills are aimed at
//!   a relay's round, a few milliseconds after it leased or marked a
//!   batch, where the window between the broker's append and the mark is;
//! - its database connections are terminated at random
//!   (`pg_terminate_backend`), one at a time and now and then all at once,
//!   starts included (a start that fails is started again).
//!
//! A consumer in the test process reads the topic with rdkafka and the
//! library's `Deduplicator`, keyed by the `idem-message-id` header: each
//! record's effect (a row of `downstream_effects`, which has no unique
//! index, so an event handled twice would show) and its marker commit in
//! one transaction, and its offset is committed after. Its connections are
//! spared: it stands for another service.
//!
//! Then the drain, with nothing killed: the clients finish their last keys
//! (a killed process's claims lapse with their 30 s lease), and the last
//! process's relay produces what waits, rows leased by a killed relay
//! included once their lease ends. At the end:
//!
//! - every payment row has exactly one effect, which carries its id, key,
//!   amount and currency; no effect names a payment that does not exist;
//!   effects = rows: no event lost, none doubled;
//! - every key answered 201 has its row, with the id answered, and so its
//!   one effect;
//! - every record read was an effect or a duplicate absorbed, and the
//!   outbox holds nothing left to relay, and nothing parked.
//!
//! `IDEM_SOAK_SECS` sets the load phase (default 60 s; the variable sets
//! `payments_killed_connections`' too); the drain is bounded. The figures are printed (`cargo test --all-features --test
//! suite -- payments_outbox_soak --nocapture`).

use crate::common;
use crate::payments_app;

use std::collections::{BTreeMap, HashMap};
use std::fmt;
use std::sync::atomic::{AtomicUsize, Ordering};
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use crate::payments::random::random_unit;
use common::kafka::{brokers, Topic, PARTITIONS};
use common::namespace::Namespace;
use common::servers::{Db, Server};
use idem::consumer::kafka::{commit_offset, identify, KeyFrom};
use idem::consumer::{Deduplicator, Handled};
use idem::outbox::{Outbox, MESSAGE_ID_HEADER};
use idem::PostgresStore;
use payments_app::{app_command, Process};
use rdkafka::consumer::{Consumer, StreamConsumer};
use rdkafka::{ClientConfig, Message};
use reqwest::header::CONTENT_TYPE;
use serde_json::{json, Value};
use sqlx::PgPool;
use tokio::sync::watch;

/// The mean time between two new payments: customers arrive whatever
/// happens to the payments already on their way.
const ARRIVAL_EVERY_MS: f64 = 40.0;
/// The most payments on their way at once. A process killed while
/// handling a payment leaves its key claimed until the claim's lease (30 s)
/// runs out, and the key's client retries it until then: those wait here
/// without holding the new customers back.
const IN_FLIGHT: usize = 64;
/// The fake gateway's latency: a killed process often has charges on the
/// way.
const GATEWAY_LATENCY_MS: &str = "25";
/// A client's patience for one request.
const REQUEST_TIMEOUT: Duration = Duration::from_millis(1500);
/// The pause between two kills of the process, in seconds, drawn from
/// this range.
const PROCESS_KILL_EVERY_S: (f64, f64) = (1.5, 4.0);
/// The share of process kills aimed at a relay's round.
const AIMED_SHARE: f64 = 0.75;
/// How long after the first sign of a relay's round an aimed kill
/// strikes, in milliseconds, drawn from this range.
const AIM_OFFSET_MS: (f64, f64) = (0.0, 40.0);
/// The pause between two connection kills, in milliseconds.
const CONNECTION_KILL_EVERY_MS: (f64, f64) = (50.0, 300.0);
/// The share of connection kills that take every connection at once.
const KILL_ALL_SHARE: f64 = 0.05;
/// The share of final answers a client "loses" and asks for again.
const LOST_ANSWER_SHARE: f64 = 0.2;
/// The share of payments made with a card the gateway declines (402: a
/// payment row, and its event, all the same).
const DECLINED_SHARE: f64 = 0.1;
/// The bound on the drain: longer than the claims a killed process leaves
/// (the layer's and entity mode's 30 s leases) and the rows its relay
/// leased (30 s), plus a producer's delivery.
const DRAIN: Duration = Duration::from_secs(50);
/// How long the consumer must read nothing more before the count ends.
const QUIET: Duration = Duration::from_secs(3);
/// Attempts of the app's start before the test gives up.
const STARTS: usize = 20;

const VISA: &str = "4242424242424242";
const DECLINED: &str = "4000000000000002";

/// The load phase: `IDEM_SOAK_SECS`, or 60 s.
fn soak_duration() -> Duration {
    let secs = match std::env::var("IDEM_SOAK_SECS") {
        Ok(value) => value
            .parse::<u64>()
            .unwrap_or_else(|_| panic!("IDEM_SOAK_SECS={value:?} is not a number of seconds")),
        Err(_) => 60,
    };
    Duration::from_secs(secs.clamp(1, 3600))
}

/// A uniform draw from `low..high`.
fn uniform(low: f64, high: f64) -> f64 {
    low + (high - low) * random_unit()
}

// ------------------------------------------------------------------ app

/// The app's processes, one at a time, on one database.
struct Apps {
    args: Vec<String>,
    /// Processes killed.
    kills: usize,
    /// Kills aimed at a relay's round that found one.
    aimed: usize,
    /// Starts that failed: the process exited before listening (a
    /// connection killed while it opened its database, say).
    failed_starts: usize,
    /// The time from kills to the next process listening.
    down: Duration,
}

impl Apps {
    /// Starts a process, again until one listens.
    async fn start(&mut self) -> Process {
        let args: Vec<&str> = self.args.iter().map(String::as_str).collect();
        for _ in 0..STARTS {
            let mut command = app_command(&args);
            // The app's warnings (connections killed, rounds failed) would
            // flood the test's output: errors only, unless asked.
            if std::env::var_os("RUST_LOG").is_none() {
                command.env("RUST_LOG", "error");
            }
            match payments_app::start(command).await {
                Ok(process) => return process,
                Err(err) => {
                    eprintln!("payments_outbox_soak: a start failed: {err}; starting again");
                    self.failed_starts += 1;
                    tokio::time::sleep(Duration::from_millis(200)).await;
                }
            }
        }
        panic!("the app did not start in {STARTS} attempts");
    }
}

/// Kills the app's process at random until `stop`, starting it again each
/// time and telling the clients its new URL; answers the last process.
///
/// Most kills are aimed: they wait (a little) for the relay to lease or
/// mark a batch, and strike a few milliseconds later: before it produced,
/// while it produces, between the broker's acknowledgement and the mark,
/// or after. A blind kill meets those windows rarely: the relay spends
/// most of its time waiting for rows.
async fn crasher(
    ns: Arc<Namespace>,
    mut apps: Apps,
    mut app: Process,
    url: watch::Sender<String>,
    stop: Instant,
) -> (Process, Apps) {
    loop {
        let pause =
            Duration::from_secs_f64(uniform(PROCESS_KILL_EVERY_S.0, PROCESS_KILL_EVERY_S.1));
        if Instant::now() + pause >= stop {
            tokio::time::sleep_until(stop.into()).await;
            return (app, apps);
        }
        tokio::time::sleep(pause).await;
        if random_unit() < AIMED_SHARE && relay_busy(&ns).await {
            apps.aimed += 1;
            let offset = uniform(AIM_OFFSET_MS.0, AIM_OFFSET_MS.1);
            tokio::time::sleep(Duration::from_micros((offset * 1000.0) as u64)).await;
        }
        app.kill().await;
        apps.kills += 1;
        let killed = Instant::now();
        app = apps.start().await;
        apps.down += killed.elapsed();
        url.send_replace(app.url.clone());
    }
}

/// Waits, 1.5 s at most, until a relay has just leased or marked a batch
/// (within the last 100 ms, by the database's clock): answers whether it
/// saw one.
async fn relay_busy(ns: &Namespace) -> bool {
    let Db::Postgres(admin) = ns.admin() else {
        unreachable!("the soak runs on PostgreSQL")
    };
    let lease = idem::outbox::kafka::DEFAULT_LEASE.as_millis() as i64;
    let sql = format!(
        "SELECT EXISTS (SELECT 1 FROM {outbox} WHERE lease_until > {now} + $1 - 100) \
         OR EXISTS (SELECT 1 FROM {outbox} WHERE relayed_at > {now} - 100)",
        outbox = ns.table("idem_records_outbox"),
        now = "(EXTRACT(EPOCH FROM clock_timestamp()) * 1000)::BIGINT",
    );
    let deadline = Instant::now() + Duration::from_millis(1500);
    while Instant::now() < deadline {
        let busy: Result<bool, _> = sqlx::query_scalar(&sql).bind(lease).fetch_one(admin).await;
        if busy.unwrap_or(false) {
            return true;
        }
        tokio::time::sleep(Duration::from_millis(2)).await;
    }
    false
}

/// Kills the app's connections at random until `stop`; answers how many.
async fn connection_killer(ns: Arc<Namespace>, stop: Instant) -> usize {
    let mut kills = 0;
    loop {
        let pause = uniform(CONNECTION_KILL_EVERY_MS.0, CONNECTION_KILL_EVERY_MS.1);
        tokio::time::sleep(Duration::from_millis(pause as u64)).await;
        if Instant::now() >= stop {
            return kills;
        }
        // The admin pool is never killed; a failed look is only skipped.
        let Ok(ids) = ns.connections().await else {
            continue;
        };
        if ids.is_empty() {
            continue;
        }
        let victims = if random_unit() < KILL_ALL_SHARE {
            ids
        } else {
            vec![ids[(random_unit() * ids.len() as f64) as usize % ids.len()]]
        };
        for id in victims {
            kills += usize::from(ns.kill(id).await);
        }
    }
}

// -------------------------------------------------------------- clients

/// What one client saw for one key.
struct KeyRecord {
    key: String,
    /// The payment id of every 201.
    created: Vec<String>,
    /// Answers a client cannot act on (400, 404, 422, ...).
    unexpected: Vec<String>,
}

/// The answers of every client, by label (`201`, `timeout`, ...).
#[derive(Default)]
struct Traffic {
    requests: AtomicUsize,
    statuses: Mutex<BTreeMap<String, usize>>,
}

impl Traffic {
    fn saw(&self, label: String) {
        self.requests.fetch_add(1, Ordering::Relaxed);
        *self.statuses.lock().unwrap().entry(label).or_default() += 1;
    }
}

enum Reply {
    /// 201 (the payment's id) or 402.
    Final(Option<String>),
    /// A timeout, a broken or refused connection, a 5xx, a 409.
    Retry,
    /// Anything else.
    Unexpected(String),
}

async fn send(http: &reqwest::Client, url: &str, key: &str, body: &str) -> (Reply, String) {
    let sent = http
        .post(format!("{url}/payments"))
        .header(CONTENT_TYPE, "application/json")
        .header("Idempotency-Key", key)
        .body(body.to_owned())
        .timeout(REQUEST_TIMEOUT)
        .send()
        .await;
    let answer = match sent {
        Ok(response) => {
            let status = response.status().as_u16();
            response.bytes().await.map(|bytes| (status, bytes))
        }
        Err(err) => Err(err),
    };
    let (status, bytes) = match answer {
        Ok(answer) => answer,
        Err(err) if err.is_timeout() => return (Reply::Retry, "timeout".to_owned()),
        Err(_) => return (Reply::Retry, "transport".to_owned()),
    };
    let body: Value = serde_json::from_slice(&bytes).unwrap_or(Value::Null);
    let label = match body["type"].as_str().and_then(|t| t.rsplit('#').next()) {
        Some(problem) if status >= 400 => format!("{status} {problem}"),
        _ => status.to_string(),
    };
    let reply = match status {
        201 => match body["id"].as_str() {
            Some(id) => Reply::Final(Some(id.to_owned())),
            None => Reply::Unexpected(format!("201 without a payment id: {body}")),
        },
        402 => Reply::Final(None),
        409 | 500..=599 => Reply::Retry,
        _ => Reply::Unexpected(format!("{status} {body}")),
    };
    (reply, label)
}

/// Sends until a final answer, with the same key and body, to the app's
/// current URL, after a growing, jittered backoff; gives up at `give_up`.
async fn until_final(
    http: &reqwest::Client,
    url: &watch::Receiver<String>,
    body: &str,
    give_up: Instant,
    traffic: &Traffic,
    record: &mut KeyRecord,
) -> bool {
    for attempt in 0.. {
        let current = url.borrow().clone();
        let (reply, label) = send(http, &current, &record.key, body).await;
        traffic.saw(label);
        match reply {
            Reply::Final(id) => {
                record.created.extend(id);
                return true;
            }
            Reply::Unexpected(answer) => {
                record.unexpected.push(answer);
                return false;
            }
            Reply::Retry => {}
        }
        if Instant::now() >= give_up {
            return false;
        }
        let ceiling = (10.0 * 1.5f64.powi(attempt.min(20))).min(250.0);
        tokio::time::sleep(Duration::from_millis(uniform(5.0, ceiling) as u64)).await;
    }
    unreachable!()
}

/// One payment, with a key of its own, retried until it has a final answer
/// (or `give_up`); some answers are "lost" and asked for again with the
/// same key.
async fn payment(
    key: String,
    http: reqwest::Client,
    url: watch::Receiver<String>,
    give_up: Instant,
    traffic: Arc<Traffic>,
) -> KeyRecord {
    let card = if random_unit() < DECLINED_SHARE {
        DECLINED
    } else {
        VISA
    };
    let amount = 100 + (random_unit() * 10_000.0) as i64;
    let body = json!({ "amount": amount, "currency": "EUR", "card": card, "description": "soak" })
        .to_string();
    let mut record = KeyRecord {
        key,
        created: Vec::new(),
        unexpected: Vec::new(),
    };
    let answered = until_final(&http, &url, &body, give_up, &traffic, &mut record).await;
    if answered && random_unit() < LOST_ANSWER_SHARE {
        until_final(&http, &url, &body, give_up, &traffic, &mut record).await;
    }
    record
}

/// New payments at random intervals until `stop` (at most [`IN_FLIGHT`]
/// at once); answers what each key saw once all are done.
async fn customers(
    url: watch::Receiver<String>,
    stop: Instant,
    give_up: Instant,
    traffic: Arc<Traffic>,
) -> Vec<KeyRecord> {
    let http = reqwest::Client::builder()
        .no_proxy()
        .build()
        .expect("an HTTP client");
    let slots = Arc::new(tokio::sync::Semaphore::new(IN_FLIGHT));
    let mut payments = Vec::new();
    for n in 0.. {
        let pause = uniform(0.0, 2.0 * ARRIVAL_EVERY_MS);
        tokio::time::sleep(Duration::from_micros((pause * 1000.0) as u64)).await;
        if Instant::now() >= stop {
            break;
        }
        let slot = slots.clone().acquire_owned().await.unwrap();
        let paying = payment(
            format!("outbox-soak-{n}"),
            http.clone(),
            url.clone(),
            give_up,
            traffic.clone(),
        );
        payments.push(tokio::spawn(async move {
            let record = paying.await;
            drop(slot);
            record
        }));
    }
    let mut records = Vec::new();
    for payment in payments {
        records.push(payment.await.expect("a payment task"));
    }
    records
}

// ------------------------------------------------------------- consumer

/// The service on the other side of the broker: its effects and its
/// dedupe markers, in the test's schema, on connections the killer
/// spares.
struct Downstream {
    pool: PgPool,
    dedupe: Deduplicator<PostgresStore>,
}

/// What the consumer counted.
#[derive(Default)]
struct Counts {
    /// Records read off the broker.
    records: AtomicUsize,
    /// Records whose effect this delivery committed.
    effects: AtomicUsize,
    /// Records answered `Duplicate`: their id had its effect already.
    duplicates: AtomicUsize,
    /// Offset commits the broker refused (the effects hold regardless).
    offsets_refused: AtomicUsize,
    /// Records that could not be processed as sent: no id, not the
    /// event's JSON, an id reused with another payload.
    refused: Mutex<Vec<String>>,
}

impl Downstream {
    async fn open(ns: &Namespace) -> Downstream {
        // Another application name: the killer looks for the app's.
        let url = format!("{}_downstream", ns.url());
        let pool = sqlx::postgres::PgPoolOptions::new()
            .max_connections(4)
            .connect(&url)
            .await
            .expect("the downstream pool connects");
        sqlx::query(
            "CREATE TABLE downstream_effects (message_id TEXT NOT NULL, payment_id TEXT NOT \
             NULL, idempotency_key TEXT NOT NULL, amount BIGINT NOT NULL, currency TEXT NOT NULL)",
        )
        .execute(&pool)
        .await
        .unwrap();
        let store = PostgresStore::new(pool.clone())
            .with_table_name("downstream_records")
            .unwrap();
        store.migrate().await.unwrap();
        Downstream {
            pool,
            dedupe: Deduplicator::new(store, "payments.downstream"),
        }
    }

    /// The effect of one event and its marker, in one transaction; tried
    /// again while the database fails.
    async fn handle(
        &self,
        id: &idem::consumer::kafka::Identity,
        event: &Value,
    ) -> Result<Handled<()>, idem::Error> {
        let insert = "INSERT INTO downstream_effects \
                      (message_id, payment_id, idempotency_key, amount, currency) \
                      VALUES ($1, $2, $3, $4, $5)";
        let mut failures = 0;
        loop {
            let attempt = async {
                let mut tx = self.pool.begin().await.map_err(idem::Error::store)?;
                let handled = self
                    .dedupe
                    .process_in_transaction(&mut tx, id.key(), id.message(), |tx| async {
                        let done = sqlx::query(insert)
                            .bind(id.key().as_str())
                            .bind(event["payment_id"].as_str())
                            .bind(event["idempotency_key"].as_str())
                            .bind(event["amount"].as_i64())
                            .bind(event["currency"].as_str())
                            .execute(&mut **tx)
                            .await
                            .map(drop)
                            .map_err(idem::Error::store);
                        (done, tx)
                    })
                    .await?;
                tx.commit().await.map_err(idem::Error::store)?;
                Ok::<_, idem::Error>(handled)
            };
            match attempt.await {
                Err(err) if err.is_retryable() && failures < 20 => {
                    failures += 1;
                    tokio::time::sleep(Duration::from_millis(100)).await;
                }
                result => return result,
            }
        }
    }
}

/// Reads `topic` from its start until `stop` is sent: each record
/// deduplicated by its `idem-message-id` header, its offset committed after
/// its effect.
async fn consume(
    topic: String,
    downstream: Arc<Downstream>,
    counts: Arc<Counts>,
    mut stop: watch::Receiver<bool>,
) {
    let consumer: StreamConsumer = ClientConfig::new()
        .set("bootstrap.servers", brokers())
        .set("group.id", common::fresh("idem-test-outbox-soak"))
        .set("enable.auto.commit", "false")
        .set("auto.offset.reset", "earliest")
        .create()
        .expect("a consumer");
    // Assigned, not subscribed: one consumer, no group to join.
    let mut partitions = rdkafka::TopicPartitionList::new();
    for partition in 0..PARTITIONS {
        partitions
            .add_partition_offset(&topic, partition, rdkafka::Offset::Beginning)
            .unwrap();
    }
    consumer
        .assign(&partitions)
        .expect("assign the topic's partitions");
    let by_id = KeyFrom::header(MESSAGE_ID_HEADER).unwrap();
    loop {
        let received = tokio::select! {
            _ = stop.changed() => return,
            record = consumer.recv() => record,
        };
        let record = match received {
            Ok(record) => record,
            Err(err) => {
                eprintln!("payments_outbox_soak: the consumer: {err}");
                tokio::time::sleep(Duration::from_millis(100)).await;
                continue;
            }
        };
        counts.records.fetch_add(1, Ordering::Relaxed);
        let place = format!(
            "partition {} offset {}",
            record.partition(),
            record.offset()
        );
        let event: Option<Value> = record
            .payload()
            .and_then(|payload| serde_json::from_slice(payload).ok());
        let handled = match (identify(&record, &by_id), event) {
            (Ok(id), Some(event)) if event["payment_id"].is_string() => {
                match downstream.handle(&id, &event).await {
                    Ok(handled) => Ok(handled),
                    Err(idem::Error::KeyReused) => {
                        Err(format!("{place}: its id came with another payload"))
                    }
                    Err(err) => panic!("the downstream database failed for good at {place}: {err}"),
                }
            }
            (Err(err), _) => Err(format!("{place}: {err}")),
            (_, _) => Err(format!("{place}: not a payment.created event")),
        };
        match handled {
            Ok(Handled::Processed(())) => counts.effects.fetch_add(1, Ordering::Relaxed),
            Ok(Handled::Duplicate(())) => counts.duplicates.fetch_add(1, Ordering::Relaxed),
            Err(refused) => {
                counts.refused.lock().unwrap().push(refused);
                0
            }
        };
        if commit_offset(&consumer, &record).is_err() {
            counts.offsets_refused.fetch_add(1, Ordering::Relaxed);
        }
    }
}

// ---------------------------------------------------------------- drain

/// Waits, within `deadline`, until the outbox holds nothing to relay, the
/// consumer has one effect per payment row, and it has read nothing more
/// for [`QUIET`] (a second copy of a record may come after its first).
async fn drained(
    ns: &Namespace,
    outbox: &Outbox<sqlx::Postgres>,
    counts: &Counts,
    deadline: Instant,
) {
    let mut quiet_since: Option<(Instant, usize)> = None;
    while Instant::now() < deadline {
        tokio::time::sleep(Duration::from_millis(250)).await;
        let waiting = outbox.waiting().await.unwrap_or(u64::MAX);
        let rows = payment_count(ns).await;
        let records = counts.records.load(Ordering::Relaxed);
        let effects = counts.effects.load(Ordering::Relaxed);
        if waiting != 0 || effects as i64 != rows {
            quiet_since = None;
            continue;
        }
        match quiet_since {
            Some((since, seen)) if seen == records => {
                if since.elapsed() >= QUIET {
                    return;
                }
            }
            _ => quiet_since = Some((Instant::now(), records)),
        }
    }
}

async fn payment_count(ns: &Namespace) -> i64 {
    let Db::Postgres(admin) = ns.admin() else {
        unreachable!("the soak runs on PostgreSQL")
    };
    let sql = format!("SELECT COUNT(*) FROM {}", ns.table("payments"));
    sqlx::query_scalar(&sql)
        .fetch_one(admin)
        .await
        .unwrap_or(-1)
}

// --------------------------------------------------------------- report

/// A payment row, or the effect of an event, as the test reads them.
#[derive(Clone, Debug, PartialEq, sqlx::FromRow)]
struct Payment {
    id: String,
    idempotency_token: String,
    amount: i64,
    currency: String,
}

/// The figures of the run, and what broke the contract.
#[derive(Default)]
struct Report {
    keys: usize,
    created: usize,
    requests: usize,
    statuses: BTreeMap<String, usize>,
    payments: usize,
    process_kills: usize,
    /// Kills aimed at a relay's round.
    aimed: usize,
    failed_starts: usize,
    /// The time the app was down, kills to listening again.
    down: Duration,
    connection_kills: usize,
    records: usize,
    effects: usize,
    duplicates: usize,
    offsets_refused: usize,
    waiting: u64,
    /// Messages the relays parked (the broker refused them for good).
    parked: u64,
    load: Duration,
    drain: Duration,
    /// Payment rows without an effect (events lost).
    lost: Vec<String>,
    /// Payment rows with more than one effect.
    doubled: Vec<String>,
    /// Effects whose payment does not exist, or differs from the row.
    stray: Vec<String>,
    /// Keys answered 201 without a row, or with another id than the row's.
    unbacked: Vec<String>,
    /// Records the consumer could not process, and answers the clients
    /// could not act on.
    refused: Vec<String>,
    unexpected: Vec<String>,
}

impl Report {
    fn check(&mut self, records: &[KeyRecord], rows: &[Payment], effects: &[Payment]) {
        self.keys = records.len();
        let mut by_payment: HashMap<&str, Vec<&Payment>> = HashMap::new();
        for effect in effects {
            by_payment
                .entry(effect.id.as_str())
                .or_default()
                .push(effect);
        }
        let by_key: HashMap<&str, &Payment> = rows
            .iter()
            .map(|row| (row.idempotency_token.as_str(), row))
            .collect();
        for row in rows {
            match by_payment.remove(row.id.as_str()).unwrap_or_default()[..] {
                [] => self.lost.push(row.id.clone()),
                [effect] if effect == row => {}
                [effect] => self.stray.push(format!("{effect:?} for the row {row:?}")),
                ref more => self
                    .doubled
                    .push(format!("{}: {} effects", row.id, more.len())),
            }
        }
        self.stray.extend(
            by_payment
                .into_keys()
                .map(|id| format!("an effect of {id}, no such payment")),
        );
        for record in records {
            self.unexpected.extend(
                record
                    .unexpected
                    .iter()
                    .map(|u| format!("{}: {u}", record.key)),
            );
            if record.created.is_empty() {
                continue;
            }
            self.created += 1;
            match by_key.get(record.key.as_str()) {
                None => self
                    .unbacked
                    .push(format!("{}: 201, no payment row", record.key)),
                Some(row) if record.created.iter().any(|id| *id != row.id) => {
                    self.unbacked.push(format!(
                        "{}: answered {:?}, the row is {}",
                        record.key, record.created, row.id
                    ));
                }
                Some(_) => {}
            }
        }
        if self.records != self.effects + self.duplicates + self.refused.len() {
            self.refused.push(format!(
                "{} records read, {} effects + {} duplicates + {} refused",
                self.records,
                self.effects,
                self.duplicates,
                self.refused.len()
            ));
        }
        if self.effects != effects.len() {
            self.stray.push(format!(
                "the consumer counted {} effects, its table holds {}",
                self.effects,
                effects.len()
            ));
        }
    }

    fn violations(&self) -> usize {
        self.lost.len()
            + self.doubled.len()
            + self.stray.len()
            + self.unbacked.len()
            + self.refused.len()
            + self.unexpected.len()
            + usize::from(self.waiting != 0)
            + usize::from(self.parked != 0)
    }
}

impl fmt::Display for Report {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        writeln!(
            f,
            "outbox soak: {:.0} s of load, {:.1} s of drain; {} keys ({} answered 201), {} \
             requests; {} payments stored",
            self.load.as_secs_f64(),
            self.drain.as_secs_f64(),
            self.keys,
            self.created,
            self.requests,
            self.payments
        )?;
        writeln!(
            f,
            "  faults: {} kills of the app's process ({} aimed at a relay's round; down {:.1} s \
             in all; {} starts failed and were tried again), {} of its database connections",
            self.process_kills,
            self.aimed,
            self.down.as_secs_f64(),
            self.failed_starts,
            self.connection_kills
        )?;
        writeln!(
            f,
            "  downstream: {} records read (events produced), {} effects, {} duplicates \
             absorbed; {} offset commits refused; {} messages left in the outbox, {} parked",
            self.records,
            self.effects,
            self.duplicates,
            self.offsets_refused,
            self.waiting,
            self.parked
        )?;
        writeln!(f, "  answers: {:?}", self.statuses)?;
        writeln!(
            f,
            "  payments without an effect: {}, with several: {}; stray effects: {}; 201s \
             without their row: {}; records refused: {}; unexpected answers: {}",
            self.lost.len(),
            self.doubled.len(),
            self.stray.len(),
            self.unbacked.len(),
            self.refused.len(),
            self.unexpected.len()
        )?;
        let examples = self
            .lost
            .iter()
            .map(|id| format!("{id}: no effect"))
            .chain(self.doubled.iter().cloned())
            .chain(self.stray.iter().cloned())
            .chain(self.unbacked.iter().cloned())
            .chain(self.refused.iter().cloned())
            .chain(self.unexpected.iter().cloned());
        for example in examples.take(10) {
            writeln!(f, "    {example}")?;
        }
        Ok(())
    }
}

// ------------------------------------------------------------------ run

async fn soak() {
    let ns = Arc::new(Namespace::on(Server::Postgres, "outbox_soak").await);
    let topic = Topic::create("payments-soak", &brokers()).await;
    let downstream = Arc::new(Downstream::open(&ns).await);
    let outbox = Outbox::new(&PostgresStore::new(downstream.pool.clone()));

    let bootstrap = brokers();
    let args = [
        "serve",
        "--addr",
        "127.0.0.1:0",
        "--database-url",
        ns.url(),
        "--gateway-latency-ms",
        GATEWAY_LATENCY_MS,
        "--kafka-brokers",
        &bootstrap,
        "--events-topic",
        &topic.name,
    ];
    let mut apps = Apps {
        args: args.iter().map(|arg| arg.to_string()).collect(),
        kills: 0,
        aimed: 0,
        failed_starts: 0,
        down: Duration::ZERO,
    };
    let app = apps.start().await;
    let (url, url_now) = watch::channel(app.url.clone());

    let counts = Arc::new(Counts::default());
    let (stop_consumer, consumer_stop) = watch::channel(false);
    let consumer = tokio::spawn(consume(
        topic.name.clone(),
        downstream.clone(),
        counts.clone(),
        consumer_stop,
    ));

    let traffic = Arc::new(Traffic::default());
    let started = Instant::now();
    let stop = started + soak_duration();
    let give_up = stop + DRAIN;
    // Faults during the load phase only: the drain shows that everything
    // comes through once nothing is killed.
    let crashing = tokio::spawn(crasher(ns.clone(), apps, app, url, stop));
    let killing = tokio::spawn(connection_killer(ns.clone(), stop));
    let customers = tokio::spawn(customers(url_now, stop, give_up, traffic.clone()));
    let (app, apps) = crashing.await.expect("the crasher task");
    let connection_kills = killing.await.expect("the connection killer");
    let records = customers.await.expect("the customers' task");
    drained(&ns, &outbox, &counts, stop + DRAIN).await;
    let drain = stop.elapsed();
    app.kill().await;
    stop_consumer.send_replace(true);
    consumer.await.expect("the consumer task");

    let Db::Postgres(admin) = ns.admin() else {
        unreachable!("the soak runs on PostgreSQL")
    };
    let rows: Vec<Payment> = sqlx::query_as(&format!(
        "SELECT id, idempotency_token, amount, currency FROM {}",
        ns.table("payments")
    ))
    .fetch_all(admin)
    .await
    .unwrap();
    let effects: Vec<Payment> = sqlx::query_as(&format!(
        "SELECT payment_id AS id, idempotency_key AS idempotency_token, amount, currency FROM {}",
        ns.table("downstream_effects")
    ))
    .fetch_all(admin)
    .await
    .unwrap();

    let waiting = outbox.waiting().await.expect("the outbox's count");
    let parked = outbox
        .parked_count()
        .await
        .expect("the outbox's parked count");
    let mut report = Report {
        requests: traffic.requests.load(Ordering::Relaxed),
        statuses: std::mem::take(&mut *traffic.statuses.lock().unwrap()),
        payments: rows.len(),
        process_kills: apps.kills,
        aimed: apps.aimed,
        failed_starts: apps.failed_starts,
        down: apps.down,
        connection_kills,
        records: counts.records.load(Ordering::Relaxed),
        effects: counts.effects.load(Ordering::Relaxed),
        duplicates: counts.duplicates.load(Ordering::Relaxed),
        offsets_refused: counts.offsets_refused.load(Ordering::Relaxed),
        waiting,
        parked,
        load: stop - started,
        drain,
        refused: std::mem::take(&mut *counts.refused.lock().unwrap()),
        ..Report::default()
    };
    report.check(&records, &rows, &effects);
    eprintln!("{report}");
    assert!(report.payments > 0, "no payment was stored");
    assert!(
        report.process_kills > 0 && report.connection_kills > 0,
        "nothing was killed: the soak tested nothing"
    );
    assert_eq!(
        report.violations(),
        0,
        "the outbox soak broke the contract; the figures are above"
    );
}

#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn payment_created_once_per_payment_under_kills() {
    // The load, the drain, and a minute for the rest.
    let bound = soak_duration() + DRAIN + Duration::from_secs(60);
    tokio::time::timeout(bound, soak())
        .await
        .expect("the soak ended within its bound");
}
