//! Issue 7: exactly-once effects for at-least-once message consumers, on
//! the real RabbitMQ and real databases.
//!
//! A shop consumes `OrderPlaced` events: in one transaction it reserves the
//! stock, writes an invoice and the "processed" marker
//! (`Deduplicator::process_in_transaction`, or `#[idempotent(tx = ...)]`).
//! RabbitMQ redelivers what a consumer did not acknowledge; every case
//! counts the effects. Each case runs on SQLite and on PostgreSQL.
//!
//! RabbitMQ is `amqp://guest:guest@127.0.0.1:5672/%2f` unless
//! `IDEM_AMQP_URL` says otherwise; PostgreSQL is `IDEM_POSTGRES_URL` (see
//! `conformance/servers.rs`). A broker or server that cannot be reached
//! fails the test, naming its variable. Each test has a queue and tables of
//! its own, deleted when it ends, and every wait on the broker is bounded.

#[path = "conformance/servers.rs"]
mod servers;

use std::future::Future;
use std::sync::atomic::{AtomicBool, AtomicUsize, Ordering};
use std::sync::Arc;
use std::time::Duration;

use idem::consumer::{content_key, Deduplicator, Handled};
use idem::{idempotent, AsKey, Key};
use serde::{Deserialize, Serialize};

/// The broker: connections, a queue per test, bounded waits.
mod broker {
    use std::time::{Duration, SystemTime, UNIX_EPOCH};

    use futures::StreamExt;
    use lapin::message::Delivery;
    use lapin::options::{
        BasicAckOptions, BasicConsumeOptions, BasicNackOptions, BasicPublishOptions,
        BasicQosOptions, ConfirmSelectOptions, QueueDeclareOptions, QueueDeleteOptions,
    };
    use lapin::types::{AMQPValue, FieldTable};
    use lapin::{BasicProperties, Channel, Connection, ConnectionProperties, Consumer};

    /// The variable naming the broker.
    pub const VAR: &str = "IDEM_AMQP_URL";
    /// The longest any test waits for the broker.
    pub const WAIT: Duration = Duration::from_secs(10);

    pub fn url() -> String {
        std::env::var(VAR).unwrap_or_else(|_| "amqp://guest:guest@127.0.0.1:5672/%2f".to_owned())
    }

    /// A connection to `url`, or why not, naming the variable.
    pub async fn connect_to(url: &str) -> Result<Connection, String> {
        let why = match tokio::time::timeout(
            WAIT,
            Connection::connect(url, ConnectionProperties::default()),
        )
        .await
        {
            Ok(Ok(conn)) => return Ok(conn),
            Ok(Err(err)) => err.to_string(),
            Err(_) => format!("no answer within {} s", WAIT.as_secs()),
        };
        Err(format!(
            "cannot reach RabbitMQ at {url} (set {VAR} to the URL of a reachable broker): {why}"
        ))
    }

    /// A connection to the test broker, or a failed test.
    pub async fn connect() -> Connection {
        connect_to(&url())
            .await
            .unwrap_or_else(|why| panic!("{why}"))
    }

    /// A queue no other test, process or run uses, deleted when dropped
    /// (and by the broker an hour after its last use, should the process
    /// be killed).
    pub struct Queue {
        pub name: String,
        publisher: Channel,
        _conn: Connection,
    }

    impl Queue {
        pub async fn new(tag: &str) -> Queue {
            let nanos = SystemTime::now()
                .duration_since(UNIX_EPOCH)
                .map(|d| d.as_nanos())
                .unwrap_or(0);
            let name = format!("idem-test-{tag}-{}-{nanos}", std::process::id());
            let conn = connect().await;
            let publisher = bounded("open a channel", conn.create_channel()).await;
            bounded(
                "select publisher confirms",
                publisher.confirm_select(ConfirmSelectOptions::default()),
            )
            .await;
            let mut arguments = FieldTable::default();
            arguments.insert("x-expires".into(), AMQPValue::LongInt(3_600_000));
            bounded(
                "declare the queue",
                publisher.queue_declare(
                    name.as_str().into(),
                    QueueDeclareOptions::default(),
                    arguments,
                ),
            )
            .await;
            Queue {
                name,
                publisher,
                _conn: conn,
            }
        }

        /// Publishes `body` and waits for the broker's confirmation.
        pub async fn publish(&self, body: &[u8]) {
            let confirm = bounded(
                "publish",
                self.publisher.basic_publish(
                    "".into(),
                    self.name.as_str().into(),
                    BasicPublishOptions::default(),
                    body,
                    BasicProperties::default().with_content_type("application/json".into()),
                ),
            )
            .await;
            let confirmation = bounded("the publisher confirmation", confirm).await;
            assert!(confirmation.is_ack(), "the broker refused a message");
        }

        /// A consumer on a channel of its own on `conn`, with at most
        /// `prefetch` unacknowledged deliveries.
        pub async fn consume(&self, conn: &Connection, prefetch: u16) -> (Channel, Consumer) {
            let channel = bounded("open a channel", conn.create_channel()).await;
            bounded(
                "set the prefetch",
                channel.basic_qos(prefetch, BasicQosOptions::default()),
            )
            .await;
            let consumer = bounded(
                "start consuming",
                channel.basic_consume(
                    self.name.as_str().into(),
                    "".into(),
                    BasicConsumeOptions::default(),
                    FieldTable::default(),
                ),
            )
            .await;
            (channel, consumer)
        }
    }

    impl Drop for Queue {
        fn drop(&mut self) {
            let name = std::mem::take(&mut self.name);
            let deleted = std::thread::spawn(move || {
                let runtime = tokio::runtime::Builder::new_current_thread()
                    .enable_all()
                    .build()
                    .expect("a runtime");
                runtime.block_on(async move {
                    let conn = connect_to(&url()).await?;
                    let channel = conn.create_channel().await.map_err(|e| e.to_string())?;
                    let deleted = channel
                        .queue_delete(name.as_str().into(), QueueDeleteOptions::default())
                        .await
                        .map_err(|e| e.to_string());
                    conn.close(200, "done".into()).await.ok();
                    deleted
                })
            })
            .join();
            match deleted {
                Ok(Ok(_)) => {}
                Ok(Err(err)) => eprintln!("deleting the test queue failed: {err}"),
                Err(_) => eprintln!("deleting the test queue panicked"),
            }
        }
    }

    /// Awaits a broker operation for at most [`WAIT`], or fails the test.
    pub async fn bounded<T, E: std::fmt::Display>(
        what: &str,
        op: impl std::future::Future<Output = Result<T, E>>,
    ) -> T {
        match tokio::time::timeout(WAIT, op).await {
            Ok(Ok(value)) => value,
            Ok(Err(err)) => panic!("RabbitMQ: {what}: {err}"),
            Err(_) => panic!("RabbitMQ: {what}: no answer within {} s", WAIT.as_secs()),
        }
    }

    /// The next delivery, within [`WAIT`].
    pub async fn next(consumer: &mut Consumer) -> Delivery {
        match tokio::time::timeout(WAIT, consumer.next()).await {
            Ok(Some(Ok(delivery))) => delivery,
            Ok(Some(Err(err))) => panic!("RabbitMQ: consuming failed: {err}"),
            Ok(None) => panic!("RabbitMQ: the consumer was cancelled"),
            Err(_) => panic!("RabbitMQ: no delivery within {} s", WAIT.as_secs()),
        }
    }

    /// The next delivery if one comes within `wait`.
    pub async fn next_within(consumer: &mut Consumer, wait: Duration) -> Option<Delivery> {
        match tokio::time::timeout(wait, consumer.next()).await {
            Ok(Some(Ok(delivery))) => Some(delivery),
            Ok(Some(Err(err))) => panic!("RabbitMQ: consuming failed: {err}"),
            Ok(None) => panic!("RabbitMQ: the consumer was cancelled"),
            Err(_) => None,
        }
    }

    /// Fails the test if anything is delivered within half a second.
    pub async fn assert_drained(consumer: &mut Consumer) {
        if let Some(delivery) = next_within(consumer, Duration::from_millis(500)).await {
            panic!(
                "unexpected delivery: {}",
                String::from_utf8_lossy(&delivery.data)
            );
        }
    }

    pub async fn ack(delivery: &Delivery) {
        bounded("ack", delivery.ack(BasicAckOptions::default())).await;
    }

    pub async fn requeue(delivery: &Delivery) {
        let options = BasicNackOptions {
            requeue: true,
            ..BasicNackOptions::default()
        };
        bounded("nack", delivery.nack(options)).await;
    }
}

#[derive(Clone, Debug, PartialEq, Serialize, Deserialize)]
pub struct OrderPlaced {
    pub order_id: String,
    pub sku: String,
    pub quantity: i64,
}

fn order(order_id: &str, quantity: i64) -> OrderPlaced {
    OrderPlaced {
        order_id: order_id.to_owned(),
        sku: "apple".to_owned(),
        quantity,
    }
}

/// The event as a publisher would write it.
fn encode(event: &OrderPlaced) -> Vec<u8> {
    serde_json::to_vec(event).unwrap()
}

/// The same event written by another publisher: members in reverse order,
/// with whitespace.
fn re_encode(event: &OrderPlaced) -> Vec<u8> {
    format!(
        "{{ \"quantity\": {}, \"sku\": {:?}, \"order_id\": {:?} }}",
        event.quantity, event.sku, event.order_id
    )
    .into_bytes()
}

/// How the shop keys a message.
#[derive(Clone, Copy, Debug)]
pub enum KeyBy {
    /// Its natural id, `order_id`.
    OrderId,
    /// The SHA-256 of its canonical JSON.
    Content,
}

#[derive(Debug, thiserror::Error)]
pub enum ShopError {
    #[error("the handler failed")]
    Failed,
    #[error("database: {0}")]
    Db(#[from] sqlx::Error),
    #[error("not an OrderPlaced event: {0}")]
    BadMessage(#[from] serde_json::Error),
    #[error(transparent)]
    Idem(#[from] idem::Error),
}

/// Stock available at the start.
const STOCK: i64 = 1_000_000;

/// What every case needs of a shop, whatever its database.
pub trait Shop: Send + Sync + 'static {
    /// Handles one delivery's body through `Deduplicator`, in a
    /// transaction of its own, committed on success and rolled back on
    /// failure.
    fn handle(
        &self,
        body: &[u8],
        key_by: KeyBy,
    ) -> impl Future<Output = Result<Handled<i64>, ShopError>> + Send;
    /// The same through the handler methods annotated `#[idempotent]`.
    fn handle_with_attribute(
        &self,
        body: &[u8],
        key_by: KeyBy,
    ) -> impl Future<Output = Result<i64, ShopError>> + Send;
    /// How many invoices were written.
    fn invoices(&self) -> impl Future<Output = i64> + Send;
    /// How much stock was reserved.
    fn reserved(&self) -> impl Future<Output = i64> + Send;
    /// The processed marker of `key`, if any.
    fn marker(&self, key: &Key) -> impl Future<Output = Option<idem::Record>> + Send;
    /// Purges the expired markers.
    fn purge(&self) -> impl Future<Output = u64> + Send;
    /// Makes the next handler run fail after its writes.
    fn fail_next(&self);
}

/// A shop on one SQL database: the store, the deduplicator, and the
/// business tables.
macro_rules! sql_shop {
    ($shop:ident, $db:ty, $store:ty, $param:literal, $begin:expr) => {
        pub struct $shop {
            store: $store,
            dedup: Deduplicator<$store>,
            pool: sqlx::Pool<$db>,
            stock: String,
            invoices: String,
            fail_next: AtomicBool,
            _guard: Box<dyn std::any::Any + Send + Sync>,
        }

        impl $shop {
            async fn new(
                store: $store,
                pool: sqlx::Pool<$db>,
                stock: String,
                invoices: String,
                retention: Duration,
                guard: Box<dyn std::any::Any + Send + Sync>,
            ) -> Self {
                let shop = $shop {
                    dedup: Deduplicator::new(store.clone(), "orders.reserve").retention(retention),
                    store,
                    pool,
                    stock,
                    invoices,
                    fail_next: AtomicBool::new(false),
                    _guard: guard,
                };
                for statement in [
                    "CREATE TABLE {stock} (sku VARCHAR(64) PRIMARY KEY, available BIGINT NOT NULL)",
                    "CREATE TABLE {invoices} (order_id VARCHAR(255) NOT NULL, quantity BIGINT NOT NULL)",
                ] {
                    sqlx::query(&shop.sql(statement))
                        .execute(&shop.pool)
                        .await
                        .unwrap();
                }
                sqlx::query(&shop.sql("INSERT INTO {stock} (sku, available) VALUES ('apple', {p}1)"))
                    .bind(STOCK)
                    .execute(&shop.pool)
                    .await
                    .unwrap();
                shop
            }

            fn sql(&self, template: &str) -> String {
                template
                    .replace("{stock}", &self.stock)
                    .replace("{invoices}", &self.invoices)
                    .replace("{p}", $param)
            }

            async fn begin(&self) -> Result<sqlx::Transaction<'static, $db>, sqlx::Error> {
                match $begin {
                    Some(statement) => self.pool.begin_with(statement).await,
                    None => self.pool.begin().await,
                }
            }

            /// The effects: reserve the stock, write the invoice.
            async fn apply(
                &self,
                tx: &mut sqlx::Transaction<'_, $db>,
                event: &OrderPlaced,
            ) -> Result<i64, ShopError> {
                sqlx::query(&self.sql(
                    "UPDATE {stock} SET available = available - {p}1 WHERE sku = {p}2",
                ))
                .bind(event.quantity)
                .bind(&event.sku)
                .execute(&mut **tx)
                .await?;
                sqlx::query(&self.sql(
                    "INSERT INTO {invoices} (order_id, quantity) VALUES ({p}1, {p}2)",
                ))
                .bind(&event.order_id)
                .bind(event.quantity)
                .execute(&mut **tx)
                .await?;
                if self.fail_next.swap(false, Ordering::SeqCst) {
                    return Err(ShopError::Failed);
                }
                Ok(event.quantity)
            }

            /// A consumer handler made idempotent by its natural key.
            #[idempotent(key = event.order_id, store = self.store, tx = tx, ttl = "14d",
                         scope = "orders.reserve-by-attribute")]
            async fn on_order_placed(
                &self,
                tx: &mut sqlx::Transaction<'_, $db>,
                event: OrderPlaced,
            ) -> Result<i64, ShopError> {
                self.apply(tx, &event).await
            }

            /// A consumer handler made idempotent by the message's content.
            #[idempotent(key = idem::consumer::content_key(&message)?, store = self.store,
                         tx = tx, scope = "orders.reserve-by-content")]
            async fn on_message(
                &self,
                tx: &mut sqlx::Transaction<'_, $db>,
                message: serde_json::Value,
            ) -> Result<i64, ShopError> {
                let event: OrderPlaced = serde_json::from_value(message)?;
                self.apply(tx, &event).await
            }
        }

        impl Shop for $shop {
            async fn handle(&self, body: &[u8], key_by: KeyBy) -> Result<Handled<i64>, ShopError> {
                // The message as received is what identifies it: every
                // member, in canonical form.
                let message: serde_json::Value = serde_json::from_slice(body)?;
                let event: OrderPlaced = serde_json::from_value(message.clone())?;
                let key = match key_by {
                    KeyBy::OrderId => event.order_id.to_key().map_err(idem::Error::from)?,
                    KeyBy::Content => content_key(&message)?,
                };
                let mut tx = self.begin().await?;
                let handled = self
                    .dedup
                    .process_in_transaction(&mut tx, &key, &message, |tx| async move {
                        let result = self.apply(tx, &event).await;
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

            async fn handle_with_attribute(&self, body: &[u8], key_by: KeyBy) -> Result<i64, ShopError> {
                let mut tx = self.begin().await?;
                let result = match key_by {
                    KeyBy::OrderId => {
                        self.on_order_placed(&mut tx, serde_json::from_slice(body)?).await
                    }
                    KeyBy::Content => self.on_message(&mut tx, serde_json::from_slice(body)?).await,
                };
                match result {
                    Ok(value) => {
                        tx.commit().await?;
                        Ok(value)
                    }
                    Err(err) => {
                        tx.rollback().await?;
                        Err(err)
                    }
                }
            }

            async fn invoices(&self) -> i64 {
                sqlx::query_scalar(&self.sql("SELECT COUNT(*) FROM {invoices}"))
                    .fetch_one(&self.pool)
                    .await
                    .unwrap()
            }

            async fn reserved(&self) -> i64 {
                let available: i64 =
                    sqlx::query_scalar(&self.sql("SELECT available FROM {stock} WHERE sku = 'apple'"))
                        .fetch_one(&self.pool)
                        .await
                        .unwrap();
                STOCK - available
            }

            async fn marker(&self, key: &Key) -> Option<idem::Record> {
                idem::Store::get(self.dedup.store(), self.dedup.scope(), key)
                    .await
                    .unwrap()
            }

            async fn purge(&self) -> u64 {
                self.dedup.purge_expired(100).await.unwrap()
            }

            fn fail_next(&self) {
                self.fail_next.store(true, Ordering::SeqCst);
            }
        }
    };
}

sql_shop!(
    SqliteShop,
    sqlx::Sqlite,
    idem::SqliteStore,
    "?",
    // A transaction that reads before it writes must hold the write lock
    // from the start on SQLite (README: Transactional mode).
    Some("BEGIN IMMEDIATE")
);
sql_shop!(
    PostgresShop,
    sqlx::Postgres,
    idem::PostgresStore,
    "$",
    None::<&'static str>
);

/// A shop on a SQLite file of its own.
async fn sqlite_shop(retention: Duration) -> SqliteShop {
    let dir = tempfile::tempdir().unwrap();
    let url = format!("sqlite://{}", dir.path().join("shop.db").display());
    let store = idem::SqliteStore::connect(&url).await.unwrap();
    let pool = store.pool().clone();
    let (stock, invoices) = ("stock".to_owned(), "invoices".to_owned());
    SqliteShop::new(store, pool, stock, invoices, retention, Box::new(dir)).await
}

/// A shop on PostgreSQL, in tables of its own dropped at the end.
async fn postgres_shop(retention: Duration) -> PostgresShop {
    let server = servers::Server::Postgres;
    let servers::Db::Postgres(pool) = server.pool(16).await else {
        unreachable!()
    };
    let mut tables = servers::DropTables::new(server);
    let records = tables.add(servers::unique_table("cmrec"));
    let stock = tables.add(servers::unique_table("cmstock"));
    let invoices = tables.add(servers::unique_table("cminv"));
    let store = idem::PostgresStore::new(pool.clone())
        .with_table_name(&records)
        .unwrap();
    store.migrate().await.unwrap();
    PostgresShop::new(store, pool, stock, invoices, retention, Box::new(tables)).await
}

/// The cases, as plain functions of a shop.
mod cases {
    use super::*;
    use broker::Queue;

    pub async fn redelivery_after_a_crash_before_the_ack(shop: impl Shop) {
        let queue = Queue::new("crash").await;
        let event = order("o-1", 3);
        queue.publish(&encode(&event)).await;

        // The first consumer processes and commits, then crashes (its
        // connection goes away) before acknowledging.
        let crashed = broker::connect().await;
        let (_channel, mut consumer) = queue.consume(&crashed, 1).await;
        let first = broker::next(&mut consumer).await;
        assert!(!first.redelivered);
        let handled = shop.handle(&first.data, KeyBy::OrderId).await.unwrap();
        assert_eq!(handled, Handled::Processed(3));
        broker::bounded("close the connection", crashed.close(320, "crash".into())).await;

        // RabbitMQ redelivers it to the next consumer: a duplicate, acked.
        let conn = broker::connect().await;
        let (_channel, mut consumer) = queue.consume(&conn, 1).await;
        let again = broker::next(&mut consumer).await;
        assert!(again.redelivered, "the broker flags the redelivery");
        assert_eq!(again.data, first.data);
        let handled = shop.handle(&again.data, KeyBy::OrderId).await.unwrap();
        assert_eq!(handled, Handled::Duplicate(3));
        broker::ack(&again).await;
        broker::assert_drained(&mut consumer).await;

        assert_eq!((shop.invoices().await, shop.reserved().await), (1, 3));
        let marker = shop.marker(&Key::new("o-1").unwrap()).await.unwrap();
        assert_eq!(marker.state, idem::State::Completed);
    }

    pub async fn a_failed_handler_leaves_nothing_and_the_redelivery_succeeds(shop: impl Shop) {
        let queue = Queue::new("fail").await;
        queue.publish(&encode(&order("o-2", 4))).await;
        let conn = broker::connect().await;
        let (_channel, mut consumer) = queue.consume(&conn, 1).await;

        shop.fail_next();
        let delivery = broker::next(&mut consumer).await;
        let err = shop
            .handle(&delivery.data, KeyBy::OrderId)
            .await
            .unwrap_err();
        assert!(matches!(err, ShopError::Failed), "{err:?}");
        // The handler's writes and the marker rolled back together.
        assert_eq!((shop.invoices().await, shop.reserved().await), (0, 0));
        assert!(shop.marker(&Key::new("o-2").unwrap()).await.is_none());
        broker::requeue(&delivery).await;

        let again = broker::next(&mut consumer).await;
        assert!(again.redelivered);
        let handled = shop.handle(&again.data, KeyBy::OrderId).await.unwrap();
        assert_eq!(handled, Handled::Processed(4));
        broker::ack(&again).await;
        broker::assert_drained(&mut consumer).await;
        assert_eq!((shop.invoices().await, shop.reserved().await), (1, 4));
        assert!(shop.marker(&Key::new("o-2").unwrap()).await.is_some());
    }

    pub async fn content_hash_dedupes_re_encoded_events_only(shop: impl Shop) {
        let queue = Queue::new("content").await;
        let event = order("c-1", 2);
        let bodies: Vec<Vec<u8>> = vec![
            encode(&event),
            re_encode(&event),
            b"{\"sku\":\"apple\",\n  \"order_id\":\"c-1\",\"quantity\":2}".to_vec(),
            // Different events: another quantity, another order.
            encode(&order("c-1", 5)),
            encode(&order("c-2", 2)),
        ];
        // The copies differ byte for byte: only the canonical form is one.
        for (i, a) in bodies.iter().enumerate() {
            for b in &bodies[i + 1..] {
                assert_ne!(a, b);
            }
        }
        for body in &bodies {
            queue.publish(body).await;
        }
        let conn = broker::connect().await;
        let (_channel, mut consumer) = queue.consume(&conn, 5).await;
        let mut answers = Vec::new();
        for _ in &bodies {
            let delivery = broker::next(&mut consumer).await;
            let handled = shop.handle(&delivery.data, KeyBy::Content).await.unwrap();
            answers.push(handled);
            broker::ack(&delivery).await;
        }
        broker::assert_drained(&mut consumer).await;
        assert_eq!(
            answers,
            [
                Handled::Processed(2),
                Handled::Duplicate(2),
                Handled::Duplicate(2),
                Handled::Processed(5),
                Handled::Processed(2),
            ]
        );
        assert_eq!((shop.invoices().await, shop.reserved().await), (3, 9));
    }

    #[derive(Debug, Default)]
    struct Tally {
        delivered: usize,
        redelivered: usize,
        processed: usize,
        duplicates: usize,
        crashes: usize,
        requeued: usize,
    }

    impl std::ops::AddAssign for Tally {
        fn add_assign(&mut self, o: Tally) {
            self.delivered += o.delivered;
            self.redelivered += o.redelivered;
            self.processed += o.processed;
            self.duplicates += o.duplicates;
            self.crashes += o.crashes;
            self.requeued += o.requeued;
        }
    }

    /// One of many consumers: handles and acks until every message was
    /// acknowledged. After its `crash_after`-th message it drops its
    /// channel, after committing but before acking, and opens another.
    async fn consumer<S: Shop>(
        shop: Arc<S>,
        queue: Arc<Queue>,
        acked: Arc<AtomicUsize>,
        total: usize,
        crash_after: usize,
    ) -> Tally {
        let conn = broker::connect().await;
        let mut tally = Tally::default();
        let mut crashed = false;
        'channels: while acked.load(Ordering::SeqCst) < total {
            let (channel, mut consumer) = queue.consume(&conn, 2).await;
            let mut handled_here = 0;
            while acked.load(Ordering::SeqCst) < total {
                let Some(delivery) =
                    broker::next_within(&mut consumer, Duration::from_millis(200)).await
                else {
                    continue;
                };
                tally.delivered += 1;
                tally.redelivered += usize::from(delivery.redelivered);
                match shop.handle(&delivery.data, KeyBy::OrderId).await {
                    Ok(Handled::Processed(_)) => tally.processed += 1,
                    Ok(Handled::Duplicate(_)) => tally.duplicates += 1,
                    Err(ShopError::Idem(err)) if err.is_retryable() => {
                        tally.requeued += 1;
                        broker::requeue(&delivery).await;
                        continue;
                    }
                    Err(ShopError::Db(err)) => {
                        // A busy database: let the message come back.
                        tally.requeued += 1;
                        eprintln!("requeued after a database error: {err}");
                        broker::requeue(&delivery).await;
                        continue;
                    }
                    Err(err) => panic!("the handler failed: {err}"),
                }
                handled_here += 1;
                if !crashed && handled_here == crash_after {
                    crashed = true;
                    tally.crashes += 1;
                    broker::bounded("drop the channel", channel.close(200, "crash".into())).await;
                    continue 'channels;
                }
                broker::ack(&delivery).await;
                acked.fetch_add(1, Ordering::SeqCst);
            }
        }
        conn.close(200, "done".into()).await.ok();
        tally
    }

    pub async fn eight_consumers_with_duplicates_apply_each_effect_once<S: Shop>(shop: S) {
        let shop = Arc::new(shop);
        let queue = Arc::new(Queue::new("storm").await);
        let orders: Vec<OrderPlaced> = (0..40)
            .map(|i| order(&format!("s-{i}"), i % 5 + 1))
            .collect();
        // Duplicates right behind the original, so that copies are often
        // in flight on two consumers at once.
        let mut published = 0;
        for (i, event) in orders.iter().enumerate() {
            queue.publish(&encode(event)).await;
            published += 1;
            if i % 3 == 0 {
                queue.publish(&encode(event)).await;
                published += 1;
            }
            if i % 4 == 0 {
                queue.publish(&re_encode(event)).await;
                published += 1;
            }
        }
        let acked = Arc::new(AtomicUsize::new(0));
        let consumers: Vec<_> = (0..8)
            .map(|i| {
                tokio::spawn(consumer(
                    shop.clone(),
                    queue.clone(),
                    acked.clone(),
                    published,
                    2 + i % 3,
                ))
            })
            .collect();
        let mut tally = Tally::default();
        let all = async {
            for consumer in consumers {
                tally += consumer.await.unwrap();
            }
        };
        tokio::time::timeout(Duration::from_secs(90), all)
            .await
            .unwrap_or_else(|_| {
                panic!(
                    "the consumers did not ack all {published} messages within 90 s ({} acked)",
                    acked.load(Ordering::SeqCst)
                )
            });
        eprintln!("{published} published, {tally:?}");

        let distinct = orders.len() as i64;
        let quantities: i64 = orders.iter().map(|o| o.quantity).sum();
        assert_eq!(shop.invoices().await, distinct);
        assert_eq!(shop.reserved().await, quantities);
        assert_eq!(tally.processed, orders.len());
        assert_eq!(acked.load(Ordering::SeqCst), published);
        // 64 deliveries at least, to 8 consumers: one handled 8 or more,
        // so it passed its crash point (2 to 4).
        assert!(tally.crashes > 0, "{tally:?}");
        assert!(
            tally.redelivered >= tally.crashes,
            "each dropped channel's unacked message comes back: {tally:?}"
        );
        assert_eq!(
            tally.processed + tally.duplicates,
            tally.delivered - tally.requeued
        );
    }

    pub async fn the_attribute_on_consumer_handlers(shop: impl Shop) {
        let queue = Queue::new("attribute").await;
        let by_id = order("a-1", 6);
        let by_content = order("a-2", 7);
        let deliveries = [
            (encode(&by_id), KeyBy::OrderId),
            (encode(&by_id), KeyBy::OrderId),
            (encode(&by_content), KeyBy::Content),
            (re_encode(&by_content), KeyBy::Content),
        ];
        for (body, _) in &deliveries {
            queue.publish(body).await;
        }
        let conn = broker::connect().await;
        let (_channel, mut consumer) = queue.consume(&conn, 4).await;
        let mut values = Vec::new();
        for (_, key_by) in &deliveries {
            let delivery = broker::next(&mut consumer).await;
            values.push(
                shop.handle_with_attribute(&delivery.data, *key_by)
                    .await
                    .unwrap(),
            );
            broker::ack(&delivery).await;
        }
        broker::assert_drained(&mut consumer).await;
        assert_eq!(values, [6, 6, 7, 7]);
        assert_eq!((shop.invoices().await, shop.reserved().await), (2, 13));
    }

    pub async fn markers_are_kept_for_the_retention_then_purged(kept: impl Shop, short: impl Shop) {
        let body = encode(&order("r-1", 1));
        let key = Key::new("r-1").unwrap();
        let first = kept.handle(&body, KeyBy::OrderId).await.unwrap();
        assert_eq!(first, Handled::Processed(1));
        let marker = kept.marker(&key).await.unwrap();
        let fourteen_days = 14 * 24 * 60 * 60 * 1000;
        assert!(marker.expires_at - marker.created_at >= fourteen_days - 1_000);

        // With a short retention the marker expires, is purged, and a late
        // copy is processed again.
        assert!(short.handle(&body, KeyBy::OrderId).await.unwrap() == Handled::Processed(1));
        assert!(short
            .handle(&body, KeyBy::OrderId)
            .await
            .unwrap()
            .is_duplicate());
        tokio::time::sleep(Duration::from_millis(400)).await;
        assert_eq!(short.purge().await, 1);
        assert!(short.marker(&key).await.is_none());
        assert_eq!(
            short.handle(&body, KeyBy::OrderId).await.unwrap(),
            Handled::Processed(1)
        );
        assert_eq!(short.invoices().await, 2);
        // The long-lived marker was not purged.
        assert_eq!(kept.purge().await, 0);
        assert!(kept
            .handle(&body, KeyBy::OrderId)
            .await
            .unwrap()
            .is_duplicate());
    }
}

macro_rules! consumer_suite {
    ($backend:ident, $shop:path) => {
        mod $backend {
            use super::*;

            const DEFAULT: Duration = Deduplicator::<()>::DEFAULT_RETENTION;

            #[tokio::test(flavor = "multi_thread", worker_threads = 2)]
            async fn redelivery_after_a_crash_before_the_ack_applies_the_effect_once() {
                cases::redelivery_after_a_crash_before_the_ack($shop(DEFAULT).await).await;
            }

            #[tokio::test(flavor = "multi_thread", worker_threads = 2)]
            async fn a_failed_handler_leaves_nothing_and_the_redelivery_succeeds() {
                cases::a_failed_handler_leaves_nothing_and_the_redelivery_succeeds(
                    $shop(DEFAULT).await,
                )
                .await;
            }

            #[tokio::test(flavor = "multi_thread", worker_threads = 2)]
            async fn content_hash_dedupes_re_encoded_events_only() {
                cases::content_hash_dedupes_re_encoded_events_only($shop(DEFAULT).await).await;
            }

            #[tokio::test(flavor = "multi_thread", worker_threads = 4)]
            async fn eight_consumers_with_duplicates_apply_each_effect_once() {
                cases::eight_consumers_with_duplicates_apply_each_effect_once($shop(DEFAULT).await)
                    .await;
            }

            #[tokio::test(flavor = "multi_thread", worker_threads = 2)]
            async fn the_attribute_on_consumer_handlers() {
                cases::the_attribute_on_consumer_handlers($shop(DEFAULT).await).await;
            }

            #[tokio::test(flavor = "multi_thread", worker_threads = 2)]
            async fn markers_are_kept_for_the_retention_then_purged() {
                cases::markers_are_kept_for_the_retention_then_purged(
                    $shop(DEFAULT).await,
                    $shop(Duration::from_millis(300)).await,
                )
                .await;
            }
        }
    };
}

consumer_suite!(sqlite, sqlite_shop);
consumer_suite!(postgres, postgres_shop);

#[tokio::test]
async fn an_unreachable_broker_fails_naming_the_variable() {
    let why = match broker::connect_to("amqp://guest:guest@127.0.0.1:1/%2f").await {
        Ok(_) => panic!("nothing listens on port 1"),
        Err(why) => why,
    };
    assert!(why.contains("IDEM_AMQP_URL"), "{why}");
}
