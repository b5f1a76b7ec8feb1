//! One call to one node, and the rules every call follows:
//!
//! - it goes out at once: nothing waits for another request (a create carries a deadline
//!   and respects its token's tombstone, an undo leaves the tombstone, so their order on a
//!   node does not matter: see `guide::order`);
//! - a node with no connection yet is first given the connect timeout to open one
//!   (TCP, TLS, AUTH, the script preload, the server check and the clock reading are
//!   several round trips, too many for a node timeout sized for one), unless its last
//!   connect failed; a round is still decided at the quorum without waiting for it, and
//!   validity counts from the round's start, so a slow connect only shortens the lease;
//! - its own exchange with the node is bounded by the node timeout;
//! - whatever happens to it (answered, timed out, dropped unsent), its slot settles, so
//!   that it no longer counts as in flight;
//! - an undo lost with a connection that broke, or that could not be opened, is sent again
//!   on a new one a few times after short pauses before its round counts it (the
//!   background then goes on: see `background`); but not where no connection to the node
//!   opened since what it undoes was made (`since`): then nothing it undoes left the
//!   client (a refused certificate or login).

use crate::timing;
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

/// A call to node `node`, ready to be sent.
pub(crate) struct NodeCall {
    pub(crate) node: usize,
    pub(crate) op: Op,
    pub(crate) command: Arc<Command>,
    /// Settled when it is over.
    pub(crate) slot: Slot,
    /// The node's connection generation when the first request this call undoes was made
    /// (0: the client's start, when not known).
    pub(crate) since: u64,
}

impl NodeCall {
    /// A read-only check of node `node`.
    pub(crate) fn check(node: usize, command: Arc<Command>, slot: Slot) -> NodeCall {
        NodeCall { node, op: Op::Check, command, slot, since: 0 }
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
        let Self { node: i, op, command, slot, since } = self;
        let node = core.nodes[i].clone();
        let timeout = core.config.node_timeout;
        // The latest a create of this call may go out, whenever its future is polled (its
        // caller's runtime may sit idle or blocked with it in flight): what the claim's
        // horizon counts on (a connect timeout, then a node timeout for a send again on a
        // new connection). Past it the create is not sent, so it cannot outlive its undo.
        let by = crate::clock::now() + core.config.connect_timeout + timeout;
        // Made before the future: a request dropped before its first poll settles too.
        let settle = SettleOnDrop::new(slot);
        async move {
            let _settle = settle;
            let started = telemetry::request_started();
            if op == Op::CleanUp && !node.may_have_reached(since) {
                // The attempt it cleans up is over and never left the client: no connection
                // opened since. A send would only cost a connect that fails like the
                // attempt's.
                return (i, NodeOutcome::Absent);
            }
            let reply = match node.connect_first().await {
                Err(failure) => Ok(Reply::unconnected(failure)),
                Ok(()) => tokio::time::timeout(timeout, node.send(&command, timeout, by)).await,
            };
            let reply = match reply {
                Ok(reply) if reply.is_lost() && op.is_undo() => {
                    // Rare: boxed, so that every request's future stays small.
                    Box::pin(undo_again(&node, &command, (timeout, by), reply, since)).await
                }
                reply => reply.ok(),
            };
            if let Some(hangs) = reply.as_ref().map_or(Some(true), Reply::hangs) {
                node.set_hung(hangs);
            }
            let Some(reply) = reply else {
                telemetry::node_request(node.name(), op.as_str(), "timed_out", started);
                return (i, NodeOutcome::TimedOut);
            };
            let mut answer = read(&reply);
            if answer.notify_refused {
                node.note_notify_refused();
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

/// Sends a lost undo (`first`) again until it is no longer lost (answered, refused), the
/// pauses run out, or a try times out (`None`). Every undo is safe to repeat, and its
/// tombstone makes a repeat answer what the first send did. Not sent again while no
/// connection opened since generation `since`: what it undoes never left the client
/// either.
async fn undo_again(
    node: &Node,
    command: &Command,
    (timeout, by): (Duration, std::time::Instant),
    first: Reply,
    since: u64,
) -> Option<Reply> {
    if command.resend() != Resend::Safe {
        return Some(first);
    }
    let mut reply = first;
    for pause in timing::UNDO_AGAIN {
        if !node.may_have_reached(since) {
            break;
        }
        tokio::time::sleep(pause).await;
        reply = tokio::time::timeout(timeout, node.send(command, timeout, by)).await.ok()?;
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
