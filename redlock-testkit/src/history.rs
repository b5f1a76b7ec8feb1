//! The exclusion checker: the grants clients saw, and which of them overlapped.
//!
//! # Which window a grant holds
//!
//! A grant holds the lock from `granted_at`, when the lock was returned to the
//! client, until `valid_until`, the validity deadline the library reported,
//! or until `released_at` if it was released earlier.
//!
//! The start is when the grant was *returned*, not when the attempt started:
//! a client cannot rely on the lock before it has it, and the attempt of a
//! grant that follows a release or an expiry typically started while the
//! previous holder still held the lock (it retried meanwhile). Starting
//! windows at the attempt would report those as violations although no two
//! clients ever believed they held the lock at once. With the returned time,
//! every reported overlap is a real one: both clients held a lock they were
//! told was valid, at the same instant.
//!
//! All instants come from [`Instant`], so all clients must run in the one
//! process that checks (as tasks or threads of the test).

use std::{
    fmt,
    sync::{Arc, Mutex, MutexGuard, PoisonError},
    time::{Duration, Instant},
};

/// One grant as a client saw it, in monotonic time.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Grant {
    /// Which client got it (any numbering the test likes).
    pub client: usize,
    /// The lock's token (its random value): grants with the same token are
    /// one lock (e.g. extended), never compared with each other.
    pub token: String,
    /// When the lock was returned to the client: the start of its window.
    pub granted_at: Instant,
    /// The validity deadline the library reported, e.g. `Instant::now() +
    /// lock.validity()` taken right when the lock was returned.
    pub valid_until: Instant,
    /// When the client released it, if it did before `valid_until`. Take it
    /// *before* calling release: the lock may be taken by others as soon as
    /// the release reaches the nodes.
    pub released_at: Option<Instant>,
}

impl Grant {
    /// A grant, not (yet) released.
    pub fn new(
        client: usize,
        token: impl Into<String>,
        granted_at: Instant,
        valid_until: Instant,
    ) -> Grant {
        Grant { client, token: token.into(), granted_at, valid_until, released_at: None }
    }

    /// Start of the window the grant holds: `granted_at`.
    pub fn start(&self) -> Instant {
        self.granted_at
    }

    /// End of the window the grant holds: `valid_until`, or `released_at` if earlier.
    pub fn end(&self) -> Instant {
        self.released_at.map_or(self.valid_until, |released| released.min(self.valid_until))
    }
}

/// Which recorded grant, to mark it released.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
pub struct GrantId(usize);

/// Two grants, by different tokens, whose windows overlap: a broken exclusion.
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
            "client {} (token {}) and client {} (token {}) both held the lock for {}",
            self.first.client,
            self.first.token,
            self.second.client,
            self.second.token,
            humantime::format_duration(self.overlap)
        )
    }
}

/// The grants of a test, recorded by its clients. Clones share the record,
/// so every client task can have one.
#[derive(Clone, Default, Debug)]
pub struct History {
    grants: Arc<Mutex<Vec<Grant>>>,
}

impl History {
    /// An empty history.
    pub fn new() -> Self {
        Self::default()
    }

    /// Records a grant; the id marks it released later.
    pub fn record(&self, grant: Grant) -> GrantId {
        let mut grants = self.lock();
        grants.push(grant);
        GrantId(grants.len() - 1)
    }

    /// Marks grant `id` released at `at`. Panics if `id` is not from this history.
    pub fn released(&self, id: GrantId, at: Instant) {
        self.lock()[id.0].released_at = Some(at);
    }

    /// Every grant so far, in recording order.
    pub fn grants(&self) -> Vec<Grant> {
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

    /// Every pair of grants, by different tokens, whose windows overlap
    /// (`a.start < b.end && b.start < a.end`: windows that only touch do
    /// not). Empty windows (released or expired at once) hold nothing.
    ///
    /// Sorts by start then sweeps: O(n log n + pairs found).
    pub fn violations(&self) -> Vec<Violation> {
        let mut grants: Vec<Grant> = self.grants();
        grants.retain(|g| g.start() < g.end());
        grants.sort_by_key(Grant::start);
        let mut violations = Vec::new();
        for (i, first) in grants.iter().enumerate() {
            // Sorted by start, and every window is non-empty: each later grant
            // that starts before `first` ends overlaps it; the first one that
            // doesn't ends the scan.
            for second in grants[i + 1..].iter().take_while(|g| g.start() < first.end()) {
                if second.token == first.token {
                    continue;
                }
                violations.push(Violation {
                    first: first.clone(),
                    second: second.clone(),
                    overlap: first.end().min(second.end()) - second.start(),
                });
            }
        }
        violations
    }

    fn lock(&self) -> MutexGuard<'_, Vec<Grant>> {
        // A poisoned lock only means a client panicked; the grants are still valid.
        self.grants.lock().unwrap_or_else(PoisonError::into_inner)
    }
}
