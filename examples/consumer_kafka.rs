//! Exactly-once effects from an at-least-once Kafka topic.
//!
//! A producer sends `OrderPlaced` events to a topic of this run's own, each
//! with its order id in an `event-id` header: some twice (a producer's
//! retry), some again with the same content written in another member
//! order (a relay that re-serializes). Three consumers in one group reserve
//! the stock and write an invoice for each order, in one database
//! transaction with the "processed" marker
//! (`Deduplicator::process_in_transaction`), and commit the record's offset
//! only after that transaction. Some consumers crash after committing an
//! order but before committing its offset: the group rebalances, the
//! partition's next owner reads the record again, and the redelivery is
//! answered `Duplicate` and its offset committed without touching the stock
//! again.
//!
//! At the end it prints what was delivered and what was applied, and
//! exits non-zero unless every distinct order was applied exactly once.
//!
//! ```sh
//! cargo run --example consumer_kafka --features kafka                                   # SQLite
//! cargo run --example consumer_kafka --features kafka,postgres -- postgres              # PostgreSQL
//! cargo run --example consumer_kafka --features kafka -- sqlite --by-content            # keyed by content hash
//! cargo run --example consumer_kafka --features kafka -- sqlite --by-field              # keyed by the order_id member
//! ```
//!
//! Kafka: `127.0.0.1:9092`, or the bootstrap servers in `IDEM_KAFKA_BROKERS`
//! (`.ci/kafka-broker start` runs a local broker). PostgreSQL:
//! `postgres://postgres@127.0.0.1:5432/test`, or `IDEM_POSTGRES_URL`; the
//! run's tables are dropped at the end, and so is the topic.

use std::collections::HashSet;
use std::error::Error as StdError;
use std::future::Future;
use std::process::ExitCode;
use std::sync::atomic::{AtomicUsize, Ordering};
use std::sync::{Arc, Mutex};
use std::time::{Duration, SystemTime, UNIX_EPOCH};

use idem::consumer::kafka::{commit_offset, identify, redeliver, KeyFrom};
use idem::consumer::{Deduplicator, Handled};
use idem::Key;
use rdkafka::admin::{AdminClient, AdminOptions, NewTopic, TopicReplication};
use rdkafka::client::DefaultClientContext;
use rdkafka::consumer::{Consumer, StreamConsumer};
use rdkafka::message::{Header, OwnedHeaders};
use rdkafka::producer::{FutureProducer, FutureRecord};
use rdkafka::{ClientConfig, Message};
use serde::{Deserialize, Serialize};

type BoxError = Box<dyn StdError + Send + Sync>;

const ORDERS: usize = 30;
const CONSUMERS: usize = 3;
const PARTITIONS: i32 = 3;
/// The longest the run may take before it gives up.
const DEADLINE: Duration = Duration::from_secs(120);
/// The header that carries an event's natural id.
const EVENT_ID: &str = "event-id";

include!("shop/common.rs");

#[derive(Debug, Default)]
struct Counters {
    delivered: AtomicUsize,
    crashes: AtomicUsize,
    processed: AtomicUsize,
    duplicates: AtomicUsize,
    retried: AtomicUsize,
    dead_lettered: AtomicUsize,
    /// The records (partition, offset) whose offset was committed: done
    /// with.
    settled: Mutex<HashSet<(i32, i64)>>,
    /// The orders a consumer already crashed on: it crashes once per order.
    crashed_on: Mutex<HashSet<String>>,
}

impl Counters {
    fn settle(&self, partition: i32, offset: i64) {
        self.settled.lock().unwrap().insert((partition, offset));
    }

    fn settled(&self) -> usize {
        self.settled.lock().unwrap().len()
    }

    /// Whether to crash on this order now: the first time only.
    fn crash_now(&self, order: &OrderPlaced) -> bool {
        crashes_on(order)
            && self
                .crashed_on
                .lock()
                .unwrap()
                .insert(order.order_id.clone())
    }
}

fn bump(counter: &AtomicUsize) {
    counter.fetch_add(1, Ordering::SeqCst);
}

fn read(counter: &AtomicUsize) -> usize {
    counter.load(Ordering::SeqCst)
}

fn brokers() -> String {
    std::env::var("IDEM_KAFKA_BROKERS").unwrap_or_else(|_| "127.0.0.1:9092".to_owned())
}

/// A consumer of the group: offsets committed by hand, and short session
/// and poll bounds so that a crashed member's partitions move on within
/// seconds.
fn consumer(group: &str) -> Result<StreamConsumer, BoxError> {
    Ok(ClientConfig::new()
        .set("bootstrap.servers", brokers())
        .set("group.id", group)
        .set("enable.auto.commit", "false")
        .set("auto.offset.reset", "earliest")
        .set("session.timeout.ms", "6000")
        .set("heartbeat.interval.ms", "500")
        .set("max.poll.interval.ms", "6000")
        .create()?)
}

/// One consumer: handles records until every record is settled. On an
/// order that `crashes_on`, first time only, it dies after the database
/// commit and before the offset commit: the client is dropped, it leaves
/// the group, and the partition's next owner reads the record again. It
/// then joins the group again, as a restarted process would.
async fn consume<S: Shop>(
    id: usize,
    shop: Arc<S>,
    topic: String,
    group: String,
    key_from: KeyFrom,
    counters: Arc<Counters>,
    total: usize,
) -> Result<(), BoxError> {
    'members: while counters.settled() < total {
        let consumer = consumer(&group)?;
        consumer.subscribe(&[&topic])?;
        while counters.settled() < total {
            let record =
                match tokio::time::timeout(Duration::from_millis(200), consumer.recv()).await {
                    Err(_) => continue,
                    Ok(record) => record?,
                };
            bump(&counters.delivered);
            let (partition, offset) = (record.partition(), record.offset());

            // What identifies the record, and the typed event the handler
            // works with.
            let identified = identify(&record, &key_from).map_err(idem::Error::from);
            let order = record
                .payload()
                .ok_or_else(|| "no payload".to_owned())
                .and_then(|p| serde_json::from_slice::<OrderPlaced>(p).map_err(|e| e.to_string()));
            let (identity, order) = match (identified, order) {
                (Ok(identity), Ok(order)) => (identity, order),
                (Err(err), _) => {
                    eprintln!("consumer {id}: dead-lettering a record with no valid key: {err}");
                    bump(&counters.dead_lettered);
                    commit_offset(&consumer, &record)?;
                    counters.settle(partition, offset);
                    continue;
                }
                (_, Err(err)) => {
                    eprintln!("consumer {id}: dead-lettering a malformed record: {err}");
                    bump(&counters.dead_lettered);
                    commit_offset(&consumer, &record)?;
                    counters.settle(partition, offset);
                    continue;
                }
            };

            match shop
                .handle(identity.key(), identity.message(), &order)
                .await
            {
                Ok(handled) => {
                    bump(if handled.is_duplicate() {
                        &counters.duplicates
                    } else {
                        &counters.processed
                    });
                    if counters.crash_now(&order) {
                        bump(&counters.crashes);
                        let what = if handled.is_duplicate() {
                            "a duplicate, nothing committed"
                        } else {
                            "processed and committed"
                        };
                        println!(
                            "consumer {id}: crashed before committing the offset of {} ({what})",
                            order.order_id
                        );
                        drop(record);
                        drop(consumer);
                        continue 'members;
                    }
                    // The effect is committed: now the offset. A refusal
                    // (the partition moved in a rebalance) leaves the
                    // record to its next owner, as a duplicate.
                    match commit_offset(&consumer, &record) {
                        Ok(()) => counters.settle(partition, offset),
                        Err(err) => eprintln!(
                            "consumer {id}: offset of {} not committed, its next owner \
                             gets a duplicate: {err}",
                            order.order_id
                        ),
                    }
                }
                Err(err) if err.is_retryable() => {
                    // Nothing was committed: read the record again.
                    eprintln!("consumer {id}: retrying {}: {err}", order.order_id);
                    bump(&counters.retried);
                    tokio::time::sleep(Duration::from_millis(100)).await;
                    if let Err(err) = redeliver(&consumer, &record) {
                        eprintln!("consumer {id}: the partition moved on: {err}");
                    }
                }
                Err(err) => {
                    eprintln!("consumer {id}: dead-lettering {}: {err}", order.order_id);
                    bump(&counters.dead_lettered);
                    commit_offset(&consumer, &record)?;
                    counters.settle(partition, offset);
                }
            }
        }
    }
    Ok(())
}

fn admin() -> Result<AdminClient<DefaultClientContext>, BoxError> {
    Ok(ClientConfig::new()
        .set("bootstrap.servers", brokers())
        .create()?)
}

/// Creates the topic, or says why not.
async fn create_topic(topic: &str) -> Result<(), BoxError> {
    let admin = admin()?;
    let options = AdminOptions::new().operation_timeout(Some(Duration::from_secs(10)));
    let created = tokio::time::timeout(
        Duration::from_secs(15),
        admin.create_topics(
            &[NewTopic::new(topic, PARTITIONS, TopicReplication::Fixed(1))],
            &options,
        ),
    )
    .await
    .map_err(|_| {
        format!(
            "no Kafka broker answered at {} within 15 s (set IDEM_KAFKA_BROKERS to the \
             bootstrap servers of a reachable broker)",
            brokers()
        )
    })??;
    for result in created {
        result.map_err(|(topic, code)| format!("cannot create topic {topic}: {code}"))?;
    }
    Ok(())
}

/// Produces, consumes, and reports. `Ok(true)` when every distinct order
/// was applied exactly once.
async fn run<S: Shop>(
    shop: S,
    key_by: &str,
    key_from: KeyFrom,
    run_id: &str,
) -> Result<bool, BoxError> {
    let shop = Arc::new(shop);
    let topic = format!("idem-example-orders-{run_id}");
    let group = format!("idem-example-shop-{run_id}");
    create_topic(&topic).await?;
    let producer: FutureProducer = ClientConfig::new()
        .set("bootstrap.servers", brokers())
        .set("enable.idempotence", "true")
        .create()?;

    // Every order once; every 4th again right away (a producer's retry);
    // every 5th again at the end, re-encoded (a relay's copy, late). Each
    // record is keyed by its order (Kafka's partitioning key) and carries
    // the event's id in a header.
    let orders: Vec<OrderPlaced> = (1..=ORDERS).map(OrderPlaced::number).collect();
    let mut records = Vec::new();
    let (mut twice, mut re_encoded) = (0, 0);
    for (n, order) in (1..).zip(&orders) {
        records.push((order, order.encode()));
        if n % 4 == 0 {
            records.push((order, order.encode()));
            twice += 1;
        }
    }
    for (n, order) in (1..).zip(&orders) {
        if n % 5 == 0 {
            records.push((order, order.re_encode()));
            re_encoded += 1;
        }
    }
    let total = records.len();

    println!(
        "topic     {topic} ({PARTITIONS} partitions) on {}",
        brokers()
    );
    println!("group     {group}, {CONSUMERS} consumers");
    println!("database  {}", shop.describe());
    println!("keyed by  {key_by}\n");

    let counters = Arc::new(Counters::default());
    let consumers: Vec<_> = (1..=CONSUMERS)
        .map(|id| {
            tokio::spawn(consume(
                id,
                shop.clone(),
                topic.clone(),
                group.clone(),
                key_from.clone(),
                counters.clone(),
                total,
            ))
        })
        .collect();
    for (order, body) in &records {
        let headers = OwnedHeaders::new().insert(Header {
            key: EVENT_ID,
            value: Some(order.order_id.as_str()),
        });
        producer
            .send(
                FutureRecord::to(&topic)
                    .key(&order.order_id)
                    .payload(body)
                    .headers(headers),
                Duration::from_secs(10),
            )
            .await
            .map_err(|(err, _)| format!("the broker refused a record: {err}"))?;
    }

    let finished = tokio::time::timeout(DEADLINE, async {
        for consumer in consumers {
            consumer.await??;
        }
        Ok::<_, BoxError>(())
    })
    .await;
    // The topic lives in the broker until deleted.
    let admin = admin()?;
    admin
        .delete_topics(&[&topic], &AdminOptions::new())
        .await
        .ok();
    match finished {
        Ok(result) => result?,
        Err(_) => {
            return Err(format!(
                "the consumers did not settle all {total} records within {} s ({} settled)",
                DEADLINE.as_secs(),
                counters.settled()
            )
            .into())
        }
    }

    let (invoices, reserved) = shop.effects().await?;
    shop.clean_up().await?;
    let distinct = orders.len() as i64;
    let expected_units: i64 = orders.iter().map(OrderPlaced::units).sum();
    let c = &counters;
    println!();
    println!(
        "produced       {total} records for {distinct} distinct orders \
         ({twice} sent twice, {re_encoded} re-encoded)"
    );
    println!("delivered      {}", read(&c.delivered));
    println!(
        "crashes        {} (after the database commit, before the offset commit)",
        read(&c.crashes)
    );
    println!(
        "handler        {} processed, {} duplicates committed without running",
        read(&c.processed),
        read(&c.duplicates)
    );
    println!(
        "retried        {}, dead-lettered {}",
        read(&c.retried),
        read(&c.dead_lettered)
    );
    println!(
        "effects        {invoices} invoices, {reserved} units reserved \
         (expected {distinct} and {expected_units})"
    );
    let exact = invoices == distinct && reserved == expected_units;
    if exact {
        println!("\nOK: every distinct order was applied exactly once");
    } else {
        println!("\nFAILED: the effects do not match the distinct orders");
    }
    Ok(exact)
}

#[tokio::main]
async fn main() -> ExitCode {
    let args: Vec<String> = std::env::args().skip(1).collect();
    let (key_by, key_from) = if args.iter().any(|a| a == "--by-content") {
        (
            "content (SHA-256 of the canonical JSON)",
            KeyFrom::content(),
        )
    } else if args.iter().any(|a| a == "--by-field") {
        (
            "the order_id member",
            KeyFrom::field("order_id").expect("a name"),
        )
    } else {
        (
            "the event-id header",
            KeyFrom::header(EVENT_ID).expect("a name"),
        )
    };
    let database = args
        .iter()
        .find(|a| !a.starts_with("--"))
        .map_or("sqlite", String::as_str);
    let nanos = SystemTime::now()
        .duration_since(UNIX_EPOCH)
        .map_or(0, |d| d.as_nanos());
    let run_id = format!("{}_{nanos}", std::process::id());

    let result = match database {
        "sqlite" => match sqlite::SqliteShop::open().await {
            Ok(shop) => run(shop, key_by, key_from, &run_id).await,
            Err(err) => Err(err),
        },
        #[cfg(feature = "postgres")]
        "postgres" => match postgres::PostgresShop::open(&run_id).await {
            Ok(shop) => run(shop, key_by, key_from, &run_id).await,
            Err(err) => Err(err),
        },
        #[cfg(not(feature = "postgres"))]
        "postgres" => Err("PostgreSQL needs `--features postgres`".into()),
        other => Err(format!("unknown database {other:?}: `sqlite` or `postgres`").into()),
    };
    match result {
        Ok(true) => ExitCode::SUCCESS,
        Ok(false) => ExitCode::FAILURE,
        Err(err) => {
            eprintln!("error: {err}");
            ExitCode::from(2)
        }
    }
}
