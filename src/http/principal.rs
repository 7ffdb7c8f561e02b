//! [`MakePrincipal`]: who sends a request, which scopes its key; and
//! [`Principal`], what it found, for the handler.

use std::fmt;

use ::http::request::Parts;

/// Who sends a request: the principal that keys are scoped to (a tenant, an
/// account, an API key id, an authenticated user).
///
/// The same key sent by two principals never shares a response. Take the
/// principal from what authentication established, never from a value the
/// client sets freely (an `X-Tenant-Id` header, a query parameter): a
/// client that names another's principal, and knows or guesses its key and
/// payload, would be answered that client's stored response.
///
/// Any `Fn(&Parts) -> Option<String>` is a `MakePrincipal`. The request
/// parts hold the extensions that earlier middleware put there: put the
/// layer behind the authentication middleware and read what it inserted
/// once it verified the request's credentials.
///
/// **A configured extractor that answers `None` refuses the request** with
/// 401 ([`Problem::MissingPrincipal`](super::Problem::MissingPrincipal)):
/// it is neither run nor stored, rather than given a scope wider than its
/// principal's. Without an extractor, keys are global to the route.
///
/// ```
/// use axum::extract::Request;
/// use axum::middleware::{self, Next};
/// use axum::response::{IntoResponse, Response};
/// use axum::{http::StatusCode, routing::post, Router};
/// use idem::http::IdempotencyLayer;
/// use idem::MemoryStore;
///
/// /// The account whose credentials were verified, put in the request's
/// /// extensions by `authenticate`.
/// #[derive(Clone)]
/// struct Account(String);
///
/// async fn authenticate(mut request: Request, next: Next) -> Response {
///     let token = request
///         .headers()
///         .get("authorization")
///         .and_then(|v| v.to_str().ok())
///         .and_then(|v| v.strip_prefix("Bearer "));
///     // Stands for a real check: a signature, a session, a database.
///     let account = match token {
///         Some("token-of-acme") => Account("acme".to_owned()),
///         _ => return StatusCode::UNAUTHORIZED.into_response(),
///     };
///     request.extensions_mut().insert(account);
///     next.run(request).await
/// }
///
/// let idempotency = IdempotencyLayer::new(MemoryStore::new()).principal(
///     |parts: &http::request::Parts| Some(parts.extensions.get::<Account>()?.0.clone()),
/// );
/// let app: Router = Router::new()
///     .route("/orders", post(|| async { "created" }))
///     // The last layer added runs first: authentication, then idempotency.
///     .layer(idempotency)
///     .layer(middleware::from_fn(authenticate));
/// ```
#[cfg_attr(docsrs, doc(cfg(feature = "http")))]
pub trait MakePrincipal: Send + Sync + 'static {
    /// The principal of the request, or `None` when it has none (the
    /// layer then answers 401).
    fn make_principal(&self, request: &Parts) -> Option<String>;
}

impl<F> MakePrincipal for F
where
    F: Fn(&Parts) -> Option<String> + Send + Sync + 'static,
{
    fn make_principal(&self, request: &Parts) -> Option<String> {
        self(request)
    }
}

/// The principal that the layer's [`MakePrincipal`] found in a request,
/// which its key is scoped to: put in the request's extensions for the
/// handler, next to the checked [`IdempotencyKey`](super::IdempotencyKey).
/// A request of a layer without a principal extractor has none.
///
/// A handler that runs an `#[idempotent]` function of its own narrows that
/// function's scope to the same principal, so that one principal's key
/// never finds another's outcome there either:
///
/// ```
/// # #[cfg(feature = "axum")]
/// # mod example {
/// use idem::http::{IdempotencyKey, Principal};
/// use idem::{idempotent, MemoryStore, Scope};
///
/// #[idempotent(
///     key = key,
///     store = store,
///     scope = Scope::new("orders.place").with_principal(principal.as_str()),
///     fingerprint = item,
/// )]
/// async fn place(
///     store: &MemoryStore,
///     key: &IdempotencyKey,
///     principal: &Principal,
///     item: &str,
/// ) -> Result<String, idem::Error> {
///     Ok(format!("{item} placed for {principal}"))
/// }
/// # }
/// ```
///
/// With the `axum` feature it is an extractor: `Principal` refuses a
/// request that has none with a 500 (the route is not behind a layer with
/// a principal extractor: a mistake of the server), and `Option<Principal>`
/// takes what there is.
#[derive(Clone, Debug, PartialEq, Eq, Hash)]
#[cfg_attr(docsrs, doc(cfg(feature = "http")))]
pub struct Principal(String);

impl Principal {
    /// A principal named `principal`, as the layer makes it from what its
    /// [`MakePrincipal`] answers; for a test of a function that takes one.
    pub fn new(principal: impl Into<String>) -> Self {
        Principal(principal.into())
    }

    /// The principal, as the extractor gave it.
    pub fn as_str(&self) -> &str {
        &self.0
    }

    /// Unwraps the principal.
    pub fn into_string(self) -> String {
        self.0
    }
}

impl AsRef<str> for Principal {
    fn as_ref(&self) -> &str {
        &self.0
    }
}

impl fmt::Display for Principal {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(&self.0)
    }
}
