//! How to start a node: persistence, port, extra arguments.

/// How a node keeps its data across [`RedisNode::restart`](crate::RedisNode::restart).
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub enum Persistence {
    /// No RDB snapshots, no AOF (`--save "" --appendonly no`): a restart comes back empty.
    #[default]
    None,
    /// `--appendonly yes --appendfsync always`: a restart comes back with its keys.
    AppendFsyncAlways,
}

/// How to start a [`RedisNode`].
#[derive(Clone, Debug, Default)]
pub struct NodeConfig {
    pub(crate) persistence: Persistence,
    pub(crate) port: Option<u16>,
    pub(crate) extra_args: Vec<String>,
}

impl NodeConfig {
    /// The defaults: no persistence, a free loopback port, no extra arguments.
    pub fn new() -> Self {
        Self::default()
    }

    /// How the node keeps its data across restarts.
    pub fn persistence(mut self, persistence: Persistence) -> Self {
        self.persistence = persistence;
        self
    }

    /// A fixed port instead of a free one.
    pub fn port(mut self, port: u16) -> Self {
        self.port = Some(port);
        self
    }

    /// One more argument for the `redis-server` command line, e.g. `"--maxmemory"` then `"1mb"`.
    pub fn extra_arg(mut self, arg: impl Into<String>) -> Self {
        self.extra_args.push(arg.into());
        self
    }

    /// The same config with a free port: a cluster cannot share one fixed port.
    pub(crate) fn without_port(mut self) -> Self {
        self.port = None;
        self
    }
}
