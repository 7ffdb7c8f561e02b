//! A backend's statements on the records table, each with the order in
//! which its placeholders are bound (MySQL's `?` are positional, where
//! SQLite's `?N` and PostgreSQL's `$N` may repeat).
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
            sql: sql.replace("{table}", table).replace("{now}", now),
            params,
        }
    }
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
    pub steps: super::step_statements::StepStatements,
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
        steps: super::step_statements::StepStatements,
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
