//! The `idem` binary against every store, as an operator runs it: records
//! are seeded by the library itself (a run in record mode, a response
//! stored by the HTTP layer, a step left in doubt, on SQL an entity-mode
//! claim held by a call in progress), then read, settled, forgotten,
//! purged and counted through the built binary, its JSON and its exit
//! codes checked.
//!
//! Servers: PostgreSQL (`IDEM_POSTGRES_URL`), MariaDB/MySQL
//! (`IDEM_MYSQL_URL`), Redis (`IDEM_REDIS_URL`) and a Redis Cluster
//! (`IDEM_REDIS_CLUSTER_URL`, one of its nodes; by default the local one
//! of `.ci/redis-cluster`, started when it is down), as the library's
//! tests use them.

use std::io::Write;
use std::process::{Command, Output, Stdio};
use std::sync::atomic::{AtomicU32, Ordering};
use std::time::Duration;

use bytes::Bytes;
use http_body_util::Full;
use idem::entity::EntityDatabase;
use idem::outbox::{Message, Outbox};
use idem::steps::Step;
use idem::{run, Call, Error, Policy, Store};
use serde_json::Value;
use sqlx::FromRow;
use tokio::sync::Notify;
use tower::{service_fn, Layer, ServiceExt as _};

/// Runs the built `idem` with `args`, `stdin` on its standard input.
fn idem(args: &[&str], stdin: &str) -> Output {
    let mut child = Command::new(env!("CARGO_BIN_EXE_idem"))
        .args(args)
        .env_remove("IDEM_URL")
        .stdin(Stdio::piped())
        .stdout(Stdio::piped())
        .stderr(Stdio::piped())
        .spawn()
        .expect("the idem binary runs");
    child
        .stdin
        .take()
        .unwrap()
        .write_all(stdin.as_bytes())
        .unwrap();
    child.wait_with_output().unwrap()
}

struct Ran {
    code: i32,
    stdout: String,
    stderr: String,
}

/// `idem <store args> <args>` on a blocking thread (the runtime keeps
/// serving the library's calls meanwhile).
async fn cli(store: &[String], args: &[&str], stdin: &str) -> Ran {
    let mut all: Vec<String> = store.to_vec();
    all.extend(args.iter().map(|a| a.to_string()));
    let stdin = stdin.to_owned();
    let out = tokio::task::spawn_blocking(move || {
        let args: Vec<&str> = all.iter().map(String::as_str).collect();
        idem(&args, &stdin)
    })
    .await
    .unwrap();
    Ran {
        code: out.status.code().unwrap_or(-1),
        stdout: String::from_utf8_lossy(&out.stdout).into_owned(),
        stderr: String::from_utf8_lossy(&out.stderr).into_owned(),
    }
}

/// Runs and expects exit code `code`; the output.
async fn expect(store: &[String], args: &[&str], stdin: &str, code: i32) -> Ran {
    let ran = cli(store, args, stdin).await;
    assert_eq!(
        ran.code, code,
        "idem {args:?}: exit {} (expected {code})\nstdout:\n{}\nstderr:\n{}",
        ran.code, ran.stdout, ran.stderr
    );
    ran
}

async fn json(store: &[String], args: &[&str]) -> Value {
    let mut args = args.to_vec();
    args.push("--json");
    let ran = expect(store, &args, "", 0).await;
    serde_json::from_str(&ran.stdout).unwrap_or_else(|e| panic!("{e}: {}", ran.stdout))
}

/// A key no other run uses.
fn fresh(tag: &str) -> String {
    static N: AtomicU32 = AtomicU32::new(0);
    let nanos = std::time::SystemTime::now()
        .duration_since(std::time::UNIX_EPOCH)
        .unwrap()
        .as_nanos();
    format!(
        "{tag}-{}-{nanos}-{}",
        std::process::id(),
        N.fetch_add(1, Ordering::Relaxed)
    )
}

fn env_url(var: &str, default: &str) -> String {
    std::env::var(var).unwrap_or_else(|_| default.to_owned())
}

/// One payment attempt whose one step refuses when in doubt; `fail`
/// makes its gateway call fail after it started (an effect that may have
/// happened: the step is then in doubt).
async fn pay<S: Store>(
    store: &S,
    key: &str,
    charges: &AtomicU32,
    fail: bool,
) -> Result<String, Error> {
    let call = Call::new("cli::pay", key, &700u32).with_policy(Policy::new());
    run(store, call, async {
        Step::new("charge")
            .refuse()
            .run(|_key| async {
                let n = charges.fetch_add(1, Ordering::SeqCst) + 1;
                if fail {
                    return Err(Error::store("the gateway's answer was lost"));
                }
                Ok::<_, Error>(format!("ch_{n}"))
            })
            .await
    })
    .await
}

/// A response stored by the HTTP layer under `POST /charges`.
async fn through_layer<S: Store + Clone + 'static>(store: &S, key: &str) {
    let service = idem::http::IdempotencyLayer::new(store.clone()).layer(service_fn(
        |_request: http::Request<Full<Bytes>>| async {
            let response = http::Response::builder()
                .status(201)
                .header("content-type", "application/json")
                .header("location", "/charges/ch_9")
                .body(Full::new(Bytes::from_static(
                    br#"{"id":"ch_9","amount":900}"#,
                )))
                .unwrap();
            Ok::<_, std::convert::Infallible>(response)
        },
    ));
    let request = http::Request::post("/charges")
        .header("idempotency-key", key)
        .header("content-type", "application/json")
        .body(Full::new(Bytes::from_static(br#"{"amount":900}"#)))
        .unwrap();
    let response = service.oneshot(request).await.unwrap();
    assert_eq!(response.status(), 201);
}

/// What every store goes through. `store` is the records store, `args`
/// the binary's `--url` (and `--table` or `--prefix`) for it.
async fn walkthrough<S: Store + Clone + 'static>(store: S, args: &[String], sql: bool) {
    // Record mode: a completed record with a JSON outcome.
    let key = fresh("order");
    let receipt: serde_json::Value = run(&store, Call::new("cli::charge", &key, &500u32), async {
        Ok::<_, Error>(serde_json::json!({"receipt": "r-1", "amount": 500}))
    })
    .await
    .unwrap();
    assert_eq!(receipt["amount"], 500);

    let inspect = expect(args, &["inspect", "cli::charge", &key], "", 0).await;
    let out = &inspect.stdout;
    assert!(out.contains("state        completed"), "{out}");
    assert!(
        out.contains("\"receipt\": \"r-1\""),
        "the outcome decoded as JSON: {out}"
    );
    assert!(out.contains("ok, 30 bytes, JSON"), "{out}");
    assert!(
        out.contains("(expires in 1 d)") || out.contains("(expires in 24 h)"),
        "{out}"
    );
    assert!(out.contains("ago)"), "a relative creation time: {out}");
    // RFC 3339 in UTC, to the millisecond.
    let created = out.lines().find(|l| l.contains("created")).unwrap();
    let stamp = created.split_whitespace().nth(1).unwrap();
    assert_eq!(stamp.len(), 24, "{stamp}");
    assert!(stamp.ends_with('Z') && &stamp[10..11] == "T", "{stamp}");

    let record = &json(args, &["inspect", "cli::charge", &key]).await["record"];
    assert_eq!(record["state"], "completed");
    assert_eq!(record["fence"], 1);
    assert_eq!(record["outcome"]["decoded"]["json"]["receipt"], "r-1");
    assert_eq!(record["fingerprint"].as_str().unwrap().len(), 64);
    assert_eq!(record["claim_token"].as_str().unwrap().len(), 32);
    assert!(record["expires_at"]["rfc3339"]
        .as_str()
        .unwrap()
        .ends_with('Z'));

    // The HTTP layer's stored response: status, headers, body.
    let http_key = fresh("http");
    through_layer(&store, &http_key).await;
    let out = expect(args, &["inspect", "POST /charges", &http_key], "", 0)
        .await
        .stdout;
    assert!(out.contains("an HTTP response"), "{out}");
    assert!(out.contains("status   201"), "{out}");
    assert!(out.contains("header   location: /charges/ch_9"), "{out}");
    assert!(
        out.contains(r#"body     26 bytes: {"id":"ch_9","amount":900}"#),
        "{out}"
    );
    let response = &json(args, &["inspect", "POST /charges", &http_key]).await["record"]["outcome"]
        ["decoded"]["http_response"];
    assert_eq!(response["status"], 201);
    assert_eq!(response["body_json"]["id"], "ch_9");

    // A step in doubt: the first attempt's call failed after it started.
    let pay_key = fresh("pay");
    let charges = AtomicU32::new(0);
    assert!(pay(&store, &pay_key, &charges, true).await.is_err());
    let refused = pay(&store, &pay_key, &charges, false).await;
    assert!(
        matches!(refused, Err(Error::OutcomeUnknown { .. })),
        "{refused:?}"
    );
    assert_eq!(charges.load(Ordering::SeqCst), 1, "refused, not run again");
    let out = expect(args, &["steps", "cli::pay", &pay_key], "", 0)
        .await
        .stdout;
    assert!(out.contains("#0   charge"), "{out}");
    assert!(out.contains("IN DOUBT"), "{out}");
    let steps = json(args, &["steps", "cli::pay", &pay_key]).await;
    assert_eq!(steps["steps"][0]["in_doubt"], true);
    assert_eq!(steps["steps"][0]["state"], "started");
    // `inspect` shows the journal even though the released claim left no
    // record.
    let out = expect(args, &["inspect", "cli::pay", &pay_key], "", 0)
        .await
        .stdout;
    assert!(
        out.contains("no record for") && out.contains("IN DOUBT"),
        "{out}"
    );

    // Resolving asks first; "n", or no answer, changes nothing.
    let resolve = [
        "resolve",
        "cli::pay",
        &pay_key,
        "0",
        "--output",
        "\"ch_77\"",
    ];
    let no = expect(args, &resolve, "n\n", 7).await;
    assert!(no.stderr.contains("Settle step #0"), "{}", no.stderr);
    let silent = expect(args, &resolve, "", 7).await;
    assert!(silent.stderr.contains("--yes"), "{}", silent.stderr);
    assert!(matches!(
        pay(&store, &pay_key, &charges, false).await,
        Err(Error::OutcomeUnknown { .. })
    ));
    let bad_json = expect(
        args,
        &["resolve", "cli::pay", &pay_key, "0", "--output", "ch_77"],
        "",
        2,
    )
    .await;
    assert!(bad_json.stderr.contains("as JSON"), "{}", bad_json.stderr);
    let missing = expect(
        args,
        &["resolve", "cli::pay", &pay_key, "5", "--rerun", "--yes"],
        "",
        6,
    )
    .await;
    assert!(missing.stderr.contains("no step #5"), "{}", missing.stderr);
    let yes = expect(args, &resolve, "y\n", 0).await;
    assert!(yes.stdout.contains("is now completed"), "{}", yes.stdout);
    // The next attempt replays the operator's output without a charge.
    assert_eq!(
        pay(&store, &pay_key, &charges, false).await.unwrap(),
        "ch_77"
    );
    assert_eq!(charges.load(Ordering::SeqCst), 1);
    let again = expect(
        args,
        &["resolve", "cli::pay", &pay_key, "0", "--rerun", "--yes"],
        "",
        8,
    )
    .await;
    assert!(again.stderr.contains("is not in doubt"), "{}", again.stderr);

    // Everything behind the HTTP key, and a key in two scopes.
    run(&store, Call::new("cli::refund", &key, &1u8), async {
        Ok::<_, Error>(1u8)
    })
    .await
    .unwrap();
    let found = json(args, &["find", &key]).await;
    let scopes: Vec<&str> = found["records"]
        .as_array()
        .unwrap()
        .iter()
        .map(|r| r["scope"].as_str().unwrap())
        .collect();
    assert_eq!(scopes, ["cli::charge", "cli::refund"]);
    let out = expect(args, &["inspect", "cli::charge", &key], "", 0)
        .await
        .stdout;
    assert!(out.contains(&format!("also under key {key}")), "{out}");
    let found = json(args, &["find", &pay_key]).await;
    assert_eq!(found["steps"][0]["output"]["decoded"]["json"], "ch_77");

    // Stats: counts by scope and state.
    let stats = json(args, &["stats"]).await;
    let records = &stats["stores"][0];
    assert_eq!(records["store"], "records");
    let charge = records["scopes"]
        .as_array()
        .unwrap()
        .iter()
        .find(|s| s["scope"] == "cli::charge")
        .expect("cli::charge is counted");
    assert!(charge["completed"].as_u64().unwrap() >= 1);
    assert!(stats["stores"][0]["steps"]["completed"].as_u64().unwrap() >= 1);
    let out = expect(args, &["stats"], "", 0).await.stdout;
    assert!(out.contains("cli::charge"), "{out}");

    // Forget asks too; then the key runs again.
    expect(args, &["forget", "cli::charge", &key], "no\n", 7).await;
    assert!(store
        .get(
            &idem::Scope::new("cli::charge"),
            &idem::Key::new(&*key).unwrap()
        )
        .await
        .unwrap()
        .is_some());
    let forgot = expect(args, &["forget", "cli::charge", &key, "--yes"], "", 0).await;
    assert!(forgot.stdout.starts_with("forgot key"), "{}", forgot.stdout);
    let gone = expect(args, &["inspect", "cli::charge", &key], "", 6).await;
    assert!(
        gone.stderr.contains("in other scopes") && gone.stderr.contains("cli::refund"),
        "{}",
        gone.stderr
    );
    expect(args, &["forget", "cli::charge", &key, "--yes"], "", 6).await;
    let ran_again: u8 = run(&store, Call::new("cli::charge", &key, &500u32), async {
        Ok::<_, Error>(2u8)
    })
    .await
    .unwrap();
    assert_eq!(ran_again, 2, "a forgotten key runs again");

    // Purge: records that expired are deleted (Redis deletes them itself).
    for _ in 0..3 {
        let short = Call::new("cli::short", &fresh("short"), &1u8)
            .with_policy(Policy::new().ttl(Duration::from_millis(1)));
        run(&store, short, async { Ok::<_, Error>(1u8) })
            .await
            .unwrap();
    }
    tokio::time::sleep(Duration::from_millis(50)).await;
    let purged = json(args, &["purge", "--batch", "2"]).await;
    let records = &purged["purged"][0];
    if sql {
        assert!(records["deleted"].as_u64().unwrap() >= 3, "{purged}");
    } else {
        assert_eq!(records["deletes_expired_itself"], true);
    }

    // Mistakes an operator makes get their own exit codes.
    let unknown = expect(args, &["inspect", "cli::charge", &fresh("never")], "", 6).await;
    assert!(
        unknown.stderr.contains("nothing is stored under this key"),
        "{}",
        unknown.stderr
    );
    let bad_key = expect(args, &["inspect", "cli::charge", "bad key"], "", 2).await;
    assert!(bad_key.stderr.contains("invalid key"), "{}", bad_key.stderr);
    expect(args, &["find", &fresh("never")], "", 6).await;
    expect(args, &["steps", "cli::pay", &fresh("never")], "", 6).await;
}

/// The row entity mode keeps, with its token.
#[derive(Debug, Clone, PartialEq, FromRow, idem::Entity)]
#[idem(table = "idem_cli_orders")]
struct Order {
    #[idem(generated)]
    id: i64,
    #[idem(token)]
    token: String,
    amount: i64,
}

/// An entity-mode call held in progress: its claim shows under
/// `idem.entity.idem_cli_orders` (in `idem_entity_claims`) with its
/// lease, beside the layer's record under the same key; once it is let go,
/// the claim is completed.
async fn entity_claims<DB>(pool: sqlx::Pool<DB>, args: &[String], create: &str)
where
    DB: EntityDatabase,
    Order: idem::entity::EntityBind<DB> + for<'r> FromRow<'r, DB::Row>,
    for<'c> &'c mut DB::Connection: sqlx::Executor<'c, Database = DB>,
{
    sqlx::raw_sql(create).execute(&pool).await.unwrap();
    let token = fresh("tok");
    let entered = Notify::new();
    let release = Notify::new();
    // The call runs beside the checks, in this task: its claim is held
    // until they are done.
    let call = idem::entity::run(&pool, Call::new("cli::order", &token, &3u8), async {
        entered.notify_one();
        release.notified().await;
        Ok::<_, Error>(Order {
            id: 0,
            token: token.clone(),
            amount: 3,
        })
    });
    let checks = async {
        entered.notified().await;
        let found = json(args, &["find", &token]).await;
        let claim = found["records"]
            .as_array()
            .unwrap()
            .iter()
            .find(|r| r["store"] == "entity_claims")
            .unwrap_or_else(|| panic!("the entity claim is found: {found}"))
            .clone();
        assert_eq!(claim["scope"], "idem.entity.idem_cli_orders");
        assert_eq!(claim["state"], "in_progress");
        assert_eq!(claim["lease_held"], true);
        let out = expect(
            args,
            &["inspect", "idem.entity.idem_cli_orders", &token],
            "",
            0,
        )
        .await
        .stdout;
        assert!(
            out.contains("(entity_claims)") && out.contains("held: its owner's lease runs in"),
            "{out}"
        );
        let stats = json(args, &["stats"]).await;
        let entity = stats["stores"]
            .as_array()
            .unwrap()
            .iter()
            .find(|s| s["store"] == "entity_claims")
            .expect("entity claims are counted")
            .clone();
        assert!(entity["oldest_in_progress"].is_object(), "{entity}");
        release.notify_one();
    };
    let (order, ()) = tokio::join!(call, checks);
    assert_eq!(order.unwrap().amount, 3);
    let claim = &json(args, &["inspect", "idem.entity.idem_cli_orders", &token]).await["record"];
    assert_eq!(claim["state"], "completed");
    assert_eq!(claim["outcome"]["decoded"]["empty"], true);
}

/// The value of the text line that starts with `label` (`  waiting  3  ...`).
fn counted(out: &str, label: &str) -> u64 {
    out.lines()
        .find_map(|line| line.trim_start().strip_prefix(label))
        .and_then(|rest| rest.split_whitespace().next())
        .and_then(|n| n.parse().ok())
        .unwrap_or_else(|| panic!("no {label:?} count in:\n{out}"))
}

/// The outbox of a SQL store: three messages published by one operation,
/// leased by a relay of the test's own, two of them parked as a broker
/// refusing them for good would have them; then counted, listed and
/// unparked through the binary, the outbox read back by the library.
async fn outbox_walkthrough<DB>(store: idem::store::SqlStore<DB>, args: &[String])
where
    DB: idem::store::Backend,
    idem::store::SqlStore<DB>: Store,
{
    let outbox = Outbox::new(&store);
    let key = fresh("ship");
    let binary: Vec<u8> = (0..300u32).map(|i| (i % 256) as u8).rev().collect();
    let messages = [
        Message::new("payment.created", r#"{"id":"pay-1","amount":500}"#)
            .unwrap()
            .with_key("pay-1")
            .unwrap()
            .with_header("content-type", "application/json")
            .unwrap(),
        Message::new("payment.audit", binary).unwrap(),
        Message::new("payment.created", r#"{"id":"pay-2"}"#)
            .unwrap()
            .with_key("pay-2")
            .unwrap(),
    ];
    let ids: Vec<String> = run(&store, Call::new("cli::ship", &key, &1u8), async {
        let mut tx = store.pool().begin().await.map_err(Error::store)?;
        let mut ids = Vec::new();
        for message in &messages {
            ids.push(outbox.publish(&mut *tx, message).await?.to_string());
        }
        tx.commit().await.map_err(Error::store)?;
        Ok::<_, Error>(ids)
    })
    .await
    .unwrap();
    assert_eq!(outbox.waiting().await.unwrap(), 3);

    // A relay of the test's own: the broker refuses the first two for
    // good, the third is given back (it failed for a while).
    let lease = outbox.lease(10, Duration::from_secs(30)).await.unwrap();
    let seqs: Vec<i64> = lease.messages().iter().map(|m| m.seq()).collect();
    assert_eq!(seqs.len(), 3, "{lease:?}");
    let (too_large, denied, later) = (seqs[0], seqs[1], seqs[2]);
    assert!(outbox
        .park(&lease, too_large, "Broker: Message size too large")
        .await
        .unwrap());
    assert!(outbox
        .park(&lease, denied, "Broker: Topic authorization failed")
        .await
        .unwrap());
    assert_eq!(outbox.release(&lease, &[later]).await.unwrap(), 1);

    // Status: the bare command and `status`, text and JSON.
    let out = expect(args, &["outbox"], "", 0).await.stdout;
    assert_eq!(counted(&out, "waiting"), 1, "{out}");
    assert_eq!(counted(&out, "parked"), 2, "{out}");
    assert!(out.contains("_outbox"), "the table is named: {out}");
    assert!(out.contains("idem outbox parked"), "a hint: {out}");
    let status = json(args, &["outbox", "status"]).await;
    assert_eq!(status["waiting"], 1, "{status}");
    assert_eq!(status["parked"], 2, "{status}");

    // The parked ones, the oldest first, with the broker's reasons.
    let out = expect(args, &["outbox", "parked"], "", 0).await.stdout;
    assert!(out.contains("2 parked message(s)"), "{out}");
    assert!(
        out.contains(&format!(
            "#{too_large:<6} topic payment.created  key pay-1  attempts 1"
        )),
        "{out}"
    );
    assert!(
        out.contains(r#"payload  27 bytes: {"id":"pay-1","amount":500}"#),
        "{out}"
    );
    assert!(out.contains(&format!("id       {}", ids[0])), "{out}");
    assert!(out.contains("headers  content-type"), "{out}");
    assert!(
        out.contains("reason   Broker: Message size too large"),
        "{out}"
    );
    assert!(
        out.contains(&format!("#{denied:<6} topic payment.audit  key none")),
        "{out}"
    );
    assert!(out.contains("payload  300 bytes, binary"), "{out}");
    assert!(out.contains("Broker: Topic authorization failed"), "{out}");
    assert!(!out.contains(&format!("#{later} ")), "not parked: {out}");
    assert!(
        out.find(&format!("#{too_large} ")) < out.find(&format!("#{denied} ")),
        "the oldest first: {out}"
    );
    let parked = json(args, &["outbox", "parked"]).await;
    assert_eq!(parked["parked"], 2, "{parked}");
    let listed = parked["messages"].as_array().unwrap();
    assert_eq!(listed.len(), 2, "{parked}");
    assert_eq!(listed[0]["seq"], too_large);
    assert_eq!(listed[0]["id"], ids[0]);
    assert_eq!(listed[0]["topic"], "payment.created");
    assert_eq!(listed[0]["key"]["text"], "pay-1");
    assert_eq!(listed[0]["payload"]["bytes"], 27);
    assert_eq!(
        listed[0]["payload"]["text_preview"],
        r#"{"id":"pay-1","amount":500}"#
    );
    assert_eq!(listed[0]["headers"][0][0], "content-type");
    assert_eq!(listed[0]["attempts"], 1);
    assert_eq!(listed[0]["reason"], "Broker: Message size too large");
    assert_eq!(listed[1]["seq"], denied);
    assert_eq!(listed[1]["key"], Value::Null);
    assert_eq!(listed[1]["payload"]["bytes"], 300);
    assert_eq!(listed[1]["payload"]["text_preview"], Value::Null);
    let first = json(args, &["outbox", "parked", "--limit", "1"]).await;
    assert_eq!(first["parked"], 2, "{first}");
    assert_eq!(first["messages"].as_array().unwrap().len(), 1, "{first}");
    assert_eq!(first["messages"][0]["seq"], too_large);
    let out = expect(args, &["outbox", "parked", "--limit", "1"], "", 0)
        .await
        .stdout;
    assert!(out.contains("the oldest 1 shown"), "{out}");
    expect(args, &["outbox", "parked", "--limit", "0"], "", 2).await;

    // Unparking asks first; "n" changes nothing.
    let one = too_large.to_string();
    let no = expect(
        args,
        &["outbox", "unpark", &one],
        "n
",
        7,
    )
    .await;
    assert!(no.stderr.contains("Unpark 1 message(s)"), "{}", no.stderr);
    assert!(
        no.stderr.contains("Broker: Message size too large"),
        "the message is shown before the question: {}",
        no.stderr
    );
    assert_eq!(outbox.parked_count().await.unwrap(), 2);
    // A message that is not parked: nothing is changed.
    let not_parked = expect(
        args,
        &["outbox", "unpark", &one, &later.to_string(), "--yes"],
        "",
        6,
    )
    .await;
    assert!(
        not_parked.stderr.contains(&format!("#{later}")),
        "{}",
        not_parked.stderr
    );
    assert_eq!(outbox.parked_count().await.unwrap(), 2);
    let yes = expect(
        args,
        &["outbox", "unpark", &one],
        "y
",
        0,
    )
    .await;
    assert!(
        yes.stdout
            .contains(&format!("unparked 1 message(s) (#{too_large})")),
        "{}",
        yes.stdout
    );
    assert_eq!(outbox.parked_count().await.unwrap(), 1);
    assert_eq!(outbox.waiting().await.unwrap(), 2);
    let status = json(args, &["outbox"]).await;
    assert_eq!(
        (status["waiting"].clone(), status["parked"].clone()),
        (2.into(), 1.into())
    );
    // Back in its place: the next lease takes it before the one behind it.
    let lease = outbox.lease(10, Duration::from_secs(30)).await.unwrap();
    let again: Vec<(i64, i64)> = lease
        .messages()
        .iter()
        .map(|m| (m.seq(), m.attempts()))
        .collect();
    assert_eq!(again, [(too_large, 2), (later, 2)]);
    outbox.release(&lease, &[too_large, later]).await.unwrap();

    // Every parked message; then there is none left.
    let all = expect(
        args,
        &["outbox", "unpark", "--all", "--json"],
        "y
",
        0,
    )
    .await;
    assert!(all.stderr.contains("Unpark all 1 parked"), "{}", all.stderr);
    let all: Value = serde_json::from_str(&all.stdout).unwrap();
    assert_eq!(all["unparked"], 1, "{all}");
    assert_eq!(all["seqs"], serde_json::json!([denied]));
    assert_eq!(all["parked_again"], 0);
    assert_eq!(outbox.parked_count().await.unwrap(), 0);
    assert_eq!(outbox.waiting().await.unwrap(), 3);
    let none = expect(args, &["outbox", "unpark", "--all"], "", 0).await;
    assert!(none.stdout.contains("nothing is parked"), "{}", none.stdout);
    let out = expect(args, &["outbox", "parked"], "", 0).await.stdout;
    assert!(out.contains("nothing is parked"), "{out}");
    // Neither messages nor --all, or both: a usage error.
    expect(args, &["outbox", "unpark"], "", 2).await;
    expect(args, &["outbox", "unpark", &one, "--all"], "", 2).await;
}

/// A records table of its own for one test, dropped at the end.
fn table_name(tag: &str) -> String {
    format!("cli_{tag}_{}", std::process::id())
}

#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn sqlite() {
    let dir = tempfile::tempdir().unwrap();
    let url = format!("sqlite://{}", dir.path().join("app.db").display());
    let store = idem::SqliteStore::connect(&url).await.unwrap();
    let args = vec!["--url".to_owned(), url.clone()];
    walkthrough(store.clone(), &args, true).await;
    outbox_walkthrough(store.clone(), &args).await;
    entity_claims(
        store.pool().clone(),
        &args,
        "CREATE TABLE IF NOT EXISTS idem_cli_orders (id INTEGER PRIMARY KEY AUTOINCREMENT, \
         token TEXT NOT NULL UNIQUE, amount BIGINT NOT NULL)",
    )
    .await;

    // A file that is not there is not created.
    let missing = dir.path().join("typo.db");
    let out = expect(
        &[],
        &["--url", &format!("sqlite://{}", missing.display()), "stats"],
        "",
        4,
    )
    .await;
    assert!(out.stderr.contains("no SQLite database"), "{}", out.stderr);
    assert!(!missing.exists());
    // A database without idem's tables.
    let empty = dir.path().join("empty.db");
    std::fs::File::create(&empty).unwrap();
    let out = expect(
        &[],
        &["--url", &format!("sqlite://{}", empty.display()), "stats"],
        "",
        5,
    )
    .await;
    assert!(out.stderr.contains("idem_records"), "{}", out.stderr);
    let out = expect(&[], &["--url", "sqlite::memory:", "stats"], "", 3).await;
    assert!(out.stderr.contains("in-memory"), "{}", out.stderr);
    let out = expect(&[], &["--url", "ftp://x", "stats"], "", 3).await;
    assert!(out.stderr.contains("must begin with"), "{}", out.stderr);
    let out = expect(&args, &["--prefix", "p", "stats"], "", 2).await;
    assert!(
        out.stderr.contains("--prefix is for Redis"),
        "{}",
        out.stderr
    );
    expect(&[], &["stats"], "", 2).await;

    // A database migrated before the outbox existed has no outbox table.
    sqlx::raw_sql("DROP TABLE idem_records_outbox")
        .execute(store.pool())
        .await
        .unwrap();
    let out = expect(&args, &["outbox"], "", 5).await;
    assert!(
        out.stderr
            .contains("no outbox table \"idem_records_outbox\""),
        "{}",
        out.stderr
    );
}

async fn sql_server<DB>(url: &str, tag: &str, create: &str)
where
    DB: EntityDatabase,
    idem::store::SqlStore<DB>: Store + Clone,
    Order: idem::entity::EntityBind<DB> + for<'r> FromRow<'r, DB::Row>,
    for<'c> &'c mut DB::Connection: sqlx::Executor<'c, Database = DB>,
{
    let pool = sqlx::Pool::<DB>::connect(url)
        .await
        .unwrap_or_else(|e| panic!("cannot reach {url} (set the server's IDEM_*_URL): {e}"));
    let table = table_name(tag);
    let store = idem::store::SqlStore::<DB>::new(pool.clone())
        .with_table_name(&table)
        .unwrap();
    store.migrate().await.unwrap();
    let args = vec![
        "--url".to_owned(),
        url.to_owned(),
        "--table".to_owned(),
        table.clone(),
    ];
    walkthrough(store.clone(), &args, true).await;
    outbox_walkthrough(store, &args).await;
    entity_claims(pool.clone(), &args, create).await;
    // A records table that is not there: nothing to forget from.
    let out = expect(
        &[
            "--url".to_owned(),
            url.to_owned(),
            "--table".to_owned(),
            "cli_no_such_table".to_owned(),
        ],
        &["forget", "cli::charge", "k", "--yes"],
        "",
        5,
    )
    .await;
    assert!(out.stderr.contains("cli_no_such_table"), "{}", out.stderr);
    let q = if tag == "mysql" { '`' } else { '"' };
    for t in [format!("{table}_steps"), format!("{table}_outbox"), table] {
        let _ = sqlx::raw_sql(&format!("DROP TABLE IF EXISTS {q}{t}{q}"))
            .execute(&pool)
            .await;
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn postgres() {
    let url = env_url(
        "IDEM_POSTGRES_URL",
        "postgres://postgres@127.0.0.1:5432/test",
    );
    sql_server::<sqlx::Postgres>(
        &url,
        "pg",
        "CREATE TABLE IF NOT EXISTS idem_cli_orders (id BIGSERIAL PRIMARY KEY, \
         token TEXT NOT NULL UNIQUE, amount BIGINT NOT NULL)",
    )
    .await;
    let out = expect(
        &[],
        &["--url", "postgres://postgres@127.0.0.1:1/test", "stats"],
        "",
        4,
    )
    .await;
    assert!(
        out.stderr.contains("cannot connect to PostgreSQL"),
        "{}",
        out.stderr
    );
}

#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn mysql() {
    let url = env_url("IDEM_MYSQL_URL", "mysql://root@127.0.0.1:3306/test");
    sql_server::<sqlx::MySql>(
        &url,
        "mysql",
        "CREATE TABLE IF NOT EXISTS idem_cli_orders (id BIGINT AUTO_INCREMENT PRIMARY KEY, \
         token VARCHAR(255) NOT NULL UNIQUE, amount BIGINT NOT NULL)",
    )
    .await;
    // `mariadb:` names the same server.
    let mariadb = url.replacen("mysql:", "mariadb:", 1);
    expect(
        &[],
        &["--url", &mariadb, "--table", &table_name("mysql"), "stats"],
        "",
        0,
    )
    .await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn redis() {
    let url = env_url("IDEM_REDIS_URL", "redis://127.0.0.1:6379");
    let prefix = fresh("cli");
    let store = idem::RedisStore::connect(&url)
        .await
        .unwrap_or_else(|e| panic!("cannot reach Redis at {url} (set IDEM_REDIS_URL): {e}"))
        .with_prefix(&prefix)
        .unwrap();
    let args = vec![
        "--url".to_owned(),
        url.clone(),
        "--prefix".to_owned(),
        prefix,
    ];
    walkthrough(store, &args, false).await;
    let out = expect(&args, &["--table", "t", "stats"], "", 2).await;
    assert!(out.stderr.contains("--table is for SQL"), "{}", out.stderr);
    // The outbox lives in the SQL stores only.
    for command in [
        &["outbox"][..],
        &["outbox", "parked"],
        &["outbox", "unpark", "--all"],
    ] {
        let out = expect(&args, command, "", 2).await;
        assert!(
            out.stderr
                .contains("the outbox lives in the SQL stores only"),
            "{}",
            out.stderr
        );
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn redis_cluster() {
    let node = match std::env::var("IDEM_REDIS_CLUSTER_URL") {
        Ok(url) => url,
        Err(_) => {
            // The local cluster of .ci/redis-cluster (a no-op when up).
            let script = concat!(env!("CARGO_MANIFEST_DIR"), "/../.ci/redis-cluster");
            let status = Command::new("bash")
                .arg(script)
                .arg("start")
                .status()
                .unwrap();
            assert!(status.success(), "{script} start failed");
            "redis://127.0.0.1:7100".to_owned()
        }
    };
    let prefix = fresh("cli");
    let store = idem::RedisStore::connect_cluster([&node])
        .await
        .unwrap_or_else(|e| panic!("cannot reach the Redis Cluster at {node}: {e}"))
        .with_prefix(&prefix)
        .unwrap();
    let cluster_url = node.replacen("redis://", "redis+cluster://", 1);
    let args = vec![
        "--url".to_owned(),
        cluster_url,
        "--prefix".to_owned(),
        prefix,
    ];
    walkthrough(store, &args, false).await;
    // One node named as a single Redis holds only some records: refused.
    let out = expect(&[], &["--url", &node, "stats"], "", 3).await;
    assert!(out.stderr.contains("redis+cluster://"), "{}", out.stderr);
}
