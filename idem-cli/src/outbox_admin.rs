//! The outbox of a SQL store, whatever its database: what `idem outbox`
//! asks of it, behind one trait object that the opened target holds.

use std::future::Future;
use std::pin::Pin;

use idem::outbox::{Outbox, Parked};
use idem::store::{Backend, SqlStore};

type Answer<'a, T> = Pin<Box<dyn Future<Output = Result<T, idem::Error>> + 'a>>;

/// The outbox of a SQL store, whatever its database.
pub(crate) trait OutboxAdmin {
    /// The outbox table's name.
    fn table(&self) -> &str;
    /// Whether the table exists (the application's `migrate()` of an idem
    /// with the outbox creates it); `None` when that cannot be asked.
    fn exists(&self) -> Answer<'_, Option<bool>>;
    fn waiting(&self) -> Answer<'_, u64>;
    fn parked_count(&self) -> Answer<'_, u64>;
    fn parked(&self, limit: usize) -> Answer<'_, Vec<Parked>>;
    fn unpark<'a>(&'a self, seqs: &'a [i64]) -> Answer<'a, u64>;
}

impl<DB: Backend> OutboxAdmin for Outbox<DB>
where
    SqlStore<DB>: idem::admin::Inventory,
{
    fn table(&self) -> &str {
        Outbox::table(self)
    }

    fn exists(&self) -> Answer<'_, Option<bool>> {
        Box::pin(async move {
            // The inventory's check of a records table, pointed at the
            // outbox's: a store on that table is never used otherwise. A
            // name too long for a records table cannot be asked this way.
            match SqlStore::new(self.store().pool().clone()).with_table_name(self.table()) {
                Ok(table) => idem::admin::Inventory::is_set_up(&table).await.map(Some),
                Err(_) => Ok(None),
            }
        })
    }

    fn waiting(&self) -> Answer<'_, u64> {
        Box::pin(Outbox::waiting(self))
    }

    fn parked_count(&self) -> Answer<'_, u64> {
        Box::pin(Outbox::parked_count(self))
    }

    fn parked(&self, limit: usize) -> Answer<'_, Vec<Parked>> {
        Box::pin(Outbox::parked(self, limit))
    }

    fn unpark<'a>(&'a self, seqs: &'a [i64]) -> Answer<'a, u64> {
        Box::pin(Outbox::unpark(self, seqs))
    }
}
