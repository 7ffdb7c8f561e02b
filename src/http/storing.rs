//! Which responses the layer stores: the status rule
//! ([`stored_by_default`]), and the handler's own word for one response
//! ([`Final`]). The table of the [module documentation](super) is the
//! rule in full.

use ::http::{Response, StatusCode};

/// Whether the layer stores a response with `status` when neither the
/// handler marked it [`Final`] nor
/// [`store_status`](super::IdempotencyLayer::store_status) replaced this
/// rule: the table "Which responses are stored" of the
/// [module documentation](super#which-responses-are-stored).
///
/// Stored: 2xx, 3xx, and the 4xx that answer a request which ran (402,
/// 410, ...). Not stored, the key released so that a retry runs: 1xx;
/// the 4xx that refuse the request as it was sent (400, 403, 404, 405,
/// 406, 411, 412, 413, 414, 415, 417, 421, 422, 426, 428, 431), so the
/// corrected retry runs; those that ask to retry later or with other
/// credentials (401, 407, 408, 409, 425, 429); and every 5xx.
///
/// ```
/// use http::StatusCode;
/// use idem::http::stored_by_default;
///
/// assert!(stored_by_default(StatusCode::CREATED));
/// assert!(stored_by_default(StatusCode::PAYMENT_REQUIRED));
/// assert!(!stored_by_default(StatusCode::UNSUPPORTED_MEDIA_TYPE));
/// assert!(!stored_by_default(StatusCode::UNPROCESSABLE_ENTITY));
/// assert!(!stored_by_default(StatusCode::SERVICE_UNAVAILABLE));
/// ```
#[cfg_attr(docsrs, doc(cfg(feature = "http")))]
pub fn stored_by_default(status: StatusCode) -> bool {
    match status.as_u16() {
        200..=399 => true,
        // Not acceptable as sent: the client corrects the request.
        400 | 403 | 404 | 405 | 406 | 411 | 412 | 413 | 414 | 415 | 417 | 421 | 422 | 426 | 428
        | 431 => false,
        // Try again: authenticated, or later.
        401 | 407 | 408 | 409 | 425 | 429 => false,
        400..=499 => true,
        _ => false,
    }
}

/// Marks a response as the final answer of a request that ran, so that
/// the layer stores and replays it whatever its status: a 422 that a
/// handler's business rule gave after it acted, a `402 Payment Required`
/// for a declined card. The mark is a response extension, never sent; it
/// wins over [`stored_by_default`] and over
/// [`store_status`](super::IdempotencyLayer::store_status). See the
/// [module documentation](super#which-responses-are-stored).
///
/// It is the HTTP counterpart of an `#[idempotent]` function's
/// `replayable` errors: an answer worth giving again to every retry.
///
/// On any tower service, [`Final::mark`] a response, or insert `Final` in
/// its extensions:
///
/// ```
/// use http::{Response, StatusCode};
/// use idem::http::Final;
///
/// let mut declined = Response::new("the card was declined");
/// *declined.status_mut() = StatusCode::PAYMENT_REQUIRED;
/// let declined = Final::mark(declined);
/// assert!(Final::is_marked(&declined));
/// ```
///
/// With the `axum` feature it is a response part, for a handler's tuple:
///
/// ```
/// # #[cfg(feature = "axum")]
/// # mod example {
/// use axum::http::StatusCode;
/// use axum::response::IntoResponse;
/// use idem::http::Final;
///
/// /// The order was refused by a rule that ran: the same answer for every
/// /// retry, not a request to correct.
/// async fn refuse_order() -> impl IntoResponse {
///     (StatusCode::UNPROCESSABLE_ENTITY, Final, "the customer's credit limit is reached")
/// }
/// # }
/// ```
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq, Hash)]
#[cfg_attr(docsrs, doc(cfg(feature = "http")))]
pub struct Final;

impl Final {
    /// `response`, marked final.
    pub fn mark<B>(mut response: Response<B>) -> Response<B> {
        response.extensions_mut().insert(Final);
        response
    }

    /// Whether `response` is marked final.
    pub fn is_marked<B>(response: &Response<B>) -> bool {
        response.extensions().get::<Final>().is_some()
    }
}

/// Whether the layer stores `response`: marked [`Final`], or its status
/// passes `store_status`.
pub(crate) fn is_stored<B>(
    response: &Response<B>,
    store_status: impl Fn(StatusCode) -> bool,
) -> bool {
    Final::is_marked(response) || store_status(response.status())
}

#[cfg(test)]
mod tests {
    use super::*;

    fn stored(code: u16) -> bool {
        stored_by_default(StatusCode::from_u16(code).unwrap())
    }

    #[test]
    fn default_stored_statuses() {
        for code in [
            200, 201, 202, 204, 299, 301, 303, 307, 399, 402, 410, 418, 424, 451,
        ] {
            assert!(stored(code), "{code}");
        }
        let refused = [
            400, 403, 404, 405, 406, 411, 412, 413, 414, 415, 417, 421, 422, 426, 428, 431,
        ];
        let retry = [401, 407, 408, 409, 425, 429];
        let failed = [100, 101, 500, 501, 502, 503, 504, 599];
        for code in refused.into_iter().chain(retry).chain(failed) {
            assert!(!stored(code), "{code}");
        }
    }

    #[test]
    fn the_mark_wins_over_the_status() {
        let mut response = Response::new(());
        *response.status_mut() = StatusCode::UNPROCESSABLE_ENTITY;
        assert!(!is_stored(&response, stored_by_default));
        let response = Final::mark(response);
        assert!(is_stored(&response, stored_by_default));
        assert!(is_stored(&response, |_| false));
        let mut ok = Response::new(());
        *ok.status_mut() = StatusCode::OK;
        assert!(!is_stored(&ok, |_| false));
    }
}
