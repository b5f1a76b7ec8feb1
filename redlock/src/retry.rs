//! When `lock()` tries again, and when it gives up.

use std::time::Duration;

use rand::Rng;

/// The retry policy of [`Redlock::lock`](crate::Redlock::lock).
///
/// After a failed attempt, `lock()` waits `delay` plus a random part of up to `jitter` (so
/// that clients that collided do not collide again), then tries again, until an attempt
/// succeeds, `max_attempts` attempts were made, or the next attempt could not start before
/// `max_wait` has passed since the first one. Attempts that fail for a reason retrying
/// cannot fix ([`ErrorKind::Config`](crate::ErrorKind::Config),
/// [`ErrorKind::WrongType`](crate::ErrorKind::WrongType)) end the loop at once.
///
/// # Default
/// - `max_attempts`: 3
/// - `delay`: 100 ms
/// - `jitter`: 100 ms (so the pause between attempts is 100 to 200 ms)
/// - `max_wait`: none (bounded by the attempts alone)
///
/// ```
/// use std::time::Duration;
/// use redlock::Retry;
///
/// // Keep trying for up to five seconds, every 20-70 ms.
/// let patient = Retry::new()
///     .with_unbounded_attempts()
///     .with_delay(Duration::from_millis(20))
///     .with_jitter(Duration::from_millis(50))
///     .with_max_wait(Duration::from_secs(5));
/// assert_eq!(patient.max_wait(), Some(Duration::from_secs(5)));
/// ```
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
#[must_use = "a Retry does nothing until it is passed to RedlockBuilder::retry"]
pub struct Retry {
    max_attempts: Option<u32>,
    delay: Duration,
    jitter: Duration,
    max_wait: Option<Duration>,
}

impl Default for Retry {
    fn default() -> Self {
        Self {
            max_attempts: Some(3),
            delay: Duration::from_millis(100),
            jitter: Duration::from_millis(100),
            max_wait: None,
        }
    }
}

impl Retry {
    /// The default policy (see [`# Default`](Retry#default)).
    pub fn new() -> Self {
        Self::default()
    }

    /// A single attempt: `lock()` behaves like `try_lock()`.
    pub fn never() -> Self {
        Self::default().with_max_attempts(1)
    }

    /// At most `attempts` attempts in all, the first included. Zero is rejected by
    /// [`RedlockBuilder::build`](crate::RedlockBuilder::build).
    pub fn with_max_attempts(mut self, attempts: u32) -> Self {
        self.max_attempts = Some(attempts);
        self
    }

    /// No limit on the number of attempts; set a [`max_wait`](Retry::with_max_wait) (or
    /// cancel the future) to bound the wait.
    pub fn with_unbounded_attempts(mut self) -> Self {
        self.max_attempts = None;
        self
    }

    /// The fixed part of the pause between attempts.
    pub fn with_delay(mut self, delay: Duration) -> Self {
        self.delay = delay;
        self
    }

    /// The upper bound of the random part of the pause between attempts.
    pub fn with_jitter(mut self, jitter: Duration) -> Self {
        self.jitter = jitter;
        self
    }

    /// Give up when the next attempt could not start within `max_wait` of the first one.
    pub fn with_max_wait(mut self, max_wait: Duration) -> Self {
        self.max_wait = Some(max_wait);
        self
    }

    /// The maximum number of attempts, or `None` when unbounded.
    pub fn max_attempts(&self) -> Option<u32> {
        self.max_attempts
    }

    /// The fixed part of the pause between attempts.
    pub fn delay(&self) -> Duration {
        self.delay
    }

    /// The upper bound of the random part of the pause.
    pub fn jitter(&self) -> Duration {
        self.jitter
    }

    /// The bound on the total wait, if any.
    pub fn max_wait(&self) -> Option<Duration> {
        self.max_wait
    }

    pub(crate) fn validate(&self) -> Result<(), &'static str> {
        if self.max_attempts == Some(0) {
            return Err("retry: max_attempts must be at least 1");
        }
        if self.max_attempts.is_none() && self.max_wait.is_none() {
            return Err("retry: unbounded attempts need a max_wait");
        }
        Ok(())
    }

    /// The pause before the next attempt, after `attempts` attempts that started `waited`
    /// ago; `None` when the policy says to give up.
    pub(crate) fn next_pause(&self, attempts: u32, waited: Duration) -> Option<Duration> {
        if self.max_attempts.is_some_and(|max| attempts >= max) {
            return None;
        }
        let pause = self.delay.saturating_add(random_up_to(self.jitter));
        match self.max_wait {
            Some(max) if waited.saturating_add(pause) > max => None,
            _ => Some(pause),
        }
    }
}

/// A uniformly random duration in `[0, bound]`.
pub(crate) fn random_up_to(bound: Duration) -> Duration {
    let nanos = u64::try_from(bound.as_nanos()).unwrap_or(u64::MAX);
    if nanos == 0 {
        return Duration::ZERO;
    }
    Duration::from_nanos(rand::rng().random_range(0..=nanos))
}

#[cfg(test)]
mod tests {
    use super::*;
    use proptest::prelude::*;

    #[test]
    fn stops_after_max_attempts() {
        let retry = Retry::new().with_max_attempts(2);
        assert!(retry.next_pause(1, Duration::ZERO).is_some());
        assert_eq!(retry.next_pause(2, Duration::ZERO), None);
        assert_eq!(Retry::never().next_pause(1, Duration::ZERO), None);
    }

    #[test]
    fn stops_before_exceeding_max_wait() {
        let retry = Retry::new()
            .with_unbounded_attempts()
            .with_delay(Duration::from_millis(100))
            .with_jitter(Duration::ZERO)
            .with_max_wait(Duration::from_secs(1));
        assert_eq!(
            retry.next_pause(50, Duration::from_millis(900)),
            Some(Duration::from_millis(100))
        );
        assert_eq!(retry.next_pause(50, Duration::from_millis(901)), None);
    }

    #[test]
    fn rejects_policies_that_never_end_or_never_start() {
        assert!(Retry::new().with_max_attempts(0).validate().is_err());
        assert!(Retry::new().with_unbounded_attempts().validate().is_err());
        assert!(Retry::new().validate().is_ok());
    }

    proptest! {
        #[test]
        fn pause_stays_within_delay_and_jitter(delay_ms in 0u64..10_000, jitter_ms in 0u64..10_000) {
            let retry = Retry::new()
                .with_delay(Duration::from_millis(delay_ms))
                .with_jitter(Duration::from_millis(jitter_ms));
            let pause = retry.next_pause(1, Duration::ZERO).unwrap();
            prop_assert!(pause >= Duration::from_millis(delay_ms));
            prop_assert!(pause <= Duration::from_millis(delay_ms + jitter_ms));
        }
    }
}
