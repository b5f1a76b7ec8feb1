//! What a lock kind tells the engine: what to send to one node for each operation, and
//! what a reply means. Pure: no I/O, testable without a server.

use std::sync::Arc;

use redis::Value;

use crate::command::{Arg, Command};
use crate::config::Ttl;
use crate::error::NodeOutcome;
use crate::node::Reply;

/// The operations the engine runs over the nodes.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub(crate) enum Op {
    /// Take the lock on the node.
    Acquire,
    /// Renew our hold's lease where it is still ours.
    Extend,
    /// Give the lock up for good: our hold goes, and whatever the attempt left to wait on
    /// (a writer's intent) goes with it.
    Release,
    /// Take back a failed attempt's hold; what outlives the attempt (a writer's intent,
    /// while it keeps waiting) stays.
    CleanUp,
    /// Ask whether the node still has our hold.
    Check,
}

impl Op {
    /// A stable name, for metrics labels.
    pub(crate) fn as_str(self) -> &'static str {
        match self {
            Self::Acquire => "acquire",
            Self::Extend => "extend",
            Self::Release => "release",
            Self::CleanUp => "clean_up",
            Self::Check => "check",
        }
    }
}

/// A node's answer, as the round counts it.
#[derive(Clone, Debug, PartialEq, Eq)]
pub(crate) struct Answer {
    pub(crate) outcome: NodeOutcome,
    /// The node did it, but refused to publish the release notification (an ACL user
    /// without the channel): worth a warning, not a failure.
    pub(crate) notify_refused: bool,
}

impl From<NodeOutcome> for Answer {
    fn from(outcome: NodeOutcome) -> Self {
        Self { outcome, notify_refused: false }
    }
}

/// What a round's command carries besides the hold's own names.
#[derive(Clone, Copy, Debug)]
pub(crate) struct Args {
    /// The lease, for `Acquire` and `Extend`.
    pub(crate) ttl: Ttl,
    /// For `Release` and `CleanUp`: tell no waiter. The clean-up of an attempt that never
    /// held a quorum frees no quorum, and a waiter counts releases by hold, so it would
    /// wake no one; published, it would only push real releases out of the waiters' memory
    /// of what they heard (and add up, per node, for the kinds whose last release names no
    /// hold).
    pub(crate) quiet: bool,
    /// For `Release`: the hold was granted, is not known lost, and is still valid, so it is
    /// on a quorum and a notification may go out without looking whether this node still
    /// had it (the native release publishes either way; the script only where it removed
    /// the key, which is what a dropped attempt's or a lost hold's release needs: a waiter
    /// counts a release at a quorum of them).
    pub(crate) held: bool,
}

impl Args {
    /// For an operation that needs only the lease.
    pub(crate) fn lease(ttl: Ttl) -> Self {
        Self { ttl, quiet: false, held: false }
    }

    /// The channel a `Release` or `CleanUp` of `key` publishes on: none (`''`, which the
    /// release scripts take for "publish nothing") when [`Args::quiet`].
    pub(crate) fn release_channel<'k>(&self, key: &'k str) -> Arg<'k> {
        if self.quiet { Arg::Bytes(b"") } else { Arg::ReleaseChannel(key) }
    }
}

/// The keys of a hold: one, inline, except for a multi-resource lock. Cloned into the
/// registrations of its undos, which costs an allocation only for several keys.
pub(crate) type Keys = smallvec::SmallVec<[Arc<str>; 1]>;

/// What names one hold of any kind.
#[derive(Debug)]
pub(crate) struct Identity {
    /// What errors and logs call the kind.
    pub(crate) kind: &'static str,
    /// The keys the hold occupies on a node.
    pub(crate) keys: Keys,
    /// A fresh random token, unique to this hold.
    pub(crate) token: crate::token::Token,
}

impl Identity {
    /// A hold of kind `kind` on `keys`, with a fresh token (carrying the client's owner
    /// label, if any).
    pub(crate) fn new(kind: &'static str, keys: Keys, label: Option<&str>) -> Self {
        let token = crate::token::generate_labelled(label);
        Self { kind, keys, token }
    }
}

/// One lock kind's dialogue with one node.
///
/// Every command must be safe to run twice (a re-sent request after a dropped connection,
/// [`crate::command::Resend::Safe`]): each hold has its own token, and every operation
/// compares it before it changes anything.
pub(crate) trait Protocol: Send + Sync + 'static {
    /// What names this hold: its kind, its keys, its token.
    fn identity(&self) -> &Identity;

    /// What errors and logs call this kind: "lock", "reentrant lock", ...
    fn kind(&self) -> &'static str {
        self.identity().kind
    }

    /// The keys the lock occupies on a node (one, except for a multi-resource lock).
    fn keys(&self) -> &Keys {
        &self.identity().keys
    }

    /// The token that identifies this hold on the nodes.
    fn token(&self) -> &str {
        self.identity().token.as_str()
    }

    /// The command for `op`, built once per round (see [`Args`]). Creates and renewals are
    /// [`Command::creating`].
    fn command(&self, op: Op, args: &Args) -> Command;

    /// What `reply` to `op` means.
    fn answer(&self, op: Op, reply: &Reply) -> Answer;

    /// Whether this hold excludes every other on its keys, and its release removes every
    /// hold there (a plain or multi-resource lock, a write share); false for those that
    /// may coexist with others (a reentrant owner's holds, a read share). A new wait for
    /// such a hold queues behind this client's waiters already in line for the key,
    /// instead of trying at once (barging in would split the nodes' votes at the next
    /// handoff), and while this client holds it, its waiters do not poll it.
    fn is_exclusive(&self) -> bool {
        false
    }

    /// Notes who holds the key on node `node`, if `reply` (to an acquisition) says so: a
    /// refusal then tells a split vote from a holder of a quorum. Kinds whose replies do
    /// not name the holder note nothing (their refusals are never called split votes
    /// unless too few nodes refused).
    fn note_holder(&self, _node: usize, _reply: &Reply) {}

    /// The holders noted so far, by node.
    fn holders(&self) -> Vec<(usize, Arc<str>)> {
        Vec::new()
    }

    /// Whether an acquisition also records, on the nodes that refuse it, an intent that
    /// holds others back while its waiter waits (a writer with the default priority): a
    /// refused attempt still does something, which no other waiter's attempt does for it.
    fn records_intent(&self) -> bool {
        false
    }

    /// Where the attempts of the wait that records this intent went out (see
    /// [`Protocol::records_intent`]): its withdrawal goes behind them.
    fn intent_routes(&self) -> Option<&crate::node::Routes> {
        None
    }
}

/// The reading shared by the scripts that answer `1` (done), `2` (done, notification
/// refused), `0` (our hold is absent) or `-1` (another owner holds the lock).
pub(crate) fn script_answer(reply: &Reply) -> Answer {
    match &reply.value {
        Ok(Value::Int(1)) => NodeOutcome::Ok.into(),
        Ok(Value::Int(2)) => Answer { outcome: NodeOutcome::Ok, notify_refused: true },
        Ok(Value::Int(0)) => NodeOutcome::Absent.into(),
        Ok(Value::Int(-1)) => NodeOutcome::Held.into(),
        other => failed(other).into(),
    }
}

/// The outcome of a reply this library does not expect, or of a failure.
pub(crate) fn failed(value: &Result<Value, crate::failure::Failure>) -> NodeOutcome {
    match value {
        Ok(other) => NodeOutcome::Failed(format!("unexpected reply {other:?}").into()),
        Err(failure) => failure.outcome(),
    }
}

#[cfg(test)]
pub(crate) mod testing {
    //! Replies for the kinds' unit tests.

    use super::*;

    pub(crate) fn reply(value: Value) -> Reply {
        Reply::of(Ok(value))
    }

    pub(crate) fn error(code: &str) -> Reply {
        let failure = crate::failure::Failure::Server {
            code: code.into(),
            message: format!("{code} test").into(),
        };
        Reply::of(Err(failure))
    }
}
