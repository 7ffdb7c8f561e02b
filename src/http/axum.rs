//! The `axum` feature: axum's route template as the route of a request,
//! and the layer's answers as responses.

use ::axum::extract::MatchedPath;
use ::axum::response::{IntoResponse, Response};
use ::http::request::Parts;

use super::problem::ProblemDetails;
use super::route::MakeRoute;

/// The route template that an axum 0.8 router matched (`/orders/{id}`),
/// from its `MatchedPath` extension; `None` outside every route (a
/// fallback, a service nested without a path). With the `axum` feature,
/// the layer's default: see [`MakeRoute`].
#[derive(Clone, Copy, Debug, Default)]
#[cfg_attr(docsrs, doc(cfg(feature = "axum")))]
pub struct MatchedPathRoute;

impl MakeRoute for MatchedPathRoute {
    fn make_route(&self, request: &Parts) -> Option<String> {
        let matched = request.extensions.get::<MatchedPath>()?;
        Some(matched.as_str().to_owned())
    }
}

/// The `application/problem+json` response, as the layer sends it.
#[cfg_attr(docsrs, doc(cfg(feature = "axum")))]
impl IntoResponse for ProblemDetails {
    fn into_response(self) -> Response {
        self.into()
    }
}
