//! The arithmetic of the algorithm: quorum size, clock drift and lease validity.
//!
//! Pure functions without I/O, so that they can be tested exhaustively.

use std::time::Duration;

/// Redis expires keys with one millisecond precision; the reference implementation adds
/// these two milliseconds to the drift allowance to cover it.
const EXPIRY_PRECISION: Duration = Duration::from_millis(2);

/// The largest lease we accept: far beyond any sane lease, far below what makes Redis
/// reject `PX` (its expiry time in milliseconds must fit an `i64` after adding "now").
pub(crate) const MAX_TTL: Duration = Duration::from_secs(100 * 365 * 24 * 3600);

/// How many of `nodes` masters must agree: a strict majority, `N/2 + 1`.
///
/// For an even `N` this is one more than half, so two disjoint groups can never both hold
/// a quorum.
pub(crate) const fn quorum(nodes: usize) -> usize {
    nodes / 2 + 1
}

/// The clock drift allowance for a lease of `ttl`: `ttl x factor + 2 ms`.
///
/// `factor` is validated to lie in `[0, 1)` by the builder, so the product cannot overflow.
pub(crate) fn drift(ttl: Duration, factor: f64) -> Duration {
    ttl.mul_f64(factor) + EXPIRY_PRECISION
}

/// What remains of a lease of `ttl` after `elapsed` and the drift allowance, or `None` when
/// nothing remains (a failed attempt, never a lock that is already over).
pub(crate) fn validity(ttl: Duration, elapsed: Duration, drift: Duration) -> Option<Duration> {
    ttl.checked_sub(elapsed)?.checked_sub(drift).filter(|left| !left.is_zero())
}

/// The one conversion from a `Duration` to the milliseconds Redis expects.
///
/// Rounds down, so the lease stored in Redis is never longer than the one the client counts
/// on; returns `None` for a lease that rounds to zero or exceeds [`MAX_TTL`].
pub(crate) fn ttl_millis(ttl: Duration) -> Option<u64> {
    if ttl > MAX_TTL {
        return None;
    }
    u64::try_from(ttl.as_millis()).ok().filter(|&ms| ms > 0)
}

/// A round is decided once its outcome cannot change: `ok` votes reached the quorum, or so
/// many nodes refused that even the ones still pending could not make up a quorum.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub(crate) enum Decision {
    /// A quorum of nodes agreed.
    Reached,
    /// A quorum is out of reach.
    Failed,
}

/// Decides a round over `nodes` masters from the votes seen so far.
pub(crate) fn decide(nodes: usize, ok: usize, answered: usize) -> Option<Decision> {
    let needed = quorum(nodes);
    if ok >= needed {
        Some(Decision::Reached)
    } else if ok + (nodes - answered) < needed {
        Some(Decision::Failed)
    } else {
        None
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use proptest::prelude::*;

    #[test]
    fn quorum_is_a_strict_majority() {
        assert_eq!(quorum(1), 1);
        assert_eq!(quorum(2), 2);
        assert_eq!(quorum(3), 2);
        assert_eq!(quorum(4), 3);
        assert_eq!(quorum(5), 3);
        assert_eq!(quorum(7), 4);
    }

    #[test]
    fn drift_follows_the_reference_constant() {
        assert_eq!(drift(Duration::from_secs(10), 0.01), Duration::from_millis(102));
        assert_eq!(drift(Duration::from_secs(10), 0.0), Duration::from_millis(2));
    }

    #[test]
    fn validity_is_none_when_used_up() {
        let ttl = Duration::from_millis(100);
        let drift = drift(ttl, 0.01);
        assert_eq!(
            validity(ttl, Duration::from_millis(10), drift),
            Some(Duration::from_millis(87))
        );
        assert_eq!(validity(ttl, Duration::from_millis(97), drift), None);
        assert_eq!(validity(ttl, Duration::from_millis(500), drift), None);
    }

    #[test]
    fn ttl_millis_rejects_zero_and_huge() {
        assert_eq!(ttl_millis(Duration::from_micros(999)), None);
        assert_eq!(ttl_millis(Duration::from_micros(1500)), Some(1));
        assert_eq!(ttl_millis(MAX_TTL + Duration::from_millis(1)), None);
        assert_eq!(ttl_millis(Duration::MAX), None);
    }

    proptest! {
        #[test]
        fn two_quorums_always_overlap(n in 1usize..64) {
            prop_assert!(2 * quorum(n) > n);
            prop_assert!(quorum(n) <= n);
        }

        #[test]
        fn validity_never_exceeds_ttl_and_never_is_zero(
            ttl_ms in 1u64..=MAX_TTL.as_millis() as u64,
            elapsed_us in 0u64..10_000_000_000,
            factor in 0.0f64..1.0,
        ) {
            let ttl = Duration::from_millis(ttl_ms);
            let elapsed = Duration::from_micros(elapsed_us);
            let d = drift(ttl, factor);
            match validity(ttl, elapsed, d) {
                Some(v) => {
                    prop_assert!(!v.is_zero());
                    prop_assert!(v + elapsed + d == ttl);
                }
                None => prop_assert!(elapsed + d >= ttl),
            }
        }

        #[test]
        fn a_decided_round_never_changes_its_mind(
            n in 1usize..16,
            votes in proptest::collection::vec(any::<bool>(), 16),
        ) {
            let mut first = None;
            let (mut ok, mut answered) = (0, 0);
            for vote in votes.iter().take(n) {
                answered += 1;
                ok += usize::from(*vote);
                if let Some(d) = decide(n, ok, answered) {
                    first.get_or_insert(d);
                    prop_assert_eq!(Some(d), first);
                }
            }
            // With every node answered the round is always decided.
            prop_assert!(decide(n, ok, n).is_some());
            prop_assert_eq!(decide(n, ok, n) == Some(Decision::Reached), ok >= quorum(n));
        }
    }
}
