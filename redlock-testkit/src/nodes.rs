//! The nodes an example or a benchmark runs against: given by the environment, or
//! started here.

use crate::{cluster::Cluster, error::Result};

/// The env var that names external nodes: comma-separated URLs, e.g.
/// `redis://127.0.0.1:7001,redis://127.0.0.1:7002,redis://127.0.0.1:7003`.
pub const NODES_ENV: &str = "REDLOCK_NODES";

/// The nodes an example or a benchmark runs against: the ones named in
/// `$REDLOCK_NODES` (e.g. the docker-compose masters, or a `redlock-cluster` started in
/// another shell), or a local [`Cluster`] started here and stopped when this value is
/// dropped.
///
/// ```no_run
/// let nodes = redlock_testkit::Nodes::from_env_or_start(5)?;
/// for url in nodes.urls() {
///     println!("node {url}");
/// }
/// # Ok::<(), redlock_testkit::Error>(())
/// ```
#[derive(Debug)]
pub struct Nodes {
    urls: Vec<String>,
    cluster: Option<Cluster>,
}

impl Nodes {
    /// The nodes of `$REDLOCK_NODES` if it names any, else `n` local nodes started now.
    ///
    /// # Errors
    /// When the local nodes cannot be started (the message says how to install
    /// `redis-server`).
    pub fn from_env_or_start(n: usize) -> Result<Nodes> {
        Self::from_list_or_start(std::env::var(NODES_ENV).ok().as_deref(), n)
    }

    /// The nodes of `list` (comma-separated URLs) if it names any, else `n` local nodes.
    /// Takes the value instead of reading the env var, so it can be tested without
    /// mutating the environment (unsafe in edition 2024).
    fn from_list_or_start(list: Option<&str>, n: usize) -> Result<Nodes> {
        let urls = list.map(parse_list).unwrap_or_default();
        if !urls.is_empty() {
            return Ok(Nodes { urls, cluster: None });
        }
        let cluster = Cluster::start(n)?;
        Ok(Nodes { urls: cluster.urls(), cluster: Some(cluster) })
    }

    /// Every node's URL.
    pub fn urls(&self) -> Vec<String> {
        self.urls.clone()
    }

    /// The first `n` node URLs (all of them if there are fewer).
    pub fn first(&self, n: usize) -> Vec<String> {
        self.urls.iter().take(n).cloned().collect()
    }

    /// Whether the nodes were started here (not named by `$REDLOCK_NODES`): only then
    /// can they be killed or paused.
    pub fn is_local(&self) -> bool {
        self.cluster.is_some()
    }

    /// The local cluster, to inspect it; `None` for nodes from `$REDLOCK_NODES`.
    pub fn cluster(&self) -> Option<&Cluster> {
        self.cluster.as_ref()
    }

    /// The local cluster, for fault injection; `None` for nodes from `$REDLOCK_NODES`.
    pub fn cluster_mut(&mut self) -> Option<&mut Cluster> {
        self.cluster.as_mut()
    }
}

/// The URLs of a comma-separated list, trimmed, empty entries skipped.
fn parse_list(list: &str) -> Vec<String> {
    list.split(',').map(str::trim).filter(|url| !url.is_empty()).map(str::to_owned).collect()
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_list_names_its_urls_and_starts_nothing() {
        let nodes =
            Nodes::from_list_or_start(Some(" redis://a:1, redis://b:2,,redis://c:3 "), 5).unwrap();
        assert_eq!(nodes.urls(), ["redis://a:1", "redis://b:2", "redis://c:3"]);
        assert_eq!(nodes.first(2), ["redis://a:1", "redis://b:2"]);
        assert_eq!(nodes.first(9).len(), 3);
        assert!(!nodes.is_local() && nodes.cluster().is_none());
    }

    #[test]
    fn no_list_or_an_empty_one_starts_local_nodes_that_answer() {
        for list in [None, Some(""), Some(" , ")] {
            let mut nodes = Nodes::from_list_or_start(list, 2).unwrap();
            assert!(nodes.is_local());
            assert_eq!(nodes.urls(), nodes.cluster().unwrap().urls());
            let cluster = nodes.cluster_mut().unwrap();
            cluster.node(1).set("k", "v").unwrap();
            assert_eq!(cluster.nodes_with_key("k").unwrap(), [1]);
        }
    }
}
