//! The plain lock: one key per resource, holding the acquisition's random token.
//!
//! On each node: acquire is `SET key token NX PX ttl GET`, which says who holds the key (nil
//! when we set it, our own token when an earlier send of this very request landed, the
//! holder's token otherwise, and `WRONGTYPE` for a key that is not a string, which `SET NX`
//! alone would report as "held"); release is a compare-and-delete; extend a
//! compare-and-renew that never sets the key again where it is gone (it would bring back a
//! key a release had just removed). Each is the server's own command where it has one, a
//! script elsewhere (see [`crate::native`]). Every command compares the token first, so
//! each is safe to send twice; a release goes behind the hold's unanswered creates (see
//! [`crate::route`]).

use std::sync::Arc;

use redis::Value;

use crate::command::{self, Arg, Command, Resend};
use crate::engine::protocol::{Args, Identity, failed, script_answer};
use crate::engine::{Answer, Op, Protocol};
use crate::error::NodeOutcome;
use crate::guard::guard;
use crate::native::Native;
use crate::node::Reply;

/// Who held the key on which node, as an acquisition's replies named them (no
/// allocation until a refusal): what tells a split vote from a holder of a quorum.
#[derive(Debug, Default)]
pub(crate) struct Holders(std::sync::Mutex<smallvec::SmallVec<[Held; 1]>>);

/// A node and the holder it named.
type Held = (usize, Arc<str>);

impl Holders {
    /// Notes the holder `reply` names on node `node`, unless it is `token` (our own).
    pub(crate) fn note(&self, token: &[u8], node: usize, reply: &Reply) {
        if let Ok(Value::BulkString(holder)) = &reply.value
            && holder.as_slice() != token
        {
            let holder: Arc<str> = String::from_utf8_lossy(holder).into();
            self.0.lock().unwrap_or_else(|poisoned| poisoned.into_inner()).push((node, holder));
        }
    }

    /// The holders noted so far, by node.
    pub(crate) fn list(&self) -> Vec<(usize, Arc<str>)> {
        self.0.lock().unwrap_or_else(|poisoned| poisoned.into_inner()).to_vec()
    }
}

/// One acquisition of one key.
#[derive(Debug)]
pub(crate) struct Plain {
    id: Identity,
    /// Who held the key where this acquisition was refused, by node (no allocation until
    /// a refusal).
    holders: Holders,
}

impl Plain {
    /// A fresh acquisition of `key`, with a fresh token.
    pub(crate) fn new(key: Arc<str>, label: Option<&str>) -> Self {
        let holders = Holders::default();
        Self { id: Identity::new("lock", smallvec::smallvec![key], label), holders }
    }

    fn key(&self) -> &str {
        &self.id.keys[0]
    }
}

impl Protocol for Plain {
    fn is_exclusive(&self) -> bool {
        true
    }

    fn identity(&self) -> &Identity {
        &self.id
    }

    fn command(&self, op: Op, args: &Args) -> Command {
        let (key, token) = (self.key(), self.id.token.as_bytes());
        match op {
            Op::Acquire => {
                let ms = args.ttl.arg();
                let argv = [token, ms.as_bytes()];
                Command::script(&command::PLAIN_ACQUIRE, &[key], &argv, Resend::Safe)
                    .or_native(Native::acquire(key, token, ms.as_bytes()))
                    .creating()
            }
            // `SET ... IFEQ ... PX` only where the node refuses scripts: it sets the lease
            // outright, and the rounds after one still in flight count less for it.
            Op::Extend => {
                let ms = args.ttl.arg();
                let argv = [token, ms.as_bytes()];
                Command::script(&command::EXTEND, &[key], &argv, Resend::Safe)
                    .or_native(Native::extend(key, token, args.ttl))
                    .creating()
            }
            Op::Release | Op::CleanUp => release(key, token, key, args),
            Op::Check => {
                let mut cmd = redis::cmd("GET");
                cmd.arg(key);
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
            // Our own token: an earlier send of this very request landed.
            (Op::Acquire | Op::Check, Ok(Value::BulkString(holder))) if ours(holder) => {
                NodeOutcome::Ok.into()
            }
            (Op::Acquire | Op::Check, Ok(Value::BulkString(_))) => NodeOutcome::Held.into(),
            (Op::Check, Ok(Value::Nil)) => NodeOutcome::Absent.into(),
            (Op::Acquire | Op::Check, other) => failed(other).into(),
            (Op::Extend | Op::Release | Op::CleanUp, _) => script_answer(reply),
        }
    }
}

/// The release of a plain key holding `token`: a compare-and-delete, telling the waiters
/// on `channel_of`'s channel unless [`Args::quiet`]; native where the server has it, unless
/// it tells the waiters of a hold not known to be on a quorum (see [`Args::held`]).
pub(crate) fn release(key: &str, token: &[u8], channel_of: &str, args: &Args) -> Command {
    let argv = [Arg::Bytes(token), args.release_channel(channel_of)];
    let command = Command::script(&command::RELEASE, &[key], &argv, Resend::Safe);
    match (args.quiet, args.held) {
        (true, _) => command.or_native(Native::release(key, token, None)),
        (false, true) => command.or_native(Native::release(key, token, Some(channel_of))),
        (false, false) => command,
    }
}

guard! {
    /// A lock held on a quorum of nodes, valid until [`validity()`](Lock::validity) reaches
    /// zero.
    ///
    /// Call [`release()`](Lock::release) when done: it reports whether the lock was still
    /// held. A `Lock` dropped without `release()` is released in the background (never
    /// blocking in `Drop`, also outside any runtime).
    ///
    /// `Lock` owns everything it needs (`Send + Sync + 'static`), so it can move into a
    /// spawned task.
    Lock(Plain), "lock", key
}

impl Lock {
    /// The fencing token of a lock taken with [`.fenced()`](crate::LockRequest::fenced):
    /// larger than that of any earlier grant of the resource, the same for the whole hold
    /// (extensions keep it); `None` when it was not requested. Pass it with every write the
    /// lock protects; see [`crate::guide::fencing`].
    pub fn fencing_token(&self) -> Option<u64> {
        self.claim.fence()
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::engine::protocol::testing::{error, reply};

    fn plain() -> Plain {
        Plain::new("orders:1".into(), None)
    }

    #[test]
    fn an_acquire_reply_names_the_holder() {
        let p = plain();
        let answer = |value| p.answer(Op::Acquire, &reply(value)).outcome;
        assert_eq!(answer(Value::Nil), NodeOutcome::Ok);
        assert_eq!(answer(Value::BulkString(p.id.token.as_bytes().to_vec())), NodeOutcome::Ok);
        assert_eq!(answer(Value::BulkString(b"someone".to_vec())), NodeOutcome::Held);
        assert_eq!(p.answer(Op::Acquire, &error("WRONGTYPE")).outcome, NodeOutcome::WrongType);
        assert!(matches!(answer(Value::Int(1)), NodeOutcome::Failed(_)));
    }

    #[test]
    fn a_release_reply_tells_done_absent_held_and_a_refused_notification() {
        let p = plain();
        let answer = |n| p.answer(Op::Release, &reply(Value::Int(n)));
        assert_eq!(answer(1), NodeOutcome::Ok.into());
        assert_eq!(answer(2), Answer { outcome: NodeOutcome::Ok, notify_refused: true });
        assert_eq!(answer(0).outcome, NodeOutcome::Absent);
        assert_eq!(answer(-1).outcome, NodeOutcome::Held);
    }

    #[test]
    fn every_command_is_safe_to_send_twice() {
        let p = plain();
        let ttl = crate::config::Ttl::new(std::time::Duration::from_secs(1), 0.01).unwrap();
        for op in [Op::Acquire, Op::Extend, Op::Release, Op::CleanUp, Op::Check] {
            assert_eq!(p.command(op, &Args::lease(ttl)).resend(), Resend::Safe, "{op:?}");
        }
    }
}
