//! The system a step calls (a card gateway): it commits effects, at once
//! or late on a task of its own, dedupes them by key or not, and can be
//! asked by key or not, as the history's [`Downstream`] says.

use std::sync::{Arc, Mutex};
use std::time::Duration;

use super::history::Downstream;

/// One committed effect.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Effect {
    /// Its id, from 1, in the order of commits.
    pub id: u64,
    /// The key it was requested with.
    pub key: String,
    /// The attempt that requested it (`usize::MAX`: the final call).
    pub attempt: usize,
}

pub struct Gateway {
    kind: Downstream,
    effects: Mutex<Vec<Effect>>,
}

impl Gateway {
    pub fn new(kind: Downstream) -> Arc<Gateway> {
        Arc::new(Gateway {
            kind,
            effects: Mutex::default(),
        })
    }

    /// Commits a request: a new effect, or the one committed before under
    /// `key` when the gateway dedupes.
    fn commit(&self, key: &str, attempt: usize) -> u64 {
        let mut effects = self.effects.lock().unwrap();
        if self.kind.dedupes {
            if let Some(e) = effects.iter().find(|e| e.key == key) {
                return e.id;
            }
        }
        let id = effects.len() as u64 + 1;
        effects.push(Effect {
            id,
            key: key.to_owned(),
            attempt,
        });
        id
    }

    /// Sends a request with `key`, answered with its effect's id once it
    /// is committed. A late commit happens on a task of the gateway's own,
    /// whether or not the client still waits.
    pub async fn charge(self: &Arc<Self>, key: &str, attempt: usize) -> u64 {
        if self.kind.commit_after_ms == 0 {
            return self.commit(key, attempt);
        }
        let (sent, committed) = tokio::sync::oneshot::channel();
        let (gateway, key) = (self.clone(), key.to_owned());
        let delay = Duration::from_millis(self.kind.commit_after_ms);
        tokio::spawn(async move {
            tokio::time::sleep(delay).await;
            let _ = sent.send(gateway.commit(&key, attempt));
        });
        committed.await.expect("the gateway commits every request")
    }

    /// What became of the request sent with `key`: its effect, once
    /// committed. Only for a gateway that can be asked.
    pub fn ask(&self, key: &str) -> Option<u64> {
        assert!(self.kind.askable, "asked a gateway that cannot be asked");
        let effects = self.effects.lock().unwrap();
        effects.iter().find(|e| e.key == key).map(|e| e.id)
    }

    pub fn effects(&self) -> Vec<Effect> {
        self.effects.lock().unwrap().clone()
    }
}
