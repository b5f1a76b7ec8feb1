//! When `lock()` tries again, and when it gives up.

use std::time::Duration;

use rand::Rng;

/// The retry policy of [`Redlock::lock`](crate::Redlock::lock) and the other waiting
/// requests (`read`, `write`, `reentrant`, `many`, `semaphore`).
///
/// After a failed attempt, a request waits `delay` plus a random part of up to `jitter` (so
/// that clients that collided do not collide again), or less when a release notification
/// wakes it, then tries again, until an attempt succeeds, `max_attempts` attempts were
/// made, or the wait's bound is reached. Attempts that fail for a reason retrying cannot
/// fix ([`ErrorKind::Config`](crate::ErrorKind::Config),
/// [`ErrorKind::WrongType`](crate::ErrorKind::WrongType)) end the loop at once.
///
/// By default a request waits for up to one TTL of the lock it asks for (10 s with the
/// builder's default TTL): a holder that died without releasing has let go by then, so
/// the lock is granted as soon as it is free; a holder that keeps extending it is still
/// there, and the request answers [`ErrorKind::NotAcquired`](crate::ErrorKind::NotAcquired).
/// The pause before the last attempt is cut short so that the last attempt starts as that
/// TTL ends. [`with_max_wait`](Retry::with_max_wait) sets another bound,
/// [`with_max_attempts`](Retry::with_max_attempts) a number of attempts, and
/// [`Retry::never`] (or a request's `.once()`) a single attempt.
///
/// A waiter behind another waiter of the same client for the same exclusive lock lets
/// that one attempt for both, and pauses at least 50 ms between its ticks whatever its
/// `delay`: a release wakes both at once, so its ticks only look for a lost notification
/// or a lock left to expire.
///
/// # Default
/// - `max_attempts`: unbounded
/// - `max_wait`: the TTL of the lock asked for (the request's `.ttl(d)`, else the builder's)
/// - `delay`: 100 ms
/// - `jitter`: 100 ms (so the pause between attempts is 100 to 200 ms)
///
/// ```
/// use std::time::Duration;
/// use redlock::Retry;
///
/// // Keep trying for up to five seconds, every 20-70 ms.
/// let patient = Retry::new()
///     .with_delay(Duration::from_millis(20))
///     .with_jitter(Duration::from_millis(50))
///     .with_max_wait(Duration::from_secs(5));
/// assert_eq!(patient.max_wait(), Some(Duration::from_secs(5)));
/// // Until acquired (or the request is dropped), as Redisson's `lock()` does.
/// let forever = Retry::new().with_max_wait(Duration::MAX);
/// // The default: for up to one TTL of the lock.
/// assert_eq!(Retry::new().max_wait(), None);
/// # let _ = forever;
/// ```
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
#[must_use = "a Retry does nothing until it is passed to RedlockBuilder::retry"]
pub struct Retry {
    max_attempts: Option<u32>,
    delay: Duration,
    jitter: Duration,
    max_wait: Option<Duration>,
    /// With no `max_wait`: the lock's TTL, set per request (see [`Retry::until_ttl`]).
    ttl: Option<Duration>,
}

impl Default for Retry {
    fn default() -> Self {
        Self {
            max_attempts: None,
            delay: Duration::from_millis(100),
            jitter: Duration::from_millis(100),
            max_wait: None,
            ttl: None,
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

    /// No limit on the number of attempts (the default): the wait is bounded by
    /// [`max_wait`](Retry::with_max_wait), or by default the lock's TTL.
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

    /// Give up when the next attempt could not start within `max_wait` of the first one,
    /// instead of waiting for up to the lock's TTL. `Duration::MAX` waits until the lock is
    /// acquired (or the request dropped).
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

    /// The bound on the total wait set by [`with_max_wait`](Retry::with_max_wait); `None`
    /// for the default, one TTL of the lock asked for.
    pub fn max_wait(&self) -> Option<Duration> {
        self.max_wait
    }

    pub(crate) fn validate(&self) -> Result<(), &'static str> {
        if self.max_attempts == Some(0) {
            return Err("retry: max_attempts must be at least 1");
        }
        Ok(())
    }

    /// This policy for a lock of `ttl`: without a `max_wait`, the wait ends with `ttl`.
    pub(crate) fn until_ttl(mut self, ttl: Duration) -> Self {
        self.ttl = Some(ttl);
        self
    }

    /// The pause before the next attempt, after `attempts` attempts that started `waited`
    /// ago, at least `min`; `None` when the policy says to give up.
    pub(crate) fn next_pause(
        &self,
        attempts: u32,
        waited: Duration,
        min: Duration,
    ) -> Option<Duration> {
        if self.max_attempts.is_some_and(|max| attempts >= max) {
            return None;
        }
        let pause = self.delay.saturating_add(random_up_to(self.jitter)).max(min);
        match (self.max_wait, self.ttl) {
            (Some(max), _) if waited.saturating_add(pause) > max => None,
            (Some(_), _) | (None, None) => Some(pause),
            // The default bound is a deadline rather than a rule on the next start: a
            // policy with long pauses (one that relies on release notifications to wake
            // it) must still wait, its last attempt as the TTL ends.
            (None, Some(ttl)) => match ttl.checked_sub(waited) {
                Some(left) if !left.is_zero() => Some(pause.min(left)),
                _ => None,
            },
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
        assert!(retry.next_pause(1, Duration::ZERO, Duration::ZERO).is_some());
        assert_eq!(retry.next_pause(2, Duration::ZERO, Duration::ZERO), None);
        assert_eq!(Retry::never().next_pause(1, Duration::ZERO, Duration::ZERO), None);
    }

    #[test]
    fn stops_before_exceeding_max_wait() {
        let retry = Retry::new()
            .with_unbounded_attempts()
            .with_delay(Duration::from_millis(100))
            .with_jitter(Duration::ZERO)
            .with_max_wait(Duration::from_secs(1));
        assert_eq!(
            retry.next_pause(50, Duration::from_millis(900), Duration::ZERO),
            Some(Duration::from_millis(100))
        );
        assert_eq!(retry.next_pause(50, Duration::from_millis(901), Duration::ZERO), None);
    }

    #[test]
    fn by_default_waits_one_ttl_with_a_last_attempt_as_it_ends() {
        let ttl = Duration::from_secs(10);
        let retry = Retry::new().until_ttl(ttl);
        assert_eq!(retry.max_attempts(), None);
        let pause = retry.next_pause(1_000, Duration::from_secs(1), Duration::ZERO).unwrap();
        assert!(pause >= Duration::from_millis(100) && pause <= Duration::from_millis(200));
        // Cut short to end with the TTL, however long the configured pause.
        let slow = Retry::new().with_delay(Duration::from_secs(20)).until_ttl(ttl);
        assert_eq!(
            slow.next_pause(1, Duration::from_secs(4), Duration::ZERO),
            Some(Duration::from_secs(6))
        );
        assert_eq!(slow.next_pause(2, ttl, Duration::ZERO), None);
        // An explicit bound replaces the TTL's.
        let longer = Retry::new().with_max_wait(Duration::from_secs(60)).until_ttl(ttl);
        assert!(longer.next_pause(50, Duration::from_secs(30), Duration::ZERO).is_some());
        let forever = Retry::new().with_max_wait(Duration::MAX).until_ttl(ttl);
        assert!(
            forever
                .next_pause(u32::MAX, Duration::from_secs(3600 * 24 * 365), Duration::ZERO)
                .is_some()
        );
    }

    #[test]
    fn a_pause_shorter_than_the_minimum_is_stretched_and_still_bounded_by_max_wait() {
        let min = Duration::from_millis(10);
        let eager = Retry::new()
            .with_delay(Duration::ZERO)
            .with_jitter(Duration::ZERO)
            .with_max_wait(Duration::from_secs(1));
        assert_eq!(eager.next_pause(5, Duration::ZERO, min), Some(min));
        assert_eq!(eager.next_pause(5, Duration::from_millis(990), min), Some(min));
        assert_eq!(eager.next_pause(5, Duration::from_millis(991), min), None, "past max_wait");
        let slow = eager.with_delay(Duration::from_millis(100));
        assert_eq!(slow.next_pause(5, Duration::ZERO, min), Some(Duration::from_millis(100)));
        // The default bound cuts the stretched pause short for a last attempt at the TTL.
        let ttl = Duration::from_secs(1);
        let until_ttl = Retry::new().with_delay(Duration::ZERO).with_jitter(Duration::ZERO);
        let until_ttl = until_ttl.until_ttl(ttl);
        let left = Duration::from_millis(4);
        assert_eq!(until_ttl.next_pause(5, ttl - left, min), Some(left));
    }

    #[test]
    fn rejects_policies_that_never_start() {
        assert!(Retry::new().with_max_attempts(0).validate().is_err());
        assert!(Retry::new().with_unbounded_attempts().validate().is_ok());
        assert!(Retry::new().validate().is_ok());
    }

    proptest! {
        #[test]
        fn pause_stays_within_delay_and_jitter(delay_ms in 0u64..10_000, jitter_ms in 0u64..10_000) {
            let retry = Retry::new()
                .with_delay(Duration::from_millis(delay_ms))
                .with_jitter(Duration::from_millis(jitter_ms));
            let pause = retry.next_pause(1, Duration::ZERO, Duration::ZERO).unwrap();
            prop_assert!(pause >= Duration::from_millis(delay_ms));
            prop_assert!(pause <= Duration::from_millis(delay_ms + jitter_ms));
        }
    }
}
