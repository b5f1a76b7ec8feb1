//! The channels releases are published on: what waiters subscribe to, and what the
//! release scripts are told to publish on. A leaf: both the commands and the engine use it.

use std::fmt;
use std::sync::Arc;

use redis::{RedisWrite, ToRedisArgs};

/// The channel a release of `key` is published on.
pub(crate) fn channel(key: &str) -> Arc<str> {
    ReleaseChannel(key).to_string().into()
}

/// The name of the channel a release of the key is published on, for writing it where it
/// goes (a script's argument) without a string of its own.
#[derive(Clone, Copy, Debug)]
pub(crate) struct ReleaseChannel<'a>(pub(crate) &'a str);

impl ReleaseChannel<'_> {
    const PREFIX: &'static str = "redlock:released:";

    /// The name's length in bytes.
    pub(crate) fn size(&self) -> usize {
        Self::PREFIX.len() + self.0.len()
    }
}

impl fmt::Display for ReleaseChannel<'_> {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(Self::PREFIX)?;
        f.write_str(self.0)
    }
}

impl ToRedisArgs for ReleaseChannel<'_> {
    fn write_redis_args<W: ?Sized + RedisWrite>(&self, out: &mut W) {
        out.write_arg_fmt(self);
    }
}
