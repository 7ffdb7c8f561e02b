//! What the outbox and entity mode read from the operation a body runs
//! under: where a message belongs ([`MessageSlot`]), the messages held for
//! the entity's transaction, and the claim that fences them.

use std::time::Duration;

use idem_core::fingerprint::Fingerprint;
use idem_core::key::Scope;
use idem_core::record::Claim;

use super::operation::{lock, OPERATION};

/// Where an outbox message of the running operation belongs: what its id
/// derives from, and how long it is kept once relayed.
pub(crate) struct MessageSlot {
    /// The operation's scope (entity mode: the operation's, not its claim's).
    pub(crate) scope: Scope,
    /// The claim, which fences the message's insert.
    pub(crate) claim: Claim,
    /// The operation's payload: a key used again with another payload
    /// (after its ttl) is another operation, whose messages are others.
    pub(crate) fingerprint: Fingerprint,
    /// How long the message is kept after it was written: the records'.
    pub(crate) ttl: Duration,
}

/// What an outbox message's id and retention derive from in the
/// operation this task's body runs under; `None` outside an operation.
pub(crate) fn next_message() -> Option<MessageSlot> {
    OPERATION
        .try_with(|operation| {
            let state = &*operation.0;
            MessageSlot {
                scope: state.steps.scope.clone(),
                claim: state.claim.clone(),
                fingerprint: state.steps.fingerprint,
                ttl: state.steps.ttl,
            }
        })
        .ok()
}

/// Entity mode: from now on, the outbox messages of the operation this
/// task's body runs under are held ([`hold_message`]) until the entity's
/// transaction writes them ([`held_messages`]).
pub(crate) fn hold_messages() {
    let _ = OPERATION.try_with(|operation| {
        lock(&operation.0.messages)
            .held
            .get_or_insert_with(Vec::new);
    });
}

/// Holds `message` for the entity's transaction; hands it back when the
/// operation does not hold messages (not in entity mode, or outside one).
pub(crate) fn hold_message(
    message: Box<dyn std::any::Any + Send + Sync>,
) -> Result<(), Box<dyn std::any::Any + Send + Sync>> {
    let mut message = Some(message);
    let _ = OPERATION.try_with(|operation| {
        if let Some(held) = lock(&operation.0.messages).held.as_mut() {
            held.extend(message.take());
        }
    });
    match message {
        None => Ok(()),
        Some(message) => Err(message),
    }
}

/// The messages held for the entity's transaction, in order.
pub(crate) fn held_messages() -> Vec<Box<dyn std::any::Any + Send + Sync>> {
    OPERATION
        .try_with(|operation| {
            lock(&operation.0.messages)
                .held
                .as_mut()
                .map(std::mem::take)
                .unwrap_or_default()
        })
        .unwrap_or_default()
}
