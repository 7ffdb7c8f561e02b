//! The channels this process's waiters listen on, and the relay of what
//! arrives on them to the waiters.
//!
//! A waiter subscribes to its record's channel before it looks at the
//! record, and unsubscribes when it stops waiting; the waiters of one key
//! share one subscription. Subscribing and unsubscribing go through one
//! task, in order, so that an unsubscription never overtakes the
//! subscription that follows it.

use std::collections::HashMap;
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::Arc;

use redis::{PushInfo, PushKind, Value};
use tokio::sync::{mpsc, oneshot};

use super::Conn;
use crate::store::Waiters;
use idem_core::key::{Key, Scope};

enum Change {
    Subscribe(String, oneshot::Sender<bool>),
    Unsubscribe(String),
}

/// The handle on the task that subscribes and unsubscribes.
pub(super) struct Subscriptions {
    changes: mpsc::UnboundedSender<Change>,
    task: tokio::task::JoinHandle<()>,
}

impl Drop for Subscriptions {
    fn drop(&mut self) {
        self.task.abort();
    }
}

/// A waiter's subscription, given back when dropped.
pub(super) struct Subscription {
    channel: Option<String>,
    changes: mpsc::UnboundedSender<Change>,
}

impl Drop for Subscription {
    fn drop(&mut self) {
        if let Some(channel) = self.channel.take() {
            let _ = self.changes.send(Change::Unsubscribe(channel));
        }
    }
}

impl Subscriptions {
    pub(super) fn start(conn: Conn, listening: Arc<AtomicBool>) -> Self {
        let (changes, receiver) = mpsc::unbounded_channel();
        let task = tokio::spawn(manage(conn, receiver, listening));
        Subscriptions { changes, task }
    }

    /// Subscribes to `channel`, or joins its subscription; once this
    /// returns, what is published there reaches this process. A failed
    /// subscription is logged and leaves the waiter to poll.
    pub(super) async fn subscribe(&self, channel: &str) -> Subscription {
        let (reply, subscribed) = oneshot::channel();
        let ok = self
            .changes
            .send(Change::Subscribe(channel.to_owned(), reply))
            .is_ok()
            && subscribed.await.unwrap_or(false);
        Subscription {
            channel: ok.then(|| channel.to_owned()),
            changes: self.changes.clone(),
        }
    }
}

async fn manage(
    mut conn: Conn,
    mut changes: mpsc::UnboundedReceiver<Change>,
    listening: Arc<AtomicBool>,
) {
    let mut counts: HashMap<String, usize> = HashMap::new();
    while let Some(change) = changes.recv().await {
        match change {
            Change::Subscribe(channel, reply) => {
                if let Some(count) = counts.get_mut(&channel) {
                    *count += 1;
                    let _ = reply.send(true);
                    continue;
                }
                let subscribed = match &mut conn {
                    Conn::Single(conn) => conn.subscribe(&channel).await,
                    Conn::Cluster(conn) => conn.ssubscribe(&channel).await,
                };
                match subscribed {
                    Ok(()) => {
                        listening.store(true, Ordering::Relaxed);
                        counts.insert(channel, 1);
                        let _ = reply.send(true);
                    }
                    Err(err) => {
                        listening.store(false, Ordering::Relaxed);
                        tracing::warn!(
                            error = %err,
                            "subscribing to an idempotency record's channel failed; its waiters poll"
                        );
                        let _ = reply.send(false);
                    }
                }
            }
            Change::Unsubscribe(channel) => {
                let Some(count) = counts.get_mut(&channel) else {
                    continue;
                };
                *count -= 1;
                if *count > 0 {
                    continue;
                }
                counts.remove(&channel);
                let unsubscribed = match &mut conn {
                    Conn::Single(conn) => conn.unsubscribe(&channel).await,
                    Conn::Cluster(conn) => conn.sunsubscribe(&channel).await,
                };
                if let Err(err) = unsubscribed {
                    tracing::debug!(error = %err, "unsubscribing from a record's channel failed");
                }
            }
        }
    }
}

/// Relays the messages of the subscribed channels to the waiters of their
/// keys. A lost connection may have lost messages: every waiter looks
/// again, and polls quickly until a subscription succeeds again.
///
/// The message of a completion sent from this process arrives before the
/// script's own reply: [`Waiters::wake_from_store`] leaves it to the
/// completion, which wakes the waiters here with the outcome.
pub(super) async fn relay(
    mut pushes: mpsc::UnboundedReceiver<PushInfo>,
    waiters: Arc<Waiters>,
    listening: Arc<AtomicBool>,
) {
    while let Some(push) = pushes.recv().await {
        match push.kind {
            PushKind::Message | PushKind::SMessage => {
                if let Some((scope, key)) = push.data.get(1).and_then(scope_and_key) {
                    waiters.wake_from_store(&scope, &key);
                }
            }
            PushKind::Disconnection => {
                listening.store(false, Ordering::Relaxed);
                waiters.wake_all();
            }
            _ => {}
        }
    }
}

/// The scope and key of a message, `<len(scope)>:<scope><key>`.
fn scope_and_key(payload: &Value) -> Option<(Scope, Key)> {
    let Value::BulkString(payload) = payload else {
        return None;
    };
    let payload = std::str::from_utf8(payload).ok()?;
    let (len, rest) = payload.split_once(':')?;
    let len: usize = len.parse().ok()?;
    let scope = rest.get(..len)?;
    let key = rest.get(len..)?;
    Some((Scope::new(scope), Key::new(key).ok()?))
}
