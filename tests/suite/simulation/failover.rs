//! The Redis failover's pair of servers: a primary and its replica of the
//! history's own (on 127.0.0.1:7320 and 7321), the store on the primary
//! waiting for the replica after every write a decision reads, and a
//! store on the replica for once it is promoted.

use std::future::Future;
use std::pin::Pin;
use std::sync::{Arc, Mutex};
use std::time::Duration;

use idem::{RedisStore, Store};

use super::faults::Failing;
use super::history::REPLICA_WAIT_MS;
use crate::common::own_redis::{primary_and_replica, promote, Server};

/// The primary's port; the replica's is the next.
const PORT: u16 = 7320;

pub struct Pair {
    /// `None` once killed.
    primary: Mutex<Option<Server>>,
    replica: Server,
    primary_url: String,
    prefix: String,
    /// A store on the replica, connected before the failover: what the
    /// store talks to once the replica is promoted.
    promoted: RedisStore,
}

impl Pair {
    /// A fresh primary and replica, in sync.
    pub async fn start() -> Arc<Pair> {
        let (primary, replica) = primary_and_replica(PORT).await;
        let prefix = crate::common::redis::unique_prefix("sim-failover");
        let promoted = connect(&replica.url(), &prefix).await;
        Arc::new(Pair {
            primary_url: primary.url(),
            primary: Mutex::new(Some(primary)),
            replica,
            prefix,
            promoted,
        })
    }

    /// The store on the primary, which waits for its replica.
    pub async fn store_on_primary(&self) -> RedisStore {
        connect(&self.primary_url, &self.prefix)
            .await
            .wait_for_replicas(1, Duration::from_millis(REPLICA_WAIT_MS))
    }
}

async fn connect(url: &str, prefix: &str) -> RedisStore {
    RedisStore::connect(url)
        .await
        .unwrap_or_else(|err| panic!("connect to the history's Redis at {url}: {err}"))
        .with_prefix(prefix)
        .expect("a valid prefix")
}

impl Failing for Pair {
    fn promote(&self) -> Pin<Box<dyn Future<Output = ()> + Send + '_>> {
        Box::pin(promote(&self.replica))
    }

    fn kill_primary(&self) -> Arc<dyn Store> {
        if let Some(mut primary) = self.primary.lock().unwrap().take() {
            primary.kill();
        }
        Arc::new(self.promoted.clone())
    }
}
