//! Overlapping windows: the sweep behind exclusion violations and shared overlaps.

use std::{fmt, time::Duration};

use super::{Grant, Mode, Who};

/// Two grants, by different tokens and at least one of them exclusive, whose windows
/// overlap: a broken exclusion.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Violation {
    /// The grant whose window started first.
    pub first: Grant,
    /// The grant that started while `first` still held.
    pub second: Grant,
    /// How long both held at once.
    pub overlap: Duration,
}

impl fmt::Display for Violation {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(
            f,
            "{} and {} both held the lock for {}",
            Who(&self.first),
            Who(&self.second),
            humantime::format_duration(self.overlap)
        )
    }
}

/// Every pair of non-empty windows, by different tokens, that overlap and whose modes
/// `counts` selects.
///
/// Sorts by start then sweeps: every later grant that starts before a grant ends
/// overlaps it, and the first one that doesn't ends that grant's scan.
pub(super) fn overlaps(grants: &[Grant], counts: impl Fn(Mode, Mode) -> bool) -> Vec<Violation> {
    let mut grants: Vec<&Grant> = grants.iter().filter(|g| g.holds()).collect();
    grants.sort_by_key(|g| g.start());
    let mut found = Vec::new();
    for (i, first) in grants.iter().enumerate() {
        let end = first.end();
        for second in grants[i + 1..].iter().take_while(|g| g.start() < end) {
            if second.token == first.token || !counts(first.mode, second.mode) {
                continue;
            }
            found.push(Violation {
                first: (*first).clone(),
                second: (*second).clone(),
                overlap: end.min(second.end()) - second.start(),
            });
        }
    }
    found
}
