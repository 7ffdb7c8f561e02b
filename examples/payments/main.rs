//! A payment service where lost responses, retries and concurrent
//! duplicates never charge a card twice.
//!
//! ```text
//! cargo run --example payments                       # http://127.0.0.1:3000, SQLite payments.db
//! cargo run --example payments -- demo               # a scripted storm of retries, then a table
//! DATABASE_URL=postgres://postgres@127.0.0.1:5432/test \
//!     cargo run --example payments --features postgres
//! KAFKA_BROKERS=127.0.0.1:9092 cargo run --example payments --features kafka
//!                                                    # payment.created relayed to Kafka
//! ```
//!
//! Read it in this order:
//!
//! 1. [`service`]: the core, `POST /payments`. The one operation that
//!    must happen once per key, marked `#[idempotent]`, with its charge as
//!    a durable step; its handler; and the HTTP
//!    [`IdempotencyLayer`](idem::http::IdempotencyLayer) in front of it.
//! 2. [`app`]: the routes, where the layer goes, and the server.
//! 3. What they use: [`model`] (the rows and the commands), [`events`]
//!    (`payment.created`, through the outbox), [`gateway`]
//!    (the fake card gateway, the side effect, with Stripe's idempotency
//!    keys), [`api`] (the other routes: reads, subscriptions, the
//!    gateway's ledger), [`problem`] (the app's error documents).
//! 4. The plumbing: [`db`] (one database chosen by URL: SQLite,
//!    PostgreSQL or MySQL, a file each), [`stripe`] (a Stripe-compatible
//!    subset), [`telemetry`] (`GET /metrics`), [`cli`] (the flags, the
//!    banner), [`demo`] (the scripted run), [`clock`] and [`random`]
//!    (timestamps and identifiers).

pub mod api;
pub mod app;
pub mod cli;
pub mod clock;
pub mod db;
pub mod demo;
pub mod events;
pub mod gateway;
pub mod model;
pub mod problem;
pub mod random;
pub mod service;
pub mod stripe;
pub mod telemetry;

fn main() -> std::process::ExitCode {
    std::process::ExitCode::from(cli::main(std::env::args().skip(1).collect()))
}
