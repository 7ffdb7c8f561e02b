//! [`IdempotencyLayer`]: the builder of the configuration, and the tower
//! `Layer` that wraps a service in [`Idempotency`].

use std::fmt;
use std::sync::Arc;
use std::time::Duration;

use ::http::header::HeaderName;
use ::http::{Method, StatusCode};
use tower_layer::Layer;

use super::config::Config;
use super::fingerprint::RequestFingerprint;
use super::key_header::IDEMPOTENCY_KEY;
use super::principal::MakePrincipal;
use super::route::MakeRoute;
use super::service::Idempotency;
use super::storing::stored_by_default;
use crate::policy::Policy;
use crate::store::Store;
use idem_core::error::Error;

/// Makes the requests of a tower service (an axum `Router`, a route)
/// idempotent by their `Idempotency-Key` header. See the
/// [module documentation](super) for the exact behaviour.
///
/// ```
/// use std::time::Duration;
/// use http::{Method, StatusCode};
/// use idem::http::IdempotencyLayer;
/// use idem::MemoryStore;
///
/// let layer = IdempotencyLayer::new(MemoryStore::new())
///     .methods([Method::POST, Method::PUT, Method::PATCH])
///     .body_limit(64 * 1024)
///     .ttl(Duration::from_secs(6 * 60 * 60))
///     .wait(Duration::from_secs(2))
///     .fingerprint_headers([http::header::CONTENT_TYPE])
///     .ignore_fields(["/sent_at"])?
///     .store_status(|status| status.is_success());
/// # Ok::<(), idem::Error>(())
/// ```
#[derive(Clone)]
#[cfg_attr(docsrs, doc(cfg(feature = "http")))]
pub struct IdempotencyLayer {
    store: Arc<dyn Store>,
    config: Config,
}

impl IdempotencyLayer {
    /// The default body limit: 2 MiB, axum's default limit too.
    pub const DEFAULT_BODY_LIMIT: usize = 2 * 1024 * 1024;

    /// The default [`max_stored_body`](Self::max_stored_body): 1 MiB, which
    /// every built-in store holds with room to spare (MariaDB's
    /// `max_allowed_packet` is often 16 MiB, Redis's `proto-max-bulk-len`
    /// 512 MiB).
    pub const DEFAULT_MAX_STORED_BODY: usize = 1024 * 1024;

    /// The default [`max_stored_body_wait`](Self::max_stored_body_wait):
    /// 1 second. A handler that returns a whole body (axum's `Json`, a
    /// `String`, bytes) ends it at once, and one that writes it from a
    /// query or a file ends it within milliseconds; a body still being
    /// produced a second after it first paused is a stream (a feed, an
    /// export fed by a slow cursor), which may never end. A second is
    /// also well within the 5 seconds a duplicate waits by default, so a
    /// duplicate that arrives while the layer waits gets the 410 rather
    /// than a 409.
    pub const DEFAULT_MAX_STORED_BODY_WAIT: Duration = Duration::from_secs(1);

    /// A layer keeping its records in `store`, with the defaults: header
    /// `Idempotency-Key`, required on POST and PATCH; bodies up to 2 MiB;
    /// the default [`Policy`] (records kept 24 hours, claims leased for 30
    /// seconds, duplicates wait up to 5 seconds); no principal (keys global
    /// to the route); JSON bodies fingerprinted canonically, no field
    /// ignored; responses stored as [`stored_by_default`] says, or when
    /// marked [`Final`](super::Final), up to a body of 1 MiB that ends
    /// within 1 second of its first pause; responses of type
    /// `text/event-stream` streamed through, never stored.
    pub fn new<S: Store + 'static>(store: S) -> Self {
        IdempotencyLayer {
            store: Arc::new(store),
            config: Config {
                header: IDEMPOTENCY_KEY,
                methods: vec![Method::POST, Method::PATCH],
                require_key: true,
                body_limit: Self::DEFAULT_BODY_LIMIT,
                policy: Policy::new(),
                principal: None,
                route: None,
                fingerprint: RequestFingerprint::default(),
                store_status: Arc::new(stored_by_default),
                max_stored_body: Self::DEFAULT_MAX_STORED_BODY,
                max_stored_body_wait: Self::DEFAULT_MAX_STORED_BODY_WAIT,
                stream_media_types: vec!["text/event-stream".to_owned()],
            },
        }
    }

    /// Reads the key from another header.
    pub fn with_header_name(mut self, name: HeaderName) -> Self {
        self.config.header = name;
        self
    }

    /// The methods the layer applies to; requests with other methods pass
    /// through untouched. Default: POST and PATCH.
    pub fn methods(mut self, methods: impl IntoIterator<Item = Method>) -> Self {
        self.config.methods = methods.into_iter().collect();
        self
    }

    /// Whether a request without a key is refused with 400 (`true`, the
    /// default) or passed through untouched, without idempotency (`false`).
    pub fn require_key(mut self, required: bool) -> Self {
        self.config.require_key = required;
        self
    }

    /// The largest request body buffered, in bytes; a larger one is answered
    /// 413 and nothing is stored. Default: 2 MiB.
    pub fn body_limit(mut self, bytes: usize) -> Self {
        self.config.body_limit = bytes;
        self
    }

    /// Replaces the whole policy (ttl, lease, in-progress behaviour).
    pub fn policy(mut self, policy: Policy) -> Self {
        self.config.policy = policy;
        self
    }

    /// How long a record, and so a key, is kept. Default: 24 hours.
    pub fn ttl(mut self, ttl: Duration) -> Self {
        self.config.policy = self.config.policy.ttl(ttl);
        self
    }

    /// How long a claim is held before another request may take the key
    /// over. Set it above your slowest handler. Default: 30 seconds.
    pub fn lease(mut self, lease: Duration) -> Self {
        self.config.policy = self.config.policy.lease(lease);
        self
    }

    /// A duplicate arriving while the first request runs waits up to `bound`
    /// for its response, then gets 409. Default: 5 seconds.
    pub fn wait(mut self, bound: Duration) -> Self {
        self.config.policy = self.config.policy.wait(bound);
        self
    }

    /// A duplicate arriving while the first request runs gets 409 at once.
    pub fn fail_fast(mut self) -> Self {
        self.config.policy = self.config.policy.fail_fast();
        self
    }

    /// Scopes keys to the principal that `extractor` finds in each request,
    /// from what authentication established; a request in which it finds
    /// none is refused with 401. Without an extractor, keys are global to
    /// the route. See [`MakePrincipal`].
    pub fn principal(mut self, extractor: impl MakePrincipal) -> Self {
        self.config.principal = Some(Arc::new(extractor));
        self
    }

    /// Names the route of a request (for example `/orders/{id}`): with the
    /// method, the operation that keys belong to. When `route` answers
    /// `None`, the layer falls back to its default: axum's `MatchedPath`
    /// with the `axum` feature, then the request's path. See
    /// [`MakeRoute`].
    pub fn route(mut self, route: impl MakeRoute) -> Self {
        self.config.route = Some(Arc::new(route));
        self
    }

    /// Adds these request headers to the fingerprint, so that a retry with
    /// other values (a different `Content-Type`, say) is a different payload
    /// (422). Default: none.
    pub fn fingerprint_headers(mut self, names: impl IntoIterator<Item = HeaderName>) -> Self {
        self.config.fingerprint.set_headers(names);
        self
    }

    /// Whether a JSON body (`Content-Type: application/json` or
    /// `…/…+json`) is fingerprinted by its canonical JSON, so that a retry
    /// whose members come in another order or with other whitespace is
    /// the same payload (`true`, the default), or by its bytes, as any
    /// other body (`false`). See the
    /// [module documentation](super#behaviour).
    pub fn canonical_json(mut self, canonical: bool) -> Self {
        self.config.fingerprint.set_canonical_json(canonical);
        self
    }

    /// Leaves these fields of a JSON body out of its fingerprint, so that
    /// a retry in which they differ (a client's timestamp, a trace id) is
    /// the same payload. Each is a JSON pointer (RFC 6901) from the body's
    /// root: `/sent_at`, `/meta/trace_id`, `/lines/0/note`; `~1` stands for
    /// a `/` in a member's name and `~0` for a `~`. A member is left out
    /// of its object; an array element counts as `null`. A pointer that
    /// names nothing in a body leaves it whole. Other bodies, and JSON
    /// bodies with [`canonical_json(false)`](Self::canonical_json), are
    /// fingerprinted whole. Replaces the fields given before.
    ///
    /// # Errors
    ///
    /// [`Error::Config`] for a pointer that does not start with `/`, or in
    /// which a `~` is followed by neither `0` nor `1`.
    pub fn ignore_fields<I, P>(mut self, pointers: I) -> Result<Self, Error>
    where
        I: IntoIterator<Item = P>,
        P: Into<String>,
    {
        self.config.fingerprint.set_ignored_fields(pointers)?;
        Ok(self)
    }

    /// Which responses are stored and replayed, by status, in place of
    /// [`stored_by_default`]; for the others the key is released and a
    /// retry runs the request again. A response that the handler marked
    /// [`Final`](super::Final) is stored whatever this says. See the
    /// [module documentation](super#which-responses-are-stored).
    pub fn store_status<F>(mut self, predicate: F) -> Self
    where
        F: Fn(StatusCode) -> bool + Send + Sync + 'static,
    {
        self.config.store_status = Arc::new(predicate);
        self
    }

    /// The largest response body kept for a replay, in bytes, and so the
    /// most of a response body the layer holds in memory (plus the one
    /// chunk that crosses it). A response to store whose body ends within
    /// it (and within [`max_stored_body_wait`](Self::max_stored_body_wait))
    /// is stored whole, then sent. One whose body goes past it is sent
    /// as it streams: its head and the part read so far at once, the rest
    /// as the inner service produces it; the key then answers
    /// [`Problem::NotReplayable`](super::Problem::NotReplayable), and the
    /// request is not run again for it. See the
    /// [module documentation](super#bodies). Default: 1 MiB
    /// ([`DEFAULT_MAX_STORED_BODY`](Self::DEFAULT_MAX_STORED_BODY)).
    ///
    /// Keep it within what the store holds in one value (with the
    /// response's headers): a response the store refuses is answered
    /// [`Problem::NotReplayable`](super::Problem::NotReplayable) as well.
    /// The engine's limit on a stored outcome
    /// ([`Call::max_outcome`](crate::Call::max_outcome)) follows this one:
    /// the body, and 64 KiB for its status and headers.
    pub fn max_stored_body(mut self, bytes: usize) -> Self {
        self.config.max_stored_body = bytes;
        self
    }

    /// How long the layer waits for a response body to end before it
    /// sends the head, counted from the first time the body has no chunk
    /// ready. A response to store whose body ends within it (and within
    /// [`max_stored_body`](Self::max_stored_body)) is stored whole, then
    /// sent. One whose body is still being produced when it passes is sent
    /// as it streams, as a body over `max_stored_body` is: its head and
    /// the part read so far at once, the rest as the inner service
    /// produces it; the key then answers
    /// [`Problem::NotReplayable`](super::Problem::NotReplayable), and the
    /// request is not run again for it. So a stream of any media type
    /// gets its head, however slowly it flows. See the
    /// [module documentation](super#bodies). Default: 1 second
    /// ([`DEFAULT_MAX_STORED_BODY_WAIT`](Self::DEFAULT_MAX_STORED_BODY_WAIT)).
    ///
    /// A body that is whole when the handler answers never waits, and no
    /// timer is armed for it. Raise the wait for a handler whose finite
    /// body pauses longer (and whose response must be replayed); keep it
    /// under [`wait`](Self::wait), so that a duplicate arriving meanwhile
    /// gets the 410 rather than a 409.
    pub fn max_stored_body_wait(mut self, wait: Duration) -> Self {
        self.config.max_stored_body_wait = wait;
        self
    }

    /// The media types of responses that are streams (server-sent events,
    /// a feed that never ends), matched against the response's
    /// `Content-Type` without its parameters, whatever their case. Such a
    /// response is sent as it streams from its first byte and never
    /// stored, whatever its status; the key answers
    /// [`Problem::NotReplayable`](super::Problem::NotReplayable) when its
    /// status is one that is stored. Replaces the types given before.
    /// Default: `text/event-stream`.
    pub fn stream_media_types<I, T>(mut self, types: I) -> Self
    where
        I: IntoIterator<Item = T>,
        T: AsRef<str>,
    {
        self.config.stream_media_types = types
            .into_iter()
            .map(|t| t.as_ref().trim().to_ascii_lowercase())
            .collect();
        self
    }
}

impl fmt::Debug for IdempotencyLayer {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("IdempotencyLayer")
            .field("config", &self.config)
            .finish_non_exhaustive()
    }
}

impl<S> Layer<S> for IdempotencyLayer {
    type Service = Idempotency<S>;

    fn layer(&self, inner: S) -> Self::Service {
        Idempotency::from_parts(inner, self.store.clone(), Arc::new(self.config.clone()))
    }
}
