//! The writes of the SQL stores that name the claim's token: renewal,
//! completion and release, each refused ([`Error::LeaseLost`]) once the
//! claim is not the record's any more.

use super::bound::Bound;
use super::{Backend, SqlStore};
use crate::store::sql::statements::Statement;
use idem_core::error::Error;
use idem_core::record::{Claim, Outcome};

impl<DB: Backend> SqlStore<DB> {
    /// [`Store::renew`](crate::store::Store::renew) on a given connection.
    pub async fn renew_on(&self, conn: &mut DB::Connection, claim: &Claim) -> Result<(), Error> {
        self.fenced(conn, &self.sql.renew, &Bound::claim(claim, None))
            .await
    }

    /// [`Store::complete`](crate::store::Store::complete) on a given
    /// connection. Waiters in other processes are told when the
    /// connection's transaction commits.
    pub async fn complete_on(
        &self,
        conn: &mut DB::Connection,
        claim: &Claim,
        outcome: &Outcome,
    ) -> Result<(), Error> {
        DB::check_outcome(conn, &self.sql.complete, outcome).await?;
        self.fenced(
            conn,
            &self.sql.complete,
            &Bound::claim(claim, Some(outcome)),
        )
        .await
    }

    /// [`Store::release`](crate::store::Store::release) on a given
    /// connection. Waiters in other processes are told when the
    /// connection's transaction commits.
    pub async fn release_on(&self, conn: &mut DB::Connection, claim: &Claim) -> Result<(), Error> {
        self.fenced(conn, &self.sql.release, &Bound::claim(claim, None))
            .await
    }

    /// A write that names the claim's token: [`Error::LeaseLost`] when it
    /// matched no row (the claim is not the record's any more).
    async fn fenced(
        &self,
        conn: &mut DB::Connection,
        statement: &Statement,
        bound: &Bound<'_>,
    ) -> Result<(), Error> {
        let done = DB::execute(conn, &statement.sql, bound.values(statement)?).await?;
        // MySQL counts a matched row even when nothing changed (sqlx asks
        // for found rows), so a completion sent again still counts.
        if DB::rows_affected(&done) == 0 {
            return Err(Error::LeaseLost);
        }
        Ok(())
    }
}
