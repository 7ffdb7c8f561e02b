//! Entity mode's first execution (find by token, claim, find again, then
//! the row's INSERT and the claim's completion in one transaction), with
//! faults injected at exact points:
//!
//! - the caller is dropped while the answer to the transaction's `BEGIN`
//!   is on its way (held back by a proxy): no connection is left inside a
//!   transaction the pool lends on, and a retry runs (sqlx counts a
//!   transaction only once `BEGIN` is answered, so the connection is
//!   closed rather than pooled: `src/backend/tx.rs`);
//! - the COMMIT of the row's transaction reaches the server, which commits,
//!   and its answer is lost (a proxy cuts the connection right after
//!   forwarding it): the call must answer the row, once;
//! - the caller is dropped while that COMMIT's answer is held back (the
//!   commit landed), or while the COMMIT itself is held back (it never
//!   lands): a retry replays the committed row, or runs once;
//! - a caller dropped by a timeout at every point of the flow (a proxy
//!   slows each round trip so the timeouts spread over the awaits): no
//!   second row, and no body runs after the one whose row stands;
//! - a lease that lapses while the first owner is stalled: whichever owner
//!   commits first, one row, and both callers get it;
//! - on MariaDB, an entity larger than `max_allowed_packet` (the server
//!   closes the connection on every attempt): the call must end.

use crate::common;

use std::collections::HashMap;
use std::net::SocketAddr;
use std::sync::atomic::{AtomicBool, AtomicUsize, Ordering};
use std::sync::{Arc, Mutex};
use std::time::Duration;

use idem::{Call, Policy};
use serde::Serialize;
use tokio::io::{AsyncReadExt, AsyncWriteExt};
use tokio::net::{TcpListener, TcpStream};
use tokio::sync::Notify;

#[derive(Debug, thiserror::Error)]
pub enum Failed {
    #[error(transparent)]
    Idem(#[from] idem::Error),
}

#[derive(Debug, Clone, Serialize)]
pub struct Order {
    pub token: String,
    pub amount: i64,
}

/// The row: `run` is the body run (per token) that produced it.
#[derive(Debug, Clone, PartialEq, sqlx::FromRow, idem::Entity)]
#[idem(table = "paid")]
pub struct Paid {
    #[idem(generated)]
    pub id: i64,
    #[idem(token)]
    pub token: String,
    pub amount: i64,
    pub run: i64,
    pub note: String,
    #[idem(request_hash)]
    pub request_hash: Option<String>,
}

const SQLITE: &str = "CREATE TABLE paid (
    id INTEGER PRIMARY KEY AUTOINCREMENT,
    token TEXT NOT NULL UNIQUE,
    amount INTEGER NOT NULL,
    run INTEGER NOT NULL,
    note TEXT NOT NULL,
    request_hash TEXT)";
const POSTGRES: &str = "CREATE TABLE paid (
    id BIGINT GENERATED ALWAYS AS IDENTITY PRIMARY KEY,
    token TEXT NOT NULL UNIQUE,
    amount BIGINT NOT NULL,
    run BIGINT NOT NULL,
    note TEXT NOT NULL,
    request_hash TEXT)";
const MYSQL: &str = "CREATE TABLE paid (
    id BIGINT AUTO_INCREMENT PRIMARY KEY,
    token VARCHAR(255) CHARACTER SET ascii NOT NULL UNIQUE,
    amount BIGINT NOT NULL,
    run BIGINT NOT NULL,
    note LONGTEXT NOT NULL,
    request_hash CHAR(64) CHARACTER SET ascii) ENGINE = InnoDB";

fn table(backend: &str) -> &'static str {
    match backend {
        "sqlite_file" => SQLITE,
        "postgres" => POSTGRES,
        "mysql" => MYSQL,
        other => panic!("no table for {other}"),
    }
}

/// Body runs per token.
#[derive(Default, Clone)]
pub struct Runs(Arc<Mutex<HashMap<String, i64>>>);

impl Runs {
    fn next(&self, token: &str) -> i64 {
        let mut runs = self.0.lock().unwrap();
        let n = runs.entry(token.to_owned()).or_default();
        *n += 1;
        *n
    }
    fn of(&self, token: &str) -> i64 {
        self.0.lock().unwrap().get(token).copied().unwrap_or(0)
    }
}

fn paid(token: &str, run: i64) -> Paid {
    Paid {
        id: 0,
        token: token.to_owned(),
        amount: 500,
        run,
        note: String::new(),
        request_hash: None,
    }
}

fn call(token: &str, policy: Policy) -> Call {
    Call::new(
        "entity_cuts.pay",
        token,
        &Order {
            token: token.to_owned(),
            amount: 500,
        },
    )
    .with_policy(policy)
}

// ------------------------------------------------------------ the proxy

/// What the proxy does with the next COMMIT it sees (then it passes).
#[derive(Clone, Copy, PartialEq, Debug)]
enum OnCommit {
    Pass,
    /// Forwards it, drops the answer, cuts the connection 300 ms later.
    CutAfter,
    /// Forwards it, holds the answer until `release`, then cuts.
    HoldAnswer,
    /// Holds it (never forwarded) until `release`, then cuts.
    HoldCommit,
    /// Not a COMMIT: on the next BEGIN, forwards it and delays its
    /// answer by a second.
    DelayBeginAnswer,
}

struct Proxy {
    addr: SocketAddr,
    mode: Arc<Mutex<OnCommit>>,
    fired: Arc<AtomicUsize>,
    release: Arc<Notify>,
    delay: Arc<Mutex<Duration>>,
    task: tokio::task::JoinHandle<()>,
}

fn find(haystack: &[u8], needle: &[u8]) -> bool {
    haystack.windows(needle.len()).any(|w| w == needle)
}

impl Proxy {
    async fn start(upstream: String, commit: &'static [u8], begin: &'static [u8]) -> Proxy {
        let listener = TcpListener::bind("127.0.0.1:0").await.unwrap();
        let addr = listener.local_addr().unwrap();
        let mode = Arc::new(Mutex::new(OnCommit::Pass));
        let fired = Arc::new(AtomicUsize::new(0));
        let release = Arc::new(Notify::new());
        let delay = Arc::new(Mutex::new(Duration::ZERO));
        let task = tokio::spawn({
            let (mode, fired, release, delay) =
                (mode.clone(), fired.clone(), release.clone(), delay.clone());
            async move {
                loop {
                    let Ok((client, _)) = listener.accept().await else {
                        continue;
                    };
                    let Ok(server) = TcpStream::connect(&upstream).await else {
                        continue;
                    };
                    let (mut c_read, mut c_write) = client.into_split();
                    let (mut s_read, mut s_write) = server.into_split();
                    let muted = Arc::new(AtomicBool::new(false));
                    let slowed = Arc::new(AtomicBool::new(false));
                    let slowed2 = slowed.clone();
                    let stop = Arc::new(Notify::new());
                    let (mode, fired, release, delay) =
                        (mode.clone(), fired.clone(), release.clone(), delay.clone());
                    let (muted2, stop2, delay2) = (muted.clone(), stop.clone(), delay.clone());
                    tokio::spawn(async move {
                        let mut buf = vec![0u8; 1 << 16];
                        loop {
                            let n = match c_read.read(&mut buf).await {
                                Ok(0) | Err(_) => break,
                                Ok(n) => n,
                            };
                            let pause = *delay.lock().unwrap();
                            if !pause.is_zero() {
                                tokio::time::sleep(pause).await;
                            }
                            let chunk = &buf[..n];
                            let armed = {
                                let mut m = mode.lock().unwrap();
                                let armed = *m;
                                let pattern = match armed {
                                    OnCommit::DelayBeginAnswer => begin,
                                    _ => commit,
                                };
                                if armed != OnCommit::Pass && find(chunk, pattern) {
                                    *m = OnCommit::Pass;
                                    armed
                                } else {
                                    OnCommit::Pass
                                }
                            };
                            match armed {
                                OnCommit::DelayBeginAnswer => {
                                    slowed.store(true, Ordering::SeqCst);
                                    if s_write.write_all(chunk).await.is_err() {
                                        break;
                                    }
                                    fired.fetch_add(1, Ordering::SeqCst);
                                }
                                OnCommit::Pass => {
                                    if s_write.write_all(chunk).await.is_err() {
                                        break;
                                    }
                                }
                                OnCommit::CutAfter => {
                                    muted.store(true, Ordering::SeqCst);
                                    let _ = s_write.write_all(chunk).await;
                                    fired.fetch_add(1, Ordering::SeqCst);
                                    tokio::time::sleep(Duration::from_millis(300)).await;
                                    break;
                                }
                                OnCommit::HoldAnswer => {
                                    muted.store(true, Ordering::SeqCst);
                                    let _ = s_write.write_all(chunk).await;
                                    fired.fetch_add(1, Ordering::SeqCst);
                                    release.notified().await;
                                    break;
                                }
                                OnCommit::HoldCommit => {
                                    fired.fetch_add(1, Ordering::SeqCst);
                                    release.notified().await;
                                    break;
                                }
                            }
                        }
                        stop.notify_one();
                        // Both halves go: the connection is cut.
                    });
                    tokio::spawn(async move {
                        let mut buf = vec![0u8; 1 << 16];
                        loop {
                            let n = tokio::select! {
                                read = s_read.read(&mut buf) => match read {
                                    Ok(0) | Err(_) => break,
                                    Ok(n) => n,
                                },
                                _ = stop2.notified() => break,
                            };
                            if muted2.load(Ordering::SeqCst) {
                                continue;
                            }
                            if slowed2.swap(false, Ordering::SeqCst) {
                                tokio::time::sleep(Duration::from_secs(1)).await;
                            }
                            let pause = *delay2.lock().unwrap();
                            if !pause.is_zero() {
                                tokio::time::sleep(pause).await;
                            }
                            if c_write.write_all(&buf[..n]).await.is_err() {
                                break;
                            }
                        }
                    });
                }
            }
        });
        Proxy {
            addr,
            mode,
            fired,
            release,
            delay,
            task,
        }
    }

    fn arm(&self, mode: OnCommit) {
        *self.mode.lock().unwrap() = mode;
    }

    /// `url` pointed at the proxy, without TLS (the proxy reads the bytes).
    fn url(&self, url: &str, no_tls: &str) -> String {
        let mut url = reqwest::Url::parse(url).unwrap();
        url.set_port(Some(self.addr.port())).unwrap();
        url.set_host(Some("127.0.0.1")).unwrap();
        let mut url = url.to_string();
        url.push(if url.contains('?') { '&' } else { '?' });
        url.push_str(no_tls);
        url
    }
}

impl Drop for Proxy {
    fn drop(&mut self) {
        self.task.abort();
    }
}

common::backends!(sqlite_file, postgres, mysql => {
    use common::namespace::Namespace;
    use idem::Key;

    type Pool = sqlx::Pool<backend::Database>;
    type Answer = Result<Paid, Failed>;

    async fn namespace() -> Namespace {
        let ns = backend::namespace("entity_cuts").await;
        let pool = backend::pool(&ns, 1).await;
        sqlx::raw_sql(table(backend::NAME)).execute(&pool).await.unwrap();
        pool.close().await;
        ns
    }

    async fn rows(pool: &Pool, token: &str) -> i64 {
        sqlx::query_scalar(&format!(
            "SELECT COUNT(*) FROM paid WHERE token = {}",
            backend::param(1)
        ))
        .bind(token)
        .fetch_one(pool)
        .await
        .unwrap()
    }

    async fn stored(pool: &Pool, token: &str) -> Option<Paid> {
        idem::entity::find(pool, &Key::new(token).unwrap()).await.unwrap()
    }

    async fn claim_state(pool: &Pool, token: &str) -> Option<idem::record::State> {
        use idem::Store as _;
        let claims = idem::store::SqlStore::new(pool.clone())
            .with_table_name("idem_entity_claims")
            .unwrap();
        claims
            .get(&idem::Scope::new("idem.entity.paid"), &Key::new(token).unwrap())
            .await
            .unwrap()
            .map(|r| r.state)
    }

    /// A lease lapses while the first owner A is stalled (its runtime
    /// blocked, so it cannot renew); B takes the claim over. `a_first`:
    /// A's row commits while B still holds the claim; otherwise B's row
    /// commits first. One row, and both callers get it.
    async fn lapse(a_first: bool) {
        let ns = Arc::new(namespace().await);
        let runs = Runs::default();
        let token = "lapse";
        let lease = Duration::from_millis(300);
        let policy = Policy::new().lease(lease).wait(Duration::from_secs(30));
        let a_in_body = Arc::new(AtomicBool::new(false));
        let a_done = Arc::new(AtomicBool::new(false));
        let a = std::thread::spawn({
            let (ns, runs, a_in_body, a_done) =
                (ns.clone(), runs.clone(), a_in_body.clone(), a_done.clone());
            move || {
                let rt = tokio::runtime::Builder::new_current_thread()
                    .enable_all()
                    .build()
                    .unwrap();
                rt.block_on(async move {
                    let pool = backend::pool(&ns, 2).await;
                    let answer: Answer = idem::entity::run(&pool, call(token, policy), async {
                        let run = runs.next(token);
                        a_in_body.store(true, Ordering::SeqCst);
                        // Stalled: nothing on this runtime renews the lease.
                        std::thread::sleep(Duration::from_millis(1_500));
                        Ok(paid(token, run))
                    })
                    .await;
                    a_done.store(true, Ordering::SeqCst);
                    pool.close().await;
                    answer
                })
            }
        });
        while !a_in_body.load(Ordering::SeqCst) {
            tokio::time::sleep(Duration::from_millis(5)).await;
        }
        tokio::time::sleep(lease * 2).await;
        let pool = backend::pool(&ns, 4).await;
        let mut seen_between = None;
        let b: Answer = idem::entity::run(&pool, call(token, policy), async {
            let run = runs.next(token);
            if a_first {
                while !a_done.load(Ordering::SeqCst) {
                    tokio::time::sleep(Duration::from_millis(5)).await;
                }
                seen_between = Some((rows(&pool, token).await, claim_state(&pool, token).await));
            }
            Ok(paid(token, run))
        })
        .await;
        let a = a.join().unwrap();
        eprintln!(
            "lapse(a_first={a_first}): runs {}, between {seen_between:?}, a {a:?}, b {b:?}",
            runs.of(token)
        );
        let (a, b) = (a.expect("A's answer"), b.expect("B's answer"));
        assert_eq!(a, b, "the two owners answer different rows");
        assert_eq!(rows(&pool, token).await, 1);
        assert_eq!(stored(&pool, token).await, Some(a.clone()));
        assert_eq!(a.run, if a_first { 1 } else { 2 });
        assert_eq!(claim_state(&pool, token).await, Some(idem::record::State::Completed));
        // A replay answers the row without running.
        let again: Answer =
            idem::entity::run(&pool, call(token, policy), async { unreachable!() }).await;
        assert_eq!(again.unwrap(), a);
        pool.close().await;
    }

    #[tokio::test(flavor = "multi_thread", worker_threads = 2)]
    async fn lapsed_lease_first_owner_commits_first() {
        lapse(true).await;
    }

    #[tokio::test(flavor = "multi_thread", worker_threads = 2)]
    async fn lapsed_lease_second_owner_commits_first() {
        lapse(false).await;
    }

    backend::if_server! {
        fn commit_pattern() -> &'static [u8] {
            match backend::NAME {
                // Simple query 'Q', length 11, "COMMIT\0".
                "postgres" => b"Q\x00\x00\x00\x0bCOMMIT\x00",
                // COM_QUERY packet of 7 bytes, sequence 0: 0x03 "COMMIT".
                _ => b"\x07\x00\x00\x00\x03COMMIT",
            }
        }

        fn begin_pattern() -> &'static [u8] {
            match backend::NAME {
                "postgres" => b"Q\x00\x00\x00\x0aBEGIN\x00",
                _ => b"\x06\x00\x00\x00\x03BEGIN",
            }
        }

        /// The namespace's connections idle inside an open transaction.
        async fn idle_in_transaction(ns: &Namespace) -> i64 {
            match ns.admin() {
                common::servers::Db::Postgres(pool) => sqlx::query_scalar(
                    "SELECT COUNT(*) FROM pg_stat_activity \
                     WHERE application_name = $1 AND state LIKE 'idle in transaction%'",
                )
                .bind(ns.name())
                .fetch_one(pool)
                .await
                .unwrap(),
                common::servers::Db::MySql(pool) => sqlx::query_scalar(
                    "SELECT COUNT(*) FROM information_schema.INNODB_TRX t \
                     JOIN information_schema.PROCESSLIST p ON p.ID = t.trx_mysql_thread_id \
                     WHERE p.DB = ? AND p.COMMAND = 'Sleep'",
                )
                .bind(ns.name())
                .fetch_one(pool)
                .await
                .unwrap(),
            }
        }

        fn no_tls() -> &'static str {
            match backend::NAME {
                "postgres" => "sslmode=disable",
                _ => "ssl-mode=disabled",
            }
        }

        /// Runs a first call of `token` whose body sets the proxy to
        /// `mode`, and aborts its task `settle_ms` after the proxy acted.
        async fn aborted_once_fired(
            proxy: &Proxy,
            pool: &Pool,
            runs: &Runs,
            token: &'static str,
            policy: Policy,
            mode: OnCommit,
            settle_ms: u64,
        ) {
            let first = tokio::spawn({
                let (pool, runs) = (pool.clone(), runs.clone());
                let proxy_mode = proxy.mode.clone();
                async move {
                    let answer: Answer = idem::entity::run(&pool, call(token, policy), async {
                        let run = runs.next(token);
                        *proxy_mode.lock().unwrap() = mode;
                        Ok(paid(token, run))
                    })
                    .await;
                    answer
                }
            });
            while proxy.fired.load(Ordering::SeqCst) == 0 {
                tokio::time::sleep(Duration::from_millis(2)).await;
            }
            tokio::time::sleep(Duration::from_millis(settle_ms)).await;
            first.abort();
            assert!(first.await.unwrap_err().is_cancelled());
        }

        async fn proxied(ns: &Namespace) -> (Proxy, Pool) {
            proxied_with(ns, 4).await
        }

        async fn proxied_with(ns: &Namespace, max: u32) -> (Proxy, Pool) {
            let upstream = reqwest::Url::parse(ns.url()).unwrap();
            let upstream = format!(
                "{}:{}",
                upstream.host_str().unwrap(),
                upstream.port().unwrap()
            );
            let proxy = Proxy::start(upstream, commit_pattern(), begin_pattern()).await;
            let pool = sqlx::pool::PoolOptions::<backend::Database>::new()
                .max_connections(max)
                .acquire_timeout(Duration::from_secs(10))
                .connect(&proxy.url(ns.url(), no_tls()))
                .await
                .unwrap();
            (proxy, pool)
        }

        /// The row's COMMIT lands, and its answer is lost: the call
        /// answers the row, the body ran once, and the claim is
        /// completed.
        #[tokio::test(flavor = "multi_thread", worker_threads = 2)]
        async fn a_commit_whose_answer_is_lost_answers_the_row_once() {
            let ns = namespace().await;
            let (proxy, pool) = proxied(&ns).await;
            let direct = backend::pool(&ns, 2).await;
            let runs = Runs::default();
            let token = "lost-answer";
            let policy = Policy::new();
            let answer: Answer = tokio::time::timeout(
                Duration::from_secs(30),
                idem::entity::run(&pool, call(token, policy), async {
                    let run = runs.next(token);
                    proxy.arm(OnCommit::CutAfter);
                    Ok(paid(token, run))
                }),
            )
            .await
            .expect("the call ends");
            assert_eq!(proxy.fired.load(Ordering::SeqCst), 1, "the COMMIT was not seen");
            let row = answer.expect("the row, not an error");
            assert_eq!(row.run, 1);
            assert_eq!(rows(&direct, token).await, 1);
            assert_eq!(stored(&direct, token).await, Some(row.clone()));
            assert_eq!(runs.of(token), 1);
            assert_eq!(claim_state(&direct, token).await, Some(idem::record::State::Completed));
            let again: Answer =
                idem::entity::run(&pool, call(token, policy), async { unreachable!() }).await;
            assert_eq!(again.unwrap(), row);
        }

        /// The caller is dropped (a timeout, an aborted task) while the
        /// `BEGIN` of the row's transaction waits for its answer. The
        /// connection must not go back to the pool inside an open
        /// transaction: every later write on it (the hand-back of the
        /// claim, other calls' claims) would be answered as done yet
        /// never committed, and hold its locks. A retry from another
        /// process, once the claim's lease has run out, must run.
        #[tokio::test(flavor = "multi_thread", worker_threads = 2)]
        async fn a_call_dropped_during_begin_leaves_no_open_transaction() {
            let ns = namespace().await;
            // One connection: the dropped call's is the one the claim's
            // hand-back then uses.
            let (proxy, pool) = proxied_with(&ns, 1).await;
            let runs = Runs::default();
            let token = "dropped-at-begin";
            let policy = Policy::new().lease(Duration::from_secs(1)).wait(Duration::from_secs(10));
            let delay = OnCommit::DelayBeginAnswer;
            aborted_once_fired(&proxy, &pool, &runs, token, policy, delay, 100).await;
            // The BEGIN's answer arrives, the connection goes back to the
            // pool, the claim is handed back on it.
            tokio::time::sleep(Duration::from_secs(2)).await;
            let leaked = idle_in_transaction(&ns).await;
            // Another process retries once the lease has run out.
            let other = backend::pool(&ns, 2).await;
            let retried: Result<Answer, _> = tokio::time::timeout(
                Duration::from_secs(15),
                idem::entity::run(&other, call(token, policy), async {
                    Ok(paid(token, runs.next(token)))
                }),
            )
            .await;
            eprintln!(
                "dropped at BEGIN: {leaked} connection(s) idle in transaction; retry: {retried:?}"
            );
            pool.close().await;
            assert_eq!(leaked, 0, "a connection went back to the pool inside a transaction");
            let row = retried.expect("the retry hangs").expect("the retry's row");
            assert_eq!(rows(&other, token).await, 1);
            assert_eq!(row.run, 2);
        }

        /// The caller is dropped while the row's COMMIT is at the server:
        /// `landed`, its answer held back (the commit landed); otherwise
        /// the COMMIT itself held back (it never lands). Then the
        /// connection is cut. A retry replays the landed row, or runs
        /// once and stores one row.
        async fn dropped_at_commit(landed: bool) {
            let ns = namespace().await;
            let (proxy, pool) = proxied(&ns).await;
            let direct = backend::pool(&ns, 2).await;
            let runs = Runs::default();
            let token = "dropped-at-commit";
            let policy = Policy::new().wait(Duration::from_secs(30));
            let mode = if landed { OnCommit::HoldAnswer } else { OnCommit::HoldCommit };
            aborted_once_fired(&proxy, &pool, &runs, token, policy, mode, 200).await;
            tokio::time::sleep(Duration::from_millis(200)).await;
            proxy.release.notify_waiters();
            let retried: Answer = tokio::time::timeout(
                Duration::from_secs(30),
                idem::entity::run(&pool, call(token, policy), async {
                    Ok(paid(token, runs.next(token)))
                }),
            )
            .await
            .expect("the retry ends");
            let row = retried.expect("the retry's row");
            assert_eq!(rows(&direct, token).await, 1);
            assert_eq!(stored(&direct, token).await, Some(row.clone()));
            if landed {
                assert_eq!(row.run, 1, "the landed row is not the answer");
                assert_eq!(runs.of(token), 1, "the body ran after its row committed");
            } else {
                assert_eq!(row.run, 2);
                assert_eq!(runs.of(token), 2);
            }
        }

        #[tokio::test(flavor = "multi_thread", worker_threads = 2)]
        async fn dropped_while_the_landed_commit_answers() {
            dropped_at_commit(true).await;
        }

        #[tokio::test(flavor = "multi_thread", worker_threads = 2)]
        async fn dropped_while_the_commit_is_held() {
            dropped_at_commit(false).await;
        }

        /// A caller dropped by a timeout at every point of the flow (each
        /// round trip slowed by the proxy): no second row, the retry
        /// answers the row that stands, and no body ran after the one
        /// whose row stands.
        #[tokio::test(flavor = "multi_thread", worker_threads = 2)]
        async fn a_timeout_at_every_await_keeps_one_row_and_one_run_after_it() {
            let ns = namespace().await;
            let (proxy, pool) = proxied(&ns).await;
            let direct = backend::pool(&ns, 2).await;
            let runs = Runs::default();
            let policy = Policy::new().wait(Duration::from_secs(30));
            // Warm up the claims' table (migrated once per process).
            let _: Answer = idem::entity::run(&pool, call("warm", policy), async {
                Ok(paid("warm", runs.next("warm")))
            })
            .await;
            *proxy.delay.lock().unwrap() = Duration::from_millis(3);
            let mut outcomes = Vec::new();
            for step in 0..40u64 {
                let token = format!("sweep-{step}");
                let first = tokio::time::timeout(
                    Duration::from_millis(step * 4),
                    idem::entity::run(&pool, call(&token, policy), async {
                        Ok::<_, Failed>(paid(&token, runs.next(&token)))
                    }),
                )
                .await;
                let retried: Answer = tokio::time::timeout(
                    Duration::from_secs(30),
                    idem::entity::run(&pool, call(&token, policy), async {
                        Ok(paid(&token, runs.next(&token)))
                    }),
                )
                .await
                .unwrap_or_else(|_| panic!("{token}: the retry hangs"));
                let row = retried.unwrap_or_else(|e| panic!("{token}: {e:?}"));
                assert_eq!(rows(&direct, &token).await, 1, "{token}");
                assert_eq!(stored(&direct, &token).await, Some(row.clone()), "{token}");
                assert_eq!(
                    runs.of(&token),
                    row.run,
                    "{token}: a body ran after the one whose row stands"
                );
                if let Ok(first) = first {
                    assert_eq!(first.unwrap(), row, "{token}");
                }
                outcomes.push((step, runs.of(&token)));
            }
            eprintln!("sweep (timeout step, runs): {outcomes:?}");
        }
    }

    backend::if_mysql! {
        /// An entity the server refuses by closing the connection
        /// (larger than `max_allowed_packet`): every attempt fails the
        /// same way. The call must end, not retry for ever.
        #[tokio::test(flavor = "multi_thread", worker_threads = 2)]
        async fn an_entity_the_server_always_refuses_does_not_hang() {
            let ns = namespace().await;
            let pool = backend::pool(&ns, 4).await;
            let max: i64 = sqlx::query_scalar("SELECT CAST(@@max_allowed_packet AS SIGNED)")
                .fetch_one(&pool)
                .await
                .unwrap();
            let token = "too-big";
            let policy = Policy::new();
            let ended = tokio::time::timeout(
                Duration::from_secs(30),
                idem::entity::run(&pool, call(token, policy), async {
                    let mut row = paid(token, 1);
                    row.note = "x".repeat(max as usize + 1024);
                    Ok::<_, Failed>(row)
                }),
            )
            .await;
            eprintln!("oversize entity: {:?}", ended.as_ref().map(|r| r.as_ref().map(|p| p.id)));
            assert!(ended.is_ok(), "the call still retries the insert after 30 s");
        }
    }
});

/// A caller dropped at every point of entity mode's flow.
mod dropped_callers {
    use super::*;

    common::backends!(sqlite_file, postgres, mysql => {
        use common::namespace::Namespace;

        async fn namespace() -> Namespace {
            let ns = backend::namespace("entity_cuts_drops").await;
            let pool = backend::pool(&ns, 1).await;
            sqlx::raw_sql(table(backend::NAME)).execute(&pool).await.unwrap();
            pool.close().await;
            ns
        }

        /// Callers dropped at every point of the flow, one token after
        /// another (the drop moves through the find, the claim, the body and
        /// the row's transaction), each followed at once by a caller that
        /// finishes. Found by the simulation harness: on SQLite, a connection
        /// dropped inside the row's transaction went back to the pool still
        /// holding the database's write lock, and the callers after it waited
        /// until they failed "database is locked", or for ever. On MariaDB
        /// the very first call on a fresh database, dropped at its first
        /// poll, left the claims' migration lock held by a pooled
        /// connection, and the next call had no answer in 15 s
        /// (`dropped_migrations`).
        #[tokio::test(flavor = "multi_thread", worker_threads = 2)]
        async fn no_dropped_caller_leaves_the_database_locked() {
            let ns = namespace().await;
            let pool = backend::pool(&ns, 8).await;
            let policy = Policy::new().lease(Duration::from_millis(200));
            for i in 0..200u64 {
                let token = format!("drop-{i}");
                let body = |run| {
                    let token = token.clone();
                    async move {
                        tokio::time::sleep(Duration::from_millis(3)).await;
                        Ok::<_, Failed>(paid(&token, run))
                    }
                };
                let drop_at = Duration::from_micros((i * 137) % 9_000);
                let _ = tokio::time::timeout(
                    drop_at,
                    idem::entity::run(&pool, call(&token, policy), body(1)),
                )
                .await;
                // Well past the lease and the wait: a lock held for ever
                // (SQLite's, before) never answers; a slow server still does.
                let next = tokio::time::timeout(
                    Duration::from_secs(15),
                    idem::entity::run(&pool, call(&token, policy), body(2)),
                )
                .await
                .unwrap_or_else(|_| panic!("{token} (the first dropped at {drop_at:?}): no answer in 15 s"));
                let row = next.unwrap_or_else(|err| panic!("{token} (dropped at {drop_at:?}): {err:?}"));
                assert_eq!(row.token, token);
            }
        }
    });
}
