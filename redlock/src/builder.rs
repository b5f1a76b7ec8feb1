//! Configuration, validated once in `build()`.

use std::collections::HashMap;
use std::sync::Arc;
use std::time::Duration;

use crate::client::Redlock;
use crate::config::{Config, Ttl};
use crate::engine::Core;
use crate::error::{Error, Result};
use crate::node::Node;
use crate::retry::Retry;
use crate::secret::{RedactedUrls, redact_url};
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
/// - `ttl`: 10 s (the TTL of every grant and extension that names none)
/// - `node_timeout`: 50 ms per node, per request, from when its node has a connection
/// - `connect_timeout`: 1 s (the longest one connection attempt may run; a request to a
///   node with no connection waits for it first)
/// - `drift_factor`: 0.01 (the drift allowance is `ttl x 0.01 + 2 ms`)
/// - `retry`: [`Retry::default()`]: a waiting request (`lock()`, `read()`, `write()`, ...)
///   tries every 100-200 ms, woken sooner by releases, for up to one TTL of its lock, then
///   answers `NotAcquired`
/// - `key_prefix`: none (the key is the resource name)
/// - `restart_quarantine`: off (`Duration::ZERO`)
/// - `connections_per_runtime`: on
/// - TLS (`rediss://` nodes, with a TLS feature): the system's root certificates (with
///   `tls-rustls-webpki-roots`, the Mozilla roots), no client certificate
///
/// `Debug` never prints a password: node URLs show as `redis://user:***@host:6379`, and a
/// client key as its length.
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
#[derive(Clone)]
#[must_use = "a builder does nothing until build() is called"]
pub struct RedlockBuilder {
    nodes: Vec<String>,
    tls: TlsOptions,
    ttl: Duration,
    node_timeout: Duration,
    connect_timeout: Duration,
    drift_factor: f64,
    retry: Retry,
    key_prefix: String,
    restart_quarantine: Duration,
    owner_label: Option<String>,
    connections_per_runtime: bool,
}

impl Default for RedlockBuilder {
    fn default() -> Self {
        Self {
            nodes: Vec::new(),
            tls: TlsOptions::default(),
            ttl: Duration::from_secs(10),
            node_timeout: Duration::from_millis(50),
            connect_timeout: Duration::from_secs(1),
            drift_factor: 0.01,
            retry: Retry::default(),
            key_prefix: String::new(),
            restart_quarantine: Duration::ZERO,
            owner_label: None,
            connections_per_runtime: true,
        }
    }
}

impl std::fmt::Debug for RedlockBuilder {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("RedlockBuilder")
            .field("nodes", &RedactedUrls(&self.nodes))
            .field("tls", &self.tls)
            .field("ttl", &self.ttl)
            .field("node_timeout", &self.node_timeout)
            .field("connect_timeout", &self.connect_timeout)
            .field("drift_factor", &self.drift_factor)
            .field("retry", &self.retry)
            .field("key_prefix", &self.key_prefix)
            .field("restart_quarantine", &self.restart_quarantine)
            .field("connections_per_runtime", &self.connections_per_runtime)
            .finish()
    }
}

/// The certificates for `rediss://` nodes; PEM bytes.
#[derive(Clone, Default)]
struct TlsOptions {
    root_ca: Option<Vec<u8>>,
    /// Certificate (chain) and private key.
    client: Option<(Vec<u8>, Vec<u8>)>,
}

impl std::fmt::Debug for TlsOptions {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        let bytes = |pem: &Vec<u8>| format!("<{} bytes of PEM>", pem.len());
        f.debug_struct("TlsOptions")
            .field("root_ca", &self.root_ca.as_ref().map(bytes))
            .field("client_cert", &self.client.as_ref().map(|(cert, _)| bytes(cert)))
            .field("client_key", &self.client.as_ref().map(|_| "<redacted>"))
            .finish()
    }
}

/// Whether the library was built with TLS.
const TLS_COMPILED: bool = cfg!(any(feature = "tls-rustls", feature = "tls-native-tls"));

impl RedlockBuilder {
    /// A builder with the defaults and no nodes.
    pub fn new() -> Self {
        Self::default()
    }

    /// The independent masters, as `redis://[user:password@]host:port[/db]` URLs, or
    /// `rediss://` for TLS (with the `tls-rustls`, `tls-rustls-webpki-roots` or
    /// `tls-native-tls` feature; without one, `build()` refuses them). Adds to any nodes
    /// given before. Passwords are never printed (see [`RedlockBuilder`]).
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

    /// How long one request to one node may take once the node has a connection (see
    /// [`connect_timeout`](Self::connect_timeout)); much shorter than the TTL, so that a
    /// dead node costs little of the lease.
    pub fn node_timeout(mut self, timeout: Duration) -> Self {
        self.node_timeout = timeout;
        self
    }

    /// How long one connection attempt (TCP, TLS, AUTH, the script preload, the server
    /// check) may run. A request to a node with no connection waits for the connect first,
    /// at most this long, and only then starts its node timeout: a connect is several round
    /// trips, more than a node timeout sized for one. After a connect that failed, the next
    /// one is waited for only within the node timeout (it goes on in the background for
    /// the callers that come next), until one succeeds. [`Redlock::connect`] opens every
    /// node's connection up front.
    pub fn connect_timeout(mut self, timeout: Duration) -> Self {
        self.connect_timeout = timeout;
        self
    }

    /// The clock-rate error allowed between this client and the nodes, in `[0, 1)`.
    pub fn drift_factor(mut self, factor: f64) -> Self {
        self.drift_factor = factor;
        self
    }

    /// The retry policy of [`Redlock::lock`] and the other waiting requests; by default
    /// they wait for up to one TTL of their lock (see [`Retry`]).
    pub fn retry(mut self, retry: Retry) -> Self {
        self.retry = retry;
        self
    }

    /// A prefix put before every resource name to form its key.
    pub fn key_prefix(mut self, prefix: impl Into<String>) -> Self {
        self.key_prefix = prefix.into();
        self
    }

    /// A label that says who holds a lock (such as `host/pid`), stored with every token of
    /// this client: `<40 hex>.<label>`, so that `redis-cli GET` and
    /// [`Redlock::inspect`](crate::Redlock::inspect) show it. Tokens are still compared
    /// whole, so safety is unchanged. At most 64 characters of `A-Z a-z 0-9 . _ / @ -`.
    /// Default: none.
    pub fn owner_label(mut self, label: impl Into<String>) -> Self {
        self.owner_label = Some(label.into());
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

    /// Whether each multi-thread Tokio runtime that uses the client gets a connection of its
    /// own to every node, opened there on first use and closed when the runtime ends, so
    /// that its requests cross no thread (about a quarter of an uncontended lock's
    /// latency). The client's own thread keeps one for its background work and for callers
    /// on current-thread runtimes, which run only while their `block_on` does.
    ///
    /// On by default. Turn it off for a multi-thread runtime built without `enable_io`:
    /// Tokio panics when such a runtime opens a socket, and the client then falls back to
    /// its own thread's connection after one caught panic per node (a build with
    /// `panic = "abort"` aborts instead). Turn it off too where a task may block every
    /// worker of its runtime while it waits for a lock (another executor's `block_on`
    /// called in a task): the connection's driver then has no worker to run on, and the
    /// call never returns.
    pub fn connections_per_runtime(mut self, on: bool) -> Self {
        self.connections_per_runtime = on;
        self
    }

    /// Trusts the CA certificate(s) in `pem` (PEM, one or more certificates) for every
    /// `rediss://` node, besides the default roots.
    #[cfg(any(feature = "tls-rustls", feature = "tls-native-tls"))]
    pub fn tls_root_ca(mut self, pem: impl Into<Vec<u8>>) -> Self {
        self.tls.root_ca = Some(pem.into());
        self
    }

    /// Presents a client certificate (mutual TLS) to every `rediss://` node: `cert_pem` the
    /// certificate (chain), `key_pem` its private key, both PEM. The key is never printed.
    #[cfg(any(feature = "tls-rustls", feature = "tls-native-tls"))]
    pub fn tls_client_cert(
        mut self,
        cert_pem: impl Into<Vec<u8>>,
        key_pem: impl Into<Vec<u8>>,
    ) -> Self {
        self.tls.client = Some((cert_pem.into(), key_pem.into()));
        self
    }

    /// Checks the configuration and creates the client. Fails with
    /// [`ErrorKind::Config`](crate::ErrorKind::Config) for no nodes, an unparsable or
    /// duplicate URL, a TTL that rounds to zero milliseconds (or is absurdly long) or leaves
    /// nothing after the drift allowance, a zero timeout (or one over 100 years), a drift
    /// factor outside `[0, 1)` or a retry policy that never starts or never ends, and for a
    /// `rediss://` node when the library was built without a TLS feature.
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
        // The bounds summed from them (a hold's horizon) stay far from overflowing.
        if self.node_timeout.max(self.connect_timeout) > crate::quorum::MAX_TTL {
            return Err(Error::config("node_timeout and connect_timeout must be under 100 years"));
        }
        self.retry.validate().map_err(Error::config)?;
        let config = Config {
            ttl,
            node_timeout: self.node_timeout,
            connect_timeout: self.connect_timeout,
            drift_factor: self.drift_factor,
            retry: self.retry,
            key_prefix: self.key_prefix.clone(),
            restart_quarantine: self.restart_quarantine,
            owner_label: match &self.owner_label {
                Some(label) => {
                    Some(crate::token::check_label(label).map_err(Error::config)?.into())
                }
                None => None,
            },
        };
        // The prefix alone must make a valid key.
        config.key("x")?;

        let tasks = Arc::new(Tasks::default());
        let servers = Arc::new(crate::server::Servers::default());
        // Each server's address, with the first node listed there.
        let mut seen: HashMap<String, (usize, Arc<str>)> = HashMap::new();
        let mut nodes = Vec::with_capacity(self.nodes.len());
        for (i, url) in self.nodes.iter().enumerate() {
            let client = self.client(i, url)?;
            let node = Node::new(
                client,
                config.connect_timeout,
                config.restart_quarantine,
                tasks.clone(),
                servers.clone(),
            )
            .connections_per_runtime(self.connections_per_runtime);
            if let Some((first, name)) = seen.get(&node.address()) {
                // Counting one master twice (even as two databases) would give one process
                // two votes.
                let message = if **name == **node.name() {
                    format!("node {i}: {name} is listed twice (nodes {first} and {i})")
                } else {
                    format!(
                        "node {i}: {} is the same server as node {first} ({name}): two \
                         databases of one server fail together, so they would give one process \
                         two votes; list each master once",
                        node.name()
                    )
                };
                return Err(Error::config(message));
            }
            seen.insert(node.address(), (i, node.name().clone()));
            nodes.push(Arc::new(node));
        }
        Ok(Redlock::from_core(Core::new(nodes, config, tasks)))
    }

    /// The client of node `i`, with the TLS options for a `rediss://` URL.
    fn client(&self, i: usize, url: &str) -> Result<redis::Client> {
        let unparsable = |err: redis::RedisError| {
            // redis-rs does not print the URL; the redacted one says which node it was.
            let why = err.detail().map_or_else(|| err.category().to_owned(), str::to_owned);
            Error::config(format!(
                "node {i}: `{}` is not a valid node URL ({why}); {URL_FORMS}",
                redact_url(url)
            ))
        };
        if url.trim().is_empty() {
            return Err(Error::config(format!("node {i}: the URL is empty; {URL_FORMS}")));
        }
        if !url.contains("://") {
            return Err(Error::config(format!(
                "node {i}: `{}` has no scheme; {URL_FORMS}",
                redact_url(url)
            )));
        }
        let is_tls = url.get(..9).is_some_and(|scheme| scheme.eq_ignore_ascii_case("rediss://"));
        if !is_tls {
            return redis::Client::open(url).map_err(unparsable);
        }
        if !TLS_COMPILED {
            return Err(Error::config(format!(
                "node {i}: {} is a TLS node, and this build of redlock-quorum has no TLS: \
                 enable its `tls-rustls` (or `tls-native-tls`) feature",
                redact_url(url)
            )));
        }
        tls::ensure_crypto_provider();
        if self.tls.root_ca.is_none() && self.tls.client.is_none() {
            return redis::Client::open(url).map_err(unparsable);
        }
        tls::client(url, &self.tls).map_err(|err| {
            Error::config(format!("node {i}: {}: TLS certificates refused: {err}", redact_url(url)))
        })
    }
}

/// What a node URL may look like, for the errors of one that is not valid.
const URL_FORMS: &str = "a node URL is `redis://[user:password@]host:port[/db]`, `rediss://...` \
                         for TLS (also `valkey://`, `valkeys://`), or `redis+unix:///path` \
                         (`unix:///path`) for a Unix socket";

/// TLS set-up, with whichever TLS feature is on.
#[cfg(any(feature = "tls-rustls", feature = "tls-native-tls"))]
mod tls {
    use super::TlsOptions;

    /// rustls needs a process-wide crypto provider, and redis-rs leaves the choice to the
    /// application: install ring's unless the application installed one (never panics;
    /// losing a race to another installer is fine, one is installed either way).
    pub(super) fn ensure_crypto_provider() {
        #[cfg(feature = "tls-rustls")]
        if rustls::crypto::CryptoProvider::get_default().is_none() {
            let _ = rustls::crypto::ring::default_provider().install_default();
        }
    }

    pub(super) fn client(url: &str, tls: &TlsOptions) -> redis::RedisResult<redis::Client> {
        let certificates = redis::TlsCertificates {
            client_tls: tls.client.as_ref().map(|(cert, key)| redis::ClientTlsConfig {
                client_cert: cert.clone(),
                client_key: key.clone(),
            }),
            root_cert: tls.root_ca.clone(),
        };
        redis::Client::build_with_tls(url, certificates)
    }
}

/// Without a TLS feature `build()` refuses `rediss://` before getting here.
#[cfg(not(any(feature = "tls-rustls", feature = "tls-native-tls")))]
mod tls {
    use super::TlsOptions;

    pub(super) fn ensure_crypto_provider() {}

    pub(super) fn client(url: &str, _: &TlsOptions) -> redis::RedisResult<redis::Client> {
        redis::Client::open(url)
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
        assert!(config_error(three().nodes(["redis://127.0.0.1:2/1"])).contains("same server"));
        assert!(config_error(three().ttl(Duration::ZERO)).contains("ttl"));
        assert!(config_error(three().ttl(Duration::from_micros(500))).contains("ttl"));
        assert!(config_error(three().ttl(Duration::from_millis(2))).contains("drift"));
        assert!(config_error(three().ttl(Duration::MAX)).contains("ttl"));
        assert!(config_error(three().node_timeout(Duration::ZERO)).contains("node_timeout"));
        assert!(config_error(three().connect_timeout(Duration::ZERO)).contains("connect_timeout"));
        assert!(config_error(three().connect_timeout(Duration::MAX)).contains("100 years"));
        assert!(config_error(three().node_timeout(Duration::MAX)).contains("100 years"));
        assert!(config_error(three().drift_factor(1.0)).contains("drift_factor"));
        assert!(config_error(three().drift_factor(-0.1)).contains("drift_factor"));
        assert!(config_error(three().drift_factor(f64::NAN)).contains("drift_factor"));
        assert!(config_error(three().retry(Retry::new().with_max_attempts(0))).contains("retry"));
    }

    #[test]
    fn a_url_that_is_not_one_shows_itself_redacted_and_the_forms_a_node_url_takes() {
        let forms = "a node URL is `redis://[user:password@]host:port[/db]`";
        assert_eq!(
            config_error(three().nodes(["127.0.0.1:7101"])),
            format!("invalid configuration: node 3: `127.0.0.1:7101` has no scheme; {URL_FORMS}")
        );
        let message = config_error(three().nodes(["app:s3cret@127.0.0.1:7101"]));
        assert!(message.contains("`***@127.0.0.1:7101` has no scheme"), "{message}");
        assert!(!message.contains("s3cret"), "{message}");
        let message = config_error(three().nodes([""]));
        assert!(message.contains("node 3: the URL is empty") && message.contains(forms));
        let message = config_error(three().nodes(["redis://:s3cret@[::1"]));
        assert!(message.contains("`redis://:***@[::1` is not a valid node URL"), "{message}");
        assert!(message.contains(forms) && !message.contains("InvalidClientConfig"), "{message}");
    }

    #[test]
    fn two_databases_of_one_server_are_refused_as_one_failure_domain() {
        let message = config_error(three().nodes(["redis://127.0.0.1:2/1"]));
        assert_eq!(
            message,
            "invalid configuration: node 3: 127.0.0.1:2/1 is the same server as node 1 \
             (127.0.0.1:2/0): two databases of one server fail together, so they would give \
             one process two votes; list each master once"
        );
        let message = config_error(three().nodes(["redis://127.0.0.1:2"]));
        assert!(message.contains("127.0.0.1:2/0 is listed twice (nodes 1 and 3)"), "{message}");
    }

    #[test]
    fn the_ttl_bounds_are_said_in_round_units() {
        let message = config_error(three().ttl(Duration::MAX));
        assert!(message.contains("between 1 ms and 36500 days (100 years)"), "{message}");
    }

    #[test]
    fn tls_nodes_need_a_tls_feature() {
        let builder = three().nodes(["rediss://:s3cret@127.0.0.1:4"]);
        if TLS_COMPILED {
            assert_eq!(builder.build().unwrap().node_count(), 4);
        } else {
            let message = config_error(builder);
            assert!(message.contains("node 3") && message.contains("tls-rustls"), "{message}");
            assert!(message.contains("rediss://:***@127.0.0.1:4"), "{message}");
        }
    }

    #[test]
    fn debug_and_errors_never_show_a_password() {
        let builder = three().nodes(["redis://app:s3cret@127.0.0.1:4", "redis://:s3cret@[::1"]);
        let debug = format!("{builder:?}");
        assert!(debug.contains("redis://app:***@127.0.0.1:4"), "{debug}");
        let message = config_error(builder);
        assert!(message.contains("node 4"), "{message}");
        for printed in [debug, message] {
            assert!(!printed.contains("s3cret"), "{printed}");
        }
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
                    prop_assert!(checked.deadline(start) > start);
                }
                Err(err) => prop_assert_eq!(err.kind(), ErrorKind::Config),
            }
        }
    }
}
