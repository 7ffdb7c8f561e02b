//! The outbox of a store ([`Outbox`]), and writing a message into it: on
//! the body's transaction ([`Outbox::publish`]), or held for the entity's
//! transaction in entity mode ([`Outbox::enqueue`]).

use std::fmt;
use std::sync::Arc;
use std::time::Duration;

use crate::steps;
use crate::store::sql::entity_rows::HeldRow;
use crate::store::sql::outbox::{OutboxStatements, Row};
use crate::store::sql::{Backend, SqlStore};
use idem_core::error::Error;
use idem_core::record::duration_millis;

use super::message::{encode_headers, Message};
use super::message_id::MessageId;

/// The outbox of a store: the table `<records table>_outbox` in its
/// database. Cloning shares it. See the [module documentation](super).
pub struct Outbox<DB: Backend> {
    pub(super) store: SqlStore<DB>,
    pub(super) sql: Arc<OutboxStatements>,
}

impl<DB: Backend> Clone for Outbox<DB> {
    fn clone(&self) -> Self {
        Outbox {
            store: self.store.clone(),
            sql: self.sql.clone(),
        }
    }
}

impl<DB: Backend> fmt::Debug for Outbox<DB> {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("Outbox")
            .field("table", &self.sql.table)
            .finish_non_exhaustive()
    }
}

impl<DB: Backend> Outbox<DB> {
    /// The outbox beside `store`'s records table; the store's migrations
    /// create it.
    pub fn new(store: &SqlStore<DB>) -> Self {
        Outbox {
            store: store.clone(),
            sql: Arc::new(DB::outbox(&store.sql.table)),
        }
    }

    /// The outbox table's name.
    pub fn table(&self) -> &str {
        &self.sql.table
    }

    /// The store.
    pub fn store(&self) -> &SqlStore<DB> {
        &self.store
    }

    /// Writes `message` on `conn`, your open transaction (record mode: the
    /// one writing the operation's effect; transactional mode: the one its
    /// claim is on), and returns its id. Call it inside the body of an
    /// idempotent operation running on this outbox's store.
    ///
    /// A message whose id the outbox holds already (an earlier attempt of
    /// this operation committed it) is not written again.
    ///
    /// # Errors
    ///
    /// - [`Error::Config`] outside an operation (or from a task the
    ///   operation spawned);
    /// - [`Error::LeaseLost`] when the operation's claim no longer holds
    ///   its record (or the operation runs on another store): roll back;
    /// - [`Error::Store`] when the database failed; the transaction is
    ///   then yours to roll back.
    pub async fn publish(
        &self,
        conn: &mut DB::Connection,
        message: &Message,
    ) -> Result<MessageId, Error> {
        let slot = steps::next_message().ok_or_else(|| outside("publish"))?;
        let id = MessageId::derive(&slot.scope, &slot.claim.key, &slot.fingerprint, message);
        let headers = encode_headers(&message.headers);
        let row = row(&id, message, &headers, slot.ttl);
        SqlStore::<DB>::outbox_insert_fenced(&self.sql, conn, &slot.claim, &row).await?;
        Ok(id)
    }

    /// Entity mode: holds `message` until the operation's entity is
    /// inserted, and writes it in that transaction (so the message is
    /// committed exactly when the entity is); returns its id. The outbox
    /// must be in the entity's database.
    ///
    /// # Errors
    ///
    /// [`Error::Config`] outside the body of an entity-mode operation.
    pub fn enqueue(&self, message: Message) -> Result<MessageId, Error> {
        let slot = steps::next_message().ok_or_else(|| outside("enqueue"))?;
        let id = MessageId::derive(&slot.scope, &slot.claim.key, &slot.fingerprint, &message);
        let headers = encode_headers(&message.headers);
        let held = HeldRow::<DB>::new(self.sql.clone(), &row(&id, &message, &headers, slot.ttl));
        steps::hold_message(Box::new(held)).map_err(|_| {
            Error::Config(
                "Outbox::enqueue holds a message for an entity-mode operation's transaction, \
                 and this operation is not in entity mode: publish on your transaction with \
                 Outbox::publish"
                    .to_owned(),
            )
        })?;
        Ok(id)
    }
}

/// The outbox row of `message`, whose id is `id`, kept for `ttl`.
fn row<'a>(id: &'a MessageId, message: &'a Message, headers: &'a [u8], ttl: Duration) -> Row<'a> {
    Row {
        id: id.as_str(),
        topic: &message.topic,
        key: message.key.as_deref(),
        payload: message.payload.as_deref(),
        headers,
        ttl: duration_millis(ttl),
    }
}

fn outside(what: &str) -> Error {
    Error::Config(format!(
        "Outbox::{what} was called outside an idempotent operation (or from a task the \
         operation spawned): a message's id derives from its operation, so publish inside the \
         body of #[idempotent] or run()"
    ))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[cfg(feature = "sqlite")]
    #[tokio::test]
    async fn publishing_outside_an_operation_is_refused() {
        let store = crate::SqliteStore::connect("sqlite::memory:")
            .await
            .unwrap();
        let outbox = Outbox::new(&store);
        let message = Message::new("t", "x").unwrap();
        let mut conn = store.pool().acquire().await.unwrap();
        let err = outbox.publish(&mut conn, &message).await.unwrap_err();
        assert!(
            matches!(&err, Error::Config(m) if m.contains("outside")),
            "{err}"
        );
        // The database's one connection, back to the pool.
        drop(conn);
        let err = outbox.enqueue(message).unwrap_err();
        assert!(
            matches!(&err, Error::Config(m) if m.contains("outside")),
            "{err}"
        );
        assert_eq!(outbox.waiting().await.unwrap(), 0);
    }
}
