//! What a backend's statements are for, and the order in which their
//! placeholders are bound: on the records table ([`Statements`]), the
//! step journal ([`StepStatements`]), the outbox ([`OutboxStatements`])
//! and an operator's inventory ([`InventoryStatements`]). The text of
//! each is its backend's, in `<backend>/sql.rs`; this file holds none.
//!
//! Placeholders are written as the backend numbers them: SQLite's `?N`
//! and PostgreSQL's `$N` may repeat a value, MySQL's `?` are bound in
//! order. In the text, `{table}` is the records table and `{now}` the
//! database's clock ([`Dialect::NOW`](super::dialect::Dialect::NOW)),
//! filled in when a store is made.
#![allow(unreachable_pub)] // named by the sealed `Dialect`, so `pub`; unnameable outside

/// What a placeholder is bound to.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Param {
    Scope,
    Key,
    Fingerprint,
    Token,
    /// The lease, in milliseconds.
    Lease,
    /// The time to keep the record, in milliseconds.
    Ttl,
    OutcomeKind,
    Outcome,
    /// How many rows a purge deletes at most.
    Batch,
}

/// One statement and its placeholders' values, in order.
#[derive(Debug)]
pub struct Statement {
    pub sql: String,
    pub params: &'static [Param],
}

impl Statement {
    /// `sql` with `{table}` and `{now}` filled in.
    pub fn new(sql: &str, table: &str, now: &str, params: &'static [Param]) -> Self {
        Statement {
            sql: filled(sql, table, now),
            params,
        }
    }
}

/// `sql` with `{table}` (the records table's name) and `{now}` (the
/// database's clock) filled in, sent as written.
pub(crate) fn filled(sql: &str, table: &str, now: &str) -> String {
    sql.replace("{table}", table).replace("{now}", now)
}

/// `sql` written over several lines, sent on one: each line break and the
/// indentation after it become one space. Then as [`filled`].
pub(crate) fn filled_on_one_line(sql: &str, table: &str, now: &str) -> String {
    let one_line = sql
        .lines()
        .map(str::trim_start)
        .collect::<Vec<_>>()
        .join(" ");
    filled(&one_line, table, now)
}

/// The statements a backend writes in `<backend>/sql.rs`.
pub trait RecordsSql {
    /// The statements on the records table `table`, and the journal's
    /// beside it ([`JournalSql`]).
    fn statements(table: String) -> Statements;
}

/// The statements a backend writes in `<backend>/sql.rs`.
pub trait JournalSql {
    /// The statements on the journal beside the records table `table`.
    fn journal(table: &str) -> StepStatements;
}

/// The statements a backend writes in `<backend>/sql.rs`.
pub trait OutboxSql {
    /// The statements on the outbox beside the records table `table`.
    fn outbox(table: &str) -> OutboxStatements;
}

/// The statements a backend writes in `<backend>/sql.rs`.
pub trait InventorySql {
    /// The statements of an operator's inventory of the records table
    /// `table` and its journal.
    fn inventory(table: &str) -> InventoryStatements;
}

/// The journal table of the records table `table`.
pub(crate) fn steps_table(table: &str) -> String {
    format!("{table}_steps")
}

/// The outbox table of the records table `table`.
pub(crate) fn outbox_table(table: &str) -> String {
    format!("{table}_outbox")
}

/// What a claim statement answers.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum ClaimReturns {
    /// The fence when it claimed, no row when the key is taken (the
    /// record is then read with [`Statements::claimed`]).
    Fence,
    /// The record as the claim left it (the caller's own, or the one that
    /// holds the key) and `db_now`, in one round trip; no row only where
    /// the record is not visible to the statement yet (read it then).
    Record,
}

/// A backend's statements on one records table.
///
/// Every one that reads a record selects its columns and `db_now`, the
/// database's clock; every fenced write names the claim's token.
#[derive(Debug)]
pub struct Statements {
    pub table: String,
    /// Claims a free key; answers as `claim_returns` says.
    pub claim: Statement,
    pub claim_returns: ClaimReturns,
    /// The claim without `RETURNING`, for a server that refuses it (MySQL
    /// has no `INSERT ... RETURNING`; MariaDB has since 10.5): it returns
    /// nothing.
    pub claim_without_returning: Option<Statement>,
    /// Set once the server refused the claim's `RETURNING`.
    pub returning_refused: std::sync::atomic::AtomicBool,
    /// The record read after a claim: a plain read, or a locking one where
    /// the claim ran inside a snapshot (MySQL).
    pub claimed: Statement,
    /// Takes over a free record the claim did not (PostgreSQL's claim only
    /// inserts); returns the fence.
    pub take_over: Option<Statement>,
    /// The record, by scope and key, with a plain read.
    pub select: Statement,
    /// The record as a duplicate sees it when it starts to wait (by scope
    /// and key): the plain read, or one that also marks the record waited
    /// on (PostgreSQL).
    pub look: Statement,
    pub renew: Statement,
    pub complete: Statement,
    pub release: Statement,
    /// Deletes the record whatever its state (an operator's forget).
    pub forget: Statement,
    pub purge: Statement,
    /// The step journal's statements.
    pub steps: StepStatements,
}

/// The SQL of a backend whose placeholders are numbered (`?N`, `$N`) in
/// one layout, shared by SQLite and PostgreSQL:
///
/// - claim and take-over: scope, key, fingerprint, token, lease, ttl;
/// - select: scope, key;
/// - renew: scope, key, token, lease;
/// - complete: outcome kind, outcome, ttl, scope, key, token;
/// - release: scope, key, token;
/// - forget: scope, key;
/// - purge: batch.
#[cfg(any(feature = "sqlite", feature = "postgres"))]
pub struct Numbered {
    pub claim: &'static str,
    pub take_over: Option<&'static str>,
    pub select: &'static str,
    pub look: Option<&'static str>,
    pub renew: &'static str,
    pub complete: &'static str,
    pub release: &'static str,
    pub forget: &'static str,
    pub purge: &'static str,
}

#[cfg(any(feature = "sqlite", feature = "postgres"))]
impl Numbered {
    /// The statements on `table`, with `now` as the database's clock. The
    /// claim answers as `claim_returns` says; the record is read back with
    /// a plain read.
    pub fn on(
        &self,
        table: String,
        now: &str,
        claim_returns: ClaimReturns,
        steps: StepStatements,
    ) -> Statements {
        use Param::*;
        const CLAIM: &[Param] = &[Scope, Key, Fingerprint, Token, Lease, Ttl];
        let s = |sql: &str, params: &'static [Param]| Statement::new(sql, &table, now, params);
        Statements {
            claim: s(self.claim, CLAIM),
            claim_returns,
            claim_without_returning: None,
            returning_refused: Default::default(),
            claimed: s(self.select, &[Scope, Key]),
            take_over: self.take_over.map(|sql| s(sql, CLAIM)),
            select: s(self.select, &[Scope, Key]),
            look: s(self.look.unwrap_or(self.select), &[Scope, Key]),
            renew: s(self.renew, &[Scope, Key, Token, Lease]),
            complete: s(
                self.complete,
                &[OutcomeKind, Outcome, Ttl, Scope, Key, Token],
            ),
            release: s(self.release, &[Scope, Key, Token]),
            forget: s(self.forget, &[Scope, Key]),
            purge: s(self.purge, &[Batch]),
            steps,
            table,
        }
    }
}

/// A backend's statements on the journal table beside the records table
/// (`<records table>_steps`), for the journal's flow
/// ([`journal`](super::journal)). Placeholders are bound in the order each
/// field gives.
///
/// Every journal write lands only while the operation's record is in
/// progress under the writer's claim, read with a shared lock
/// (PostgreSQL's `FOR SHARE`, MySQL's `LOCK IN SHARE MODE`, nothing on
/// SQLite, whose transaction holds the whole database): a takeover, which
/// updates the record, waits for the write to commit.
#[derive(Debug)]
pub struct StepStatements {
    /// The operation's record, locked against a takeover: scope, key.
    pub(super) fence: String,
    /// An entry, locked: scope, key, seq.
    pub(super) select: String,
    /// A new entry, started: scope, key, seq, name, fingerprint, token, ttl.
    pub(super) insert: String,
    /// An entry replaced by a started one: name, fingerprint, token, ttl,
    /// scope, key, seq.
    pub(super) start: String,
    /// An entry completed: token, output, ttl, scope, key, seq, name.
    pub(super) complete: String,
    /// Every entry of an operation: scope, key.
    pub(super) list: String,
    /// An operator's resolution with an output: output, scope, key, seq,
    /// name.
    ///
    /// Both resolutions land only where the attempt that started the entry
    /// no longer holds the operation: no record is in progress under the
    /// entry's claim with a live lease. Only then is a step in doubt, for
    /// an operator to settle: a resolution sent again, or a second
    /// operator's, must not land on a step that a later attempt, let run
    /// by the first resolution, is running now.
    pub(super) resolve_completed: String,
    /// An operator's resolution allowing a rerun: scope, key, seq, name.
    pub(super) resolve_rerun: String,
    /// A new entry, started, in one statement that checks the fence as the
    /// transaction's first read does (the record in progress under the
    /// claim, locked against a takeover until the statement's transaction
    /// ends): scope, key, seq, name, fingerprint, token, ttl, then the
    /// record's scope, key, token.
    pub(super) insert_fenced: String,
    /// An entry completed in one statement, under the same check: token,
    /// output, ttl, scope, key, seq, name, then the record's scope, key,
    /// token.
    pub(super) complete_fenced: String,
    /// Deletes an operation's entries: scope, key.
    pub(crate) forget: String,
    /// Deletes an entry still started under a claim, whose call failed
    /// cleanly: scope, key, seq, name, token.
    pub(super) undo: String,
    /// Keeps an operation's live entries until at least a ttl from now:
    /// ttl, scope, key, ttl.
    pub(crate) keep: String,
    /// Deletes at most a batch of expired entries: batch.
    pub(crate) purge: String,
}

/// A backend's statements on the outbox table beside the records table
/// (`<records table>_outbox`), for the outbox's flow
/// ([`outbox`](super::outbox)). Placeholders are bound in the order each
/// field gives; the four statements that end with `seq IN ` are sent with
/// a list of placeholders for the sequence numbers appended, numbered
/// after those of the statement.
#[derive(Debug)]
pub struct OutboxStatements {
    /// The table's name.
    pub(crate) table: String,
    /// A message, written while the operation's record is in progress
    /// under its claim (read with a shared lock), unless a row holds its
    /// id already: message id, topic, key, payload, headers, ttl, then the
    /// record's scope, key, token.
    pub(super) insert_fenced: String,
    /// A message, unfenced (entity mode, whose transaction completes the
    /// claim), unless a row holds its id: message id, topic, key, payload,
    /// headers, ttl.
    pub(super) insert: String,
    /// Whether a message id is in the table: message id.
    pub(super) exists: String,
    /// The oldest rows a relay may lease, passing over those another relay
    /// is leasing where rows are locked one by one: batch.
    pub(super) free: String,
    /// Leases rows: lease, token, then the sequence numbers.
    pub(super) lease: String,
    /// The rows a lease holds: token.
    pub(super) leased: String,
    /// Marks rows relayed: the sequence numbers.
    pub(crate) mark: String,
    /// Gives leased rows back: token, then the sequence numbers.
    pub(crate) release: String,
    /// Deletes at most a batch of relayed rows past their time: batch.
    pub(super) purge: String,
    /// How many rows wait to be relayed (parked rows do not).
    pub(super) waiting: String,
    /// Parks a leased row: reason, token, sequence number.
    pub(super) park: String,
    /// The oldest parked rows, with their reason: batch.
    pub(super) parked: String,
    /// How many rows are parked.
    pub(super) parked_count: String,
    /// Unparks rows: the sequence numbers.
    pub(crate) unpark: String,
}

/// A backend's statements for an operator's [`Inventory`](crate::admin::Inventory)
/// of a records table and its journal ([`inventory`](super::inventory)).
/// Every record or entry read selects the columns the flow decodes.
#[derive(Debug)]
pub struct InventoryStatements {
    /// The records holding a key, in every scope: key.
    pub(super) with_key: String,
    /// How many records each scope holds in each state, and how many of
    /// them expired.
    pub(super) by_scope: String,
    /// The oldest record in progress.
    pub(super) oldest_in_progress: String,
    /// How many journal entries are in each state, and how many of them
    /// expired.
    pub(super) steps: String,
    /// The journal entries of a key, in every scope: key.
    pub(super) steps_with_key: String,
}
