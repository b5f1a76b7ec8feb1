//! `redlock run --once-per`: which window a run belongs to, and how long it keeps the lock.
//!
//! Windows are fixed spans of UTC time, aligned to the Unix epoch (so `1d` windows are UTC
//! days, `1h` windows are hours), each moved earlier by a short lead: every machine finds
//! the same window for a run from its own clock, whenever within the window it starts,
//! without having seen the run that took the lock. A run keeps the lock until its window
//! ends, so that a late start in the window finds it held, and gives it back before the
//! next window begins, so that the next scheduled run finds it free.

use std::time::{Duration, SystemTime};

/// The longest lead: how much earlier than its boundary a window begins. It absorbs the
/// difference between the clock of the machine that kept the lock (which set when its keys
/// expire) and the clocks of those that start right at the next boundary, and the nodes'
/// own expiry precision, so that a job scheduled exactly on the boundary (cron's
/// `*/5 * * * *` with `--once-per 5m`) never finds the previous window's hold.
const MAX_LEAD: Duration = Duration::from_secs(2);

/// The shortest window: below it the lead and the nodes' timing decide more than the clock.
pub(crate) const MIN_PERIOD: Duration = Duration::from_secs(1);

/// The window a run belongs to.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub(crate) struct Window {
    /// When it ends, as time since the Unix epoch.
    end: Duration,
    /// How long before its end a run of the window stops trying to get the lock.
    closing: Duration,
}

impl Window {
    /// The window of length `period` that holds `now`.
    pub(crate) fn of(period: Duration, now: SystemTime) -> Self {
        let lead = lead(period);
        let since_epoch = now.duration_since(SystemTime::UNIX_EPOCH).unwrap_or_default();
        let period_ns = period.as_nanos().max(1);
        // Counted from the lead on: a run in the lead before a boundary is the next window's.
        let index = (since_epoch + lead).as_nanos() / period_ns;
        let boundary = (index + 1).saturating_mul(period_ns);
        let end = Duration::from_nanos(u64::try_from(boundary).unwrap_or(u64::MAX)) - lead;
        Self { end, closing: lead }
    }

    /// How long a run of the window may still try to get the lock, at `now`: until the lead
    /// before its end. The lock kept by the window's run expires at the end, by the clock of
    /// the machine that kept it; a run granted after that would run the command a second
    /// time in the window. Stopping a whole lead early keeps that from happening for clocks
    /// that differ by up to the lead, the skew the lead absorbs at the window's start too.
    pub(crate) fn open_for(&self, now: SystemTime) -> Duration {
        self.left(now).saturating_sub(self.closing)
    }

    /// When it ends, in milliseconds since the Unix epoch: the same for every run of the
    /// window, whichever machine's clock it read.
    pub(crate) fn end_millis(&self) -> u128 {
        self.end.as_millis()
    }

    /// What is left of the window at `now` (zero once it is over).
    pub(crate) fn left(&self, now: SystemTime) -> Duration {
        let since_epoch = now.duration_since(SystemTime::UNIX_EPOCH).unwrap_or_default();
        self.end.saturating_sub(since_epoch)
    }
}

/// How much earlier than its boundary a window of length `period` begins: [`MAX_LEAD`], or
/// a tenth of the window if that is shorter.
fn lead(period: Duration) -> Duration {
    MAX_LEAD.min(period / 10)
}

/// Parses `--once-per`: a duration of at least [`MIN_PERIOD`].
pub(crate) fn parse_period(text: &str) -> Result<Duration, String> {
    let period =
        humantime::parse_duration(text.trim()).map_err(|err| format!("`{text}`: {err}"))?;
    if period < MIN_PERIOD {
        return Err(format!(
            "`{text}`: a window is at least {}",
            humantime::format_duration(MIN_PERIOD)
        ));
    }
    Ok(period)
}

#[cfg(test)]
mod tests {
    use super::*;

    fn at(secs: u64, millis: u64) -> SystemTime {
        SystemTime::UNIX_EPOCH + Duration::from_secs(secs) + Duration::from_millis(millis)
    }

    const DAY: u64 = 86_400;

    #[test]
    fn a_day_window_ends_two_seconds_before_utc_midnight() {
        let window = Window::of(Duration::from_secs(DAY), at(10 * DAY + 2 * 3600, 0));
        assert_eq!(window.left(at(10 * DAY + 2 * 3600, 0)), Duration::from_secs(22 * 3600 - 2));
        // A start one second later, or twenty hours later, is in the same window.
        assert_eq!(window, Window::of(Duration::from_secs(DAY), at(10 * DAY + 2 * 3600 + 1, 0)));
        assert_eq!(window, Window::of(Duration::from_secs(DAY), at(10 * DAY + 22 * 3600, 0)));
        assert_eq!(window.left(at(11 * DAY, 0)), Duration::ZERO);
        // Runs stop trying the lead (2 s) before the end (2 s before midnight).
        assert_eq!(window.open_for(at(11 * DAY - 4, 0)), Duration::ZERO);
        assert_eq!(window.open_for(at(11 * DAY - 5, 0)), Duration::from_secs(1));
    }

    #[test]
    fn a_start_in_the_lead_before_a_boundary_belongs_to_the_next_window() {
        let period = Duration::from_secs(300);
        let early = Window::of(period, at(3000 - 1, 0));
        let on_time = Window::of(period, at(3000, 5));
        assert_eq!(early, on_time);
        assert_eq!(on_time.left(at(3000, 0)), Duration::from_secs(298));
        let before = Window::of(period, at(3000 - 3, 0));
        assert_eq!(before.left(at(3000 - 3, 0)), Duration::from_secs(1));
    }

    #[test]
    fn short_windows_lead_by_a_tenth() {
        let period = Duration::from_secs(3);
        let window = Window::of(period, at(30, 0));
        assert_eq!(window.left(at(30, 0)), Duration::from_millis(2700));
        assert_eq!(Window::of(period, at(32, 800)).left(at(32, 800)), Duration::from_millis(2900));
    }

    #[test]
    fn periods_parse_with_a_minimum() {
        assert_eq!(parse_period("1d"), Ok(Duration::from_secs(DAY)));
        assert_eq!(parse_period("5m"), Ok(Duration::from_secs(300)));
        assert!(parse_period("500ms").is_err());
        assert!(parse_period("daily").is_err());
    }
}
