//! Start here: `POST /payments`, where a client that retries never pays
//! twice. Three pieces make it safe, each enough by itself to keep one key
//! to one charge:
//!
//! 1. [`Payments::create`] is the operation that must happen once per
//!    idempotency key: it charges the card and returns the payment.
//!    `#[idempotent(..., entity)]` makes it look for the payment stored
//!    under the key first, and charge only when there is none; the
//!    `payments` table holds the key in a UNIQUE column, so the payment is
//!    stored once. The charge is a durable step ([`Payments::charge`])
//!    with a key of its own for the gateway: a process killed between the
//!    charge and the row leaves a charge that the retry finds, rather
//!    than a second one.
//! 2. [`create_payment`], its handler, takes the key with the library's
//!    [`IdempotencyKey`] extractor (behind the layer, the key the layer
//!    checked; without it, the header read as the layer reads it), passes
//!    that same key to the operation, and answers the operation's
//!    idempotency errors (a key reused with another body, a duplicate
//!    still running) exactly as the HTTP layer does, with
//!    [`ProblemDetails`].
//! 3. [`idempotency_layer`] is that HTTP layer, which [`app`](super::app)
//!    puts in front of the routes: a retry gets the first response back,
//!    marked `Idempotent-Replayed: true`, without running the handler; a
//!    duplicate that arrives while the first request runs waits for its
//!    response; a key reused with another body is refused (422). A
//!    request refused as sent (400) is not stored, so the client may fix
//!    it and send it again with the same key; the declined card's 402 is
//!    marked final and stored.
//!
//! Started with `--no-http-layer`, the app runs without the layer, and the
//! operation alone still charges once per key.
//!
//! Every payment stored announces itself: its `payment.created` event is
//! written to the outbox in the transaction that inserts its row (see
//! [`events`](super::events)), so the event exists exactly when the
//! payment does.

use std::sync::Arc;
use std::time::Duration;

use axum::body::Bytes;
use axum::extract::State;
use axum::http::{HeaderMap, StatusCode};
use axum::response::{IntoResponse, Response};
use axum::Json;
use idem::entity::EntityDatabase;
use idem::http::{IdempotencyKey, IdempotencyLayer, ProblemDetails};
use idem::steps::{Failed, Step, StepKey};
use idem::{idempotent, Store};
use sqlx::Pool;

use super::app::App;
use super::clock::now_rfc3339;
use super::events::Events;
use super::gateway::{Charge, ChargeRequest, Gateway, GatewayError};
use super::model::{mask_card, NewPayment, Payment, Table};
use super::problem::{declined, internal, problem, unless_json};
use super::random::new_id;

/// The payment operations, on one database: SQLite, PostgreSQL or MySQL.
pub struct Payments<DB: idem::store::Backend> {
    pub pool: Pool<DB>,
    pub gateway: Arc<Gateway>,
    /// The outbox that `payment.created` goes through, in the same
    /// database.
    pub events: Events<DB>,
}

impl<DB: idem::store::Backend> Payments<DB> {
    pub fn new(pool: Pool<DB>, gateway: Arc<Gateway>) -> Self {
        let events = Events::new(&pool);
        Payments {
            pool,
            gateway,
            events,
        }
    }
}

impl<DB: EntityDatabase> Payments<DB>
where
    Payment: Table<DB>,
{
    /// Charges the card once per idempotency key and stores the payment,
    /// `succeeded` or `declined`. A retry gets the stored payment back; the
    /// same key with another command is refused (`KeyReused`), since the
    /// row keeps the command's fingerprint; a gateway failure stores
    /// nothing, so the retry charges. The charge is a durable step
    /// ([`charge`](Self::charge)): a retry after a crash between the charge
    /// and the row finds the charge rather than making another. The
    /// payment's `payment.created` event is committed with its row, and
    /// only then.
    #[idempotent(key = cmd.idempotency_key, store = self.pool, entity)]
    pub async fn create(&self, cmd: &NewPayment) -> Result<Payment, ServiceError> {
        let charge = self
            .charge(ChargeRequest {
                reference: &cmd.idempotency_key,
                amount: cmd.amount,
                currency: &cmd.currency,
                card: &cmd.card,
            })
            .await?;
        let payment = Payment {
            seq: 0,
            id: new_id("pay"),
            idempotency_token: cmd.idempotency_key.clone(),
            request_hash: None,
            amount: cmd.amount,
            currency: cmd.currency.clone(),
            status: charge.status,
            card: mask_card(&cmd.card),
            description: cmd.description.clone(),
            charge_id: charge.id,
            created_at: now_rfc3339(),
        };
        // Held for the transaction that inserts the row: written with it.
        self.events.payment_created(&payment)?;
        Ok(payment)
    }
}

impl<DB: idem::store::Backend> Payments<DB> {
    /// The card charge of an idempotent operation, as its durable step
    /// `charge`. The claim keeps duplicates out while the operation runs,
    /// and the row answers retries once it is stored; in between, the
    /// process may die after the gateway charged and before the row was
    /// written. The step covers that window:
    ///
    /// - the gateway gets the step's derived key, the same at every
    ///   attempt, in every process, so it can tell a retry from a new
    ///   charge;
    /// - its answer is journaled under the operation's claim: an attempt
    ///   that failed after the charge (the row's insert, say) replays it
    ///   at the next attempt, without calling the gateway;
    /// - a step that was started and never journaled (the process was
    ///   killed while the gateway answered) is *in doubt*: the next
    ///   attempt asks the gateway what became of the key
    ///   ([`Gateway::lookup`]) and takes its charge, or charges (with the
    ///   same key) if there is none.
    ///
    /// The lookup compares the parameters too: in entity mode alone (no
    /// HTTP layer), a client that reuses its key with another amount after
    /// such a crash finds no row to refuse it (none was written), and
    /// would otherwise be handed the crashed attempt's charge.
    pub async fn charge(&self, request: ChargeRequest<'_>) -> Result<Charge, ServiceError> {
        let gateway = &self.gateway;
        Step::new("charge")
            .reconcile(|key: StepKey| async move {
                Ok::<_, ServiceError>(gateway.lookup(key.as_str(), request).await?)
            })
            // This gateway runs in the service's process: a call that
            // ended (answered, failed, or dropped with its caller) charges
            // nothing later, so there is nothing in flight to wait for
            // before asking. A gateway over the network would say how long
            // a call may still land: its client's timeout.
            .settle(Duration::ZERO)
            .try_run(|key: StepKey| async move {
                gateway
                    .charge(key.as_str(), request)
                    .await
                    .map_err(|err| match err {
                        // The gateway said it charged nothing: the next
                        // attempt charges afresh, without asking it first.
                        GatewayError::Unavailable | GatewayError::KeyReused => {
                            Failed::Cleanly(err.into())
                        }
                        // It may have charged: the step is in doubt.
                        err => Failed::InDoubt(err.into()),
                    })
            })
            .await
    }
}

/// Why an operation did not give its answer.
#[derive(Debug, thiserror::Error)]
pub enum ServiceError {
    /// The gateway did not charge. `Unavailable`: transient, nothing was
    /// charged nor stored; retry with the same key. `KeyReused`: the
    /// gateway holds this key's charge for another command.
    #[error(transparent)]
    Gateway(#[from] GatewayError),
    /// The idempotency contract: key reused, in progress, store down.
    /// `#[idempotent]` needs this `From<idem::Error>`.
    #[error(transparent)]
    Idempotency(#[from] idem::Error),
    #[error("database error: {0}")]
    Database(#[from] sqlx::Error),
}

impl IntoResponse for ServiceError {
    fn into_response(self) -> Response {
        match self {
            // 422, 409 with Retry-After, 503...: the layer's own answers.
            ServiceError::Idempotency(err) => ProblemDetails::from(&err).into_response(),
            // The client reused its key with another command, and the
            // gateway, not the row, was the one to know: answered as the
            // layer answers a reused key (422).
            ServiceError::Gateway(GatewayError::KeyReused) => {
                ProblemDetails::from(&idem::Error::KeyReused).into_response()
            }
            ServiceError::Gateway(err) => problem(
                StatusCode::SERVICE_UNAVAILABLE,
                "gateway-unavailable",
                "Card gateway unavailable",
                format!("{err}; nothing was charged, retry with the same Idempotency-Key"),
            ),
            ServiceError::Database(err) => internal(&err),
        }
    }
}

/// `POST /payments`: 201 with the payment, 402 when the card is declined.
/// `key` is the key the layer checked; without the layer
/// (`--no-http-layer`), the extractor reads the header and refuses a
/// request without a valid key with the layer's 400.
pub async fn create_payment(
    State(app): State<Arc<App>>,
    key: IdempotencyKey,
    headers: HeaderMap,
    body: Bytes,
) -> Response {
    if let Some(unsupported) = unless_json(&headers) {
        return unsupported;
    }
    let command = match NewPayment::parse(key.as_str().to_owned(), &body) {
        Ok(command) => command,
        Err(detail) => {
            return problem(
                StatusCode::BAD_REQUEST,
                "invalid-request",
                "Invalid payment request",
                detail,
            )
        }
    };
    // On a task of its own: a client that hangs up must not cancel a
    // payment between the charge and the row that records it. `backend`
    // calls `Payments::create` on the database the URL named (`db`).
    let created = tokio::spawn(async move { app.db.backend.create(&command).await }).await;
    match created {
        Ok(Ok(payment)) if payment.succeeded() => {
            (StatusCode::CREATED, Json(payment)).into_response()
        }
        Ok(Ok(payment)) => declined(&payment),
        Ok(Err(err)) => err.into_response(),
        Err(join) => internal(&join),
    }
}

/// The idempotency layer on the JSON API: `Idempotency-Key` required on
/// POST and PATCH, records in `store` (the app's database). Its defaults
/// store the final answers (201, the 402 of a declined card) and not a
/// refused request (400, 401), which did not run: as with Stripe, a client
/// may fix its request and send it again with the same key.
pub fn idempotency_layer(store: Arc<dyn Store>) -> IdempotencyLayer {
    IdempotencyLayer::new(store)
}
