//! Fencing tokens ordered with grants, fixed after the acquisition is decided.
//!
//! Every resource has a counter on every node, under [`FENCE_NAMESPACE`] + its key (a
//! namespace no lock key may enter). Once an acquisition is granted (and before the lock is
//! handed out), two more rounds run:
//!
//! 1. **Read**: `GET` the counter on every node until a quorum answered; `m` is the highest
//!    value read (a missing counter reads as 0).
//! 2. **Write**: raise the counter to `t = m + 1` (never lowering it) on every node until a
//!    quorum confirmed. The lock is handed out with token `t` only if this completes before
//!    its validity deadline; otherwise the attempt fails and is taken back.
//!
//! # Why a later grant always gets a larger token
//! Let grant `G1` get token `t1`, its write round confirmed on a quorum `W1` at time `w1`
//! (before its deadline `D1`), and let `G2` be any grant handed out after `G1`, by any
//! client. `G2`'s acquisition quorum `Q2` and `G1`'s acquisition quorum `Q1` share a node
//! `n`. `n` granted `G2` only once `G1`'s hold was gone from it: released (after `G1` was
//! handed out, so after `w1`) or expired (at `D1` or later, under the model's bounded
//! drift, so after `w1`). `G2`'s acquisition was decided after `n` granted it, so `G2`'s
//! read round starts after `w1`. Its read quorum shares a node `k` with `W1`, where the
//! counter was already at least `t1` at `w1`, and counters never decrease. So `G2` reads at
//! least `t1`, and `t2 = max + 1 > t1`.
//!
//! Nothing here depends on when counters were bumped during earlier acquisitions (the
//! earlier design bumped them in the acquire round itself, which a later grant could read
//! before an earlier grant's raise arrived: a later grant got a smaller token). Failed
//! attempts never touch counters; a write round that reached only a minority leaves
//! counters higher than needed, which only makes later tokens larger.
//!
//! # Limits
//! - Counters must survive restarts, like the keys (`appendfsync always`): a node that
//!   comes back empty may be the only node `k` above, and a later token can then repeat
//!   an earlier one. Restart quarantine does not help here: a lost counter stays lost.
//! - Counters never expire: one small string per fenced resource, forever.
//! - Costs two round trips after the acquisition.

use std::sync::Arc;
use std::sync::atomic::{AtomicU64, Ordering};
use std::time::Instant;

use redis::Value;

use crate::command::{self, Command, Resend};
use crate::config::FENCE_NAMESPACE;
use crate::error::{Error, ErrorKind, NodeOutcome};
use crate::quorum::{Settled, Tally};

use super::Core;
use super::call::NodeCall;
use super::protocol::Answer;
use super::round;
use super::slot::Slots;

/// The key of the fencing counter of the lock key `key`.
pub(crate) fn counter_key(key: &str) -> String {
    format!("{FENCE_NAMESPACE}{key}")
}

/// Fixes the token of a grant of `key` that is valid until `deadline`.
pub(crate) async fn fix_token(
    core: &Arc<Core>,
    key: &str,
    resource: &str,
    deadline: Instant,
) -> Result<u64, Error> {
    let counter = counter_key(key);
    let highest = Arc::new(AtomicU64::new(0));
    let get = {
        let mut cmd = redis::cmd("GET");
        cmd.arg(&counter);
        Command::plain(cmd, Resend::Safe)
    };
    let seen = highest.clone();
    let read = run(core, get, move |reply| read_counter(&reply.value, &seen)).await;
    let token = match read.settled {
        Settled::Reached => highest.load(Ordering::Acquire).checked_add(1),
        Settled::Failed(kind) => return Err(failure(core, kind, "read", resource, &read)),
    };
    let Some(token) = token else {
        let message = "the fencing counter is at its maximum";
        return Err(Error::round(
            ErrorKind::WrongType,
            message,
            resource,
            read.report(&core.nodes),
        ));
    };
    let raise = Command::script(
        &command::FENCE_RAISE,
        &[counter.as_str()],
        &[token.to_string().as_bytes()],
        Resend::Safe,
    );
    let write = run(core, raise, |reply| match &reply.value {
        Ok(Value::Int(1)) => NodeOutcome::Ok.into(),
        other => super::protocol::failed(other).into(),
    })
    .await;
    match write.settled {
        Settled::Reached if write.decided_at < deadline => Ok(token),
        Settled::Reached => Err(failure(core, ErrorKind::Expired, "write", resource, &write)),
        Settled::Failed(kind) => Err(failure(core, kind, "write", resource, &write)),
    }
}

/// One fencing round on every node, decided at the quorum.
async fn run<R>(core: &Arc<Core>, command: Command, read: R) -> round::Round
where
    R: Fn(&crate::node::Reply) -> Answer + Clone + Send + 'static,
{
    let command = Arc::new(command);
    let slots = Slots::new(core.nodes.len());
    let at = crate::clock::now();
    let requests = round::Rest::new(
        &slots,
        (0..core.nodes.len()).map(|i| {
            // Quarantined nodes may have lost their counters: their answers do not count.
            let request = NodeCall::check(i, command.clone(), slots.get(i), at);
            request.send(core, read.clone())
        }),
    );
    let (round, rest) = round::run(requests, at, settle, &core.nodes).await;
    round::finish(&core.tasks, rest);
    round
}

/// A fencing round is reached at a quorum; it fails as `WrongType` when more nodes than
/// may fail hold a counter that is not a number, else as `Unavailable`.
fn settle(t: &Tally) -> Option<Settled> {
    let quorum = crate::quorum::quorum(t.nodes);
    let spare = t.nodes - quorum;
    if t.ok >= quorum {
        Some(Settled::Reached)
    } else if t.ok + t.pending >= quorum {
        None
    } else if t.wrong_type > spare {
        Some(Settled::Failed(ErrorKind::WrongType))
    } else if t.wrong_type + t.pending > spare {
        None
    } else {
        Some(Settled::Failed(ErrorKind::Unavailable))
    }
}

/// Reads one node's counter into `highest`.
fn read_counter(value: &Result<Value, crate::failure::Failure>, highest: &AtomicU64) -> Answer {
    let count = match value {
        Ok(Value::Nil) => Some(0),
        Ok(Value::BulkString(bytes)) => {
            std::str::from_utf8(bytes).ok().and_then(|s| s.parse().ok())
        }
        other => return super::protocol::failed(other).into(),
    };
    match count {
        Some(count) => {
            highest.fetch_max(count, Ordering::AcqRel);
            NodeOutcome::Ok.into()
        }
        None => NodeOutcome::WrongType.into(),
    }
}

fn failure(
    core: &Core,
    kind: ErrorKind,
    round_name: &str,
    resource: &str,
    round: &round::Round,
) -> Error {
    let message =
        format!("the fencing token could not be fixed on a quorum in time ({round_name} round)");
    Error::round(kind, message, resource, round.report(&core.nodes))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn counters_read_as_numbers_or_as_a_wrong_type() {
        let highest = AtomicU64::new(3);
        assert_eq!(read_counter(&Ok(Value::Nil), &highest).outcome, NodeOutcome::Ok);
        let nine = Ok(Value::BulkString(b"9".to_vec()));
        assert_eq!(read_counter(&nine, &highest).outcome, NodeOutcome::Ok);
        assert_eq!(highest.load(Ordering::Acquire), 9);
        let text = Ok(Value::BulkString(b"x".to_vec()));
        assert_eq!(read_counter(&text, &highest).outcome, NodeOutcome::WrongType);
        let big = Ok(Value::BulkString(u64::MAX.to_string().into_bytes()));
        assert_eq!(read_counter(&big, &highest).outcome, NodeOutcome::Ok);
        assert_eq!(highest.load(Ordering::Acquire), u64::MAX);
    }

    #[test]
    fn no_lock_key_is_a_counter_key() {
        assert_eq!(counter_key("orders:1"), "redlock:fence:orders:1");
    }
}
