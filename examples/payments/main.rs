//! A payment service where lost responses, retries and concurrent
//! duplicates never charge a card twice.
//!
//! ```text
//! cargo run --example payments                       # http://127.0.0.1:3000, SQLite payments.db
//! cargo run --example payments -- demo               # a scripted storm of retries, then a table
//! DATABASE_URL=postgres://postgres@127.0.0.1:5432/test \
//!     cargo run --example payments --features postgres
//! ```
//!
//! Two lines of defense:
//!
//! - the HTTP [`IdempotencyLayer`](idem::http::IdempotencyLayer) answers the
//!   `Idempotency-Key` contract: replays marked `Idempotent-Replayed: true`,
//!   409 while the first request runs, 422 for a key reused with another
//!   body;
//! - underneath, [`service::Payments::create`] is an `#[idempotent(...,
//!   entity)]` method: the `payments` table has a UNIQUE
//!   `idempotency_token`, so even without the layer (`--no-http-layer`) one
//!   key is one charge and one row.
//!
//! The modules: [`cli`] (flags, the banner), [`app`] (state, router,
//! server), [`api`] (the JSON API), [`stripe`] (the Stripe-compatible
//! subset), [`service`] (the idempotent operations), [`db`] (pools, schema,
//! queries), [`model`] (rows and commands), [`gateway`] (the fake card
//! gateway), [`telemetry`] (`/metrics`), [`demo`] (the scripted run).

pub mod api;
pub mod app;
pub mod cli;
pub mod db;
pub mod demo;
pub mod gateway;
pub mod model;
pub mod service;
pub mod stripe;
pub mod telemetry;

fn main() -> std::process::ExitCode {
    std::process::ExitCode::from(cli::main(std::env::args().skip(1).collect()))
}
