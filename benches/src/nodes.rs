//! The nodes a benchmark runs against.

use redlock_testkit::Cluster;

/// The nodes a benchmark runs against: the ones named in `REDLOCK_NODES`
/// (comma-separated URLs, e.g. the docker-compose masters), or a local cluster started
/// through the testkit and stopped when this value is dropped.
#[derive(Debug)]
pub struct Nodes {
    urls: Vec<String>,
    cluster: Option<Cluster>,
}

impl Nodes {
    /// Reads `REDLOCK_NODES`, or starts `n` local nodes.
    ///
    /// # Panics
    /// When the local nodes cannot be started (the message says how to install
    /// `redis-server`): a benchmark has nothing to measure without them.
    pub fn from_env_or_start(n: usize) -> Self {
        match std::env::var("REDLOCK_NODES") {
            Ok(list) if !list.trim().is_empty() => Self {
                urls: list.split(',').map(|url| url.trim().to_owned()).collect(),
                cluster: None,
            },
            _ => {
                let cluster =
                    Cluster::start(n).unwrap_or_else(|err| panic!("cannot start {n} nodes: {err}"));
                Self { urls: cluster.urls(), cluster: Some(cluster) }
            }
        }
    }

    /// The node URLs.
    pub fn urls(&self) -> Vec<String> {
        self.urls.clone()
    }

    /// The first `n` node URLs (all of them if there are fewer).
    pub fn first(&self, n: usize) -> Vec<String> {
        self.urls.iter().take(n).cloned().collect()
    }

    /// The local cluster, for fault injection; `None` for nodes from `REDLOCK_NODES`.
    pub fn cluster_mut(&mut self) -> Option<&mut Cluster> {
        self.cluster.as_mut()
    }
}
