//! The payments example app killed (SIGKILL) while the gateway's answer is
//! on its way: the gateway has recorded the charge in its ledger, the
//! service has not heard of it, so neither the `charge` step's journal nor
//! the `payments` table knows. The app is started again on the same
//! database and the client retries with the same key and body until it gets
//! a final answer:
//!
//! - one charge in the ledger, the one made before the kill;
//! - one payment, whose `charge_id` is that charge;
//! - the same answer to every later retry.
//!
//! The charge comes back through the `charge` step and its derived key, by
//! one of two paths, which the figures name (from the new process's
//! counters): the step is found in doubt and the gateway's lookup by key
//! answers the first charge (`idem_steps_in_doubt_total{resolution=
//! "reconciled"}`), or, when the step's journal entry has expired by the
//! time the retry takes over, the step runs again under the same key and
//! the gateway answers it with the first charge. Any other path fails.
//!
//! On PostgreSQL and MariaDB (where the ledger, and the gateway's keys, are
//! a table that outlives the process), with the HTTP idempotency layer on
//! and off (`--no-http-layer`). A third case per backend reuses the key
//! with another amount after the crash, without the layer: the payment row
//! that would refuse it was never written, so the gateway (its lookup, or
//! the charge sent again under the same key) is what refuses it (422), and
//! the right body then gets its payment.
//!
//! The app is this test binary started again as `payments serve` (see
//! `payments_app`), and the client sends real HTTP requests to its port.
//! The gateway takes [`LATENCY_MS`]: the charge is recorded half way, and
//! the test kills the app as soon as the ledger holds it, well before the
//! answer is due.
//!
//! What it costs: until the killed process's claims lapse, a retry is
//! answered 409 (after waiting up to 5 s for the outcome). Entity mode's
//! claim has the default lease of 30 s, which `#[idempotent(..., entity)]`
//! cannot shorten, and the layer's record the same; so each case takes
//! about 30 s. The cases of a backend run at once, and the two backends'
//! tests in parallel. Run with `-- --nocapture` for the figures.

use crate::common;
use crate::payments_app;

use std::time::{Duration, Instant};

use common::namespace::Namespace;
use common::servers::{Db, Server};
use payments_app::{card, spawn_instance, Answer, Api, Process, VISA};
use serde_json::Value;

/// The gateway's latency: the charge is recorded after half of it, the
/// answer comes after the other half.
const LATENCY_MS: u64 = 3000;
const KEY: &str = "order-crash-1";
const AMOUNT: i64 = 4200;
/// The bound on one case, the wait for the lapsed leases included.
const CASE_BOUND: Duration = Duration::from_secs(150);

/// A charge in the ledger, as the test reads it from the table.
#[derive(Debug, PartialEq, sqlx::FromRow)]
struct LedgerRow {
    id: String,
    amount: i64,
    idempotency_key: Option<String>,
}

/// A payment row.
#[derive(Debug, PartialEq, sqlx::FromRow)]
struct PaymentRow {
    id: String,
    amount: i64,
    charge_id: String,
}

/// Rows of the namespace, read on the admin pool (the app's may be dead).
async fn rows<T>(ns: &Namespace, sql: &str) -> Vec<T>
where
    T: Send
        + Unpin
        + for<'r> sqlx::FromRow<'r, sqlx::postgres::PgRow>
        + for<'r> sqlx::FromRow<'r, sqlx::mysql::MySqlRow>,
{
    let rows = match ns.admin() {
        Db::Postgres(pool) => sqlx::query_as(sql).fetch_all(pool).await,
        Db::MySql(pool) => sqlx::query_as(sql).fetch_all(pool).await,
    };
    rows.unwrap_or_else(|err| panic!("{sql}: {err}"))
}

/// The gateway's charges for [`KEY`].
async fn charges(ns: &Namespace) -> Vec<LedgerRow> {
    let table = ns.table("gateway_charges");
    let sql = format!(
        "SELECT id, amount, idempotency_key FROM {table} WHERE reference = '{KEY}' ORDER BY seq"
    );
    rows(ns, &sql).await
}

/// The payments stored under [`KEY`].
async fn payments(ns: &Namespace) -> Vec<PaymentRow> {
    let table = ns.table("payments");
    let sql =
        format!("SELECT id, amount, charge_id FROM {table} WHERE idempotency_token = '{KEY}'");
    rows(ns, &sql).await
}

/// One attempt of the client after the restart.
struct Attempt {
    status: u16,
    /// When it was answered, since the kill.
    at: Duration,
    /// How long its answer took.
    took: Duration,
}

/// What a case saw, printed at its end.
struct Figures {
    case: String,
    /// From the request to the charge in the ledger.
    charged_after: Duration,
    /// From the charge seen in the ledger to the process reaped.
    killed_after: Duration,
    /// From the kill to the new process listening.
    restarted_after: Duration,
    attempts: Vec<Attempt>,
}

impl Figures {
    fn attempt(&mut self, killed: Instant, sent: Instant, answer: &Answer) {
        self.attempts.push(Attempt {
            status: answer.status.as_u16(),
            at: killed.elapsed(),
            took: sent.elapsed(),
        });
    }

    fn print(&self, outcome: &str) {
        let attempts: Vec<String> = self
            .attempts
            .iter()
            .map(|a| {
                format!(
                    "{} at {:.1} s ({:.1} s)",
                    a.status,
                    a.at.as_secs_f64(),
                    a.took.as_secs_f64()
                )
            })
            .collect();
        let recovered = self.attempts.last().map_or(Duration::ZERO, |a| a.at);
        eprintln!(
            "{}:\n  charge recorded {} ms after the request, app killed {} ms later (its \
             answer was due {} ms after the charge)\n  restarted {} ms after the kill; {} \
             attempts: {}\n  final answer {:.1} s after the kill; {outcome}",
            self.case,
            self.charged_after.as_millis(),
            self.killed_after.as_millis(),
            LATENCY_MS / 2,
            self.restarted_after.as_millis(),
            attempts.len(),
            attempts.join(", "),
            recovered.as_secs_f64(),
        );
    }
}

/// The app after the crash: started again on the same database.
struct Crashed {
    ns: Namespace,
    /// The charge made before the kill.
    charge: LedgerRow,
    killed: Instant,
    app: Process,
    api: Api,
    figures: Figures,
}

/// Starts the app, sends the payment, kills the app (SIGKILL) once the
/// gateway's ledger holds the charge and before its answer is due, checks
/// what the crash left, and starts the app again on the same database.
async fn charge_then_kill(server: Server, http_layer: bool, case: &str) -> Crashed {
    let case = format!(
        "{case}, {}, HTTP layer {}",
        server.name(),
        if http_layer { "on" } else { "off" }
    );
    let ns = Namespace::on(server, "crash").await;
    let latency = LATENCY_MS.to_string();
    let mut args = vec!["serve", "--addr", "127.0.0.1:0", "--database-url", ns.url()];
    args.extend(["--gateway-latency-ms", &latency]);
    if !http_layer {
        args.push("--no-http-layer");
    }
    let app = spawn_instance(&args).await;
    let api = Api::new(app.url.clone());

    let sent = Instant::now();
    let request = {
        let api = api.clone();
        tokio::spawn(async move { api.try_pay(KEY, &card(AMOUNT, VISA)).await })
    };
    let charge = tokio::time::timeout(Duration::from_millis(LATENCY_MS * 3), async {
        loop {
            if let Some(charge) = charges(&ns).await.pop() {
                return charge;
            }
            tokio::time::sleep(Duration::from_millis(5)).await;
        }
    })
    .await
    .unwrap_or_else(|_| panic!("{case}: the gateway never charged"));
    let charged_after = sent.elapsed();
    app.kill().await;
    let killed = Instant::now();
    let killed_after = killed - sent - charged_after;

    // The answer could not have come back: the gateway's call began after
    // the request arrived, and takes the whole latency.
    assert!(
        killed - sent < Duration::from_millis(LATENCY_MS),
        "{case}: the kill came {:?} after the request, when the answer may have been sent",
        killed - sent
    );
    match request.await.expect("the request task") {
        Err(_) => {}
        Ok(answer) => panic!(
            "{case}: the request was answered before the kill: {} {}",
            answer.status, answer.body
        ),
    }
    // What the crash left: the charge, under a key derived for the step,
    // and no payment.
    let key = charge.idempotency_key.as_deref().unwrap_or_default();
    assert!(
        key.len() == 64
            && key
                .bytes()
                .all(|b| b.is_ascii_digit() || (b'a'..=b'f').contains(&b)),
        "{case}: the charge's gateway key is not a derived step key: {charge:?}"
    );
    assert_eq!(charge.amount, AMOUNT, "{case}");
    assert!(
        payments(&ns).await.is_empty(),
        "{case}: a payment was stored"
    );

    let app = spawn_instance(&args).await;
    let restarted_after = killed.elapsed();
    let api = Api::new(app.url.clone());
    Crashed {
        ns,
        charge,
        killed,
        app,
        api,
        figures: Figures {
            case,
            charged_after,
            killed_after,
            restarted_after,
            attempts: Vec::new(),
        },
    }
}

impl Crashed {
    /// Sends `body` with the key while the answer is 409 (the killed
    /// process's claim holds until its lease lapses), and returns the first
    /// other answer.
    async fn until_not_in_progress(&mut self, body: &Value) -> Answer {
        loop {
            let sent = Instant::now();
            let answer = self.api.pay(KEY, body).await;
            self.figures.attempt(self.killed, sent, &answer);
            if answer.status != 409 {
                return answer;
            }
            assert_eq!(
                answer.body["status"], 409,
                "{}: a 409 that is not a problem: {}",
                self.figures.case, answer.body
            );
            tokio::time::sleep(Duration::from_millis(100)).await;
        }
    }

    /// The payment answered `answer` is the one payment, made with the
    /// charge from before the kill; every later retry answers it again.
    /// Answers how the step was settled.
    async fn assert_one_charge_one_payment(
        &self,
        answer: &Answer,
        http_layer: bool,
    ) -> &'static str {
        let case = &self.figures.case;
        assert_eq!(answer.status, 201, "{case}: {}", answer.body);
        assert_eq!(answer.body["amount"], AMOUNT, "{case}: {}", answer.body);
        assert_eq!(
            answer.body["status"], "succeeded",
            "{case}: {}",
            answer.body
        );
        let id = answer.body["id"].as_str().expect("a payment id");

        let charges = charges(&self.ns).await;
        assert_eq!(
            charges,
            [self.charge_again()],
            "{case}: one charge, the first"
        );
        let payments = payments(&self.ns).await;
        assert_eq!(
            payments,
            [PaymentRow {
                id: id.to_owned(),
                amount: AMOUNT,
                charge_id: self.charge.id.clone(),
            }],
            "{case}: one payment, on the first charge"
        );

        for _ in 0..3 {
            let again = self.api.pay(KEY, &card(AMOUNT, VISA)).await;
            assert_eq!(again.status, 201, "{case}: {}", again.body);
            assert_eq!(again.body, answer.body, "{case}: a later retry");
            if http_layer {
                assert!(again.replayed(), "{case}: a later retry is a replay");
            }
        }

        // How the step was settled, from the new process's counters.
        let metrics = self.api.http.get(format!("{}/metrics", self.api.url));
        let text = metrics.send().await.unwrap().text().await.unwrap();
        let counter = |name: &str, label: &str| {
            text.lines()
                .filter(|line| line.starts_with(&format!("{name}{{")))
                .filter(|line| line.contains("step=\"charge\"") && line.contains(label))
                .filter_map(|line| line.rsplit(' ').next()?.parse::<u64>().ok())
                .sum::<u64>()
        };
        let reconciled = counter("idem_steps_in_doubt_total", "resolution=\"reconciled\"");
        let in_doubt = counter("idem_steps_in_doubt_total", "resolution=");
        let ran = counter("idem_steps_total", "decision=\"ran\"");
        match (reconciled, in_doubt, ran) {
            (1, 1, 0) => "in doubt; the gateway's lookup found the charge",
            // Either way the payment holds the first charge (checked
            // above): the gateway answered the step's key with it.
            (0, 0, 1) => {
                "not in doubt: its journal entry had expired, so it ran again under its key, \
                 and the gateway answered with the first charge"
            }
            _ => panic!(
                "{case}: the step was settled otherwise (reconciled {reconciled}, in doubt \
                 {in_doubt}, ran {ran}):\n{text}"
            ),
        }
    }

    /// The charge made before the kill, as the ledger holds it.
    fn charge_again(&self) -> LedgerRow {
        LedgerRow {
            id: self.charge.id.clone(),
            amount: self.charge.amount,
            idempotency_key: self.charge.idempotency_key.clone(),
        }
    }
}

/// The crash, then the client's retries with the same key and body.
async fn retried_after_the_crash(server: Server, http_layer: bool) {
    let mut crashed = charge_then_kill(server, http_layer, "retried after the crash").await;
    let answer = crashed.until_not_in_progress(&card(AMOUNT, VISA)).await;
    let step = crashed
        .assert_one_charge_one_payment(&answer, http_layer)
        .await;
    crashed.figures.print(&format!(
        "{} {}; 1 charge ({}), 1 payment; 3 later retries answered the same\n  the \
         charge step: {step}",
        answer.status, answer.body["id"], crashed.charge.id
    ));
    crashed.app.kill().await;
}

/// The crash, then the key reused with another amount (no layer): refused,
/// nothing charged; then the first body gets its payment.
async fn key_reused_after_the_crash(server: Server) {
    let mut crashed = charge_then_kill(server, false, "key reused after the crash").await;
    let reused = crashed.until_not_in_progress(&card(AMOUNT + 1, VISA)).await;
    let case = crashed.figures.case.clone();
    reused.assert_problem(422);
    assert_eq!(
        charges(&crashed.ns).await,
        [crashed.charge_again()],
        "{case}: the reused key charged"
    );
    assert!(
        payments(&crashed.ns).await.is_empty(),
        "{case}: the reused key stored a payment"
    );
    let answer = crashed.until_not_in_progress(&card(AMOUNT, VISA)).await;
    let step = crashed.assert_one_charge_one_payment(&answer, false).await;
    crashed.figures.print(&format!(
        "another amount: 422; then {} {} on the first charge ({})\n  the charge step: {step}",
        answer.status, answer.body["id"], crashed.charge.id
    ));
    crashed.app.kill().await;
}

async fn bounded(case: impl std::future::Future<Output = ()>) {
    tokio::time::timeout(CASE_BOUND, case)
        .await
        .expect("the case ended within its bound");
}

common::backends!(postgres, mysql => {
    /// The cases of this backend, at once: each spends its time waiting
    /// for the killed process's leases.
    #[tokio::test(flavor = "multi_thread", worker_threads = 2)]
    async fn sigkill_between_the_charge_and_its_answer() {
        tokio::join!(
            bounded(retried_after_the_crash(backend::SERVER, true)),
            bounded(retried_after_the_crash(backend::SERVER, false)),
            bounded(key_reused_after_the_crash(backend::SERVER)),
        );
    }
});
