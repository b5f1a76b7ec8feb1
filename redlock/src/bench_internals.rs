//! Not part of the API: the pure functions the benchmarks time, so that their cost can be
//! measured without a network. Hidden from the docs; may change in any release.

use std::time::Duration;

/// The quorum of `nodes` masters.
pub fn quorum(nodes: usize) -> usize {
    crate::quorum::quorum(nodes)
}

/// The validity left of a lease of `ttl` after `elapsed`, with the drift of `factor`.
pub fn validity(ttl: Duration, elapsed: Duration, factor: f64) -> Option<Duration> {
    crate::quorum::validity(ttl, elapsed, crate::quorum::drift(ttl, factor))
}

/// Feeds `votes` (yes or no, in answer order) to the round decision over `votes.len()`
/// nodes; `Some(true)` when a quorum was reached, `Some(false)` when it became impossible.
pub fn decide(votes: &[bool]) -> Option<bool> {
    let (mut ok, mut answered) = (0, 0);
    for &vote in votes {
        answered += 1;
        ok += usize::from(vote);
        if let Some(decision) = crate::quorum::decide(votes.len(), ok, answered) {
            return Some(decision == crate::quorum::Decision::Reached);
        }
    }
    None
}

/// A fresh lock token.
pub fn token() -> String {
    crate::token::generate()
}
