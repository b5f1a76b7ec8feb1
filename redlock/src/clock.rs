//! The clock every lease is counted on: [`Instant`]'s, plus the time the machine has spent
//! suspended since this process first read it, where the platform says (Linux and Android:
//! `CLOCK_BOOTTIME`).
//!
//! Why: `Instant` is `CLOCK_MONOTONIC` on Linux, which stops while the machine (or its VM)
//! is suspended, but the nodes' clocks do not: their keys expire meanwhile. A holder that
//! counted its validity on `Instant` would wake up still "valid" after its keys were gone
//! and another client had taken the lock. Counted here, a suspend shortens the validity by
//! its length, as it shortens the keys' lives on the nodes.
//!
//! Every instant that is compared with a lease's deadline lives on this scale: deadlines,
//! rounds' start and decision times, the nodes' late and hung marks (compared with a round's
//! decision), and the holds a waiter defers to. They stay `Instant`s (this clock is
//! `Instant::now()` plus an offset that only grows), so that arithmetic on them is the usual
//! one. Two places must convert: a Tokio timer runs on the monotonic clock ([`sleep_until`]
//! converts, and wakes at least every [`timing::WAKE_CHECK`] to notice a suspend), and an instant
//! handed to the user is put back on `Instant`'s scale ([`on_std`]). Retry pacing, waiting
//! budgets and shutdown deadlines stay on `Instant`: a suspend only makes them longer.

use crate::timing;
use std::sync::OnceLock;
use std::sync::atomic::{AtomicU64, Ordering};
use std::time::{Duration, Instant};

/// The widest window in which a reading of the two clocks is taken as one instant: a
/// reading interrupted for longer (the thread preempted between the reads) is taken again.
const READ_WINDOW: Duration = Duration::from_micros(50);

/// How many readings are tried before the tightest one is taken, whatever its window.
const READ_TRIES: usize = 3;

/// What a measured suspended time is rounded up to: the few microseconds of a reading's
/// window would otherwise move the instants handed to users (`deadline()`) by a hair from
/// one call to the next. A lease is at most this much shorter than on `Instant`'s clock
/// (Redis keeps expiries to the millisecond anyway).
const GRAIN: Duration = Duration::from_millis(1);

/// The largest suspended time measured so far, in nanoseconds: `now()` never runs back.
static SUSPENDED: AtomicU64 = AtomicU64::new(0);

/// Suspended time injected by the test hook, in nanoseconds (only ever grows).
static INJECTED: AtomicU64 = AtomicU64::new(0);

/// Now, on the lease clock: one read of the suspend-counting clock, put on `Instant`'s scale
/// at the origin (about as cheap as `Instant::now()`; `tests::cost_of_a_read`, release
/// build). Every round trip of a lock reads it a few dozen times, so it is not [`read`]'s
/// paired reading (three clock reads and a shared atomic), which only [`on_std`] needs.
pub(crate) fn now() -> Instant {
    if let Some(at) = on_boot_scale() {
        return at;
    }
    let (instant, suspended) = read();
    instant.checked_add(suspended).unwrap_or(instant)
}

/// The suspend-counting clock on `Instant`'s scale, plus any simulated suspend: the origin's
/// instant plus what that clock ran since (its reading there was taken first, so this is
/// never behind `Instant::now()`). `None` without such a clock, and in unit tests, whose
/// clock is Tokio's (paused time).
fn on_boot_scale() -> Option<Instant> {
    if cfg!(test) {
        return None;
    }
    boot_scale()
}

/// [`on_boot_scale`] whatever the build: what its unit tests read on the real clocks.
fn boot_scale() -> Option<Instant> {
    let origin = origin()?;
    let boot = boot_time()?;
    let injected = Duration::from_nanos(INJECTED.load(Ordering::Relaxed));
    origin
        .instant
        .checked_add(boot.saturating_sub(origin.boot))
        .and_then(|at| at.checked_add(injected))
}

/// The time on the lease clock since `earlier` (an instant on that clock), zero if none.
pub(crate) fn since(earlier: Instant) -> Duration {
    now().saturating_duration_since(earlier)
}

/// `at` (on the lease clock) on `Instant`'s scale as of now: what a user compares with
/// `Instant::now()`. A later suspend moves it earlier.
pub(crate) fn on_std(at: Instant) -> Instant {
    let (instant, suspended) = read();
    at.checked_sub(suspended).unwrap_or(instant)
}

/// Sleeps until `deadline` on the lease clock: on the Tokio timer, in steps of at most
/// [`timing::WAKE_CHECK`], so that a suspend that passes the deadline is noticed soon after the
/// machine wakes.
pub(crate) async fn sleep_until(deadline: Instant) {
    loop {
        let left = deadline.saturating_duration_since(now());
        if left.is_zero() {
            return;
        }
        tokio::time::sleep(left.min(timing::WAKE_CHECK)).await;
    }
}

/// `Instant::now()` and the suspended time then.
fn read() -> (Instant, Duration) {
    let (instant, measured) = match origin() {
        Some(origin) => {
            let (instant, boot) = pair();
            (instant, origin.suspended(instant, boot))
        }
        None => (Instant::now(), Duration::ZERO),
    };
    let measured = round_up(measured);
    let seen = SUSPENDED.fetch_max(measured, Ordering::Relaxed).max(measured);
    let injected = INJECTED.load(Ordering::Relaxed) + hook::here();
    (hook::instant(instant), Duration::from_nanos(seen.saturating_add(injected)))
}

/// `Instant::now()`, for what stays on `Instant`'s scale (retry pacing, a line's patience):
/// in unit tests Tokio's clock, so that paused time moves it as it moves the timers.
pub(crate) fn monotonic() -> Instant {
    hook::instant(Instant::now())
}

/// `measured` in nanoseconds, rounded up to the [`GRAIN`].
fn round_up(measured: Duration) -> u64 {
    let grain = GRAIN.as_nanos();
    let grains = measured.as_nanos().div_ceil(grain);
    u64::try_from(grains.saturating_mul(grain)).unwrap_or(u64::MAX)
}

/// The first reading of both clocks: what the suspended time counts from.
#[derive(Clone, Copy, Debug)]
struct Origin {
    instant: Instant,
    /// The suspend-counting clock, never later than the true value at `instant`.
    boot: Duration,
}

impl Origin {
    /// The time spent suspended between the origin and a reading `(instant, boot)` taken
    /// by [`pair`]: what the suspend-counting clock advanced beyond `Instant`. Never less
    /// than the truth: the origin's `boot` is read before its `instant`, a later reading's
    /// after (every read's delay errs on the short-validity side).
    fn suspended(&self, instant: Instant, boot: Duration) -> Duration {
        let boot_elapsed = boot.saturating_sub(self.boot);
        boot_elapsed.saturating_sub(instant.saturating_duration_since(self.instant))
    }
}

fn origin() -> Option<Origin> {
    static ORIGIN: OnceLock<Option<Origin>> = OnceLock::new();
    *ORIGIN.get_or_init(|| {
        // The suspend-counting clock first, so that its value is never late; the reading
        // with the tightest window of a few, the first tight one.
        let mut best: Option<(Origin, Duration)> = None;
        for _ in 0..READ_TRIES {
            let boot = boot_time()?;
            let instant = Instant::now();
            let window = boot_time()?.saturating_sub(boot);
            let origin = Origin { instant, boot };
            if window <= READ_WINDOW {
                return Some(origin);
            }
            if best.is_none_or(|(_, widest)| window < widest) {
                best = Some((origin, window));
            }
        }
        best.map(|(origin, _)| origin)
    })
}

/// `Instant::now()` and the suspend-counting clock read just after it (the smallest gap of
/// a few tries, the first whose window was tight).
fn pair() -> (Instant, Duration) {
    let mut best: Option<(Instant, Duration, Duration)> = None;
    for _ in 0..READ_TRIES {
        let instant = Instant::now();
        let Some(boot) = boot_time() else { break };
        let window = instant.elapsed();
        if window <= READ_WINDOW {
            return (instant, boot);
        }
        if best.is_none_or(|(_, _, widest)| window < widest) {
            best = Some((instant, boot, window));
        }
    }
    match best {
        Some((instant, boot, _)) => (instant, boot),
        // The clock failed after it worked at the origin: no suspend is measured.
        None => (Instant::now(), Duration::ZERO),
    }
}

/// The clock that counts suspended time too, where the platform has one.
#[cfg(any(target_os = "linux", target_os = "android"))]
fn boot_time() -> Option<Duration> {
    use nix::time::{ClockId, clock_gettime};
    clock_gettime(ClockId::CLOCK_BOOTTIME).ok().map(Duration::from)
}

#[cfg(not(any(target_os = "linux", target_os = "android")))]
fn boot_time() -> Option<Duration> {
    None
}

/// Moves the lease clock ahead by `by`, as a suspend of that length would, for every lease
/// of the process.
pub(crate) fn simulate_suspend(by: Duration) {
    let by = u64::try_from(by.as_nanos()).unwrap_or(u64::MAX);
    let _ = INJECTED
        .fetch_update(Ordering::Relaxed, Ordering::Relaxed, |old| Some(old.saturating_add(by)));
}

/// The unit tests' own seam: a suspend seen by the current thread only, so that tests
/// running at once in one process do not see each other's.
mod hook {
    #[cfg(test)]
    thread_local! {
        static HERE: std::cell::Cell<u64> = const { std::cell::Cell::new(0) };
    }

    #[cfg(test)]
    pub(super) fn here() -> u64 {
        HERE.with(std::cell::Cell::get)
    }

    #[cfg(not(test))]
    pub(super) fn here() -> u64 {
        0
    }

    /// What the clock reads as `Instant::now()`: in unit tests Tokio's clock (the same
    /// unless a test paused it), so that a test with paused time moves leases, rounds and
    /// deadlines with `tokio::time::advance` instead of sleeping for real.
    #[cfg(test)]
    pub(super) fn instant(_: std::time::Instant) -> std::time::Instant {
        tokio::time::Instant::now().into_std()
    }

    #[cfg(not(test))]
    pub(super) fn instant(read: std::time::Instant) -> std::time::Instant {
        read
    }

    /// Moves the lease clock ahead by `by` for this thread.
    #[cfg(test)]
    pub(crate) fn suspend_here(by: std::time::Duration) {
        let by = u64::try_from(by.as_nanos()).unwrap_or(u64::MAX);
        HERE.with(|here| here.set(here.get().saturating_add(by)));
    }
}

#[cfg(test)]
pub(crate) use hook::suspend_here;

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_reading_counts_what_the_boot_clock_ran_beyond_the_monotonic_one() {
        let start = Instant::now();
        let origin = Origin { instant: start, boot: Duration::from_secs(100) };
        let awake = Duration::from_secs(5);
        let asleep = Duration::from_secs(30);
        let boot = Duration::from_secs(100) + awake + asleep;
        assert_eq!(origin.suspended(start + awake, boot), asleep);
        // Never negative, whatever the reading's noise.
        assert_eq!(origin.suspended(start + awake, Duration::from_secs(104)), Duration::ZERO);
    }

    #[cfg(any(target_os = "linux", target_os = "android"))]
    #[test]
    fn linux_reads_the_boot_clock() {
        assert!(origin().is_some(), "CLOCK_BOOTTIME could not be read");
        let (_, boot) = pair();
        assert!(boot > Duration::ZERO);
    }

    #[test]
    fn a_measure_is_rounded_up_to_the_millisecond() {
        assert_eq!(round_up(Duration::ZERO), 0);
        assert_eq!(round_up(Duration::from_nanos(1)), 1_000_000);
        assert_eq!(round_up(Duration::from_millis(3)), 3_000_000);
        assert_eq!(round_up(Duration::from_micros(3001)), 4_000_000);
    }

    #[test]
    fn the_users_deadline_holds_still_while_nothing_is_suspended() {
        let deadline = now() + Duration::from_secs(1);
        let first = on_std(deadline);
        for _ in 0..10_000 {
            assert_eq!(on_std(deadline), first);
        }
    }

    #[test]
    fn the_clock_never_runs_back_and_keeps_up_with_instant() {
        let mut last = now();
        for _ in 0..10_000 {
            let next = now();
            assert!(next >= last);
            last = next;
        }
        let (std_before, lease) = (Instant::now(), now());
        assert!(lease >= std_before, "the lease clock is never behind Instant");
    }

    /// The reading every lease is counted on outside unit tests (which count on Tokio's
    /// clock instead): it never runs back, is never behind `Instant` (a validity counted
    /// on it errs short), and what it reads, handed to a user, is never later than the
    /// `Instant` it stands for (a user's `deadline()` is never past the true expiry).
    #[cfg(any(target_os = "linux", target_os = "android"))]
    #[test]
    fn the_boot_clock_reading_never_runs_back_nor_behind_instant_nor_late_for_the_user() {
        let mut last = boot_scale().unwrap();
        for _ in 0..10_000 {
            let before = Instant::now();
            let next = boot_scale().unwrap();
            assert!(next >= last, "ran back by {:?}", last - next);
            assert!(next >= before, "behind Instant by {:?}", before - next);
            let handed_out = on_std(next);
            let after = Instant::now();
            assert!(handed_out <= after, "late for the user by {:?}", handed_out - after);
            last = next;
        }
    }

    #[test]
    fn a_suspend_moves_the_clock_ahead_and_the_users_deadline_earlier() {
        let deadline = now() + Duration::from_secs(60);
        let before = on_std(deadline);
        suspend_here(Duration::from_secs(20));
        let validity = deadline.saturating_duration_since(now());
        assert!(validity <= Duration::from_secs(40), "{validity:?}");
        assert!(validity > Duration::from_secs(39), "{validity:?}");
        let after = on_std(deadline);
        let moved = before.saturating_duration_since(after);
        assert!(moved >= Duration::from_secs(20), "{moved:?}");
        assert!(moved < Duration::from_secs(21), "{moved:?}");
    }

    #[tokio::test]
    async fn a_sleep_ends_soon_after_a_suspend_that_passes_its_deadline() {
        let deadline = now() + Duration::from_secs(3600);
        let sleeping = tokio::spawn(sleep_until(deadline));
        tokio::time::sleep(Duration::from_millis(20)).await;
        assert!(!sleeping.is_finished());
        let suspended_at = Instant::now();
        suspend_here(Duration::from_secs(3600));
        tokio::time::timeout(Duration::from_secs(10), sleeping).await.unwrap().unwrap();
        let noticed = suspended_at.elapsed();
        assert!(noticed <= timing::WAKE_CHECK + Duration::from_secs(2), "{noticed:?}");
    }

    /// Measures what the clock costs per read (run with `--ignored --nocapture`).
    #[test]
    #[ignore = "a measurement, not a check"]
    fn cost_of_a_read() {
        const READS: u32 = 1_000_000;
        let started = Instant::now();
        for _ in 0..READS {
            std::hint::black_box(Instant::now());
        }
        let std = started.elapsed() / READS;
        let started = Instant::now();
        for _ in 0..READS {
            std::hint::black_box(now());
        }
        let lease = started.elapsed() / READS;
        println!("Instant::now(): {std:?}; clock::now(): {lease:?}");
    }
}
