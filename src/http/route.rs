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
#[cfg_attr(docsrs, doc(cfg(feature = "http")))]
pub trait MakeRoute: Send + Sync + 'static {
    /// The route of the request (for example `/orders/{id}`), or `None`
    /// for the layer's default.
    fn make_route(&self, request: &Parts) -> Option<String>;
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
/// behind an axum router.
#[derive(Clone, Copy, Debug, Default)]
#[cfg_attr(docsrs, doc(cfg(feature = "http")))]
pub struct RequestPath;

impl MakeRoute for RequestPath {
    fn make_route(&self, request: &Parts) -> Option<String> {
        Some(request.uri.path().to_owned())
    }
}
