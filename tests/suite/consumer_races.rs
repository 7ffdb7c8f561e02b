//! Consumer dedupe (`idem::consumer`) on RabbitMQ and the SQL stores:
//! copies of one message in flight at once across two consumers whose
//! acks are lost, and a policy set for its lease keeping the markers'
//! retention.

use crate::common;

use std::collections::HashMap;
use std::sync::atomic::{AtomicBool, AtomicUsize, Ordering};
use std::sync::{Arc, Mutex};
use std::time::Duration;

use common::broker::{self, Queue};
use futures::StreamExt;
use idem::consumer::{Deduplicator, Handled};
use idem::{Key, Policy};
use lapin::options::{BasicAckOptions, BasicNackOptions};

/// The effects applied, by message.
#[derive(Default)]
struct Effects(Mutex<HashMap<String, usize>>);

impl Effects {
    fn apply(&self, what: &str) {
        *self.0.lock().unwrap().entry(what.to_owned()).or_default() += 1;
    }

    fn counts(&self) -> HashMap<String, usize> {
        self.0.lock().unwrap().clone()
    }
}

common::backends!(postgres, mysql => {
    /// A consumer that sets a policy for a longer lease (a slow handler)
    /// keeps its markers for the default retention (14 days), or for the
    /// retention set before the policy: before, `policy` replaced the
    /// retention with `Policy::new()`'s 24 hours, and a redelivery on day
    /// 2 to 14 ran the handler again.
    #[tokio::test(flavor = "multi_thread", worker_threads = 2)]
    async fn a_longer_lease_keeps_markers_for_the_default_retention() {
        let (store, _guard) = backend::store(4).await;
        let lease = Policy::new().lease(Duration::from_secs(120));
        let day = Duration::from_secs(24 * 3600);
        let cases = [
            ("default", Deduplicator::new(store.clone(), "orders.slow").policy(lease), 14 * day),
            (
                "retention first",
                Deduplicator::new(store.clone(), "orders.slow.kept")
                    .retention(30 * day)
                    .policy(lease),
                30 * day,
            ),
            (
                "a policy's own ttl",
                Deduplicator::new(store, "orders.slow.own").policy(lease.ttl(3 * day)),
                3 * day,
            ),
        ];
        for (case, dedup, retention) in cases {
            dedup
                .process("m-1", &(), async { Ok::<_, idem::Error>(1) })
                .await
                .unwrap();
            let record = idem::Store::get(dedup.store(), dedup.scope(), &Key::new("m-1").unwrap())
                .await
                .unwrap()
                .unwrap();
            let kept_ms = record.expires_at - record.created_at;
            let retention_ms = retention.as_millis() as i64;
            assert!(
                (retention_ms - 1_000..=retention_ms + 1_000).contains(&kept_ms),
                "{case}: the marker is kept {} h, not {} h",
                kept_ms / 3_600_000,
                retention_ms / 3_600_000
            );
        }
    }

    /// `Deduplicator::process` on a SQL store, two consumer "processes"
    /// (two store instances with pools of their own on one table), prefetch
    /// 8 with every delivery handled concurrently, so many copies of one
    /// message are in flight at once in the same process and across both.
    /// The lease (150 ms) is far shorter than the handler (600 ms): only
    /// renewal keeps the claim. Duplicates wait 100 ms, get `InProgress`,
    /// are nacked and come straight back (a hot redelivery loop). The
    /// first consumer to process a message drops its broker connection
    /// right after that `Processed` (handler committed, ack lost): its in-flight deliveries
    /// come back while their handlers may still run. Every message's effect
    /// must be applied exactly once.
    #[tokio::test(flavor = "multi_thread", worker_threads = 4)]
    async fn process_with_duplicates_in_flight_across_two_processes_applies_once() {
        let (store_a, guard) = backend::store(8).await;
        let store_b = backend::store_at(&backend::location(&store_a, &guard), 8).await;
        let policy = Policy::new()
            .ttl(Deduplicator::<()>::DEFAULT_RETENTION)
            .lease(Duration::from_millis(150))
            .wait(Duration::from_millis(100));
        let scope = "orders.capture";
        let dedups = [
            Arc::new(Deduplicator::new(store_a, scope).policy(policy)),
            Arc::new(Deduplicator::new(store_b, scope).policy(policy)),
        ];
        let queue = Arc::new(Queue::new("races-inflight").await);
        let ids = ["x-1", "x-2", "x-3"];
        let mut published = 0;
        for round in 0..6 {
            for (i, id) in ids.iter().enumerate() {
                if i == 0 || round % 2 == 0 {
                    let body = serde_json::json!({"id": id, "amount": 10 + i});
                    queue.publish(&serde_json::to_vec(&body).unwrap()).await;
                    published += 1;
                }
            }
        }
        let effects = Arc::new(Effects::default());
        let acked = Arc::new(AtomicUsize::new(0));
        let crash = Arc::new(AtomicBool::new(true));
        let consumers: Vec<_> = dedups
            .iter()
            .map(|dedup| {
                let (dedup, queue, effects, acked) =
                    (dedup.clone(), queue.clone(), effects.clone(), acked.clone());
                // Whichever consumer processes a message first loses its
                // connection before the ack (one crash in all).
                let crash = crash.clone();
                tokio::spawn(async move {
                    while acked.load(Ordering::SeqCst) < published {
                        let conn = Arc::new(broker::connect().await);
                        let (_channel, mut consumer) = queue.consume(&conn, 8).await;
                        let mut tasks = tokio::task::JoinSet::new();
                        while acked.load(Ordering::SeqCst) < published && conn.status().connected() {
                            let delivery = match tokio::time::timeout(
                                Duration::from_millis(200),
                                consumer.next(),
                            )
                            .await
                            {
                                Err(_) => continue,
                                Ok(Some(Ok(delivery))) => delivery,
                                Ok(_) => break,
                            };
                            let (dedup, effects, acked, crash, conn) = (
                                dedup.clone(),
                                effects.clone(),
                                acked.clone(),
                                crash.clone(),
                                conn.clone(),
                            );
                            tasks.spawn(async move {
                                let message: serde_json::Value =
                                    serde_json::from_slice(&delivery.data).unwrap();
                                let id = message["id"].as_str().unwrap().to_owned();
                                let handled = dedup
                                    .process(&id, &message, async {
                                        effects.apply(&id);
                                        tokio::time::sleep(Duration::from_millis(600)).await;
                                        Ok::<_, idem::Error>(id.clone())
                                    })
                                    .await;
                                match handled {
                                    Ok(Handled::Processed(_)) if crash.swap(false, Ordering::SeqCst) => {
                                        // Committed, then the connection dies before the ack.
                                        let _ = conn.close(320, "crash".into()).await;
                                    }
                                    Ok(_) => {
                                        if delivery.ack(BasicAckOptions::default()).await.is_ok() {
                                            acked.fetch_add(1, Ordering::SeqCst);
                                        }
                                    }
                                    Err(err) => {
                                        assert!(err.is_retryable(), "{err}");
                                        tokio::time::sleep(Duration::from_millis(20)).await;
                                        let requeue = BasicNackOptions {
                                            requeue: true,
                                            ..BasicNackOptions::default()
                                        };
                                        let _ = delivery.nack(requeue).await;
                                    }
                                }
                            });
                        }
                        while let Some(done) = tasks.join_next().await {
                            done.unwrap();
                        }
                        let _ = conn.close(200, "done".into()).await;
                    }
                })
            })
            .collect();
        let all = async {
            for consumer in consumers {
                consumer.await.unwrap();
            }
        };
        tokio::time::timeout(Duration::from_secs(90), all)
            .await
            .unwrap_or_else(|_| panic!("the consumers did not ack {published} messages in 90 s"));
        assert!(!crash.load(Ordering::SeqCst), "the crash was injected");
        let counts = effects.counts();
        assert_eq!(counts.len(), ids.len(), "{counts:?}");
        assert!(counts.values().all(|n| *n == 1), "an effect applied twice: {counts:?}");
    }
});
