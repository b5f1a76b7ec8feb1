//! Finding the `redis-server` binary, before spawning, so a missing one gets a clear error.

use std::{
    ffi::OsString,
    path::{Path, PathBuf},
};

use crate::error::{Error, Result};

/// The env var that overrides where `redis-server` is.
pub(crate) const ENV_VAR: &str = "REDLOCK_REDIS_SERVER";

/// The binary for this process's environment.
pub(crate) fn redis_server() -> Result<PathBuf> {
    find_redis_server(std::env::var_os(ENV_VAR), std::env::var_os("PATH"))
}

/// Pure lookup (takes the env values as arguments) so it can be unit-tested
/// without mutating the environment, which is unsafe in edition 2024.
pub(crate) fn find_redis_server(
    env_value: Option<OsString>,
    path: Option<OsString>,
) -> Result<PathBuf> {
    if let Some(value) = env_value.filter(|v| !v.is_empty()) {
        let candidate = PathBuf::from(value);
        // An explicit override that is wrong must fail, not silently fall back to PATH.
        return if is_executable(&candidate) {
            Ok(candidate)
        } else {
            Err(Error::RedisServerNotFound {
                looked: format!("{ENV_VAR}={} is not an executable file", candidate.display()),
            })
        };
    }
    path.iter()
        .flat_map(std::env::split_paths)
        .map(|dir| dir.join("redis-server"))
        .find(|candidate| is_executable(candidate))
        .ok_or_else(|| Error::RedisServerNotFound { looked: "not on PATH".to_owned() })
}

fn is_executable(path: &Path) -> bool {
    use std::os::unix::fs::PermissionsExt;
    path.metadata().is_ok_and(|m| m.is_file() && m.permissions().mode() & 0o111 != 0)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn missing_env_binary_says_how_to_install() {
        let err = find_redis_server(Some("/nonexistent/redis-server".into()), None).unwrap_err();
        let msg = err.to_string();
        assert!(msg.contains("apt-get install redis-server"), "{msg}");
        assert!(msg.contains("brew install redis"), "{msg}");
        assert!(msg.contains(ENV_VAR), "{msg}");
        assert!(msg.contains("/nonexistent/redis-server"), "{msg}");
    }

    #[test]
    fn empty_path_is_not_found() {
        let err = find_redis_server(None, Some("/nonexistent-dir".into())).unwrap_err();
        assert!(matches!(err, Error::RedisServerNotFound { .. }));
        assert!(err.to_string().contains("apt-get"));
    }

    #[test]
    fn finds_binary_on_path() {
        let dir = tempfile::tempdir().unwrap();
        let bin = dir.path().join("redis-server");
        std::fs::write(&bin, "#!/bin/sh\n").unwrap();
        use std::os::unix::fs::PermissionsExt;
        std::fs::set_permissions(&bin, std::fs::Permissions::from_mode(0o755)).unwrap();
        let path = std::env::join_paths(["/nonexistent-dir".as_ref(), dir.path()]).unwrap();
        assert_eq!(find_redis_server(None, Some(path)).unwrap(), bin);
        // The override wins over PATH.
        assert_eq!(
            find_redis_server(Some(bin.clone().into()), Some("/nonexistent-dir".into())).unwrap(),
            bin
        );
    }
}
