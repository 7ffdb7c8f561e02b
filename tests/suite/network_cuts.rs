//! Network faults: a TCP proxy inside the test sits between a
//! `PostgresStore` and PostgreSQL. While the bodies of a batch of calls
//! run, the proxy cuts every live connection and refuses new ones.
//!
//! In record mode the bodies have run, so their effects happened:
//!
//! - every caller gets its own body's value, never an error saying that
//!   nothing happened;
//! - no record is completed without its outcome (read on a pool of its own
//!   that bypasses the proxy): the cut records stay in progress;
//! - the outcomes are stored in the background once connections go
//!   through again (within the lease), and concurrent retries of each key
//!   replay them: each body ran once.
//!
//! In transactional mode the cut rolls the claim and the business row back
//! together, so each key ends with exactly one committed row.

use crate::common;

use std::collections::HashMap;
use std::net::SocketAddr;
use std::str::FromStr;
use std::sync::atomic::{AtomicBool, AtomicUsize, Ordering};
use std::sync::{Arc, Mutex};
use std::time::{Duration, SystemTime, UNIX_EPOCH};

use idem::record::State;
use idem::{run, Call, Error, Policy, Store};
use sqlx::postgres::{PgConnectOptions, PgPoolOptions};
use tokio::net::{TcpListener, TcpStream};
use tokio::sync::{watch, Barrier};

use common::backend::postgres;
use common::servers::Server;

const KEYS: usize = 8;
const RETRIERS: usize = 3;
const SCOPE: &str = "network_cuts";
/// Longer than the cut: the outage is transient, so no claim may lapse.
const LEASE: Duration = Duration::from_secs(10);

/// A TCP proxy to `upstream` on an ephemeral local port, with a switch.
struct Proxy {
    addr: SocketAddr,
    open: Arc<AtomicBool>,
    cuts: watch::Sender<u64>,
    task: tokio::task::JoinHandle<()>,
}

impl Proxy {
    async fn start(upstream: String) -> Proxy {
        let listener = TcpListener::bind("127.0.0.1:0").await.expect("bind");
        let addr = listener.local_addr().unwrap();
        let open = Arc::new(AtomicBool::new(true));
        let (cuts, _) = watch::channel(0u64);
        let task = tokio::spawn({
            let (open, cuts) = (open.clone(), cuts.clone());
            async move {
                loop {
                    let Ok((mut client, _)) = listener.accept().await else {
                        continue;
                    };
                    if !open.load(Ordering::SeqCst) {
                        drop(client); // refused: the peer sees the connection close
                        continue;
                    }
                    let mut cut = cuts.subscribe();
                    let upstream = upstream.clone();
                    tokio::spawn(async move {
                        let Ok(mut server) = TcpStream::connect(&upstream).await else {
                            return;
                        };
                        tokio::select! {
                            _ = tokio::io::copy_bidirectional(&mut client, &mut server) => {}
                            _ = cut.changed() => {}
                        }
                        // Dropping both sockets cuts the connection mid-call.
                    });
                }
            }
        });
        Proxy {
            addr,
            open,
            cuts,
            task,
        }
    }

    /// Cuts every live connection and refuses new ones.
    fn cut_all(&self) {
        self.open.store(false, Ordering::SeqCst);
        self.cuts.send_modify(|n| *n += 1);
    }

    /// Lets connections through again.
    fn reopen(&self) {
        self.open.store(true, Ordering::SeqCst);
    }
}

impl Drop for Proxy {
    fn drop(&mut self) {
        self.task.abort();
    }
}

/// `KEYS` keys no other run uses.
fn fresh_keys(tag: &str) -> Vec<String> {
    let millis = SystemTime::now()
        .duration_since(UNIX_EPOCH)
        .unwrap()
        .as_millis();
    (0..KEYS)
        .map(|k| format!("{tag}-{}-{millis}-{k}", std::process::id()))
        .collect()
}

/// The cut: starts `call` on every key, waits until every body runs, then
/// drops every connection through the proxy. Answers the calls' tasks.
async fn start_then_cut<T>(
    proxy: &Proxy,
    keys: &[String],
    call: impl Fn(String, Option<Arc<Barrier>>, Duration) -> tokio::task::JoinHandle<T>,
) -> Vec<tokio::task::JoinHandle<T>> {
    let started = Arc::new(Barrier::new(keys.len() + 1));
    let calls = keys
        .iter()
        .map(|k| call(k.clone(), Some(started.clone()), Duration::from_millis(300)))
        .collect();
    tokio::time::timeout(Duration::from_secs(20), started.wait())
        .await
        .expect("every body started");
    proxy.cut_all();
    calls
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn cut_connections_are_retryable_and_complete_once() {
    // The store's table, migrated directly; the store under test reaches it
    // only through the proxy.
    let (direct, _guard) = postgres::store(4).await;
    let db = postgres::db(&direct);
    let table = direct.table_name().to_owned();
    let url = Server::Postgres.url();
    let options = PgConnectOptions::from_str(&url).expect("a PostgreSQL URL");
    let upstream = format!("{}:{}", options.get_host(), options.get_port());
    let proxy = Proxy::start(upstream).await;
    let pool = PgPoolOptions::new()
        .max_connections(KEYS as u32 + 2)
        .acquire_timeout(Duration::from_secs(1))
        .connect_with(options.host("127.0.0.1").port(proxy.addr.port()))
        .await
        .expect("connect through the proxy");
    let store: Arc<dyn Store> = Arc::new(
        idem::PostgresStore::new(pool)
            .with_table_name(&table)
            .expect("a valid table name"),
    );

    let runs: Arc<Mutex<HashMap<String, usize>>> = Arc::default();
    let total_runs = Arc::new(AtomicUsize::new(0));
    let call = |key: String, started: Option<Arc<Barrier>>, pause: Duration| {
        let (store, runs, total_runs) = (store.clone(), runs.clone(), total_runs.clone());
        tokio::spawn(async move {
            let policy = Policy::new().lease(LEASE).wait(Duration::from_secs(10));
            run::<_, usize, Error, _, _>(
                &*store,
                Call::new(SCOPE, key.as_str(), &"payload").with_policy(policy),
                async {
                    let run = total_runs.fetch_add(1, Ordering::SeqCst) + 1;
                    *runs.lock().unwrap().entry(key.clone()).or_default() += 1;
                    if let Some(started) = started {
                        started.wait().await;
                    }
                    tokio::time::sleep(pause).await;
                    Ok(run)
                },
            )
            .await
        })
    };

    // 1. The cut: every body is running when the proxy drops everything.
    let keys = fresh_keys("net");
    let calls = start_then_cut(&proxy, &keys, call).await;
    let mut cut_runs = HashMap::new();
    for (key, task) in keys.iter().zip(calls) {
        let result = tokio::time::timeout(Duration::from_secs(30), task)
            .await
            .expect("a cut call returns")
            .expect("a cut call does not panic");
        let run = result.unwrap_or_else(|err| {
            panic!("{key}: the body ran, yet its caller got an error: {err:?}")
        });
        cut_runs.insert(key.clone(), run);
    }

    // 2. Nothing completed without its outcome: the cut claims are in
    // progress, fence 1, and no row is completed.
    let t = db.ident(&table);
    assert_eq!(
        db.count(&format!(
            "SELECT COUNT(*) FROM {t} WHERE state = 'completed' OR outcome IS NOT NULL"
        ))
        .await,
        0
    );
    for key in &keys {
        let record = direct
            .get(&SCOPE.into(), &idem::Key::new(key.as_str()).unwrap())
            .await
            .unwrap()
            .expect("the cut claim");
        assert_eq!(
            (record.state, record.fence),
            (State::InProgress, 1),
            "{key}"
        );
    }
    assert_eq!(total_runs.load(Ordering::SeqCst), KEYS);

    // 3. Connections go through again: the outcomes land, and concurrent
    // retries of each key replay the cut run's value.
    proxy.reopen();
    let retries: Vec<_> = keys
        .iter()
        .flat_map(|k| (0..RETRIERS).map(move |_| k.clone()))
        .map(|k| (k.clone(), call(k, None, Duration::from_millis(20))))
        .collect();
    let mut results: HashMap<String, Vec<usize>> = HashMap::new();
    for (key, task) in retries {
        let run = tokio::time::timeout(Duration::from_secs(30), task)
            .await
            .expect("a retry returns")
            .expect("a retry does not panic")
            .unwrap_or_else(|err| panic!("{key}: retry failed: {err:?}"));
        results.entry(key).or_default().push(run);
    }
    for key in &keys {
        let seen = &results[key];
        assert!(seen.iter().all(|r| *r == cut_runs[key]), "{key}: {seen:?}");
        assert_eq!(runs.lock().unwrap()[key], 1, "{key}: the body ran again");
        let record = direct
            .get(&SCOPE.into(), &idem::Key::new(key.as_str()).unwrap())
            .await
            .unwrap()
            .unwrap();
        assert_eq!((record.state, record.fence), (State::Completed, 1), "{key}");
        assert_eq!(
            record.outcome.unwrap().body,
            seen[0].to_string().into_bytes()
        );
    }
    assert_eq!(total_runs.load(Ordering::SeqCst), KEYS);
}

/// Transactional mode under the same cut: the claim, the business row and
/// the completion travel on one transaction, so the cut rolls all three
/// back. The retries then find no record and run at once, and every key
/// ends with exactly one committed business row.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn cut_transactions_roll_back_whole_and_commit_once() {
    let (direct, mut guard) = postgres::store(4).await;
    let db = postgres::db(&direct);
    let table = direct.table_name().to_owned();
    let rows = guard.table("rows");
    db.create_runs_table(&rows).await;
    let url = Server::Postgres.url();
    let options = PgConnectOptions::from_str(&url).expect("a PostgreSQL URL");
    let upstream = format!("{}:{}", options.get_host(), options.get_port());
    let proxy = Proxy::start(upstream).await;
    let pool = PgPoolOptions::new()
        .max_connections(KEYS as u32 + 2)
        .acquire_timeout(Duration::from_secs(1))
        .connect_with(options.host("127.0.0.1").port(proxy.addr.port()))
        .await
        .expect("connect through the proxy");
    let store = Arc::new(
        idem::PostgresStore::new(pool.clone())
            .with_table_name(&table)
            .expect("a valid table name"),
    );

    let call = |key: String, started: Option<Arc<Barrier>>, pause: Duration| {
        let (store, pool, rows) = (store.clone(), pool.clone(), rows.clone());
        tokio::spawn(async move {
            let mut tx = pool.begin().await.map_err(Error::store)?;
            let insert = format!("INSERT INTO \"{rows}\" (run_key) VALUES ($1) RETURNING id");
            let result = idem::run_in_transaction::<_, _, i64, Error, _, _, _>(
                &*store,
                &mut *tx,
                Call::new(SCOPE, key.as_str(), &"payload"),
                |conn| async move {
                    let id = sqlx::query_scalar::<_, i64>(&insert)
                        .bind(&key)
                        .fetch_one(&mut *conn)
                        .await
                        .map_err(Error::store);
                    if let Some(started) = started {
                        started.wait().await;
                    }
                    tokio::time::sleep(pause).await;
                    (id, conn)
                },
            )
            .await?;
            tx.commit().await.map_err(Error::store)?;
            Ok::<_, Error>(result)
        })
    };

    let keys = fresh_keys("nettx");
    let calls = start_then_cut(&proxy, &keys, call).await;
    for (key, task) in keys.iter().zip(calls) {
        let result = tokio::time::timeout(Duration::from_secs(30), task)
            .await
            .expect("a cut call returns")
            .expect("a cut call does not panic");
        match result {
            Err(err) => assert!(err.is_retryable(), "{key}: not retryable: {err:?}"),
            Ok(run) => panic!("{key}: committed through a cut connection (run {run})"),
        }
    }
    // Rolled back whole: no record, no business row.
    let (t, r) = (db.ident(&table), db.ident(&rows));
    assert_eq!(db.count(&format!("SELECT COUNT(*) FROM {t}")).await, 0);
    assert_eq!(db.count(&format!("SELECT COUNT(*) FROM {r}")).await, 0);

    proxy.reopen();
    let retries: Vec<_> = keys
        .iter()
        .flat_map(|k| (0..RETRIERS).map(move |_| k.clone()))
        .map(|k| (k.clone(), call(k, None, Duration::from_millis(20))))
        .collect();
    let mut results: HashMap<String, Vec<i64>> = HashMap::new();
    for (key, task) in retries {
        let run = tokio::time::timeout(Duration::from_secs(30), task)
            .await
            .expect("a retry returns")
            .expect("a retry does not panic")
            .unwrap_or_else(|err| panic!("{key}: retry failed: {err:?}"));
        results.entry(key).or_default().push(run);
    }
    for key in &keys {
        let seen = &results[key];
        assert!(seen.iter().all(|r| *r == seen[0]), "{key}: {seen:?}");
        let record = direct
            .get(&SCOPE.into(), &idem::Key::new(key.as_str()).unwrap())
            .await
            .unwrap()
            .unwrap();
        assert_eq!((record.state, record.fence), (State::Completed, 1), "{key}");
    }
    assert_eq!(
        db.count(&format!("SELECT COUNT(*) FROM {r}")).await,
        KEYS as i64,
        "one committed business row per key"
    );
    assert_eq!(
        db.count(&format!("SELECT COUNT(DISTINCT run_key) FROM {r}"))
            .await,
        KEYS as i64
    );
}
