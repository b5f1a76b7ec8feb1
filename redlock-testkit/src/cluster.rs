//! Several independent nodes, as a Redlock deployment has.

use std::{
    collections::BTreeMap,
    thread,
    time::{Duration, Instant},
};

use crate::{config::NodeConfig, error::Result, node::RedisNode, wakeup::Wakeup};

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

    /// Pauses `nodes` (indexes) now and resumes them together after `duration`, each
    /// from a plain thread; see [`RedisNode::pause_for`].
    ///
    /// # Errors
    /// The first node that cannot be paused; the nodes paused before it are still
    /// resumed on time.
    ///
    /// # Panics
    /// When an index is out of range.
    pub fn pause_for(&mut self, nodes: &[usize], duration: Duration) -> Result<Wakeup> {
        let until = Instant::now() + duration;
        let mut wakeup = Wakeup::new(Vec::new());
        for &i in nodes {
            wakeup = wakeup.merge(self.nodes[i].pause_until(until)?);
        }
        Ok(wakeup)
    }

    // Inspection. Killed and paused nodes are skipped, never contacted: a paused node
    // would hang the read until its timeout.

    /// On which nodes `key` currently holds `value` (indexes). Killed and
    /// paused nodes are skipped, never contacted (a paused node would hang
    /// the read); a node that errors counts as not holding it.
    pub fn nodes_holding(&self, key: &str, value: &str) -> Vec<usize> {
        self.reachable()
            .filter(|(_, node)| node.get(key).ok().flatten().as_deref() == Some(value))
            .map(|(i, _)| i)
            .collect()
    }

    /// How many live, unpaused nodes have `key` at all; a node that errors counts as not.
    pub fn count_key(&self, key: &str) -> usize {
        self.reachable().filter(|(_, node)| node.exists(key).unwrap_or(false)).count()
    }

    /// On which live, unpaused nodes `key` exists, whatever its type or value (indexes).
    ///
    /// # Errors
    /// The first error of a node that was asked.
    pub fn nodes_with_key(&self, key: &str) -> Result<Vec<usize>> {
        let found = self.per_node(|node| node.exists(key))?;
        Ok(found
            .iter()
            .enumerate()
            .filter(|(_, has)| **has == Some(true))
            .map(|(i, _)| i)
            .collect())
    }

    /// Each node's `PTTL` of `key`, in node order: milliseconds left, -1 without expiry,
    /// -2 if missing; `None` for killed and paused nodes.
    ///
    /// # Errors
    /// The first error of a node that was asked.
    pub fn pttls(&self, key: &str) -> Result<Vec<Option<i64>>> {
        self.per_node(|node| node.pttl(key))
    }

    /// Each node's fields of the hash at `key`, in node order (empty if the key is
    /// missing); `None` for killed and paused nodes.
    ///
    /// # Errors
    /// The first error of a node that was asked, e.g. `WRONGTYPE` when the key is not a hash.
    pub fn hash_fields(&self, key: &str) -> Result<Vec<Option<BTreeMap<String, String>>>> {
        self.per_node(|node| node.hgetall(key))
    }

    /// How many keys match `pattern` over all live, unpaused nodes: `0` means no hold is
    /// left anywhere, e.g. `keys_everywhere("*")` after every lock was released.
    ///
    /// # Errors
    /// The first error of a node that was asked.
    pub fn keys_everywhere(&self, pattern: &str) -> Result<usize> {
        let keys = self.per_node(|node| node.keys(pattern))?.into_iter().flatten().flatten();
        Ok(keys.count())
    }

    /// `read` on every reachable node, `None` for the others, in node order.
    fn per_node<T>(&self, read: impl Fn(&RedisNode) -> Result<T>) -> Result<Vec<Option<T>>> {
        self.nodes
            .iter()
            .map(|node| if is_reachable(node) { read(node).map(Some) } else { Ok(None) })
            .collect()
    }

    fn reachable(&self) -> impl Iterator<Item = (usize, &RedisNode)> {
        self.nodes.iter().enumerate().filter(|(_, node)| is_reachable(node))
    }
}

/// Whether a read would be answered: running and not paused.
fn is_reachable(node: &RedisNode) -> bool {
    node.is_running() && !node.is_paused()
}
