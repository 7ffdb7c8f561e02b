//! What waiting costs the database: one call holds a PostgreSQL key for
//! two seconds while eight duplicates wait for it, and the database's own
//! counters tell how many transactions and how much WAL the wait made.
//!
//! ```text
//! cargo run --example waiting_cost --features postgres
//! ```
//!
//! `IDEM_POSTGRES_URL` points at the server (default
//! `postgres://postgres@127.0.0.1:5432/test`). Other clients of the same
//! database add to the counters: run it on a quiet server.

use std::time::{Duration, Instant};

use idem::{run, Call, Error, Policy, PostgresStore};
use sqlx::Row;

const WAITERS: usize = 8;
const HOLD: Duration = Duration::from_secs(2);

async fn counters(pool: &sqlx::PgPool) -> Result<(i64, i64), sqlx::Error> {
    // Statistics are sent at the end of each transaction, and the snapshot
    // of them is per transaction: clear it first.
    sqlx::query("SELECT pg_stat_clear_snapshot()")
        .execute(pool)
        .await?;
    let row = sqlx::query(
        "SELECT (xact_commit + xact_rollback)::BIGINT AS xacts,
                pg_wal_lsn_diff(pg_current_wal_lsn(), '0/0')::BIGINT AS wal
         FROM pg_stat_database WHERE datname = current_database()",
    )
    .fetch_one(pool)
    .await?;
    Ok((row.try_get("xacts")?, row.try_get("wal")?))
}

#[tokio::main]
async fn main() -> Result<(), Box<dyn std::error::Error>> {
    let url = std::env::var("IDEM_POSTGRES_URL")
        .unwrap_or_else(|_| "postgres://postgres@127.0.0.1:5432/test".to_owned());
    let store = PostgresStore::connect(&url).await?;
    let key = format!("waiting-cost-{}", std::process::id());
    let policy = Policy::new().wait(Duration::from_secs(10));
    let call = || Call::new("examples.waiting_cost", key.as_str(), &1).with_policy(policy);

    // The owner claims first, so that the counters see only the waiting.
    let (claimed_tx, claimed_rx) = tokio::sync::oneshot::channel();
    let owner = run(&store, call(), async {
        claimed_tx.send(()).ok();
        tokio::time::sleep(HOLD).await;
        Ok::<_, Error>(1u32)
    });
    let waiters = async {
        claimed_rx.await.ok();
        // Give the owner's claim time to commit and the listener to start.
        tokio::time::sleep(Duration::from_millis(100)).await;
        let before = counters(store.pool()).await?;
        let started = Instant::now();
        let answers = futures::future::join_all(
            (0..WAITERS).map(|_| run(&store, call(), async { Ok::<_, Error>(2u32) })),
        )
        .await;
        let waited = started.elapsed();
        let after = counters(store.pool()).await?;
        Ok::<_, Box<dyn std::error::Error>>((answers, waited, before, after))
    };
    let (owner, waited) = tokio::join!(owner, waiters);
    let (answers, waited, before, after) = waited?;
    assert_eq!(owner?, 1);
    assert!(
        answers.into_iter().all(|a| a.ok() == Some(1)),
        "every waiter replays"
    );
    println!(
        "{WAITERS} waiters, {:.2} s: {} transactions, {} bytes of WAL (counters include \
         the owner's completion and the reads of this report)",
        waited.as_secs_f64(),
        after.0 - before.0,
        after.1 - before.1
    );
    Ok(())
}
