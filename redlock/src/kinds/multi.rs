//! The multi-resource lock: several resources taken together, all or nothing.
//!
//! On each node one script (`multi_acquire.lua`) reads every key and, only if all are absent
//! (or already hold this attempt's token), sets them all to the token with the lease;
//! otherwise it sets none and reports "held". A node therefore either holds the whole set
//! for us or nothing of it, and the quorum is counted per node over the whole set: the set
//! is granted when a quorum of nodes granted all of it. Release (`multi_release.lua`) and
//! extend (`multi_extend.lua`) cover the set in one script per node, comparing the token key
//! by key, so another owner's key is never deleted or renewed. Every script reads all keys
//! before writing any, so a `WRONGTYPE` (a key that is not a plain lock) aborts it before
//! anything changed.
//!
//! Each key is an ordinary plain-lock key (a string holding the token), so a
//! [`Lock`](crate::Lock) on one of the resources and a [`MultiLock`] including it exclude
//! each other.

use std::collections::HashSet;
use std::fmt;
use std::sync::Arc;
use std::time::{Duration, Instant};

use redis::Value;

use super::{Held, Label, Protocol};
use crate::builder::check_ttl;
use crate::error::{Error, NodeOutcome, Result};
use crate::node::Node;
use crate::notify;
use crate::protocol::{script_outcome, unexpected, vote};
use crate::redlock::Redlock;
use crate::script;
use crate::token;

const KIND: &str = "multi";

/// The per-node protocol of one set of keys under one token.
pub(crate) struct Multi {
    keys: Box<[String]>,
    /// Per key, where its release is published, for waiters of `Redlock::lock*`.
    channels: Box<[Arc<str>]>,
    token: Arc<str>,
}

impl Multi {
    fn keys(&self) -> Vec<&str> {
        self.keys.iter().map(String::as_str).collect()
    }
}

impl Protocol for Multi {
    /// A token names one acquisition, so release and extend may go to every node.
    const PER_HOLD: bool = false;

    async fn acquire(&self, node: Arc<Node>, ttl_ms: u64) -> NodeOutcome {
        let ttl = ttl_ms.to_string();
        let reply = node
            .eval(&script::MULTI_ACQUIRE, &self.keys(), &[self.token.as_bytes(), ttl.as_bytes()])
            .await;
        match script_outcome(reply) {
            NodeOutcome::Ok => vote(&node),
            other => other,
        }
    }

    async fn release(&self, node: Arc<Node>) -> NodeOutcome {
        let mut args = vec![self.token.as_bytes()];
        args.extend(self.channels.iter().map(|c| c.as_bytes()));
        match node.eval(&script::MULTI_RELEASE, &self.keys(), &args).await {
            Ok(Value::Array(counts)) => match counts.as_slice() {
                [Value::Int(ours), Value::Int(foreign)] => {
                    if usize::try_from(*ours).is_ok_and(|ours| ours == self.keys.len()) {
                        NodeOutcome::Ok
                    } else if *foreign > 0 {
                        NodeOutcome::Held
                    } else {
                        // Some or all of our keys were gone: the set was no longer whole here.
                        NodeOutcome::Absent
                    }
                }
                _ => unexpected(&Value::Array(counts)),
            },
            Ok(other) => unexpected(&other),
            Err(failure) => failure.into_outcome(),
        }
    }

    async fn extend(&self, node: Arc<Node>, ttl_ms: u64) -> NodeOutcome {
        let ttl = ttl_ms.to_string();
        let reply = node
            .eval(&script::MULTI_EXTEND, &self.keys(), &[self.token.as_bytes(), ttl.as_bytes()])
            .await;
        match script_outcome(reply) {
            NodeOutcome::Ok => vote(&node),
            other => other,
        }
    }
}

impl Redlock {
    /// One attempt to lock every resource in `resources` together, for the default TTL:
    /// all of them or none.
    ///
    /// On each node, one script sets all the keys (each resource's key, with the client's
    /// key prefix, holding one fresh token) only if none is held; the set is granted when a
    /// quorum of nodes granted all of it. Taking several resources in one call, rather than
    /// one [`try_lock`](Redlock::try_lock) after another, avoids both partial sets and the
    /// deadlocks of two clients taking the same resources in different orders.
    ///
    /// # Redis Cluster
    /// The scripts touch only the keys of the set. When every resource shares one hash tag
    /// (`{orders}:1`, `{orders}:2`; the prefix must not contain braces), all keys live in one
    /// slot and the same call works against a Redis Cluster node. Without a shared tag it
    /// needs standalone masters, which is what Redlock's nodes are; a cluster node answers
    /// `CROSSSLOT`, reported as a failed node.
    ///
    /// Fails like [`try_lock`](Redlock::try_lock) ([`ErrorKind::NotAcquired`] when another
    /// owner holds any of the resources on too many nodes), and with [`ErrorKind::Config`]
    /// for an empty set, an empty resource name or a name given twice. A failed attempt
    /// removes whatever it may have set. Errors name the resources joined by `", "`.
    ///
    /// [`ErrorKind::NotAcquired`]: crate::ErrorKind::NotAcquired
    /// [`ErrorKind::Config`]: crate::ErrorKind::Config
    pub async fn try_lock_many(&self, resources: &[&str]) -> Result<MultiLock> {
        self.try_lock_many_for(resources, self.ttl()).await
    }

    /// One attempt to lock every resource in `resources` together, for `ttl`.
    pub async fn try_lock_many_for(&self, resources: &[&str], ttl: Duration) -> Result<MultiLock> {
        let set = Set::new(self, resources, ttl)?;
        MultiLock::attempt(self, &set).await
    }

    /// Locks every resource in `resources` together for the default TTL, retrying per the
    /// [`Retry`](crate::Retry) policy (cancellation-safe, like [`lock`](Redlock::lock)).
    /// Each attempt uses a fresh token. Between attempts it waits for a release of the
    /// set's first resource or the policy's pause, whichever comes first (a release of
    /// another resource of the set is found by the pause). Its own release notifies the
    /// waiters of each of its keys.
    pub async fn lock_many(&self, resources: &[&str]) -> Result<MultiLock> {
        self.lock_many_for(resources, self.ttl()).await
    }

    /// Locks every resource in `resources` together for `ttl`, retrying per the
    /// [`Retry`](crate::Retry) policy.
    pub async fn lock_many_for(&self, resources: &[&str], ttl: Duration) -> Result<MultiLock> {
        let set = Set::new(self, resources, ttl)?;
        // `Set::new` rejects an empty set, so there is a first key.
        let first = set.keys.first().map_or("", String::as_str);
        self.retrying(first, || MultiLock::attempt(self, &set)).await
    }
}

/// A validated set of resources and its lease.
struct Set {
    resources: Box<[String]>,
    keys: Box<[String]>,
    display: String,
    ttl_ms: u64,
}

impl Set {
    fn new(rl: &Redlock, resources: &[&str], ttl: Duration) -> Result<Self> {
        let ttl_ms = check_ttl(ttl, rl.inner().config.drift_factor)?;
        if resources.is_empty() {
            return Err(Error::config("the set of resources is empty"));
        }
        let mut seen = HashSet::with_capacity(resources.len());
        let mut keys = Vec::with_capacity(resources.len());
        for resource in resources {
            if !seen.insert(*resource) {
                return Err(Error::config(format!("the resource `{resource}` is given twice")));
            }
            keys.push(rl.inner().key(resource)?.to_string());
        }
        Ok(Self {
            resources: resources.iter().map(|r| (*r).to_owned()).collect(),
            keys: keys.into(),
            display: resources.join(", "),
            ttl_ms,
        })
    }
}

/// Several resources locked together on a quorum of nodes, under one token, valid until
/// [`validity()`](MultiLock::validity) reaches zero.
///
/// Every node that counts toward the quorum holds every key of the set. Call
/// [`release()`](MultiLock::release) when done; dropped without it, the set is released in
/// the background on the Tokio runtime (never blocking in `Drop`), and dropped outside a
/// runtime its keys are left to expire.
///
/// `MultiLock` owns everything it needs (`Send + 'static`), so it can move into a spawned
/// task.
#[must_use = "dropping a MultiLock releases it at once, in the background"]
pub struct MultiLock {
    held: Held<Multi>,
    resources: Box<[String]>,
    display: String,
}

impl fmt::Debug for MultiLock {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("MultiLock")
            .field("resources", &self.resources)
            .field("token", &self.token())
            .field("validity", &self.validity())
            .finish()
    }
}

impl MultiLock {
    async fn attempt(rl: &Redlock, set: &Set) -> Result<Self> {
        let proto = Arc::new(Multi {
            keys: set.keys.clone(),
            channels: set.keys.iter().map(|key| notify::channel(key)).collect(),
            token: token::generate().into(),
        });
        let label = Label { kind: KIND, resource: &set.display };
        let held = super::attempt(rl.inner(), proto, set.ttl_ms, label).await?;
        Ok(Self { held, resources: set.resources.clone(), display: set.display.clone() })
    }

    /// The resource names, in the order passed to the lock call.
    pub fn resources(&self) -> &[String] {
        &self.resources
    }

    /// The Redis keys (each resource name behind the configured prefix), in the same order.
    pub fn keys(&self) -> &[String] {
        &self.held.proto().keys
    }

    /// The random token stored as every key's value on the nodes.
    pub fn token(&self) -> &str {
        &self.held.proto().token
    }

    /// What remains of the lease, counting down; [`Duration::ZERO`] once it is over.
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

    /// Renews every key of the set to `ttl` from now, on each node only if none of the keys
    /// is held by another owner there (then nothing changes on that node).
    ///
    /// Behaves as [`Lock::extend`](crate::Lock::extend): a quorum is needed, the new validity
    /// is timed from the start of this call, a node that lost some keys gets them back but
    /// does not count, and a failed extension deletes nothing.
    pub async fn extend(&mut self, ttl: Duration) -> Result<()> {
        let label = Label { kind: KIND, resource: &self.display };
        self.held.extend(ttl, label).await
    }

    /// Releases every key of the set that still holds our token, on every node, never
    /// touching another owner's key. Results as [`Lock::release`](crate::Lock::release).
    pub async fn release(self) -> Result<()> {
        let label = Label { kind: KIND, resource: &self.display };
        self.held.release(label).await
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_multi_lock_can_move_across_tasks() {
        fn send_static<T: Send + 'static>() {}
        send_static::<MultiLock>();
    }
}
