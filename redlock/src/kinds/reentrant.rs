//! The reentrant lock: one owner (a job or request id, not a thread) may hold the lock
//! several times at once; every acquisition is its own hold with its own guard.
//!
//! Layout, rules and the safety argument: [`crate::guide::kinds`].

use std::sync::Arc;

use redis::Value;

use crate::command::{self, Arg, Command, Resend};
use crate::engine::protocol::{Args, Identity, failed, script_answer};
use crate::engine::{Answer, Op, Protocol};
use crate::error::{Error, NodeOutcome, Result};
use crate::guard::guard;
use crate::node::Reply;

/// One hold of one owner on one key: the hash field `h:<token>:<owner>`.
#[derive(Debug)]
pub(crate) struct Reentrant {
    id: Identity,
    owner: Arc<str>,
    field: Arc<str>,
}

impl Reentrant {
    /// A fresh hold of `key` for `owner`.
    pub(crate) fn new(key: Arc<str>, owner: Arc<str>, label: Option<&str>) -> Self {
        let id = Identity::new("reentrant lock", smallvec::smallvec![key], label);
        let field = format!("h:{}:{owner}", id.token).into();
        Self { id, owner, field }
    }

    /// Checks an owner id.
    pub(crate) fn check_owner(owner: &str) -> Result<Arc<str>> {
        if owner.is_empty() {
            return Err(Error::config("the owner id is empty"));
        }
        Ok(owner.into())
    }

    pub(crate) fn owner(&self) -> &str {
        &self.owner
    }

    pub(crate) fn field(&self) -> &str {
        &self.field
    }
}

impl Protocol for Reentrant {
    fn identity(&self) -> &Identity {
        &self.id
    }

    fn command(&self, op: Op, args: &Args) -> Command {
        let keys = [&*self.id.keys[0]];
        let field = self.field.as_bytes();
        let ms = args.ttl.arg();
        let (field, ms) = (Arg::Bytes(field), Arg::Bytes(ms.as_bytes()));
        match op {
            Op::Acquire | Op::Extend => {
                let script = if op == Op::Acquire {
                    &command::REENTRANT_ACQUIRE
                } else {
                    &command::REENTRANT_EXTEND
                };
                Command::script(script, &keys, &[field, ms], Resend::Safe).creating()
            }
            Op::Release | Op::CleanUp => {
                let channel = args.release_channel(keys[0]);
                let argv = [field, channel, Arg::Bytes(b"")];
                Command::script(&command::REENTRANT_RELEASE, &keys, &argv, Resend::Safe)
            }
            Op::Check => Command::script(&command::REENTRANT_CHECK, &keys, &[field], Resend::Safe),
        }
    }

    fn answer(&self, op: Op, reply: &Reply) -> Answer {
        match (op, &reply.value) {
            (Op::Acquire, Ok(Value::Int(1))) => NodeOutcome::Ok.into(),
            (Op::Acquire, Ok(Value::Int(-1))) => NodeOutcome::Held.into(),
            (Op::Acquire, other) => failed(other).into(),
            _ => script_answer(reply),
        }
    }
}

guard! {
    /// One hold of a reentrant lock, valid until [`validity()`](ReentrantLock::validity)
    /// reaches zero.
    ///
    /// Every acquisition by the same owner is a hold of its own, with its own token, lease
    /// and validity (timed from its own acquisition); the lock stays held while any of the
    /// owner's holds is, and another owner is refused meanwhile. Releasing a hold removes
    /// that hold and no other, even a stale guard released long after its lease ran out.
    /// Dropped without [`release()`](ReentrantLock::release), the hold is released in the
    /// background.
    ///
    /// See [`crate::guide::kinds`] for the layout on the nodes and the safety argument.
    ReentrantLock(Reentrant), "hold", key
}

impl ReentrantLock {
    /// The owner id this hold was taken for.
    pub fn owner(&self) -> &str {
        self.claim.proto().owner()
    }

    /// The hash field of this hold (`h:<token>:<owner>`), whose value is its expiry in
    /// the node's milliseconds.
    pub fn field(&self) -> &str {
        self.claim.proto().field()
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::engine::protocol::testing::{error, reply};

    #[test]
    fn every_hold_has_its_own_field_naming_its_owner() {
        let a = Reentrant::new("job".into(), "worker:1".into(), None);
        let b = Reentrant::new("job".into(), "worker:1".into(), None);
        assert_ne!(a.field, b.field);
        assert!(a.field.starts_with("h:") && a.field.ends_with(":worker:1"));
        assert_eq!(a.field.len(), 2 + 40 + 1 + "worker:1".len());
        let labelled = Reentrant::new("job".into(), "worker:1".into(), Some("host/42"));
        // The scripts take the owner after the first `:` that follows the token.
        assert!(labelled.field.ends_with(".host/42:worker:1"), "{}", labelled.field);
    }

    #[test]
    fn replies_mean_granted_held_absent_or_wrong_type() {
        let hold = Reentrant::new("job".into(), "w".into(), None);
        let acquire = |v| hold.answer(Op::Acquire, &reply(v)).outcome;
        assert_eq!(acquire(Value::Int(1)), NodeOutcome::Ok);
        assert_eq!(acquire(Value::Int(-1)), NodeOutcome::Held);
        assert_eq!(hold.answer(Op::Acquire, &error("WRONGTYPE")).outcome, NodeOutcome::WrongType);
        assert_eq!(hold.answer(Op::Release, &reply(Value::Int(0))).outcome, NodeOutcome::Absent);
        assert_eq!(hold.answer(Op::Extend, &reply(Value::Int(-1))).outcome, NodeOutcome::Held);
    }
}
