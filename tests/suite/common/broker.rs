//! The RabbitMQ broker the consumer tests run on: `IDEM_AMQP_URL`, or the
//! local `amqp://guest:guest@127.0.0.1:5672/%2f`; a queue of a test's own,
//! deleted when it ends; every wait on the broker bounded.
//!
//! A broker that cannot be reached fails the test with a message naming
//! the variable; it never passes silently.

use std::time::{Duration, SystemTime, UNIX_EPOCH};

use futures::StreamExt;
use lapin::message::Delivery;
use lapin::options::{
    BasicAckOptions, BasicConsumeOptions, BasicNackOptions, BasicPublishOptions, BasicQosOptions,
    ConfirmSelectOptions, QueueDeclareOptions, QueueDeleteOptions,
};
use lapin::types::{AMQPValue, FieldTable};
use lapin::{BasicProperties, Channel, Connection, ConnectionProperties, Consumer};

/// The variable naming the broker.
pub const VAR: &str = "IDEM_AMQP_URL";
/// The longest any test waits for the broker.
pub const WAIT: Duration = Duration::from_secs(10);

/// The broker's URL: the variable, or the local default.
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
