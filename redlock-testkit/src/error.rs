//! The one error type of the testkit.

use std::{fmt, io, time::Duration};

/// What can go wrong while running test nodes.
#[derive(Debug)]
#[non_exhaustive]
pub enum Error {
    /// No `redis-server` binary could be found.
    RedisServerNotFound {
        /// Where we looked (the env var's path, or `PATH`).
        looked: String,
    },
    /// Spawning the process, or preparing to (temp dir, free port), wiping its
    /// data, or starting a proxy (binding its port, spawning its threads) failed.
    Spawn {
        /// What we were doing.
        context: String,
        /// The underlying error.
        source: io::Error,
    },
    /// The node did not answer PING in time (or exited while starting).
    NotReady {
        /// The node's port.
        port: u16,
        /// How long we waited.
        waited: Duration,
        /// The node's log file, to see why.
        log: String,
    },
    /// Sending a signal to the node failed.
    Signal {
        /// The signal we tried to send.
        signal: nix::sys::signal::Signal,
        /// The errno.
        source: nix::Error,
    },
    /// A command sent to the node failed.
    Redis(redis::RedisError),
    /// Generating the TLS certificates failed (the message says why).
    Certificates(String),
}

/// `Result` with this crate's [`Error`].
pub type Result<T, E = Error> = std::result::Result<T, E>;

impl fmt::Display for Error {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            Error::RedisServerNotFound { looked } => write!(
                f,
                "redis-server not found ({looked}); install it with `apt-get install redis-server` \
                 (Debian/Ubuntu) or `brew install redis` (macOS), or set REDLOCK_REDIS_SERVER \
                 to the binary's path"
            ),
            Error::Spawn { context, source } => write!(f, "{context}: {source}"),
            Error::NotReady { port, waited, log } => write!(
                f,
                "redis-server on port {port} did not answer PING within {}; its log:\n{log}",
                humantime::format_duration(*waited)
            ),
            Error::Signal { signal, source } => write!(f, "sending {signal} failed: {source}"),
            Error::Redis(e) => write!(f, "redis command failed: {e}"),
            Error::Certificates(why) => write!(f, "could not generate TLS certificates: {why}"),
        }
    }
}

impl std::error::Error for Error {
    fn source(&self) -> Option<&(dyn std::error::Error + 'static)> {
        match self {
            Error::Spawn { source, .. } => Some(source),
            Error::Signal { source, .. } => Some(source),
            Error::Redis(e) => Some(e),
            Error::RedisServerNotFound { .. } | Error::NotReady { .. } | Error::Certificates(_) => {
                None
            }
        }
    }
}

impl From<redis::RedisError> for Error {
    fn from(e: redis::RedisError) -> Self {
        Error::Redis(e)
    }
}

impl Error {
    /// Wraps an io error with what we were doing.
    pub(crate) fn spawn(context: impl Into<String>, source: io::Error) -> Self {
        Error::Spawn { context: context.into(), source }
    }
}
