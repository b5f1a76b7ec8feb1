//! A held lock: its validity, extension and release.

use std::fmt;
use std::sync::Arc;
use std::time::{Duration, Instant};

use crate::builder::check_ttl;
use crate::error::{Error, ErrorKind, Result};
use crate::fanout::InFlight;
use crate::quorum::Decision;
use crate::redlock::Inner;

/// A key and token that may be set on some nodes, released in the background if dropped
/// while armed. It guards an attempt in progress and then the lock it becomes.
pub(crate) struct Claim {
    inner: Arc<Inner>,
    key: Arc<str>,
    token: Arc<str>,
    /// Per node, the acquisition `SET` still in flight there, if any.
    in_flight: Vec<Option<InFlight>>,
    armed: bool,
}

impl Claim {
    pub(crate) fn new(inner: Arc<Inner>, key: Arc<str>, token: Arc<str>) -> Self {
        Self { inner, key, token, in_flight: Vec::new(), armed: true }
    }

    /// Remembers the `SET`s still in flight, so that releases wait for them.
    pub(crate) fn track(&mut self, in_flight: Vec<Option<InFlight>>) {
        self.in_flight = in_flight;
    }

    pub(crate) fn key(&self) -> &Arc<str> {
        &self.key
    }

    pub(crate) fn token(&self) -> &Arc<str> {
        &self.token
    }

    /// The acquisition request still in flight on node `i`, if any.
    pub(crate) fn in_flight(&self, i: usize) -> Option<InFlight> {
        self.in_flight.get(i).cloned().flatten()
    }

    /// Hands the key, token and in-flight `SET`s over to the caller, who releases them.
    pub(crate) fn disarm(mut self) -> (Arc<str>, Arc<str>, Vec<Option<InFlight>>) {
        self.armed = false;
        (self.key.clone(), self.token.clone(), std::mem::take(&mut self.in_flight))
    }
}

impl Drop for Claim {
    fn drop(&mut self) {
        if !self.armed {
            return;
        }
        // Never block here: the release runs as tasks on the runtime, or not at all.
        if tokio::runtime::Handle::try_current().is_ok() {
            let in_flight = std::mem::take(&mut self.in_flight);
            self.inner.release_detached(&self.key, &self.token, in_flight);
        } else {
            tracing::warn!(
                target: "redlock",
                key = &*self.key,
                "lock dropped outside a Tokio runtime: its key is left to expire"
            );
        }
    }
}

/// A lock held on a quorum of nodes, valid until [`validity()`](Lock::validity) reaches
/// zero.
///
/// Call [`release()`](Lock::release) when done: it reports whether the lock was still held.
/// A `Lock` dropped without `release()` is released in the background on the Tokio
/// runtime (never blocking in `Drop`); dropped outside a runtime, its key is left to expire.
///
/// `Lock` owns everything it needs (`Send + 'static`), so it can move into a spawned task.
#[must_use = "dropping a Lock releases it at once, in the background"]
pub struct Lock {
    claim: Claim,
    resource_len: usize,
    deadline: Instant,
    lease: Duration,
    fence: Option<u64>,
}

impl fmt::Debug for Lock {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("Lock")
            .field("resource", &self.resource())
            .field("token", &self.token())
            .field("validity", &self.validity())
            .finish()
    }
}

impl Lock {
    pub(crate) fn new(
        claim: Claim,
        resource_len: usize,
        deadline: Instant,
        lease: Duration,
    ) -> Self {
        Self { claim, resource_len, deadline, lease, fence: None }
    }

    pub(crate) fn with_fence(mut self, fence: u64) -> Self {
        self.fence = Some(fence);
        self
    }

    /// The resource name, as passed to the lock call.
    pub fn resource(&self) -> &str {
        let key = &*self.claim.key;
        &key[key.len() - self.resource_len..]
    }

    /// The Redis key (the resource name behind the configured prefix).
    pub fn key(&self) -> &str {
        &self.claim.key
    }

    /// The random token stored as the key's value on the nodes: `redis-cli GET key` shows
    /// it while the lock is held.
    pub fn token(&self) -> &str {
        &self.claim.token
    }

    /// What remains of the lease, counting down; [`Duration::ZERO`] once it is over.
    ///
    /// This is the only safe measure of ownership: work that must not overlap another
    /// holder's has to finish (or be fenced) before it reaches zero.
    pub fn validity(&self) -> Duration {
        self.deadline.saturating_duration_since(Instant::now())
    }

    /// The instant at which the validity ends.
    pub fn deadline(&self) -> Instant {
        self.deadline
    }

    /// The fencing token of a lock taken with
    /// [`try_lock_fenced`](crate::Redlock::try_lock_fenced) or
    /// [`lock_fenced`](crate::Redlock::lock_fenced); `None` otherwise.
    pub fn fencing_token(&self) -> Option<u64> {
        self.fence
    }

    /// The lease of the last grant or extension, as sent to Redis.
    pub fn ttl(&self) -> Duration {
        self.lease
    }

    /// Whether the validity has not run out yet.
    pub fn is_valid(&self) -> bool {
        Instant::now() < self.deadline
    }

    /// Asks the nodes whether a quorum still holds this lock's token: `Ok(true)` if so,
    /// `Ok(false)` if too many no longer do, [`ErrorKind::Unavailable`] if too few answered.
    ///
    /// Advisory only: the answer is stale once it arrives, and a key can outlive its lease
    /// on a node whose clock runs slow. Only [`validity()`](Lock::validity) is safe to act
    /// on; use this to detect a lock lost early (a node restarted empty, a key deleted by
    /// hand), not to decide that a lock is still safe to use.
    pub async fn is_held(&self) -> Result<bool> {
        let inner = &self.claim.inner;
        let round = inner.check(&self.claim.key, &self.claim.token).await;
        match round.decision {
            Decision::Reached => Ok(true),
            Decision::Failed => match inner.lost_error(self.resource(), "check", &round) {
                err if err.kind() == ErrorKind::NotHeld => Ok(false),
                err => Err(err),
            },
        }
    }

    /// Renews the lease to `ttl` from now on every node that still holds our token.
    ///
    /// Succeeds only with a quorum, while the lock is still valid; the new validity is
    /// `ttl - elapsed - drift`, timed from the start of this call. A node that lost the key
    /// (expired early, restarted empty) gets it back if nobody else took it, but does not
    /// count toward the quorum. A failed extension deletes nothing and leaves the current
    /// validity as it was. Errors: [`ErrorKind::NotHeld`] when the validity is over or the
    /// token is gone from too many nodes, [`ErrorKind::Unavailable`] when too few nodes
    /// answered, [`ErrorKind::Expired`] when the round used up the new lease.
    pub async fn extend(&mut self, ttl: Duration) -> Result<()> {
        let ttl_ms = check_ttl(ttl, self.claim.inner.config.drift_factor)?;
        if !self.is_valid() {
            return Err(Error::local(
                ErrorKind::NotHeld,
                "validity is over: not extending",
                self.resource(),
            ));
        }
        let inner = self.claim.inner.clone();
        // Cloned, not taken: if this future is dropped mid-round, releases still wait for
        // the SETs that were in flight before it.
        let previous = self.claim.in_flight.clone();
        let (round, validity, in_flight) =
            inner.extend(&self.claim.key, &self.claim.token, ttl_ms, previous).await;
        self.claim.track(in_flight);
        if round.decided_at >= self.deadline {
            // The lease ran out while we asked: another client may already hold the lock.
            return Err(Error::round(
                ErrorKind::NotHeld,
                "validity ran out during the extension",
                self.resource(),
                round.report(&inner.nodes),
            ));
        }
        match (round.decision, validity) {
            (Decision::Reached, Some(validity)) => {
                self.deadline = round.decided_at + validity;
                self.lease = Duration::from_millis(ttl_ms);
                Ok(())
            }
            (Decision::Reached, None) => Err(Error::round(
                ErrorKind::Expired,
                "the extension took the whole new lease",
                self.resource(),
                round.report(&inner.nodes),
            )),
            (Decision::Failed, _) => Err(inner.lost_error(self.resource(), "extend", &round)),
        }
    }

    /// Releases the lock on every node where it still holds our token, never touching
    /// another owner's key.
    ///
    /// Returns once a quorum confirmed (nodes still to answer get the release in the
    /// background). `Ok` means the lock was held until this call; [`ErrorKind::NotHeld`]
    /// means the lease had run out (locally, or on too many nodes) before the release,
    /// so the critical section may have overlapped another holder's;
    /// [`ErrorKind::Unavailable`] means too few nodes answered. Keys that remain expire
    /// with their lease either way.
    pub async fn release(self) -> Result<()> {
        let was_valid = self.is_valid();
        let inner = self.claim.inner.clone();
        let in_flight = self.claim.in_flight.clone();
        let round = inner.release(&self.claim.key, &self.claim.token, in_flight).await;
        let resource = self.resource().to_owned();
        // Only now: if this future is dropped mid-round, Drop releases again.
        let _ = self.into_claim().disarm();
        match round.decision {
            Decision::Reached if was_valid => Ok(()),
            Decision::Reached => Err(Error::round(
                ErrorKind::NotHeld,
                "the validity had run out before the release",
                &resource,
                round.report(&inner.nodes),
            )),
            Decision::Failed => Err(inner.lost_error(&resource, "release", &round)),
        }
    }

    fn into_claim(self) -> Claim {
        self.claim
    }
}
