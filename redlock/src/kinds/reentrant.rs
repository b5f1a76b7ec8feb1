//! The reentrant lock: one owner (a job or request id, not a thread) may hold the lock
//! several times at once; every acquisition is its own guard.
//!
//! # Layout on each node
//! One hash per lock: field = owner id, value = that owner's hold count. Acquire
//! (`reentrant_acquire.lua`) succeeds when the key is absent or has the owner's field:
//! `HINCRBY +1`, and the key's lease is raised to the new hold's if it was shorter (never
//! shortened: the owner's other holds count on theirs). Release (`reentrant_release.lua`)
//! decrements, deletes the field at zero or below and the key with its last field. Extend
//! (`reentrant_extend.lua`) raises the lease only if the owner's field exists. Release and
//! extend by an owner without a field touch nothing. A key of another type (a plain
//! [`Lock`](crate::Lock) is a string) raises `WRONGTYPE`: the two kinds exclude each other,
//! each seeing the other's key as an error rather than as a lock.
//!
//! # Counts that disagree between nodes
//! Unlike a per-attempt token, a count cannot tell our increment from another hold's, so a
//! decrement on a node where our increment never landed would remove another hold's, and a
//! node could drop the key while holds remain: the unsafe direction. A count that is too
//! high only keeps the key until its lease ends: the direction a failed release always had.
//! The rules keep every error in the safe direction, barring lost data:
//!
//! 1. **A hold is counted only from the nodes that answered yes.** Each guard remembers, per
//!    node, its acquisition request (shared, awaited if still in flight). Release and
//!    extend go only to the nodes where that request answered yes (or was written during
//!    restart quarantine); elsewhere they are not sent and the node reports
//!    [`NodeOutcome::Absent`](crate::NodeOutcome::Absent). So on every node the count is
//!    at least the number of live holds that landed there, and a decrement never takes
//!    another hold's increment.
//! 2. **An increment that timed out may or may not have landed.** It is not counted and
//!    never decremented. If it landed (a slow node that answers late), that node's count
//!    stays one too high: after the owner's last release the key stays on that node alone
//!    until its lease ends (at most the longest lease of the owner's holds and
//!    extensions), refusing other owners there: a minority, so others still get a quorum.
//! 3. **Extend counts only where the hold landed.** A yes from a node where only the
//!    owner's other holds are counted could vanish with their release; counting it would
//!    let a hold believe in a quorum it does not have.
//! 4. **A node that lost the key** (restarted empty, expired early) answers release and
//!    extend with "absent" and is never set again by them. An acquisition that finds the
//!    key absent restores the owner's field there with a count of one (its own hold). That
//!    node's count is then lower than the owner's live holds, and an older hold's release
//!    can delete the key there while newer holds remain: the node forgets the lock, exactly
//!    as it forgot the plain lock it lost. Within the model (nodes keep their keys, or sit
//!    out a [restart quarantine](crate::RedlockBuilder::restart_quarantine)) this cannot
//!    happen on a majority, so every valid hold keeps its quorum.
//! 5. **A release that brings a count to zero or below removes the field**, and the key
//!    with its last field; an acquisition that finds a count of zero or below (edited by
//!    hand) sets it to one.
//!
//! Each hold's validity is `ttl - elapsed - drift` from its own round's start, as for the
//! plain lock: every node that answered yes keeps the key at least that long, because no
//! script ever shortens its lease and no decrement takes this hold's count.

use std::fmt;
use std::sync::Arc;
use std::time::{Duration, Instant};

use super::{Held, Label, Protocol};
use crate::builder::check_ttl;
use crate::error::{Error, NodeOutcome, Result};
use crate::node::Node;
use crate::notify;
use crate::protocol::{script_outcome, unexpected, vote};
use crate::redlock::Redlock;
use crate::script;

const KIND: &str = "reentrant";

/// The per-node protocol of one owner's holds on one key.
pub(crate) struct Reentrant {
    key: Arc<str>,
    owner: Arc<str>,
    /// Where the owner's last release is published, for waiters of `Redlock::lock*`.
    channel: Arc<str>,
}

impl Protocol for Reentrant {
    const PER_HOLD: bool = true;

    async fn acquire(&self, node: Arc<Node>, ttl_ms: u64) -> NodeOutcome {
        let ttl = ttl_ms.to_string();
        let reply = node
            .eval(
                &script::REENTRANT_ACQUIRE,
                &[&self.key],
                &[self.owner.as_bytes(), ttl.as_bytes()],
            )
            .await;
        match reply {
            Ok(redis::Value::Int(count)) if count >= 1 => vote(&node),
            Ok(redis::Value::Int(-1)) => NodeOutcome::Held,
            Ok(other) => unexpected(&other),
            Err(failure) => failure.into_outcome(),
        }
    }

    async fn release(&self, node: Arc<Node>) -> NodeOutcome {
        let args: [&[u8]; 2] = [self.owner.as_bytes(), self.channel.as_bytes()];
        script_outcome(node.eval(&script::REENTRANT_RELEASE, &[&self.key], &args).await)
    }

    async fn extend(&self, node: Arc<Node>, ttl_ms: u64) -> NodeOutcome {
        let ttl = ttl_ms.to_string();
        let reply = node
            .eval(&script::REENTRANT_EXTEND, &[&self.key], &[self.owner.as_bytes(), ttl.as_bytes()])
            .await;
        match script_outcome(reply) {
            NodeOutcome::Ok => vote(&node),
            other => other,
        }
    }
}

impl Redlock {
    /// One attempt to take a hold on `resource` for `owner`, for the default TTL.
    ///
    /// `owner` names who holds the lock: a job or request id, chosen by the caller and the
    /// same for every hold that may nest (never a thread id: async tasks move between
    /// threads). It succeeds when the resource is free or already held by `owner`; every
    /// success is a separate [`ReentrantLock`], and the lock stays held until the last of
    /// them is released or expires.
    ///
    /// Fails like [`try_lock`](Redlock::try_lock): [`ErrorKind::NotAcquired`] when another
    /// owner holds it, [`ErrorKind::Unavailable`], [`ErrorKind::Expired`],
    /// [`ErrorKind::WrongType`] when the key is not a reentrant lock (a plain
    /// [`Lock`](crate::Lock)'s key included), and [`ErrorKind::Config`] for an empty
    /// resource or owner. A failed attempt takes back whatever it added.
    ///
    /// [`ErrorKind::NotAcquired`]: crate::ErrorKind::NotAcquired
    /// [`ErrorKind::Unavailable`]: crate::ErrorKind::Unavailable
    /// [`ErrorKind::Expired`]: crate::ErrorKind::Expired
    /// [`ErrorKind::WrongType`]: crate::ErrorKind::WrongType
    /// [`ErrorKind::Config`]: crate::ErrorKind::Config
    pub async fn try_lock_reentrant(&self, resource: &str, owner: &str) -> Result<ReentrantLock> {
        self.try_lock_reentrant_for(resource, owner, self.ttl()).await
    }

    /// One attempt to take a hold on `resource` for `owner`, for `ttl`.
    pub async fn try_lock_reentrant_for(
        &self,
        resource: &str,
        owner: &str,
        ttl: Duration,
    ) -> Result<ReentrantLock> {
        let (proto, ttl_ms) = self.reentrant(resource, owner, ttl)?;
        ReentrantLock::attempt(self, resource, proto, ttl_ms).await
    }

    /// Takes a hold on `resource` for `owner` for the default TTL, retrying per the
    /// [`Retry`](crate::Retry) policy, like [`lock`](Redlock::lock): cancellation-safe, and
    /// woken between attempts when the holder's last hold is released.
    pub async fn lock_reentrant(&self, resource: &str, owner: &str) -> Result<ReentrantLock> {
        self.lock_reentrant_for(resource, owner, self.ttl()).await
    }

    /// Takes a hold on `resource` for `owner` for `ttl`, retrying per the
    /// [`Retry`](crate::Retry) policy.
    pub async fn lock_reentrant_for(
        &self,
        resource: &str,
        owner: &str,
        ttl: Duration,
    ) -> Result<ReentrantLock> {
        let (proto, ttl_ms) = self.reentrant(resource, owner, ttl)?;
        // Woken when the holder's last hold goes, like `lock()`.
        let key = proto.key.clone();
        self.retrying(&key, || ReentrantLock::attempt(self, resource, proto.clone(), ttl_ms)).await
    }

    fn reentrant(
        &self,
        resource: &str,
        owner: &str,
        ttl: Duration,
    ) -> Result<(Arc<Reentrant>, u64)> {
        let ttl_ms = check_ttl(ttl, self.inner().config.drift_factor)?;
        let key = self.inner().key(resource)?;
        if owner.is_empty() {
            return Err(Error::config("the owner id is empty"));
        }
        let channel = notify::channel(&key);
        Ok((Arc::new(Reentrant { key, owner: owner.into(), channel }), ttl_ms))
    }
}

/// One hold of a reentrant lock, valid until [`validity()`](ReentrantLock::validity) reaches
/// zero.
///
/// The nodes keep one hash per lock with the owner's hold count; each `ReentrantLock` is
/// one of those holds, with its own lease and validity (timed from its own acquisition).
/// Releasing it takes one hold away; the key goes with the owner's last hold. Dropped
/// without [`release()`](ReentrantLock::release), the hold is released in the background on
/// the Tokio runtime (never blocking in `Drop`); dropped outside a runtime, it is left to
/// expire with the key's lease.
///
/// # Counts after faults
/// A hold counts, and is later released and extended, only on the nodes that granted it.
/// An increment that timed out may still land on a slow node; it is never taken back, so
/// after the owner's last release that node alone keeps the key until its lease ends (the
/// longest lease of the owner's holds). A node that restarted empty gets the owner's field
/// back from the next acquisition, with that one hold. No release ever removes another
/// owner's field or another hold's count from a node where this hold did not land.
///
/// `ReentrantLock` owns everything it needs (`Send + 'static`), so it can move into a
/// spawned task.
#[must_use = "dropping a ReentrantLock releases its hold at once, in the background"]
pub struct ReentrantLock {
    held: Held<Reentrant>,
    resource_len: usize,
}

impl fmt::Debug for ReentrantLock {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("ReentrantLock")
            .field("resource", &self.resource())
            .field("owner", &self.owner())
            .field("validity", &self.validity())
            .finish()
    }
}

impl ReentrantLock {
    async fn attempt(
        rl: &Redlock,
        resource: &str,
        proto: Arc<Reentrant>,
        ttl_ms: u64,
    ) -> Result<Self> {
        let label = Label { kind: KIND, resource };
        let held = super::attempt(rl.inner(), proto, ttl_ms, label).await?;
        Ok(Self { held, resource_len: resource.len() })
    }

    /// The resource name, as passed to the lock call.
    pub fn resource(&self) -> &str {
        let key = &*self.held.proto().key;
        &key[key.len() - self.resource_len..]
    }

    /// The Redis key (the resource name behind the configured prefix): a hash whose field
    /// [`owner()`](ReentrantLock::owner) holds the owner's hold count.
    pub fn key(&self) -> &str {
        &self.held.proto().key
    }

    /// The owner id this hold was taken for.
    pub fn owner(&self) -> &str {
        &self.held.proto().owner
    }

    /// What remains of this hold's lease, counting down; [`Duration::ZERO`] once it is over.
    ///
    /// Each hold has its own: the owner's other holds neither lengthen nor shorten it.
    pub fn validity(&self) -> Duration {
        self.held.validity()
    }

    /// The instant at which the validity ends.
    pub fn deadline(&self) -> Instant {
        self.held.deadline()
    }

    /// Whether the validity has not run out yet.
    pub fn is_valid(&self) -> bool {
        self.held.is_valid()
    }

    /// Renews the lease to `ttl` from now on the nodes that granted this hold, where the
    /// owner's field still exists (the key's lease is raised, never shortened, since the
    /// owner's other holds count on theirs).
    ///
    /// Succeeds only with a quorum, while the hold is still valid; the new validity is
    /// timed from the start of this call. A failed extension deletes nothing and keeps the
    /// current validity; a node that lost the key is not set again. Errors as
    /// [`Lock::extend`](crate::Lock::extend).
    pub async fn extend(&mut self, ttl: Duration) -> Result<()> {
        let resource = self.resource().to_owned();
        self.held.extend(ttl, Label { kind: KIND, resource: &resource }).await
    }

    /// Releases this hold (one decrement of the owner's count on every node that granted
    /// it), never touching another owner's field.
    ///
    /// Results as [`Lock::release`](crate::Lock::release): `Ok` means the hold was valid
    /// until this call, [`ErrorKind::NotHeld`](crate::ErrorKind::NotHeld) that its lease
    /// had run out or the owner's field is gone from too many nodes,
    /// [`ErrorKind::Unavailable`](crate::ErrorKind::Unavailable) that too few nodes
    /// answered.
    pub async fn release(self) -> Result<()> {
        let resource = self.resource().to_owned();
        let label = Label { kind: KIND, resource: &resource };
        self.held.release(label).await
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_reentrant_lock_can_move_across_tasks() {
        fn send_static<T: Send + 'static>() {}
        send_static::<ReentrantLock>();
    }
}
