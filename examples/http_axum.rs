//! An axum order service whose POSTs are safe to retry.
//!
//! ```sh
//! cargo run --example http_axum --features http
//! # then, twice: the second answer is the first one, replayed
//! curl -i -X POST localhost:3000/orders -H 'Idempotency-Key: "order-1"' \
//!      -H 'X-Account: acme' -H 'Content-Type: application/json' \
//!      -d '{"item":"apples","quantity":2}'
//! ```
//!
//! Records are kept in an in-memory SQLite database; pass a path
//! (`-- orders.db`) to keep them in a file across runs. The account header
//! stands in for real authentication: keys are scoped to it.

use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::Arc;

use axum::extract::State;
use axum::http::{request::Parts, StatusCode};
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
    let idempotency = IdempotencyLayer::new(store)
        .principal(|req: &Parts| Some(req.headers.get("x-account")?.to_str().ok()?.to_owned()));
    let app = Router::new()
        .route("/orders", post(create_order))
        .layer(idempotency)
        .with_state(Arc::new(AtomicU64::new(1)));
    let listener = tokio::net::TcpListener::bind("127.0.0.1:3000").await?;
    println!("listening on http://{}", listener.local_addr()?);
    axum::serve(listener, app).await?;
    Ok(())
}
