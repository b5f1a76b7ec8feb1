//! Several independent nodes, as a Redlock deployment has.

use std::thread;

use crate::{
    error::Result,
    node::{NodeConfig, RedisNode},
};

/// `n` independent [`RedisNode`]s, each on its own free port.
#[derive(Debug)]
pub struct Cluster {
    nodes: Vec<RedisNode>,
}

impl Cluster {
    /// Starts `n` nodes with the default config.
    pub fn start(n: usize) -> Result<Cluster> {
        Self::start_with(n, NodeConfig::new())
    }

    /// Starts `n` nodes with `config`; its port is ignored (each node gets a free one).
    pub fn start_with(n: usize, config: NodeConfig) -> Result<Cluster> {
        let config = config.without_port();
        // In parallel: AOF nodes take a while to start, and tests start many clusters.
        // On an error, the nodes already started are dropped, so killed.
        let nodes = thread::scope(|s| {
            let handles: Vec<_> = (0..n)
                .map(|_| {
                    let config = config.clone();
                    s.spawn(move || RedisNode::start_with(config))
                })
                .collect();
            handles
                .into_iter()
                .map(|h| h.join().unwrap_or_else(|p| std::panic::resume_unwind(p)))
                .collect::<Result<Vec<_>>>()
        })?;
        Ok(Cluster { nodes })
    }

    /// Every node's URL, in node order.
    pub fn urls(&self) -> Vec<String> {
        self.nodes.iter().map(RedisNode::url).collect()
    }

    /// Number of nodes (running or not).
    pub fn len(&self) -> usize {
        self.nodes.len()
    }

    /// Whether there are no nodes.
    pub fn is_empty(&self) -> bool {
        self.nodes.is_empty()
    }

    /// Node `i`. Panics if out of range.
    pub fn node(&self, i: usize) -> &RedisNode {
        &self.nodes[i]
    }

    /// Node `i`, to kill, restart or pause it. Panics if out of range.
    pub fn node_mut(&mut self, i: usize) -> &mut RedisNode {
        &mut self.nodes[i]
    }

    /// All nodes.
    pub fn nodes(&self) -> &[RedisNode] {
        &self.nodes
    }

    /// All nodes, mutably.
    pub fn nodes_mut(&mut self) -> &mut [RedisNode] {
        &mut self.nodes
    }

    /// On which nodes `key` currently holds `value` (indexes). Killed and
    /// paused nodes are skipped, never contacted (a paused node would hang
    /// the read); a node that errors counts as not holding it.
    pub fn nodes_holding(&self, key: &str, value: &str) -> Vec<usize> {
        self.reachable()
            .filter(|(_, node)| node.get(key).ok().flatten().as_deref() == Some(value))
            .map(|(i, _)| i)
            .collect()
    }

    /// How many live, unpaused nodes have `key` at all.
    pub fn count_key(&self, key: &str) -> usize {
        self.reachable().filter(|(_, node)| node.exists(key).unwrap_or(false)).count()
    }

    fn reachable(&self) -> impl Iterator<Item = (usize, &RedisNode)> {
        self.nodes.iter().enumerate().filter(|(_, node)| node.is_running() && !node.is_paused())
    }
}
