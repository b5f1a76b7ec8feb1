//! Faults as data, and a cluster with a proxy in front of every node to apply them.

use std::time::Duration;

use crate::{
    cluster::Cluster,
    config::NodeConfig,
    error::Result,
    proxy::{Fuzz, NetFault, Proxy},
};

/// One fault to inject into a node, so suites can be tables of faults.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Fault {
    /// SIGKILL the process: connections close, new ones are refused.
    Kill,
    /// Kill, delete the node's data, start again at once: the node lost its
    /// keys (and its disk, if it has one).
    RestartEmpty,
    /// Kill and start again at once with its data. The keys survive only with
    /// [`Persistence::AppendFsyncAlways`](crate::Persistence::AppendFsyncAlways);
    /// with `Persistence::None` the node comes back empty, as `RestartEmpty`.
    RestartPersisted,
    /// SIGSTOP the process: a hung node, connections stay open, nothing answers.
    Pause,
    /// Delay all traffic, via the node's proxy; see [`NetFault::Latency`].
    Latency {
        /// The delay of every chunk, each way.
        fixed: Duration,
        /// The bound of a random extra delay.
        jitter: Duration,
    },
    /// A network partition, via the node's proxy; see [`NetFault::Blackhole`].
    Blackhole,
    /// Connection resets, via the node's proxy; see [`NetFault::Reset`].
    Reset,
}

impl Fault {
    /// Whether the fault is applied by the proxy (the node process is untouched).
    pub fn is_network(&self) -> bool {
        matches!(self, Fault::Latency { .. } | Fault::Blackhole | Fault::Reset)
    }

    /// A short stable name, for tables and test output: `"kill"`,
    /// `"restart-empty"`, `"restart-persisted"`, `"pause"`, `"latency"`,
    /// `"blackhole"`, `"reset"`.
    pub fn name(&self) -> &'static str {
        match self {
            Fault::Kill => "kill",
            Fault::RestartEmpty => "restart-empty",
            Fault::RestartPersisted => "restart-persisted",
            Fault::Pause => "pause",
            Fault::Latency { .. } => "latency",
            Fault::Blackhole => "blackhole",
            Fault::Reset => "reset",
        }
    }

    /// The proxy's fault for a network fault, `None` for a process fault.
    fn net_fault(&self) -> Option<NetFault> {
        match *self {
            Fault::Latency { fixed, jitter } => Some(NetFault::Latency { fixed, jitter }),
            Fault::Blackhole => Some(NetFault::Blackhole),
            Fault::Reset => Some(NetFault::Reset),
            Fault::Kill | Fault::RestartEmpty | Fault::RestartPersisted | Fault::Pause => None,
        }
    }
}

/// A [`Cluster`] with a [`Proxy`] in front of every node, for each client: clients use
/// the proxies' [`urls_for`](Self::urls_for) their index ([`urls`](Self::urls) for a
/// single client); faults go through [`inject`](Self::inject).
///
/// With several clients ([`start_for_clients`](Self::start_for_clients)), each client has
/// its own proxy per node, so that faults of one client's connections
/// ([`fuzz_client`](Self::fuzz_client), [`client_proxy`](Self::client_proxy)) never
/// touch another's. Faults of a node ([`inject`](Self::inject)) apply to every client.
///
/// Inspection through [`cluster`](Self::cluster) (e.g.
/// [`Cluster::nodes_holding`]) talks to the nodes directly, not through the
/// proxies, so it sees the nodes' state whatever the network faults.
#[derive(Debug)]
pub struct FaultyCluster {
    // Proxies first: dropped before the nodes, so their connections close
    // before the nodes are killed, not the other way round.
    /// `proxies[client][node]`.
    proxies: Vec<Vec<Proxy>>,
    cluster: Cluster,
}

impl FaultyCluster {
    /// Starts `n` nodes with the default config, each behind a proxy.
    pub fn start(n: usize) -> Result<Self> {
        Self::start_with(n, NodeConfig::new())
    }

    /// Starts `n` nodes with `config` (its port is ignored), each behind a proxy.
    pub fn start_with(n: usize, config: NodeConfig) -> Result<Self> {
        Self::start_for_clients(n, 1, config)
    }

    /// Starts `n` nodes with `config` (its port is ignored), each behind one proxy per
    /// client.
    ///
    /// # Panics
    /// When `clients` is 0.
    pub fn start_for_clients(n: usize, clients: usize, config: NodeConfig) -> Result<Self> {
        assert!(clients > 0, "FaultyCluster::start_for_clients: at least one client");
        let cluster = Cluster::start_with(n, config)?;
        // A node keeps its port across restarts, so the proxy's upstream stays valid.
        let proxies = (0..clients)
            .map(|_| cluster.nodes().iter().map(|node| Proxy::start(node.port())).collect())
            .collect::<Result<_>>()?;
        Ok(FaultyCluster { proxies, cluster })
    }

    /// Client 0's proxy URLs, in node order: what a single client should use.
    pub fn urls(&self) -> Vec<String> {
        self.urls_for(0)
    }

    /// The URLs of `client`'s own proxies, in node order.
    ///
    /// # Panics
    /// When `client` is out of range.
    pub fn urls_for(&self, client: usize) -> Vec<String> {
        // The node's URL (scheme, password) with the proxy's port: TLS passes through.
        let nodes = self.cluster.nodes();
        nodes
            .iter()
            .zip(&self.proxies[client])
            .map(|(node, proxy)| node.url_via(proxy.port()))
            .collect()
    }

    /// [`urls_for`](Self::urls_for) logging in as the ACL user `name` (see
    /// [`RedisNode::acl_setuser`](crate::RedisNode::acl_setuser)).
    ///
    /// # Panics
    /// When `client` is out of range.
    pub fn urls_as(&self, client: usize, name: &str, password: &str) -> Vec<String> {
        let nodes = self.cluster.nodes();
        nodes
            .iter()
            .zip(&self.proxies[client])
            .map(|(node, proxy)| node.url_as_via(name, password, proxy.port()))
            .collect()
    }

    /// Number of nodes.
    pub fn len(&self) -> usize {
        self.cluster.len()
    }

    /// Whether there are no nodes.
    pub fn is_empty(&self) -> bool {
        self.cluster.is_empty()
    }

    /// Number of clients, each with its own proxies.
    pub fn clients(&self) -> usize {
        self.proxies.len()
    }

    /// The nodes, for direct inspection.
    pub fn cluster(&self) -> &Cluster {
        &self.cluster
    }

    /// The nodes, mutably, to act on them beyond [`Fault`]s.
    pub fn cluster_mut(&mut self) -> &mut Cluster {
        &mut self.cluster
    }

    /// Client 0's proxy in front of node `i`.
    ///
    /// # Panics
    /// When `i` is out of range.
    pub fn proxy(&self, i: usize) -> &Proxy {
        self.client_proxy(0, i)
    }

    /// `client`'s proxy in front of node `node`, to set a fault on that client's
    /// connections to that node only.
    ///
    /// # Panics
    /// When an index is out of range.
    pub fn client_proxy(&self, client: usize, node: usize) -> &Proxy {
        &self.proxies[client][node]
    }

    /// Fuzzes every connection of `client`: each of its proxies gets `fuzz` with a seed
    /// derived from the node's index ([`Fuzz::derive`]), so the nodes' schedules differ
    /// but all replay from `fuzz`'s seed. [`heal_client`](Self::heal_client) ends it.
    ///
    /// # Panics
    /// When `client` is out of range.
    pub fn fuzz_client(&self, client: usize, fuzz: Fuzz) {
        for (node, proxy) in (0u64..).zip(&self.proxies[client]) {
            proxy.set_fault(NetFault::Fuzz(fuzz.derive(node)));
        }
    }

    /// Clears the network faults of `client`'s proxies, whoever set them.
    ///
    /// # Panics
    /// When `client` is out of range.
    pub fn heal_client(&self, client: usize) {
        self.proxies[client].iter().for_each(Proxy::heal);
    }

    /// Applies `fault` to each of `nodes` (indexes), in order; stops at the
    /// first error. A network fault applies to every client's proxy of the node.
    ///
    /// Restarts are done when this returns (the node answers again); the
    /// other faults last until [`heal`](Self::heal).
    ///
    /// # Panics
    /// When an index is out of range.
    pub fn inject(&mut self, fault: Fault, nodes: &[usize]) -> Result<()> {
        for &i in nodes {
            let node = self.cluster.node_mut(i);
            match fault {
                Fault::Kill => node.kill()?,
                Fault::RestartEmpty => node.restart_empty()?,
                Fault::RestartPersisted => node.restart()?,
                Fault::Pause => node.pause()?,
                Fault::Latency { .. } | Fault::Blackhole | Fault::Reset => {
                    let net_fault = fault.net_fault().unwrap_or_default();
                    self.proxies.iter().for_each(|client| client[i].set_fault(net_fault));
                }
            }
        }
        Ok(())
    }

    /// Undoes whatever was injected on `nodes`: resumes paused nodes, starts
    /// killed ones again (same port and data dir), clears every client's proxy
    /// faults there. Heals every node even if one fails; returns the first error.
    ///
    /// # Panics
    /// When an index is out of range.
    pub fn heal(&mut self, nodes: &[usize]) -> Result<()> {
        let mut first_error = None;
        for &i in nodes {
            self.proxies.iter().for_each(|client| client[i].heal());
            let node = self.cluster.node_mut(i);
            let healed = if node.is_paused() { node.resume() } else { node.start_again() };
            if let Err(e) = healed {
                first_error.get_or_insert(e);
            }
        }
        first_error.map_or(Ok(()), Err)
    }

    /// [`heal`](Self::heal)s every node.
    pub fn heal_all(&mut self) -> Result<()> {
        let all: Vec<usize> = (0..self.len()).collect();
        self.heal(&all)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn names_are_distinct_and_network_faults_map_to_the_proxy() {
        let ms = Duration::from_millis;
        let all = [
            Fault::Kill,
            Fault::RestartEmpty,
            Fault::RestartPersisted,
            Fault::Pause,
            Fault::Latency { fixed: ms(1), jitter: ms(2) },
            Fault::Blackhole,
            Fault::Reset,
        ];
        let mut names: Vec<_> = all.iter().map(Fault::name).collect();
        names.sort_unstable();
        names.dedup();
        assert_eq!(names.len(), all.len());
        for fault in all {
            assert_eq!(fault.is_network(), fault.net_fault().is_some(), "{}", fault.name());
        }
        assert_eq!(
            Fault::Latency { fixed: ms(1), jitter: ms(2) }.net_fault(),
            Some(NetFault::Latency { fixed: ms(1), jitter: ms(2) })
        );
    }
}
