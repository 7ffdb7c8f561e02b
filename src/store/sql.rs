//! What the SQL backends share: table names and the embedded migrations'
//! bookkeeping.

use crate::error::Error;
use crate::fingerprint::Fingerprint;
use crate::key::{Key, Scope};
use crate::record::{ClaimToken, Millis, Outcome, OutcomeKind, Record, State};

/// The default name of the records table.
pub(crate) const DEFAULT_TABLE: &str = "idem_records";

/// Checks a table name: 1 to 63 characters of ASCII letters, digits and
/// underscores, not starting with a digit. Names are formatted into SQL
/// (a table name cannot be bound), so nothing else is accepted.
pub(crate) fn validate_table_name(name: &str) -> Result<String, Error> {
    let mut chars = name.chars();
    let valid_start = chars
        .next()
        .is_some_and(|c| c.is_ascii_alphabetic() || c == '_');
    let valid_rest = chars.all(|c| c.is_ascii_alphanumeric() || c == '_');
    if !valid_start || !valid_rest || name.len() > 63 {
        return Err(Error::Config(format!(
            "invalid table name {name:?}: use 1 to 63 ASCII letters, digits and underscores, \
             not starting with a digit"
        )));
    }
    Ok(name.to_owned())
}

/// Fills the `{table}` placeholders of a statement.
pub(crate) fn render(sql: &str, table: &str) -> String {
    sql.replace("{table}", table)
}

/// How many times a claim is tried against records that change under it
/// (released, lapsed, purged between two statements) before giving up:
/// far more than any real interleaving needs, few enough to never spin.
pub(crate) const CLAIM_ROUNDS: usize = 64;

/// The error of a claim that did not settle within [`CLAIM_ROUNDS`].
pub(crate) fn unsettled() -> Error {
    Error::store(format!(
        "the claim did not settle after {CLAIM_ROUNDS} rounds: the record kept changing"
    ))
}

/// A connection of the store's own pool for a plain read beside a
/// caller's transaction, or `None` when none comes soon (the pool is
/// exhausted, or holds a single connection the caller has): the caller
/// then goes on to the claim on its own connection, which reads the
/// latest row.
#[cfg(any(feature = "sqlite", feature = "mysql"))]
pub(crate) async fn beside<DB: sqlx::Database>(
    pool: &sqlx::Pool<DB>,
) -> Option<sqlx::pool::PoolConnection<DB>> {
    const SOON: std::time::Duration = std::time::Duration::from_millis(100);
    if pool.options().get_max_connections() <= 1 {
        return None;
    }
    tokio::time::timeout(SOON, pool.acquire()).await.ok()?.ok()
}

/// Milliseconds to bind for a duration (leases, ttls), saturating.
pub(crate) fn millis(d: std::time::Duration) -> Millis {
    crate::record::duration_millis(d)
}

/// A record's columns as a SQL row holds them, before the checks that
/// turn them into a [`Record`]: every backend reads its row into this, so
/// the decoding rules live in one place.
pub(crate) struct StoredRecord {
    pub(crate) scope: String,
    pub(crate) key: String,
    pub(crate) fingerprint: Vec<u8>,
    pub(crate) state: String,
    pub(crate) fence: i64,
    pub(crate) token: Option<Vec<u8>>,
    pub(crate) lease_until: Option<Millis>,
    pub(crate) outcome_kind: Option<i64>,
    pub(crate) outcome: Option<Vec<u8>>,
    pub(crate) created_at: Millis,
    pub(crate) expires_at: Millis,
}

impl StoredRecord {
    /// Checks the columns; a row this library could not have written is a
    /// store error naming what is wrong.
    pub(crate) fn into_record(self) -> Result<Record, Error> {
        let corrupt = |what: &str| Error::store(format!("corrupt idempotency record: {what}"));
        let fingerprint = <[u8; 32]>::try_from(self.fingerprint.as_slice())
            .map(Fingerprint::from_digest)
            .map_err(|_| corrupt("fingerprint is not 32 bytes"))?;
        let state = State::parse(&self.state).ok_or_else(|| corrupt("unknown state"))?;
        let outcome = match (self.outcome_kind, self.outcome) {
            (Some(kind), Some(body)) => Some(Outcome {
                kind: OutcomeKind::from_code(kind)
                    .ok_or_else(|| corrupt("unknown outcome kind"))?,
                body,
            }),
            _ => None,
        };
        let token = self
            .token
            .map(|t| <[u8; 16]>::try_from(t.as_slice()).map(ClaimToken::from_bytes))
            .transpose()
            .map_err(|_| corrupt("claim token is not 16 bytes"))?;
        Ok(Record {
            scope: Scope::from_stored(&self.scope),
            key: Key::new(self.key).map_err(|_| corrupt("invalid key"))?,
            fingerprint,
            state,
            fence: self.fence,
            token,
            lease_until: self.lease_until,
            outcome,
            created_at: self.created_at,
            expires_at: self.expires_at,
        })
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn table_names() {
        assert!(validate_table_name("idem_records").is_ok());
        assert!(validate_table_name("_t1").is_ok());
        assert!(validate_table_name(&"a".repeat(63)).is_ok());
        for bad in [
            "",
            "1abc",
            "a-b",
            "a b",
            "a;drop",
            "a\"b",
            "é",
            &"a".repeat(64),
        ] {
            assert!(validate_table_name(bad).is_err(), "{bad:?}");
        }
    }
}
