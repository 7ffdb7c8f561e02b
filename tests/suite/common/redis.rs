//! Redis for the Redis store's tests: a single Redis (`IDEM_REDIS_URL`,
//! by default the one on 127.0.0.1:6379) and a Redis Cluster
//! (`IDEM_REDIS_CLUSTER_URL`, by default the local one of
//! `.ci/redis-cluster` on 127.0.0.1:7100-7105, started on first use when
//! no variable names another), keys of a test's own, deleted when the test
//! ends.

use std::sync::atomic::{AtomicUsize, Ordering};
use std::sync::OnceLock;
use std::time::{Duration, SystemTime, UNIX_EPOCH};

use redis::aio::ConnectionLike;

/// A Redis of the test environment.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Redis {
    Single,
    Cluster,
}

impl Redis {
    /// The variable that names it.
    pub fn var(self) -> &'static str {
        match self {
            Redis::Single => "IDEM_REDIS_URL",
            Redis::Cluster => "IDEM_REDIS_CLUSTER_URL",
        }
    }

    /// Its URL (a cluster's: one of its nodes).
    pub fn url(self) -> String {
        std::env::var(self.var()).unwrap_or_else(|_| {
            match self {
                Redis::Single => "redis://127.0.0.1:6379",
                Redis::Cluster => "redis://127.0.0.1:7100",
            }
            .to_owned()
        })
    }

    fn unreachable(self, err: impl std::fmt::Display) -> ! {
        panic!(
            "cannot reach the Redis{} at {} (set {} to the URL of a reachable one): {err}",
            if self == Redis::Cluster {
                " Cluster"
            } else {
                ""
            },
            self.url(),
            self.var()
        )
    }

    /// A store on it, keyed under `prefix`.
    pub async fn store(self, prefix: &str) -> idem::RedisStore {
        if self == Redis::Cluster {
            ensure_local_cluster();
        }
        let connect = async {
            match self {
                Redis::Single => idem::RedisStore::connect(&self.url()).await,
                Redis::Cluster => idem::RedisStore::connect_cluster([self.url()]).await,
            }
        };
        let store = match tokio::time::timeout(Duration::from_secs(20), connect).await {
            Ok(Ok(store)) => store,
            Ok(Err(err)) => self.unreachable(err),
            Err(_) => self.unreachable("no answer within 20 s"),
        };
        store.with_prefix(prefix).expect("a valid prefix")
    }

    /// A plain connection, for what a test does besides the store.
    pub async fn conn(self) -> Conn {
        if self == Redis::Cluster {
            ensure_local_cluster();
        }
        let conn = async {
            match self {
                Redis::Single => redis::Client::open(self.url())?
                    .get_multiplexed_async_connection()
                    .await
                    .map(Conn::Single),
                Redis::Cluster => redis::cluster::ClusterClient::new(vec![self.url()])?
                    .get_async_connection()
                    .await
                    .map(Conn::Cluster),
            }
        };
        match tokio::time::timeout(Duration::from_secs(20), conn).await {
            Ok(Ok(conn)) => conn,
            Ok(Err(err)) => self.unreachable(err),
            Err(_) => self.unreachable("no answer within 20 s"),
        }
    }

    /// Deletes every key under `prefix`, on a thread and a connection of
    /// its own (from a `Drop`, whether the test passed or panicked).
    pub fn clean_up(self, prefix: String) {
        let cleaned = std::thread::spawn(move || {
            let runtime = tokio::runtime::Builder::new_current_thread()
                .enable_all()
                .build()
                .expect("a runtime");
            runtime.block_on(async move {
                let mut conn = self.conn().await;
                // KEYS on a cluster asks every primary and joins the lists.
                let keys: Vec<String> = redis::cmd("KEYS")
                    .arg(format!("{prefix}:*"))
                    .query_async(&mut conn)
                    .await?;
                for key in keys {
                    redis::cmd("DEL")
                        .arg(&key)
                        .query_async::<()>(&mut conn)
                        .await?;
                }
                Ok::<_, redis::RedisError>(())
            })
        })
        .join();
        match cleaned {
            Ok(Ok(())) => {}
            Ok(Err(err)) => eprintln!("cleaning up the Redis keys failed: {err}"),
            Err(_) => eprintln!("cleaning up the Redis keys panicked"),
        }
    }
}

/// A connection to a single Redis or to a cluster.
pub enum Conn {
    Single(redis::aio::MultiplexedConnection),
    Cluster(redis::cluster_async::ClusterConnection),
}

impl ConnectionLike for Conn {
    fn req_packed_command<'a>(
        &'a mut self,
        cmd: &'a redis::Cmd,
    ) -> redis::RedisFuture<'a, redis::Value> {
        match self {
            Conn::Single(conn) => conn.req_packed_command(cmd),
            Conn::Cluster(conn) => conn.req_packed_command(cmd),
        }
    }

    fn req_packed_commands<'a>(
        &'a mut self,
        pipeline: &'a redis::Pipeline,
        offset: usize,
        count: usize,
    ) -> redis::RedisFuture<'a, Vec<redis::Value>> {
        match self {
            Conn::Single(conn) => conn.req_packed_commands(pipeline, offset, count),
            Conn::Cluster(conn) => conn.req_packed_commands(pipeline, offset, count),
        }
    }

    fn get_db(&self) -> i64 {
        match self {
            Conn::Single(conn) => conn.get_db(),
            Conn::Cluster(conn) => conn.get_db(),
        }
    }
}

/// A key prefix no other test, process or run uses.
pub fn unique_prefix(tag: &str) -> String {
    static N: AtomicUsize = AtomicUsize::new(0);
    let nanos = SystemTime::now()
        .duration_since(UNIX_EPOCH)
        .map(|d| d.subsec_nanos())
        .unwrap_or(0);
    format!(
        "idem-t-{tag}-{}-{nanos}-{}",
        std::process::id(),
        N.fetch_add(1, Ordering::Relaxed)
    )
}

/// Deletes a test's keys when dropped.
#[derive(Debug)]
pub struct DeleteKeys {
    pub redis: Redis,
    pub prefix: String,
}

impl Drop for DeleteKeys {
    fn drop(&mut self) {
        self.redis.clean_up(std::mem::take(&mut self.prefix));
    }
}

/// Starts the local cluster of `.ci/redis-cluster` unless
/// `IDEM_REDIS_CLUSTER_URL` names one; once per test binary. The script
/// does nothing when the cluster is up already, and several test binaries
/// may call it at once.
pub fn ensure_local_cluster() {
    static STARTED: OnceLock<()> = OnceLock::new();
    if std::env::var_os(Redis::Cluster.var()).is_some() {
        return;
    }
    STARTED.get_or_init(|| {
        // Up already (the usual case, and always in a child process of a
        // test): no script to run.
        let up = std::net::TcpStream::connect_timeout(
            &std::net::SocketAddr::from(([127, 0, 0, 1], 7100)),
            Duration::from_secs(1),
        )
        .is_ok();
        if up {
            return;
        }
        let script = concat!(env!("CARGO_MANIFEST_DIR"), "/.ci/redis-cluster");
        let status = std::process::Command::new(script)
            .arg("start")
            .stdout(std::process::Stdio::null())
            .status();
        match status {
            Ok(status) if status.success() => {}
            Ok(status) => panic!(
                "starting the local Redis Cluster ({script} start) failed: {status}; \
                 set {} to a reachable cluster",
                Redis::Cluster.var()
            ),
            Err(err) => panic!("cannot run {script}: {err}"),
        }
    });
}
