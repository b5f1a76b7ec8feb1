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
    /// | `{prefix}TLS_CA` | `tls_root_ca` (a TLS feature), a PEM file | `/etc/redlock/ca.pem` |
    /// | `{prefix}TLS_CERT`, `{prefix}TLS_KEY` (both or neither) | `tls_client_cert` (a TLS feature), PEM files | `client.pem`, `client.key` |
    ///
    /// Durations are in [`humantime`] form (`1m 30s`, `250ms`). Settings not set keep their
    /// defaults; the builder's other methods still apply on top. The `redlock` command reads
    /// the same variables (with the prefix `REDLOCK_`) through this same reader, so one
    /// environment configures both alike.
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
    /// missing or a value does not parse, or a TLS file cannot be read (or only one of
    /// `TLS_CERT` and `TLS_KEY` is set). A value is never repeated in the message (a node URL
    /// may hold a password), though a file's path is.
    pub fn from_env(prefix: &str) -> Result<RedlockBuilder> {
        from_lookup(prefix, |name| std::env::var(name).ok())
    }

    /// [`from_env`](Self::from_env) over any source of variables: `get` is asked for each
    /// variable by its full name (`{prefix}TTL`) and answers its value, if set. For a program
    /// whose own flags override the environment: answer a flag's value where one was given,
    /// the environment's otherwise (as the `redlock` command does).
    ///
    /// # Errors
    /// As [`from_env`](Self::from_env).
    pub fn from_vars(prefix: &str, get: impl Fn(&str) -> Option<String>) -> Result<RedlockBuilder> {
        from_lookup(prefix, get)
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
    tls_from(builder, var)
}

/// The TLS files of `{prefix}TLS_CA`, `_CERT` and `_KEY`, if set.
#[cfg(any(feature = "tls-rustls", feature = "tls-native-tls"))]
fn tls_from(
    mut builder: RedlockBuilder,
    var: impl Fn(&str) -> (String, Option<String>),
) -> Result<RedlockBuilder> {
    // The files are read here, once: a missing file is a configuration error naming its
    // variable, not a handshake failure on every node later.
    let read = |(name, path): (String, Option<String>)| -> Result<Option<Vec<u8>>> {
        path.map(|path| {
            std::fs::read(path.trim())
                .map_err(|err| Error::config(format!("{name}: cannot read {}: {err}", path.trim())))
        })
        .transpose()
    };
    if let Some(ca) = read(var("TLS_CA"))? {
        builder = builder.tls_root_ca(ca);
    }
    match (var("TLS_CERT"), var("TLS_KEY")) {
        ((_, None), (_, None)) => {}
        (cert @ (_, Some(_)), key @ (_, Some(_))) => {
            let (cert, key) = (read(cert)?, read(key)?);
            if let (Some(cert), Some(key)) = (cert, key) {
                builder = builder.tls_client_cert(cert, key);
            }
        }
        ((set, Some(_)), (unset, None)) | ((unset, None), (set, Some(_))) => {
            return Err(Error::config(format!(
                "{set} is set but {unset} is not: a client certificate needs both"
            )));
        }
    }
    Ok(builder)
}

/// Without a TLS feature, a TLS variable is a configuration error, not a silent plain
/// connection.
#[cfg(not(any(feature = "tls-rustls", feature = "tls-native-tls")))]
fn tls_from(
    builder: RedlockBuilder,
    var: impl Fn(&str) -> (String, Option<String>),
) -> Result<RedlockBuilder> {
    for name in ["TLS_CA", "TLS_CERT", "TLS_KEY"] {
        if let (name, Some(_)) = var(name) {
            return Err(Error::config(format!(
                "{name} is set, but the library was built without a TLS feature \
                 (enable `tls-rustls` or `tls-native-tls`)"
            )));
        }
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

    #[cfg(not(any(feature = "tls-rustls", feature = "tls-native-tls")))]
    #[test]
    fn tls_variables_without_a_tls_feature_are_refused_by_name() {
        let set = lookup(&[("APP_NODES", "redis://127.0.0.1:1"), ("APP_TLS_CA", "/ca.pem")]);
        let err = from_lookup("APP_", set).unwrap_err();
        assert_eq!(err.kind(), ErrorKind::Config);
        assert!(err.to_string().contains("APP_TLS_CA"), "{err}");
    }

    #[cfg(any(feature = "tls-rustls", feature = "tls-native-tls"))]
    #[test]
    fn tls_files_are_read_and_named_by_their_variable() {
        let nodes = ("APP_NODES", "rediss://127.0.0.1:1");
        let missing = from_lookup("APP_", lookup(&[nodes, ("APP_TLS_CA", "/nonexistent/ca.pem")]))
            .unwrap_err();
        assert_eq!(missing.kind(), ErrorKind::Config);
        assert!(missing.to_string().contains("APP_TLS_CA"), "{missing}");
        let half = from_lookup("APP_", lookup(&[nodes, ("APP_TLS_CERT", "/nonexistent/c.pem")]))
            .unwrap_err();
        assert!(half.to_string().contains("APP_TLS_KEY"), "{half}");
    }
}
