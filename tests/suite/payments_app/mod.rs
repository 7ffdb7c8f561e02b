//! What the tests of the payments example app share: the app in a process
//! of its own, a client of its API, and the ledger's first check.
//!
//! A test binary compiles the app's modules in and this module beside
//! them:
//!
//! ```ignore
//! #[path = "../examples/payments/main.rs"]
//! #[allow(dead_code)]
//! mod payments;
//! mod payments_app;
//! ```
//!
//! The app's process is that test binary, started again as the app (see
//! [`app_process`]): it runs the same code as `cargo run --example
//! payments`.
#![allow(dead_code)]

use std::collections::HashSet;
use std::process::Stdio;
use std::time::Duration;

use reqwest::header::{HeaderMap, CONTENT_TYPE};
use reqwest::StatusCode;
use serde_json::{json, Value};
use tokio::io::{AsyncBufReadExt, BufReader};

/// The test that is the app's entry point, as `--exact` names it.
const APP_PROCESS: &str = "payments_app::app_process";

/// Not a test: the entry point of the app's processes that the tests
/// start. Run as a test, without `PAYMENTS_APP_ARGS`, it returns at once.
#[test]
fn app_process() {
    let Ok(args) = std::env::var("PAYMENTS_APP_ARGS") else {
        return;
    };
    let args: Vec<String> = serde_json::from_str(&args).expect("a JSON list of arguments");
    std::process::exit(crate::payments::cli::main(args).into());
}

/// This test binary, started as the app with `args`.
pub fn app_command(args: &[&str]) -> tokio::process::Command {
    let mut command = tokio::process::Command::new(std::env::current_exe().unwrap());
    command
        .args([APP_PROCESS, "--exact", "--nocapture", "--test-threads=1"])
        .env("PAYMENTS_APP_ARGS", serde_json::to_string(args).unwrap())
        .env_remove("DATABASE_URL")
        .env_remove("KAFKA_BROKERS")
        .stdin(Stdio::null())
        .stdout(Stdio::piped())
        .stderr(Stdio::inherit())
        .kill_on_drop(true);
    command
}

/// An instance of the app in a process of its own, killed when dropped.
pub struct Process {
    /// `http://127.0.0.1:port`, from its banner.
    pub url: String,
    child: tokio::process::Child,
    /// Kept open: the app prints to it.
    _stdout: tokio::io::Lines<BufReader<tokio::process::ChildStdout>>,
}

/// Starts `payments serve` with `args` and waits (30 s at most) for its
/// banner's URL.
pub async fn spawn_instance(args: &[&str]) -> Process {
    start(app_command(args))
        .await
        .unwrap_or_else(|err| panic!("{err}"))
}

/// Starts the app with `command` (an [`app_command`]) and waits (30 s at
/// most) for its banner's URL; answers why not when it exited first (it
/// could not open its database, say) or did not listen in time.
pub async fn start(mut command: tokio::process::Command) -> Result<Process, String> {
    let mut child = command.spawn().expect("start the app process");
    let mut stdout = BufReader::new(child.stdout.take().unwrap()).lines();
    let listening = tokio::time::timeout(Duration::from_secs(30), async {
        while let Ok(Some(line)) = stdout.next_line().await {
            // The test harness may print its own words first on the line.
            if let Some((_, rest)) = line.split_once("payments: listening on ") {
                return Some(rest.split_whitespace().next().unwrap().to_owned());
            }
        }
        None
    })
    .await;
    match listening {
        Ok(Some(url)) => Ok(Process {
            url,
            child,
            _stdout: stdout,
        }),
        Ok(None) => {
            let status = child.wait().await.expect("reap the app process");
            Err(format!(
                "the app process exited before listening ({status})"
            ))
        }
        Err(_) => Err("the app process did not listen within 30 s".to_owned()),
    }
}

impl Process {
    /// Kills the process with SIGKILL, as a crash or the OOM killer
    /// would: nothing of it runs again (no drop, no release, no flush).
    /// Returns once it is reaped.
    pub async fn kill(mut self) {
        self.child.start_kill().expect("kill the app process");
        let status = self.child.wait().await.expect("reap the app process");
        use std::os::unix::process::ExitStatusExt;
        assert_eq!(status.signal(), Some(9), "the app died of SIGKILL");
    }
}

/// An answer: status, headers, JSON body (`Null` if none).
pub struct Answer {
    pub status: StatusCode,
    pub headers: HeaderMap,
    pub body: Value,
}

impl Answer {
    pub fn replayed(&self) -> bool {
        self.headers
            .get("idempotent-replayed")
            .is_some_and(|v| v == "true")
    }

    pub fn content_type(&self) -> &str {
        self.headers
            .get(CONTENT_TYPE)
            .and_then(|v| v.to_str().ok())
            .unwrap_or_default()
    }

    #[track_caller]
    pub fn assert_problem(&self, status: u16) {
        assert_eq!(self.status.as_u16(), status, "{}", self.body);
        assert_eq!(self.content_type(), "application/problem+json");
        assert_eq!(self.body["status"], status, "{}", self.body);
        assert!(self.body["type"].is_string(), "{}", self.body);
        assert!(self.body["title"].is_string(), "{}", self.body);
        assert!(self.body["detail"].is_string(), "{}", self.body);
    }
}

/// A client of one instance.
#[derive(Clone)]
pub struct Api {
    pub http: reqwest::Client,
    pub url: String,
}

impl Api {
    pub fn new(url: String) -> Api {
        Api {
            http: reqwest::Client::new(),
            url,
        }
    }

    pub async fn answer(request: reqwest::RequestBuilder) -> Answer {
        Self::try_answer(request).await.expect("an answer")
    }

    /// The answer, or why there was none (the connection broke, the
    /// process died).
    pub async fn try_answer(request: reqwest::RequestBuilder) -> Result<Answer, reqwest::Error> {
        let response = request.send().await?;
        let status = response.status();
        let headers = response.headers().clone();
        let bytes = response.bytes().await?;
        let body = serde_json::from_slice(&bytes).unwrap_or(Value::Null);
        Ok(Answer {
            status,
            headers,
            body,
        })
    }

    /// `POST /payments` with a raw body.
    pub async fn pay_raw(&self, key: Option<&str>, body: &str) -> Answer {
        Self::answer(self.payment(key, body)).await
    }

    /// `POST /payments` with `content_type` (none: no `Content-Type`).
    pub async fn pay_as(&self, key: &str, content_type: Option<&str>, body: &Value) -> Answer {
        let mut request = self
            .http
            .post(format!("{}/payments", self.url))
            .header("Idempotency-Key", key)
            .body(body.to_string());
        if let Some(content_type) = content_type {
            request = request.header(CONTENT_TYPE, content_type);
        }
        Self::answer(request).await
    }

    /// `POST /payments`, whose answer may not come.
    pub async fn try_pay(&self, key: &str, body: &Value) -> Result<Answer, reqwest::Error> {
        Self::try_answer(self.payment(Some(key), &body.to_string())).await
    }

    fn payment(&self, key: Option<&str>, body: &str) -> reqwest::RequestBuilder {
        let mut request = self
            .http
            .post(format!("{}/payments", self.url))
            .header(CONTENT_TYPE, "application/json")
            .body(body.to_owned());
        if let Some(key) = key {
            request = request.header("Idempotency-Key", key);
        }
        request
    }

    pub async fn pay(&self, key: &str, body: &Value) -> Answer {
        self.pay_raw(Some(key), &body.to_string()).await
    }

    pub async fn get(&self, path: &str) -> Answer {
        Self::answer(self.http.get(format!("{}{path}", self.url))).await
    }

    pub async fn put(&self, path: &str, body: &str) -> Answer {
        Self::answer(
            self.http
                .put(format!("{}{path}", self.url))
                .header(CONTENT_TYPE, "application/json")
                .body(body.to_owned()),
        )
        .await
    }

    /// `POST /v1/payment_intents`, form-encoded.
    pub async fn intent(&self, api_key: Option<&str>, key: Option<&str>, form: &str) -> Answer {
        let mut request = self
            .http
            .post(format!("{}/v1/payment_intents", self.url))
            .header(CONTENT_TYPE, "application/x-www-form-urlencoded")
            .body(form.to_owned());
        if let Some(api_key) = api_key {
            request = request.bearer_auth(api_key);
        }
        if let Some(key) = key {
            request = request.header("Idempotency-Key", key);
        }
        Self::answer(request).await
    }

    pub async fn intent_by_id(&self, api_key: &str, id: &str) -> Answer {
        Self::answer(
            self.http
                .get(format!("{}/v1/payment_intents/{id}", self.url))
                .bearer_auth(api_key),
        )
        .await
    }

    /// The gateway's ledger.
    pub async fn charges(&self) -> Vec<Value> {
        let answer = self.get("/gateway/charges").await;
        assert_eq!(answer.status, StatusCode::OK);
        let charges = answer.body["charges"].as_array().unwrap().clone();
        assert_eq!(answer.body["count"], charges.len());
        charges
    }

    pub async fn payment_count(&self) -> u64 {
        let answer = self.get("/payments").await;
        assert_eq!(answer.status, StatusCode::OK);
        answer.body["count"].as_u64().unwrap()
    }

    /// Sends until a final answer (201 or 402), retrying lost answers, 409
    /// and 503 with the same key, at most 100 times.
    pub async fn pay_until_final(&self, key: &str, body: &Value) -> Answer {
        for _ in 0..100 {
            let answer = self.pay(key, body).await;
            if matches!(answer.status.as_u16(), 201 | 402) {
                return answer;
            }
            assert!(
                matches!(answer.status.as_u16(), 409 | 503),
                "{key}: {} {}",
                answer.status,
                answer.body
            );
            tokio::time::sleep(Duration::from_millis(20)).await;
        }
        panic!("{key}: no final answer after 100 attempts");
    }
}

pub fn card(amount: i64, card: &str) -> Value {
    json!({ "amount": amount, "currency": "EUR", "card": card, "description": "test" })
}

pub const VISA: &str = "4242424242424242";
pub const DECLINED: &str = "4000000000000002";

/// Each charge's reference appears once: one charge per key.
#[track_caller]
pub fn assert_one_charge_per_key(charges: &[Value], keys: usize) {
    let references: HashSet<&str> = charges
        .iter()
        .map(|c| c["reference"].as_str().unwrap())
        .collect();
    assert_eq!(charges.len(), keys, "{charges:#?}");
    assert_eq!(
        references.len(),
        keys,
        "a key was charged twice: {charges:#?}"
    );
}
