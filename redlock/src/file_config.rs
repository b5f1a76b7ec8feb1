//! Configuration from a file or any serde source (feature `serde`): [`RedlockConfig`].

use std::fmt;
use std::time::Duration;

use serde::{Deserialize, Deserializer};

use crate::builder::RedlockBuilder;

/// The client's settings as data, for configuration files (feature `serde`). Durations are
/// strings in [`humantime`] form (`"30s"`, `"250ms"`); settings left out keep the
/// builder's defaults; unknown fields are refused.
///
/// ```
/// # fn run() -> Result<(), Box<dyn std::error::Error>> {
/// let config: redlock::RedlockConfig = serde_json::from_str(
///     r#"{ "nodes": ["redis://10.0.0.1:6379", "redis://10.0.0.2:6379", "redis://10.0.0.3:6379"],
///          "ttl": "30s", "node_timeout": "50ms" }"#,
/// )?;
/// let rl = redlock::RedlockBuilder::from_config(&config).build()?;
/// # let _ = rl;
/// # Ok(())
/// # }
/// ```
#[derive(Clone, Default, Deserialize, PartialEq)]
#[serde(default, deny_unknown_fields)]
#[non_exhaustive]
pub struct RedlockConfig {
    /// The node URLs.
    pub nodes: Vec<String>,
    /// The lease ([`RedlockBuilder::ttl`]).
    #[serde(deserialize_with = "duration")]
    pub ttl: Option<Duration>,
    /// [`RedlockBuilder::node_timeout`].
    #[serde(deserialize_with = "duration")]
    pub node_timeout: Option<Duration>,
    /// [`RedlockBuilder::connect_timeout`].
    #[serde(deserialize_with = "duration")]
    pub connect_timeout: Option<Duration>,
    /// [`RedlockBuilder::drift_factor`].
    pub drift_factor: Option<f64>,
    /// [`RedlockBuilder::key_prefix`].
    pub key_prefix: Option<String>,
    /// [`RedlockBuilder::restart_quarantine`].
    #[serde(deserialize_with = "duration")]
    pub restart_quarantine: Option<Duration>,
}

impl fmt::Debug for RedlockConfig {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        let nodes: Vec<String> =
            self.nodes.iter().map(|url| crate::secret::redact_url(url)).collect();
        f.debug_struct("RedlockConfig")
            .field("nodes", &nodes)
            .field("ttl", &self.ttl)
            .field("node_timeout", &self.node_timeout)
            .field("connect_timeout", &self.connect_timeout)
            .field("drift_factor", &self.drift_factor)
            .field("key_prefix", &self.key_prefix)
            .field("restart_quarantine", &self.restart_quarantine)
            .finish()
    }
}

fn duration<'de, D: Deserializer<'de>>(deserializer: D) -> Result<Option<Duration>, D::Error> {
    let text = String::deserialize(deserializer)?;
    humantime::parse_duration(text.trim()).map(Some).map_err(|err| {
        serde::de::Error::custom(format!("not a duration ({err}); e.g. \"30s\", \"250ms\""))
    })
}

impl RedlockBuilder {
    /// A builder with the settings of `config`; the builder's methods still apply on top.
    pub fn from_config(config: &RedlockConfig) -> RedlockBuilder {
        let mut builder = RedlockBuilder::new().nodes(config.nodes.iter().cloned());
        if let Some(ttl) = config.ttl {
            builder = builder.ttl(ttl);
        }
        if let Some(timeout) = config.node_timeout {
            builder = builder.node_timeout(timeout);
        }
        if let Some(timeout) = config.connect_timeout {
            builder = builder.connect_timeout(timeout);
        }
        if let Some(factor) = config.drift_factor {
            builder = builder.drift_factor(factor);
        }
        if let Some(prefix) = &config.key_prefix {
            builder = builder.key_prefix(prefix.clone());
        }
        if let Some(period) = config.restart_quarantine {
            builder = builder.restart_quarantine(period);
        }
        builder
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_file_configures_the_client_and_names_a_bad_field() {
        let config: RedlockConfig = serde_json::from_str(
            r#"{"nodes": ["redis://u:s3cret@127.0.0.1:1", "redis://127.0.0.1:2", "redis://127.0.0.1:3"],
                "ttl": "1m 30s", "node_timeout": "80ms"}"#,
        )
        .unwrap();
        assert!(!format!("{config:?}").contains("s3cret"));
        let rl = RedlockBuilder::from_config(&config).build().unwrap();
        assert_eq!(rl.ttl(), Duration::from_secs(90));
        let bad = serde_json::from_str::<RedlockConfig>(r#"{"nodes": [], "ttl": "soon"}"#);
        assert!(bad.unwrap_err().to_string().contains("not a duration"));
        let unknown = serde_json::from_str::<RedlockConfig>(r#"{"nodez": []}"#);
        assert!(unknown.unwrap_err().to_string().contains("nodez"));
    }
}
