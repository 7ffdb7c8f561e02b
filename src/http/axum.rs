//! The `axum` feature: axum's route template as the route of a request,
//! what the layer checked (the key, the principal) as extractors, the
//! [`Final`] mark as a response part, and the layer's answers as
//! responses.

use std::convert::Infallible;

use ::axum::extract::{FromRequestParts, MatchedPath, OptionalFromRequestParts};
use ::axum::response::{IntoResponse, IntoResponseParts, Response, ResponseParts};
use ::http::request::Parts;

use super::key_header::{refusal, IdempotencyKey, KeyHeaderError, Unkeyed, IDEMPOTENCY_KEY};
use super::principal::Principal;
use super::problem::{Problem, ProblemDetails};
use super::route::MakeRoute;
use super::storing::Final;

/// The route template that an axum 0.8 router matched (`/orders/{id}`),
/// from its `MatchedPath` extension; `None` outside every route (a
/// fallback, a service nested without a path). With the `axum` feature,
/// the layer's default: see [`MakeRoute`]. Where it answers `None`, the
/// layer scopes the key to the request's path, and labels the request's
/// metrics `METHOD (unmatched)`, one label for every such path (see
/// [Metrics](MakeRoute#metrics)).
#[derive(Clone, Copy, Debug, Default)]
#[cfg_attr(docsrs, doc(cfg(feature = "axum")))]
pub struct MatchedPathRoute;

impl MakeRoute for MatchedPathRoute {
    fn make_route(&self, request: &Parts) -> Option<String> {
        let matched = request.extensions.get::<MatchedPath>()?;
        Some(matched.as_str().to_owned())
    }
}

/// Behind the layer, the key that the layer checked (read from whatever
/// header it was configured with), and nothing else: a request the layer
/// let through without a key (a method it does not cover, or a key it does
/// not require and did not get) has none, whatever other header it
/// carries. Elsewhere, the `Idempotency-Key` header, read as the layer
/// reads it. A request without a valid key is refused with the layer's own
/// 400 ([`Problem::MissingKey`] or [`Problem::InvalidKey`]), the same
/// document word for word.
#[cfg_attr(docsrs, doc(cfg(feature = "axum")))]
impl<S: Send + Sync> FromRequestParts<S> for IdempotencyKey {
    type Rejection = ProblemDetails;

    async fn from_request_parts(parts: &mut Parts, _state: &S) -> Result<Self, Self::Rejection> {
        if let Some(checked) = parts.extensions.get::<IdempotencyKey>() {
            return Ok(checked.clone());
        }
        if let Some(Unkeyed(header)) = parts.extensions.get::<Unkeyed>() {
            return Err(refusal(KeyHeaderError::Missing, &parts.method, header));
        }
        IdempotencyKey::from_headers(&parts.headers)
            .map_err(|err| refusal(err, &parts.method, &IDEMPOTENCY_KEY))
    }
}

/// The principal that the layer found. A request without one (a route not
/// behind a layer with a [`principal`](super::IdempotencyLayer::principal)
/// extractor: a mistake of the server) is refused with
/// [`Problem::Internal`], a 500.
#[cfg_attr(docsrs, doc(cfg(feature = "axum")))]
impl<S: Send + Sync> FromRequestParts<S> for Principal {
    type Rejection = ProblemDetails;

    async fn from_request_parts(parts: &mut Parts, _state: &S) -> Result<Self, Self::Rejection> {
        parts.extensions.get::<Principal>().cloned().ok_or_else(|| {
            ProblemDetails::new(
                Problem::Internal,
                "the handler takes the principal of the idempotency layer, and the request \
                 has none: the route is not behind a layer with a principal extractor",
            )
        })
    }
}

/// `Option<Principal>`: the principal that the layer found, if any.
#[cfg_attr(docsrs, doc(cfg(feature = "axum")))]
impl<S: Send + Sync> OptionalFromRequestParts<S> for Principal {
    type Rejection = Infallible;

    async fn from_request_parts(
        parts: &mut Parts,
        _state: &S,
    ) -> Result<Option<Self>, Self::Rejection> {
        Ok(parts.extensions.get::<Principal>().cloned())
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
