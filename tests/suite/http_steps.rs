//! Durable steps behind the HTTP layer, through a real server and client:
//! the handler charges through a step that refuses when in doubt. The
//! first request's gateway answer is lost (the handler answers 500, not
//! stored); every retry then gets the layer's 502 `OutcomeUnknown` without
//! calling the gateway, until an operator resolves the step with the
//! charge the gateway made; the next retry answers 201 with it, and later
//! ones replay that response. On every store.

use crate::common;
use crate::common::journal_of;

use std::sync::atomic::{AtomicUsize, Ordering};
use std::sync::Arc;

use axum::extract::State;
use axum::http::StatusCode;
use axum::response::{IntoResponse, Response};
use axum::routing::post;
use axum::{Json, Router};
use idem::http::{IdempotencyLayer, Problem, ProblemDetails};
use idem::steps::{self, Step, StepKey};
use idem::{Key, Scope, Store};
use serde_json::{json, Value};

/// The gateway: counts its calls; the first one's answer is lost.
#[derive(Default)]
struct Gateway {
    calls: AtomicUsize,
}

impl Gateway {
    async fn charge(&self, key: &StepKey) -> Result<String, idem::Error> {
        let n = self.calls.fetch_add(1, Ordering::SeqCst);
        if n == 0 {
            return Err(idem::Error::store("the gateway's answer was lost"));
        }
        Ok(format!("ch_{}", &key.as_str()[..12]))
    }
}

async fn pay(State(gateway): State<Arc<Gateway>>) -> Response {
    let charged = Step::new("charge")
        .refuse()
        .run(|key| {
            let gateway = gateway.clone();
            async move { gateway.charge(&key).await }
        })
        .await;
    match charged {
        Ok(charge) => (StatusCode::CREATED, Json(json!({ "charge": charge }))).into_response(),
        Err(err @ idem::Error::OutcomeUnknown { .. }) => ProblemDetails::from(&err).into_response(),
        Err(err) => (StatusCode::INTERNAL_SERVER_ERROR, err.to_string()).into_response(),
    }
}

async fn refused_until_resolved<S: Store + Clone + 'static>(store: S) {
    let gateway = Arc::new(Gateway::default());
    let router = Router::new()
        .route("/payments", post(pay))
        .with_state(gateway.clone())
        .layer(IdempotencyLayer::new(store.clone()));
    let (base, client) = common::http::serve(router).await;
    let key = format!(
        "http-steps-{}-{}",
        std::process::id(),
        std::time::SystemTime::now()
            .duration_since(std::time::UNIX_EPOCH)
            .unwrap()
            .as_nanos()
    );
    let send = || {
        client
            .post(format!("{base}/payments"))
            .header("idempotency-key", &key)
            .header("content-type", "application/json")
            .body(r#"{"amount":500}"#)
            .send()
    };

    let lost = send().await.unwrap();
    assert_eq!(lost.status(), 500);
    assert_eq!(gateway.calls.load(Ordering::SeqCst), 1);

    for _ in 0..2 {
        let refused = send().await.unwrap();
        assert_eq!(refused.status(), 502);
        assert_eq!(
            refused.headers()["content-type"],
            "application/problem+json"
        );
        let problem: Value = refused.json().await.unwrap();
        assert_eq!(problem["type"], Problem::OutcomeUnknown.type_uri());
        assert!(
            problem["detail"].as_str().unwrap().contains("charge"),
            "{problem}"
        );
    }
    assert_eq!(
        gateway.calls.load(Ordering::SeqCst),
        1,
        "a refused step ran"
    );

    // The operator looks the step up and settles it with the charge the
    // gateway made under the step's key.
    let scope = Scope::new("POST /payments");
    let k = Key::new(key.as_str()).unwrap();
    let journal = journal_of(&store).steps(&scope, &k).await.unwrap();
    assert_eq!(journal.len(), 1);
    let step_key = StepKey::derive(&scope, &k, "charge", 0);
    let charge = format!("ch_{}", &step_key.as_str()[..12]);
    assert!(
        steps::resolve(&store, &scope, &k, 0, "charge", Some(&charge))
            .await
            .unwrap()
    );

    let settled = send().await.unwrap();
    assert_eq!(settled.status(), 201);
    assert!(settled.headers().get("idempotent-replayed").is_none());
    let body: Value = settled.json().await.unwrap();
    assert_eq!(body["charge"], charge.as_str());
    let replayed = send().await.unwrap();
    assert_eq!(replayed.status(), 201);
    assert_eq!(replayed.headers()["idempotent-replayed"], "true");
    let again: Value = replayed.json().await.unwrap();
    assert_eq!(again, body);
    assert_eq!(gateway.calls.load(Ordering::SeqCst), 1);
}

common::backends!(memory, sqlite_file, postgres, mysql => {
    #[tokio::test(flavor = "multi_thread", worker_threads = 2)]
    async fn a_refused_step_answers_502_until_an_operator_resolves_it() {
        let (store, _guard) = backend::store(4).await;
        super::refused_until_resolved(store).await;
    }
});
