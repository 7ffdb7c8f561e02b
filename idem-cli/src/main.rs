//! `idem`: the operator's tool for idem's stores. See README.md.

mod failure;
mod open;
mod outbox;
mod outbox_admin;
mod show;
mod time;

use std::io::{BufRead, IsTerminal, Write};
use std::process::ExitCode;

use clap::{Args, Parser, Subcommand};
use idem::admin::Inventory;
use idem::journal::{StepAt, StepRecord, StepResolution, StepState};
use idem::record::Record;
use idem::{Key, Scope};
use serde_json::{json, Value};

use crate::failure::Failure;
use crate::open::{open, Target};

/// Inspect, settle, forget and purge idempotency records on any idem store;
/// look at and unpark the messages of a SQL store's outbox.
///
/// Exit codes: 0 done; 1 store error; 2 invalid arguments (or a command
/// the store has nothing for, as `outbox` on Redis); 3 invalid URL; 4
/// store unreachable; 5 no idem table; 6 not found; 7 not confirmed; 8
/// refused (the step is not in doubt).
#[derive(Parser)]
#[command(name = "idem", version, max_term_width = 100)]
struct Cli {
    /// The store: sqlite://PATH, postgres://..., mysql://... or
    /// mariadb://..., redis://HOST:PORT, redis+cluster://HOST:PORT[,HOST:PORT...]
    #[arg(long, env = "IDEM_URL", global = true)]
    url: Option<String>,

    /// The records table of a SQL store (default idem_records)
    #[arg(long, global = true)]
    table: Option<String>,

    /// The key prefix of a Redis store (default idem)
    #[arg(long, global = true)]
    prefix: Option<String>,

    /// Print JSON, for scripts
    #[arg(long, global = true)]
    json: bool,

    #[command(subcommand)]
    command: Command,
}

#[derive(Subcommand)]
enum Command {
    /// Show a record: its state, times, fingerprint, claim and outcome;
    /// its step journal; and every other record under the same key
    Inspect(ScopedKey),
    /// Show everything behind a key, in any scope: the layer's record,
    /// records of #[idempotent] fns, entity-mode claims, step journals
    Find {
        /// The idempotency key (or entity token)
        key: String,
    },
    /// List the step journal of an operation
    Steps(ScopedKey),
    /// Settle a step in doubt: with its output (the next attempt replays
    /// it), or by allowing the next attempt to run it again
    Resolve {
        #[command(flatten)]
        at: ScopedKey,
        /// The step's place in the operation (`#N` in `idem steps`)
        seq: u32,
        /// The step's output, as JSON: its effect happened with this result
        #[arg(long, conflicts_with = "rerun", required_unless_present = "rerun")]
        output: Option<String>,
        /// Its effect did not happen: the next attempt runs it again (with
        /// the same derived key)
        #[arg(long)]
        rerun: bool,
        /// Do not ask for confirmation
        #[arg(long, short)]
        yes: bool,
    },
    /// Delete a record and its step journal, whatever its state: the next
    /// call with the key runs again from its first step
    Forget {
        #[command(flatten)]
        at: ScopedKey,
        /// Do not ask for confirmation
        #[arg(long, short)]
        yes: bool,
    },
    /// Delete every expired record and journal entry
    Purge {
        /// At most this many rows per statement
        #[arg(long, default_value_t = 500, value_parser = clap::value_parser!(u32).range(1..))]
        batch: u32,
    },
    /// Count records by scope and state, journal entries by state, and
    /// show the oldest record in progress
    Stats,
    /// The transactional outbox (SQL stores): count the messages waiting
    /// and parked, list the parked ones, unpark them
    Outbox {
        #[command(subcommand)]
        command: Option<outbox::OutboxCommand>,
    },
}

#[derive(Args)]
struct ScopedKey {
    /// The scope: `module::path::fn_name` for #[idempotent] (or its
    /// `scope = ...`), `METHOD /route` for the HTTP layer, plus
    /// "\n<principal>" where one is set; `idem.entity.<table>` for an
    /// entity-mode claim
    scope: String,
    /// The idempotency key (or entity token)
    key: String,
}

impl ScopedKey {
    fn parse(&self) -> Result<(Scope, Key), Failure> {
        let key = Key::new(self.key.as_str())
            .map_err(|e| Failure::Usage(format!("invalid key {:?}: {e}", self.key)))?;
        Ok((Scope::from_stored(&self.scope), key))
    }
}

fn main() -> ExitCode {
    let cli = Cli::parse();
    let runtime = match tokio::runtime::Builder::new_multi_thread()
        .worker_threads(2)
        .enable_all()
        .build()
    {
        Ok(runtime) => runtime,
        Err(err) => {
            eprintln!("idem: cannot start: {err}");
            return ExitCode::FAILURE;
        }
    };
    match runtime.block_on(run(cli)) {
        Ok(()) => ExitCode::SUCCESS,
        Err(failure) => {
            eprintln!("idem: {failure}");
            failure.exit_code()
        }
    }
}

/// Prints JSON or text lines.
fn emit(json: bool, value: Value, text: Vec<String>) {
    let mut out = std::io::stdout().lock();
    let _ = if json {
        writeln!(
            out,
            "{}",
            serde_json::to_string_pretty(&value).unwrap_or_default()
        )
    } else {
        writeln!(out, "{}", text.join("\n"))
    };
}

async fn run(cli: Cli) -> Result<(), Failure> {
    let url = cli.url.as_deref().ok_or_else(|| {
        Failure::Usage(
            "no store: give --url (or set IDEM_URL), for example --url sqlite://app.db".into(),
        )
    })?;
    let target = open(url, cli.table.as_deref(), cli.prefix.as_deref()).await?;
    let json = cli.json;
    match cli.command {
        Command::Inspect(at) => inspect(&target, &at, json).await,
        Command::Find { key } => find(&target, &key, json).await,
        Command::Steps(at) => steps(&target, &at, json).await,
        Command::Resolve {
            at,
            seq,
            output,
            rerun,
            yes,
        } => resolve(&target, &at, seq, output, rerun, yes, json).await,
        Command::Forget { at, yes } => forget(&target, &at, yes, json).await,
        Command::Purge { batch } => purge(&target, batch as usize, json).await,
        Command::Stats => stats(&target, json).await,
        Command::Outbox { command } => outbox::run(&target, command, json).await,
    }
}

/// The journals of `(scope, key)` in every store of the target, each
/// with its store's name and the record its attempts hold.
async fn journals(
    target: &Target,
    scope: &Scope,
    key: &Key,
) -> Result<Vec<(&'static str, Vec<StepRecord>, Option<Record>)>, Failure> {
    let mut found = Vec::new();
    for (name, store) in target.stores() {
        let steps = journal(store)?.steps(scope, key).await?;
        if !steps.is_empty() {
            // Entity mode journals under the operation's scope, and
            // claims under `idem.entity.<table>`: its attempt's record
            // is the claim with the same token.
            let record = match store.get(scope, key).await? {
                Some(record) => Some(record),
                None => store
                    .records_with_key(key)
                    .await?
                    .into_iter()
                    .find(|r| steps.iter().any(|s| Some(s.token) == r.token)),
            };
            found.push((name, steps, record));
        }
    }
    Ok(found)
}

async fn now(target: &Target) -> Result<i64, Failure> {
    let (_, store) = target.stores()[0];
    Ok(store.now().await?)
}

async fn inspect(target: &Target, at: &ScopedKey, json: bool) -> Result<(), Failure> {
    let (scope, key) = at.parse()?;
    let now = now(target).await?;
    let store = target.store_for(scope.as_str());
    let record = match store {
        Some(store) => store.get(&scope, &key).await?,
        None => None,
    };
    let journals = journals(target, &scope, &key).await?;
    let mut others = Vec::new();
    for (name, store) in target.stores() {
        for other in store.records_with_key(&key).await? {
            if other.scope != scope {
                others.push((name, other));
            }
        }
    }
    if record.is_none() && journals.is_empty() {
        let mut message = format!(
            "no record and no step journal for key {:?} in scope {:?} ({})",
            key.as_str(),
            scope.as_str(),
            target.name
        );
        if others.is_empty() {
            message.push_str(": nothing is stored under this key in any scope either");
        } else {
            message.push_str("; under this key in other scopes:");
            for (_, other) in &others {
                message.push_str(&format!("\n  {:?}", other.scope.as_str()));
            }
        }
        return Err(Failure::NotFound(message));
    }
    let store_name = |s: &str| {
        if s.starts_with(idem::admin::ENTITY_CLAIMS_SCOPE_PREFIX) {
            "entity_claims"
        } else {
            "records"
        }
    };
    let mut text = Vec::new();
    match &record {
        Some(r) => text.extend(show::record_text(store_name(scope.as_str()), r, now)),
        None => text.push(format!(
            "no record for {:?} / {} (its steps are journaled below)",
            scope.as_str(),
            key.as_str()
        )),
    }
    for (name, steps, holder) in &journals {
        text.push(String::new());
        text.extend(show::steps_text(name, steps, holder.as_ref(), now));
    }
    if !others.is_empty() {
        text.push(String::new());
        text.push(format!("also under key {}:", key.as_str()));
        for (name, other) in &others {
            text.extend(show::record_text(name, other, now));
        }
    }
    let value = json!({
        "now": crate::time::rfc3339(now),
        "record": record.as_ref().map(|r| show::record_json(store_name(scope.as_str()), r, now)),
        "steps": journals.iter().flat_map(|(name, steps, holder)| {
            steps.iter().map(move |s| show::step_json(name, s, holder.as_ref(), now))
        }).collect::<Vec<_>>(),
        "other_records": others.iter().map(|(name, r)| show::record_json(name, r, now)).collect::<Vec<_>>(),
    });
    emit(json, value, text);
    Ok(())
}

async fn find(target: &Target, key: &str, json: bool) -> Result<(), Failure> {
    let key = Key::new(key).map_err(|e| Failure::Usage(format!("invalid key {key:?}: {e}")))?;
    let now = now(target).await?;
    let mut records = Vec::new();
    let mut steps = Vec::new();
    for (name, store) in target.stores() {
        let found = store.records_with_key(&key).await?;
        let journal = store.steps_with_key(&key).await?;
        for step in journal {
            let holder = found.iter().find(|r| r.token == Some(step.token)).cloned();
            steps.push((name, step, holder));
        }
        records.extend(found.into_iter().map(|r| (name, r)));
    }
    if records.is_empty() && steps.is_empty() {
        return Err(Failure::NotFound(format!(
            "nothing is stored under key {:?} in any scope ({}, {})",
            key.as_str(),
            target.name,
            target.records_at
        )));
    }
    let mut text = Vec::new();
    for (name, record) in &records {
        text.extend(show::record_text(name, record, now));
        text.push(String::new());
    }
    // One block per journal: by store, then scope.
    let mut at = 0;
    while at < steps.len() {
        let (name, first, holder) = &steps[at];
        let end = steps[at..]
            .iter()
            .position(|(n, s, _)| n != name || s.scope != first.scope)
            .map_or(steps.len(), |p| at + p);
        let block: Vec<StepRecord> = steps[at..end].iter().map(|(_, s, _)| s.clone()).collect();
        let holder = holder
            .clone()
            .or_else(|| steps[at..end].iter().find_map(|(_, _, h)| h.clone()));
        text.extend(show::steps_text(name, &block, holder.as_ref(), now));
        text.push(String::new());
        at = end;
    }
    while text.last().is_some_and(String::is_empty) {
        text.pop();
    }
    let value = json!({
        "now": crate::time::rfc3339(now),
        "key": key.as_str(),
        "records": records.iter().map(|(n, r)| show::record_json(n, r, now)).collect::<Vec<_>>(),
        "steps": steps.iter().map(|(n, s, h)| show::step_json(n, s, h.as_ref(), now)).collect::<Vec<_>>(),
    });
    emit(json, value, text);
    Ok(())
}

async fn steps(target: &Target, at: &ScopedKey, json: bool) -> Result<(), Failure> {
    let (scope, key) = at.parse()?;
    let now = now(target).await?;
    let journals = journals(target, &scope, &key).await?;
    if journals.is_empty() {
        return Err(Failure::NotFound(format!(
            "no step journal for key {:?} in scope {:?} ({}): the operation ran no step, or \
             its entries expired (`idem find {}` shows what the key holds)",
            key.as_str(),
            scope.as_str(),
            target.name,
            key.as_str()
        )));
    }
    let mut text = Vec::new();
    for (name, steps, holder) in &journals {
        text.extend(show::steps_text(name, steps, holder.as_ref(), now));
    }
    let value = json!({
        "now": crate::time::rfc3339(now),
        "steps": journals.iter().flat_map(|(name, steps, holder)| {
            steps.iter().map(move |s| show::step_json(name, s, holder.as_ref(), now))
        }).collect::<Vec<_>>(),
    });
    emit(json, value, text);
    Ok(())
}

/// Asks `question` on standard error and reads the answer from standard
/// input: done only on `y` or `yes`.
fn confirm(question: &str) -> Result<(), Failure> {
    eprint!("{question} [y/N] ");
    let _ = std::io::stderr().flush();
    let mut answer = String::new();
    let read = std::io::stdin().lock().read_line(&mut answer);
    match read {
        Ok(0) | Err(_) => Err(Failure::Declined(format!(
            "not confirmed: no answer on standard input{}; pass --yes to skip the question",
            if std::io::stdin().is_terminal() {
                ""
            } else {
                " (it is not a terminal)"
            }
        ))),
        Ok(_) if matches!(answer.trim().to_ascii_lowercase().as_str(), "y" | "yes") => Ok(()),
        Ok(_) => Err(Failure::Declined(
            "not confirmed: nothing was changed".into(),
        )),
    }
}

async fn resolve(
    target: &Target,
    at: &ScopedKey,
    seq: u32,
    output: Option<String>,
    rerun: bool,
    yes: bool,
    json: bool,
) -> Result<(), Failure> {
    let (scope, key) = at.parse()?;
    let resolution = match output {
        Some(output) => {
            let value: Value = serde_json::from_str(&output).map_err(|e| {
                Failure::Usage(format!(
                    "--output must be the step's output as JSON (its codec's form): {e}; a \
                     string is quoted, as --output '\"ch_123\"'"
                ))
            })?;
            StepResolution::Completed(serde_json::to_vec(&value).unwrap_or_default())
        }
        None if rerun => StepResolution::Rerun,
        None => return Err(Failure::Usage("give --output <json> or --rerun".into())),
    };
    let now = now(target).await?;
    let journals = journals(target, &scope, &key).await?;
    let found = journals.iter().find_map(|(name, steps, holder)| {
        steps
            .iter()
            .find(|s| s.seq == seq)
            .map(|s| (*name, s, holder.as_ref()))
    });
    let Some((name, step, holder)) = found else {
        return Err(Failure::NotFound(format!(
            "no step #{seq} in the journal of key {:?} in scope {:?}: `idem steps` lists it",
            key.as_str(),
            scope.as_str()
        )));
    };
    let refused = |why: String| {
        Err(Failure::Refused(format!(
            "step #{seq} ({:?}) is not in doubt: {why}; nothing was changed",
            step.name
        )))
    };
    match step.state {
        StepState::Completed => return refused("it is completed, its output journaled".into()),
        StepState::RerunAllowed if rerun => {
            return refused("a rerun is allowed already".into());
        }
        _ if step.expires_at <= now => return refused("its entry expired".into()),
        StepState::Started
            if holder.is_some_and(|r| r.token == Some(step.token) && r.holds_lease(now)) =>
        {
            return refused(format!(
                "its attempt still runs (its lease runs until {})",
                holder
                    .and_then(|r| r.lease_until)
                    .map(crate::time::rfc3339)
                    .unwrap_or_default()
            ));
        }
        _ => {}
    }
    let store = target
        .stores()
        .into_iter()
        .find(|(n, _)| *n == name)
        .map(|(_, s)| s)
        .ok_or_else(|| target.missing_records())?;
    let what = match &resolution {
        StepResolution::Completed(_) => format!(
            "Settle step #{seq} ({:?}) of {:?} / {} as completed with output {}? The next \
             attempt replays it without calling the downstream.",
            step.name,
            scope.as_str(),
            key.as_str(),
            output_shown(&resolution)
        ),
        StepResolution::Rerun => format!(
            "Allow step #{seq} ({:?}) of {:?} / {} to run again? The next attempt calls the \
             downstream again, with the same derived key.",
            step.name,
            scope.as_str(),
            key.as_str()
        ),
    };
    if !yes {
        confirm(&what)?;
    }
    if !journal(store)?
        .resolve_step(
            &StepAt {
                scope: &scope,
                key: &key,
                seq,
                name: &step.name,
            },
            &resolution,
        )
        .await?
    {
        return refused(
            "the store refused the resolution: the step changed meanwhile (an attempt runs it, \
             or it completed)"
                .into(),
        );
    }
    let done = match resolution {
        StepResolution::Completed(_) => "completed",
        StepResolution::Rerun => "rerun_allowed",
    };
    emit(
        json,
        json!({ "resolved": true, "scope": scope.as_str(), "key": key.as_str(), "seq": seq, "name": step.name, "state": done }),
        vec![format!(
            "step #{seq} ({:?}) of {:?} / {} is now {}",
            step.name,
            scope.as_str(),
            key.as_str(),
            done.replace('_', " ")
        )],
    );
    Ok(())
}

fn output_shown(resolution: &StepResolution) -> String {
    match resolution {
        StepResolution::Completed(output) => String::from_utf8_lossy(output).into_owned(),
        StepResolution::Rerun => String::new(),
    }
}

async fn forget(target: &Target, at: &ScopedKey, yes: bool, json: bool) -> Result<(), Failure> {
    let (scope, key) = at.parse()?;
    let store = target.store_for(scope.as_str()).ok_or_else(|| {
        if scope
            .as_str()
            .starts_with(idem::admin::ENTITY_CLAIMS_SCOPE_PREFIX)
        {
            Failure::MissingTable(format!(
                "{} has no entity-mode claims table {:?}",
                target.name,
                idem::admin::ENTITY_CLAIMS_TABLE
            ))
        } else {
            target.missing_records()
        }
    })?;
    let now = store.now().await?;
    let record = store.get(&scope, &key).await?;
    let steps = journal(store)?.steps(&scope, &key).await?;
    let Some(record) = record else {
        if steps.is_empty() {
            return Err(Failure::NotFound(format!(
                "no record for key {:?} in scope {:?} ({}): nothing to forget (`idem find {}` \
                 shows what the key holds)",
                key.as_str(),
                scope.as_str(),
                target.name,
                key.as_str()
            )));
        }
        return forget_confirmed(store, &scope, &key, None, steps.len(), yes, json).await;
    };
    if !yes {
        for line in show::record_text("", &record, now) {
            eprintln!("{line}");
        }
    }
    forget_confirmed(store, &scope, &key, Some(&record), steps.len(), yes, json).await
}

async fn forget_confirmed(
    store: &dyn Inventory,
    scope: &Scope,
    key: &Key,
    record: Option<&Record>,
    steps: usize,
    yes: bool,
    json: bool,
) -> Result<(), Failure> {
    if !yes {
        let warning = match record {
            Some(r) if r.state == idem::record::State::InProgress => {
                " It is IN PROGRESS: forget it only if its owner is gone, or its body may run \
                 twice."
            }
            _ => "",
        };
        confirm(&format!(
            "Forget key {:?} in scope {:?}{}? Its next call runs again from its first step.{warning}",
            key.as_str(),
            scope.as_str(),
            if steps > 0 {
                format!(" and its {steps} journaled step(s)")
            } else {
                String::new()
            }
        ))?;
    }
    let had_record = store.forget(scope, key).await?;
    emit(
        json,
        json!({ "forgotten": true, "scope": scope.as_str(), "key": key.as_str(), "had_record": had_record, "steps": steps }),
        vec![format!(
            "forgot key {} in scope {:?}{}: its next call runs again",
            key.as_str(),
            scope.as_str(),
            if steps > 0 {
                format!(" (and {steps} journaled step(s))")
            } else {
                String::new()
            }
        )],
    );
    Ok(())
}

/// The step journal of `store`: every store the tool opens keeps one.
fn journal(store: &dyn Inventory) -> Result<&dyn idem::store::Journal, idem::Error> {
    store
        .journal()
        .ok_or_else(|| idem::Error::Config("this store keeps no step journal".into()))
}

async fn purge(target: &Target, batch: usize, json: bool) -> Result<(), Failure> {
    let mut results = Vec::new();
    for (name, store) in target.stores() {
        if store.capabilities().deletes_expired_itself {
            results.push((name, 0, true));
            continue;
        }
        let stats = store.stats().await?;
        let expired: u64 =
            stats.scopes.iter().map(|s| s.expired).sum::<u64>() + stats.steps.expired;
        // A bar only where it has something to show: more than one batch.
        let bar = if expired > batch as u64 && !json {
            let bar = indicatif::ProgressBar::new(expired);
            bar.set_style(
                indicatif::ProgressStyle::with_template(
                    "{msg} [{bar:30}] {pos}/{len} ({eta} left)",
                )
                .unwrap_or_else(|_| indicatif::ProgressStyle::default_bar())
                .progress_chars("=> "),
            );
            bar.set_message(format!("purging {name}"));
            Some(bar)
        } else {
            None
        };
        let progress = |deleted: u64| {
            if let Some(bar) = &bar {
                bar.inc(deleted);
            }
        };
        let deleted = store.purge_expired_reporting(batch, &progress).await?;
        if let Some(bar) = bar {
            bar.finish_and_clear();
        }
        results.push((name, deleted, false));
    }
    let text = results
        .iter()
        .map(|(name, deleted, itself)| {
            if *itself {
                format!("{name}: Redis deletes expired records itself; nothing to purge")
            } else {
                format!("{name}: purged {deleted} expired record(s) and journal entries")
            }
        })
        .collect();
    let value = json!({
        "purged": results.iter().map(|(name, deleted, itself)| json!({
            "store": name, "deleted": deleted, "deletes_expired_itself": itself,
        })).collect::<Vec<_>>(),
    });
    emit(json, value, text);
    Ok(())
}

async fn stats(target: &Target, json: bool) -> Result<(), Failure> {
    let mut text = Vec::new();
    let mut values = Vec::new();
    for (name, store) in target.stores() {
        let stats = store.stats().await?;
        if !text.is_empty() {
            text.push(String::new());
        }
        text.extend(show::stats_text(name, &stats));
        values.push(show::stats_json(name, &stats));
    }
    emit(json, json!({ "stores": values }), text);
    Ok(())
}
