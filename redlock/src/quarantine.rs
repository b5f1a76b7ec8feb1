//! Restart quarantine: a node whose Redis process started recently does not vote.
//!
//! A master that restarted without its keys can grant a lock that another client still
//! holds there. The Redlock spec's remedy is a delayed restart (keep the node out for
//! longer than the longest lease); this module lets the client apply it, from the
//! uptime the node reports whenever a connection opens.

use crate::timing;
use std::time::{Duration, Instant};

/// `uptime_in_seconds` from an `INFO server` reply.
pub(crate) fn parse_uptime(info: &str) -> Option<Duration> {
    info.lines()
        .find_map(|line| line.strip_prefix("uptime_in_seconds:"))
        .and_then(|value| value.trim().parse().ok())
        .map(Duration::from_secs)
}

/// When the quarantine of a node that reported `uptime` in a reply received at
/// `replied_at` ends, assuming the latest start the reply allows; `None` when it is over.
pub(crate) fn end(replied_at: Instant, uptime: Duration, quarantine: Duration) -> Option<Instant> {
    let latest_start_plus =
        replied_at.checked_add(quarantine)?.checked_add(timing::UPTIME_RESOLUTION)?;
    latest_start_plus.checked_sub(uptime).filter(|end| *end > replied_at)
}

#[cfg(test)]
mod tests {
    use super::*;
    use proptest::prelude::*;

    #[test]
    fn parses_the_uptime_line() {
        let info =
            "# Server\r\nredis_version:7.0.15\r\nuptime_in_seconds:42\r\nuptime_in_days:0\r\n";
        assert_eq!(parse_uptime(info), Some(Duration::from_secs(42)));
        assert_eq!(parse_uptime("# Server\r\nredis_version:7.0.15\r\n"), None);
        assert_eq!(parse_uptime("uptime_in_seconds:abc\r\n"), None);
    }

    #[test]
    fn a_fresh_node_is_quarantined_one_resolution_longer() {
        let now = Instant::now();
        let q = Duration::from_secs(10);
        assert_eq!(end(now, Duration::ZERO, q), Some(now + Duration::from_secs(11)));
        assert_eq!(end(now, Duration::from_secs(4), q), Some(now + Duration::from_secs(7)));
        assert_eq!(end(now, Duration::from_secs(11), q), None);
        assert_eq!(end(now, Duration::from_secs(3600), q), None);
    }

    proptest! {
        #[test]
        fn the_quarantine_never_ends_before_the_true_start_plus_the_period(
            uptime_s in 0u64..100_000,
            below_reported_ms in 0u64..1000,
            q_ms in 0u64..10_000_000,
        ) {
            // The true uptime is in (reported - 1 s, reported], at most.
            let now = Instant::now();
            let reported = Duration::from_secs(uptime_s);
            let true_uptime = reported.saturating_sub(Duration::from_millis(below_reported_ms));
            let quarantine = Duration::from_millis(q_ms);
            let true_end = (now + quarantine).checked_sub(true_uptime);
            match (end(now, reported, quarantine), true_end) {
                (Some(ours), Some(truth)) => prop_assert!(ours >= truth),
                (None, Some(truth)) => prop_assert!(truth <= now),
                _ => {}
            }
        }
    }
}
