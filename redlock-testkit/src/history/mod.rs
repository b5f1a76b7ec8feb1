//! The history checker: the grants clients saw, and which of them broke exclusion, a
//! limit on holders at once, or fencing order.
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
//! # Exclusive and shared grants
//!
//! A plain lock's grant, or a write lock's, is [`Mode::Exclusive`]: it may overlap no
//! other grant. A read lock's share is [`Mode::Shared`]: it may overlap other shared
//! grants, never an exclusive one. Grants with the same token are one lock (e.g.
//! recorded again after an extension) and are never compared with each other.
//!
//! # Counted holders
//!
//! A counting lock's permit (a semaphore of L permits) is [`Mode::Counted`]: permits may
//! overlap each other, never an exclusive grant, and at most L may hold at any instant.
//! [`History::over_limit`] finds the stretches of time with more than L holders; with L = 1
//! it flags exactly the histories in which exclusion broke.
//!
//! # Fencing tokens
//!
//! A grant may carry the fencing token the library handed out with it. Whatever the
//! clocks say about overlaps, a grant that started after another one ended must carry
//! a larger token, or a storage that checks tokens would take the older holder's
//! writes over the newer one's: see [`History::fencing_violations`].
//!
//! All instants come from [`Instant`], so all clients must run in the one
//! process that checks (as tasks or threads of the test).

mod exclusion;
mod fencing;
mod limit;

use std::{
    fmt,
    sync::{Arc, Mutex, MutexGuard, PoisonError},
    time::Instant,
};

pub use exclusion::Violation;
pub use fencing::FencingViolation;
pub use limit::LimitViolation;

/// Whether a grant excludes every other one, or only exclusive ones.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq, Hash)]
pub enum Mode {
    /// A plain or write lock: may overlap no grant of another token.
    #[default]
    Exclusive,
    /// A read lock's share: may overlap other shared grants, not an exclusive one.
    Shared,
    /// A counting lock's permit: may overlap other permits, not an exclusive grant; how
    /// many may hold at once is checked by [`History::over_limit`].
    Counted,
}

impl fmt::Display for Mode {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(match self {
            Mode::Exclusive => "exclusive",
            Mode::Shared => "shared",
            Mode::Counted => "counted",
        })
    }
}

/// One grant as a client saw it, in monotonic time.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Grant {
    /// Which client got it (any numbering the test likes).
    pub client: usize,
    /// The lock's token (its random value): grants with the same token are
    /// one lock (e.g. extended), never compared with each other.
    pub token: String,
    /// Exclusive (plain and write locks) or shared (read locks).
    pub mode: Mode,
    /// The fencing token handed out with the grant, if the lock is fenced.
    pub fence: Option<u64>,
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
    /// An exclusive grant (a plain or write lock), not (yet) released, without a fencing token.
    pub fn new(
        client: usize,
        token: impl Into<String>,
        granted_at: Instant,
        valid_until: Instant,
    ) -> Grant {
        Grant {
            client,
            token: token.into(),
            mode: Mode::Exclusive,
            fence: None,
            granted_at,
            valid_until,
            released_at: None,
        }
    }

    /// A shared grant (a read lock's share), not (yet) released, without a fencing token.
    pub fn shared(
        client: usize,
        token: impl Into<String>,
        granted_at: Instant,
        valid_until: Instant,
    ) -> Grant {
        Grant { mode: Mode::Shared, ..Grant::new(client, token, granted_at, valid_until) }
    }

    /// A counted grant (a counting lock's permit), not (yet) released, without a fencing
    /// token.
    pub fn permit(
        client: usize,
        token: impl Into<String>,
        granted_at: Instant,
        valid_until: Instant,
    ) -> Grant {
        Grant { mode: Mode::Counted, ..Grant::new(client, token, granted_at, valid_until) }
    }

    /// The same grant carrying the fencing token `fence`.
    #[must_use]
    pub fn with_fence(mut self, fence: u64) -> Grant {
        self.fence = Some(fence);
        self
    }

    /// Start of the window the grant holds: `granted_at`.
    pub fn start(&self) -> Instant {
        self.granted_at
    }

    /// End of the window the grant holds: `valid_until`, or `released_at` if earlier.
    pub fn end(&self) -> Instant {
        self.released_at.map_or(self.valid_until, |released| released.min(self.valid_until))
    }

    /// Whether the window holds anything: a grant released or expired at once does not.
    fn holds(&self) -> bool {
        self.start() < self.end()
    }
}

/// How a grant names itself in messages: `client 1 (token a)`, `client 2 (shared token r)`,
/// `client 3 (permit token p)`.
struct Who<'a>(&'a Grant);

impl fmt::Display for Who<'_> {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        let grant = self.0;
        let mode = match grant.mode {
            Mode::Exclusive => "",
            Mode::Shared => "shared ",
            Mode::Counted => "permit ",
        };
        write!(f, "client {} ({mode}token {}", grant.client, grant.token)?;
        if let Some(fence) = grant.fence {
            write!(f, ", fence {fence}")?;
        }
        f.write_str(")")
    }
}

/// Which recorded grant, to mark it released.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
pub struct GrantId(usize);

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

    /// Marks grant `id` released at `at`.
    ///
    /// # Panics
    /// When `id` is not from this history.
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

    /// Every pair of grants, by different tokens and at least one of them exclusive,
    /// whose windows overlap (`a.start < b.end && b.start < a.end`: windows that only
    /// touch do not). Empty windows (released or expired at once) hold nothing.
    ///
    /// Sorts by start then sweeps: O(n log n + pairs compared).
    pub fn violations(&self) -> Vec<Violation> {
        exclusion::overlaps(&self.grants(), |a, b| a == Mode::Exclusive || b == Mode::Exclusive)
    }

    /// How many pairs of grants that may overlap, by different tokens, overlapped: two read
    /// shares, or two permits. Evidence that readers (or permit holders) did share, so that
    /// a test of shared locks or counting locks cannot pass by serializing them.
    pub fn shared_overlaps(&self) -> usize {
        exclusion::overlaps(&self.grants(), |a, b| a == b && a != Mode::Exclusive).len()
    }

    /// Every stretch of time during which more than `limit` grants, by different tokens,
    /// held at once: a counting lock of `limit` permits let one holder too many in.
    ///
    /// Every grant counts, whatever its mode (a history of one counting lock holds only
    /// [`Mode::Counted`] grants); grants with the same token are one holder; windows that
    /// only touch do not overlap, and empty ones hold nothing. Each stretch is reported
    /// once, with the most holders it saw at one instant and who they were. O(n log n) for
    /// the sweep, plus a snapshot of the holders whenever a stretch reaches a new peak.
    pub fn over_limit(&self, limit: usize) -> Vec<LimitViolation> {
        limit::over(&self.grants(), limit)
    }

    /// Grants whose fencing token is not larger than that of a grant, by another
    /// token, that ended before they started; see [`FencingViolation`].
    ///
    /// Only exclusive grants with a token take part. Each offending grant is reported
    /// once, against the earlier grant with the largest token. O(n log n).
    pub fn fencing_violations(&self) -> Vec<FencingViolation> {
        fencing::violations(&self.grants())
    }

    fn lock(&self) -> MutexGuard<'_, Vec<Grant>> {
        // A poisoned lock only means a client panicked; the grants are still valid.
        self.grants.lock().unwrap_or_else(PoisonError::into_inner)
    }
}
