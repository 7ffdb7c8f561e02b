//! A soak of the payments example app: retrying clients while its database
//! connections are killed, on PostgreSQL and MariaDB/MySQL, with the HTTP
//! idempotency layer on and off.
//!
//! Each case starts the real service (its modules are compiled in, as in
//! `tests/payments_example.rs`) on an ephemeral port of 127.0.0.1, in a schema
//! (PostgreSQL) or a database (MariaDB) of its own, dropped at the end.
//! Clients behave like real ones: every logical payment has its own
//! `Idempotency-Key`; a request has a timeout; a timeout, a 5xx or a 409
//! is retried with the same key and the same body after a small, growing
//! backoff; now and then an answer is "lost" and asked for again. During
//! the load phase a killer terminates the app's connections at random: one
//! at a time, and now and then all of them, as a database failover would
//! (`pg_terminate_backend`, `KILL CONNECTION`). The gateway's ledger, the
//! ground truth, is written through a pool of its own that is never killed,
//! since it stands for another system. Then the clients finish their last
//! keys on a healthy database (the drain).
//!
//! At the end, with the ledger quiet:
//!
//! - every key is charged at most once, and every accepted key (one that got
//!   a 201 or a 402) exactly once, with exactly one payment row;
//! - every answer for a key carries the same payment id, that row's id.
//!
//! The ledger holds charges, not requests: the gateway dedupes by the
//! idempotency key the service's `charge` step derives, and a request it
//! answers from its key adds no row. A ledger row is money moved, and its
//! `reference` is the client's key, so "charged at most once" still counts
//! charges per client key, whatever key the service sent them under (two
//! charges under two gateway keys are two rows with one reference). The
//! figures also say how often the gateway answered a charge from its key:
//! a charge the service sent again, which the key kept single.
//!
//! `IDEM_SOAK_SECS` sets the load phase per case (default 8 s); the drain
//! that follows is bounded too. The figures of each case are printed
//! (`cargo test --all-features --test suite --
//! payments_killed_connections:: --nocapture`).

use crate::payments;

use crate::common;

use std::collections::{BTreeMap, HashMap, HashSet};
use std::fmt;
use std::sync::atomic::{AtomicUsize, Ordering};
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use common::namespace::Namespace;
use common::servers::{Db, Server};
use payments::app::{self, App};
use payments::db::{Backend, Database};
use payments::gateway::{Gateway, Ledger};
use payments::random::random_unit;
use payments::service::Payments;
use reqwest::header::CONTENT_TYPE;
use serde_json::{json, Value};

/// Concurrent clients per case.
const CLIENTS: usize = 12;
/// How long the fake card gateway takes: the window in which a killed
/// connection meets a running body.
const GATEWAY_LATENCY: Duration = Duration::from_millis(25);
/// A client's patience for one request.
const REQUEST_TIMEOUT: Duration = Duration::from_millis(1500);
/// Attempts per key before a client gives the key up.
const MAX_ATTEMPTS: usize = 60;
/// The bound on the drain after the load phase, when nothing is killed any
/// more: clients finish their current key within it, or give it up. Longer
/// than the layer's default lease (30 s), so a claim whose owner was cut
/// off can be taken over.
const DRAIN: Duration = Duration::from_secs(40);
/// The pause between two kills is drawn from this range.
const KILL_EVERY_MS: (f64, f64) = (20.0, 150.0);
/// The share of kills that take every connection of the app at once.
const KILL_ALL_SHARE: f64 = 0.05;
/// The share of final answers the client "loses" and asks for again.
const LOST_ANSWER_SHARE: f64 = 0.2;
/// The share of payments made with a card the gateway declines (402).
const DECLINED_SHARE: f64 = 0.1;

const VISA: &str = "4242424242424242";
const DECLINED: &str = "4000000000000002";

/// The load phase of one case: `IDEM_SOAK_SECS`, or 8 s.
fn soak_duration() -> Duration {
    let secs = match std::env::var("IDEM_SOAK_SECS") {
        Ok(value) => value
            .parse::<u64>()
            .unwrap_or_else(|_| panic!("IDEM_SOAK_SECS={value:?} is not a number of seconds")),
        Err(_) => 8,
    };
    Duration::from_secs(secs.clamp(1, 3600))
}

/// A uniform draw from `low..high`.
fn uniform(low: f64, high: f64) -> f64 {
    low + (high - low) * random_unit()
}

// ------------------------------------------------------------ namespace

/// The namespace of one case (a PostgreSQL schema, a MariaDB database),
/// with the connections the killer spares: the gateway ledger's.
struct Soaked {
    ns: Namespace,
    spared: Arc<Mutex<HashSet<i64>>>,
}

impl Soaked {
    async fn new(server: Server) -> Soaked {
        Soaked {
            ns: Namespace::on(server, "soak").await,
            spared: Arc::default(),
        }
    }

    /// The gateway's ledger, on a pool whose connections are spared.
    async fn ledger(&self) -> Ledger {
        let spared = self.spared.clone();
        macro_rules! spared_pool {
            ($options:ty, $url:expr, $id:literal) => {
                <$options>::new()
                    .max_connections(8)
                    .after_connect(move |conn, _| {
                        let spared = spared.clone();
                        Box::pin(async move {
                            let id: i64 = sqlx::query_scalar($id).fetch_one(&mut *conn).await?;
                            spared.lock().unwrap().insert(id);
                            Ok(())
                        })
                    })
                    .connect($url)
                    .await
                    .expect("the ledger's pool connects")
            };
        }
        match self.ns.server() {
            Server::Postgres => {
                // Another application name, too: the ledger is not the app.
                let url = format!("{}_ledger", self.ns.url());
                Ledger::Postgres(spared_pool!(
                    sqlx::postgres::PgPoolOptions,
                    &url,
                    "SELECT pg_backend_pid()::bigint"
                ))
            }
            Server::MySql => Ledger::MySql(spared_pool!(
                sqlx::mysql::MySqlPoolOptions,
                self.ns.url(),
                "SELECT CAST(CONNECTION_ID() AS SIGNED)"
            )),
        }
    }

    /// The app's open connections, the ledger's left out.
    async fn app_connections(&self) -> Result<Vec<i64>, sqlx::Error> {
        let ids = self.ns.connections().await?;
        let spared = self.spared.lock().unwrap();
        Ok(ids.into_iter().filter(|id| !spared.contains(id)).collect())
    }

    /// The reference of every charge the gateway made.
    async fn charges(&self) -> Vec<String> {
        let sql = format!("SELECT reference FROM {}", self.ns.table("gateway_charges"));
        self.strings(&sql).await
    }

    /// `(idempotency_token, id)` of every payment row.
    async fn payments(&self) -> Vec<(String, String)> {
        let sql = format!(
            "SELECT idempotency_token, id FROM {}",
            self.ns.table("payments")
        );
        let rows = match self.ns.admin() {
            Db::Postgres(pool) => sqlx::query_as(&sql).fetch_all(pool).await,
            Db::MySql(pool) => sqlx::query_as(&sql).fetch_all(pool).await,
        };
        rows.unwrap_or_else(|err| panic!("{sql}: {err}"))
    }

    async fn strings(&self, sql: &str) -> Vec<String> {
        let rows = match self.ns.admin() {
            Db::Postgres(pool) => sqlx::query_scalar(sql).fetch_all(pool).await,
            Db::MySql(pool) => sqlx::query_scalar(sql).fetch_all(pool).await,
        };
        rows.unwrap_or_else(|err| panic!("{sql}: {err}"))
    }

    /// The charges, once their count has stayed the same for a while: a
    /// body whose client gave up may still be running.
    async fn settled_charges(&self) -> Vec<String> {
        let mut last = self.charges().await;
        for _ in 0..20 {
            tokio::time::sleep(Duration::from_millis(250)).await;
            let now = self.charges().await;
            if now.len() == last.len() {
                return now;
            }
            last = now;
        }
        last
    }
}

// ------------------------------------------------------------------ app

/// The app, serving on 127.0.0.1.
struct RunningApp {
    url: String,
    gateway: Arc<Gateway>,
    shutdown: tokio::sync::oneshot::Sender<()>,
    task: tokio::task::JoinHandle<std::io::Result<()>>,
}

impl RunningApp {
    /// Opens the app's database as `payments serve` does, then puts the
    /// gateway on the spared ledger, and serves.
    async fn start(ns: &Soaked, http_layer: bool) -> RunningApp {
        let Database {
            backend,
            store,
            description,
        } = payments::db::connect(ns.ns.url(), GATEWAY_LATENCY, 0.0)
            .await
            .expect("the app opens its database");
        let gateway = Arc::new(Gateway::new(GATEWAY_LATENCY, 0.0, ns.ledger().await));
        let backend = match backend {
            Backend::Postgres(service) => {
                Backend::Postgres(Payments::new(service.pool, gateway.clone()))
            }
            Backend::MySql(service) => Backend::MySql(Payments::new(service.pool, gateway.clone())),
            Backend::Sqlite(_) => unreachable!("the soak runs on database servers"),
        };
        let app = Arc::new(App {
            db: Database {
                backend,
                store,
                description,
            },
            metrics: payments::telemetry::prometheus(),
        });
        let listener = tokio::net::TcpListener::bind(("127.0.0.1", 0))
            .await
            .unwrap();
        let url = format!("http://{}", listener.local_addr().unwrap());
        let router = app::router(app, http_layer);
        let (shutdown, stopped) = tokio::sync::oneshot::channel::<()>();
        let task = tokio::spawn(async move {
            axum::serve(listener, router)
                .with_graceful_shutdown(async {
                    let _ = stopped.await;
                })
                .await
        });
        RunningApp {
            url,
            gateway,
            shutdown,
            task,
        }
    }

    /// Stops serving: gracefully within 10 s, then by force.
    async fn stop(self) {
        let _ = self.shutdown.send(());
        let abort = self.task.abort_handle();
        if tokio::time::timeout(Duration::from_secs(10), self.task)
            .await
            .is_err()
        {
            abort.abort();
        }
    }
}

// -------------------------------------------------------------- clients

/// What one client saw for one key.
struct KeyRecord {
    key: String,
    /// The payment id of every final answer (201, 402).
    ids: Vec<String>,
    /// Every answer, in order (`201`, `500 internal`, `timeout`, ...).
    answers: Vec<String>,
    /// Answers a client cannot act on (400, 404, 422, ...).
    unexpected: Vec<String>,
}

/// Counts shared by the clients of one case.
#[derive(Default)]
struct Traffic {
    requests: AtomicUsize,
    statuses: Mutex<BTreeMap<String, usize>>,
}

impl Traffic {
    fn saw(&self, answer: &str) {
        self.requests.fetch_add(1, Ordering::Relaxed);
        *self
            .statuses
            .lock()
            .unwrap()
            .entry(answer.to_owned())
            .or_default() += 1;
    }
}

/// One answer, as a retrying client reads it, and its label for the
/// figures.
struct Answer {
    reply: Reply,
    label: String,
}

enum Reply {
    /// 201 or 402: the payment's id.
    Final(String),
    /// A timeout, a broken connection, a 5xx, a 409.
    Retry,
    /// Anything else.
    Unexpected(String),
}

async fn send(http: &reqwest::Client, url: &str, key: &str, body: &str) -> Answer {
    let sent = http
        .post(format!("{url}/payments"))
        .header(CONTENT_TYPE, "application/json")
        .header("Idempotency-Key", key)
        .body(body.to_owned())
        .timeout(REQUEST_TIMEOUT)
        .send()
        .await;
    let answer = match sent {
        Ok(response) => {
            let status = response.status().as_u16();
            response.bytes().await.map(|bytes| (status, bytes))
        }
        Err(err) => Err(err),
    };
    let (status, bytes) = match answer {
        Ok(answer) => answer,
        Err(err) => {
            let label = if err.is_timeout() {
                "timeout"
            } else {
                "transport"
            };
            return Answer {
                reply: Reply::Retry,
                label: label.to_owned(),
            };
        }
    };
    let body: Value = serde_json::from_slice(&bytes).unwrap_or(Value::Null);
    // The problem type tells a 503 of the gateway from one of the store.
    let label = match body["type"].as_str().and_then(|t| t.rsplit('#').next()) {
        Some(problem) if status >= 400 => format!("{status} {problem}"),
        _ => status.to_string(),
    };
    let id = match status {
        201 => body["id"].as_str(),
        402 => body["payment"]["id"].as_str(),
        409 | 500..=599 => None,
        _ => {
            let reply = Reply::Unexpected(format!("{status} {body}"));
            return Answer { reply, label };
        }
    };
    let reply = match (status, id) {
        (409 | 500..=599, _) => Reply::Retry,
        (_, Some(id)) => Reply::Final(id.to_owned()),
        (_, None) => Reply::Unexpected(format!("{status} without a payment id: {body}")),
    };
    Answer { reply, label }
}

/// Sends until a final answer, retrying with the same key and body after a
/// growing, jittered backoff; gives up after [`MAX_ATTEMPTS`] or at
/// `give_up`.
async fn until_final(
    http: &reqwest::Client,
    url: &str,
    key: &str,
    body: &str,
    give_up: Instant,
    traffic: &Traffic,
    record: &mut KeyRecord,
) -> bool {
    for attempt in 0..MAX_ATTEMPTS {
        let answer = send(http, url, key, body).await;
        traffic.saw(&answer.label);
        record.answers.push(answer.label);
        match answer.reply {
            Reply::Final(id) => {
                record.ids.push(id);
                return true;
            }
            Reply::Unexpected(answer) => {
                record.unexpected.push(answer);
                return false;
            }
            Reply::Retry => {}
        }
        if Instant::now() >= give_up {
            return false;
        }
        let ceiling = (10.0 * 1.5f64.powi(attempt as i32)).min(250.0);
        tokio::time::sleep(Duration::from_millis(uniform(5.0, ceiling) as u64)).await;
    }
    false
}

/// One client: a new key per payment until `stop`, each retried until it
/// has a final answer (bounded by `give_up`); some answers are "lost" and
/// asked for again with the same key.
async fn client(
    n: usize,
    url: String,
    stop: Instant,
    give_up: Instant,
    traffic: Arc<Traffic>,
) -> Vec<KeyRecord> {
    let http = reqwest::Client::builder()
        .no_proxy()
        .build()
        .expect("an HTTP client");
    let mut records = Vec::new();
    for i in 0.. {
        if Instant::now() >= stop {
            break;
        }
        let card = if random_unit() < DECLINED_SHARE {
            DECLINED
        } else {
            VISA
        };
        let amount = 100 + (random_unit() * 10_000.0) as i64;
        let body =
            json!({ "amount": amount, "currency": "EUR", "card": card, "description": "soak" })
                .to_string();
        let mut record = KeyRecord {
            key: format!("soak-{n}-{i}"),
            ids: Vec::new(),
            answers: Vec::new(),
            unexpected: Vec::new(),
        };
        let key = record.key.clone();
        let answered = until_final(&http, &url, &key, &body, give_up, &traffic, &mut record).await;
        if answered && random_unit() < LOST_ANSWER_SHARE {
            until_final(&http, &url, &key, &body, give_up, &traffic, &mut record).await;
        }
        records.push(record);
    }
    records
}

// --------------------------------------------------------------- killer

/// Kills the app's connections at random until `stop`; answers how many.
async fn killer(ns: Arc<Soaked>, stop: Instant) -> usize {
    let mut kills = 0;
    loop {
        let pause = uniform(KILL_EVERY_MS.0, KILL_EVERY_MS.1);
        tokio::time::sleep(Duration::from_millis(pause as u64)).await;
        if Instant::now() >= stop {
            return kills;
        }
        // The admin pool is never killed; a failed look is only skipped.
        let Ok(ids) = ns.app_connections().await else {
            continue;
        };
        if ids.is_empty() {
            continue;
        }
        let victims = if random_unit() < KILL_ALL_SHARE {
            ids
        } else {
            vec![ids[(random_unit() * ids.len() as f64) as usize % ids.len()]]
        };
        for id in victims {
            kills += usize::from(ns.ns.kill(id).await);
        }
    }
}

// --------------------------------------------------------------- report

/// The figures of one case, and what broke the contract.
#[derive(Default)]
struct Report {
    case: String,
    keys: usize,
    accepted: usize,
    kills: usize,
    requests: usize,
    /// Charge requests the gateway answered from their key, and lookups.
    gateway_replays: usize,
    gateway_lookups: usize,
    statuses: BTreeMap<String, usize>,
    /// Keys charged more than once: the key, the count, its answers.
    charged_twice: Vec<(String, usize, Vec<String>)>,
    /// Accepted keys without a charge.
    uncharged: Vec<String>,
    /// Accepted keys without a payment row.
    without_row: Vec<String>,
    /// Accepted keys whose answers, or row, carry different ids.
    differing_ids: Vec<String>,
    /// Charges for a key no client sent.
    stray_charges: Vec<String>,
    unexpected: Vec<String>,
}

impl Report {
    fn new(
        case: String,
        records: &[KeyRecord],
        charges: &[String],
        rows: &[(String, String)],
    ) -> Report {
        let mut charge_counts: HashMap<&str, usize> = HashMap::new();
        for reference in charges {
            *charge_counts.entry(reference.as_str()).or_default() += 1;
        }
        let rows: HashMap<&str, &str> = rows
            .iter()
            .map(|(t, id)| (t.as_str(), id.as_str()))
            .collect();
        let sent: HashSet<&str> = records.iter().map(|r| r.key.as_str()).collect();
        let mut report = Report {
            case,
            keys: records.len(),
            ..Report::default()
        };
        for record in records {
            let key = record.key.as_str();
            let charged = charge_counts.get(key).copied().unwrap_or(0);
            if charged > 1 {
                report
                    .charged_twice
                    .push((key.to_owned(), charged, record.answers.clone()));
            }
            report
                .unexpected
                .extend(record.unexpected.iter().map(|u| format!("{key}: {u}")));
            if record.ids.is_empty() {
                continue;
            }
            report.accepted += 1;
            if charged == 0 {
                report.uncharged.push(key.to_owned());
            }
            match rows.get(key) {
                None => report.without_row.push(key.to_owned()),
                Some(row) if record.ids.iter().any(|id| id != row) => {
                    report
                        .differing_ids
                        .push(format!("{key}: answers {:?}, row {row}", record.ids));
                }
                Some(_) => {}
            }
        }
        report.stray_charges = charge_counts
            .keys()
            .filter(|reference| !sent.contains(*reference))
            .map(|reference| (*reference).to_owned())
            .collect();
        report
    }

    fn violations(&self) -> usize {
        self.charged_twice.len()
            + self.uncharged.len()
            + self.without_row.len()
            + self.differing_ids.len()
            + self.stray_charges.len()
            + self.unexpected.len()
    }
}

impl fmt::Display for Report {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        let share = |n: usize| 100.0 * n as f64 / self.accepted.max(1) as f64;
        writeln!(
            f,
            "soak {}: {} keys ({} accepted, {} given up), {} requests, {} connections killed",
            self.case,
            self.keys,
            self.accepted,
            self.keys - self.accepted,
            self.requests,
            self.kills
        )?;
        writeln!(f, "  answers: {:?}", self.statuses)?;
        writeln!(
            f,
            "  gateway: {} charge requests answered from their key, {} lookups by key",
            self.gateway_replays, self.gateway_lookups
        )?;
        writeln!(
            f,
            "  keys charged more than once: {} ({:.2}% of accepted; {} of them after a 5xx \
             answer); accepted keys without a charge: {}, without a row: {}, with differing \
             ids: {}; stray charges: {}; unexpected answers: {}",
            self.charged_twice.len(),
            share(self.charged_twice.len()),
            self.charged_twice
                .iter()
                .filter(|(_, _, answers)| answers.iter().any(|a| a.starts_with('5')))
                .count(),
            self.uncharged.len(),
            self.without_row.len(),
            self.differing_ids.len(),
            self.stray_charges.len(),
            self.unexpected.len()
        )?;
        let mut examples = Vec::new();
        examples.extend(
            self.charged_twice
                .iter()
                .map(|(k, n, answers)| format!("{k} charged {n} times, answered {answers:?}")),
        );
        examples.extend(
            self.uncharged
                .iter()
                .map(|k| format!("{k} accepted, not charged")),
        );
        examples.extend(
            self.without_row
                .iter()
                .map(|k| format!("{k} accepted, no row")),
        );
        examples.extend(self.differing_ids.iter().cloned());
        examples.extend(
            self.stray_charges
                .iter()
                .map(|k| format!("stray charge {k}")),
        );
        examples.extend(self.unexpected.iter().cloned());
        for example in examples.iter().take(10) {
            writeln!(f, "    {example}")?;
        }
        Ok(())
    }
}

// ---------------------------------------------------------------- cases

async fn soak(server: Server, http_layer: bool) {
    let case = format!(
        "{} with the HTTP layer {}",
        server.name(),
        if http_layer { "on" } else { "off" }
    );
    let ns = Arc::new(Soaked::new(server).await);
    let app = RunningApp::start(&ns, http_layer).await;

    let traffic = Arc::new(Traffic::default());
    let stop = Instant::now() + soak_duration();
    let give_up = stop + DRAIN;
    // Kills during the load phase only: the drain shows whether every key
    // recovers on a healthy database.
    let killing = tokio::spawn(killer(ns.clone(), stop));
    let clients: Vec<_> = (0..CLIENTS)
        .map(|n| tokio::spawn(client(n, app.url.clone(), stop, give_up, traffic.clone())))
        .collect();
    let mut records = Vec::new();
    for client in clients {
        records.extend(client.await.expect("a client task"));
    }
    let kills = killing.await.expect("the killer task");

    let charges = ns.settled_charges().await;
    let rows = ns.payments().await;
    let gateway = app.gateway.clone();
    app.stop().await;

    let mut report = Report::new(case, &records, &charges, &rows);
    report.kills = kills;
    report.gateway_replays = gateway.replayed();
    report.gateway_lookups = gateway.looked_up();
    report.requests = traffic.requests.load(Ordering::Relaxed);
    report.statuses = std::mem::take(&mut *traffic.statuses.lock().unwrap());
    eprintln!("{report}");
    assert!(report.keys > 0, "no payment was attempted");
    assert!(
        report.kills > 0,
        "no connection was killed: the soak tested nothing"
    );
    assert_eq!(
        report.violations(),
        0,
        "the soak {} broke the contract; the figures are above",
        report.case
    );
}

common::backends!(postgres, mysql => {
    #[tokio::test(flavor = "multi_thread", worker_threads = 4)]
    async fn with_the_http_layer() {
        within_bound(soak(backend::SERVER, true)).await;
    }

    #[tokio::test(flavor = "multi_thread", worker_threads = 4)]
    async fn entity_mode_alone() {
        within_bound(soak(backend::SERVER, false)).await;
    }
});

/// Fails a case that outlasts its load phase and drain by a minute.
async fn within_bound(case: impl std::future::Future<Output = ()>) {
    let bound = soak_duration() + DRAIN + Duration::from_secs(60);
    tokio::time::timeout(bound, case)
        .await
        .expect("the soak case ended within its bound");
}
