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

use idem::consumer::kafka::{commit_offset, identify, redeliver, Digest, KeyFrom};
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
/// Units of each product in stock at the start.
const STOCK: i64 = 10_000;
const PRODUCTS: [&str; 3] = ["apple", "pear", "plum"];
const EVENT_ID: &str = "event-id";

#[derive(Clone, Debug, Serialize, Deserialize)]
struct OrderPlaced {
    order_id: String,
    customer: String,
    lines: Vec<Line>,
}

#[derive(Clone, Debug, Serialize, Deserialize)]
struct Line {
    sku: String,
    quantity: i64,
}

impl OrderPlaced {
    fn number(n: usize) -> Self {
        let lines = (0..1 + n % 2)
            .map(|i| Line {
                sku: PRODUCTS[(n + i) % PRODUCTS.len()].to_owned(),
                quantity: (n % 4 + 1) as i64,
            })
            .collect();
        OrderPlaced {
            order_id: format!("order-{n:03}"),
            customer: format!("customer-{}", n % 7),
            lines,
        }
    }

    fn units(&self) -> i64 {
        self.lines.iter().map(|l| l.quantity).sum()
    }

    /// The event as the publisher writes it.
    fn encode(&self) -> Vec<u8> {
        serde_json::to_vec(self).expect("an event serializes")
    }

    /// The same event as another writer would put it: every object's
    /// members in reverse order, with whitespace. The bytes differ; the
    /// canonical JSON does not.
    fn re_encode(&self) -> Vec<u8> {
        let lines: Vec<String> = self
            .lines
            .iter()
            .map(|l| format!("{{ \"quantity\": {}, \"sku\": {:?} }}", l.quantity, l.sku))
            .collect();
        format!(
            "{{ \"lines\": [{}], \"customer\": {:?}, \"order_id\": {:?} }}",
            lines.join(", "),
            self.customer,
            self.order_id
        )
        .into_bytes()
    }
}

/// Crash after committing these orders, before committing their offsets.
fn crashes_on(order: &OrderPlaced) -> bool {
    order
        .order_id
        .strip_prefix("order-")
        .and_then(|n| n.parse::<usize>().ok())
        .is_some_and(|n| n % 7 == 3)
}

#[derive(Debug, thiserror::Error)]
enum ShopError {
    #[error("not enough {0} in stock")]
    OutOfStock(String),
    #[error("database: {0}")]
    Db(#[from] sqlx::Error),
    #[error(transparent)]
    Idem(#[from] idem::Error),
}

impl ShopError {
    /// Whether a redelivery may succeed: requeue it; otherwise dead-letter.
    fn is_retryable(&self) -> bool {
        match self {
            ShopError::OutOfStock(_) => false,
            ShopError::Db(_) => true,
            ShopError::Idem(err) => err.is_retryable(),
        }
    }
}

/// The business database, SQLite or PostgreSQL.
trait Shop: Send + Sync + 'static {
    /// Reserves the order's stock and writes its invoice, once per `key`:
    /// the marker and the rows commit together.
    fn handle(
        &self,
        key: &Key,
        message: &Digest,
        order: &OrderPlaced,
    ) -> impl Future<Output = Result<Handled<i64>, ShopError>> + Send;
    /// Invoices written and units reserved.
    fn effects(&self) -> impl Future<Output = Result<(i64, i64), sqlx::Error>> + Send;
    /// Where the data lives, for the report.
    fn describe(&self) -> String;
    /// Drops what the run created.
    fn clean_up(&self) -> impl Future<Output = Result<(), sqlx::Error>> + Send;
}

/// The statements, the same on both databases (sqlx binds `$n` on SQLite
/// too). `{stock}` and `{invoices}` are the run's tables.
const SCHEMA: &[&str] = &[
    "CREATE TABLE {stock} (sku VARCHAR(64) PRIMARY KEY, available BIGINT NOT NULL)",
    "CREATE TABLE {invoices} (order_id VARCHAR(255) NOT NULL, customer VARCHAR(255) NOT NULL, \
     units BIGINT NOT NULL)",
];
const SEED: &str = "INSERT INTO {stock} (sku, available) VALUES ($1, $2)";
const RESERVE: &str =
    "UPDATE {stock} SET available = available - $1 WHERE sku = $2 AND available >= $1";
const INVOICE: &str = "INSERT INTO {invoices} (order_id, customer, units) VALUES ($1, $2, $3)";
const INVOICES: &str = "SELECT COUNT(*) FROM {invoices}";
const AVAILABLE: &str = "SELECT CAST(COALESCE(SUM(available), 0) AS BIGINT) FROM {stock}";

fn sql(template: &str, stock: &str, invoices: &str) -> String {
    template
        .replace("{stock}", stock)
        .replace("{invoices}", invoices)
}

/// The order's lines in one order on every consumer, so that two
/// transactions never lock the same rows in opposite orders.
fn sorted_lines(order: &OrderPlaced) -> Vec<&Line> {
    let mut lines: Vec<&Line> = order.lines.iter().collect();
    lines.sort_by(|a, b| a.sku.cmp(&b.sku));
    lines
}

mod sqlite {
    use super::*;
    use idem::SqliteStore;
    use sqlx::{SqliteConnection, SqlitePool};

    pub(crate) struct SqliteShop {
        dedup: Deduplicator<SqliteStore>,
        pool: SqlitePool,
        dir: tempfile::TempDir,
    }

    impl SqliteShop {
        /// A database file in a temporary directory, removed at the end.
        pub(crate) async fn open() -> Result<Self, BoxError> {
            let dir = tempfile::tempdir()?;
            let url = format!("sqlite://{}", dir.path().join("shop.db").display());
            let store = SqliteStore::connect(&url).await?;
            let pool = store.pool().clone();
            for statement in SCHEMA {
                sqlx::query(&sql(statement, "stock", "invoices"))
                    .execute(&pool)
                    .await?;
            }
            for sku in PRODUCTS {
                sqlx::query(&sql(SEED, "stock", "invoices"))
                    .bind(sku)
                    .bind(STOCK)
                    .execute(&pool)
                    .await?;
            }
            let dedup = Deduplicator::new(store, "orders.reserve-and-invoice");
            Ok(SqliteShop { dedup, pool, dir })
        }
    }

    async fn reserve_and_invoice(
        conn: &mut SqliteConnection,
        order: &OrderPlaced,
    ) -> Result<i64, ShopError> {
        for line in sorted_lines(order) {
            let done = sqlx::query(&sql(RESERVE, "stock", "invoices"))
                .bind(line.quantity)
                .bind(&line.sku)
                .execute(&mut *conn)
                .await?;
            if done.rows_affected() == 0 {
                return Err(ShopError::OutOfStock(line.sku.clone()));
            }
        }
        sqlx::query(&sql(INVOICE, "stock", "invoices"))
            .bind(&order.order_id)
            .bind(&order.customer)
            .bind(order.units())
            .execute(&mut *conn)
            .await?;
        Ok(order.units())
    }

    impl Shop for SqliteShop {
        async fn handle(
            &self,
            key: &Key,
            message: &Digest,
            order: &OrderPlaced,
        ) -> Result<Handled<i64>, ShopError> {
            // SQLite: take the write lock at BEGIN (README: Transactional mode).
            let mut tx = self.pool.begin_with("BEGIN IMMEDIATE").await?;
            let handled = self
                .dedup
                .process_in_transaction(&mut tx, key, message, |tx| async move {
                    let result = reserve_and_invoice(tx, order).await;
                    (result, tx)
                })
                .await;
            match handled {
                Ok(handled) => {
                    tx.commit().await?;
                    Ok(handled)
                }
                Err(err) => {
                    tx.rollback().await?;
                    Err(err)
                }
            }
        }

        async fn effects(&self) -> Result<(i64, i64), sqlx::Error> {
            let invoices: i64 = sqlx::query_scalar(&sql(INVOICES, "stock", "invoices"))
                .fetch_one(&self.pool)
                .await?;
            let available: i64 = sqlx::query_scalar(&sql(AVAILABLE, "stock", "invoices"))
                .fetch_one(&self.pool)
                .await?;
            Ok((invoices, STOCK * PRODUCTS.len() as i64 - available))
        }

        fn describe(&self) -> String {
            format!("SQLite ({})", self.dir.path().join("shop.db").display())
        }

        async fn clean_up(&self) -> Result<(), sqlx::Error> {
            Ok(())
        }
    }
}

#[cfg(feature = "postgres")]
mod postgres {
    use super::*;
    use idem::PostgresStore;
    use sqlx::{PgConnection, PgPool};

    pub(crate) struct PostgresShop {
        dedup: Deduplicator<PostgresStore>,
        pool: PgPool,
        url: String,
        tables: [String; 3],
    }

    impl PostgresShop {
        /// Tables of this run's own: the markers, the stock, the invoices.
        pub(crate) async fn open(run: &str) -> Result<Self, BoxError> {
            let url = std::env::var("IDEM_POSTGRES_URL")
                .unwrap_or_else(|_| "postgres://postgres@127.0.0.1:5432/test".to_owned());
            let pool = PgPool::connect(&url).await.map_err(|err| {
                format!(
                    "cannot reach PostgreSQL at {url} (set IDEM_POSTGRES_URL to the URL of a \
                     reachable server): {err}"
                )
            })?;
            let tables =
                ["records", "stock", "invoices"].map(|t| format!("idem_example_{run}_{t}"));
            let store = PostgresStore::new(pool.clone()).with_table_name(&tables[0])?;
            store.migrate().await?;
            let shop = PostgresShop {
                dedup: Deduplicator::new(store, "orders.reserve-and-invoice"),
                pool,
                url,
                tables,
            };
            for statement in SCHEMA {
                sqlx::query(&shop.sql(statement))
                    .execute(&shop.pool)
                    .await?;
            }
            for sku in PRODUCTS {
                sqlx::query(&shop.sql(SEED))
                    .bind(sku)
                    .bind(STOCK)
                    .execute(&shop.pool)
                    .await?;
            }
            Ok(shop)
        }

        fn sql(&self, template: &str) -> String {
            sql(template, &self.tables[1], &self.tables[2])
        }

        async fn reserve_and_invoice(
            &self,
            conn: &mut PgConnection,
            order: &OrderPlaced,
        ) -> Result<i64, ShopError> {
            for line in sorted_lines(order) {
                let done = sqlx::query(&self.sql(RESERVE))
                    .bind(line.quantity)
                    .bind(&line.sku)
                    .execute(&mut *conn)
                    .await?;
                if done.rows_affected() == 0 {
                    return Err(ShopError::OutOfStock(line.sku.clone()));
                }
            }
            sqlx::query(&self.sql(INVOICE))
                .bind(&order.order_id)
                .bind(&order.customer)
                .bind(order.units())
                .execute(&mut *conn)
                .await?;
            Ok(order.units())
        }
    }

    impl Shop for PostgresShop {
        async fn handle(
            &self,
            key: &Key,
            message: &Digest,
            order: &OrderPlaced,
        ) -> Result<Handled<i64>, ShopError> {
            let mut tx = self.pool.begin().await?;
            let handled = self
                .dedup
                .process_in_transaction(&mut tx, key, message, |tx| async move {
                    let result = self.reserve_and_invoice(tx, order).await;
                    (result, tx)
                })
                .await;
            match handled {
                Ok(handled) => {
                    tx.commit().await?;
                    Ok(handled)
                }
                Err(err) => {
                    tx.rollback().await?;
                    Err(err)
                }
            }
        }

        async fn effects(&self) -> Result<(i64, i64), sqlx::Error> {
            let invoices: i64 = sqlx::query_scalar(&self.sql(INVOICES))
                .fetch_one(&self.pool)
                .await?;
            let available: i64 = sqlx::query_scalar(&self.sql(AVAILABLE))
                .fetch_one(&self.pool)
                .await?;
            Ok((invoices, STOCK * PRODUCTS.len() as i64 - available))
        }

        fn describe(&self) -> String {
            format!(
                "PostgreSQL ({}, tables {})",
                self.url,
                self.tables.join(", ")
            )
        }

        async fn clean_up(&self) -> Result<(), sqlx::Error> {
            for table in &self.tables {
                sqlx::query(&format!("DROP TABLE IF EXISTS {table}"))
                    .execute(&self.pool)
                    .await?;
            }
            sqlx::query("DELETE FROM idem_migrations WHERE table_name = $1")
                .bind(&self.tables[0])
                .execute(&self.pool)
                .await?;
            Ok(())
        }
    }
}

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
