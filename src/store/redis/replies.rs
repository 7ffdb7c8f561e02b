//! The scripts' replies: values decoded, and records read from their
//! hash fields.

use redis::Value;

use idem_core::error::Error;
use idem_core::fingerprint::Fingerprint;
use idem_core::key::{Key, Scope};
use idem_core::record::{ClaimToken, Millis, Outcome, OutcomeKind, Record, State};

pub(super) fn corrupt(what: &str) -> Error {
    Error::store(format!("corrupt idempotency record in Redis: {what}"))
}

/// Bytes of a reply value.
pub(super) fn bytes(value: &Value) -> Option<&[u8]> {
    match value {
        Value::BulkString(b) => Some(b),
        Value::SimpleString(s) => Some(s.as_bytes()),
        _ => None,
    }
}

pub(super) fn text(value: &Value) -> Option<&str> {
    bytes(value).and_then(|b| std::str::from_utf8(b).ok())
}

pub(super) fn int(value: &Value) -> Option<i64> {
    match value {
        Value::Int(n) => Some(*n),
        other => text(other)?.parse().ok(),
    }
}

pub(super) fn array(value: Value) -> Result<Vec<Value>, Error> {
    match value {
        Value::Array(items) => Ok(items),
        Value::Nil => Ok(Vec::new()),
        other => Err(Error::store(format!(
            "unexpected reply from an idem script: {other:?}"
        ))),
    }
}

/// `{now, <fields>}`, as `peek` and `look` answer.
pub(super) fn now_and_record(value: Value) -> Result<(Millis, Option<Record>), Error> {
    let mut items = array(value)?.into_iter();
    let now = items
        .next()
        .as_ref()
        .and_then(int)
        .ok_or_else(|| corrupt("no time"))?;
    let fields = array(items.next().unwrap_or(Value::Nil))?;
    Ok((now, parse_record(fields)?))
}

/// A record from its hash fields, as HGETALL lists them; `None` for none.
pub(super) fn parse_record(fields: Vec<Value>) -> Result<Option<Record>, Error> {
    if fields.is_empty() {
        return Ok(None);
    }
    let mut map = std::collections::HashMap::new();
    let mut items = fields.into_iter();
    while let (Some(name), Some(value)) = (items.next(), items.next()) {
        let name = text(&name)
            .ok_or_else(|| corrupt("a field name"))?
            .to_owned();
        map.insert(name, value);
    }
    let field = |name: &str| map.get(name);
    let number = |name: &str| field(name).and_then(int);
    let scope = field("s")
        .and_then(text)
        .ok_or_else(|| corrupt("no scope"))?;
    let key = field("k").and_then(text).ok_or_else(|| corrupt("no key"))?;
    let fingerprint: [u8; 32] = field("fp")
        .and_then(bytes)
        .and_then(|b| b.try_into().ok())
        .ok_or_else(|| corrupt("no fingerprint"))?;
    let state = field("st")
        .and_then(text)
        .and_then(State::parse)
        .ok_or_else(|| corrupt("no state"))?;
    let token: Option<[u8; 16]> = field("tok").and_then(bytes).and_then(|b| b.try_into().ok());
    let outcome = match (field("kind").and_then(int), field("body").and_then(bytes)) {
        (Some(kind), Some(body)) => Some(Outcome {
            kind: OutcomeKind::from_code(kind).ok_or_else(|| corrupt("an outcome kind"))?,
            body: body.to_vec(),
        }),
        _ => None,
    };
    Ok(Some(Record {
        scope: Scope::new(scope),
        key: Key::new(key).map_err(|_| corrupt("an invalid key"))?,
        fingerprint: Fingerprint::from_digest(fingerprint),
        state,
        fence: number("f").ok_or_else(|| corrupt("no fence"))?,
        token: token.map(ClaimToken::from_bytes),
        lease_until: number("lease"),
        outcome,
        created_at: number("c").ok_or_else(|| corrupt("no creation time"))?,
        expires_at: number("exp").ok_or_else(|| corrupt("no expiry"))?,
    }))
}

/// The status word a journal script answers first.
pub(super) fn status(items: &[Value]) -> Result<&str, Error> {
    items
        .first()
        .and_then(text)
        .ok_or_else(|| Error::store("unexpected reply from an idem journal script"))
}
