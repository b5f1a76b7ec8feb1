//! Shared set-up for the integration tests: real nodes from redlock-testkit.
#![allow(dead_code)]

use std::time::{Duration, Instant};

use redlock::{Redlock, RedlockBuilder, Retry};
use redlock_testkit::{Cluster, NetFault};

/// `n` fresh nodes; panics with the testkit's message (how to install redis-server).
pub fn cluster(n: usize) -> Cluster {
    Cluster::start(n).unwrap_or_else(|err| panic!("cannot start {n} redis nodes: {err}"))
}

/// A builder over the cluster with test-friendly settings: one attempt, 10 s lease.
pub fn builder(cluster: &Cluster, node_timeout: Duration) -> RedlockBuilder {
    builder_for(cluster.urls(), node_timeout)
}

/// [`builder`] over any URLs (a faulty cluster's proxies).
pub fn builder_for(urls: Vec<String>, node_timeout: Duration) -> RedlockBuilder {
    Redlock::builder()
        .nodes(urls)
        .ttl(Duration::from_secs(10))
        .node_timeout(node_timeout)
        .retry(Retry::never())
}

pub fn client(cluster: &Cluster) -> Redlock {
    builder(cluster, Duration::from_millis(200)).build().unwrap()
}

/// One attempt, 10 s lease, 100 ms node timeout, over any URLs.
pub fn single_attempt(urls: Vec<String>) -> Redlock {
    builder_for(urls, Duration::from_millis(100)).build().unwrap()
}

/// A fixed delay each way, no jitter.
pub fn latency(ms: u64) -> NetFault {
    NetFault::Latency { fixed: Duration::from_millis(ms), jitter: Duration::ZERO }
}

/// Runs one raw command (`args[0]` and its arguments) on node `i`, ignoring the reply.
pub fn run(cluster: &Cluster, i: usize, args: &[&str]) {
    let mut con = cluster.node(i).connection().unwrap();
    let mut cmd = redis::cmd(args[0]);
    for arg in &args[1..] {
        cmd.arg(*arg);
    }
    let _: redis::Value = cmd.query(&mut con).unwrap();
}

/// Polls `check` until it holds or `within` passes.
pub async fn eventually(within: Duration, mut check: impl FnMut() -> bool) -> bool {
    let deadline = Instant::now() + within;
    loop {
        if check() {
            return true;
        }
        if Instant::now() >= deadline {
            return false;
        }
        tokio::time::sleep(Duration::from_millis(10)).await;
    }
}

/// How many pub/sub subscribers each node has for the release channel of `key`.
pub fn subscribers(cluster: &Cluster, key: &str) -> Vec<i64> {
    let channel = format!("redlock:released:{key}");
    cluster
        .nodes()
        .iter()
        .map(|node| {
            let mut con = node.connection().unwrap();
            let (_, count): (String, i64) =
                redis::cmd("PUBSUB").arg("NUMSUB").arg(&channel).query(&mut con).unwrap();
            count
        })
        .collect()
}

/// Log output captured in memory, for tests that read what the library logged: a
/// `tracing_subscriber` writer (`.with_writer(move || LogBuffer(shared.clone()))`).
#[derive(Clone, Default)]
pub struct LogBuffer(pub std::sync::Arc<std::sync::Mutex<Vec<u8>>>);

impl std::io::Write for LogBuffer {
    fn write(&mut self, bytes: &[u8]) -> std::io::Result<usize> {
        self.0.lock().unwrap().extend_from_slice(bytes);
        Ok(bytes.len())
    }
    fn flush(&mut self) -> std::io::Result<()> {
        Ok(())
    }
}
