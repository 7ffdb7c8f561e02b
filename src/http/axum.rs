//! The `axum` feature: axum's route template as the route of a request,
//! the key header as an extractor, the [`Final`] mark as a response part,
//! and the layer's answers as responses.

use std::convert::Infallible;

use ::axum::extract::{FromRequestParts, MatchedPath};
use ::axum::response::{IntoResponse, IntoResponseParts, Response, ResponseParts};
use ::http::request::Parts;

use super::key_header::{refusal, IdempotencyKey, IDEMPOTENCY_KEY};
use super::problem::ProblemDetails;
use super::route::MakeRoute;
use super::storing::Final;

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

/// Reads the `Idempotency-Key` header; a request without a valid key is
/// refused with the layer's own 400 ([`Problem::MissingKey`] or
/// [`Problem::InvalidKey`](super::Problem::InvalidKey)), the same
/// document word for word.
///
/// [`Problem::MissingKey`]: super::Problem::MissingKey
#[cfg_attr(docsrs, doc(cfg(feature = "axum")))]
impl<S: Send + Sync> FromRequestParts<S> for IdempotencyKey {
    type Rejection = ProblemDetails;

    async fn from_request_parts(parts: &mut Parts, _state: &S) -> Result<Self, Self::Rejection> {
        IdempotencyKey::from_headers(&parts.headers)
            .map_err(|err| refusal(err, &parts.method, &IDEMPOTENCY_KEY))
    }
}

/// Marks the response final: `(StatusCode::PAYMENT_REQUIRED, Final, body)`.
#[cfg_attr(docsrs, doc(cfg(feature = "axum")))]
impl IntoResponseParts for Final {
    type Error = Infallible;

    fn into_response_parts(self, mut response: ResponseParts) -> Result<ResponseParts, Infallible> {
        response.extensions_mut().insert(self);
        Ok(response)
    }
}

/// The `application/problem+json` response, as the layer sends it.
#[cfg_attr(docsrs, doc(cfg(feature = "axum")))]
impl IntoResponse for ProblemDetails {
    fn into_response(self) -> Response {
        self.into()
    }
}
