//! What tests send to one node directly: reads to inspect its keys, raw commands.
//!
//! Each call opens its own short-lived connection (2 s timeouts), so a node can be
//! inspected from any thread, and a connection broken by a fault never leaks into the
//! next call. Never call these on a paused node: they would wait for the timeout.

use std::collections::BTreeMap;

use crate::{access, error::Result, node::RedisNode};

/// Connect and read/write timeout of the testkit's own connections.
pub(crate) const CONNECTION_TIMEOUT: std::time::Duration = std::time::Duration::from_secs(2);

impl RedisNode {
    /// A client for this node, as the testkit's own connections use it: as the default
    /// user (with the node's password), over TLS with the testkit's CA and client
    /// certificate on a [TLS node](crate::NodeConfig::tls).
    pub fn client(&self) -> Result<redis::Client> {
        access::client(&self.config, &self.url())
    }

    /// A client for the ACL user `name` (see [`acl_setuser`](Self::acl_setuser)), TLS as
    /// [`client`](Self::client).
    pub fn client_as(&self, name: &str, password: &str) -> Result<redis::Client> {
        access::client(&self.config, &self.url_as(name, password))
    }

    /// Creates or replaces the ACL user `name`: `ACL SETUSER name reset on >password
    /// rules...`, e.g. rules `["~app:*", "+get", "+set"]` for a user that may only
    /// `GET` and `SET` keys under `app:`. Connect as it with [`url_as`](Self::url_as).
    pub fn acl_setuser(&self, name: &str, password: &str, rules: &[&str]) -> Result<()> {
        redis::cmd("ACL")
            .arg("SETUSER")
            .arg(name)
            .arg("reset")
            .arg("on")
            .arg(format!(">{password}"))
            .arg(rules)
            .query::<()>(&mut self.connection()?)?;
        Ok(())
    }

    /// A sync connection with a 2 s connect and read/write timeout, for tests to inspect keys.
    pub fn connection(&self) -> Result<redis::Connection> {
        connect(&self.client()?)
    }

    /// Runs one raw command, e.g. `&["CONFIG", "GET", "maxmemory"]`, and returns its reply
    /// as it came. An error reply is an `Err`.
    ///
    /// # Panics
    /// When `args` is empty: there is no command to send.
    pub fn command(&self, args: &[&str]) -> Result<redis::Value> {
        let (name, rest) = args.split_first().expect("command: no command name given");
        Ok(redis::cmd(name).arg(rest).query(&mut self.connection()?)?)
    }

    /// `GET key`.
    pub fn get(&self, key: &str) -> Result<Option<String>> {
        Ok(redis::cmd("GET").arg(key).query(&mut self.connection()?)?)
    }

    /// Plain `SET key value`, no expiry.
    pub fn set(&self, key: &str, value: &str) -> Result<()> {
        redis::cmd("SET").arg(key).arg(value).query::<()>(&mut self.connection()?)?;
        Ok(())
    }

    /// `PTTL key`: milliseconds left, -1 without expiry, -2 if missing.
    pub fn pttl(&self, key: &str) -> Result<i64> {
        Ok(redis::cmd("PTTL").arg(key).query(&mut self.connection()?)?)
    }

    /// `EXISTS key`: whether the key is there, whatever its type.
    pub fn exists(&self, key: &str) -> Result<bool> {
        Ok(redis::cmd("EXISTS").arg(key).query(&mut self.connection()?)?)
    }

    /// `KEYS pattern`, sorted. `KEYS` walks every key: fine for the few keys of a test.
    pub fn keys(&self, pattern: &str) -> Result<Vec<String>> {
        let mut keys: Vec<String> =
            redis::cmd("KEYS").arg(pattern).query(&mut self.connection()?)?;
        keys.sort_unstable();
        Ok(keys)
    }

    /// `HGETALL key`: a hash's fields and values, empty if the key is missing.
    ///
    /// # Errors
    /// Also when the key holds another type (`WRONGTYPE`).
    pub fn hgetall(&self, key: &str) -> Result<BTreeMap<String, String>> {
        Ok(redis::cmd("HGETALL").arg(key).query(&mut self.connection()?)?)
    }

    /// `FLUSHALL`.
    pub fn flushall(&self) -> Result<()> {
        redis::cmd("FLUSHALL").query::<()>(&mut self.connection()?)?;
        Ok(())
    }
}

/// A sync connection with the testkit's timeouts.
pub(crate) fn connect(client: &redis::Client) -> Result<redis::Connection> {
    let con = client.get_connection_with_timeout(CONNECTION_TIMEOUT)?;
    con.set_read_timeout(Some(CONNECTION_TIMEOUT))?;
    con.set_write_timeout(Some(CONNECTION_TIMEOUT))?;
    Ok(con)
}
