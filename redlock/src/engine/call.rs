//! One call to one node (a command and what it must wait for), and the ordering rules
//! every call follows:
//!
//! - it goes out only after the requests it must follow on that node: for an undo, once
//!   the request it undoes is over; for an acquisition, once this client's undos still in
//!   flight on the same key went out (the node runs them first: they share its one
//!   connection, and an acquisition needs their effect, not their answers); one lost with
//!   that connection goes out once more after them, once they are over;
//! - its own exchange with the node is bounded by the node timeout; an acquisition's wait
//!   counts against it too (it is worthless once the round is over), an undo's does not
//!   (an undo whose clock ran while it waited could time out before it is even queued);
//! - whatever happens to it (answered, timed out, dropped unsent), its slot settles, so
//!   that nothing waits for it forever;
//! - an undo lost with a connection that broke, or that could not be opened (a reset, not
//!   a refusal or a timeout), is sent again on a new one, a few times after short pauses,
//!   before its slot settles: it is safe to repeat, and without this a reset leaves the
//!   key for a whole lease (the background retries only undos that timed out).

use std::future::Future;
use std::sync::Arc;
use std::time::Duration;

use crate::command::{Command, Resend};
use crate::error::NodeOutcome;
use crate::node::{Node, Reply};
use crate::telemetry;

use super::Core;
use super::protocol::{Answer, Op};
use super::slot::{SettleOnDrop, Slot};
use super::undo::After;

/// A call to node `node`, ready to be sent.
pub(crate) struct NodeCall {
    pub(crate) node: usize,
    pub(crate) op: Op,
    pub(crate) command: Arc<Command>,
    /// What must be over on the node before it goes out: the claim's previous request
    /// there, if any, and `after`.
    pub(crate) previous: Option<Slot>,
    pub(crate) after: After,
    /// Settled when it is over.
    pub(crate) slot: Slot,
}

impl NodeCall {
    /// A read-only check of node `node`, ordered after nothing: it changes nothing, so it
    /// may overtake whatever is in flight.
    pub(crate) fn check(node: usize, command: Arc<Command>, slot: Slot) -> NodeCall {
        NodeCall { node, op: Op::Check, command, previous: None, after: After::new(), slot }
    }

    /// The request as a future answering `(node, outcome)`; `read` says what the reply
    /// means.
    pub(crate) fn send<R>(
        self,
        core: &Core,
        read: R,
    ) -> impl Future<Output = (usize, NodeOutcome)> + Send + 'static + use<R>
    where
        R: FnOnce(&Reply) -> Answer + Send + 'static,
    {
        let Self { node: i, op, command, previous, after, slot } = self;
        let node = core.nodes[i].clone();
        let timeout = core.config.node_timeout;
        // Made before the future: a request dropped before its first poll settles too.
        let mut turn = SettleOnDrop::new(slot, previous);
        async move {
            let started = telemetry::request_started();
            let reply = if op == Op::Acquire {
                let exchange = async {
                    turn.wait_behind(&after).await;
                    let reply = queued(node.send(&command), &turn).await;
                    if !reply.is_lost() || after.is_empty() {
                        return reply;
                    }
                    // Rare: boxed, so that every request's future stays small.
                    Box::pin(acquire_again(&node, &command, &after, reply)).await
                };
                tokio::time::timeout(timeout, exchange).await
            } else {
                turn.wait_turn(&after).await;
                tokio::time::timeout(timeout, queued(node.send(&command), &turn)).await
            };
            let reply = match reply {
                Ok(reply) if reply.is_lost() && op.is_undo() => {
                    // Rare: boxed, so that every request's future stays small.
                    Box::pin(undo_again(&node, &command, timeout, reply)).await
                }
                reply => reply.ok(),
            };
            let Some(reply) = reply else {
                telemetry::node_request(node.name(), op.as_str(), "timed_out", started);
                return (i, NodeOutcome::TimedOut);
            };
            let mut answer = read(&reply);
            if answer.notify_refused {
                node.note_notify_refused();
            }
            if reply.resent && op.is_undo() && answer.outcome == NodeOutcome::Absent {
                // Re-sent after a dropped connection: the first send removed it.
                answer.outcome = NodeOutcome::Ok;
            }
            if answer.outcome == NodeOutcome::Ok && op.is_vote() && node.in_quarantine() {
                answer.outcome = NodeOutcome::Quarantined;
            }
            let outcome = telemetry::node_outcome(&answer.outcome);
            telemetry::node_request(node.name(), op.as_str(), outcome, started);
            (i, answer.outcome)
        }
    }
}

/// Runs `send` (a node's send), recording in `turn` after its first poll: the command is
/// then queued on the node's connection, ahead of any command queued there later.
async fn queued<F: Future>(send: F, turn: &SettleOnDrop) -> F::Output {
    let mut send = std::pin::pin!(send);
    let mut first = true;
    std::future::poll_fn(|cx| {
        let polled = send.as_mut().poll(cx);
        if std::mem::take(&mut first) {
            turn.went_out();
        }
        polled
    })
    .await
}

/// Sends a lost acquisition (`first`) once more, once the undos it followed (`after`) are
/// over: it went out right behind them on their connection, and was lost with it; they are
/// sent again on a new one (see [`undo_again`]), and going out ahead of them there, it
/// would find this client's own stale key. Safe to repeat, like every acquisition.
async fn acquire_again(node: &Node, command: &Command, after: &[Slot], first: Reply) -> Reply {
    if command.resend() != Resend::Safe {
        return first;
    }
    for slot in after {
        slot.settled().await;
    }
    let again = node.send(command).await;
    Reply { resent: first.resent || first.written || again.resent, ..again }
}

/// Pauses before a lost undo goes out again: the first is short (a reset connection is
/// usually replaced at once), the last lets a node that resets every connection for a
/// moment recover.
const UNDO_AGAIN: [Duration; 3] =
    [Duration::from_millis(10), Duration::from_millis(50), Duration::from_millis(200)];

/// Sends a lost undo (`first`) again until it is no longer lost (answered, refused), the
/// pauses run out, or a try times out (`None`). The reply is marked re-sent once a try
/// was written on a connection that broke: that try may have run, and "absent" then
/// means done. A try that found no connection sent nothing, so its "absent" means absent.
async fn undo_again(
    node: &Node,
    command: &Command,
    timeout: Duration,
    first: Reply,
) -> Option<Reply> {
    if command.resend() != Resend::Safe {
        return Some(first);
    }
    let mut may_have_run = first.resent || first.written;
    let mut reply = first;
    for pause in UNDO_AGAIN {
        tokio::time::sleep(pause).await;
        let again = tokio::time::timeout(timeout, node.send(command)).await.ok()?;
        let resent = may_have_run || again.resent;
        may_have_run = resent || again.written;
        reply = Reply { resent, ..again };
        if !reply.is_lost() {
            break;
        }
    }
    Some(reply)
}

impl Op {
    /// Whether the node's yes counts toward a quorum (not while it is in restart
    /// quarantine: it may have forgotten a lock it granted before its restart).
    fn is_vote(self) -> bool {
        matches!(self, Self::Acquire | Self::Extend | Self::Check)
    }

    /// Whether the request takes something back.
    pub(crate) fn is_undo(self) -> bool {
        matches!(self, Self::Release | Self::CleanUp)
    }
}
