//! The counting lock (semaphore): at most L holders of a resource at once, as L slot locks.
//!
//! Each slot is a plain Redlock of its own: its key holds the token of its one holder
//! (`SET NX` semantics, compare-and-delete release), so at most one holder per slot and at
//! most L in all. A per-node counter would not do: see [`crate::guide::semaphore`].
//!
//! Keys, for resource `R` behind prefix `P` (all in one Redis Cluster hash slot: they share
//! the beginning `P{R}`, which holds the first `{` and a `}` after it):
//! - `P{R}:permit:<i>` for slot `i` in `0..L`: a plain lock key (key -> token);
//! - `P{R}:permits`: the L the slots were granted with, as a decimal string. Every grant
//!   checks it and refuses a different L; it lives on each node at least as long as every
//!   slot granted there with it (a grant or extension only lengthens it), so while a permit
//!   of one L is valid its quorum refuses any other L, and two Ls are never both granted.
//!
//! Releases publish on the count key's release channel, whichever slot they free: a waiter
//! watches that one channel and is woken by the release of any slot.

use std::sync::Arc;
use std::sync::atomic::{AtomicU64, Ordering};

use redis::Value;

use crate::command::{self, Command, Resend};
use crate::config::Config;
use crate::engine::protocol::{Args, Identity, failed, script_answer};
use crate::engine::{Answer, Op, Protocol};
use crate::error::{Error, NodeOutcome, Result};
use crate::guard::guard;
use crate::node::Reply;

use super::plain::Holders;

/// A validated counting lock: its name, count and keys.
#[derive(Clone, Debug)]
pub(crate) struct Permits {
    resource: Arc<str>,
    permits: u32,
    /// `P{R}`: the beginning every key of the counting lock shares.
    base: Arc<str>,
    count_key: Arc<str>,
    /// Another count a node answered with, plus one (0: none yet): shared by every attempt
    /// of one request, read when a round was refused.
    mismatch: Arc<AtomicU64>,
}

impl Permits {
    /// Checks the name and the count (at least one permit).
    pub(crate) fn new(config: &Config, resource: &str, permits: u32) -> Result<Self> {
        if permits == 0 {
            return Err(Error::config("a counting lock needs at least one permit"));
        }
        // Validates the name as any lock's (not empty, not in a reserved namespace).
        let (name, _) = config.name_and_key(resource)?;
        let base: Arc<str> = format!("{}{{{resource}}}", config.key_prefix).into();
        let count_key = count_key(&base);
        Ok(Self { resource: name, permits, base, count_key, mismatch: Arc::default() })
    }

    pub(crate) fn resource(&self) -> &Arc<str> {
        &self.resource
    }

    pub(crate) fn permits(&self) -> u32 {
        self.permits
    }

    /// The key of the count, whose release channel every slot's release publishes on.
    pub(crate) fn count_key(&self) -> &Arc<str> {
        &self.count_key
    }

    /// The key of slot `slot`.
    pub(crate) fn slot_key(&self, slot: u32) -> Arc<str> {
        slot_key(&self.base, slot)
    }

    /// The count another client uses, if a node refused this one's for it.
    pub(crate) fn mismatch(&self) -> Option<u64> {
        self.mismatch.load(Ordering::Acquire).checked_sub(1)
    }

    /// A fresh acquisition of slot `slot`, with a fresh token.
    pub(crate) fn hold(&self, slot: u32, label: Option<&str>) -> PermitHold {
        let key = self.slot_key(slot);
        PermitHold {
            id: Identity::new("permit", smallvec::smallvec![key], label),
            slot,
            permits: self.permits,
            count: self.permits.to_string(),
            count_key: self.count_key.clone(),
            mismatch: self.mismatch.clone(),
            holders: Holders::default(),
        }
    }
}

/// The key of slot `slot` of the counting lock whose keys begin with `base` (`P{R}`).
pub(crate) fn slot_key(base: &str, slot: u32) -> Arc<str> {
    format!("{base}:permit:{slot}").into()
}

/// The key of the count of the counting lock whose keys begin with `base` (`P{R}`).
pub(crate) fn count_key(base: &str) -> Arc<str> {
    format!("{base}:permits").into()
}

/// One acquisition of one slot of a counting lock.
#[derive(Debug)]
pub(crate) struct PermitHold {
    id: Identity,
    slot: u32,
    permits: u32,
    /// `permits` as sent to the nodes.
    count: String,
    count_key: Arc<str>,
    mismatch: Arc<AtomicU64>,
    holders: Holders,
}

impl PermitHold {
    fn slot_key(&self) -> &Arc<str> {
        &self.id.keys[0]
    }
}

impl Protocol for PermitHold {
    // A permit excludes the other holders of its slot only, not of the resource: this
    // client's waiters for the resource neither queue behind each other nor stop polling
    // while it holds one.
    fn is_exclusive(&self) -> bool {
        false
    }

    fn identity(&self) -> &Identity {
        &self.id
    }

    fn command(&self, op: Op, args: &Args) -> Command {
        let token = self.id.token.as_bytes();
        let keys = [&**self.slot_key(), &self.count_key];
        match op {
            Op::Acquire | Op::Extend => {
                let ms = args.ttl.arg();
                let script = if op == Op::Acquire {
                    &command::PERMIT_ACQUIRE
                } else {
                    &command::PERMIT_EXTEND
                };
                let argv = [token, ms.as_bytes(), self.count.as_bytes()];
                Command::script(script, &keys, &argv, Resend::Safe).creating()
            }
            // The plain lock's release, published on the count key's channel: a waiter for
            // any slot hears it.
            Op::Release | Op::CleanUp => {
                super::plain::release(keys[0], token, &self.count_key, args)
            }
            Op::Check => {
                let mut cmd = redis::cmd("GET");
                cmd.arg(&**self.slot_key());
                Command::plain(cmd, Resend::Safe)
            }
        }
    }

    fn note_holder(&self, node: usize, reply: &Reply) {
        self.holders.note(self.id.token.as_bytes(), node, reply);
    }

    fn holders(&self) -> Vec<(usize, Arc<str>)> {
        self.holders.list()
    }

    fn answer(&self, op: Op, reply: &Reply) -> Answer {
        let ours = |holder: &[u8]| holder == self.id.token.as_bytes();
        match (op, &reply.value) {
            (Op::Acquire, Ok(Value::Nil)) => NodeOutcome::Ok.into(),
            (Op::Acquire | Op::Check, Ok(Value::BulkString(holder))) if ours(holder) => {
                NodeOutcome::Ok.into()
            }
            (Op::Acquire | Op::Check, Ok(Value::BulkString(_))) => NodeOutcome::Held.into(),
            // The node's count differs: counted as a key this request cannot use (refused
            // for good once more nodes than may fail say so), reported as `Config`.
            (Op::Acquire, Ok(Value::Int(other))) => {
                let other = u64::try_from(*other).unwrap_or(0);
                self.mismatch.store(other.saturating_add(1), Ordering::Release);
                NodeOutcome::WrongType.into()
            }
            (Op::Check, Ok(Value::Nil)) => NodeOutcome::Absent.into(),
            (Op::Acquire | Op::Check, other) => failed(other).into(),
            (Op::Extend | Op::Release | Op::CleanUp, _) => script_answer(reply),
        }
    }
}

guard! {
    /// One permit of a counting lock ([`Redlock::semaphore`](crate::Redlock::semaphore)):
    /// slot [`slot()`](Permit::slot) of the resource's L, held on a quorum of nodes, valid
    /// until [`validity()`](Permit::validity) reaches zero.
    ///
    /// Each slot is a plain lock, so at most one valid permit per slot and at most L in all.
    /// Call [`release()`](Permit::release) when done: it frees the slot and wakes a waiter.
    /// Dropped without it, the permit is released in the background.
    Permit(PermitHold), "permit", key
}

impl Permit {
    /// The fencing token of a permit taken with
    /// [`.fenced()`](crate::SemaphoreRequest::fenced): larger than that of any earlier
    /// grant of the same slot (not of the resource), the same for the whole hold; `None`
    /// when it was not requested. See [`crate::guide::semaphore`].
    pub fn fencing_token(&self) -> Option<u64> {
        self.claim.fence()
    }
}

impl Permit {
    /// Which of the resource's slots this permit holds, in `0..permits()`.
    pub fn slot(&self) -> u32 {
        self.claim.proto().slot
    }

    /// How many permits the resource has (L), as requested.
    pub fn permits(&self) -> u32 {
        self.claim.proto().permits
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::engine::protocol::testing::{error, reply};

    fn permits(prefix: &str, resource: &str, n: u32) -> Permits {
        Permits::new(&crate::config::config(prefix), resource, n).unwrap()
    }

    #[test]
    fn every_key_of_a_counting_lock_shares_one_hash_tag_behind_the_prefix() {
        let p = permits("p:", "jobs", 3);
        assert_eq!(&*p.slot_key(2), "p:{jobs}:permit:2");
        assert_eq!(&**p.count_key(), "p:{jobs}:permits");
        // A name with braces of its own: the tag differs, but it is the same for all keys.
        let p = permits("", "a}b{c", 2);
        assert_eq!(&*p.slot_key(0), "{a}b{c}:permit:0");
        assert_eq!(&**p.count_key(), "{a}b{c}:permits");
    }

    #[test]
    fn zero_permits_or_a_bad_name_is_a_config_error() {
        let config = crate::config::config("p:");
        let kind = |r, n| Permits::new(&config, r, n).unwrap_err().kind();
        assert_eq!(kind("jobs", 0), crate::ErrorKind::Config);
        assert_eq!(kind("", 2), crate::ErrorKind::Config);
    }

    #[test]
    fn an_acquire_reply_names_the_holder_or_the_other_count() {
        let p = permits("", "jobs", 2);
        let hold = p.hold(1, None);
        let answer = |value| hold.answer(Op::Acquire, &reply(value)).outcome;
        assert_eq!(answer(Value::Nil), NodeOutcome::Ok);
        assert_eq!(answer(Value::BulkString(hold.id.token.as_bytes().to_vec())), NodeOutcome::Ok);
        assert_eq!(answer(Value::BulkString(b"someone".to_vec())), NodeOutcome::Held);
        assert_eq!(p.mismatch(), None);
        assert_eq!(answer(Value::Int(3)), NodeOutcome::WrongType);
        assert_eq!(p.mismatch(), Some(3));
        assert_eq!(hold.answer(Op::Acquire, &error("WRONGTYPE")).outcome, NodeOutcome::WrongType);
    }

    #[test]
    fn every_command_is_safe_to_send_twice() {
        let hold = permits("", "jobs", 2).hold(0, None);
        let ttl = crate::config::Ttl::new(std::time::Duration::from_secs(1), 0.01).unwrap();
        for op in [Op::Acquire, Op::Extend, Op::Release, Op::CleanUp, Op::Check] {
            assert_eq!(hold.command(op, &Args::lease(ttl)).resend(), Resend::Safe, "{op:?}");
        }
    }
}
