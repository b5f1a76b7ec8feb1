//! The exclusion checker for read-write locks: read and write grants, and which of them
//! overlapped where they must not.
//!
//! Windows are those of [`History`](crate::History) (see there): from when the grant was
//! returned until its validity deadline or its release, whichever is first. Two reads may
//! overlap; a write must overlap no other grant (read or write) of another token.

use std::{
    fmt,
    sync::{Arc, Mutex, MutexGuard, PoisonError},
    time::{Duration, Instant},
};

use crate::history::Grant;

/// Which side of the lock a grant is.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
pub enum RwMode {
    /// A reader's share: may overlap other shares.
    Read,
    /// The writer's grant: may overlap nothing.
    Write,
}

impl fmt::Display for RwMode {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(match self {
            RwMode::Read => "read",
            RwMode::Write => "write",
        })
    }
}

/// One grant of a read-write lock as a client saw it.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct RwGrant {
    /// Read or write.
    pub mode: RwMode,
    /// Who, the token, and the window.
    pub grant: Grant,
}

/// Which recorded read-write grant, to mark it released.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
pub struct RwGrantId(usize);

/// Two grants, by different tokens and at least one of them a write, whose windows
/// overlap: a broken exclusion.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct RwViolation {
    /// The grant whose window started first.
    pub first: RwGrant,
    /// The grant that started while `first` still held.
    pub second: RwGrant,
    /// How long both held at once.
    pub overlap: Duration,
}

impl fmt::Display for RwViolation {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        let (a, b) = (&self.first, &self.second);
        write!(
            f,
            "client {} ({} token {}) and client {} ({} token {}) both held the lock for {}",
            a.grant.client,
            a.mode,
            a.grant.token,
            b.grant.client,
            b.mode,
            b.grant.token,
            humantime::format_duration(self.overlap)
        )
    }
}

/// The read and write grants of a test, recorded by its clients. Clones share the record.
#[derive(Clone, Default, Debug)]
pub struct RwHistory {
    grants: Arc<Mutex<Vec<RwGrant>>>,
}

impl RwHistory {
    /// An empty history.
    pub fn new() -> Self {
        Self::default()
    }

    /// Records a grant; the id marks it released later.
    pub fn record(&self, mode: RwMode, grant: Grant) -> RwGrantId {
        let mut grants = self.lock();
        grants.push(RwGrant { mode, grant });
        RwGrantId(grants.len() - 1)
    }

    /// Marks grant `id` released at `at` (take it *before* calling release). Panics if `id`
    /// is not from this history.
    pub fn released(&self, id: RwGrantId, at: Instant) {
        self.lock()[id.0].grant.released_at = Some(at);
    }

    /// Every grant so far, in recording order.
    pub fn grants(&self) -> Vec<RwGrant> {
        self.lock().clone()
    }

    /// Number of grants.
    pub fn len(&self) -> usize {
        self.lock().len()
    }

    /// Whether no grant was recorded.
    pub fn is_empty(&self) -> bool {
        self.lock().is_empty()
    }

    /// Every pair of grants, by different tokens and at least one a write, whose windows
    /// overlap (windows that only touch do not; empty windows hold nothing).
    pub fn violations(&self) -> Vec<RwViolation> {
        self.overlaps(|a, b| a == RwMode::Write || b == RwMode::Write)
    }

    /// How many pairs of read grants overlapped: evidence that readers did share.
    pub fn shared_reads(&self) -> usize {
        self.overlaps(|a, b| a == RwMode::Read && b == RwMode::Read).len()
    }

    fn overlaps(&self, counts: impl Fn(RwMode, RwMode) -> bool) -> Vec<RwViolation> {
        let mut grants = self.grants();
        grants.retain(|g| g.grant.start() < g.grant.end());
        grants.sort_by_key(|g| g.grant.start());
        let mut found = Vec::new();
        for (i, first) in grants.iter().enumerate() {
            // Sorted by start, windows non-empty: every later grant that starts before
            // `first` ends overlaps it; the first one that doesn't ends the scan.
            let end = first.grant.end();
            for second in grants[i + 1..].iter().take_while(|g| g.grant.start() < end) {
                if second.grant.token == first.grant.token || !counts(first.mode, second.mode) {
                    continue;
                }
                found.push(RwViolation {
                    first: first.clone(),
                    second: second.clone(),
                    overlap: end.min(second.grant.end()) - second.grant.start(),
                });
            }
        }
        found
    }

    fn lock(&self) -> MutexGuard<'_, Vec<RwGrant>> {
        // A poisoned lock only means a client panicked; the grants are still valid.
        self.grants.lock().unwrap_or_else(PoisonError::into_inner)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn ms(n: u64) -> Duration {
        Duration::from_millis(n)
    }

    fn grant(t0: Instant, client: usize, token: &str, from: u64, until: u64) -> Grant {
        Grant::new(client, token, t0 + ms(from), t0 + ms(until))
    }

    #[test]
    fn overlapping_reads_are_fine_and_counted() {
        let t0 = Instant::now();
        let history = RwHistory::new();
        history.record(RwMode::Read, grant(t0, 0, "a", 0, 100));
        history.record(RwMode::Read, grant(t0, 1, "b", 50, 150));
        history.record(RwMode::Read, grant(t0, 2, "c", 60, 70));
        assert!(history.violations().is_empty());
        assert_eq!(history.shared_reads(), 3);
    }

    #[test]
    fn a_write_overlapping_a_read_or_a_write_is_reported() {
        let t0 = Instant::now();
        let history = RwHistory::new();
        history.record(RwMode::Read, grant(t0, 0, "r1", 0, 100));
        history.record(RwMode::Read, grant(t0, 1, "r2", 20, 60));
        history.record(RwMode::Write, grant(t0, 2, "w1", 90, 200)); // overlaps r1 by 10
        history.record(RwMode::Write, grant(t0, 3, "w2", 150, 300)); // overlaps w1 by 50
        history.record(RwMode::Read, grant(t0, 4, "r3", 300, 400)); // touches w2 only
        let mut found: Vec<_> = history
            .violations()
            .into_iter()
            .map(|v| (v.first.grant.token, v.second.grant.token, v.overlap))
            .collect();
        found.sort();
        assert_eq!(found, [("r1".into(), "w1".into(), ms(10)), ("w1".into(), "w2".into(), ms(50))]);
        assert_eq!(history.shared_reads(), 1);
    }

    #[test]
    fn a_release_ends_the_window_and_one_token_never_conflicts_with_itself() {
        let t0 = Instant::now();
        let history = RwHistory::new();
        let w = history.record(RwMode::Write, grant(t0, 0, "w", 0, 1000));
        history.record(RwMode::Write, grant(t0, 0, "w", 500, 1500)); // the same lock, extended
        history.released(w, t0 + ms(100));
        history.record(RwMode::Read, grant(t0, 1, "r1", 100, 200)); // after the release
        history.record(RwMode::Read, grant(t0, 2, "r2", 600, 700)); // inside the extension
        let violations = history.violations();
        assert_eq!(violations.len(), 1, "{violations:?}");
        let v = &violations[0];
        assert_eq!((v.first.grant.token.as_str(), v.second.grant.token.as_str()), ("w", "r2"));
        assert!(v.to_string().contains("client 2 (read token r2)"), "{v}");
    }
}
