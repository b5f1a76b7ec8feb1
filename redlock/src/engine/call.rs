//! One call to one node, and the rules every call follows:
//!
//! - it goes out at once: nothing waits for another request, but an undo goes out behind
//!   the creates of its hold not answered yet, on their connection, and a create is not
//!   sent once an undo of its hold was issued (see [`crate::route`]);
//! - a node with no connection yet is first given the connect timeout to open one
//!   (TCP, TLS, AUTH, the script preload and the server check are several round trips, too many for a node timeout sized for one), unless its last
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
use std::time::{Duration, Instant};

use crate::command::{Command, Resend};
use crate::error::NodeOutcome;
use crate::failure::Failure;
use crate::node::{Connected, Node, Renewal, Reply, Route, Undo};
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
    /// When its round started (read once per round): no send of it goes out before, and
    /// its bounds count from there.
    pub(crate) at: Instant,
    /// Its hold's route on the node (see [`crate::route`]): a create or extension is not
    /// sent once an undo was issued, and an undo goes behind them.
    pub(crate) route: Option<Route>,
    /// A create's second route, recorded too: its wait's (see `Protocol::intent_routes`).
    pub(crate) also: Option<Route>,
    /// An undo goes to every node, also where nothing of its hold went out: a writer's
    /// release withdraws the intent its wait's earlier attempts may have left there.
    pub(crate) everywhere: bool,
}

impl NodeCall {
    /// A read-only check of node `node`.
    pub(crate) fn check(node: usize, command: Arc<Command>, slot: Slot, at: Instant) -> NodeCall {
        NodeCall {
            node,
            op: Op::Check,
            command,
            slot,
            since: 0,
            at,
            route: None,
            also: None,
            everywhere: false,
        }
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
        let Self { node: i, op, command, slot, since, at, route, also, everywhere } = self;
        let node = core.nodes[i].clone();
        let (connect_timeout, timeout) = (core.config.connect_timeout, core.config.node_timeout);
        // The latest a create of this call may go out, whenever its future is polled (its
        // caller's runtime may sit idle or blocked with it in flight): what the claim's
        // re-sends of its undos count on (a connect timeout, then a node timeout for a send
        // again on a new connection). Past it the create is not sent.
        let by = command.creates().then(|| at + timing::sent_within(connect_timeout, timeout));
        // Read now, as the round begins: its claim counts from what the nodes were then.
        let outright = node.refuses_scripts();
        let renews = (op == Op::Extend).then_some(Renewal { at, outright });
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
            // An undo goes behind what it undoes, on its connection; where nothing of the
            // hold went out, nothing will, and there is nothing to undo (unless the kind
            // leaves something of earlier attempts there: a writer's intent).
            let (route, behind) = match route {
                Some(route) if op.is_undo() => match route.undo() {
                    Undo::Behind(handle) => (None, Some(handle)),
                    Undo::Nothing if !everywhere => return (i, NodeOutcome::Absent),
                    Undo::Nothing | Undo::Anywhere => (None, None),
                },
                route => (route, None),
            };
            let reply = exchange(
                || async {
                    match behind {
                        Some(handle) => Ok(Connected::on(handle)),
                        None => node.connect_first().await,
                    }
                },
                timeout,
                |connected| {
                    let bounds = (by, route.as_ref(), also.as_ref(), renews);
                    node.send(&command, bounds, connected)
                },
            );
            let reply = match reply.await {
                Some(reply) if reply.is_lost() && op.is_undo() => {
                    // Rare: boxed, so that every request's future stays small.
                    Box::pin(undo_again(&node, &command, timeout, reply, since)).await
                }
                reply => reply,
            };
            if let Some(hangs) = reply.as_ref().map_or(Some(true), Reply::hangs) {
                node.set_hung(hangs);
            }
            let Some(reply) = reply else {
                telemetry::node_request(node.name(), op.as_str(), "timed_out", started);
                return (i, NodeOutcome::TimedOut);
            };
            let mut answer = read(&reply);
            if reply.resent
                && op == Op::Release
                && matches!(answer.outcome, NodeOutcome::Absent | NodeOutcome::Held)
            {
                // An earlier send may have removed the hold (nothing on the node tells): a
                // release sent again counts as done whatever it finds. It cannot tell its
                // own removal from an operator's forced release meanwhile.
                answer.outcome = NodeOutcome::Ok;
            }
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

/// One exchange with a node: `connect` (the wait for its connection, which bounds
/// itself: see `Node::connect_first`), then `send`, given `timeout` from the moment the
/// connection is there; `None` when the request ran out of it.
///
/// `connect` makes the wait when called: a wait passed in would keep its place in the
/// request beside the send's (an argument's is never reused), and a round moves each of
/// its requests once (about 0.1 instruction per byte).
async fn exchange<C, W, T, S, F>(connect: C, timeout: Duration, send: S) -> Option<Reply>
where
    C: FnOnce() -> W,
    W: Future<Output = Result<T, Failure>>,
    S: FnOnce(T) -> F,
    F: Future<Output = Reply>,
{
    match connect().await {
        Err(failure) => Some(Reply::unconnected(failure)),
        Ok(connected) => tokio::time::timeout(timeout, send(connected)).await.ok(),
    }
}

/// Sends a lost undo (`first`) again until it is no longer lost (answered, refused), the
/// pauses run out, or a try times out (`None`). Every undo is safe to repeat; the reply of
/// a send again is marked [resent](Reply::resent). Not sent again while no connection
/// opened since generation `since`: what it undoes never left the client either.
async fn undo_again(
    node: &Node,
    command: &Command,
    timeout: Duration,
    first: Reply,
    since: u64,
) -> Option<Reply> {
    if command.resend() != Resend::Safe {
        return Some(first);
    }
    let reached = || node.may_have_reached(since);
    let send = || node.send(command, (None, None, None, None), Connected::default());
    let resend = || tokio::time::timeout(timeout, send());
    resend_lost(first, reached, resend).await
}

/// [`undo_again`]'s pacing, with the node behind two seams: `reached` says whether what the
/// undo undoes may have left the client, `send` sends it once more (`Err` when that try
/// timed out).
async fn resend_lost<S, F>(first: Reply, reached: impl Fn() -> bool, mut send: S) -> Option<Reply>
where
    S: FnMut() -> F,
    F: Future<Output = Result<Reply, tokio::time::error::Elapsed>>,
{
    let mut reply = first;
    for pause in timing::UNDO_AGAIN {
        if !reached() {
            break;
        }
        tokio::time::sleep(pause).await;
        let answer = send().await.ok()?;
        // Exact only while no earlier send may have reached the node.
        let (resent, sent) = (reply.resent || reply.sent, reply.sent || answer.sent);
        reply = Reply { resent: resent || answer.resent, sent, ..answer };
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

#[cfg(test)]
mod tests {
    use std::sync::Mutex;

    use redis::Value;
    use tokio::time::Instant;

    use super::*;

    fn lost() -> Reply {
        Reply::unconnected(Failure::Unreachable("reset".into()))
    }

    /// Lost with a connection that dropped with it sent: it may have run.
    fn dropped() -> Reply {
        Reply { sent: true, ..lost() }
    }

    fn answered() -> Reply {
        Reply::of(Ok(Value::Int(1)))
    }

    #[tokio::test(start_paused = true)]
    async fn a_request_is_given_the_node_timeout_once_its_connection_is_there() {
        let timeout = Duration::from_millis(50);
        let start = Instant::now();
        // A connect of 800 ms (bounded by the connect timeout, not this one), then a node
        // that never answers: timed out a node timeout after the connection was there.
        let connected = async {
            tokio::time::sleep(Duration::from_millis(800)).await;
            Ok(())
        };
        let reply = exchange(|| connected, timeout, |()| std::future::pending::<Reply>()).await;
        assert!(reply.is_none(), "timed out");
        assert_eq!(start.elapsed(), Duration::from_millis(850));
        // An answer within the node timeout is the reply.
        let start = Instant::now();
        let slow = |()| async {
            tokio::time::sleep(Duration::from_millis(49)).await;
            answered()
        };
        let reply = exchange(|| async { Ok(()) }, timeout, slow).await;
        assert!(matches!(reply, Some(Reply { value: Ok(Value::Int(1)), resent: false, .. })));
        assert_eq!(start.elapsed(), Duration::from_millis(49));
        // A connect that failed sends nothing, and is a reply of its own at once.
        let refused = async { Err(Failure::Refused("refused".into())) };
        let sent = std::cell::Cell::new(false);
        let reply = exchange(
            || refused,
            timeout,
            |()| {
                sent.set(true);
                std::future::pending::<Reply>()
            },
        )
        .await;
        assert!(reply.is_some_and(|reply| reply.hangs().is_none()), "unreachable");
        assert!(!sent.get());
    }

    /// When each send of a lost undo went out, after the first, from the start of the test.
    async fn resends(replies: Vec<Option<Reply>>, reached: bool) -> (Option<Reply>, Vec<Duration>) {
        let start = Instant::now();
        let timeout = Duration::from_millis(50);
        let sent = Mutex::new(Vec::new());
        let replies = Mutex::new(replies.into_iter());
        let send = || {
            sent.lock().unwrap().push(start.elapsed());
            let reply = replies.lock().unwrap().next().flatten();
            async move {
                match reply {
                    Some(reply) => Ok(reply),
                    None => tokio::time::timeout(timeout, std::future::pending()).await,
                }
            }
        };
        let reply = resend_lost(lost(), || reached, send).await;
        (reply, sent.into_inner().unwrap())
    }

    #[tokio::test(start_paused = true)]
    async fn a_lost_undo_is_sent_again_after_10_50_and_200_ms_until_it_is_answered() {
        let ms = Duration::from_millis;
        let (reply, sent) = resends(vec![Some(lost()), Some(lost()), Some(lost())], true).await;
        assert_eq!(sent, [ms(10), ms(60), ms(260)], "the pauses of UNDO_AGAIN");
        assert!(reply.is_some_and(|reply| reply.is_lost()), "lost still: the round counts it");
        let (reply, sent) = resends(vec![Some(lost()), Some(answered())], true).await;
        assert_eq!(sent, [ms(10), ms(60)], "no more once answered");
        assert!(reply.is_some_and(|reply| !reply.is_lost() && !reply.resent), "none left before");
        let (reply, _) = resends(vec![Some(dropped()), Some(answered())], true).await;
        assert!(reply.is_some_and(|reply| reply.resent), "after one that may have run: resent");
        let (reply, sent) = resends(vec![Some(lost()), None, Some(answered())], true).await;
        assert_eq!(sent, [ms(10), ms(60)], "no more once a try timed out");
        assert!(reply.is_none(), "timed out");
    }

    #[tokio::test(start_paused = true)]
    async fn a_lost_undo_is_not_sent_again_where_nothing_it_undoes_left_the_client() {
        let (reply, sent) = resends(vec![Some(answered())], false).await;
        assert!(sent.is_empty());
        assert!(reply.is_some_and(|reply| reply.is_lost()), "the first send's answer");
    }
}
