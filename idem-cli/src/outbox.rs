//! `idem outbox`: the transactional outbox of a SQL store (the table
//! `<records table>_outbox`). How many messages wait to be relayed, which
//! ones are parked (the broker refused them for good) and why, and
//! putting parked ones back once the cause is fixed.

use clap::Subcommand;
use idem::outbox::{Parked, MAX_LEASE_BATCH};
use serde_json::{json, Value};

use crate::failure::Failure;
use crate::open::Target;
use crate::outbox_admin::OutboxAdmin;
use crate::{confirm, emit};

/// How many characters of a text payload the text listing shows.
const SHORT: usize = 80;

/// How many bytes of a text payload the JSON listing carries.
const PREVIEW_BYTES: usize = 512;

#[derive(Subcommand)]
pub(crate) enum OutboxCommand {
    /// Count the messages waiting to be relayed and those parked (the
    /// default)
    Status,
    /// List parked messages, the oldest first: seq, id, topic, key,
    /// payload, attempts, and the broker's reason
    Parked {
        /// Show at most this many
        #[arg(
            long,
            default_value_t = 50,
            value_parser = clap::value_parser!(u32).range(1..=MAX_LEASE_BATCH as i64)
        )]
        limit: u32,
    },
    /// Put parked messages back: they wait to be relayed again, in their
    /// place. Do it once the broker will take them (the topic's size limit
    /// raised, an ACL granted)
    Unpark {
        /// The messages' seq (`#N` in `idem outbox parked`)
        #[arg(required_unless_present = "all", conflicts_with = "all")]
        seqs: Vec<i64>,
        /// Every parked message
        #[arg(long)]
        all: bool,
        /// Do not ask for confirmation
        #[arg(long, short)]
        yes: bool,
    },
}

/// The outbox of `target`, once its table is known to be there.
async fn outbox(target: &Target) -> Result<&dyn OutboxAdmin, Failure> {
    if !target.sql {
        return Err(Failure::Usage(format!(
            "the outbox lives in the SQL stores only (SQLite, PostgreSQL, MySQL/MariaDB), in \
             the database that holds the application's effects: {} has none",
            target.name
        )));
    }
    let outbox = target
        .outbox
        .as_deref()
        .ok_or_else(|| target.missing_records())?;
    if outbox.exists().await? == Some(false) {
        return Err(Failure::MissingTable(format!(
            "{} has no outbox table {:?}: the application's migrate() creates it beside the \
             records table {}, with a version of idem that has the outbox",
            target.name,
            outbox.table(),
            target.records_at
        )));
    }
    Ok(outbox)
}

pub(crate) async fn run(
    target: &Target,
    command: Option<OutboxCommand>,
    json: bool,
) -> Result<(), Failure> {
    let outbox = outbox(target).await?;
    match command.unwrap_or(OutboxCommand::Status) {
        OutboxCommand::Status => status(target, outbox, json).await,
        OutboxCommand::Parked { limit } => parked(outbox, limit as usize, json).await,
        OutboxCommand::Unpark { seqs, all, yes } => {
            if all {
                unpark_all(outbox, yes, json).await
            } else {
                unpark(outbox, &seqs, yes, json).await
            }
        }
    }
}

async fn status(target: &Target, outbox: &dyn OutboxAdmin, json: bool) -> Result<(), Failure> {
    let waiting = outbox.waiting().await?;
    let parked = outbox.parked_count().await?;
    let mut text = vec![
        format!("outbox {:?}  ({})", outbox.table(), target.name),
        format!("  waiting  {waiting:>8}  to be relayed"),
        format!("  parked   {parked:>8}  refused by the broker for good, kept until unparked"),
    ];
    if parked > 0 {
        text.push(
            "  `idem outbox parked` lists them with the broker's reason; `idem outbox \
             unpark` puts them back once the cause is fixed"
                .into(),
        );
    }
    let value = json!({ "table": outbox.table(), "waiting": waiting, "parked": parked });
    emit(json, value, text);
    Ok(())
}

async fn parked(outbox: &dyn OutboxAdmin, limit: usize, json: bool) -> Result<(), Failure> {
    let count = outbox.parked_count().await?;
    let messages = outbox.parked(limit).await?;
    let mut text = Vec::new();
    if messages.is_empty() {
        text.push(format!("outbox {:?}: nothing is parked", outbox.table()));
    } else {
        let shown = if (messages.len() as u64) < count {
            format!(", the oldest {} shown (--limit)", messages.len())
        } else {
            String::new()
        };
        text.push(format!(
            "outbox {:?}: {count} parked message(s){shown}",
            outbox.table()
        ));
        for parked in &messages {
            text.extend(parked_text(parked));
        }
    }
    let value = json!({
        "table": outbox.table(),
        "parked": count,
        "messages": messages.iter().map(parked_json).collect::<Vec<_>>(),
    });
    emit(json, value, text);
    Ok(())
}

async fn unpark(
    outbox: &dyn OutboxAdmin,
    seqs: &[i64],
    yes: bool,
    json: bool,
) -> Result<(), Failure> {
    let mut seqs = seqs.to_vec();
    seqs.sort_unstable();
    seqs.dedup();
    let count = outbox.parked_count().await?;
    let page = outbox.parked(MAX_LEASE_BATCH).await?;
    let found: Vec<&Parked> = seqs
        .iter()
        .filter_map(|seq| page.iter().find(|p| p.message().seq() == *seq))
        .collect();
    // The page holds every parked message: one not in it is not parked.
    if page.len() as u64 >= count && found.len() < seqs.len() {
        let missing: Vec<String> = seqs
            .iter()
            .filter(|seq| !found.iter().any(|p| p.message().seq() == **seq))
            .map(|seq| format!("#{seq}"))
            .collect();
        return Err(Failure::NotFound(format!(
            "not parked in {:?}: {} (relayed, waiting, or never written; `idem outbox parked` \
             lists those that are); nothing was changed",
            outbox.table(),
            missing.join(", ")
        )));
    }
    let listed = seqs
        .iter()
        .map(|seq| format!("#{seq}"))
        .collect::<Vec<_>>()
        .join(", ");
    if !yes {
        for parked in &found {
            for line in parked_text(parked) {
                eprintln!("{line}");
            }
        }
        confirm(&format!(
            "Unpark {} message(s) ({listed})? They wait to be relayed again, in their place: \
             the broker refuses them again unless the cause is fixed.",
            seqs.len()
        ))?;
    }
    let unparked = outbox.unpark(&seqs).await?;
    if unparked == 0 {
        return Err(Failure::NotFound(format!(
            "none of {listed} is parked in {:?} now (unparked or relayed meanwhile); nothing \
             was changed",
            outbox.table()
        )));
    }
    let text = if unparked < seqs.len() as u64 {
        format!(
            "unparked {unparked} of {} message(s) ({listed}): the others were not parked; \
             the unparked wait to be relayed again",
            seqs.len()
        )
    } else {
        format!("unparked {unparked} message(s) ({listed}): they wait to be relayed again")
    };
    emit(
        json,
        json!({ "table": outbox.table(), "unparked": unparked, "seqs": seqs }),
        vec![text],
    );
    Ok(())
}

async fn unpark_all(outbox: &dyn OutboxAdmin, yes: bool, json: bool) -> Result<(), Failure> {
    let count = outbox.parked_count().await?;
    if count == 0 {
        emit(
            json,
            json!({ "table": outbox.table(), "unparked": 0, "seqs": [] }),
            vec![format!(
                "outbox {:?}: nothing is parked, nothing to unpark",
                outbox.table()
            )],
        );
        return Ok(());
    }
    if !yes {
        confirm(&format!(
            "Unpark all {count} parked message(s) of {:?}? They wait to be relayed again, in \
             their place: the broker refuses them again unless the cause is fixed.",
            outbox.table()
        ))?;
    }
    // A page at a time (the oldest first). A message this command
    // unparked that a relay parked again meanwhile is not unparked twice:
    // the broker still refuses it.
    let mut done: Vec<i64> = Vec::new();
    let mut unparked = 0;
    let parked_again = loop {
        let page = outbox.parked(MAX_LEASE_BATCH).await?;
        let seqs: Vec<i64> = page
            .iter()
            .map(|p| p.message().seq())
            .filter(|seq| done.binary_search(seq).is_err())
            .collect();
        if seqs.is_empty() {
            break page.len();
        }
        unparked += outbox.unpark(&seqs).await?;
        done.extend(&seqs);
        done.sort_unstable();
    };
    let mut text = vec![format!(
        "unparked {unparked} message(s) of {:?}: they wait to be relayed again",
        outbox.table()
    )];
    if parked_again > 0 {
        text.push(format!(
            "{parked_again} of them were parked again meanwhile: the broker still refuses them \
             (`idem outbox parked` shows why)"
        ));
    }
    emit(
        json,
        json!({
            "table": outbox.table(),
            "unparked": unparked,
            "seqs": done,
            "parked_again": parked_again,
        }),
        text,
    );
    Ok(())
}

/// Bytes as text for one line, its control characters escaped; `None`
/// where they are not UTF-8.
fn one_line(bytes: &[u8], max_chars: usize) -> Option<String> {
    let text = std::str::from_utf8(bytes).ok()?;
    let mut out = String::new();
    for (n, c) in text.chars().enumerate() {
        if n == max_chars {
            out.push('…');
            break;
        }
        if c.is_control() {
            out.extend(c.escape_default());
        } else {
            out.push(c);
        }
    }
    Some(out)
}

fn hex(bytes: &[u8]) -> String {
    bytes.iter().map(|b| format!("{b:02x}")).collect()
}

/// A message key as text, or as hexadecimal when it is not UTF-8.
fn key_text(key: Option<&[u8]>) -> String {
    match key {
        None => "none".into(),
        Some(key) => match one_line(key, SHORT) {
            Some(text) => text,
            None => format!("0x{}", hex(key)),
        },
    }
}

/// A parked message as text lines.
fn parked_text(parked: &Parked) -> Vec<String> {
    let leased = parked.message();
    let message = leased.message();
    let payload = match message.payload() {
        None => "none (a tombstone)".to_owned(),
        Some(payload) => match one_line(payload, SHORT) {
            Some(text) => format!("{} bytes: {text}", payload.len()),
            None => format!("{} bytes, binary", payload.len()),
        },
    };
    let mut lines = vec![
        format!(
            "  #{:<6} topic {}  key {}  attempts {}",
            leased.seq(),
            message.topic(),
            key_text(message.key()),
            leased.attempts()
        ),
        format!("          id       {}", leased.id()),
        format!("          payload  {payload}"),
    ];
    if !message.headers().is_empty() {
        let names: Vec<&str> = message.headers().iter().map(|(n, _)| n.as_str()).collect();
        lines.push(format!("          headers  {}", names.join(", ")));
    }
    lines.push(format!("          reason   {}", parked.reason()));
    lines
}

/// A parked message as JSON.
fn parked_json(parked: &Parked) -> Value {
    let leased = parked.message();
    let message = leased.message();
    let key = message.key().map(|key| match std::str::from_utf8(key) {
        Ok(text) => json!({ "text": text }),
        Err(_) => json!({ "hex": hex(key) }),
    });
    let payload = message.payload().map(|payload| {
        // Text, cut at a character's boundary; none for binary.
        let preview = std::str::from_utf8(payload).ok().map(|text| {
            let mut end = text.len().min(PREVIEW_BYTES);
            while !text.is_char_boundary(end) {
                end -= 1;
            }
            &text[..end]
        });
        json!({
            "bytes": payload.len(),
            "text_preview": preview,
            "truncated": preview.is_some_and(|p| p.len() < payload.len()),
        })
    });
    json!({
        "seq": leased.seq(),
        "id": leased.id().as_str(),
        "topic": message.topic(),
        "key": key,
        "payload": payload,
        "headers": message.headers().iter().map(|(name, value)| {
            json!([name, String::from_utf8_lossy(value)])
        }).collect::<Vec<_>>(),
        "attempts": leased.attempts(),
        "reason": parked.reason(),
    })
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn one_line_escapes_and_cuts() {
        assert_eq!(one_line(b"{\"a\":1}\n", 80).unwrap(), "{\"a\":1}\\n");
        assert_eq!(one_line("héllo".as_bytes(), 2).unwrap(), "hé…");
        assert_eq!(one_line(&[0xff, 0x00], 80), None);
        assert_eq!(key_text(Some(&[0xff, 0x01])), "0xff01");
        assert_eq!(key_text(None), "none");
    }
}
