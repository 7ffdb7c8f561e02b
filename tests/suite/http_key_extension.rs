//! The HTTP layer hands the handler what it checked, over real HTTP on
//! each store: the `IdempotencyKey` extractor is the layer's key (from the
//! header the layer reads, not parsed again), `Principal` the principal it
//! found; a handler passes both to an `#[idempotent]` function of its own,
//! which then guards the very key the layer guards.

use crate::http_support;

use std::sync::Arc;

use axum::extract::State;
use axum::http::header::HeaderName;
use axum::http::request::Parts;
use axum::http::StatusCode;
use axum::response::{IntoResponse, Response};
use axum::routing::post;
use axum::{Extension, Router};
use http_support::{fresh_key, on_each_store, replayed, Runs, Server};
use idem::http::{IdempotencyKey, IdempotencyLayer, Principal, ProblemDetails};
use idem::{idempotent, Scope, Store};
use reqwest::Method;

on_each_store!(
    handler_gets_the_key_the_layer_checked,
    idempotent_function_guards_the_layers_key_and_principal,
    principal_is_absent_without_an_extractor,
);

/// The tenant that authentication verified, in the request's extensions
/// (here every request's: `Extension(Tenant(..))` stands for the
/// authentication middleware in front of the layer).
#[derive(Clone)]
struct Tenant(&'static str);

fn by_tenant(parts: &Parts) -> Option<String> {
    Some(parts.extensions.get::<Tenant>()?.0.to_owned())
}

const HEADER: HeaderName = HeaderName::from_static("x-request-key");

/// Behind a layer that reads `X-Request-Key`, the extractor answers the
/// key of that header: the layer's, since by itself it reads
/// `Idempotency-Key`, which the request does not have.
async fn handler_gets_the_key_the_layer_checked<S: Store + 'static>(store: S) {
    async fn echo(key: IdempotencyKey) -> String {
        format!("key {key}")
    }
    let layer = IdempotencyLayer::new(store).with_header_name(HEADER);
    let server = Server::start(Router::new().route("/echo", post(echo)).layer(layer)).await;
    let send = |value: &str| {
        server
            .request(Method::POST, "/echo")
            .header(HEADER, value)
            .send()
    };
    let quoted = send(r#""k-\"1\"""#).await.unwrap();
    assert_eq!(quoted.status(), StatusCode::OK);
    assert_eq!(quoted.text().await.unwrap(), r#"key k-"1""#);
    // The same key, bare: the layer replays the first answer.
    let bare = send(r#"k-"1""#).await.unwrap();
    assert!(replayed(&bare));
}

/// The operation behind `POST /orders`, guarded by the engine on its own
/// scope, narrowed to the principal: a second line of defence on the
/// layer's key.
#[idempotent(
    key = key,
    store = store,
    scope = Scope::new("orders.place").with_principal(principal.as_str()),
    fingerprint = item,
)]
async fn place<S: Store>(
    store: &S,
    runs: &Runs,
    key: &IdempotencyKey,
    principal: &Principal,
    item: &str,
) -> Result<String, idem::Error> {
    Ok(format!(
        "order {} of {item} for {principal} ({key})",
        runs.next()
    ))
}

struct App<S> {
    store: S,
    runs: Runs,
}

async fn create_order<S: Store + 'static>(
    State(app): State<Arc<App<S>>>,
    key: IdempotencyKey,
    principal: Principal,
    item: String,
) -> Response {
    match place(&app.store, &app.runs, &key, &principal, &item).await {
        Ok(order) => (StatusCode::CREATED, order).into_response(),
        Err(err) => ProblemDetails::from(&err).into_response(),
    }
}

/// The handler passes the layer's key and principal to [`place`]: the
/// first request runs it once; after that, [`place`] called directly with
/// the same key and principal finds its outcome, and with another
/// principal does not.
async fn idempotent_function_guards_the_layers_key_and_principal<S: Store + Clone + 'static>(
    store: S,
) {
    let app = Arc::new(App {
        store: store.clone(),
        runs: Runs::default(),
    });
    let layer = IdempotencyLayer::new(store)
        .with_header_name(HEADER)
        .principal(by_tenant);
    let router = Router::new()
        .route("/orders", post(create_order::<S>))
        .with_state(app.clone())
        .layer(layer)
        .layer(Extension(Tenant("acme")));
    let server = Server::start(router).await;
    let key = fresh_key();
    let send = || {
        server
            .request(Method::POST, "/orders")
            .header(HEADER, &key)
            .body("2 apples")
            .send()
    };
    let first = send().await.unwrap();
    assert_eq!(first.status(), StatusCode::CREATED);
    let placed = first.text().await.unwrap();
    let bare_key = key.trim_matches('"');
    assert_eq!(placed, format!("order 1 of 2 apples for acme ({bare_key})"));
    let retry = send().await.unwrap();
    assert!(replayed(&retry));
    assert_eq!(retry.text().await.unwrap(), placed);
    assert_eq!(app.runs.count(), 1);

    // The function's own record: the layer's key, the layer's principal.
    let checked = IdempotencyKey::parse(key.as_bytes()).unwrap();
    let acme = Principal::new("acme");
    let again = place(&app.store, &app.runs, &checked, &acme, "2 apples").await;
    assert_eq!(again.unwrap(), placed);
    assert_eq!(app.runs.count(), 1, "the function ran again");
    let other = Principal::new("globex");
    let theirs = place(&app.store, &app.runs, &checked, &other, "2 apples").await;
    assert_eq!(
        theirs.unwrap(),
        format!("order 2 of 2 apples for globex ({bare_key})")
    );
}

/// Under a layer without a principal extractor, `Option<Principal>` is
/// `None`, and a handler that requires a `Principal` is refused with 500:
/// the server is set up wrong, the client is not to blame.
async fn principal_is_absent_without_an_extractor<S: Store + 'static>(store: S) {
    async fn maybe(principal: Option<Principal>) -> String {
        format!("{principal:?}")
    }
    async fn required(principal: Principal) -> String {
        principal.into_string()
    }
    let router = Router::new()
        .route("/maybe", post(maybe))
        .route("/required", post(required))
        .layer(IdempotencyLayer::new(store));
    let server = Server::start(router).await;
    let maybe = server.post("/maybe", &fresh_key()).send().await.unwrap();
    assert_eq!(maybe.text().await.unwrap(), "None");
    let required = server.post("/required", &fresh_key()).send().await.unwrap();
    assert_eq!(required.status(), StatusCode::INTERNAL_SERVER_ERROR);
    assert_eq!(
        required.headers()["content-type"],
        "application/problem+json"
    );
}
