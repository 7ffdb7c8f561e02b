//! [`MakeRoute`]: how the layer names the route of a request, which scopes
//! its key.

use ::http::request::Parts;

/// Names the route of a request: the operation that its key belongs to,
/// together with the method. Two requests whose routes differ never share
/// a key; two paths of one route (`/orders/1` and `/orders/2` of
/// `/orders/{id}`) do, so the same key sent to both is a reused key (422).
///
/// The layer asks the [`route`](super::IdempotencyLayer::route) it was
/// given; when there is none, or it answers `None`: with the `axum`
/// feature, axum's `MatchedPath` if the request went through an axum
/// router ([`MatchedPathRoute`](super::MatchedPathRoute)); otherwise, the
/// request's path ([`RequestPath`]).
///
/// Any `Fn(&Parts) -> Option<String>` is a `MakeRoute`, for a router that
/// leaves its route template in the request's extensions:
///
/// ```
/// use http::request::Parts;
/// use idem::http::IdempotencyLayer;
/// use idem::MemoryStore;
///
/// /// What a router of your own puts in the request's extensions.
/// #[derive(Clone)]
/// struct RouteTemplate(&'static str);
///
/// let layer = IdempotencyLayer::new(MemoryStore::new())
///     .route(|parts: &Parts| Some(parts.extensions.get::<RouteTemplate>()?.0.to_owned()));
/// ```
///
/// # Metrics
///
/// The route also names the operation in the engine's metrics (the
/// `operation` label, `POST /orders/{id}`), which a metrics exporter
/// keeps for as long as the process runs. So that no client can make a
/// label per path it sends, only a route template is a label: the routes
/// of a `MakeRoute` whose [`is_template`](MakeRoute::is_template) is
/// `true` (closures, and [`MatchedPathRoute`](super::MatchedPathRoute)).
/// A request scoped to its raw path, by [`RequestPath`] or as the last
/// resort (with the `axum` feature: a request that matched no route of
/// the router, such as one answered by its fallback), is labelled with
/// its route template when axum matched one, and otherwise with the one
/// label `METHOD (unmatched)`. Its key is still scoped to its path, and
/// it is claimed, run and stored as any request is (axum's own 404 is not
/// stored, so its key is released); only its label is shared. The labels
/// are so bounded by the application's routes, times its methods.
#[cfg_attr(docsrs, doc(cfg(feature = "http")))]
pub trait MakeRoute: Send + Sync + 'static {
    /// The route of the request (for example `/orders/{id}`), or `None`
    /// for the layer's default.
    fn make_route(&self, request: &Parts) -> Option<String>;

    /// Whether the routes this names are templates, a set fixed by the
    /// application (`true`, the default), so that they may label the
    /// engine's metrics; `false` for routes made of what the client sent
    /// (its raw path, as [`RequestPath`]), whose requests share a label
    /// (see [Metrics](MakeRoute#metrics)). Answer `false` from a
    /// `MakeRoute` of your own that is not bounded.
    fn is_template(&self) -> bool {
        true
    }
}

impl<F> MakeRoute for F
where
    F: Fn(&Parts) -> Option<String> + Send + Sync + 'static,
{
    fn make_route(&self, request: &Parts) -> Option<String> {
        self(request)
    }
}

/// The request's path, without its query: every path is a route of its
/// own. The layer's last resort, and its default without the `axum`
/// feature; with it, set `route(RequestPath)` to scope keys by path even
/// behind an axum router. Not a template: a request scoped by it is
/// labelled in metrics by axum's route template when one matched, and
/// otherwise as `METHOD (unmatched)` (see [Metrics](MakeRoute#metrics)).
#[derive(Clone, Copy, Debug, Default)]
#[cfg_attr(docsrs, doc(cfg(feature = "http")))]
pub struct RequestPath;

impl MakeRoute for RequestPath {
    fn make_route(&self, request: &Parts) -> Option<String> {
        Some(request.uri.path().to_owned())
    }

    fn is_template(&self) -> bool {
        false
    }
}

/// The route in the metrics label of a request that has no route
/// template: one for every such request.
pub(crate) const UNMATCHED: &str = "(unmatched)";
