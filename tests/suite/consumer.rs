//! Exactly-once effects for at-least-once message consumers, on the real
//! RabbitMQ and real databases.
//!
//! A shop consumes `OrderPlaced` events: in one transaction it reserves the
//! stock, writes an invoice and the "processed" marker
//! (`Deduplicator::process_in_transaction`, or `#[idempotent(tx = ...)]`).
//! RabbitMQ redelivers what a consumer did not acknowledge; every case
//! counts the effects. Each case runs on SQLite and on PostgreSQL; the
//! `on_redis` cases deduplicate on Redis and on a Redis Cluster.
//!
//! RabbitMQ is `amqp://guest:guest@127.0.0.1:5672/%2f` unless
//! `IDEM_AMQP_URL` says otherwise; PostgreSQL is `IDEM_POSTGRES_URL` (see
//! `common/`). A broker or server that cannot be reached
//! fails the test, naming its variable. Each test has a queue and tables of
//! its own, deleted when it ends, and every wait on the broker is bounded.

use crate::common;

use std::future::Future;
use std::sync::atomic::{AtomicBool, AtomicUsize, Ordering};
use std::sync::Arc;
use std::time::Duration;

use common::backend::Guard;
use common::broker;
use idem::consumer::{content_key_of_json, Deduplicator, Handled};
use idem::{idempotent, AsKey, Key};
use serde::{Deserialize, Serialize};

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
    fn marker(&self, key: &Key) -> impl Future<Output = Option<idem::record::Record>> + Send;
    /// Purges the expired markers.
    fn purge(&self) -> impl Future<Output = u64> + Send;
    /// Makes the next handler run fail after its writes.
    fn fail_next(&self);
}

/// The statement that begins a shop's transaction: one that reads before
/// it writes must hold the write lock from the start on SQLite (the guide,
/// src/_guide/modes.md: Transactional mode).
fn begin_statement(backend: &str) -> Option<&'static str> {
    (backend == "sqlite_file").then_some("BEGIN IMMEDIATE")
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
        assert_eq!(marker.state, idem::record::State::Completed);
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

common::backends!(sqlite_file, postgres => {
    pub struct SqlShop {
        store: backend::Store,
        dedup: Deduplicator<backend::Store>,
        pool: sqlx::Pool<backend::Database>,
        stock: String,
        invoices: String,
        fail_next: AtomicBool,
        _guard: Guard,
    }

    impl SqlShop {
        async fn new(
            store: backend::Store,
            pool: sqlx::Pool<backend::Database>,
            stock: String,
            invoices: String,
            retention: Duration,
            guard: Guard,
        ) -> Self {
            let shop = SqlShop {
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
                .replace("{p}1", &backend::param(1))
                .replace("{p}2", &backend::param(2))
        }

        async fn begin(&self) -> Result<sqlx::Transaction<'static, backend::Database>, sqlx::Error> {
            match begin_statement(backend::NAME) {
                Some(statement) => self.pool.begin_with(statement).await,
                None => self.pool.begin().await,
            }
        }

        /// The effects: reserve the stock, write the invoice.
        async fn apply(
            &self,
            tx: &mut sqlx::Transaction<'_, backend::Database>,
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
            tx: &mut sqlx::Transaction<'_, backend::Database>,
            event: OrderPlaced,
        ) -> Result<i64, ShopError> {
            self.apply(tx, &event).await
        }

        /// A consumer handler made idempotent by the message's content.
        #[idempotent(key = idem::consumer::content_key(&message)?, store = self.store,
                     tx = tx, scope = "orders.reserve-by-content")]
        async fn on_message(
            &self,
            tx: &mut sqlx::Transaction<'_, backend::Database>,
            message: serde_json::Value,
        ) -> Result<i64, ShopError> {
            let event: OrderPlaced = serde_json::from_value(message)?;
            self.apply(tx, &event).await
        }
    }

    impl Shop for SqlShop {
        async fn handle(&self, body: &[u8], key_by: KeyBy) -> Result<Handled<i64>, ShopError> {
            // The message as received is what identifies it: every
            // member, in canonical form, keyed from its bytes (a parsed
            // `Value` could merge two messages).
            let message: serde_json::Value = serde_json::from_slice(body)?;
            let event: OrderPlaced = serde_json::from_value(message.clone())?;
            let key = match key_by {
                KeyBy::OrderId => event.order_id.to_key().map_err(idem::Error::from)?,
                KeyBy::Content => content_key_of_json(body)?,
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

        async fn marker(&self, key: &Key) -> Option<idem::record::Record> {
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

    /// A shop in tables of its own, dropped at the end (on SQLite, a file
    /// of its own), keeping its markers for `retention`.
    async fn shop(retention: Duration) -> SqlShop {
        let (store, mut guard) = backend::store(16).await;
        let pool = store.pool().clone();
        let (stock, invoices) = (guard.table("cmstock"), guard.table("cminv"));
        SqlShop::new(store, pool, stock, invoices, retention, guard).await
    }

    const DEFAULT: Duration = Deduplicator::<()>::DEFAULT_RETENTION;

    #[tokio::test(flavor = "multi_thread", worker_threads = 2)]
    async fn redelivery_after_a_crash_before_the_ack_applies_the_effect_once() {
        cases::redelivery_after_a_crash_before_the_ack(shop(DEFAULT).await).await;
    }

    #[tokio::test(flavor = "multi_thread", worker_threads = 2)]
    async fn a_failed_handler_leaves_nothing_and_the_redelivery_succeeds() {
        cases::a_failed_handler_leaves_nothing_and_the_redelivery_succeeds(
            shop(DEFAULT).await,
        )
        .await;
    }

    #[tokio::test(flavor = "multi_thread", worker_threads = 2)]
    async fn content_hash_dedupes_re_encoded_events_only() {
        cases::content_hash_dedupes_re_encoded_events_only(shop(DEFAULT).await).await;
    }

    #[tokio::test(flavor = "multi_thread", worker_threads = 4)]
    async fn eight_consumers_with_duplicates_apply_each_effect_once() {
        cases::eight_consumers_with_duplicates_apply_each_effect_once(shop(DEFAULT).await)
            .await;
    }

    #[tokio::test(flavor = "multi_thread", worker_threads = 2)]
    async fn the_attribute_on_consumer_handlers() {
        cases::the_attribute_on_consumer_handlers(shop(DEFAULT).await).await;
    }

    #[tokio::test(flavor = "multi_thread", worker_threads = 2)]
    async fn markers_are_kept_for_the_retention_then_purged() {
        cases::markers_are_kept_for_the_retention_then_purged(
            shop(DEFAULT).await,
            shop(Duration::from_millis(300)).await,
        )
        .await;
    }
});

#[tokio::test]
async fn an_unreachable_broker_fails_naming_the_variable() {
    let why = match broker::connect_to("amqp://guest:guest@127.0.0.1:1/%2f").await {
        Ok(_) => panic!("nothing listens on port 1"),
        Err(why) => why,
    };
    assert!(why.contains("IDEM_AMQP_URL"), "{why}");
}

/// Consumers deduplicating on Redis and on a Redis Cluster
/// (`Deduplicator::process`: the marker lives in Redis, beside no
/// transaction, so the effect here is the handler's own and counted in
/// memory). A redelivery after a crash before the ack is a duplicate, and
/// 4 consumers over duplicated and redelivered messages apply each effect
/// once.
#[cfg(feature = "redis")]
mod on_redis {
    use std::collections::HashMap;
    use std::sync::Mutex;

    use super::*;
    use broker::Queue;
    use common::redis::{unique_prefix, DeleteKeys, Redis};

    /// The effects applied, by order id.
    #[derive(Default)]
    struct Effects(Mutex<HashMap<String, usize>>);

    impl Effects {
        fn apply(&self, event: &OrderPlaced) -> i64 {
            *self
                .0
                .lock()
                .unwrap()
                .entry(event.order_id.clone())
                .or_default() += 1;
            event.quantity
        }

        fn counts(&self) -> HashMap<String, usize> {
            self.0.lock().unwrap().clone()
        }
    }

    async fn handle(
        dedup: &Deduplicator<idem::RedisStore>,
        effects: &Effects,
        body: &[u8],
    ) -> Result<Handled<i64>, ShopError> {
        let event: OrderPlaced = serde_json::from_slice(body)?;
        dedup
            .process(&event.order_id, &event, async { Ok(effects.apply(&event)) })
            .await
    }

    async fn redelivery_after_a_crash_is_a_duplicate(redis: Redis) {
        let prefix = unique_prefix("consumer");
        let _keys = DeleteKeys {
            redis,
            prefix: prefix.clone(),
        };
        let dedup = Deduplicator::new(redis.store(&prefix).await, "orders.reserve");
        let effects = Effects::default();
        let queue = Queue::new("redis-crash").await;
        queue.publish(&encode(&order("r-1", 3))).await;

        let crashed = broker::connect().await;
        let (_channel, mut consumer) = queue.consume(&crashed, 1).await;
        let first = broker::next(&mut consumer).await;
        let handled = handle(&dedup, &effects, &first.data).await.unwrap();
        assert_eq!(handled, Handled::Processed(3));
        broker::bounded("close the connection", crashed.close(320, "crash".into())).await;

        let conn = broker::connect().await;
        let (_channel, mut consumer) = queue.consume(&conn, 1).await;
        let again = broker::next(&mut consumer).await;
        assert!(again.redelivered);
        let handled = handle(&dedup, &effects, &again.data).await.unwrap();
        assert_eq!(handled, Handled::Duplicate(3));
        broker::ack(&again).await;
        broker::assert_drained(&mut consumer).await;
        assert_eq!(effects.counts().get("r-1"), Some(&1));
    }

    async fn many_consumers_apply_each_effect_once(redis: Redis) {
        const ORDERS: usize = 100;
        const CONSUMERS: usize = 4;
        let prefix = unique_prefix("consumers");
        let _keys = DeleteKeys {
            redis,
            prefix: prefix.clone(),
        };
        let effects = Arc::new(Effects::default());
        let queue = Arc::new(Queue::new("redis-many").await);
        // Every order published twice (a publisher's retry).
        for i in 0..ORDERS {
            let body = encode(&order(&format!("m-{i}"), 1 + i as i64 % 5));
            queue.publish(&body).await;
            queue.publish(&body).await;
        }
        let handled = Arc::new(AtomicUsize::new(0));
        let consumers: Vec<_> = (0..CONSUMERS)
            .map(|c| {
                let (queue, effects, handled) = (queue.clone(), effects.clone(), handled.clone());
                let prefix = prefix.clone();
                tokio::spawn(async move {
                    let dedup = Deduplicator::new(redis.store(&prefix).await, "orders.reserve");
                    let mut crashed_once = false;
                    loop {
                        let conn = broker::connect().await;
                        let (_channel, mut consumer) = queue.consume(&conn, 4).await;
                        let mut crashed = false;
                        while let Some(delivery) =
                            broker::next_within(&mut consumer, Duration::from_secs(2)).await
                        {
                            handle(&dedup, &effects, &delivery.data).await.unwrap();
                            // Consumer 0 crashes once, after processing and
                            // before the ack of its 10th message.
                            let n = handled.fetch_add(1, Ordering::SeqCst);
                            if c == 0 && !crashed_once && n >= 10 {
                                crashed_once = true;
                                crashed = true;
                                break;
                            }
                            broker::ack(&delivery).await;
                        }
                        if crashed {
                            broker::bounded("crash", conn.close(320, "crash".into())).await;
                            continue;
                        }
                        return;
                    }
                })
            })
            .collect();
        for consumer in consumers {
            tokio::time::timeout(Duration::from_secs(120), consumer)
                .await
                .expect("the consumers finished within 120 s")
                .unwrap();
        }
        let counts = effects.counts();
        assert_eq!(counts.len(), ORDERS, "every order applied");
        assert!(
            counts.values().all(|n| *n == 1),
            "an effect applied twice: {counts:?}"
        );
        assert!(
            handled.load(Ordering::SeqCst) >= 2 * ORDERS,
            "every delivery was handled"
        );
    }

    #[tokio::test(flavor = "multi_thread", worker_threads = 2)]
    async fn redis_redelivery_after_a_crash_is_a_duplicate() {
        redelivery_after_a_crash_is_a_duplicate(Redis::Single).await;
    }

    #[tokio::test(flavor = "multi_thread", worker_threads = 2)]
    async fn redis_cluster_redelivery_after_a_crash_is_a_duplicate() {
        redelivery_after_a_crash_is_a_duplicate(Redis::Cluster).await;
    }

    #[tokio::test(flavor = "multi_thread", worker_threads = 4)]
    async fn redis_consumers_apply_each_effect_once() {
        many_consumers_apply_each_effect_once(Redis::Single).await;
    }

    #[tokio::test(flavor = "multi_thread", worker_threads = 4)]
    async fn redis_cluster_consumers_apply_each_effect_once() {
        many_consumers_apply_each_effect_once(Redis::Cluster).await;
    }
}
