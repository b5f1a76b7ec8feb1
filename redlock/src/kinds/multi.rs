//! The multi-resource lock: several resources taken together, all or nothing.
//!
//! On each node one script (`multi_acquire.lua`) reads every key and, only if all are absent
//! (or already hold this attempt's token), sets them all to the token with the lease;
//! otherwise it sets none and reports "held". A node therefore either holds the whole set
//! for us or nothing of it, and the quorum is counted per node over the whole set. Release
//! (`multi_release.lua`) and extend (`multi_extend.lua`) cover the set in one script per
//! node, comparing the token key by key, so another owner's key is never deleted or
//! renewed. Every script reads all keys before writing any, so a `WRONGTYPE` (a key that is
//! not a plain lock) aborts it before anything changed.
//!
//! Each key is an ordinary plain-lock key (a string holding the token), so a
//! [`Lock`](crate::Lock) on one of the resources and a [`MultiLock`] including it exclude
//! each other.

use std::collections::HashSet;
use std::sync::Arc;

use redis::Value;

use crate::command::{self, Arg, Command, Resend};
use crate::config::Config;
use crate::engine::protocol::{Args, Identity, failed, script_answer};
use crate::engine::{Answer, Op, Protocol};
use crate::error::{Error, NodeOutcome, Result};
use crate::guard::guard;
use crate::node::Reply;

/// A validated set of resources: their names and keys.
#[derive(Clone, Debug)]
pub(crate) struct Set {
    resources: Arc<[String]>,
    keys: Arc<[Arc<str>]>,
    /// The names joined by `", "`, for errors and logs.
    label: Arc<str>,
}

impl Set {
    /// Checks `resources`: not empty, no name twice, every name a valid key.
    pub(crate) fn new(config: &Config, resources: &[&str]) -> Result<Self> {
        if resources.is_empty() {
            return Err(Error::config("the set of resources is empty"));
        }
        let mut seen = HashSet::with_capacity(resources.len());
        let mut keys = Vec::with_capacity(resources.len());
        for resource in resources {
            if !seen.insert(*resource) {
                return Err(Error::config(format!("the resource `{resource}` is given twice")));
            }
            keys.push(config.key(resource)?);
        }
        Ok(Self {
            resources: resources.iter().map(|r| (*r).to_owned()).collect(),
            keys: keys.into(),
            label: resources.join(", ").into(),
        })
    }

    pub(crate) fn label(&self) -> &Arc<str> {
        &self.label
    }
}

/// One acquisition of a set of keys under one token.
#[derive(Debug)]
pub(crate) struct Multi {
    set: Set,
    id: Identity,
}

impl Multi {
    /// A fresh acquisition of `set`, with a fresh token.
    pub(crate) fn new(set: Set, label: Option<&str>) -> Self {
        let id = Identity::new("multi-resource lock", set.keys.iter().cloned().collect(), label);
        Self { set, id }
    }
}

impl Protocol for Multi {
    fn is_exclusive(&self) -> bool {
        true
    }

    fn identity(&self) -> &Identity {
        &self.id
    }

    fn command(&self, op: Op, args: &Args) -> Command {
        let token = self.id.token.as_bytes();
        let ms = args.ttl.arg();
        let (token, ms) = (Arg::Bytes(token), Arg::Bytes(ms.as_bytes()));
        match op {
            Op::Acquire | Op::Extend => {
                let script = if op == Op::Acquire {
                    &command::MULTI_ACQUIRE
                } else {
                    &command::MULTI_EXTEND
                };
                Command::script(script, &self.set.keys, &[token, ms], Resend::Safe).creating()
            }
            Op::Release | Op::CleanUp => {
                let channels = self.set.keys.iter().map(|key| args.release_channel(key));
                let argv: Vec<Arg<'_>> = std::iter::once(token).chain(channels).collect();
                Command::script(&command::MULTI_RELEASE, &self.set.keys, &argv, Resend::Safe)
            }
            Op::Check => {
                Command::script(&command::MULTI_CHECK, &self.set.keys, &[token], Resend::Safe)
            }
        }
    }

    fn answer(&self, op: Op, reply: &Reply) -> Answer {
        if !op.is_undo() {
            return script_answer(reply);
        }
        let Ok(Value::Array(counts)) = &reply.value else { return failed(&reply.value).into() };
        match counts.as_slice() {
            [Value::Int(ours), Value::Int(foreign), Value::Int(refused)] => {
                let whole = usize::try_from(*ours).is_ok_and(|ours| ours == self.set.keys.len());
                let outcome = if whole {
                    NodeOutcome::Ok
                } else if *foreign > 0 {
                    NodeOutcome::Held
                } else {
                    // Some or all of our keys were gone: the set was no longer whole here.
                    NodeOutcome::Absent
                };
                Answer { outcome, notify_refused: *refused != 0 }
            }
            _ => failed(&reply.value).into(),
        }
    }
}

guard! {
    /// Several resources locked together on a quorum of nodes, under one token, valid
    /// until [`validity()`](MultiLock::validity) reaches zero.
    ///
    /// Every node that counts toward the quorum holds every key of the set. Call
    /// [`release()`](MultiLock::release) when done; dropped without it, the set is released
    /// in the background. [`resource()`](MultiLock::resource) names the set as its
    /// resources joined by `", "`.
    MultiLock(Multi), "set"
}

impl MultiLock {
    /// The resource names, in the order passed to the lock call.
    pub fn resources(&self) -> &[String] {
        &self.claim.proto().set.resources
    }

    /// The Redis keys (each resource name behind the configured prefix), in the same order.
    pub fn keys(&self) -> Vec<&str> {
        self.claim.proto().set.keys.iter().map(|key| &**key).collect()
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::engine::protocol::testing::reply;

    fn config() -> Config {
        crate::config::config("p:")
    }

    #[test]
    fn sets_are_checked_and_keyed() {
        let set = Set::new(&config(), &["a", "b"]).unwrap();
        assert_eq!(&*set.label, "a, b");
        assert_eq!(&*set.keys[1], "p:b");
        assert!(Set::new(&config(), &[]).is_err());
        assert!(Set::new(&config(), &["a", "a"]).is_err());
        assert!(Set::new(&config(), &["a", ""]).is_err());
    }

    #[test]
    fn a_release_counts_only_a_whole_set() {
        let multi = Multi::new(Set::new(&config(), &["a", "b"]).unwrap(), None);
        let release = |ours, foreign| {
            let counts = vec![Value::Int(ours), Value::Int(foreign), Value::Int(0)];
            multi.answer(Op::Release, &reply(Value::Array(counts))).outcome
        };
        assert_eq!(release(2, 0), NodeOutcome::Ok);
        assert_eq!(release(1, 1), NodeOutcome::Held);
        assert_eq!(release(1, 0), NodeOutcome::Absent);
        assert_eq!(release(0, 0), NodeOutcome::Absent);
    }
}
