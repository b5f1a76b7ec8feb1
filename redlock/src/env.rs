//! Configuration from the environment: `RedlockBuilder::from_env(prefix)`.

use std::time::Duration;

use crate::builder::RedlockBuilder;
use crate::error::{Error, Result};

impl RedlockBuilder {
    /// A builder configured from environment variables named `prefix` + a setting:
    ///
    /// | variable | setting | example |
    /// | --- | --- | --- |
    /// | `{prefix}NODES` (required) | [`nodes`](Self::nodes), comma-separated | `redis://a:6379,redis://b:6379` |
    /// | `{prefix}TTL` | [`ttl`](Self::ttl) | `30s` |
    /// | `{prefix}NODE_TIMEOUT` | [`node_timeout`](Self::node_timeout) | `50ms` |
    /// | `{prefix}CONNECT_TIMEOUT` | [`connect_timeout`](Self::connect_timeout) | `1s` |
    /// | `{prefix}DRIFT_FACTOR` | [`drift_factor`](Self::drift_factor) | `0.01` |
    /// | `{prefix}KEY_PREFIX` | [`key_prefix`](Self::key_prefix) | `locks:` |
    /// | `{prefix}RESTART_QUARANTINE` | [`restart_quarantine`](Self::restart_quarantine) | `30s` |
    ///
    /// Durations are in [`humantime`] form (`1m 30s`, `250ms`). Settings not set keep their
    /// defaults; the builder's other methods still apply on top.
    ///
    /// ```no_run
    /// # fn run() -> Result<(), redlock::Error> {
    /// // REDLOCK_NODES=redis://10.0.0.1:6379,... REDLOCK_TTL=30s
    /// let rl = redlock::RedlockBuilder::from_env("REDLOCK_")?.build()?;
    /// # Ok(())
    /// # }
    /// ```
    ///
    /// # Errors
    /// [`ErrorKind::Config`](crate::ErrorKind::Config), naming the variable, when `NODES` is
    /// missing or a value does not parse. A value is never repeated in the message (a node
    /// URL may hold a password).
    pub fn from_env(prefix: &str) -> Result<RedlockBuilder> {
        from_lookup(prefix, |name| std::env::var(name).ok())
    }
}

/// [`RedlockBuilder::from_env`] over any source of variables (a map in tests).
pub(crate) fn from_lookup(
    prefix: &str,
    get: impl Fn(&str) -> Option<String>,
) -> Result<RedlockBuilder> {
    let var = |setting: &str| {
        let name = format!("{prefix}{setting}");
        let value = get(&name).filter(|v| !v.trim().is_empty());
        (name, value)
    };
    let duration = |setting: &str| -> Result<Option<Duration>> {
        match var(setting) {
            (_, None) => Ok(None),
            (name, Some(value)) => {
                humantime::parse_duration(value.trim()).map(Some).map_err(|err| {
                    Error::config(format!(
                        "{name}: not a duration ({err}); e.g. 30s, 250ms, 1m 30s"
                    ))
                })
            }
        }
    };
    let (name, nodes) = var("NODES");
    let Some(nodes) = nodes else {
        return Err(Error::config(format!("{name} is not set: the comma-separated node URLs")));
    };
    let mut builder = RedlockBuilder::new()
        .nodes(nodes.split(',').map(str::trim).filter(|url| !url.is_empty()).map(str::to_owned));
    if let Some(ttl) = duration("TTL")? {
        builder = builder.ttl(ttl);
    }
    if let Some(timeout) = duration("NODE_TIMEOUT")? {
        builder = builder.node_timeout(timeout);
    }
    if let Some(timeout) = duration("CONNECT_TIMEOUT")? {
        builder = builder.connect_timeout(timeout);
    }
    if let Some(period) = duration("RESTART_QUARANTINE")? {
        builder = builder.restart_quarantine(period);
    }
    if let (name, Some(value)) = var("DRIFT_FACTOR") {
        let factor = value
            .trim()
            .parse::<f64>()
            .map_err(|_| Error::config(format!("{name}: not a number; e.g. 0.01")))?;
        builder = builder.drift_factor(factor);
    }
    if let (_, Some(prefix)) = var("KEY_PREFIX") {
        builder = builder.key_prefix(prefix);
    }
    Ok(builder)
}

#[cfg(test)]
mod tests {
    use std::collections::HashMap;

    use super::*;
    use crate::error::ErrorKind;

    fn lookup(vars: &[(&str, &str)]) -> impl Fn(&str) -> Option<String> {
        let vars: HashMap<String, String> =
            vars.iter().map(|(k, v)| ((*k).to_owned(), (*v).to_owned())).collect();
        move |name| vars.get(name).cloned()
    }

    #[test]
    fn settings_come_from_the_prefixed_variables() {
        let rl = from_lookup(
            "APP_",
            lookup(&[
                ("APP_NODES", "redis://127.0.0.1:1, redis://127.0.0.1:2,redis://127.0.0.1:3"),
                ("APP_TTL", "1m 30s"),
                ("APP_NODE_TIMEOUT", "80ms"),
            ]),
        )
        .unwrap()
        .build()
        .unwrap();
        assert_eq!(rl.node_count(), 3);
        assert_eq!(rl.ttl(), Duration::from_secs(90));
    }

    #[test]
    fn errors_name_the_variable_and_never_repeat_a_value() {
        let missing = from_lookup("APP_", lookup(&[])).unwrap_err();
        assert_eq!(missing.kind(), ErrorKind::Config);
        assert!(missing.to_string().contains("APP_NODES"), "{missing}");
        let bad = from_lookup(
            "APP_",
            lookup(&[("APP_NODES", "redis://u:s3cret@h:1"), ("APP_TTL", "s3cret")]),
        )
        .unwrap_err();
        assert!(bad.to_string().contains("APP_TTL"), "{bad}");
        assert!(!bad.to_string().contains("s3cret"), "{bad}");
    }
}
