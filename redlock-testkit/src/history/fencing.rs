//! Fencing order: a grant that starts after another one ended must carry a larger token.

use std::fmt;

use super::{Grant, Mode, Who};

/// A grant whose fencing token is not larger than that of a grant, by another token,
/// that ended before it started (windows that touch count as one after the other).
///
/// A storage that keeps the largest token it saw would then refuse the newer holder's
/// writes, or take the older holder's late writes over the newer one's.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct FencingViolation {
    /// The grant that ended first, with the larger (or equal) token.
    pub earlier: Grant,
    /// The grant that started after `earlier` ended, with a token that is not larger.
    pub later: Grant,
}

impl fmt::Display for FencingViolation {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(
            f,
            "{} started after {} ended, but its fencing token is not larger",
            Who(&self.later),
            Who(&self.earlier)
        )
    }
}

/// The earlier grants with the largest fences among those that ended so far: the best
/// one, and the best one of another token (so that a grant is never compared with
/// another record of its own lock).
#[derive(Default)]
struct Largest<'a> {
    best: Option<(&'a Grant, u64)>,
    other_token: Option<(&'a Grant, u64)>,
}

impl<'a> Largest<'a> {
    fn add(&mut self, grant: &'a Grant, fence: u64) {
        match self.best {
            None => self.best = Some((grant, fence)),
            Some((best, top)) if best.token == grant.token => {
                if fence > top {
                    self.best = Some((grant, fence));
                }
            }
            Some((_, top)) if fence > top => self.other_token = self.best.replace((grant, fence)),
            Some(_) => {
                if self.other_token.is_none_or(|(_, second)| fence > second) {
                    self.other_token = Some((grant, fence));
                }
            }
        }
    }

    /// The earlier grant with the largest fence whose token is not `token`.
    fn against(&self, token: &str) -> Option<(&'a Grant, u64)> {
        match self.best {
            Some((best, _)) if best.token == token => self.other_token,
            best => best,
        }
    }
}

/// Each exclusive, fenced grant whose token is not larger than the largest one of the
/// grants (by other tokens) that ended before it started.
///
/// Sorts by start and by end, then sweeps both: O(n log n).
pub(super) fn violations(grants: &[Grant]) -> Vec<FencingViolation> {
    let fenced: Vec<(&Grant, u64)> = grants
        .iter()
        .filter(|g| g.mode == Mode::Exclusive)
        .filter_map(|g| g.fence.map(|fence| (g, fence)))
        .collect();
    let mut by_start = fenced.clone();
    by_start.sort_by_key(|(g, _)| g.start());
    let mut by_end = fenced;
    by_end.sort_by_key(|(g, _)| g.end());

    let mut ended = by_end.into_iter().peekable();
    let mut largest = Largest::default();
    let mut found = Vec::new();
    for (later, fence) in by_start {
        while let Some((earlier, earlier_fence)) = ended.next_if(|(g, _)| g.end() <= later.start())
        {
            largest.add(earlier, earlier_fence);
        }
        if let Some((earlier, earlier_fence)) = largest.against(&later.token)
            && earlier_fence >= fence
        {
            found.push(FencingViolation { earlier: earlier.clone(), later: later.clone() });
        }
    }
    found
}

#[cfg(test)]
mod tests {
    use std::time::{Duration, Instant};

    use super::*;

    /// Which later grants are out of order, the quadratic way.
    fn brute_force(grants: &[Grant]) -> Vec<String> {
        let fenced = || grants.iter().filter(|g| g.mode == Mode::Exclusive && g.fence.is_some());
        let mut late: Vec<String> = fenced()
            .filter(|later| {
                fenced().any(|earlier| {
                    earlier.token != later.token
                        && earlier.end() <= later.start()
                        && earlier.fence >= later.fence
                })
            })
            .map(|g| g.token.clone())
            .collect();
        late.sort();
        late
    }

    #[test]
    fn the_sweep_flags_the_same_grants_as_comparing_every_pair() {
        let t0 = Instant::now();
        let mut seed = 0x9e37_79b9_7f4a_7c15_u64;
        let mut next = |bound: u64| {
            seed ^= seed << 13;
            seed ^= seed >> 7;
            seed ^= seed << 17;
            seed % bound
        };
        for round in 0..200 {
            let grants: Vec<Grant> = (0..12)
                .map(|i| {
                    let from = next(100);
                    let until = from + next(40);
                    // Few tokens, so that some grants are records of the same lock.
                    let token = format!("t{}", next(8));
                    let mut g = Grant::new(
                        i,
                        token,
                        t0 + Duration::from_millis(from),
                        t0 + Duration::from_millis(until),
                    );
                    g.fence = (next(4) > 0).then(|| next(20));
                    g
                })
                .collect();
            let mut swept: Vec<String> =
                violations(&grants).into_iter().map(|v| v.later.token).collect();
            swept.sort();
            assert_eq!(swept, brute_force(&grants), "round {round}: {grants:#?}");
        }
    }
}
