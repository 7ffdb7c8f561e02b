//! Redis servers a test starts itself (on 127.0.0.1:7310-7329, no
//! persistence, SIGKILLed when dropped, even when the test fails): one
//! server, or a primary and its replica, for the tests that kill, promote
//! or reconfigure a server. Such tests hold [`FAILOVERS`](super::FAILOVERS).

use std::process::{Child, Command, Stdio};
use std::time::{Duration, Instant};

/// A `redis-server` of the test's own on one port, SIGKILLed when dropped.
pub struct Server {
    port: u16,
    child: Option<Child>,
}

impl Server {
    /// Starts a server on `port` with the options `extra`, and waits until
    /// it answers.
    pub async fn start(port: u16, extra: &[&str]) -> Server {
        let pid_file = std::env::temp_dir().join(format!("idem-own-redis-{port}.pid"));
        if std::net::TcpStream::connect(("127.0.0.1", port)).is_ok() {
            Server::kill_leftover(&pid_file).await;
        }
        assert!(
            std::net::TcpStream::connect(("127.0.0.1", port)).is_err(),
            "port {port} is in use: the test starts a Redis of its own there"
        );
        let child = Command::new("redis-server")
            .args(["--pidfile", &pid_file.to_string_lossy()])
            .args(["--port", &port.to_string()])
            .args(["--bind", "127.0.0.1", "--protected-mode", "no"])
            .args(["--save", "", "--appendonly", "no"])
            .args(["--dir", &std::env::temp_dir().to_string_lossy()])
            .args(["--dbfilename", &format!("idem-own-{port}.rdb")])
            .args(extra)
            .stdout(Stdio::null())
            .stderr(Stdio::null())
            .spawn()
            .unwrap_or_else(|err| panic!("start redis-server on {port}: {err}"));
        let server = Server {
            port,
            child: Some(child),
        };
        let started = Instant::now();
        while server.query(&["PING"]).await.is_err() {
            assert!(
                started.elapsed() < Duration::from_secs(10),
                "redis-server on {port} does not answer after 10 s"
            );
            tokio::time::sleep(Duration::from_millis(50)).await;
        }
        server
    }

    /// Kills the server a killed run of this test left behind (SIGKILL
    /// ends a test process without dropping its servers), named by its
    /// pid file, if it is a redis-server.
    async fn kill_leftover(pid_file: &std::path::Path) {
        let Some(pid) = std::fs::read_to_string(pid_file)
            .ok()
            .and_then(|pid| pid.trim().parse::<u32>().ok())
        else {
            return;
        };
        let comm = std::fs::read_to_string(format!("/proc/{pid}/comm")).unwrap_or_default();
        if comm.trim() != "redis-server" {
            return;
        }
        let _ = Command::new("kill")
            .args(["-KILL", &pid.to_string()])
            .status();
        for _ in 0..50 {
            if !std::path::Path::new(&format!("/proc/{pid}")).exists() {
                break;
            }
            tokio::time::sleep(Duration::from_millis(20)).await;
        }
    }

    /// Sends `signal` (`STOP`, `CONT`) to the server.
    pub fn signal(&self, signal: &str) {
        let pid = self.child.as_ref().expect("a live server").id();
        let status = Command::new("kill")
            .args([&format!("-{signal}"), &pid.to_string()])
            .status()
            .expect("run kill");
        assert!(status.success(), "kill -{signal} {pid}");
    }

    pub fn url(&self) -> String {
        format!("redis://127.0.0.1:{}", self.port)
    }

    /// One command on a connection of its own.
    pub async fn query(&self, args: &[&str]) -> redis::RedisResult<redis::Value> {
        let client = redis::Client::open(self.url())?;
        let mut conn = tokio::time::timeout(
            Duration::from_secs(2),
            client.get_multiplexed_async_connection(),
        )
        .await
        .map_err(|_| std::io::Error::from(std::io::ErrorKind::TimedOut))??;
        let mut cmd = redis::cmd(args[0]);
        for arg in &args[1..] {
            cmd.arg(*arg);
        }
        cmd.query_async(&mut conn).await
    }

    pub async fn info(&self, section: &str) -> String {
        match self.query(&["INFO", section]).await {
            Ok(redis::Value::BulkString(b)) => String::from_utf8_lossy(&b).into_owned(),
            Ok(redis::Value::VerbatimString { text, .. }) => text,
            other => panic!("INFO {section} on {}: {other:?}", self.port),
        }
    }

    /// SIGKILL: no shutdown, nothing more sent to its replicas.
    pub fn kill(&mut self) {
        if let Some(mut child) = self.child.take() {
            let _ = child.kill();
            let _ = child.wait();
        }
    }
}

impl Drop for Server {
    fn drop(&mut self) {
        self.kill();
    }
}

/// A primary on `port` and its replica on `port + 1`, once the replica
/// is in sync.
pub async fn primary_and_replica(port: u16) -> (Server, Server) {
    // No delay before the first sync (5 s by default).
    let primary = Server::start(port, &["--repl-diskless-sync-delay", "0"]).await;
    let replica = Server::start(port + 1, &["--replicaof", "127.0.0.1", &port.to_string()]).await;
    let started = Instant::now();
    while !replica
        .info("replication")
        .await
        .contains("master_link_status:up")
    {
        assert!(
            started.elapsed() < Duration::from_secs(10),
            "the replica on {} is not in sync after 10 s",
            port + 1
        );
        tokio::time::sleep(Duration::from_millis(50)).await;
    }
    (primary, replica)
}

/// Promotes the replica (`REPLICAOF NO ONE`): from then on, what the
/// primary writes reaches no replica, and is lost once the primary is
/// killed, as in a failover.
pub async fn promote(replica: &Server) {
    let promoted = replica.query(&["REPLICAOF", "NO", "ONE"]).await;
    assert!(promoted.is_ok(), "REPLICAOF NO ONE: {promoted:?}");
}
