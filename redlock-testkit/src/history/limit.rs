//! Counted holders: the stretches of time during which more than L grants held at once.

use std::{
    collections::BTreeMap,
    fmt,
    time::{Duration, Instant},
};

use super::{Grant, Who};

/// A stretch of time during which more grants, by different tokens, held at once than the
/// limit allows: a counting lock (a semaphore of `limit` permits) let one holder too many in.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct LimitViolation {
    /// The limit the history was checked against.
    pub limit: usize,
    /// When the holders first outnumbered the limit.
    pub from: Instant,
    /// When they were back within it.
    pub until: Instant,
    /// The most holders at one instant of the stretch.
    pub most: usize,
    /// One grant per holder at the first instant with `most` holders, by start.
    pub holders: Vec<Grant>,
}

impl LimitViolation {
    /// How long the holders outnumbered the limit.
    pub fn duration(&self) -> Duration {
        self.until - self.from
    }
}

impl fmt::Display for LimitViolation {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(
            f,
            "{} holders at once (at most {} allowed) for {}:",
            self.most,
            self.limit,
            humantime::format_duration(self.duration())
        )?;
        for (i, grant) in self.holders.iter().enumerate() {
            let sep = if i == 0 { " " } else { ", " };
            write!(f, "{sep}{}", Who(grant))?;
        }
        Ok(())
    }
}

/// Every maximal stretch during which more than `limit` tokens held a non-empty window.
///
/// Grants with the same token are one holder. Windows that only touch do not overlap: all
/// the starts and ends of one instant are applied before the holders are counted. Sorts the
/// starts and ends, then sweeps them once: O(n log n + n x holders) for the snapshots.
pub(super) fn over(grants: &[Grant], limit: usize) -> Vec<LimitViolation> {
    let holding: Vec<&Grant> = grants.iter().filter(|g| g.holds()).collect();
    // (instant, +1 start / -1 end, grant): one instant's events are applied together.
    let mut events: Vec<(Instant, i8, usize)> = Vec::with_capacity(holding.len() * 2);
    for (i, grant) in holding.iter().enumerate() {
        events.push((grant.start(), 1, i));
        events.push((grant.end(), -1, i));
    }
    events.sort_by_key(|&(at, _, i)| (at, i));

    // Token -> the records of it holding now (an extension is recorded again).
    let mut active: BTreeMap<&str, Vec<usize>> = BTreeMap::new();
    let mut open: Option<LimitViolation> = None;
    let mut found = Vec::new();
    let mut next = 0;
    while next < events.len() {
        let at = events[next].0;
        while let Some(&(when, step, i)) = events.get(next)
            && when == at
        {
            let token = holding[i].token.as_str();
            if step > 0 {
                active.entry(token).or_default().push(i);
            } else if let Some(records) = active.get_mut(token) {
                records.retain(|&r| r != i);
                if records.is_empty() {
                    active.remove(token);
                }
            }
            next += 1;
        }
        let holders = active.len();
        match open.as_mut() {
            Some(stretch) if holders <= limit => {
                stretch.until = at;
                found.extend(open.take());
            }
            Some(stretch) if holders > stretch.most => {
                stretch.most = holders;
                stretch.holders = snapshot(&holding, &active);
            }
            Some(_) => {}
            None if holders > limit => {
                open = Some(LimitViolation {
                    limit,
                    from: at,
                    until: at,
                    most: holders,
                    holders: snapshot(&holding, &active),
                });
            }
            None => {}
        }
    }
    // Every window ends, so every stretch was closed by its last end.
    found
}

/// One record per holding token, the earliest-starting, in order of start.
fn snapshot(holding: &[&Grant], active: &BTreeMap<&str, Vec<usize>>) -> Vec<Grant> {
    let mut holders: Vec<Grant> = active
        .values()
        .filter_map(|records| records.iter().map(|&i| holding[i]).min_by_key(|g| g.start()))
        .cloned()
        .collect();
    holders.sort_by_key(|g| (g.start(), g.client));
    holders
}

#[cfg(test)]
mod tests {
    use std::time::{Duration, Instant};

    use super::*;
    use crate::history::{Mode, exclusion};

    /// The most tokens holding at one instant, looking at every start (where counts rise).
    fn most_at_once(grants: &[Grant]) -> usize {
        let holding: Vec<&Grant> = grants.iter().filter(|g| g.holds()).collect();
        holding
            .iter()
            .map(|probe| {
                let at = probe.start();
                let mut tokens: Vec<&str> = holding
                    .iter()
                    .filter(|g| g.start() <= at && at < g.end())
                    .map(|g| g.token.as_str())
                    .collect();
                tokens.sort();
                tokens.dedup();
                tokens.len()
            })
            .max()
            .unwrap_or(0)
    }

    fn random_histories(mut check: impl FnMut(usize, &[Grant])) {
        let t0 = Instant::now();
        let mut seed = 0x2545_f491_4f6c_dd1d_u64;
        let mut next = |bound: u64| {
            seed ^= seed << 13;
            seed ^= seed >> 7;
            seed ^= seed << 17;
            seed % bound
        };
        for round in 0..300 {
            let grants: Vec<Grant> = (0..10)
                .map(|i| {
                    let from = next(60);
                    // Some windows empty, some touching: both count as not holding there.
                    let until = from + next(30);
                    let mut g = Grant::new(
                        i,
                        format!("t{}", next(7)),
                        t0 + Duration::from_millis(from),
                        t0 + Duration::from_millis(until),
                    );
                    if next(4) == 0 {
                        g.released_at = Some(t0 + Duration::from_millis(from + next(20)));
                    }
                    g
                })
                .collect();
            check(round, &grants);
        }
    }

    #[test]
    fn a_limit_is_broken_exactly_when_more_tokens_than_it_hold_at_one_instant() {
        random_histories(|round, grants| {
            let most = most_at_once(grants);
            for limit in 0..5 {
                let found = over(grants, limit);
                assert_eq!(!found.is_empty(), most > limit, "round {round}, limit {limit}");
                let peak = found.iter().map(|v| v.most).max().unwrap_or(0);
                assert_eq!(peak, if most > limit { most } else { 0 }, "round {round}");
                for v in &found {
                    assert!(v.from < v.until, "round {round}: an empty stretch {v:?}");
                    assert_eq!(v.holders.len(), v.most, "round {round}");
                }
            }
        });
    }

    #[test]
    fn a_limit_of_one_flags_the_same_histories_as_exclusion() {
        random_histories(|round, grants| {
            let pairs =
                exclusion::overlaps(grants, |a, b| a == Mode::Exclusive || b == Mode::Exclusive);
            assert_eq!(over(grants, 1).is_empty(), pairs.is_empty(), "round {round}: {grants:#?}");
        });
    }
}
