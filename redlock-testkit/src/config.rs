//! How to start a node: persistence, port, TLS, password, extra arguments.

use std::fmt;

use crate::tls::ClientCerts;

/// How a node keeps its data across [`RedisNode::restart`](crate::RedisNode::restart).
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub enum Persistence {
    /// No RDB snapshots, no AOF (`--save "" --appendonly no`): a restart comes back empty.
    #[default]
    None,
    /// `--appendonly yes --appendfsync always`: a restart comes back with its keys.
    AppendFsyncAlways,
}

/// How to start a [`RedisNode`](crate::RedisNode).
///
/// # Default
/// No persistence, a free loopback port, plain TCP, no password, no extra arguments.
#[derive(Clone, Default)]
#[must_use = "a config does nothing until a node is started with it"]
pub struct NodeConfig {
    pub(crate) persistence: Persistence,
    pub(crate) port: Option<u16>,
    pub(crate) tls: Option<ClientCerts>,
    pub(crate) requirepass: Option<String>,
    pub(crate) extra_args: Vec<String>,
}

impl NodeConfig {
    /// The defaults: see [`NodeConfig`].
    pub fn new() -> Self {
        Self::default()
    }

    /// TLS only: the node listens with the testkit's [`Certificates`](crate::tls::Certificates)
    /// on its port and has no plain-TCP port (`--port 0 --tls-port PORT`), asking clients
    /// for a certificate as `client_certs` says. Its [`url`](crate::RedisNode::url) is then
    /// `rediss://...`.
    pub fn tls(mut self, client_certs: ClientCerts) -> Self {
        self.tls = Some(client_certs);
        self
    }

    /// `--requirepass password`: the default user needs it. The node's
    /// [`url`](crate::RedisNode::url) and the testkit's own connections include it.
    pub fn requirepass(mut self, password: impl Into<String>) -> Self {
        self.requirepass = Some(password.into());
        self
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

impl fmt::Debug for NodeConfig {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("NodeConfig")
            .field("persistence", &self.persistence)
            .field("port", &self.port)
            .field("tls", &self.tls)
            // Never print a secret: tests check that passwords leak nowhere.
            .field("requirepass", &self.requirepass.as_ref().map(|_| "***"))
            .field("extra_args", &self.extra_args)
            .finish()
    }
}
