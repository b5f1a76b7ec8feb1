//! Not part of the API: the pure functions the benchmarks time, so that their cost can be
//! measured without a network. Hidden from the docs; may change in any release.

use std::time::{Duration, Instant};

/// The quorum of `nodes` masters.
pub fn quorum(nodes: usize) -> usize {
    crate::quorum::quorum(nodes)
}

/// The validity deadline of a lease of `ttl` whose round started at `started_at`, with the
/// drift of `factor` (`None` for a lease out of range).
pub fn deadline(ttl: Duration, factor: f64, started_at: Instant) -> Option<Instant> {
    Some(crate::config::Ttl::new(ttl, factor).ok()?.deadline(started_at))
}

/// Feeds `votes` (yes or no, in answer order) to the round decision over `votes.len()`
/// nodes; `Some(true)` when a quorum was reached, `Some(false)` when it became impossible.
pub fn decide(votes: &[bool]) -> Option<bool> {
    use crate::error::NodeOutcome;
    use crate::quorum::{Settled, Tally, settle_acquire};
    let mut tally = Tally::new(votes.len());
    for &vote in votes {
        tally.add(if vote { &NodeOutcome::Ok } else { &NodeOutcome::Held });
        if let Some(settled) = settle_acquire(&tally) {
            return Some(settled == Settled::Reached);
        }
    }
    None
}

/// A fresh lock token.
pub fn token() -> String {
    crate::token::generate()
}
