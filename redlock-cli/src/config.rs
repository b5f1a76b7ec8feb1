//! Where the nodes are and how locks are taken: flags, each with its environment variable.

use std::time::Duration;

use redlock::{Redlock, RedlockBuilder};

/// Options shared by every subcommand.
#[derive(Debug, clap::Args)]
pub(crate) struct Options {
    /// The masters, comma-separated (`redis://host:6379,...`; passwords are never echoed).
    #[arg(
        long,
        env = "REDLOCK_NODES",
        value_delimiter = ',',
        global = true,
        hide_env_values = true
    )]
    pub(crate) nodes: Vec<String>,
    /// The lease of the lock, renewed while the command runs (e.g. `30s`).
    #[arg(long, env = "REDLOCK_TTL", default_value = "30s", value_parser = humantime::parse_duration, global = true)]
    pub(crate) ttl: Duration,
    /// How long a node may take to answer one request, once connected (e.g. `50ms`). Longer
    /// than the library's 50 ms: a job waits for no one's latency, and nodes behind TLS or in
    /// another zone can take a few tens of milliseconds a round trip. Connecting has its own
    /// timeout (`REDLOCK_CONNECT_TIMEOUT`), and every node is connected to at once first.
    #[arg(long, env = "REDLOCK_NODE_TIMEOUT", default_value = "250ms", value_parser = humantime::parse_duration, global = true)]
    pub(crate) node_timeout: Duration,
    /// Put before every resource name to make its key.
    #[arg(long, env = "REDLOCK_KEY_PREFIX", default_value = "", global = true)]
    pub(crate) key_prefix: String,
    /// A CA certificate (PEM file) to trust for `rediss://` nodes, besides the system's.
    #[arg(long, env = "REDLOCK_TLS_CA", global = true)]
    pub(crate) tls_ca: Option<std::path::PathBuf>,
    /// A client certificate (PEM file) for mutual TLS, with --tls-key.
    #[arg(long, env = "REDLOCK_TLS_CERT", global = true, requires = "tls_key")]
    pub(crate) tls_cert: Option<std::path::PathBuf>,
    /// The client certificate's private key (PEM file).
    #[arg(long, env = "REDLOCK_TLS_KEY", global = true, requires = "tls_cert")]
    pub(crate) tls_key: Option<std::path::PathBuf>,
    /// Who holds the lock, stored with its token and shown by `inspect` (default: host/pid).
    #[arg(long, env = "REDLOCK_OWNER_LABEL", global = true)]
    pub(crate) owner_label: Option<String>,
}

impl Options {
    /// A plain redis-rs client for `url`, with the TLS files if any (for `check`).
    pub(crate) fn redis_client(&self, url: &str) -> Result<redis::Client, String> {
        if self.tls_ca.is_none() && self.tls_cert.is_none() {
            return redis::Client::open(url).map_err(|err| err.to_string());
        }
        let read = |path: &std::path::Path| {
            std::fs::read(path).map_err(|err| format!("{}: {err}", path.display()))
        };
        let client_tls = match (&self.tls_cert, &self.tls_key) {
            (Some(cert), Some(key)) => {
                Some(redis::ClientTlsConfig { client_cert: read(cert)?, client_key: read(key)? })
            }
            _ => None,
        };
        let root_cert = self.tls_ca.as_deref().map(read).transpose()?;
        redis::Client::build_with_tls(url, redis::TlsCertificates { client_tls, root_cert })
            .map_err(|err| err.to_string())
    }

    /// The client these options describe: the library's own reader of the environment
    /// (`RedlockBuilder::from_vars`), with this command's flags in place of the variables
    /// they override, so that one environment configures the command and the library alike
    /// (the TLS files, and the settings the command has no flag for, such as
    /// `REDLOCK_RESTART_QUARANTINE`).
    pub(crate) fn client(&self) -> Result<Redlock, String> {
        if self.nodes.is_empty() {
            return Err("no nodes: give --nodes or REDLOCK_NODES".to_owned());
        }
        RedlockBuilder::from_vars(ENV_PREFIX, |name| self.var(name))
            .map_err(|err| err.to_string())?
            .owner_label(self.owner_label.clone().unwrap_or_else(default_label))
            .build()
            .map_err(|err| err.to_string())
    }

    /// The value of the variable `name` as these options have it (clap has already merged
    /// each flag with its variable), or as the environment has it for the others.
    fn var(&self, name: &str) -> Option<String> {
        let path = |path: &Option<std::path::PathBuf>| {
            path.as_ref().map(|path| path.to_string_lossy().into_owned())
        };
        match name.strip_prefix(ENV_PREFIX)? {
            "NODES" => {
                Some(self.nodes.iter().map(|node| node.trim()).collect::<Vec<_>>().join(","))
            }
            "TTL" => Some(humantime::format_duration(self.ttl).to_string()),
            "NODE_TIMEOUT" => Some(humantime::format_duration(self.node_timeout).to_string()),
            "KEY_PREFIX" => Some(self.key_prefix.clone()),
            "TLS_CA" => path(&self.tls_ca),
            "TLS_CERT" => path(&self.tls_cert),
            "TLS_KEY" => path(&self.tls_key),
            _ => std::env::var(name).ok(),
        }
    }
}

/// The prefix of every variable the command reads.
const ENV_PREFIX: &str = "REDLOCK_";

/// `host/pid`, with anything a label may not hold replaced by `_`.
fn default_label() -> String {
    let host = std::fs::read_to_string("/proc/sys/kernel/hostname")
        .or_else(|_| std::fs::read_to_string("/etc/hostname"))
        .unwrap_or_else(|_| "unknown".to_owned());
    let host: String = host
        .trim()
        .chars()
        .take(40)
        .map(|c| if c.is_ascii_alphanumeric() || "._-".contains(c) { c } else { '_' })
        .collect();
    let host = if host.is_empty() { "unknown".to_owned() } else { host };
    format!("{host}/{}", std::process::id())
}

/// How long to wait for the lock: `0` (one attempt), a duration, or `forever`.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub(crate) enum Wait {
    /// One attempt.
    Once,
    /// Until granted or this long has passed.
    For(Duration),
    /// Until granted.
    Forever,
}

/// Parses `--wait`.
pub(crate) fn parse_wait(text: &str) -> Result<Wait, String> {
    match text.trim() {
        "0" => Ok(Wait::Once),
        "forever" => Ok(Wait::Forever),
        other => match humantime::parse_duration(other) {
            Ok(d) if d.is_zero() => Ok(Wait::Once),
            Ok(d) => Ok(Wait::For(d)),
            Err(err) => {
                Err(format!("`{other}`: {err} (give 0, a duration such as 30s, or forever)"))
            }
        },
    }
}

/// A signal by name (`TERM`, `SIGTERM`, `INT`, ...) or number.
pub(crate) fn parse_signal(text: &str) -> Result<nix::sys::signal::Signal, String> {
    use std::str::FromStr;
    let name = text.trim().to_ascii_uppercase();
    if let Ok(n) = name.parse::<i32>() {
        return nix::sys::signal::Signal::try_from(n).map_err(|err| format!("signal {n}: {err}"));
    }
    let name = if name.starts_with("SIG") { name } else { format!("SIG{name}") };
    nix::sys::signal::Signal::from_str(&name).map_err(|_| format!("unknown signal `{text}`"))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn waits_and_signals_parse() {
        assert_eq!(parse_wait("0"), Ok(Wait::Once));
        assert_eq!(parse_wait("forever"), Ok(Wait::Forever));
        assert_eq!(parse_wait("1m 30s"), Ok(Wait::For(Duration::from_secs(90))));
        assert!(parse_wait("soon").is_err());
        assert_eq!(parse_signal("term"), Ok(nix::sys::signal::Signal::SIGTERM));
        assert_eq!(parse_signal("SIGKILL"), Ok(nix::sys::signal::Signal::SIGKILL));
        assert_eq!(parse_signal("2"), Ok(nix::sys::signal::Signal::SIGINT));
        assert!(parse_signal("NOPE").is_err());
    }
}
