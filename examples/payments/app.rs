//! The service's state, its routes, and a server that the command line,
//! the demo and the tests start the same way.
//!
//! | route | answer |
//! |---|---|
//! | `POST /payments` (`Idempotency-Key` required) | 201 payment; 402 declined (stored and replayed); 400 invalid body (nothing stored, nothing charged); 409 while the first request with the key runs; 422 key reused; 503 gateway down (the key is released) |
//! | `GET /payments/{id}` | 200, or 404 |
//! | `GET /payments` | `{"count": N, "payments": [the latest 100, newest first]}` |
//! | `PUT /subscriptions/{user_id}` `{"plan": ".."}` | 200: created or updated, the same state however often it is sent |
//! | `GET /subscriptions/{user_id}` | 200, or 404 |
//! | `GET /gateway/charges` | `{"count": N, "charges": [...]}`: every charge the gateway made |
//! | `GET /metrics` | the library's counters, Prometheus text format |
//! | `/v1/payment_intents` | the Stripe-compatible subset: see [`stripe`] |
//!
//! Errors are RFC 9457 `application/problem+json` documents: the
//! idempotency layer's, and the app's own ([`problem`](super::problem)).
//!
//! Every payment stored writes its `payment.created` event to the outbox
//! ([`events`](super::events)); with `kafka_brokers` set (and the `kafka`
//! feature built in), the server runs the outbox's relay beside it.

use std::net::SocketAddr;
use std::sync::Arc;
use std::time::Duration;

use axum::routing::get;
use axum::Router;
use metrics_exporter_prometheus::PrometheusHandle;
use tokio::net::TcpListener;
use tokio::sync::oneshot;
use tokio::task::JoinHandle;

use super::db::{self, ConnectError, Database};
use super::events::PAYMENT_CREATED;
use super::service::{create_payment, idempotency_layer};
use super::{api, stripe, telemetry};

/// How to run the service.
#[derive(Clone, Debug)]
pub struct Config {
    pub addr: SocketAddr,
    pub database_url: String,
    /// Whether the HTTP idempotency layer is on (`--no-http-layer` turns it
    /// off, leaving entity mode alone between retries and the card).
    pub http_layer: bool,
    /// Where the HTTP layer keeps its records when not in the database
    /// (`--idempotency-store redis://...`).
    pub idempotency_store: Option<String>,
    pub gateway_latency: Duration,
    pub gateway_failure_rate: f64,
    /// The topic of the `payment.created` events (`--events-topic`).
    pub events_topic: String,
    /// The Kafka cluster (bootstrap servers) the outbox's relay produces
    /// the events to (`--kafka-brokers`); none: they wait in the outbox.
    pub kafka_brokers: Option<String>,
}

impl Default for Config {
    fn default() -> Self {
        Config {
            addr: SocketAddr::from(([127, 0, 0, 1], 3000)),
            database_url: "sqlite://payments.db".to_owned(),
            http_layer: true,
            idempotency_store: None,
            gateway_latency: Duration::from_millis(50),
            gateway_failure_rate: 0.0,
            events_topic: PAYMENT_CREATED.to_owned(),
            kafka_brokers: None,
        }
    }
}

/// What every handler shares.
pub struct App {
    pub db: Database,
    pub metrics: PrometheusHandle,
}

/// Every route, with the idempotency layer on the writes when asked.
pub fn router(app: Arc<App>, http_layer: bool) -> Router {
    let api = Router::new()
        .route("/payments", get(api::list_payments).post(create_payment))
        .route("/payments/{id}", get(api::get_payment))
        .route(
            "/subscriptions/{user_id}",
            get(api::get_subscription).put(api::put_subscription),
        )
        .route("/gateway/charges", get(api::gateway_charges))
        .route("/metrics", get(api::metrics));
    // On POST and PATCH only: PUT /subscriptions is idempotent by itself.
    let layer = http_layer.then(|| idempotency_layer(app.db.store.clone()));
    let api = match &layer {
        Some(layer) => api.layer(layer.clone()),
        None => api,
    };
    api.merge(stripe::router(layer)).with_state(app)
}

#[derive(Debug, thiserror::Error)]
pub enum StartError {
    #[error(transparent)]
    Database(#[from] ConnectError),
    #[error("cannot listen on {addr}: {source}")]
    Bind {
        addr: SocketAddr,
        source: std::io::Error,
    },
    #[error("the events' topic: {0}")]
    Topic(#[from] idem::outbox::InvalidMessage),
    #[error("cannot start the outbox's relay to Kafka: {0}")]
    Relay(idem::Error),
    #[cfg(not(feature = "kafka"))]
    #[error(
        "--kafka-brokers {0}: this build has no Kafka support: run it with `--features kafka`"
    )]
    KafkaNotBuilt(String),
}

/// A running service.
pub struct Server {
    pub addr: SocketAddr,
    pub app: Arc<App>,
    /// What becomes of the outbox's events, for the banner.
    pub events: String,
    shutdown: Option<oneshot::Sender<()>>,
    task: JoinHandle<std::io::Result<()>>,
    /// The outbox's relay, when it runs here.
    relay: Option<JoinHandle<()>>,
}

impl Server {
    /// `http://127.0.0.1:3000`.
    pub fn url(&self) -> String {
        format!("http://{}", self.addr)
    }

    /// Stops accepting, lets the requests in flight finish, and returns.
    pub async fn stop(mut self) -> std::io::Result<()> {
        if let Some(shutdown) = self.shutdown.take() {
            let _ = shutdown.send(());
        }
        let served = (&mut self.task).await.unwrap_or(Ok(()));
        // What it leased and did not mark is produced again after its
        // lease, by the next relay.
        if let Some(relay) = self.relay.take() {
            relay.abort();
        }
        served
    }

    /// Serves until the server stops by itself (it does not, but for an
    /// error).
    pub async fn wait(mut self) -> std::io::Result<()> {
        (&mut self.task).await.unwrap_or(Ok(()))
    }
}

/// Opens the database, binds the address, and serves on a task.
pub async fn start(config: &Config) -> Result<Server, StartError> {
    let mut db = db::connect(
        &config.database_url,
        config.gateway_latency,
        config.gateway_failure_rate,
    )
    .await?;
    if let Some(url) = &config.idempotency_store {
        let (store, description) = db::idempotency_store(url).await?;
        db.store = store;
        db.description = format!("{}, the layer's records in {description}", db.description);
    }
    idem::outbox::Message::tombstone(&config.events_topic)?;
    db.backend.set_events_topic(&config.events_topic);
    let (relay, events): (Option<db::Relay>, String) = match &config.kafka_brokers {
        None => (
            None,
            "they wait there, no relay runs (--kafka-brokers)".to_owned(),
        ),
        #[cfg(feature = "kafka")]
        Some(brokers) => (
            Some(db.backend.relay(brokers).map_err(StartError::Relay)?),
            format!("a relay produces them to Kafka at {brokers}"),
        ),
        #[cfg(not(feature = "kafka"))]
        Some(brokers) => return Err(StartError::KafkaNotBuilt(brokers.clone())),
    };
    let app = Arc::new(App {
        db,
        metrics: telemetry::prometheus(),
    });
    let listener = TcpListener::bind(config.addr)
        .await
        .map_err(|source| StartError::Bind {
            addr: config.addr,
            source,
        })?;
    let addr = listener.local_addr().map_err(|source| StartError::Bind {
        addr: config.addr,
        source,
    })?;
    let router = router(app.clone(), config.http_layer);
    let (shutdown, stopped) = oneshot::channel::<()>();
    let task = tokio::spawn(async move {
        axum::serve(listener, router)
            .with_graceful_shutdown(async {
                let _ = stopped.await;
            })
            .await
    });
    Ok(Server {
        addr,
        app,
        events,
        shutdown: Some(shutdown),
        task,
        relay: relay.map(tokio::spawn),
    })
}
