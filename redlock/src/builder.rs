//! Configuration, validated once in `build()`.

use std::collections::HashSet;
use std::sync::Arc;
use std::time::Duration;

use crate::client::Redlock;
use crate::config::{Config, Ttl};
use crate::engine::Core;
use crate::error::{Error, Result};
use crate::node::Node;
use crate::retry::Retry;
use crate::tasks::Tasks;

impl Redlock {
    /// Starts a [`RedlockBuilder`].
    pub fn builder() -> RedlockBuilder {
        RedlockBuilder::new()
    }
}

/// Builds a [`Redlock`]. `build()` checks everything and never touches the network:
/// connections open lazily, on first use, so a node that is down at start-up is fine.
///
/// # Default
/// - `ttl`: 10 s (the lease of `lock()` and `try_lock()`)
/// - `node_timeout`: 50 ms per node, per request (connection set-up included)
/// - `connect_timeout`: 1 s (the longest a shared connect may run in the background)
/// - `drift_factor`: 0.01 (the drift allowance is `ttl x 0.01 + 2 ms`)
/// - `retry`: [`Retry::default()`]
/// - `key_prefix`: none (the key is the resource name)
/// - `restart_quarantine`: off (`Duration::ZERO`)
///
/// ```
/// use std::time::Duration;
/// use redlock::{Redlock, Retry};
///
/// let rl = Redlock::builder()
///     .nodes(["redis://127.0.0.1:7001", "redis://127.0.0.1:7002", "redis://127.0.0.1:7003"])
///     .ttl(Duration::from_secs(10))
///     .node_timeout(Duration::from_millis(50))
///     .drift_factor(0.01)
///     .retry(Retry::new().with_max_attempts(5))
///     .build()?;
/// assert_eq!(rl.quorum(), 2);
/// # Ok::<(), redlock::Error>(())
/// ```
#[derive(Clone, Debug)]
#[must_use = "a builder does nothing until build() is called"]
pub struct RedlockBuilder {
    nodes: Vec<String>,
    ttl: Duration,
    node_timeout: Duration,
    connect_timeout: Duration,
    drift_factor: f64,
    retry: Retry,
    key_prefix: String,
    restart_quarantine: Duration,
}

impl Default for RedlockBuilder {
    fn default() -> Self {
        Self {
            nodes: Vec::new(),
            ttl: Duration::from_secs(10),
            node_timeout: Duration::from_millis(50),
            connect_timeout: Duration::from_secs(1),
            drift_factor: 0.01,
            retry: Retry::default(),
            key_prefix: String::new(),
            restart_quarantine: Duration::ZERO,
        }
    }
}

impl RedlockBuilder {
    /// A builder with the defaults and no nodes.
    pub fn new() -> Self {
        Self::default()
    }

    /// The independent masters, as `redis://[user:password@]host:port[/db]` URLs (or
    /// `rediss://` where TLS is compiled into `redis`). Adds to any nodes given before.
    pub fn nodes<I>(mut self, urls: I) -> Self
    where
        I: IntoIterator,
        I::Item: Into<String>,
    {
        self.nodes.extend(urls.into_iter().map(Into::into));
        self
    }

    /// The default lease. Must be at least 1 ms and longer than its drift allowance.
    pub fn ttl(mut self, ttl: Duration) -> Self {
        self.ttl = ttl;
        self
    }

    /// How long one request to one node may take, connecting included; much shorter than
    /// the TTL, so that a dead node costs little of the lease.
    pub fn node_timeout(mut self, timeout: Duration) -> Self {
        self.node_timeout = timeout;
        self
    }

    /// How long one connection attempt may run. Callers never wait for it longer than
    /// their node timeout; it goes on for the callers that come next.
    pub fn connect_timeout(mut self, timeout: Duration) -> Self {
        self.connect_timeout = timeout;
        self
    }

    /// The clock-rate error allowed between this client and the nodes, in `[0, 1)`.
    pub fn drift_factor(mut self, factor: f64) -> Self {
        self.drift_factor = factor;
        self
    }

    /// The retry policy of [`Redlock::lock`].
    pub fn retry(mut self, retry: Retry) -> Self {
        self.retry = retry;
        self
    }

    /// A prefix put before every resource name to form its key.
    pub fn key_prefix(mut self, prefix: impl Into<String>) -> Self {
        self.key_prefix = prefix.into();
        self
    }

    /// Keeps a node whose Redis process started less than `period` ago out of the quorum
    /// of acquire and extend (keys are still written and released there).
    ///
    /// This is the Redlock spec's "delayed restart", done by the client, for masters that run
    /// without `appendfsync always`: a master that restarted empty may have forgotten a lock
    /// that another client still holds, so it must not vote until every lease it could have
    /// held is over. Use at least the longest lease any client takes. The node's start is
    /// read from its uptime (`INFO server`) whenever a connection opens, then tracked with the
    /// local monotonic clock; the uptime's one-second resolution is rounded against us.
    ///
    /// Off by default (`Duration::ZERO`): with it on, a freshly started cluster refuses every
    /// lock for one period.
    pub fn restart_quarantine(mut self, period: Duration) -> Self {
        self.restart_quarantine = period;
        self
    }

    /// Checks the configuration and creates the client. Fails with
    /// [`ErrorKind::Config`](crate::ErrorKind::Config) for no nodes, an unparsable or
    /// duplicate URL, a TTL that rounds to zero milliseconds (or is absurdly long) or leaves
    /// nothing after the drift allowance, a zero timeout, a drift factor outside `[0, 1)`
    /// or a retry policy that never starts or never ends.
    pub fn build(self) -> Result<Redlock> {
        if self.nodes.is_empty() {
            return Err(Error::config("no nodes given"));
        }
        let ttl = Ttl::new(self.ttl, self.drift_factor)?;
        if self.node_timeout.is_zero() {
            return Err(Error::config("node_timeout must be greater than zero"));
        }
        if self.connect_timeout.is_zero() {
            return Err(Error::config("connect_timeout must be greater than zero"));
        }
        self.retry.validate().map_err(Error::config)?;
        let config = Config {
            ttl,
            node_timeout: self.node_timeout,
            connect_timeout: self.connect_timeout,
            drift_factor: self.drift_factor,
            retry: self.retry,
            key_prefix: self.key_prefix,
            restart_quarantine: self.restart_quarantine,
        };
        // The prefix alone must make a valid key.
        config.key("x")?;

        let tasks = Arc::new(Tasks::default());
        let mut seen = HashSet::new();
        let mut nodes = Vec::with_capacity(self.nodes.len());
        for (i, url) in self.nodes.iter().enumerate() {
            let client = redis::Client::open(url.as_str())
                .map_err(|err| Error::config(format!("node {i}: unparsable URL: {err}")))?;
            let node =
                Node::new(client, config.connect_timeout, config.restart_quarantine, tasks.clone());
            if !seen.insert(node.address()) {
                // Counting one master twice (even as two databases) would give one process
                // two votes.
                return Err(Error::config(format!("node {i}: {} is listed twice", node.name())));
            }
            nodes.push(Arc::new(node));
        }
        Ok(Redlock::from_core(Core::new(nodes, config, tasks)))
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::ErrorKind;
    use proptest::prelude::*;

    fn three() -> RedlockBuilder {
        RedlockBuilder::new().nodes([
            "redis://127.0.0.1:1",
            "redis://127.0.0.1:2",
            "redis://127.0.0.1:3",
        ])
    }

    fn config_error(builder: RedlockBuilder) -> String {
        let err = builder.build().unwrap_err();
        assert_eq!(err.kind(), ErrorKind::Config);
        err.to_string()
    }

    #[test]
    fn rejects_bad_configuration() {
        assert!(config_error(RedlockBuilder::new()).contains("no nodes"));
        assert!(config_error(three().nodes(["not a url"])).contains("node 3"));
        assert!(config_error(three().nodes(["redis://127.0.0.1:2"])).contains("twice"));
        assert!(config_error(three().nodes(["redis://127.0.0.1:2/1"])).contains("twice"));
        assert!(config_error(three().ttl(Duration::ZERO)).contains("ttl"));
        assert!(config_error(three().ttl(Duration::from_micros(500))).contains("ttl"));
        assert!(config_error(three().ttl(Duration::from_millis(2))).contains("drift"));
        assert!(config_error(three().ttl(Duration::MAX)).contains("ttl"));
        assert!(config_error(three().node_timeout(Duration::ZERO)).contains("node_timeout"));
        assert!(config_error(three().connect_timeout(Duration::ZERO)).contains("connect_timeout"));
        assert!(config_error(three().drift_factor(1.0)).contains("drift_factor"));
        assert!(config_error(three().drift_factor(-0.1)).contains("drift_factor"));
        assert!(config_error(three().drift_factor(f64::NAN)).contains("drift_factor"));
        assert!(config_error(three().retry(Retry::new().with_max_attempts(0))).contains("retry"));
    }

    #[test]
    fn builds_without_any_node_up() {
        let rl = three().build().unwrap();
        assert_eq!(rl.quorum(), 2);
    }

    #[test]
    fn quorum_for_any_node_count() {
        for n in 1..=8usize {
            let urls = (0..n).map(|i| format!("redis://127.0.0.1:{}", 7000 + i));
            let rl = RedlockBuilder::new().nodes(urls).build().unwrap();
            assert_eq!(rl.quorum(), n / 2 + 1);
        }
    }

    proptest! {
        #[test]
        fn ttl_check_accepts_exactly_the_leases_with_validity_left(
            ttl_us in 0u64..100_000_000,
            factor in -0.5f64..1.5,
        ) {
            let ttl = Duration::from_micros(ttl_us);
            match Ttl::new(ttl, factor) {
                Ok(checked) => {
                    prop_assert!((0.0..1.0).contains(&factor));
                    let lease = checked.duration();
                    prop_assert!(lease <= ttl);
                    let start = std::time::Instant::now();
                    prop_assert!(checked.validity(start, start).is_some());
                }
                Err(err) => prop_assert_eq!(err.kind(), ErrorKind::Config),
            }
        }
    }
}
