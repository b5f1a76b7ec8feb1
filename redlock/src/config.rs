//! The validated configuration that every lock of one client shares, and the one place
//! where a `Duration` becomes the milliseconds Redis takes.

use std::sync::Arc;
use std::time::{Duration, Instant};

use crate::error::{Error, Result};
use crate::quorum;
use crate::retry::Retry;

/// Where fencing counters live: no lock key may start with it, so that no resource name can
/// produce a counter's key (see [`Config::key`]).
pub(crate) const FENCE_NAMESPACE: &str = "redlock:fence:";

/// The configuration, validated by the builder.
#[derive(Debug)]
pub(crate) struct Config {
    pub(crate) ttl: Ttl,
    pub(crate) node_timeout: Duration,
    pub(crate) connect_timeout: Duration,
    pub(crate) drift_factor: f64,
    pub(crate) retry: Retry,
    pub(crate) key_prefix: String,
    pub(crate) restart_quarantine: Duration,
    /// Put after every token of this client (`<token>.<label>`).
    pub(crate) owner_label: Option<std::sync::Arc<str>>,
}

impl Config {
    /// The lease to use: `requested`, validated, or the default.
    pub(crate) fn ttl(&self, requested: Option<Duration>) -> Result<Ttl> {
        match requested {
            Some(ttl) => Ttl::new(ttl, self.drift_factor),
            None => Ok(self.ttl),
        }
    }

    /// The Redis key of `resource`: the prefix, then the name. Empty names and names that
    /// fall into the fencing counters' namespace are configuration errors.
    pub(crate) fn key(&self, resource: &str) -> Result<Arc<str>> {
        if resource.is_empty() {
            return Err(Error::config("the resource name is empty"));
        }
        let len = self.key_prefix.len() + resource.len();
        if len > MAX_KEY {
            // Not printed: a name that long is a mistake, and its text would be the message.
            return Err(Error::config(format!(
                "the resource name is {} bytes long (with the key prefix, {len}); a lock's key \
                 is at most {MAX_KEY} bytes",
                resource.len()
            )));
        }
        let key: Arc<str> = if self.key_prefix.is_empty() {
            resource.into()
        } else {
            format!("{}{resource}", self.key_prefix).into()
        };
        if key.starts_with(FENCE_NAMESPACE) {
            return Err(Error::config(format!(
                "the key `{key}` is in the namespace reserved for fencing counters (`{FENCE_NAMESPACE}`)"
            )));
        }
        Ok(key)
    }

    /// `resource` as a shared name, and its [`key`](Self::key): without a prefix they are
    /// the same string, made once.
    pub(crate) fn name_and_key(&self, resource: &str) -> Result<(Arc<str>, Arc<str>)> {
        let key = self.key(resource)?;
        let name = if self.key_prefix.is_empty() { key.clone() } else { resource.into() };
        Ok((name, key))
    }
}

/// The longest key a lock may have (its prefix and resource name), in bytes: far beyond any
/// sane name, and short enough that a mistake (a whole document passed as the name) is
/// refused before it is sent to every node and repeated in every message.
pub(crate) const MAX_KEY: usize = 4096;

/// A validated lease: whole milliseconds, at least one, longer than its drift allowance.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub(crate) struct Ttl {
    ms: u64,
    drift: Duration,
}

impl Ttl {
    /// Validates `ttl` against the drift allowance of `drift_factor`.
    pub(crate) fn new(ttl: Duration, drift_factor: f64) -> Result<Self> {
        if !(0.0..1.0).contains(&drift_factor) {
            return Err(Error::config(format!(
                "drift_factor must be in [0, 1), got {drift_factor}"
            )));
        }
        let ms = quorum::ttl_millis(ttl).ok_or_else(|| {
            Error::config(format!(
                "ttl must be between 1 ms and {} days (100 years), got {ttl:?}",
                quorum::MAX_TTL.as_secs() / 86_400
            ))
        })?;
        let lease = Duration::from_millis(ms);
        let drift = quorum::drift(lease, drift_factor);
        if lease <= drift {
            return Err(Error::config(format!(
                "ttl {lease:?} leaves no validity after the drift allowance of {drift:?}"
            )));
        }
        Ok(Self { ms, drift })
    }

    /// Milliseconds, as sent to Redis.
    pub(crate) fn ms(self) -> u64 {
        self.ms
    }

    /// [`Ttl::ms`] as a script argument.
    pub(crate) fn arg(self) -> Digits {
        Digits::new(self.ms)
    }

    /// The lease as a duration (whole milliseconds).
    pub(crate) fn duration(self) -> Duration {
        Duration::from_millis(self.ms)
    }

    /// The validity deadline of a lease whose round started at `started_at`: every node
    /// that granted it keeps it at least until then, drift allowed for.
    pub(crate) fn deadline(self, started_at: Instant) -> Instant {
        started_at + (self.duration() - self.drift)
    }

    /// The drift allowance of this lease.
    pub(crate) fn drift(self) -> Duration {
        self.drift
    }
}

/// A configuration for unit tests: a 10 s lease, 50 ms node timeout, the given prefix.
#[cfg(test)]
pub(crate) fn config(prefix: &str) -> Config {
    Config {
        ttl: Ttl::new(Duration::from_secs(10), 0.01).unwrap(),
        node_timeout: Duration::from_millis(50),
        connect_timeout: Duration::from_secs(1),
        drift_factor: 0.01,
        retry: Retry::default(),
        key_prefix: prefix.to_owned(),
        restart_quarantine: Duration::ZERO,
        owner_label: None,
    }
}

/// A number's decimal digits, kept on the stack: the numbers a command carries (a lease, a
/// count of permits) without a `String` each.
#[derive(Clone, Copy, Debug)]
pub(crate) struct Digits {
    bytes: [u8; 20],
    /// Where the digits start: they end the buffer.
    from: usize,
}

impl Digits {
    pub(crate) fn new(mut n: u64) -> Self {
        let mut bytes = [0u8; 20];
        let mut from = bytes.len();
        loop {
            from -= 1;
            // A digit: always below 10.
            bytes[from] = b'0' + u8::try_from(n % 10).unwrap_or(0);
            n /= 10;
            if n == 0 {
                break;
            }
        }
        Self { bytes, from }
    }

    pub(crate) fn as_bytes(&self) -> &[u8] {
        &self.bytes[self.from..]
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn digits_are_the_decimal_text_of_the_number() {
        for n in [0, 7, 10, 30_000, 1_234_567_890, u64::MAX] {
            assert_eq!(Digits::new(n).as_bytes(), n.to_string().as_bytes());
        }
    }

    #[test]
    fn the_deadline_is_the_lease_less_its_drift_from_the_rounds_start() {
        let ttl = Ttl::new(Duration::from_millis(1000), 0.01).unwrap();
        let start = Instant::now();
        assert_eq!(ttl.drift(), Duration::from_millis(12));
        assert_eq!(ttl.deadline(start), start + Duration::from_millis(988));
    }

    #[test]
    fn no_resource_name_reaches_the_fencing_namespace() {
        let plain = config("");
        assert_eq!(&*plain.key("orders:1").unwrap(), "orders:1");
        assert!(plain.key("redlock:fence:orders:1").is_err());
        assert!(plain.key("").is_err());
        let prefixed = config("app:");
        assert_eq!(&*prefixed.key("redlock:fence:x").unwrap(), "app:redlock:fence:x");
        assert!(config("redlock:fence:").key("x").is_err());
    }
}
