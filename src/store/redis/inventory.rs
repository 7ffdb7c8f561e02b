//! [`Inventory`] on Redis: `SCAN` over the store's record and journal
//! keys (on every primary of a cluster), each page read back with one
//! pipeline of `HGETALL`s on the node that holds it.

use async_trait::async_trait;
use redis::cluster_routing::{RoutingInfo, SingleNodeRoutingInfo};
use redis::Value;

use super::calls::store_error;
use super::replies::{array, int, parse_record, text};
use super::{Conn, RedisStore};
use crate::admin::{Inventory, ScopeStats, Stats, StepStats};
use crate::store::Journal;
use idem_core::error::Error;
use idem_core::journal::{StepRecord, StepState};
use idem_core::key::Key;
use idem_core::record::{Millis, Record, State};

/// How many keys one `SCAN` looks at.
const PAGE: usize = 500;

/// `s` with Redis's glob characters escaped, to match itself.
fn glob_literal(s: &str) -> String {
    let mut out = String::with_capacity(s.len());
    for c in s.chars() {
        if matches!(c, '*' | '?' | '[' | ']' | '\\') {
            out.push('\\');
        }
        out.push(c);
    }
    out
}

/// A hash's fields as a flat list of names and values, as RESP2 and the
/// scripts give them (RESP3 answers `HGETALL` with a map).
fn flat(value: Value) -> Result<Vec<Value>, Error> {
    match value {
        Value::Map(pairs) => Ok(pairs.into_iter().flat_map(|(k, v)| [k, v]).collect()),
        other => array(other),
    }
}

impl RedisStore {
    /// The primaries of the cluster, as `(host, port)`, from `CLUSTER
    /// NODES`.
    async fn primaries(&self) -> Result<Vec<(String, u16)>, Error> {
        let Conn::Cluster(mut conn) = self.shared.conn.clone() else {
            return Ok(Vec::new());
        };
        let nodes = conn
            .route_command(
                redis::cmd("CLUSTER").arg("NODES").clone(),
                RoutingInfo::SingleNode(SingleNodeRoutingInfo::Random),
            )
            .await
            .map_err(store_error)?;
        let nodes = match &nodes {
            Value::VerbatimString { text, .. } => text.clone(),
            other => text(other)
                .ok_or_else(|| Error::store("unexpected CLUSTER NODES reply"))?
                .to_owned(),
        };
        let mut primaries = Vec::new();
        for line in nodes.lines() {
            let fields: Vec<&str> = line.split(' ').collect();
            let (Some(address), Some(flags)) = (fields.get(1), fields.get(2)) else {
                continue;
            };
            let flags: Vec<&str> = flags.split(',').collect();
            if !flags.contains(&"master") || flags.iter().any(|f| *f == "fail" || *f == "noaddr") {
                continue;
            }
            // `ip:port@cport[,hostname]`
            let address = address.split('@').next().unwrap_or_default();
            if let Some((host, port)) = address.rsplit_once(':') {
                if let Ok(port) = port.parse() {
                    primaries.push((host.to_owned(), port));
                }
            }
        }
        if primaries.is_empty() {
            return Err(Error::store("CLUSTER NODES lists no reachable primary"));
        }
        Ok(primaries)
    }

    /// Calls `visit` with the fields of every hash whose key is
    /// `<prefix>:{<tag>}:<suffix>`, on every primary.
    async fn scan_hashes(
        &self,
        suffix: &str,
        mut visit: impl FnMut(Vec<Value>) -> Result<(), Error> + Send,
    ) -> Result<(), Error> {
        let pattern = format!("{}:{{*}}:{suffix}", glob_literal(&self.prefix));
        match self.shared.conn.clone() {
            Conn::Single(mut conn) => {
                let mut cursor = 0u64;
                loop {
                    let (next, keys): (u64, Vec<String>) = redis::cmd("SCAN")
                        .arg(cursor)
                        .arg("MATCH")
                        .arg(&pattern)
                        .arg("COUNT")
                        .arg(PAGE)
                        .query_async(&mut conn)
                        .await
                        .map_err(store_error)?;
                    if !keys.is_empty() {
                        let mut pipeline = redis::pipe();
                        for key in &keys {
                            pipeline.cmd("HGETALL").arg(key);
                        }
                        let hashes: Vec<Value> =
                            pipeline.query_async(&mut conn).await.map_err(store_error)?;
                        for hash in hashes {
                            visit(flat(hash)?)?;
                        }
                    }
                    if next == 0 {
                        return Ok(());
                    }
                    cursor = next;
                }
            }
            Conn::Cluster(mut conn) => {
                for (host, port) in self.primaries().await? {
                    let node = || SingleNodeRoutingInfo::ByAddress {
                        host: host.clone(),
                        port,
                    };
                    let mut cursor = 0u64;
                    loop {
                        let mut scan = redis::cmd("SCAN");
                        scan.arg(cursor)
                            .arg("MATCH")
                            .arg(&pattern)
                            .arg("COUNT")
                            .arg(PAGE);
                        let reply = conn
                            .route_command(scan, RoutingInfo::SingleNode(node()))
                            .await
                            .map_err(store_error)?;
                        let (next, keys): (u64, Vec<String>) =
                            redis::from_redis_value(reply).map_err(Error::store)?;
                        if !keys.is_empty() {
                            let mut pipeline = redis::pipe();
                            for key in &keys {
                                pipeline.cmd("HGETALL").arg(key);
                            }
                            let hashes = conn
                                .route_pipeline(pipeline, 0, keys.len(), node())
                                .await
                                .map_err(store_error)?;
                            for hash in hashes {
                                visit(flat(hash)?)?;
                            }
                        }
                        if next == 0 {
                            break;
                        }
                        cursor = next;
                    }
                }
                Ok(())
            }
        }
    }

    /// Every record of the store (those that expired between the scan
    /// and the read are left out).
    async fn scan_records(&self, mut visit: impl FnMut(Record) + Send) -> Result<(), Error> {
        self.scan_hashes("r", |fields| {
            if let Some(record) = parse_record(fields)? {
                visit(record);
            }
            Ok(())
        })
        .await
    }
}

#[async_trait]
impl Inventory for RedisStore {
    async fn now(&self) -> Result<Millis, Error> {
        let mut conn = self.shared.conn.clone();
        let (seconds, micros): (i64, i64) = redis::cmd("TIME")
            .query_async(&mut conn)
            .await
            .map_err(store_error)?;
        Ok(seconds * 1000 + micros / 1000)
    }

    /// Redis has no table to create: `true`, unless a store made with
    /// [`connect`](RedisStore::connect) reaches a node of a cluster, which
    /// holds only some of the records: an error saying to use
    /// [`connect_cluster`](RedisStore::connect_cluster).
    async fn is_set_up(&self) -> Result<bool, Error> {
        let Conn::Single(mut conn) = self.shared.conn.clone() else {
            return Ok(true);
        };
        let info: Value = redis::cmd("INFO")
            .arg("cluster")
            .query_async(&mut conn)
            .await
            .map_err(store_error)?;
        let info = match &info {
            Value::VerbatimString { text, .. } => text.as_str(),
            other => text(other).unwrap_or_default(),
        };
        if info.lines().any(|line| line.trim() == "cluster_enabled:1") {
            return Err(Error::Config(
                "this Redis is a node of a Redis Cluster, which holds only some of the records: \
                 connect to the cluster (RedisStore::connect_cluster)"
                    .into(),
            ));
        }
        Ok(true)
    }

    async fn records_with_key(&self, key: &Key) -> Result<Vec<Record>, Error> {
        let mut found = Vec::new();
        self.scan_records(|record| {
            if record.key == *key {
                found.push(record);
            }
        })
        .await?;
        found.sort_by(|a, b| a.scope.as_str().cmp(b.scope.as_str()));
        Ok(found)
    }

    async fn steps_with_key(&self, key: &Key) -> Result<Vec<StepRecord>, Error> {
        let mut steps = Vec::new();
        for record in self.records_with_key(key).await? {
            steps.extend(self.steps(&record.scope, &record.key).await?);
        }
        Ok(steps)
    }

    async fn stats(&self) -> Result<Stats, Error> {
        let now = self.now().await?;
        let mut scopes = std::collections::BTreeMap::<String, ScopeStats>::new();
        let mut oldest: Option<Record> = None;
        self.scan_records(|record| {
            let entry = scopes
                .entry(record.scope.as_str().to_owned())
                .or_insert_with(|| ScopeStats {
                    scope: record.scope.as_str().to_owned(),
                    ..ScopeStats::default()
                });
            match record.state {
                State::InProgress => entry.in_progress += 1,
                State::Completed => entry.completed += 1,
            }
            if record.expires_at <= now {
                entry.expired += 1;
            }
            if record.state == State::InProgress
                && oldest
                    .as_ref()
                    .is_none_or(|o| record.created_at < o.created_at)
            {
                oldest = Some(record);
            }
        })
        .await?;
        let mut steps = StepStats::default();
        self.scan_hashes("j", |fields| {
            // `<seq>:<field>` → value; the state is `st`, the expiry `e`.
            let mut pairs = fields.chunks(2);
            let mut expiries = std::collections::HashMap::new();
            let mut states = Vec::new();
            for pair in &mut pairs {
                let (Some(name), Some(value)) = (pair.first().and_then(text), pair.get(1)) else {
                    continue;
                };
                match name.split_once(':') {
                    Some((seq, "st")) => states.push((seq.to_owned(), text(value))),
                    Some((seq, "e")) => {
                        expiries.insert(seq.to_owned(), int(value));
                    }
                    _ => {}
                }
            }
            for (seq, state) in states {
                match state.and_then(StepState::parse) {
                    Some(StepState::Started) => steps.started += 1,
                    Some(StepState::Completed) => steps.completed += 1,
                    Some(StepState::RerunAllowed) => steps.rerun_allowed += 1,
                    None => return Err(super::replies::corrupt("a journal entry's state")),
                }
                if expiries
                    .get(&seq)
                    .copied()
                    .flatten()
                    .is_some_and(|e| e <= now)
                {
                    steps.expired += 1;
                }
            }
            Ok(())
        })
        .await?;
        Ok(Stats {
            now,
            scopes: scopes.into_values().collect(),
            steps,
            oldest_in_progress: oldest,
        })
    }

    /// Nothing to do: Redis deletes expired records and journals itself.
    async fn purge_expired_reporting(
        &self,
        batch: usize,
        progress: &(dyn Fn(u64) + Send + Sync),
    ) -> Result<u64, Error> {
        let _ = (batch, progress);
        Ok(0)
    }
}
