//! The Kafka-protocol broker the Kafka tests use, from `IDEM_KAFKA_BROKERS`
//! (`127.0.0.1:9092` by default, which `.ci/kafka-broker start` serves),
//! and a topic per test.

use std::time::Duration;

use rdkafka::admin::{AdminClient, AdminOptions, NewTopic, TopicReplication};
use rdkafka::client::DefaultClientContext;
use rdkafka::ClientConfig;

/// The variable naming the broker.
pub const BROKERS_VAR: &str = "IDEM_KAFKA_BROKERS";
/// How many partitions a test's topic has.
pub const PARTITIONS: i32 = 3;

/// The bootstrap servers of the test broker.
pub fn brokers() -> String {
    std::env::var(BROKERS_VAR).unwrap_or_else(|_| "127.0.0.1:9092".to_owned())
}

fn admin(bootstrap: &str) -> Result<AdminClient<DefaultClientContext>, rdkafka::error::KafkaError> {
    ClientConfig::new()
        .set("bootstrap.servers", bootstrap)
        .create()
}

/// A topic of the test's own on `bootstrap`, with [`PARTITIONS`]
/// partitions, deleted when dropped (the broker keeps it in memory only).
pub struct Topic {
    pub name: String,
    pub bootstrap: String,
}

impl Topic {
    /// Creates `idem-test-<tag>-<unique>`; panics, naming
    /// [`BROKERS_VAR`], when no broker answers within 20 s.
    pub async fn create(tag: &str, bootstrap: &str) -> Topic {
        let name = super::fresh(&format!("idem-test-{tag}"));
        let admin = admin(bootstrap).expect("an admin client");
        let options = AdminOptions::new().operation_timeout(Some(Duration::from_secs(10)));
        let created = tokio::time::timeout(
            Duration::from_secs(20),
            admin.create_topics(
                &[NewTopic::new(&name, PARTITIONS, TopicReplication::Fixed(1))],
                &options,
            ),
        )
        .await
        .unwrap_or_else(|_| {
            panic!(
                "no Kafka broker answered at {bootstrap} within 20 s (set {BROKERS_VAR} to the \
                 bootstrap servers of a reachable broker, or run `.ci/kafka-broker start`)"
            )
        })
        .unwrap_or_else(|err| panic!("cannot create a topic on {bootstrap}: {err}"));
        for result in created {
            result.unwrap_or_else(|(topic, code)| panic!("cannot create topic {topic}: {code}"));
        }
        Topic {
            name,
            bootstrap: bootstrap.to_owned(),
        }
    }
}

impl Drop for Topic {
    fn drop(&mut self) {
        let (name, bootstrap) = (self.name.clone(), self.bootstrap.clone());
        // A thread of its own: the drop may run inside or outside a runtime.
        std::thread::spawn(move || {
            let runtime = tokio::runtime::Builder::new_current_thread()
                .enable_all()
                .build()
                .expect("a runtime");
            runtime.block_on(async {
                if let Ok(admin) = admin(&bootstrap) {
                    let deleting = admin.delete_topics(&[&name], &AdminOptions::new());
                    let _ = tokio::time::timeout(Duration::from_secs(5), deleting).await;
                }
            });
        })
        .join()
        .ok();
    }
}
