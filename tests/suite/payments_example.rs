//! The payments example app, driven over HTTP on SQLite, PostgreSQL and
//! MariaDB/MySQL.
//!
//! The app's modules are compiled into this test (`#[path]`), so each case
//! starts the real service on an ephemeral port of 127.0.0.1 and talks to
//! it with a real client: every endpoint and status, retries after lost
//! answers, concurrent duplicates, the declined card's replay, transient
//! gateway failures, entity mode alone (`--no-http-layer`), the layer's
//! records in Redis or a Redis Cluster (`--idempotency-store`), the
//! Stripe-compatible routes and `/metrics`. Cases that need processes (two
//! instances sharing one PostgreSQL, the demo's exit status) start this
//! test binary again as the app (see
//! [`payments_app::app_process`]), so they run the same code as `cargo run
//! --example payments`.
//!
//! The ground truth is the gateway's ledger (`GET /gateway/charges`): one
//! charge per accepted key, whatever the client did. A payment stored
//! leaves its `payment.created` event in the outbox, and a replay none.

use crate::payments;

use crate::common;
use crate::payments_app;

use std::collections::HashSet;
use std::future::Future;
use std::sync::Arc;
use std::time::Duration;

use common::namespace::Namespace;
use payments::app::{self, Config};
use payments::db::Backend;
use payments::gateway::{Charge, ChargeRequest, GatewayError};
use payments_app::{
    app_command, assert_one_charge_per_key, card, spawn_instance, Api, DECLINED, VISA,
};
use reqwest::header::RETRY_AFTER;
use reqwest::StatusCode;
use serde_json::{json, Value};
use tokio::sync::Barrier;

/// The service's defaults for tests: a fast gateway that never fails.
fn config(db: &Namespace) -> Config {
    Config {
        addr: ([127, 0, 0, 1], 0).into(),
        database_url: db.url().to_owned(),
        http_layer: true,
        idempotency_store: None,
        gateway_latency: Duration::from_millis(10),
        gateway_failure_rate: 0.0,
        ..Config::default()
    }
}

async fn start(config: Config) -> (app::Server, Api) {
    let server = app::start(&config).await.expect("the app starts");
    let api = Api::new(server.url());
    (server, api)
}

// ---------------------------------------------------------------- cases

async fn create_then_replay(db: Namespace) {
    let (server, api) = start(config(&db)).await;
    let body = card(2500, "4242 4242 4242 4242");
    let first = api.pay("order-1", &body).await;
    assert_eq!(first.status, StatusCode::CREATED, "{}", first.body);
    assert!(!first.replayed());
    let payment = &first.body;
    assert!(
        payment["id"].as_str().unwrap().starts_with("pay_"),
        "{payment}"
    );
    assert_eq!(payment["amount"], 2500);
    assert_eq!(payment["currency"], "EUR");
    assert_eq!(payment["status"], "succeeded");
    assert_eq!(payment["card"], "**** 4242");
    assert_eq!(payment["description"], "test");
    assert!(
        payment["created_at"].as_str().unwrap().ends_with('Z'),
        "{payment}"
    );

    let retry = api.pay("order-1", &body).await;
    assert_eq!(retry.status, StatusCode::CREATED);
    assert!(retry.replayed(), "the retry is a replay");
    assert_eq!(retry.body, first.body);

    let id = payment["id"].as_str().unwrap();
    let found = api.get(&format!("/payments/{id}")).await;
    assert_eq!(found.status, StatusCode::OK);
    assert_eq!(&found.body, payment);
    let list = api.get("/payments").await;
    assert_eq!(list.body["count"], 1);
    assert_eq!(list.body["payments"][0], *payment);

    let charges = api.charges().await;
    assert_one_charge_per_key(&charges, 1);
    assert_eq!(charges[0]["reference"], "order-1");
    assert_eq!(charges[0]["amount"], 2500);
    assert_eq!(charges[0]["status"], "succeeded");

    // A structured-string key is the same key.
    let quoted = api.pay("\"order-1\"", &body).await;
    assert!(quoted.replayed());
    assert_eq!(quoted.body, first.body);

    // One event, the payment's, whatever the replays.
    let events = match &server.app.db.backend {
        Backend::Sqlite(service) => waiting_events(&service.events.outbox).await,
        Backend::Postgres(service) => waiting_events(&service.events.outbox).await,
        Backend::MySql(service) => waiting_events(&service.events.outbox).await,
    };
    let [event] = &events[..] else {
        panic!("one payment.created event, not {events:?}");
    };
    assert_eq!(event.topic(), "payment.created");
    assert_eq!(event.key(), Some(id.as_bytes()));
    let payload: Value = serde_json::from_slice(event.payload().unwrap()).unwrap();
    assert_eq!(
        payload,
        json!({ "payment_id": id, "amount": 2500, "currency": "EUR", "status": "succeeded",
                "idempotency_key": "order-1" })
    );
    server.stop().await.unwrap();
}

/// The messages waiting in `outbox`, leased and given back.
async fn waiting_events<DB: idem::store::Backend>(
    outbox: &idem::outbox::Outbox<DB>,
) -> Vec<idem::outbox::Message> {
    let lease = outbox.lease(100, Duration::from_secs(30)).await.unwrap();
    let seqs: Vec<i64> = lease.messages().iter().map(|m| m.seq()).collect();
    outbox.release(&lease, &seqs).await.unwrap();
    lease
        .messages()
        .iter()
        .map(|leased| leased.message().clone())
        .collect()
}

async fn invalid_requests_are_400_and_store_nothing(db: Namespace) {
    let (server, api) = start(config(&db)).await;
    let missing_key = api.pay_raw(None, &card(100, VISA).to_string()).await;
    missing_key.assert_problem(400);
    let bodies = [
        r#"{"currency": "EUR", "card": "4242424242424242"}"#,
        r#"{"amount": 0, "currency": "EUR", "card": "4242424242424242"}"#,
        r#"{"amount": -5, "currency": "EUR", "card": "4242424242424242"}"#,
        r#"{"amount": 12.5, "currency": "EUR", "card": "4242424242424242"}"#,
        r#"{"amount": "100", "currency": "EUR", "card": "4242424242424242"}"#,
        r#"{"amount": 100, "card": "4242424242424242"}"#,
        r#"{"amount": 100, "currency": "EURO", "card": "4242424242424242"}"#,
        r#"{"amount": 100, "currency": "E1R", "card": "4242424242424242"}"#,
        r#"{"amount": 100, "currency": "EUR"}"#,
        r#"{"amount": 100, "currency": "EUR", "card": "not a card"}"#,
        r#"{"amount": 100, "currency": "EUR", "card": "4242", "description": 7}"#,
        r#"{"amount": 100, "currency": "EUR", "#,
        r#"[100, "EUR", "4242424242424242"]"#,
        "",
    ];
    for (i, body) in bodies.iter().enumerate() {
        let answer = api.pay_raw(Some(&format!("bad-{i}")), body).await;
        answer.assert_problem(400);
        assert!(!answer.replayed());
    }
    assert!(api.charges().await.is_empty(), "an invalid request charged");
    assert_eq!(api.payment_count().await, 0);
    // A refused request is not stored: the client may fix it and send it
    // again with the same key.
    let fixed = api.pay("bad-1", &card(100, VISA)).await;
    assert_eq!(fixed.status, StatusCode::CREATED, "{}", fixed.body);
    assert!(!fixed.replayed());
    assert_one_charge_per_key(&api.charges().await, 1);
    server.stop().await.unwrap();
}

/// A JSON body not declared JSON is refused with 415, as axum's `Json`
/// refuses it, and not stored: the same bytes, sent again declared, are
/// charged (not a 422 "key reused" from a body read one way, then the
/// other).
async fn a_body_not_declared_json_is_415(db: Namespace) {
    let (server, api) = start(config(&db)).await;
    let body = card(700, VISA);
    for content_type in [
        None,
        Some("text/plain"),
        Some("application/x-www-form-urlencoded"),
    ] {
        let refused = api.pay_as("undeclared", content_type, &body).await;
        refused.assert_problem(415);
        assert!(!refused.replayed(), "{content_type:?}");
    }
    assert!(api.charges().await.is_empty(), "an undeclared body charged");
    let declared = api
        .pay_as("undeclared", Some("application/json; charset=utf-8"), &body)
        .await;
    assert_eq!(declared.status, StatusCode::CREATED, "{}", declared.body);
    let again = api
        .pay_as("undeclared", Some("application/json"), &body)
        .await;
    assert!(again.replayed());
    assert_one_charge_per_key(&api.charges().await, 1);
    server.stop().await.unwrap();
}

async fn reused_key_is_422(db: Namespace) {
    let (server, api) = start(config(&db)).await;
    let first = api.pay("reused", &card(1000, VISA)).await;
    assert_eq!(first.status, StatusCode::CREATED);
    let other = api.pay("reused", &card(1001, VISA)).await;
    other.assert_problem(422);
    assert_one_charge_per_key(&api.charges().await, 1);
    assert_eq!(api.payment_count().await, 1);
    server.stop().await.unwrap();
}

async fn declined_card_is_402_and_replayed(db: Namespace) {
    let (server, api) = start(config(&db)).await;
    let declined = api.pay("declined", &card(700, DECLINED)).await;
    declined.assert_problem(402);
    assert!(!declined.replayed());
    let payment = &declined.body["payment"];
    assert_eq!(payment["status"], "declined", "{}", declined.body);
    assert_eq!(payment["card"], "**** 0002");
    let retry = api.pay("declined", &card(700, DECLINED)).await;
    retry.assert_problem(402);
    assert!(retry.replayed());
    assert_eq!(retry.body, declined.body);
    let id = payment["id"].as_str().unwrap();
    let stored = api.get(&format!("/payments/{id}")).await;
    assert_eq!(stored.body["status"], "declined");
    let charges = api.charges().await;
    assert_one_charge_per_key(&charges, 1);
    assert_eq!(charges[0]["status"], "declined");
    server.stop().await.unwrap();
}

async fn reads_and_subscriptions(db: Namespace) {
    let (server, api) = start(config(&db)).await;
    api.get("/payments/pay_missing").await.assert_problem(404);
    let empty = api.get("/payments").await;
    assert_eq!(empty.body, json!({ "count": 0, "payments": [] }));
    let ledger = api.get("/gateway/charges").await;
    assert_eq!(ledger.body, json!({ "count": 0, "charges": [] }));

    api.get("/subscriptions/u-1").await.assert_problem(404);
    for _ in 0..3 {
        let put = api.put("/subscriptions/u-1", r#"{"plan": "basic"}"#).await;
        assert_eq!(put.status, StatusCode::OK, "{}", put.body);
        assert_eq!(put.body, json!({ "user_id": "u-1", "plan": "basic" }));
    }
    let pro = api.put("/subscriptions/u-1", r#"{"plan": "pro"}"#).await;
    assert_eq!(pro.body, json!({ "user_id": "u-1", "plan": "pro" }));
    let got = api.get("/subscriptions/u-1").await;
    assert_eq!(got.status, StatusCode::OK);
    assert_eq!(got.body, json!({ "user_id": "u-1", "plan": "pro" }));
    api.put("/subscriptions/u-1", r#"{"plan": ""}"#)
        .await
        .assert_problem(400);
    api.put("/subscriptions/u-1", "{").await.assert_problem(400);
    api.get("/subscriptions/u-2").await.assert_problem(404);

    // Concurrent upserts of one user leave one row, the last state.
    let tasks: Vec<_> = (0..10)
        .map(|_| {
            let api = api.clone();
            tokio::spawn(async move { api.put("/subscriptions/u-3", r#"{"plan": "team"}"#).await })
        })
        .collect();
    for task in tasks {
        assert_eq!(task.await.unwrap().status, StatusCode::OK);
    }
    let team = api.get("/subscriptions/u-3").await;
    assert_eq!(team.body, json!({ "user_id": "u-3", "plan": "team" }));
    server.stop().await.unwrap();
}

async fn a_lost_answer_is_retried_and_charged_once(db: Namespace) {
    let (server, api) = start(Config {
        gateway_latency: Duration::from_millis(300),
        ..config(&db)
    })
    .await;
    for key in ["lost-1", "lost-2"] {
        // The client gives up before the gateway answers: the charge goes on.
        let lost = api
            .http
            .post(format!("{}/payments", api.url))
            .header("Idempotency-Key", key)
            .json(&card(1500, VISA))
            .timeout(Duration::from_millis(50))
            .send()
            .await;
        assert!(lost.is_err(), "the answer was not lost: {lost:?}");
        if key == "lost-2" {
            // This retry comes after the first request finished.
            tokio::time::sleep(Duration::from_millis(600)).await;
        }
        let retry = api.pay(key, &card(1500, VISA)).await;
        assert_eq!(retry.status, StatusCode::CREATED, "{}", retry.body);
        assert!(retry.replayed(), "{key}: the retry got the first answer");
    }
    assert_one_charge_per_key(&api.charges().await, 2);
    assert_eq!(api.payment_count().await, 2);
    server.stop().await.unwrap();
}

async fn concurrent_duplicates_charge_once(db: Namespace) {
    const DUPLICATES: usize = 20;
    let (server, api) = start(Config {
        gateway_latency: Duration::from_millis(200),
        ..config(&db)
    })
    .await;
    let barrier = Arc::new(Barrier::new(DUPLICATES));
    let tasks: Vec<_> = (0..DUPLICATES)
        .map(|_| {
            let (api, barrier) = (api.clone(), barrier.clone());
            tokio::spawn(async move {
                barrier.wait().await;
                api.pay("storm", &card(3000, VISA)).await
            })
        })
        .collect();
    let mut answers = Vec::new();
    for task in tasks {
        answers.push(task.await.unwrap());
    }
    for answer in &answers {
        assert_eq!(answer.status, StatusCode::CREATED, "{}", answer.body);
        assert_eq!(answer.body, answers[0].body);
    }
    let originals = answers.iter().filter(|a| !a.replayed()).count();
    assert_eq!(originals, 1, "one request ran, the others were replays");
    assert_one_charge_per_key(&api.charges().await, 1);
    assert_eq!(api.payment_count().await, 1);
    server.stop().await.unwrap();
}

async fn transient_failures_release_the_key(db: Namespace) {
    // A gateway that always fails: 503, nothing charged, nothing stored.
    let (down, api) = start(Config {
        gateway_failure_rate: 1.0,
        ..config(&db)
    })
    .await;
    for _ in 0..2 {
        let failed = api.pay("flaky", &card(900, VISA)).await;
        failed.assert_problem(503);
        assert!(failed.headers.contains_key(RETRY_AFTER));
        assert!(!failed.replayed(), "a 503 is not stored");
    }
    assert!(api.charges().await.is_empty());
    assert_eq!(api.payment_count().await, 0);
    down.stop().await.unwrap();

    // The gateway is back: the retry with the same key charges, once.
    let (up, api) = start(config(&db)).await;
    let retry = api.pay("flaky", &card(900, VISA)).await;
    assert_eq!(retry.status, StatusCode::CREATED, "{}", retry.body);
    assert!(!retry.replayed());
    assert_one_charge_per_key(&api.charges().await, 1);
    up.stop().await.unwrap();

    // A gateway failing half the time: clients retry until answered.
    let (flaky, api) = start(Config {
        gateway_failure_rate: 0.5,
        ..config(&db)
    })
    .await;
    for i in 0..10 {
        api.pay_until_final(&format!("half-{i}"), &card(100 + i, VISA))
            .await;
    }
    // On SQLite this process's ledger; on PostgreSQL, one ledger for all.
    let charges: Vec<Value> = api
        .charges()
        .await
        .into_iter()
        .filter(|c| c["reference"].as_str().unwrap().starts_with("half-"))
        .collect();
    assert_one_charge_per_key(&charges, 10);
    assert_eq!(api.payment_count().await, 11);
    flaky.stop().await.unwrap();
}

/// `--no-http-layer`: the entity-mode method alone still charges once
/// and stores one row per key.
async fn entity_mode_alone_charges_once(db: Namespace) {
    let (server, api) = start(Config {
        http_layer: false,
        gateway_latency: Duration::from_millis(150),
        ..config(&db)
    })
    .await;
    // Sequential retries: the stored row comes back, unmarked.
    let first = api.pay("solo", &card(1200, VISA)).await;
    assert_eq!(first.status, StatusCode::CREATED, "{}", first.body);
    for _ in 0..3 {
        let retry = api.pay("solo", &card(1200, VISA)).await;
        assert_eq!(retry.status, StatusCode::CREATED);
        assert!(!retry.replayed(), "no layer, no replay header");
        assert_eq!(retry.body, first.body);
    }
    // Concurrent duplicates.
    let barrier = Arc::new(Barrier::new(20));
    let tasks: Vec<_> = (0..20)
        .map(|_| {
            let (api, barrier) = (api.clone(), barrier.clone());
            tokio::spawn(async move {
                barrier.wait().await;
                api.pay_until_final("solo-storm", &card(1300, VISA)).await
            })
        })
        .collect();
    let mut ids = HashSet::new();
    for task in tasks {
        let answer = task.await.unwrap();
        assert_eq!(answer.status, StatusCode::CREATED, "{}", answer.body);
        ids.insert(answer.body["id"].as_str().unwrap().to_owned());
    }
    assert_eq!(ids.len(), 1, "duplicates got different payments: {ids:?}");
    // A lost answer, then the retry.
    let lost = api
        .http
        .post(format!("{}/payments", api.url))
        .header("Idempotency-Key", "solo-lost")
        .json(&card(1400, VISA))
        .timeout(Duration::from_millis(30))
        .send()
        .await;
    assert!(lost.is_err());
    let retry = api.pay_until_final("solo-lost", &card(1400, VISA)).await;
    assert_eq!(retry.status, StatusCode::CREATED);
    // The decline is stored and answered again.
    let declined = api.pay("solo-declined", &card(1500, DECLINED)).await;
    declined.assert_problem(402);
    let again = api.pay("solo-declined", &card(1500, DECLINED)).await;
    again.assert_problem(402);
    assert_eq!(again.body, declined.body);
    // The row keeps the command's fingerprint: another amount is refused.
    api.pay("solo", &card(9999, VISA)).await.assert_problem(422);
    assert_one_charge_per_key(&api.charges().await, 4);
    assert_eq!(api.payment_count().await, 4);
    server.stop().await.unwrap();
}

async fn stripe_payment_intents(db: Namespace) {
    let (server, api) = start(config(&db)).await;
    let form = "amount=2000&currency=usd&payment_method=pm_card_visa&confirm=true";
    let created = api.intent(Some("sk_test_a"), Some("pi-key"), form).await;
    assert_eq!(created.status, StatusCode::OK, "{}", created.body);
    let intent = &created.body;
    assert!(intent["id"].as_str().unwrap().starts_with("pi_"));
    assert_eq!(intent["object"], "payment_intent");
    assert_eq!(intent["amount"], 2000);
    assert_eq!(intent["amount_received"], 2000);
    assert_eq!(intent["currency"], "usd");
    assert_eq!(intent["status"], "succeeded");
    assert!(!created.replayed());

    let retry = api.intent(Some("sk_test_a"), Some("pi-key"), form).await;
    assert!(retry.replayed());
    assert_eq!(retry.body, created.body);

    // The same key under another API key is another request.
    let other_account = api.intent(Some("sk_test_b"), Some("pi-key"), form).await;
    assert_eq!(other_account.status, StatusCode::OK);
    assert!(!other_account.replayed());
    assert_ne!(other_account.body["id"], intent["id"]);

    let reused = api
        .intent(
            Some("sk_test_a"),
            Some("pi-key"),
            "amount=2001&currency=usd&payment_method=pm_card_visa&confirm=true",
        )
        .await;
    assert_eq!(reused.status, StatusCode::BAD_REQUEST, "{}", reused.body);
    assert_eq!(reused.body["error"]["type"], "idempotency_error");

    // Without a key, each request is a new intent.
    let a = api.intent(Some("sk_test_a"), None, form).await;
    let b = api.intent(Some("sk_test_a"), None, form).await;
    assert_eq!((a.status, b.status), (StatusCode::OK, StatusCode::OK));
    assert_ne!(a.body["id"], b.body["id"]);

    let declined = api
        .intent(
            Some("sk_test_a"),
            Some("pi-declined"),
            "amount=500&currency=eur&payment_method=pm_card_chargeDeclined&confirm=true",
        )
        .await;
    assert_eq!(
        declined.status,
        StatusCode::PAYMENT_REQUIRED,
        "{}",
        declined.body
    );
    assert_eq!(declined.body["error"]["type"], "card_error");
    assert_eq!(declined.body["error"]["code"], "card_declined");
    assert_eq!(
        declined.body["error"]["payment_intent"]["status"],
        "requires_payment_method"
    );
    let declined_again = api
        .intent(
            Some("sk_test_a"),
            Some("pi-declined"),
            "amount=500&currency=eur&payment_method=pm_card_chargeDeclined&confirm=true",
        )
        .await;
    assert!(declined_again.replayed());
    assert_eq!(declined_again.body, declined.body);

    let unconfirmed = api
        .intent(
            Some("sk_test_a"),
            Some("pi-later"),
            "amount=300&currency=eur&payment_method=pm_card_visa",
        )
        .await;
    assert_eq!(unconfirmed.body["status"], "requires_confirmation");

    // Errors shaped like Stripe's.
    let no_key = api.intent(None, Some("pi-x"), form).await;
    assert_eq!(no_key.status, StatusCode::UNAUTHORIZED);
    assert_eq!(no_key.body["error"]["type"], "invalid_request_error");
    let no_amount = api
        .intent(Some("sk_test_a"), Some("pi-bad"), "currency=usd")
        .await;
    assert_eq!(no_amount.status, StatusCode::BAD_REQUEST);
    assert_eq!(no_amount.body["error"]["param"], "amount");
    assert_eq!(no_amount.body["error"]["type"], "invalid_request_error");
    let bad_currency = api
        .intent(
            Some("sk_test_a"),
            Some("pi-bad"),
            "amount=100&currency=dollars",
        )
        .await;
    assert_eq!(bad_currency.status, StatusCode::BAD_REQUEST);
    assert_eq!(bad_currency.body["error"]["param"], "currency");
    // The refused request was not stored: the key still works.
    let fixed = api
        .intent(Some("sk_test_a"), Some("pi-bad"), "amount=100&currency=usd")
        .await;
    assert_eq!(fixed.status, StatusCode::OK, "{}", fixed.body);
    assert_eq!(fixed.body["status"], "requires_payment_method");

    let id = intent["id"].as_str().unwrap();
    let found = api.intent_by_id("sk_test_a", id).await;
    assert_eq!(found.status, StatusCode::OK);
    assert_eq!(&found.body, intent);
    let hidden = api.intent_by_id("sk_test_b", id).await;
    assert_eq!(hidden.status, StatusCode::NOT_FOUND);
    assert_eq!(hidden.body["error"]["code"], "resource_missing");

    // Confirmed intents only were charged: a, b, the first, the other
    // account's, the declined one.
    assert_one_charge_per_key(&api.charges().await, 5);
    server.stop().await.unwrap();
}

/// The gateway alone, as Stripe keys it: requests with one key at once
/// charge once and all get that charge; the key with other parameters is
/// refused, charging nothing; a lookup answers what a charge would, short
/// of charging.
async fn the_gateway_charges_once_per_key(db: Namespace) {
    let (server, _) = start(Config {
        gateway_latency: Duration::from_millis(100),
        ..config(&db)
    })
    .await;
    let gateway = server.app.db.backend.gateway();
    let request = |amount| ChargeRequest {
        reference: "order-7",
        amount,
        currency: "EUR",
        card: VISA,
    };
    let key = "step-key-7";
    assert!(gateway.lookup(key, request(700)).await.unwrap().is_none());
    let charges = futures::future::join_all((0..10).map(|_| gateway.charge(key, request(700))));
    let charges: Vec<Charge> = charges.await.into_iter().map(Result::unwrap).collect();
    assert!(
        charges.iter().all(|c| *c == charges[0]),
        "one key, several charges: {charges:#?}"
    );
    assert_eq!(charges[0].idempotency_key.as_deref(), Some(key));
    assert_eq!(gateway.replayed(), 9);
    let reused = gateway.charge(key, request(701)).await;
    assert!(matches!(reused, Err(GatewayError::KeyReused)), "{reused:?}");
    let found = gateway.lookup(key, request(700)).await.unwrap();
    assert_eq!(found.as_ref(), Some(&charges[0]));
    let reused = gateway.lookup(key, request(701)).await;
    assert!(matches!(reused, Err(GatewayError::KeyReused)), "{reused:?}");
    // Another key is another charge.
    let other = gateway.charge("step-key-8", request(700)).await.unwrap();
    assert_ne!(other.id, charges[0].id);
    assert_eq!(
        gateway.charges().await.unwrap(),
        [charges[0].clone(), other]
    );
    server.stop().await.unwrap();
}

async fn metrics_count_executions_and_replays(db: Namespace) {
    let (server, api) = start(config(&db)).await;
    for _ in 0..2 {
        api.pay("metered", &card(100, VISA)).await;
    }
    let metrics = api
        .http
        .get(format!("{}/metrics", api.url))
        .send()
        .await
        .unwrap();
    assert_eq!(metrics.status(), StatusCode::OK);
    let text = metrics.text().await.unwrap();
    for expected in [
        "# TYPE idem_executions_total counter",
        "idem_executions_total{operation=\"POST /payments\"}",
        "idem_replays_total{operation=\"POST /payments\"}",
        "idem_replay_latency_seconds_bucket{operation=\"POST /payments\"",
    ] {
        assert!(text.contains(expected), "no {expected} in:\n{text}");
    }
    server.stop().await.unwrap();
}

/// `payments demo` in a process of its own exits 0, after its table.
async fn demo_exits_zero(db: Namespace) {
    let mut demo = app_command(&[
        "demo",
        "--database-url",
        db.url(),
        "--gateway-latency-ms",
        "60",
    ]);
    let output = tokio::time::timeout(Duration::from_secs(120), demo.output())
        .await
        .expect("the demo ended within 120 s")
        .unwrap();
    let stdout = String::from_utf8_lossy(&output.stdout);
    assert!(output.status.success(), "{:?}:\n{stdout}", output.status);
    assert!(stdout.contains("gateway charges"), "{stdout}");
    assert!(stdout.contains("OK: "), "{stdout}");
}

// Each case in a database of its own (a SQLite file, a PostgreSQL schema,
// a MariaDB database), dropped at the end.
common::backends!(sqlite_file, postgres, mysql =>
    #[tokio::test(flavor = "multi_thread", worker_threads = 4)]
    cases(within_two_minutes, backend::namespace("pay")) {
        create_then_replay,
        invalid_requests_are_400_and_store_nothing,
        a_body_not_declared_json_is_415,
        reused_key_is_422,
        declined_card_is_402_and_replayed,
        reads_and_subscriptions,
        a_lost_answer_is_retried_and_charged_once,
        concurrent_duplicates_charge_once,
        transient_failures_release_the_key,
        entity_mode_alone_charges_once,
        stripe_payment_intents,
        the_gateway_charges_once_per_key,
        metrics_count_executions_and_replays,
        demo_exits_zero,
    }
);

/// Runs `case` in the namespace `db`, failing it after 120 s.
async fn within_two_minutes<F>(
    db: impl Future<Output = Namespace>,
    case: impl FnOnce(Namespace) -> F,
) where
    F: Future<Output = ()>,
{
    tokio::time::timeout(Duration::from_secs(120), case(db.await))
        .await
        .expect("the case ended within 120 s");
}

/// The app's log, written to a pipe at INFO while its gateway says "503,
/// nothing was charged" to every call: plain text (no colour codes), no
/// statement of sqlx's, and no "step in doubt" at the retries, since the
/// step's call failed cleanly (`Failed::Cleanly`): each retry charges
/// afresh, without asking the gateway first.
#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn logs_are_plain_and_clean_failures_leave_no_doubt() {
    use tokio::io::AsyncReadExt;
    let db = common::backend::postgres::namespace("pay").await;
    let args = [
        "serve",
        "--addr",
        "127.0.0.1:0",
        "--database-url",
        db.url(),
        "--gateway-failure-rate",
        "1",
    ];
    let mut command = app_command(&args);
    command
        .env("RUST_LOG", "info,sqlx=info")
        .stderr(std::process::Stdio::piped());
    let mut child = command.spawn().unwrap();
    let mut stderr = child.stderr.take().unwrap();
    let mut stdout = tokio::io::BufReader::new(child.stdout.take().unwrap());
    let url = tokio::time::timeout(Duration::from_secs(30), async {
        use tokio::io::AsyncBufReadExt;
        let mut line = String::new();
        loop {
            line.clear();
            assert!(stdout.read_line(&mut line).await.unwrap() > 0, "no banner");
            if let Some((_, rest)) = line.split_once("payments: listening on ") {
                return rest.split_whitespace().next().unwrap().to_owned();
            }
        }
    })
    .await
    .unwrap();
    let api = Api::new(url);
    for _ in 0..3 {
        let failed = api.pay("clean-503", &card(300, VISA)).await;
        failed.assert_problem(503);
    }
    assert!(api.charges().await.is_empty());
    child.start_kill().unwrap();
    child.wait().await.unwrap();
    let mut log = String::new();
    stderr.read_to_string(&mut log).await.unwrap();
    assert!(log.contains("INFO"), "nothing logged at INFO:\n{log}");
    assert!(
        !log.contains('\u{1b}'),
        "colour codes in a piped log:\n{log}"
    );
    assert!(!log.contains("step in doubt"), "{log}");
    assert!(!log.contains("SELECT "), "statements logged:\n{log}");
}

/// Two processes of the app on different ports, sharing one PostgreSQL: the
/// same key sent to both at the same moment, many times, is one charge and
/// one payment per key, with the idempotency layer and with entity mode
/// alone.
#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn two_instances_share_one_postgres() {
    const KEYS: usize = 25;
    tokio::time::timeout(Duration::from_secs(180), async {
        for layer in [true, false] {
            let db = common::backend::postgres::namespace("pay").await;
            let mut args = vec!["serve", "--addr", "127.0.0.1:0", "--database-url", db.url()];
            args.extend(["--gateway-latency-ms", "30"]);
            if !layer {
                args.push("--no-http-layer");
            }
            let first = spawn_instance(&args).await;
            let second = spawn_instance(&args).await;
            assert_ne!(first.url, second.url);
            let (a, b) = (Api::new(first.url.clone()), Api::new(second.url.clone()));
            for i in 0..KEYS {
                let key = format!("shared-{i}");
                let body = card(100 + i as i64, VISA);
                let (x, y) = tokio::join!(
                    a.pay_until_final(&key, &body),
                    b.pay_until_final(&key, &body)
                );
                assert_eq!(x.status, StatusCode::CREATED, "{}", x.body);
                assert_eq!(x.body, y.body, "{key}: two answers");
                if layer {
                    assert!(
                        x.replayed() != y.replayed(),
                        "{key}: one original answer and one replay"
                    );
                }
            }
            // One ledger and one table, seen from either instance.
            let charges = a.charges().await;
            assert_one_charge_per_key(&charges, KEYS);
            assert_eq!(b.charges().await, charges);
            assert_eq!(a.payment_count().await, KEYS as u64);
            assert_eq!(b.payment_count().await, KEYS as u64);
            drop((first, second));
        }
    })
    .await
    .expect("the two-instance case ended within 180 s");
}

/// `--idempotency-store redis://...`: the HTTP layer keeps its records in
/// Redis (or a Redis Cluster) while entity mode stays on SQLite. Twenty
/// concurrent duplicates are one charge, one original answer and
/// nineteen replays; a later retry replays; another payload is 422; and
/// the layer's records are in Redis, under `payments`.
#[cfg(feature = "redis")]
async fn the_layer_on_redis(redis: common::redis::Redis, url: String) {
    const DUPLICATES: usize = 20;
    let db = common::backend::sqlite_file::namespace("pay").await;
    let (server, api) = start(Config {
        idempotency_store: Some(url),
        gateway_latency: Duration::from_millis(200),
        ..config(&db)
    })
    .await;
    let key = format!("redis-{}", std::process::id());
    let barrier = Arc::new(Barrier::new(DUPLICATES));
    let tasks: Vec<_> = (0..DUPLICATES)
        .map(|_| {
            let (api, barrier, key) = (api.clone(), barrier.clone(), key.clone());
            tokio::spawn(async move {
                barrier.wait().await;
                api.pay(&key, &card(4100, VISA)).await
            })
        })
        .collect();
    let mut answers = Vec::new();
    for task in tasks {
        answers.push(task.await.unwrap());
    }
    for answer in &answers {
        assert_eq!(answer.status, StatusCode::CREATED, "{}", answer.body);
        assert_eq!(answer.body, answers[0].body);
    }
    assert_eq!(answers.iter().filter(|a| !a.replayed()).count(), 1);
    let retry = api.pay(&key, &card(4100, VISA)).await;
    assert!(retry.replayed());
    assert_eq!(retry.body, answers[0].body);
    assert_eq!(
        api.pay(&key, &card(999, VISA)).await.status,
        StatusCode::UNPROCESSABLE_ENTITY
    );
    assert_one_charge_per_key(&api.charges().await, 1);
    // The records are Redis's: hashes under the app's prefix.
    let mut conn = redis.conn().await;
    let records: Vec<String> = redis::cmd("KEYS")
        .arg("payments:*:r")
        .query_async(&mut conn)
        .await
        .unwrap();
    assert!(!records.is_empty(), "no record of the layer in Redis");
    server.stop().await.unwrap();
}

#[cfg(feature = "redis")]
#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn the_layer_keeps_its_records_in_redis() {
    use common::redis::Redis;
    the_layer_on_redis(Redis::Single, Redis::Single.url()).await;
}

#[cfg(feature = "redis")]
#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn the_layer_keeps_its_records_in_a_redis_cluster() {
    use common::redis::Redis;
    common::redis::ensure_local_cluster();
    let url = Redis::Cluster
        .url()
        .replacen("redis://", "redis+cluster://", 1);
    the_layer_on_redis(Redis::Cluster, url).await;
}
