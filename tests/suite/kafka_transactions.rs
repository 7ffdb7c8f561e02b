//! Consume, transform, produce with Kafka transactions
//! (`idem::consumer::kafka::transactions`), on the Kafka-protocol test
//! broker (Tansu, over TCP) and on librdkafka's mock cluster (in process),
//! with SQLite for the effects.
//!
//! A transformer reads `order` records (an `event-id` header each; some
//! sent twice by their producer), writes one invoice row per order and the
//! dedupe marker in one database transaction, and produces one `invoice`
//! record per order in a Kafka transaction with the input's offset. It
//! "crashes" once before the database committed (the record is then
//! processed afresh), and twice after the database committed and before
//! Kafka's commit: its
//! Kafka transaction is left open, and its consumer and producer are
//! dropped. The transformer started in its place (the same group, the same
//! `transactional.id`, whose registration aborts the open transaction)
//! reads the record again, finds it a duplicate, and produces the stored
//! output again with the same id.
//!
//! At the end: one invoice row per order; the group's committed offsets
//! are past every input record; downstream, the `invoice` topic read from
//! the start and deduplicated on `idem-message-id` holds one invoice per
//! order, each with the id derived from its order. The copies that reached
//! the topic (an order sent twice is produced twice, and neither test
//! broker hides an aborted copy from `read_committed` readers) are counted
//! and printed.

use crate::common;

use std::collections::{BTreeMap, BTreeSet};
use std::time::{Duration, Instant};

use common::backend::Guard;
use common::kafka::{brokers, Topic};
use idem::consumer::kafka::transactions::{output_id, Outputs, TransactionalProducer};
use idem::consumer::kafka::{identify, redeliver, KeyFrom};
use idem::consumer::Deduplicator;
use idem::outbox::{Message, MESSAGE_ID_HEADER};
use idem::SqliteStore;
use rdkafka::consumer::{BaseConsumer, Consumer, StreamConsumer};
use rdkafka::message::{Header, Headers, OwnedHeaders};
use rdkafka::mocking::MockCluster;
use rdkafka::producer::{FutureProducer, FutureRecord};
use rdkafka::types::{RDKafkaApiKey, RDKafkaRespErr};
use rdkafka::{ClientConfig, Message as _, Offset, TopicPartitionList};

const SCOPE: &str = "invoices.issue";
const ORDERS: usize = 12;
/// Orders whose producer sends them twice.
const SENT_TWICE: [usize; 2] = [3, 8];
/// The transformer crashes after the database commit of its n-th record.
const CRASH_AFTER: [usize; 2] = [4, 9];
/// The transformer crashes before the database commit of its n-th record.
const CRASH_BEFORE_DB_COMMIT: usize = 6;
const WAIT: Duration = Duration::from_secs(120);

fn order(n: usize) -> (String, String) {
    (
        format!("order-{n:02}"),
        format!(r#"{{"order":"order-{n:02}","amount":{}}}"#, 100 + n),
    )
}

async fn produce_orders(bootstrap: &str, topic: &str) -> usize {
    let producer: FutureProducer = ClientConfig::new()
        .set("bootstrap.servers", bootstrap)
        .set("enable.idempotence", "true")
        .create()
        .expect("a producer");
    let mut sends = Vec::new();
    for n in 0..ORDERS {
        sends.push(n);
        if SENT_TWICE.contains(&n) {
            sends.push(n);
        }
    }
    for &n in &sends {
        let (id, payload) = order(n);
        let record =
            FutureRecord::to(topic)
                .key(&id)
                .payload(&payload)
                .headers(OwnedHeaders::new().insert(Header {
                    key: "event-id",
                    value: Some(&id),
                }));
        producer
            .send(record, Duration::from_secs(20))
            .await
            .map_err(|(err, _)| err)
            .expect("the order acknowledged");
    }
    sends.len()
}

fn consumer(bootstrap: &str, group: &str, topic: &str) -> StreamConsumer {
    let consumer: StreamConsumer = ClientConfig::new()
        .set("bootstrap.servers", bootstrap)
        .set("group.id", group)
        .set("enable.auto.commit", "false")
        .set("auto.offset.reset", "earliest")
        .set("isolation.level", "read_committed")
        .set("session.timeout.ms", "6000")
        .create()
        .expect("a consumer");
    consumer.subscribe(&[topic]).expect("subscribed");
    consumer
}

/// What the transformers did.
#[derive(Debug, Default)]
struct Counts {
    records: usize,
    processed: usize,
    duplicates: usize,
    crashes: usize,
    crashes_before: usize,
    aborted: usize,
    /// The records the group committed past, at the end.
    committed: usize,
}

/// Transforms until every input record's Kafka transaction committed.
/// With a mock cluster, the Kafka commit of the 3rd processed order fails
/// as an abortable error and that of the 7th fences the producer (a fatal
/// error).
async fn transform(
    bootstrap: &str,
    store: &SqliteStore,
    orders: &str,
    invoices: &str,
    group: &str,
    inputs: usize,
    mock: Option<&MockCluster<'static, rdkafka::producer::DefaultProducerContext>>,
) -> Counts {
    let dedup = Deduplicator::new(store.clone(), SCOPE);
    let by_event_id = KeyFrom::header("event-id").unwrap();
    let transactional_id = common::fresh("idem-test-invoicer");
    let producer_config = || {
        ClientConfig::new()
            .set("bootstrap.servers", bootstrap)
            .set("transactional.id", &transactional_id)
            .set("transaction.timeout.ms", "60000")
            .clone()
    };
    let mut counts = Counts::default();
    let mut done = BTreeSet::new();
    let deadline = Instant::now() + WAIT;
    'restart: loop {
        let source = consumer(bootstrap, group, orders);
        let producer = TransactionalProducer::new(&producer_config())
            .await
            .expect("the transactional producer registered")
            .with_timeout(Duration::from_secs(20));
        loop {
            assert!(
                Instant::now() < deadline,
                "the transform within {WAIT:?}: {counts:?}"
            );
            if done.len() == inputs {
                counts.committed = committed(&source, orders);
                return counts;
            }
            let record = match tokio::time::timeout(Duration::from_secs(1), source.recv()).await {
                Err(_) => continue,
                Ok(record) => record.expect("a record"),
            };
            counts.records += 1;
            let id = identify(&record, &by_event_id).expect("an event id");
            let payload = record.payload().unwrap_or_default().to_vec();
            let mut kafka = producer.begin().await.expect("a Kafka transaction");
            let mut tx = store.pool().begin_with("BEGIN IMMEDIATE").await.unwrap();
            let invoice_topic = invoices.to_owned();
            let handled = dedup
                .process_in_transaction(&mut *tx, id.key(), id.message(), |tx| async move {
                    let written = sqlx::query("INSERT INTO invoices (order_event) VALUES (?)")
                        .bind(&payload)
                        .execute(&mut *tx)
                        .await
                        .map_err(idem::Error::store);
                    let outputs = written.and_then(|_| {
                        Ok(Outputs::one(
                            Message::new(&invoice_topic, payload)?.with_key("invoice")?,
                        ))
                    });
                    (outputs, tx)
                })
                .await
                .expect("processed");
            if handled.is_duplicate() {
                counts.duplicates += 1;
            } else {
                counts.processed += 1;
            }
            // A duplicate produces the stored invoice again, with its id.
            let invoice = Message::new(invoices, record.payload().unwrap_or_default())
                .unwrap()
                .with_key("invoice")
                .unwrap();
            assert_eq!(handled.value(), &Outputs::one(invoice.clone()));
            let produced = kafka
                .produce(dedup.scope(), &id, handled.value())
                .await
                .expect("the invoice produced");
            assert_eq!(
                produced,
                vec![output_id(dedup.scope(), &id, &invoice).unwrap()]
            );
            kafka
                .send_offsets(&source, &record)
                .await
                .expect("the offset in the transaction");
            if !handled.is_duplicate()
                && counts.processed == CRASH_BEFORE_DB_COMMIT
                && counts.crashes_before == 0
            {
                // Dies before the database commits: the effect rolls back,
                // the Kafka transaction stays open. The record is processed
                // again, afresh.
                counts.crashes_before += 1;
                counts.processed -= 1;
                drop(tx);
                drop(kafka);
                drop(record);
                drop(producer);
                drop(source);
                continue 'restart;
            }
            tx.commit().await.unwrap();
            if !handled.is_duplicate() && CRASH_AFTER.contains(&counts.processed) {
                // Dies between the two commits: the Kafka transaction stays
                // open, the consumer and the producer are gone.
                counts.crashes += 1;
                drop(kafka);
                drop(record);
                drop(producer);
                drop(source);
                continue 'restart;
            }
            if let (Some(cluster), false) = (mock, handled.is_duplicate()) {
                let error = match counts.processed {
                    3 => Some(RDKafkaRespErr::RD_KAFKA_RESP_ERR_UNKNOWN_PRODUCER_ID),
                    7 => Some(RDKafkaRespErr::RD_KAFKA_RESP_ERR_PRODUCER_FENCED),
                    _ => None,
                };
                if let Some(error) = error {
                    cluster.request_errors(RDKafkaApiKey::EndTxn, &[error]);
                }
            }
            match kafka.commit().await {
                Ok(()) => {
                    done.insert((record.partition(), record.offset()));
                }
                Err(_) => {
                    counts.aborted += 1;
                    redeliver(&source, &record).expect("read again");
                }
            }
        }
    }
}

/// How many records of `topic` the group has committed past.
fn committed(consumer: &StreamConsumer, topic: &str) -> usize {
    let Ok(offsets) = consumer.committed(Duration::from_secs(5)) else {
        return 0;
    };
    offsets
        .elements_for_topic(topic)
        .iter()
        .map(|e| match e.offset() {
            Offset::Offset(n) => usize::try_from(n).unwrap_or(0),
            _ => 0,
        })
        .sum()
}

/// Every record of `topic`, from the start, read without a group: its
/// `idem-message-id` and payload.
fn read_all(bootstrap: &str, topic: &str) -> Vec<(String, String)> {
    let reader: BaseConsumer = ClientConfig::new()
        .set("bootstrap.servers", bootstrap)
        .set("group.id", common::fresh("idem-test-reader"))
        .set("enable.auto.commit", "false")
        .set("isolation.level", "read_committed")
        .create()
        .expect("a reader");
    let metadata = reader
        .fetch_metadata(Some(topic), Duration::from_secs(10))
        .expect("metadata");
    let mut assignment = TopicPartitionList::new();
    let mut ends = BTreeMap::new();
    for partition in metadata.topics()[0].partitions() {
        let (_, high) = reader
            .fetch_watermarks(topic, partition.id(), Duration::from_secs(10))
            .expect("watermarks");
        ends.insert(partition.id(), high);
        assignment
            .add_partition_offset(topic, partition.id(), Offset::Beginning)
            .unwrap();
    }
    reader.assign(&assignment).expect("assigned");
    let mut seen = Vec::new();
    let deadline = Instant::now() + Duration::from_secs(30);
    // The position, not the last record's offset: a transaction's commit
    // marker takes an offset and is no record.
    let at_end = |reader: &BaseConsumer| {
        let positions = reader.position().expect("positions");
        ends.iter().all(|(&partition, &high)| {
            matches!(
                positions.find_partition(topic, partition).map(|e| e.offset()),
                Some(Offset::Offset(n)) if n >= high
            ) || high == 0
        })
    };
    loop {
        let Some(message) = reader.poll(Duration::from_millis(200)) else {
            if at_end(&reader) {
                break;
            }
            assert!(
                Instant::now() < deadline,
                "read {topic} to its end: {ends:?}"
            );
            continue;
        };
        let message = message.expect("a record");
        let id = message
            .headers()
            .and_then(|h| h.iter().find(|h| h.key == MESSAGE_ID_HEADER))
            .and_then(|h| h.value)
            .map(|v| String::from_utf8(v.to_vec()).unwrap())
            .expect("an id header");
        let payload = String::from_utf8(message.payload().unwrap_or_default().to_vec()).unwrap();
        seen.push((id, payload));
    }
    seen
}

/// A topic on the test broker, or on a mock cluster.
enum Topics<'c> {
    Broker,
    Mock(&'c MockCluster<'static, rdkafka::producer::DefaultProducerContext>),
}

impl Topics<'_> {
    async fn create(&self, tag: &str, bootstrap: &str) -> (String, Option<Topic>) {
        match self {
            Topics::Broker => {
                let topic = Topic::create(tag, bootstrap).await;
                (topic.name.clone(), Some(topic))
            }
            Topics::Mock(cluster) => {
                let name = common::fresh(&format!("idem-test-{tag}"));
                cluster
                    .create_topic(&name, common::kafka::PARTITIONS, 1)
                    .expect("a mock topic");
                (name, None)
            }
        }
    }
}

async fn one_invoice_per_order(bootstrap: &str, topics: Topics<'_>, label: &str) {
    let guard = Guard::temp_dir();
    let store = SqliteStore::connect(&format!("sqlite://{}", guard.path("invoices.db").display()))
        .await
        .unwrap();
    sqlx::query("CREATE TABLE invoices (order_event BLOB NOT NULL)")
        .execute(store.pool())
        .await
        .unwrap();
    let (orders, _orders) = topics.create("txn-orders", bootstrap).await;
    let (invoices, _invoices) = topics.create("txn-invoices", bootstrap).await;
    let inputs = produce_orders(bootstrap, &orders).await;
    let group = common::fresh("idem-test-invoicers");
    let mock = match topics {
        Topics::Mock(cluster) => Some(cluster),
        Topics::Broker => None,
    };
    let counts = transform(bootstrap, &store, &orders, &invoices, &group, inputs, mock).await;

    // One invoice row per order, in the database.
    let rows: Vec<(Vec<u8>,)> = sqlx::query_as("SELECT order_event FROM invoices")
        .fetch_all(store.pool())
        .await
        .unwrap();
    let mut effects: BTreeMap<String, usize> = BTreeMap::new();
    for (payload,) in rows {
        *effects
            .entry(String::from_utf8(payload).unwrap())
            .or_default() += 1;
    }
    let expected: BTreeMap<String, usize> = (0..ORDERS).map(|n| (order(n).1, 1)).collect();
    assert_eq!(effects, expected, "one invoice row per order");

    // Downstream: one invoice per order once deduplicated, with its id.
    let copies = read_all(bootstrap, &invoices);
    let ids: BTreeSet<&str> = copies.iter().map(|(id, _)| id.as_str()).collect();
    let by_event_id = KeyFrom::header("event-id").unwrap();
    let mut wanted = BTreeSet::new();
    for n in 0..ORDERS {
        let (id, payload) = order(n);
        let input = rdkafka::message::OwnedMessage::new(
            Some(payload.clone().into_bytes()),
            None,
            orders.clone(),
            rdkafka::Timestamp::NotAvailable,
            0,
            0,
            Some(OwnedHeaders::new().insert(Header {
                key: "event-id",
                value: Some(&id),
            })),
        );
        let identity = identify(&input, &by_event_id).unwrap();
        let output = Message::new(&invoices, payload)
            .unwrap()
            .with_key("invoice")
            .unwrap();
        wanted.insert(
            output_id(&idem::Scope::new(SCOPE), &identity, &output)
                .unwrap()
                .to_string(),
        );
    }
    assert_eq!(
        ids,
        wanted.iter().map(String::as_str).collect(),
        "one invoice id per order downstream"
    );
    for (id, payload) in &copies {
        let first = copies.iter().find(|(other, _)| other == id).unwrap();
        assert_eq!(&first.1, payload, "every copy of {id} is the same invoice");
    }
    assert_eq!(
        (counts.crashes, counts.crashes_before),
        (CRASH_AFTER.len(), 1),
        "{counts:?}"
    );
    match mock {
        // The mock cluster takes transactional offset commits without
        // keeping them.
        Some(_) => assert_eq!(counts.aborted, 2, "{counts:?}"),
        None => {
            assert_eq!(
                counts.committed, inputs,
                "offsets committed past every order: {counts:?}"
            );
            assert_eq!(counts.aborted, 0, "{counts:?}");
        }
    }
    assert_eq!(counts.processed, ORDERS, "{counts:?}");
    // Each crash and each order sent twice came back as a duplicate.
    assert!(
        counts.duplicates >= CRASH_AFTER.len() + SENT_TWICE.len(),
        "{counts:?}"
    );
    println!(
        "kafka_transactions::{label}: {inputs} order records ({ORDERS} orders), {} deliveries, \
         {} processed, {} duplicates, {} crashes between the commits, {} before the database's, \
         {} commits failed and \
         aborted; downstream {} invoice records, {} after dedupe",
        counts.records,
        counts.processed,
        counts.duplicates,
        counts.crashes,
        counts.crashes_before,
        counts.aborted,
        copies.len(),
        ids.len()
    );
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn tansu() {
    one_invoice_per_order(&brokers(), Topics::Broker, "tansu").await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn mock_cluster() {
    let cluster = MockCluster::new(1).expect("a mock cluster");
    one_invoice_per_order(
        &cluster.bootstrap_servers(),
        Topics::Mock(&cluster),
        "mock_cluster",
    )
    .await;
}

/// The record is read again after its database commit (the Kafka commit
/// failed, or the process died before it): the duplicate carries the
/// stored outputs, however large they were allowed to be.
async fn redelivery_gets_the_stored_outputs(outputs: Outputs) {
    let guard = Guard::temp_dir();
    let store = SqliteStore::connect(&format!("sqlite://{}", guard.path("big.db").display()))
        .await
        .unwrap();
    let dedup = Deduplicator::new(store.clone(), SCOPE);
    let mut tx = store.pool().begin().await.unwrap();
    let first = dedup
        .process_in_transaction(&mut *tx, "order-1", &"payload", |tx| {
            let outputs = outputs.clone();
            async move { (Ok::<_, idem::Error>(outputs), tx) }
        })
        .await
        .unwrap();
    tx.commit().await.unwrap();
    assert!(!first.is_duplicate());
    let mut tx = store.pool().begin().await.unwrap();
    let again = dedup
        .process_in_transaction(&mut *tx, "order-1", &"payload", |tx| async move {
            (Ok::<_, idem::Error>(Outputs::none()), tx)
        })
        .await
        .expect("the stored outputs");
    tx.rollback().await.unwrap();
    assert!(again.is_duplicate());
    assert_eq!(again.value(), &outputs);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_largest_outputs_survive_a_redelivery() {
    use idem::outbox::{InvalidMessage, MAX_MESSAGE_BYTES};
    // Text: three of the largest messages fit, a fourth is refused when
    // the handler builds its outputs, before anything commits.
    let text = Message::new("reports", "x".repeat(MAX_MESSAGE_BYTES)).unwrap();
    let three = Outputs::one(text.clone())
        .with(text.clone())
        .unwrap()
        .with(text.clone())
        .unwrap();
    assert!(matches!(
        three.clone().with(text),
        Err(InvalidMessage::OutputsTooLarge(_))
    ));
    redelivery_gets_the_stored_outputs(three).await;
    // Bytes that are not text, kept in base64.
    let binary = Outputs::one(Message::new("invoice.pdf", vec![0xffu8; 600_000]).unwrap())
        .with(Message::new("invoice.pdf", vec![0xfeu8; 600_000]).unwrap())
        .unwrap()
        .with(Message::new("invoice.pdf", vec![0x00u8; 600_000]).unwrap())
        .unwrap();
    redelivery_gets_the_stored_outputs(binary).await;
}
