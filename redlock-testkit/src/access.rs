//! How to reach a node: its URL (scheme, credentials, port) and a redis-rs client for it,
//! TLS and passwords included.

use crate::{
    config::NodeConfig,
    error::Result,
    tls::{self, Certificates},
};

/// Who connects: the default user (with the node's password, if any), or a named user.
#[derive(Clone, Copy, Debug)]
pub(crate) enum Credentials<'a> {
    /// The default user, with `--requirepass` if set.
    Default,
    /// An ACL user.
    User {
        /// The user's name.
        name: &'a str,
        /// Its password.
        password: &'a str,
    },
}

/// The URL of a node started with `config`, reached on `port` (its own, or a proxy's).
pub(crate) fn url(config: &NodeConfig, port: u16, credentials: Credentials<'_>) -> String {
    let scheme = if config.tls.is_some() { "rediss" } else { "redis" };
    let userinfo = match credentials {
        Credentials::Default => config
            .requirepass
            .as_deref()
            .map(|password| format!(":{}@", percent_encode(password)))
            .unwrap_or_default(),
        Credentials::User { name, password } => {
            format!("{}:{}@", percent_encode(name), percent_encode(password))
        }
    };
    format!("{scheme}://{userinfo}127.0.0.1:{port}")
}

/// A client for `url` of a node started with `config`: with the testkit's CA and client
/// certificate on a TLS node.
pub(crate) fn client(config: &NodeConfig, url: &str) -> Result<redis::Client> {
    if config.tls.is_none() {
        return Ok(redis::Client::open(url)?);
    }
    tls::install_crypto_provider();
    Ok(redis::Client::build_with_tls(url, Certificates::get()?.redis_tls())?)
}

/// Percent-encodes everything but URL-unreserved characters, so that any user name or
/// password survives in a URL's userinfo (redis-rs decodes it).
fn percent_encode(s: &str) -> String {
    let mut out = String::with_capacity(s.len());
    for byte in s.bytes() {
        if byte.is_ascii_alphanumeric() || b"-._~".contains(&byte) {
            out.push(char::from(byte));
        } else {
            out.push_str(&format!("%{byte:02X}"));
        }
    }
    out
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::tls::ClientCerts;

    #[test]
    fn urls_say_the_scheme_and_the_credentials() {
        let plain = NodeConfig::new();
        assert_eq!(url(&plain, 7000, Credentials::Default), "redis://127.0.0.1:7000");
        let secured = NodeConfig::new().tls(ClientCerts::Required).requirepass("p@ss:w/rd é");
        assert_eq!(
            url(&secured, 7001, Credentials::Default),
            "rediss://:p%40ss%3Aw%2Frd%20%C3%A9@127.0.0.1:7001"
        );
        assert_eq!(
            url(&plain, 7002, Credentials::User { name: "app", password: "s3-cr_et" }),
            "redis://app:s3-cr_et@127.0.0.1:7002"
        );
    }
}
