//! The transactional outbox on SQLite, PostgreSQL and MariaDB (no broker:
//! `outbox_kafka` relays to one).
//!
//! - Record, transactional and entity mode write a message with the
//!   operation's effect; a replay enqueues nothing; a rolled-back body
//!   enqueues nothing; an attempt run again after its first one committed
//!   and died derives the same ids and enqueues nothing more.
//! - An attempt whose claim was taken over cannot publish (`LeaseLost`),
//!   and nothing is written; publishing outside an operation is refused.
//! - Relays racing on one outbox lease each row to one of them at a time,
//!   and every row is relayed; a relay whose lease ended while it still
//!   produced loses its rows to the next one, both mark, and none is lost.
//! - Purge deletes relayed rows past their time, never waiting ones, also
//!   while relays run.

use crate::common;

use std::collections::BTreeMap;
use std::sync::{Arc, Mutex};
use std::time::Duration;

use idem::outbox::{Message, MessageId, Outbox};
use idem::{run, run_in_transaction, Call, Error, Key, Policy, Scope};

const SCOPE: &str = "shop.order";

fn event(n: usize) -> Message {
    Message::new("order.created", format!(r#"{{"n":{n}}}"#))
        .unwrap()
        .with_key(format!("order-{n}"))
        .unwrap()
        .with_header("content-type", "application/json")
        .unwrap()
}

/// The id of `message` published by the operation `key` of `SCOPE`,
/// whose payload is `payload`.
fn id(key: &str, payload: u32, message: &Message) -> MessageId {
    MessageId::derive(
        &Scope::new(SCOPE),
        &Key::new(key).unwrap(),
        &idem::Fingerprint::of(&payload).unwrap(),
        message,
    )
}

/// A shipment, in entity mode: the row is the operation's result.
#[derive(Debug, Clone, PartialEq, sqlx::FromRow, idem::Entity)]
#[idem(table = "shipments")]
pub struct Shipment {
    #[idem(generated)]
    pub id: i64,
    #[idem(token)]
    pub token: String,
    pub qty: i64,
}

fn shipments_table(backend: &str) -> &'static str {
    match backend {
        "sqlite_file" => {
            "CREATE TABLE shipments (id INTEGER PRIMARY KEY AUTOINCREMENT, \
             token TEXT NOT NULL UNIQUE, qty INTEGER NOT NULL)"
        }
        "postgres" => {
            "CREATE TABLE shipments (id BIGINT GENERATED ALWAYS AS IDENTITY PRIMARY KEY, \
             token TEXT NOT NULL UNIQUE, qty BIGINT NOT NULL)"
        }
        _ => {
            "CREATE TABLE shipments (id BIGINT AUTO_INCREMENT PRIMARY KEY, \
             token VARCHAR(255) NOT NULL UNIQUE, qty BIGINT NOT NULL)"
        }
    }
}

common::backends!(sqlite_file, postgres, mysql => {
    use sqlx::Connection;

    type Db = backend::Database;

    /// A store, its outbox, and an effects table of the test's own.
    async fn fixture() -> (backend::Store, Outbox<Db>, String, common::backend::Guard) {
        let (store, mut guard) = backend::store(8).await;
        let effects = if backend::NAME == "sqlite_file" {
            "effects".to_owned()
        } else {
            guard.table("outbox_effects")
        };
        sqlx::query(&format!("CREATE TABLE {effects} (id VARCHAR(64) NOT NULL)"))
            .execute(store.pool())
            .await
            .unwrap();
        let outbox = Outbox::new(&store);
        (store, outbox, effects, guard)
    }

    async fn effects(store: &backend::Store, table: &str) -> i64 {
        sqlx::query_scalar(&format!("SELECT COUNT(*) FROM {table}"))
            .fetch_one(store.pool())
            .await
            .unwrap()
    }

    /// The body of an order in record mode: the effect and three messages,
    /// on the body's own transaction.
    async fn place(
        store: &backend::Store,
        outbox: &Outbox<Db>,
        effects: &str,
        key: &str,
        policy: Policy,
    ) -> Result<Vec<String>, Error> {
        run(store, Call::new(SCOPE, key, &1).with_policy(policy), async {
            let mut tx = store.pool().begin().await.map_err(Error::store)?;
            sqlx::query(&format!("INSERT INTO {effects} (id) VALUES ({})", backend::param(1)))
                .bind(key)
                .execute(&mut *tx)
                .await
                .map_err(Error::store)?;
            let mut ids = Vec::new();
            ids.push(outbox.publish(&mut tx, &event(1)).await?.to_string());
            ids.push(outbox.publish(&mut tx, &event(2)).await?.to_string());
            let audit = Message::new("order.audit", "placed").unwrap();
            ids.push(outbox.publish(&mut tx, &audit).await?.to_string());
            tx.commit().await.map_err(Error::store)?;
            Ok(ids)
        })
        .await
    }

    #[tokio::test(flavor = "multi_thread", worker_threads = 2)]
    async fn record_mode_enqueues_with_the_effect_and_a_replay_enqueues_nothing() {
        let (store, outbox, effects_table, _guard) = fixture().await;
        let ids = place(&store, &outbox, &effects_table, "o-1", Policy::new()).await.unwrap();
        let expected = [
            id("o-1", 1, &event(1)),
            id("o-1", 1, &event(2)),
            id("o-1", 1, &Message::new("order.audit", "placed").unwrap()),
        ];
        assert_eq!(ids, expected.iter().map(|i| i.to_string()).collect::<Vec<_>>());
        let replay = place(&store, &outbox, &effects_table, "o-1", Policy::new()).await.unwrap();
        assert_eq!(replay, ids);
        assert_eq!(effects(&store, &effects_table).await, 1);
        assert_eq!(outbox.waiting().await.unwrap(), 3);

        let lease = outbox.lease(10, Duration::from_secs(30)).await.unwrap();
        let leased: Vec<_> = lease.messages().iter().map(|m| m.id().clone()).collect();
        assert_eq!(leased, expected);
        let first = &lease.messages()[0];
        assert_eq!(first.message(), &event(1));
        assert_eq!(first.attempts(), 1);
        assert_eq!(lease.messages()[2].message().key(), None);
        // Leased: no other relay gets them.
        assert!(outbox.lease(10, Duration::from_secs(30)).await.unwrap().is_empty());
        let seqs: Vec<i64> = lease.messages().iter().map(|m| m.seq()).collect();
        assert!(seqs.windows(2).all(|w| w[0] < w[1]), "{seqs:?}");
        assert_eq!(outbox.mark_relayed(&seqs).await.unwrap(), 3);
        assert_eq!(outbox.mark_relayed(&seqs).await.unwrap(), 0);
        assert_eq!(outbox.waiting().await.unwrap(), 0);
    }

    #[tokio::test(flavor = "multi_thread", worker_threads = 2)]
    async fn a_rolled_back_body_enqueues_nothing_and_its_retry_enqueues_once() {
        let (store, outbox, effects_table, _guard) = fixture().await;
        let failed: Result<(), Error> = run(&store, Call::new(SCOPE, "o-2", &1), async {
            let mut tx = store.pool().begin().await.map_err(Error::store)?;
            outbox.publish(&mut tx, &event(1)).await?;
            tx.rollback().await.map_err(Error::store)?;
            Err(Error::store("the payment gateway failed"))
        })
        .await;
        assert!(failed.is_err());
        assert_eq!(outbox.waiting().await.unwrap(), 0);
        place(&store, &outbox, &effects_table, "o-2", Policy::new()).await.unwrap();
        assert_eq!(outbox.waiting().await.unwrap(), 3);
    }

    /// The first attempt commits its effect and messages, then dies before
    /// its outcome is stored (dropped here: its claim is handed back, as a
    /// crash's lease would lapse); the second runs the body again.
    #[tokio::test(flavor = "multi_thread", worker_threads = 2)]
    async fn an_attempt_run_again_after_its_commit_enqueues_nothing_more() {
        let (store, outbox, effects_table, _guard) = fixture().await;
        let (committed, done) = tokio::sync::oneshot::channel::<Vec<String>>();
        let first = {
            let (store, outbox) = (store.clone(), outbox.clone());
            tokio::spawn(async move {
                let _: Result<(), Error> = run(&store, Call::new(SCOPE, "o-3", &1), async {
                    let mut tx = store.pool().begin().await.map_err(Error::store)?;
                    let a = outbox.publish(&mut tx, &event(1)).await?.to_string();
                    let b = outbox.publish(&mut tx, &event(2)).await?.to_string();
                    tx.commit().await.map_err(Error::store)?;
                    let _ = committed.send(vec![a, b]);
                    std::future::pending().await
                })
                .await;
            })
        };
        let ids = done.await.unwrap();
        first.abort();
        let _ = first.await;
        let mut retried = None;
        for _ in 0..100 {
            match place(&store, &outbox, &effects_table, "o-3", Policy::new()).await {
                Ok(again) => {
                    retried = Some(again);
                    break;
                }
                Err(Error::InProgress { .. }) => tokio::time::sleep(Duration::from_millis(50)).await,
                Err(err) => panic!("{err}"),
            }
        }
        let again = retried.expect("the retry ran");
        assert_eq!(again[..2], ids[..]);
        // The two messages of the first attempt, and the audit message only
        // the second published.
        assert_eq!(outbox.waiting().await.unwrap(), 3);
    }

    #[tokio::test(flavor = "multi_thread", worker_threads = 2)]
    async fn an_attempt_that_lost_its_claim_cannot_publish() {
        let (store, outbox, _effects, _guard) = fixture().await;
        let table = store.table_name().to_owned();
        let result: Result<(), Error> = run(&store, Call::new(SCOPE, "o-4", &1), async {
            // Another attempt takes the record over (its claim token changes).
            let stolen = format!(
                "UPDATE {table} SET claim_token = {} WHERE {} = {}",
                backend::param(1),
                if backend::NAME == "mysql" { "`key`" } else { "key" },
                backend::param(2)
            );
            sqlx::query(&stolen)
                .bind(&[7u8; 16][..])
                .bind("o-4")
                .execute(store.pool())
                .await
                .unwrap();
            let mut tx = store.pool().begin().await.map_err(Error::store)?;
            let published = outbox.publish(&mut tx, &event(1)).await;
            assert!(matches!(published, Err(Error::LeaseLost)), "{published:?}");
            tx.commit().await.map_err(Error::store)?;
            published.map(drop)
        })
        .await;
        assert!(matches!(result, Err(Error::LeaseLost)), "{result:?}");
        assert_eq!(outbox.waiting().await.unwrap(), 0);
    }

    #[tokio::test(flavor = "multi_thread", worker_threads = 2)]
    async fn transactional_mode_enqueues_on_the_callers_transaction() {
        let (store, outbox, _effects, _guard) = fixture().await;
        for commit in [false, true, true] {
            let mut conn = store.pool().acquire().await.unwrap();
            let mut tx = conn.begin().await.unwrap();
            let ids: Vec<String> = run_in_transaction(
                &store,
                &mut *tx,
                Call::new(SCOPE, "o-5", &1),
                |conn| async {
                    let id = outbox.publish(&mut *conn, &event(5)).await.map(|id| id.to_string());
                    (id.map(|id| vec![id]), conn)
                },
            )
            .await
            .unwrap();
            assert_eq!(ids, [id("o-5", 1, &event(5)).to_string()]);
            if commit {
                tx.commit().await.unwrap();
            } else {
                tx.rollback().await.unwrap();
                assert_eq!(outbox.waiting().await.unwrap(), 0);
            }
        }
        assert_eq!(outbox.waiting().await.unwrap(), 1);
    }

    /// Four relays lease, in small batches, from one outbox at once: each
    /// row is leased once (the leases are long), and every row is marked.
    #[tokio::test(flavor = "multi_thread", worker_threads = 4)]
    async fn racing_relays_lease_each_row_once_and_relay_all() {
        let (store, outbox, _effects, _guard) = fixture().await;
        const MESSAGES: usize = 60;
        run(&store, Call::new(SCOPE, "bulk", &1), async {
            let mut tx = store.pool().begin().await.map_err(Error::store)?;
            for n in 0..MESSAGES {
                outbox.publish(&mut tx, &event(n)).await?;
            }
            tx.commit().await.map_err(Error::store)?;
            Ok::<_, Error>(())
        })
        .await
        .unwrap();
        let leased: Arc<Mutex<BTreeMap<i64, usize>>> = Arc::default();
        // The rows some relay holds right now.
        let held: Arc<Mutex<std::collections::BTreeSet<i64>>> = Arc::default();
        let relays: Vec<_> = (0..4)
            .map(|relay| {
                let (outbox, leased, held) = (outbox.clone(), leased.clone(), held.clone());
                tokio::spawn(async move {
                    loop {
                        let lease = outbox.lease(4, Duration::from_secs(60)).await.unwrap();
                        if lease.is_empty() {
                            if outbox.waiting().await.unwrap() == 0 {
                                return;
                            }
                            tokio::task::yield_now().await;
                            continue;
                        }
                        let seqs: Vec<i64> = lease.messages().iter().map(|m| m.seq()).collect();
                        {
                            let (mut leased, mut held) = (leased.lock().unwrap(), held.lock().unwrap());
                            for seq in &seqs {
                                *leased.entry(*seq).or_default() += 1;
                                assert!(held.insert(*seq), "row {seq} leased by two relays at once");
                            }
                        }
                        // Let go of them here before the database does, so
                        // that a relay leasing them next is never taken
                        // for a second holder.
                        held.lock().unwrap().retain(|seq| !seqs.contains(seq));
                        // Relay 0 gives half of its leases back, as after
                        // a failed produce: they are leased again.
                        if relay == 0 && seqs[0] % 2 == 0 {
                            assert_eq!(outbox.release(&lease, &seqs).await.unwrap(), seqs.len() as u64);
                            continue;
                        }
                        outbox.mark_relayed(&seqs).await.unwrap();
                    }
                })
            })
            .collect();
        for relay in relays {
            relay.await.unwrap();
        }
        assert_eq!(outbox.waiting().await.unwrap(), 0);
        let leased = leased.lock().unwrap();
        assert_eq!(leased.len(), MESSAGES);
        // Relay 0's give-backs were leased again.
        assert!(leased.values().sum::<usize>() >= MESSAGES);
    }

    /// Relay A's lease ends while it still produces; B leases the rows, and
    /// both produce them (one id: the consumer's dedupe absorbs the copy).
    /// A marks first; B's mark finds them marked; no row is lost, and a
    /// late give-back by A leaves B's lease alone.
    #[tokio::test(flavor = "multi_thread", worker_threads = 2)]
    async fn a_lease_that_ended_mid_produce_is_taken_over_and_nothing_is_lost() {
        let (store, outbox, effects_table, _guard) = fixture().await;
        place(&store, &outbox, &effects_table, "o-6", Policy::new()).await.unwrap();
        let a = outbox.lease(10, Duration::from_millis(300)).await.unwrap();
        assert_eq!(a.messages().len(), 3);
        assert!(outbox.lease(10, Duration::from_secs(30)).await.unwrap().is_empty());
        tokio::time::sleep(Duration::from_millis(600)).await;
        let b = outbox.lease(10, Duration::from_secs(30)).await.unwrap();
        let ids = |lease: &idem::outbox::Lease| {
            lease.messages().iter().map(|m| m.id().clone()).collect::<Vec<_>>()
        };
        assert_eq!(ids(&a), ids(&b));
        assert!(b.messages().iter().all(|m| m.attempts() == 2));
        let a_seqs: Vec<i64> = a.messages().iter().map(|m| m.seq()).collect();
        // A gives one back late: B holds it, so it stays B's.
        assert_eq!(outbox.release(&a, &a_seqs[..1]).await.unwrap(), 0);
        assert_eq!(outbox.mark_relayed(&a_seqs).await.unwrap(), 3);
        let b_seqs: Vec<i64> = b.messages().iter().map(|m| m.seq()).collect();
        assert_eq!(outbox.mark_relayed(&b_seqs).await.unwrap(), 0);
        assert_eq!(outbox.waiting().await.unwrap(), 0);
        assert!(outbox.lease(10, Duration::from_secs(30)).await.unwrap().is_empty());
    }

    /// Relayed rows are kept for the records' ttl and then purged, while
    /// relays lease and mark; waiting rows are never purged.
    #[tokio::test(flavor = "multi_thread", worker_threads = 4)]
    async fn purge_takes_relayed_rows_past_their_time_only_even_while_relays_run() {
        let (store, outbox, effects_table, _guard) = fixture().await;
        let short = Policy::new().ttl(Duration::from_millis(200)).lease(Duration::from_millis(200));
        for n in 0..10 {
            place(&store, &outbox, &effects_table, &format!("p-{n}"), short).await.unwrap();
        }
        let purger = {
            let outbox = outbox.clone();
            tokio::spawn(async move {
                let mut purged = 0;
                for _ in 0..40 {
                    purged += outbox.purge(5).await.unwrap();
                    tokio::time::sleep(Duration::from_millis(10)).await;
                }
                purged
            })
        };
        let mut relayed = 0;
        tokio::time::sleep(Duration::from_millis(250)).await;
        while relayed < 30 {
            let lease = outbox.lease(4, Duration::from_secs(30)).await.unwrap();
            if lease.is_empty() {
                break;
            }
            let seqs: Vec<i64> = lease.messages().iter().map(|m| m.seq()).collect();
            relayed += outbox.mark_relayed(&seqs).await.unwrap();
        }
        assert_eq!(relayed, 30, "every row is relayed: none was purged while waiting");
        let purged = purger.await.unwrap() + outbox.purge(100).await.unwrap();
        assert_eq!(purged, 30);
        // A row kept for its ttl is not purged before it.
        place(&store, &outbox, &effects_table, "kept", Policy::new()).await.unwrap();
        let lease = outbox.lease(10, Duration::from_secs(30)).await.unwrap();
        let seqs: Vec<i64> = lease.messages().iter().map(|m| m.seq()).collect();
        outbox.mark_relayed(&seqs).await.unwrap();
        assert_eq!(outbox.purge(100).await.unwrap(), 0);
    }

    /// Entity mode: the message is written in the transaction that
    /// inserts the entity. A replay finds the row and enqueues nothing; a
    /// body that fails after enqueuing leaves nothing behind.
    #[tokio::test(flavor = "multi_thread", worker_threads = 2)]
    async fn entity_mode_enqueues_with_the_entity() {
        let ns = backend::namespace("outbox_entity").await;
        let pool = backend::pool(&ns, 4).await;
        sqlx::query(shipments_table(backend::NAME)).execute(&pool).await.unwrap();
        let store = idem::store::SqlStore::<Db>::new(pool.clone());
        store.migrate().await.unwrap();
        let outbox = Outbox::new(&store);
        let ship = |token: &'static str, fail: bool| {
            let (pool, outbox) = (pool.clone(), outbox.clone());
            async move {
                idem::entity::run(&pool, Call::new(SCOPE, token, &2), async {
                    outbox.enqueue(event(1))?;
                    outbox.enqueue(event(2))?;
                    if fail {
                        return Err(Error::store("the warehouse failed"));
                    }
                    Ok(Shipment { id: 0, token: token.to_owned(), qty: 2 })
                })
                .await
            }
        };
        assert!(ship("s-1", true).await.is_err());
        assert_eq!(outbox.waiting().await.unwrap(), 0);
        let first = ship("s-1", false).await.unwrap();
        assert_eq!(ship("s-1", false).await.unwrap(), first);
        assert_eq!(outbox.waiting().await.unwrap(), 2);
        let lease = outbox.lease(10, Duration::from_secs(30)).await.unwrap();
        let ids: Vec<_> = lease.messages().iter().map(|m| m.id().clone()).collect();
        assert_eq!(ids, [id("s-1", 2, &event(1)), id("s-1", 2, &event(2))]);
    }

    /// A table migrated before parking existed (no `parked_*` columns, its
    /// last version not recorded) takes the new version, and the message
    /// that waited in it is leased as before.
    #[tokio::test]
    async fn an_outbox_from_before_parking_is_upgraded() {
        let (store, outbox, effects, _guard) = fixture().await;
        place(&store, &outbox, &effects, "o-1", Policy::new()).await.unwrap();
        let (table, book) = (store.table_name().to_owned(), store.migrations_table().to_owned());
        let q = if backend::NAME == "mysql" { '`' } else { '"' };
        for column in ["parked_at", "parked_reason"] {
            sqlx::query(&format!("ALTER TABLE {q}{table}_outbox{q} DROP COLUMN {column}"))
                .execute(store.pool())
                .await
                .unwrap();
        }
        let latest: i64 = sqlx::query_scalar(&format!(
            "SELECT MAX(version) FROM {q}{book}{q} WHERE table_name = '{table}'"
        ))
        .fetch_one(store.pool())
        .await
        .unwrap();
        sqlx::query(&format!(
            "DELETE FROM {q}{book}{q} WHERE table_name = '{table}' AND version = {latest}"
        ))
        .execute(store.pool())
        .await
        .unwrap();
        assert!(outbox.waiting().await.is_err(), "the columns are gone");

        store.migrate().await.unwrap();
        assert_eq!(outbox.waiting().await.unwrap(), 3);
        assert_eq!(outbox.parked_count().await.unwrap(), 0);
        let lease = outbox.lease(10, Duration::from_secs(30)).await.unwrap();
        assert_eq!(lease.messages().len(), 3);

        // A migration that ran and whose record was lost (MySQL's and
        // MariaDB's DDL commit at once; SQLite's migrations run in one
        // transaction) is recorded on the next run.
        if backend::NAME != "sqlite_file" {
            sqlx::query(&format!(
                "DELETE FROM {q}{book}{q} WHERE table_name = '{table}' AND version = {latest}"
            ))
            .execute(store.pool())
            .await
            .unwrap();
            store.migrate().await.unwrap();
            assert_eq!(outbox.parked_count().await.unwrap(), 0);
        }
    }

    #[tokio::test]
    async fn publishing_outside_an_operation_is_refused() {
        let (store, outbox, _effects, _guard) = fixture().await;
        let mut tx = store.pool().begin().await.unwrap();
        let err = outbox.publish(&mut tx, &event(1)).await.unwrap_err();
        assert!(matches!(&err, Error::Config(m) if m.contains("outside")), "{err}");
        // And enqueue outside entity mode, inside an operation.
        let err = run(&store, Call::new(SCOPE, "o-7", &1), async {
            outbox.enqueue(event(1)).map(drop)
        })
        .await
        .unwrap_err();
        assert!(matches!(&err, Error::Config(m) if m.contains("not in entity mode")), "{err}");
        drop(tx);
        assert_eq!(outbox.waiting().await.unwrap(), 0);
    }
});
