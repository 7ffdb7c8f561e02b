//! An axum order service whose POSTs get the `Idempotency-Key` contract:
//! a retry gets the first response back, a duplicate waits for it.
//!
//! The layer alone does not make a re-run after a crash safe: if the
//! process dies while a handler runs, nothing is stored, and once the
//! layer's lease passes (30 s) the retry runs the handler again. This
//! handler only writes to memory; a handler with an effect outside the
//! database (a card charge) uses the payments recipe instead:
//! `#[idempotent(..., entity)]` with the outside call as a durable
//! `Step` on its derived key (README, *The payments recipe*;
//! `examples/payments/service.rs`).
//!
//! ```sh
//! cargo run --example http_axum
//! # then, twice: the second answer is the first one, replayed
//! curl -i -X POST localhost:3000/orders -H 'Idempotency-Key: "order-1"' \
//!      -H 'Authorization: Bearer token-of-acme' -H 'Content-Type: application/json' \
//!      -d '{"item":"apples","quantity":2}'
//! ```
//!
//! Records are kept in an in-memory SQLite database; pass a path
//! (`-- orders.db`) to keep them in a file across runs. Keys are scoped to
//! the account that authentication verified: the same key sent with
//! `token-of-globex` is another account's, and runs again. A small token
//! table stands in for real authentication (a JWT's signature, a session
//! store).

use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::Arc;

use axum::extract::{Request, State};
use axum::http::{header::AUTHORIZATION, request::Parts, StatusCode};
use axum::middleware::{self, Next};
use axum::response::{IntoResponse, Response};
use axum::{routing::post, Json, Router};
use idem::http::IdempotencyLayer;
use idem::SqliteStore;
use serde::{Deserialize, Serialize};

#[derive(Deserialize)]
struct NewOrder {
    item: String,
    quantity: u32,
}

#[derive(Serialize)]
struct Order {
    id: u64,
    item: String,
    quantity: u32,
}

/// The account whose token `authenticate` verified, in the request's
/// extensions.
#[derive(Clone)]
struct Account(&'static str);

/// Puts the account of a known bearer token in the request's extensions;
/// refuses any other request with 401.
async fn authenticate(mut request: Request, next: Next) -> Response {
    let token = request
        .headers()
        .get(AUTHORIZATION)
        .and_then(|v| v.to_str().ok())
        .and_then(|v| v.strip_prefix("Bearer "));
    let account = match token {
        Some("token-of-acme") => Account("acme"),
        Some("token-of-globex") => Account("globex"),
        _ => return (StatusCode::UNAUTHORIZED, [("www-authenticate", "Bearer")]).into_response(),
    };
    request.extensions_mut().insert(account);
    next.run(request).await
}

async fn create_order(
    State(next_id): State<Arc<AtomicU64>>,
    Json(new): Json<NewOrder>,
) -> (StatusCode, Json<Order>) {
    let id = next_id.fetch_add(1, Ordering::SeqCst);
    println!("creating order {id}: {} x {}", new.quantity, new.item);
    let order = Order {
        id,
        item: new.item,
        quantity: new.quantity,
    };
    (StatusCode::CREATED, Json(order))
}

#[tokio::main]
async fn main() -> Result<(), Box<dyn std::error::Error>> {
    let url = match std::env::args().nth(1) {
        Some(path) => format!("sqlite://{path}"),
        None => "sqlite::memory:".to_owned(),
    };
    let store = SqliteStore::connect(&url).await?;
    // The principal comes from what `authenticate` verified, never from a
    // header the client may set to another account's name.
    let idempotency = IdempotencyLayer::new(store)
        .principal(|req: &Parts| Some(req.extensions.get::<Account>()?.0.to_owned()));
    let app = Router::new()
        .route("/orders", post(create_order))
        .layer(idempotency)
        // Added last, runs first: only authenticated requests reach the layer.
        .layer(middleware::from_fn(authenticate))
        .with_state(Arc::new(AtomicU64::new(1)));
    let listener = tokio::net::TcpListener::bind("127.0.0.1:3000").await?;
    println!("listening on http://{}", listener.local_addr()?);
    axum::serve(listener, app).await?;
    Ok(())
}
