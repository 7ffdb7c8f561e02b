//! A message's id is what the message is (the operation's scope, key and
//! payload, and the message's topic, key, payload and headers), not the
//! count of publish calls that came before it: an attempt run again that
//! takes another path (it skips work an earlier attempt committed, a step
//! replays from the journal, a transaction retried inside the body) gives
//! each message the id it had, drops none as a "duplicate" of another,
//! and writes none under two ids. A key reused after its ttl with another
//! payload is another operation, whose messages are others. A relay's
//! batch and a message's size stay within what the database and the
//! broker take.

use crate::common;

use std::time::Duration;

use idem::outbox::{Message, Outbox};
use idem::{run, Call, Error, Policy};

const SCOPE: &str = "shop.order";
const TOPIC: &str = "order.events";

fn message(payload: &str) -> Message {
    Message::new(TOPIC, payload.to_owned()).unwrap()
}

common::backends!(sqlite_file, postgres, mysql => {
    type Db = backend::Database;

    async fn fixture() -> (backend::Store, Outbox<Db>, String, common::backend::Guard) {
        let (store, mut guard) = backend::store(8).await;
        let effects = if backend::NAME == "sqlite_file" {
            "effects".to_owned()
        } else {
            guard.table("outbox_ids_effects")
        };
        sqlx::query(&format!("CREATE TABLE {effects} (id VARCHAR(64) NOT NULL)"))
            .execute(store.pool())
            .await
            .unwrap();
        let outbox = Outbox::new(&store);
        (store, outbox, effects, guard)
    }

    /// The payloads the outbox holds, in order.
    async fn payloads(outbox: &Outbox<Db>) -> Vec<String> {
        let lease = outbox.lease(1000, Duration::from_secs(30)).await.unwrap();
        let seqs: Vec<i64> = lease.messages().iter().map(|m| m.seq()).collect();
        outbox.release(&lease, &seqs).await.unwrap();
        lease
            .messages()
            .iter()
            .map(|m| String::from_utf8(m.message().payload().unwrap().to_vec()).unwrap())
            .collect()
    }

    async fn has_effect(store: &backend::Store, table: &str, id: &str) -> Result<bool, Error> {
        let n: i64 = sqlx::query_scalar(&format!(
            "SELECT COUNT(*) FROM {table} WHERE id = {}",
            backend::param(1)
        ))
        .bind(id)
        .fetch_one(store.pool())
        .await
        .map_err(Error::store)?;
        Ok(n > 0)
    }

    /// An order is created, then confirmed, in two transactions, each
    /// announcing itself on one topic. The first attempt commits the
    /// creation and its message, then fails (a transient error: the claim
    /// is handed back). The retry resumes where the first stopped (the
    /// order exists: it is not created again) and confirms it. Its
    /// `order.confirmed` message is its first publish on the topic; were
    /// ids counted by calls, it would derive the id of the first attempt's
    /// `order.created`, and be dropped as a duplicate of it. It is written.
    #[tokio::test(flavor = "multi_thread", worker_threads = 2)]
    async fn a_retry_that_resumes_past_a_committed_publish_enqueues_its_next_message() {
        let (store, outbox, effects, _guard) = fixture().await;
        let attempt = |fail_after_create: bool| {
            let (store, outbox, effects) = (store.clone(), outbox.clone(), effects.clone());
            async move {
                run(&store, Call::new(SCOPE, "b-1", &1), async {
                    if !has_effect(&store, &effects, "created").await? {
                        let mut tx = store.pool().begin().await.map_err(Error::store)?;
                        sqlx::query(&format!("INSERT INTO {effects} (id) VALUES ('created')"))
                            .execute(&mut *tx)
                            .await
                            .map_err(Error::store)?;
                        outbox.publish(&mut tx, &message("order.created")).await?;
                        tx.commit().await.map_err(Error::store)?;
                    }
                    if fail_after_create {
                        return Err(Error::store("the payment gateway timed out"));
                    }
                    let mut tx = store.pool().begin().await.map_err(Error::store)?;
                    sqlx::query(&format!("INSERT INTO {effects} (id) VALUES ('confirmed')"))
                        .execute(&mut *tx)
                        .await
                        .map_err(Error::store)?;
                    let id = outbox.publish(&mut tx, &message("order.confirmed")).await?;
                    tx.commit().await.map_err(Error::store)?;
                    Ok(id.to_string())
                })
                .await
            }
        };
        assert!(attempt(true).await.is_err());
        attempt(false).await.unwrap();
        assert!(has_effect(&store, &effects, "confirmed").await.unwrap());
        assert_eq!(
            payloads(&outbox).await,
            ["order.created", "order.confirmed"],
            "the order was confirmed and its confirmation was never enqueued"
        );
    }

    /// Steps and the outbox in one body: the step `reserve` publishes on
    /// its transaction, then the body publishes `order.placed`. The first
    /// attempt fails after the step (the claim is handed back). The retry
    /// replays `reserve` from the journal (its closure does not run, so it
    /// publishes nothing) and publishes `order.placed` as its first message
    /// on the topic: counted by calls, the id of `order.reserved`, and
    /// lost. It is written.
    #[tokio::test(flavor = "multi_thread", worker_threads = 2)]
    async fn a_step_replayed_from_the_journal_leaves_the_next_message_its_id() {
        let (store, outbox, _effects, _guard) = fixture().await;
        let attempt = |fail_after_step: bool| {
            let (store, outbox) = (store.clone(), outbox.clone());
            async move {
                run(&store, Call::new(SCOPE, "s-1", &1), async {
                    idem::steps::step("reserve", |_key| async {
                        let mut tx = store.pool().begin().await.map_err(Error::store)?;
                        outbox.publish(&mut tx, &message("order.reserved")).await?;
                        tx.commit().await.map_err(Error::store)?;
                        Ok::<_, Error>(7_i64)
                    })
                    .await?;
                    if fail_after_step {
                        return Err(Error::store("the warehouse timed out"));
                    }
                    let mut tx = store.pool().begin().await.map_err(Error::store)?;
                    outbox.publish(&mut tx, &message("order.placed")).await?;
                    tx.commit().await.map_err(Error::store)?;
                    Ok(())
                })
                .await
            }
        };
        assert!(attempt(true).await.is_err());
        attempt(false).await.unwrap();
        assert_eq!(
            payloads(&outbox).await,
            ["order.reserved", "order.placed"],
            "the order was placed and its message was never enqueued"
        );
    }

    /// The body retries its own transaction (as after a serialization
    /// failure or a deadlock: here the first try is rolled back), then
    /// commits the message under its second publish, and fails afterwards
    /// (the claim is handed back). The retry commits the same message
    /// under its first publish: counted by calls, two rows under two ids,
    /// a copy the consumer's dedupe cannot absorb. It is one row.
    #[tokio::test(flavor = "multi_thread", worker_threads = 2)]
    async fn a_transaction_retried_in_the_body_writes_one_message_once() {
        let (store, outbox, _effects, _guard) = fixture().await;
        let first: Result<(), Error> = run(&store, Call::new(SCOPE, "t-1", &1), async {
            let mut tx = store.pool().begin().await.map_err(Error::store)?;
            outbox.publish(&mut tx, &message("order.created")).await?;
            // The database asked for the transaction to be tried again.
            tx.rollback().await.map_err(Error::store)?;
            let mut tx = store.pool().begin().await.map_err(Error::store)?;
            outbox.publish(&mut tx, &message("order.created")).await?;
            tx.commit().await.map_err(Error::store)?;
            Err(Error::store("the payment gateway timed out"))
        })
        .await;
        assert!(first.is_err());
        run(&store, Call::new(SCOPE, "t-1", &1), async {
            let mut tx = store.pool().begin().await.map_err(Error::store)?;
            outbox.publish(&mut tx, &message("order.created")).await?;
            tx.commit().await.map_err(Error::store)?;
            Ok::<_, Error>(())
        })
        .await
        .unwrap();
        let lease = outbox.lease(10, Duration::from_secs(30)).await.unwrap();
        let ids: std::collections::BTreeSet<String> =
            lease.messages().iter().map(|m| m.id().to_string()).collect();
        assert_eq!(
            (lease.messages().len(), ids.len()),
            (1, 1),
            "one message, written under {} ids: {ids:?}",
            ids.len()
        );
    }

    /// Once its records' ttl passed, a key is free again: a call with it
    /// is a new operation, whose body runs, with another payload. The old
    /// operation's row is still kept (not yet relayed here; a relayed row
    /// is kept until the relay's next purge). The new message has an id of
    /// its own, and is written.
    #[tokio::test(flavor = "multi_thread", worker_threads = 2)]
    async fn a_key_used_again_after_its_ttl_enqueues_the_new_operations_message() {
        let (store, outbox, _effects, _guard) = fixture().await;
        let short = Policy::new().ttl(Duration::from_millis(300));
        let order = |amount: i64| {
            let (store, outbox) = (store.clone(), outbox.clone());
            async move {
                run(&store, Call::new(SCOPE, "k-1", &amount).with_policy(short), async {
                    let mut tx = store.pool().begin().await.map_err(Error::store)?;
                    let payload = format!("amount={amount}");
                    outbox.publish(&mut tx, &message(&payload)).await?;
                    tx.commit().await.map_err(Error::store)?;
                    Ok::<_, Error>(amount)
                })
                .await
            }
        };
        assert_eq!(order(100).await.unwrap(), 100);
        tokio::time::sleep(Duration::from_millis(800)).await;
        // The body ran again: a new operation.
        assert_eq!(order(250).await.unwrap(), 250);
        assert_eq!(
            payloads(&outbox).await,
            ["amount=100", "amount=250"],
            "the second operation ran and its message was never enqueued"
        );
    }
});

/// A lease binds one parameter per row it leases: a batch asked for over
/// the database's limit (SQLite: 32766) is taken at `MAX_LEASE_BATCH`,
/// so a relay with a large batch and a large backlog still leases.
#[cfg(feature = "sqlite")]
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_large_batch_with_a_large_backlog_still_leases() {
    use idem::outbox::MAX_LEASE_BATCH;
    let guard = common::backend::Guard::temp_dir();
    let store =
        idem::SqliteStore::connect(&format!("sqlite://{}", guard.path("idem.db").display()))
            .await
            .unwrap();
    let outbox = Outbox::new(&store);
    const ROWS: usize = 33_000;
    run(&store, Call::new(SCOPE, "backlog", &1), async {
        let mut tx = store.pool().begin().await.map_err(Error::store)?;
        for n in 0..ROWS {
            outbox.publish(&mut tx, &message(&n.to_string())).await?;
        }
        tx.commit().await.map_err(Error::store)?;
        Ok::<_, Error>(())
    })
    .await
    .unwrap();
    assert_eq!(outbox.waiting().await.unwrap(), ROWS as u64);
    let lease = outbox.lease(40_000, Duration::from_secs(30)).await;
    assert!(
        lease.as_ref().is_ok_and(|lease| !lease.is_empty()),
        "a relay with a batch of 40000 cannot lease from a backlog of {ROWS}: {:?}",
        lease.map(|l| l.messages().len())
    );

    // Marks and give-backs of more rows than one statement carries go in
    // statements of `MAX_LEASE_BATCH` rows: a give-back of two leases'
    // rows under the first's token gives back the first's alone, and a
    // mark of both marks every row.
    let first = lease.unwrap();
    let second = outbox.lease(40_000, Duration::from_secs(30)).await.unwrap();
    let seqs: Vec<i64> = [&first, &second]
        .iter()
        .flat_map(|lease| lease.messages().iter().map(|leased| leased.seq()))
        .collect();
    assert_eq!(seqs.len(), 2 * MAX_LEASE_BATCH);
    assert_eq!(
        outbox.release(&first, &seqs).await.unwrap(),
        MAX_LEASE_BATCH as u64
    );
    assert_eq!(outbox.mark_relayed(&seqs).await.unwrap(), seqs.len() as u64);
    assert_eq!(
        outbox.waiting().await.unwrap(),
        (ROWS - 2 * MAX_LEASE_BATCH) as u64
    );
}

/// `Message` checks a message as it is built "so that a message that
/// exists can be published", up to `MAX_MESSAGE_BYTES` of key, payload
/// and headers: the relay's producer takes a record of that size (its
/// `message.max.bytes`, 1,000,000 by default, counts the record's framing
/// and the id header too), and the broker acknowledges it.
#[cfg(all(feature = "kafka", feature = "sqlite"))]
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_message_the_outbox_accepts_at_its_size_limit_is_relayed() {
    use idem::outbox::kafka::KafkaRelay;
    use idem::outbox::MAX_MESSAGE_BYTES;
    use rdkafka::admin::{AdminClient, AdminOptions, NewTopic, TopicReplication};
    use rdkafka::client::DefaultClientContext;
    use rdkafka::ClientConfig;

    let brokers =
        std::env::var("IDEM_KAFKA_BROKERS").unwrap_or_else(|_| "127.0.0.1:9092".to_owned());
    let topic = common::fresh("idem-test-outbox-ids-size");
    let admin: AdminClient<DefaultClientContext> = ClientConfig::new()
        .set("bootstrap.servers", &brokers)
        .create()
        .unwrap();
    let options = AdminOptions::new().operation_timeout(Some(Duration::from_secs(10)));
    for result in admin
        .create_topics(
            &[NewTopic::new(&topic, 1, TopicReplication::Fixed(1))],
            &options,
        )
        .await
        .unwrap()
    {
        result.unwrap();
    }

    let guard = common::backend::Guard::temp_dir();
    let store =
        idem::SqliteStore::connect(&format!("sqlite://{}", guard.path("idem.db").display()))
            .await
            .unwrap();
    let outbox = Outbox::new(&store);
    let big = Message::new(&topic, vec![b'x'; MAX_MESSAGE_BYTES - 16])
        .unwrap()
        .with_key("pay-1")
        .unwrap();
    run(&store, Call::new(SCOPE, "big", &1), async {
        let mut tx = store.pool().begin().await.map_err(Error::store)?;
        outbox.publish(&mut tx, &big).await?;
        tx.commit().await.map_err(Error::store)?;
        Ok::<_, Error>(())
    })
    .await
    .unwrap();
    let relay = KafkaRelay::new(
        outbox.clone(),
        ClientConfig::new().set("bootstrap.servers", &brokers),
    )
    .unwrap()
    .with_lease(
        ClientConfig::new().set("bootstrap.servers", &brokers),
        Duration::from_secs(10),
    )
    .unwrap();
    let mut rounds = Vec::new();
    for _ in 0..3 {
        let round = relay.relay_once().await.unwrap();
        rounds.push(round);
        if round.acknowledged > 0 {
            break;
        }
    }
    let _ = admin.delete_topics(&[&topic], &AdminOptions::new()).await;
    assert_eq!(
        outbox.waiting().await.unwrap(),
        0,
        "a message the outbox accepted is refused at every round: {rounds:?}"
    );
}
