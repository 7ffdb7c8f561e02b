//! The benchmarks:
//! `cargo bench --bench idem --features sqlite,postgres,mysql,redis,testing`.
//!
//! Every figure is a ratio of two measurements taken side by side in the
//! same run: baseline and subject alternate in rounds (A B, then B A), and
//! the median of the per-round ratios is reported, since the machine is
//! shared and noisy. The table is printed and written to `BENCHMARKS.md`
//! (anything below the `<!-- notes -->` line of that file is kept), with
//! the chart `benchmarks.svg` beside it.
//!
//! The reference of a server is a client that sends the statements the
//! store sends (from `SqlStore::reference_statements`, so never a copy)
//! without idem's engine: pgbench on PostgreSQL (when `pgbench` is on the
//! PATH), a bare sqlx loop on MariaDB. It runs in the same rounds as the
//! plain call and idem, and is reported as a ratio to the same plain call.
//!
//! Redis and Redis Cluster have no transactional mode and no SQL: B1
//! (record mode), B2, B4 and the store's cost per call run on them
//! ([`harness::calls::Calls`]), with a plain call that is the body's own write, one
//! `INCRBY` (see [`harness::redis::RedisPayments`]). Their reference is a loop of the
//! scripts the store sends, through the store's own connection (from
//! `RedisStore::reference_first_execution` and `reference_replay`),
//! around the same `INCRBY`.
//!
//! Servers: `IDEM_POSTGRES_URL`, `IDEM_MYSQL_URL`, `IDEM_REDIS_URL` and
//! `IDEM_REDIS_CLUSTER_URL` (local defaults as in the tests); SQLite is a
//! file in a temporary directory. `IDEM_BENCH_QUICK=1` shortens every
//! measurement (for trying the harness, not for figures).
//! `IDEM_BENCH_ONLY=postgres` (or `sqlite`, `mariadb`, `redis`,
//! `redis_cluster`, comma-separated) runs some backends only, and
//! `IDEM_BENCH_CASES=B4,B4'` (comma-separated) some measurements only; a
//! run narrowed by either prints its table and leaves `BENCHMARKS.md` and
//! the chart as they are. A whole run first waits, up to five minutes,
//! for the one-minute load average to fall to 1.5 or below (see
//! [`harness::wait_for_quiet`]). B4' runs this
//! binary again as child processes, with `IDEM_BENCH_CHILD` naming the
//! backend (see [`rows::b4_processes`]).
//!
//! [`harness`] holds what the rows share (the knobs, the measuring, the
//! side-by-side ratios, the backends' stores and calls), [`rows`] one file
//! per row of the table (B1, B2, ...), and [`report`] the table, printed
//! and written to `BENCHMARKS.md` with the chart.

mod harness;
mod report;
mod rows;

/// The tests' Redis and Redis Cluster: their URLs (`IDEM_REDIS_URL`,
/// `IDEM_REDIS_CLUSTER_URL`, the local ones by default, the local cluster
/// started if down), stores and connections, and the deletion of the keys
/// under a prefix.
#[path = "../../tests/suite/common/redis.rs"]
#[allow(dead_code)]
mod redis_env;

use std::sync::Arc;
use std::time::Instant;

use harness::calls::{Bench, Calls};
use harness::redis::RedisPayments;
use harness::sql::{lite, my, pg};
use harness::{case, narrowed, wait_for_quiet};
use redis_env::Redis;
use report::{Report, Run};
use rows::b1_first_execution::b1;
use rows::b2_replay::b2;
use rows::b3_check_then_act::b3;
use rows::b4_one_key::b4;
use rows::b4_processes::{b4_processes, child_main, CHILD};
use rows::b5_stored_records::b5;
use rows::b6_cost_per_call::{b6, b6_on};
use rows::b7_concurrency::b7;
use rows::b8_entity::b8;
use rows::b9_steps::b9;

fn main() {
    let runtime = tokio::runtime::Builder::new_multi_thread()
        .worker_threads(2)
        .enable_all()
        .build()
        .unwrap();
    match std::env::var(CHILD) {
        Ok(label) => runtime.block_on(child_main(&label)),
        Err(_) => runtime.block_on(main_async()),
    }
}

/// Runs each measurement `id => f` that `IDEM_BENCH_CASES` asks for
/// ([`case`]), in order, as `f(b, report)`.
macro_rules! measure_cases {
    ($b:expr, $report:expr; $($id:literal => $f:ident),+ $(,)?) => {
        $(
            if case($id) {
                $f($b, $report).await;
            }
        )+
    };
}

async fn each<B: Bench>(b: &Arc<B>, report: &mut Report) {
    let t = Instant::now();
    measure_cases!(b, report;
        "B1" => b1, "B2" => b2, "B3" => b3, "B4" => b4, "B4'" => b4_processes,
        "B5" => b5, "B8" => b8, "B9" => b9, "B6" => b6_on,
    );
    if b.dialect().curve && case("B7") {
        b7(b, report).await;
    }
    b.drop_tables().await;
    eprintln!("{} done in {:.0} s", b.label(), t.elapsed().as_secs_f64());
}

/// Redis or Redis Cluster: what runs on every backend; its keys are
/// deleted as it is dropped.
async fn each_redis(redis: Redis, report: &mut Report) {
    let t = Instant::now();
    let b = &Arc::new(RedisPayments::new(redis).await);
    measure_cases!(b, report; "B1" => b1, "B2" => b2, "B4" => b4, "B6" => b6_on);
    eprintln!("{} done in {:.0} s", b.label(), t.elapsed().as_secs_f64());
}

async fn main_async() {
    let quiet = narrowed() || wait_for_quiet().await;
    let run = Run::start(quiet);
    let mut report = Report::default();
    let dir = tempfile::tempdir().unwrap();
    let dir = dir.path();
    let only = std::env::var("IDEM_BENCH_ONLY").unwrap_or_default();
    let wanted = |backend: &str| only.is_empty() || only.split(',').any(|b| b.trim() == backend);
    // B6 over MemoryStore first, while the machine is as quiet as the run
    // will find it: it is CPU and memory alone, and after the backends it
    // would run beside their servers' own work on what the run left them
    // (vacuum, purge of the bulk-loaded tables). Its rows go last.
    let mut memory = Report::default();
    if case("B6") {
        b6(&mut memory).await;
    }
    if wanted("sqlite") {
        each(&Arc::new(lite::Payments::new(dir, "b").await), &mut report).await;
    }
    if wanted("postgres") {
        each(&Arc::new(pg::Payments::new(dir, "b").await), &mut report).await;
    }
    if wanted("mariadb") {
        each(&Arc::new(my::Payments::new(dir, "b").await), &mut report).await;
    }
    if wanted("redis") {
        each_redis(Redis::Single, &mut report).await;
    }
    if wanted("redis_cluster") {
        each_redis(Redis::Cluster, &mut report).await;
    }
    report.rows.append(&mut memory.rows);
    run.finish(&report);
}
