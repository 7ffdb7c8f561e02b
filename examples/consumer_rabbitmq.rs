//! Exactly-once effects from an at-least-once RabbitMQ queue.
//!
//! A publisher sends `OrderPlaced` events to a queue of this run's own:
//! some twice (a producer's retry), some again with the same content
//! written in another member order (a relay that re-serializes). Four
//! consumers reserve the stock and write an invoice for each order, in one
//! database transaction with the "processed" marker
//! (`Deduplicator::process_in_transaction`). Some consumers crash after
//! committing an order but before acknowledging it: RabbitMQ redelivers
//! what they held, and the redeliveries are answered `Duplicate` and
//! acknowledged without touching the stock again.
//!
//! At the end it prints what was delivered and what was applied, and
//! exits non-zero unless every distinct order was applied exactly once.
//!
//! ```sh
//! cargo run --example consumer_rabbitmq                                   # SQLite
//! cargo run --example consumer_rabbitmq --features postgres -- postgres   # PostgreSQL
//! cargo run --example consumer_rabbitmq -- sqlite --by-content            # keyed by content hash
//! ```
//!
//! RabbitMQ: `amqp://guest:guest@127.0.0.1:5672/%2f`, or `IDEM_AMQP_URL`.
//! PostgreSQL: `postgres://postgres@127.0.0.1:5432/test`, or
//! `IDEM_POSTGRES_URL`; the run's tables are dropped at the end. The queue
//! is deleted at the end too (and by the broker an hour after its last use,
//! should the run be killed).

use std::error::Error as StdError;
use std::future::Future;
use std::process::ExitCode;
use std::sync::atomic::{AtomicUsize, Ordering};
use std::sync::Arc;
use std::time::{Duration, SystemTime, UNIX_EPOCH};

use futures::StreamExt;
use idem::consumer::{content_key_of_json, Deduplicator, Handled};
use idem::{AsKey, Key};
use lapin::options::{
    BasicAckOptions, BasicConsumeOptions, BasicNackOptions, BasicPublishOptions, BasicQosOptions,
    BasicRejectOptions, ConfirmSelectOptions, QueueDeclareOptions, QueueDeleteOptions,
};
use lapin::types::{AMQPValue, FieldTable};
use lapin::{BasicProperties, Connection, ConnectionProperties};
use serde::{Deserialize, Serialize};

type BoxError = Box<dyn StdError + Send + Sync>;

const ORDERS: usize = 30;
const CONSUMERS: usize = 4;
const PREFETCH: u16 = 4;
/// The longest the run may take before it gives up.
const DEADLINE: Duration = Duration::from_secs(60);
include!("shop/common.rs");

/// How a message is keyed.
#[derive(Clone, Copy, Debug)]
enum KeyBy {
    /// Its natural id, `order_id`.
    OrderId,
    /// The SHA-256 of its canonical JSON, for messages without an id.
    Content,
}

#[derive(Debug, Default)]
struct Counters {
    delivered: AtomicUsize,
    redelivered: AtomicUsize,
    crashes: AtomicUsize,
    processed: AtomicUsize,
    duplicates: AtomicUsize,
    requeued: AtomicUsize,
    dead_lettered: AtomicUsize,
    /// Acknowledged or dead-lettered: done with.
    settled: AtomicUsize,
}

fn bump(counter: &AtomicUsize) {
    counter.fetch_add(1, Ordering::SeqCst);
}

fn read(counter: &AtomicUsize) -> usize {
    counter.load(Ordering::SeqCst)
}

fn amqp_url() -> String {
    std::env::var("IDEM_AMQP_URL")
        .unwrap_or_else(|_| "amqp://guest:guest@127.0.0.1:5672/%2f".to_owned())
}

async fn connect(url: &str) -> Result<Connection, BoxError> {
    let connecting = Connection::connect(url, ConnectionProperties::default());
    let why = match tokio::time::timeout(Duration::from_secs(10), connecting).await {
        Ok(Ok(conn)) => return Ok(conn),
        Ok(Err(err)) => err.to_string(),
        Err(_) => "no answer within 10 s".to_owned(),
    };
    Err(format!(
        "cannot reach RabbitMQ at {url} (set IDEM_AMQP_URL to the URL of a reachable broker): {why}"
    )
    .into())
}

/// One consumer: handles deliveries until every message is settled. On an
/// order that `crashes_on`, first delivery only, it dies after the commit
/// and before the ack: its connection goes away, and RabbitMQ requeues
/// every delivery it had not acknowledged.
async fn consume<S: Shop>(
    id: usize,
    shop: Arc<S>,
    queue: String,
    key_by: KeyBy,
    counters: Arc<Counters>,
    total: usize,
) -> Result<(), BoxError> {
    'connections: while read(&counters.settled) < total {
        let conn = connect(&amqp_url()).await?;
        let channel = conn.create_channel().await?;
        channel
            .basic_qos(PREFETCH, BasicQosOptions::default())
            .await?;
        let mut deliveries = channel
            .basic_consume(
                queue.as_str().into(),
                format!("consumer-{id}").as_str().into(),
                BasicConsumeOptions::default(),
                FieldTable::default(),
            )
            .await?;
        while read(&counters.settled) < total {
            let delivery =
                match tokio::time::timeout(Duration::from_millis(200), deliveries.next()).await {
                    Err(_) => continue,
                    Ok(None) => return Err("the broker cancelled the consumer".into()),
                    Ok(Some(delivery)) => delivery?,
                };
            bump(&counters.delivered);
            if delivery.redelivered {
                bump(&counters.redelivered);
            }

            // The message as received identifies it; the typed event is
            // what the handler works with.
            let parsed = serde_json::from_slice::<serde_json::Value>(&delivery.data)
                .and_then(|message| Ok((serde_json::from_value(message.clone())?, message)));
            let (order, message): (OrderPlaced, _) = match parsed {
                Ok(parsed) => parsed,
                Err(err) => {
                    eprintln!("consumer {id}: dead-lettering a malformed message: {err}");
                    delivery.reject(BasicRejectOptions::default()).await?;
                    bump(&counters.dead_lettered);
                    bump(&counters.settled);
                    continue;
                }
            };
            let key = match key_by {
                KeyBy::OrderId => order.order_id.to_key().map_err(idem::Error::from),
                // By the bytes received: a Value parsed from them could
                // merge two distinct messages (see content_key_of_json).
                KeyBy::Content => content_key_of_json(&delivery.data),
            };
            // A message that makes no valid key (an order id with a space,
            // say) cannot be processed as sent, by any consumer.
            let key = match key {
                Ok(key) => key,
                Err(err) => {
                    eprintln!("consumer {id}: dead-lettering a message with no valid key: {err}");
                    delivery.reject(BasicRejectOptions::default()).await?;
                    bump(&counters.dead_lettered);
                    bump(&counters.settled);
                    continue;
                }
            };

            match shop.handle(&key, &message, &order).await {
                Ok(handled) => {
                    bump(if handled.is_duplicate() {
                        &counters.duplicates
                    } else {
                        &counters.processed
                    });
                    if crashes_on(&order) && !delivery.redelivered {
                        bump(&counters.crashes);
                        let what = if handled.is_duplicate() {
                            "a duplicate, nothing committed"
                        } else {
                            "processed and committed"
                        };
                        println!(
                            "consumer {id}: crashed before acking {} ({what})",
                            order.order_id
                        );
                        drop(deliveries);
                        drop(channel);
                        conn.close(320, "simulated crash".into()).await.ok();
                        continue 'connections;
                    }
                    delivery.ack(BasicAckOptions::default()).await?;
                    bump(&counters.settled);
                }
                Err(err) if err.is_retryable() => {
                    // Nothing was committed: let the broker deliver it again.
                    eprintln!("consumer {id}: requeueing {}: {err}", order.order_id);
                    tokio::time::sleep(Duration::from_millis(100)).await;
                    let requeue = BasicNackOptions {
                        requeue: true,
                        ..BasicNackOptions::default()
                    };
                    delivery.nack(requeue).await?;
                    bump(&counters.requeued);
                }
                Err(err) => {
                    eprintln!("consumer {id}: dead-lettering {}: {err}", order.order_id);
                    delivery.reject(BasicRejectOptions::default()).await?;
                    bump(&counters.dead_lettered);
                    bump(&counters.settled);
                }
            }
        }
        conn.close(200, "done".into()).await?;
    }
    Ok(())
}

/// Publishes, consumes, and reports. `Ok(true)` when every distinct order
/// was applied exactly once.
async fn run<S: Shop>(shop: S, key_by: KeyBy, run_id: &str) -> Result<bool, BoxError> {
    let shop = Arc::new(shop);
    let url = amqp_url();
    let conn = connect(&url).await?;
    let publisher = conn.create_channel().await?;
    publisher
        .confirm_select(ConfirmSelectOptions::default())
        .await?;
    let queue = format!("idem-example-orders-{run_id}");
    let mut arguments = FieldTable::default();
    arguments.insert("x-expires".into(), AMQPValue::LongInt(3_600_000));
    publisher
        .queue_declare(
            queue.as_str().into(),
            QueueDeclareOptions::default(),
            arguments,
        )
        .await?;

    // Every order once; every 4th again right away (a producer's retry);
    // every 5th again at the end, re-encoded (a relay's copy, late).
    let orders: Vec<OrderPlaced> = (1..=ORDERS).map(OrderPlaced::number).collect();
    let mut messages = Vec::new();
    let (mut twice, mut re_encoded) = (0, 0);
    for (n, order) in (1..).zip(&orders) {
        messages.push(order.encode());
        if n % 4 == 0 {
            messages.push(order.encode());
            twice += 1;
        }
    }
    for (n, order) in (1..).zip(&orders) {
        if n % 5 == 0 {
            messages.push(order.re_encode());
            re_encoded += 1;
        }
    }
    let total = messages.len();

    println!("queue     {queue} on {url}");
    println!("database  {}", shop.describe());
    println!("keyed by  {key_by:?}\n");

    let counters = Arc::new(Counters::default());
    let consumers: Vec<_> = (1..=CONSUMERS)
        .map(|id| {
            tokio::spawn(consume(
                id,
                shop.clone(),
                queue.clone(),
                key_by,
                counters.clone(),
                total,
            ))
        })
        .collect();
    for body in &messages {
        let properties = BasicProperties::default()
            .with_content_type("application/json".into())
            .with_delivery_mode(2);
        let confirm = publisher
            .basic_publish(
                "".into(),
                queue.as_str().into(),
                BasicPublishOptions::default(),
                body,
                properties,
            )
            .await?;
        if !confirm.await?.is_ack() {
            return Err("the broker refused a message".into());
        }
    }

    let finished = tokio::time::timeout(DEADLINE, async {
        for consumer in consumers {
            consumer.await??;
        }
        Ok::<_, BoxError>(())
    })
    .await;
    publisher
        .queue_delete(queue.as_str().into(), QueueDeleteOptions::default())
        .await?;
    conn.close(200, "done".into()).await?;
    match finished {
        Ok(result) => result?,
        Err(_) => {
            return Err(format!(
                "the consumers did not settle all {total} messages within {} s ({} settled)",
                DEADLINE.as_secs(),
                read(&counters.settled)
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
        "published      {total} messages for {distinct} distinct orders \
         ({twice} sent twice, {re_encoded} re-encoded)"
    );
    println!(
        "delivered      {} ({} redeliveries)",
        read(&c.delivered),
        read(&c.redelivered)
    );
    println!(
        "crashes        {} (after handling, before the ack)",
        read(&c.crashes)
    );
    println!(
        "handler        {} processed, {} duplicates acknowledged without running",
        read(&c.processed),
        read(&c.duplicates)
    );
    println!(
        "requeued       {}, dead-lettered {}",
        read(&c.requeued),
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
    let key_by = if args.iter().any(|a| a == "--by-content") {
        KeyBy::Content
    } else {
        KeyBy::OrderId
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
            Ok(shop) => run(shop, key_by, &run_id).await,
            Err(err) => Err(err),
        },
        #[cfg(feature = "postgres")]
        "postgres" => match postgres::PostgresShop::open(&run_id).await {
            Ok(shop) => run(shop, key_by, &run_id).await,
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
