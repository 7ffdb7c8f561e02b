//! Records, journal entries and outcomes, as text for a person and as
//! JSON for a script.

use idem::admin::{unrecorded_reason, Stats};
use idem::http::decode_http_response;
use idem::journal::{StepRecord, StepState};
use idem::record::{ClaimToken, Outcome, OutcomeKind, Record, State};
use serde_json::{json, Value};

use crate::time::{relative, rfc3339};

/// How many bytes of a body the text output shows.
const PREVIEW: usize = 512;

fn hex(bytes: &[u8]) -> String {
    bytes.iter().map(|b| format!("{b:02x}")).collect()
}

fn token(token: &ClaimToken) -> String {
    hex(token.as_bytes())
}

/// A time as JSON: RFC 3339, the raw milliseconds, and relative to now.
fn time_json(at: i64, now: i64) -> Value {
    json!({ "rfc3339": rfc3339(at), "millis": at, "relative": relative(at, now) })
}

/// A time as text: `2024-05-01T10:00:00.000Z (in 23 h)`.
fn time_text(at: i64, now: i64) -> String {
    format!("{} ({})", rfc3339(at), relative(at, now))
}

/// What an outcome holds, decoded as far as it can be.
enum Decoded {
    /// The HTTP layer's stored response.
    Http(idem::http::StoredHttpResponse),
    /// The engine's stand-in for a result it could not encode.
    Unrecorded(String),
    /// Entity mode's completed claim: the row is the result.
    Empty,
    /// A JSON value (record mode's codec, and steps').
    Json(Value),
    /// Text that is not JSON.
    Text(String),
    /// Anything else.
    Bytes,
}

fn decode(kind: OutcomeKind, body: &[u8]) -> Decoded {
    let outcome = Outcome {
        kind,
        body: body.to_vec(),
    };
    if let Some(reason) = unrecorded_reason(&outcome) {
        return Decoded::Unrecorded(reason);
    }
    if body.is_empty() {
        return Decoded::Empty;
    }
    // The layer's framing starts with its version, 1 or 2, which no JSON
    // does.
    if matches!(body[0], 1 | 2) {
        if let Ok(response) = decode_http_response(body) {
            return Decoded::Http(response);
        }
    }
    if let Ok(value) = serde_json::from_slice::<Value>(body) {
        return Decoded::Json(value);
    }
    match std::str::from_utf8(body) {
        Ok(text) => Decoded::Text(text.to_owned()),
        Err(_) => Decoded::Bytes,
    }
}

/// The first `PREVIEW` bytes of a body, as text where they are.
fn preview(body: &[u8]) -> String {
    let cut = &body[..body.len().min(PREVIEW)];
    let mut text = match std::str::from_utf8(cut) {
        Ok(text) => text.to_owned(),
        // Cut inside a character, or binary.
        Err(err) if err.valid_up_to() + 4 >= cut.len() && err.valid_up_to() > 0 => {
            String::from_utf8_lossy(&cut[..err.valid_up_to()]).into_owned()
        }
        Err(_) => format!("(binary) {}", hex(&cut[..cut.len().min(64)])),
    };
    if body.len() > cut.len() {
        text.push_str(&format!("… ({} more bytes)", body.len() - cut.len()));
    }
    text
}

fn kind_name(kind: OutcomeKind) -> &'static str {
    match kind {
        OutcomeKind::Ok => "ok",
        OutcomeKind::Err => "replayable error",
    }
}

/// An outcome as JSON.
pub(crate) fn outcome_json(kind: OutcomeKind, body: &[u8]) -> Value {
    let kind_code = match kind {
        OutcomeKind::Ok => "ok",
        OutcomeKind::Err => "err",
    };
    let decoded = match decode(kind, body) {
        Decoded::Http(r) => json!({
            "http_response": {
                "status": r.status,
                "headers": r.headers.iter().map(|(n, v)| json!([n, String::from_utf8_lossy(v)])).collect::<Vec<_>>(),
                "body_bytes": r.body.len(),
                "body_preview": preview(&r.body),
                "body_json": serde_json::from_slice::<Value>(&r.body).ok(),
            }
        }),
        Decoded::Unrecorded(reason) => json!({ "unrecorded": reason }),
        Decoded::Empty => json!({ "empty": true }),
        Decoded::Json(value) => json!({ "json": value }),
        Decoded::Text(text) => json!({ "text": text }),
        Decoded::Bytes => json!({ "hex": hex(body) }),
    };
    json!({ "kind": kind_code, "bytes": body.len(), "decoded": decoded })
}

/// An outcome as indented text lines.
fn outcome_text(kind: OutcomeKind, body: &[u8], indent: &str) -> Vec<String> {
    let head = format!("{}, {} bytes", kind_name(kind), body.len());
    let mut lines = Vec::new();
    match decode(kind, body) {
        Decoded::Http(r) => {
            lines.push(format!("{head}: an HTTP response"));
            lines.push(format!("{indent}status   {}", r.status));
            for (name, value) in &r.headers {
                lines.push(format!(
                    "{indent}header   {name}: {}",
                    String::from_utf8_lossy(value)
                ));
            }
            lines.push(format!(
                "{indent}body     {} bytes: {}",
                r.body.len(),
                preview(&r.body)
            ));
        }
        Decoded::Unrecorded(reason) => lines.push(format!(
            "{head}: no result stored (it could not be encoded: {reason}); replays answer \
             Error::Unrecorded"
        )),
        Decoded::Empty => lines.push(format!(
            "{head}: empty (an entity-mode claim: the row in the entity's table is the result)"
        )),
        Decoded::Json(value) => {
            lines.push(format!("{head}, JSON:"));
            let pretty = serde_json::to_string_pretty(&value).unwrap_or_default();
            let pretty = preview(pretty.as_bytes());
            lines.extend(pretty.lines().map(|l| format!("{indent}{l}")));
        }
        Decoded::Text(text) => lines.push(format!("{head}: {}", preview(text.as_bytes()))),
        Decoded::Bytes => lines.push(format!("{head}: {}", preview(body))),
    }
    lines
}

fn state_name(state: State) -> &'static str {
    match state {
        State::InProgress => "in progress",
        State::Completed => "completed",
    }
}

/// What a record in progress is doing now.
fn progress_text(record: &Record, now: i64) -> Option<String> {
    if record.state != State::InProgress {
        return None;
    }
    Some(match record.lease_until {
        Some(lease) if lease > now => format!(
            "held: its owner's lease runs {} (a duplicate waits, then gets 409)",
            relative(lease, now)
        ),
        _ => "free: its lease ran out (its owner stopped); the next call with this key takes \
              it over"
            .to_owned(),
    })
}

/// A record as JSON.
pub(crate) fn record_json(store: &str, record: &Record, now: i64) -> Value {
    json!({
        "store": store,
        "scope": record.scope.as_str(),
        "key": record.key.as_str(),
        "state": record.state.as_str(),
        "expired": record.expires_at <= now,
        "lease_held": record.holds_lease(now),
        "fence": record.fence,
        "claim_token": record.token.as_ref().map(token),
        "fingerprint": record.fingerprint.to_hex(),
        "created_at": time_json(record.created_at, now),
        "lease_until": record.lease_until.map(|l| time_json(l, now)),
        "expires_at": time_json(record.expires_at, now),
        "outcome": record.outcome.as_ref().map(|o| outcome_json(o.kind, &o.body)),
    })
}

/// A record as text lines.
pub(crate) fn record_text(store: &str, record: &Record, now: i64) -> Vec<String> {
    let mut lines = vec![
        format!(
            "record {:?} / {}  ({store})",
            record.scope.as_str(),
            record.key.as_str()
        ),
        format!("  state        {}", state_name(record.state)),
    ];
    if let Some(progress) = progress_text(record, now) {
        lines.push(format!("               {progress}"));
    }
    lines.push(format!(
        "  claim        fence {}, token {}",
        record.fence,
        record
            .token
            .as_ref()
            .map(token)
            .unwrap_or_else(|| "none".into())
    ));
    lines.push(format!("  fingerprint  {}", record.fingerprint.to_hex()));
    lines.push(format!(
        "  created      {}",
        time_text(record.created_at, now)
    ));
    if let Some(lease) = record.lease_until {
        lines.push(format!("  lease until  {}", time_text(lease, now)));
    }
    let expiry = if record.expires_at <= now {
        format!(
            "{} (expired {}: the key is free, purge removes it)",
            rfc3339(record.expires_at),
            relative(record.expires_at, now)
        )
    } else {
        format!(
            "{} (expires {})",
            rfc3339(record.expires_at),
            relative(record.expires_at, now)
        )
    };
    lines.push(format!("  expires      {expiry}"));
    if let Some(outcome) = &record.outcome {
        let mut outcome =
            outcome_text(outcome.kind, &outcome.body, "                 ").into_iter();
        if let Some(first) = outcome.next() {
            lines.push(format!("  outcome      {first}"));
        }
        lines.extend(outcome);
    }
    lines
}

/// Whether a started step's attempt is still running: its record is in
/// progress under the same claim with a live lease.
fn step_running(step: &StepRecord, record: Option<&Record>, now: i64) -> bool {
    record.is_some_and(|r| r.token == Some(step.token) && r.holds_lease(now))
}

/// A step's condition in words, for a person.
fn step_condition(step: &StepRecord, record: Option<&Record>, now: i64) -> &'static str {
    if step.expires_at <= now {
        return "expired";
    }
    match step.state {
        StepState::Completed => "completed",
        StepState::RerunAllowed => "rerun allowed",
        StepState::Started if step_running(step, record, now) => "running",
        StepState::Started => "IN DOUBT",
    }
}

/// A journal entry as JSON.
pub(crate) fn step_json(
    store: &str,
    step: &StepRecord,
    record: Option<&Record>,
    now: i64,
) -> Value {
    json!({
        "store": store,
        "scope": step.scope.as_str(),
        "key": step.key.as_str(),
        "seq": step.seq,
        "name": step.name,
        "state": step.state.as_str(),
        "in_doubt": step.state == StepState::Started && step.expires_at > now && !step_running(step, record, now),
        "claim_token": token(&step.token),
        "fingerprint": step.fingerprint.to_hex(),
        "updated_at": time_json(step.updated_at, now),
        "expires_at": time_json(step.expires_at, now),
        "output": step.output.as_ref().map(|o| outcome_json(OutcomeKind::Ok, o)),
    })
}

/// A journal as text lines.
pub(crate) fn steps_text(
    store: &str,
    steps: &[StepRecord],
    record: Option<&Record>,
    now: i64,
) -> Vec<String> {
    let Some(first) = steps.first() else {
        return Vec::new();
    };
    let mut lines = vec![format!(
        "steps of {:?} / {}  ({store})",
        first.scope.as_str(),
        first.key.as_str()
    )];
    for step in steps {
        lines.push(format!(
            "  #{:<3} {:<20} {:<14} updated {}",
            step.seq,
            step.name,
            step_condition(step, record, now),
            time_text(step.updated_at, now)
        ));
        if let Some(output) = &step.output {
            for line in outcome_text(OutcomeKind::Ok, output, "                ") {
                lines.push(format!("        output {line}"));
            }
        }
        if step_condition(step, record, now) == "IN DOUBT" {
            lines.push(format!(
                "        its attempt is gone without an outcome; settle it with `idem resolve {:?} {} {} --output <json>` or `--rerun`",
                step.scope.as_str(),
                step.key.as_str(),
                step.seq
            ));
        }
    }
    lines
}

/// Stats as JSON.
pub(crate) fn stats_json(store: &str, stats: &Stats) -> Value {
    json!({
        "store": store,
        "now": time_json(stats.now, stats.now),
        "scopes": stats.scopes.iter().map(|s| json!({
            "scope": s.scope,
            "in_progress": s.in_progress,
            "completed": s.completed,
            "expired": s.expired,
        })).collect::<Vec<_>>(),
        "steps": {
            "started": stats.steps.started,
            "completed": stats.steps.completed,
            "rerun_allowed": stats.steps.rerun_allowed,
            "expired": stats.steps.expired,
        },
        "oldest_in_progress": stats.oldest_in_progress.as_ref().map(|r| record_json(store, r, stats.now)),
    })
}

/// Stats as text lines.
pub(crate) fn stats_text(store: &str, stats: &Stats) -> Vec<String> {
    let mut lines = vec![format!("{store}: {} scope(s)", stats.scopes.len())];
    if !stats.scopes.is_empty() {
        lines.push(format!(
            "  {:>11} {:>11} {:>9}  scope",
            "in progress", "completed", "expired"
        ));
    }
    for s in &stats.scopes {
        lines.push(format!(
            "  {:>11} {:>11} {:>9}  {}",
            s.in_progress, s.completed, s.expired, s.scope
        ));
    }
    let steps = &stats.steps;
    lines.push(format!(
        "  journal: {} started (running or in doubt), {} completed, {} rerun allowed, {} expired",
        steps.started, steps.completed, steps.rerun_allowed, steps.expired
    ));
    match &stats.oldest_in_progress {
        Some(r) => lines.push(format!(
            "  oldest in progress: {:?} / {}, claimed {}{}",
            r.scope.as_str(),
            r.key.as_str(),
            time_text(r.created_at, stats.now),
            progress_text(r, stats.now)
                .map(|p| format!("; {p}"))
                .unwrap_or_default()
        )),
        None => lines.push("  nothing in progress".into()),
    }
    lines
}
