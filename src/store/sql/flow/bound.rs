//! What the placeholders of the records' statements are bound to: the
//! request, the claim, the key or the batch, in the order each statement
//! names its [`Param`]s.

use crate::store::sql::exec::Value;
use crate::store::sql::statements::{Param, Statement};
use idem_core::error::Error;
use idem_core::key::{Key, Scope};
use idem_core::record::{duration_millis, BeginRequest, Claim, Millis, Outcome};

/// What a statement's placeholders are bound to, by [`Param`].
#[derive(Default)]
pub(super) struct Bound<'a> {
    scope: Option<&'a str>,
    key: Option<&'a str>,
    fingerprint: Option<&'a [u8]>,
    token: Option<&'a [u8]>,
    lease: Option<Millis>,
    ttl: Option<Millis>,
    outcome: Option<&'a Outcome>,
    batch: Option<i64>,
}

impl<'a> Bound<'a> {
    pub(super) fn request(req: &'a BeginRequest<'_>) -> Self {
        Bound {
            scope: Some(req.scope.as_str()),
            key: Some(req.key.as_str()),
            fingerprint: Some(&req.fingerprint.as_bytes()[..]),
            token: Some(&req.token.as_bytes()[..]),
            lease: Some(duration_millis(req.lease)),
            ttl: Some(duration_millis(req.ttl)),
            ..Bound::default()
        }
    }

    pub(super) fn claim(claim: &'a Claim, outcome: Option<&'a Outcome>) -> Self {
        Bound {
            scope: Some(claim.scope.as_str()),
            key: Some(claim.key.as_str()),
            token: Some(&claim.token.as_bytes()[..]),
            lease: Some(duration_millis(claim.lease)),
            ttl: Some(duration_millis(claim.ttl)),
            outcome,
            ..Bound::default()
        }
    }

    pub(super) fn key(scope: &'a Scope, key: &'a Key) -> Self {
        Bound {
            scope: Some(scope.as_str()),
            key: Some(key.as_str()),
            ..Bound::default()
        }
    }

    pub(super) fn batch(batch: i64) -> Self {
        Bound {
            batch: Some(batch),
            ..Bound::default()
        }
    }

    /// The values of `statement`'s placeholders, in order. Every statement
    /// is paired with the flow that binds it, so a missing value is this
    /// crate's bug, reported as such rather than bound as something else.
    pub(super) fn values(&self, statement: &Statement) -> Result<Vec<Value<'a>>, Error> {
        statement
            .params
            .iter()
            .map(|param| {
                let value = match param {
                    Param::Scope => self.scope.map(Value::Text),
                    Param::Key => self.key.map(Value::Text),
                    Param::Fingerprint => self.fingerprint.map(Value::Bytes),
                    Param::Token => self.token.map(Value::Bytes),
                    Param::Lease => self.lease.map(Value::Int),
                    Param::Ttl => self.ttl.map(Value::Int),
                    Param::OutcomeKind => self.outcome.map(|o| Value::Small(o.kind.code())),
                    Param::Outcome => self.outcome.map(|o| Value::Bytes(&o.body[..])),
                    Param::Batch => self.batch.map(Value::Int),
                };
                value.ok_or_else(|| {
                    Error::Config(format!("no value for the statement's {param:?} parameter"))
                })
            })
            .collect()
    }
}
