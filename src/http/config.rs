//! [`Config`]: what an [`IdempotencyLayer`](super::IdempotencyLayer) was
//! configured with, shared by the services it makes.

use std::fmt;
use std::sync::Arc;
use std::time::Duration;

use ::http::header::HeaderName;
use ::http::{Method, StatusCode};

use super::fingerprint::RequestFingerprint;
use super::principal::MakePrincipal;
use super::route::MakeRoute;
use crate::policy::Policy;

type StatusFn = dyn Fn(StatusCode) -> bool + Send + Sync;

/// Everything the layer was configured with, shared by its services.
#[derive(Clone)]
pub(crate) struct Config {
    pub(crate) header: HeaderName,
    pub(crate) methods: Vec<Method>,
    pub(crate) require_key: bool,
    pub(crate) body_limit: usize,
    pub(crate) policy: Policy,
    pub(crate) principal: Option<Arc<dyn MakePrincipal>>,
    pub(crate) route: Option<Arc<dyn MakeRoute>>,
    pub(crate) fingerprint: RequestFingerprint,
    pub(crate) store_status: Arc<StatusFn>,
    /// The largest response body kept for a replay.
    pub(crate) max_stored_body: usize,
    /// How long a response body to keep may take to end, counted from the
    /// first time it has nothing ready, before it is streamed instead.
    pub(crate) max_stored_body_wait: Duration,
    /// Media types (`type/subtype`, lower case) whose responses stream
    /// through without being kept.
    pub(crate) stream_media_types: Vec<String>,
}

impl fmt::Debug for Config {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("Config")
            .field("header", &self.header)
            .field("methods", &self.methods)
            .field("require_key", &self.require_key)
            .field("body_limit", &self.body_limit)
            .field("policy", &self.policy)
            .field("principal", &self.principal.is_some())
            .field("route", &self.route.is_some())
            .field("fingerprint", &self.fingerprint)
            .field("max_stored_body", &self.max_stored_body)
            .field("max_stored_body_wait", &self.max_stored_body_wait)
            .field("stream_media_types", &self.stream_media_types)
            .finish_non_exhaustive()
    }
}
