//! What went wrong, as a message a person can act on and a documented
//! exit code (README: Exit codes).

use std::fmt;
use std::process::ExitCode;

/// A failed command: what to tell the operator, and the exit code.
#[derive(Debug)]
pub(crate) enum Failure {
    /// A store error with no better category (exit 1).
    Store(String),
    /// Arguments the command cannot run with: an invalid key, table name,
    /// JSON output (exit 2, as clap's own usage errors).
    Usage(String),
    /// A URL that names no store this tool opens (exit 3).
    BadUrl(String),
    /// The store cannot be reached or opened (exit 4).
    Unreachable(String),
    /// The database has no idem table under that name (exit 5).
    MissingTable(String),
    /// No record, journal or step under what was named (exit 6).
    NotFound(String),
    /// The operator did not confirm (exit 7).
    Declined(String),
    /// The store refused the change: the step is not in doubt (exit 8).
    Refused(String),
}

impl Failure {
    pub(crate) fn exit_code(&self) -> ExitCode {
        ExitCode::from(match self {
            Failure::Store(_) => 1,
            Failure::Usage(_) => 2,
            Failure::BadUrl(_) => 3,
            Failure::Unreachable(_) => 4,
            Failure::MissingTable(_) => 5,
            Failure::NotFound(_) => 6,
            Failure::Declined(_) => 7,
            Failure::Refused(_) => 8,
        })
    }

    /// A store error met while running a command.
    pub(crate) fn store(err: idem::Error) -> Self {
        match err {
            idem::Error::Config(message) => Failure::Usage(message),
            other => Failure::Store(other.to_string()),
        }
    }
}

impl fmt::Display for Failure {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        let message = match self {
            Failure::Store(m)
            | Failure::Usage(m)
            | Failure::BadUrl(m)
            | Failure::Unreachable(m)
            | Failure::MissingTable(m)
            | Failure::NotFound(m)
            | Failure::Declined(m)
            | Failure::Refused(m) => m,
        };
        f.write_str(message)
    }
}

impl From<idem::Error> for Failure {
    fn from(err: idem::Error) -> Self {
        Failure::store(err)
    }
}
