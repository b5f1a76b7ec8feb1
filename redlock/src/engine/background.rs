//! Undos left to the background once their round was decided: the releases and clean-ups
//! of the nodes that had not answered yet.
//!
//! Rules, each for a reason:
//! - They stay registered with the client's undos until they are over: a shutdown names
//!   their nodes.
//! - They run on the caller's runtime when there is one: a hop to another thread per
//!   request costs more than the request itself under load. If that runtime ends first (a
//!   short-lived runtime, a test's), the nodes that had not answered are handed over to the
//!   client's own thread and their undos sent again (every undo is safe to repeat): an undo
//!   dropped unsent would leave its key for a whole lease.
//! - An undo that timed out, could not reach its node (a reset, a node down that may come
//!   back with its data) or was put off by it (`LOADING`, `BUSY`: see [`may_pass`]) is
//!   sent again, after pauses that double up to a second, until it
//!   is answered or nothing it removes can exist any more (every create of its hold has
//!   gone out or never will, and what it set has expired). Every undo is safe to repeat,
//!   and goes behind its hold's unanswered creates (see [`crate::route`]); not where no
//!   connection opened since what it undoes was made (nothing left the client).
//! - Failures that remain are counted and logged, never silent.

use crate::timing;
use std::future::Future;
use std::sync::{Arc, Mutex, MutexGuard, PoisonError};
use std::task::Poll;
use std::time::{Duration, Instant};

use futures::future::BoxFuture;
use futures::stream::FuturesUnordered;
use futures::{FutureExt, StreamExt};
use smallvec::SmallVec;

use crate::error::NodeOutcome;

use crate::command::Command;
use crate::node::Reply;

use super::Core;
use super::call::NodeCall;
use super::protocol::{Answer, Keys, Op};
use super::round::Rest;
use super::slot::{Slot, Slots};
use super::undo::Tracked;
use crate::node::Routes;

/// Makes a fresh undo request for a node, settling the given slot when over, and
/// registered with the client's undos while in flight. A plain closure, kept by value:
/// most rounds never remake anything.
pub(crate) trait Remake:
    Fn(usize, Slot) -> BoxFuture<'static, (usize, NodeOutcome)> + Clone + Send + Sync + 'static
{
}

impl<T> Remake for T where
    T: Fn(usize, Slot) -> BoxFuture<'static, (usize, NodeOutcome)> + Clone + Send + Sync + 'static
{
}

/// The [`Remake`] of `op`'s `command` on `keys`, whose replies `read` reads; behind the
/// hold's creates where its `routes` tell where they went.
pub(crate) fn remake<R>(
    core: &Arc<Core>,
    (keys, routes): (&Keys, Option<Routes>),
    (op, command): (Op, &Arc<Command>),
    read: R,
) -> impl Remake + use<R>
where
    R: Fn(&Reply) -> Answer + Clone + Send + Sync + 'static,
{
    let (core, keys, command) = (core.clone(), keys.clone(), command.clone());
    move |node, slot| {
        let tracked = core.undos.track_one(node, &keys, &slot);
        let command = command.clone();
        // Sent again only after a connection opened: since any did.
        let (at, route) = (crate::clock::now(), routes.as_ref().map(|routes| routes.get(node)));
        // A node where nothing of the hold went out gets no first undo to send again.
        let request =
            NodeCall { node, op, command, slot, since: 0, at, route, also: None, everywhere: true };
        let call = request.send(&core, read.clone());
        async move {
            let answer = call.await;
            drop(tracked);
            answer
        }
        .boxed()
    }
}

/// What the background needs to finish, report, and send again the undos of one round.
#[derive(Clone)]
pub(crate) struct Undos<M> {
    pub(crate) core: Arc<Core>,
    pub(crate) remake: M,
    /// Every key these undos remove has expired by then: no point in sending them after.
    pub(crate) until: Instant,
    pub(crate) what: &'static str,
    pub(crate) resource: Arc<str>,
    /// Per node, the connection generation when the first request these undos undo was
    /// made: once it changed, an undo may travel on another connection than what it
    /// undoes, and nothing orders them.
    pub(crate) generations: Generations,
}

/// Where the undos run.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub(crate) enum Place {
    /// The caller's runtime if there is one, handed over to the client's own thread if it
    /// ends first.
    Caller,
    /// The client's own thread.
    Own,
}

/// Node indices, inline for up to seven.
pub(crate) type Nodes = SmallVec<[usize; 7]>;

/// Per node, a connection generation, inline for up to seven nodes.
pub(crate) type Generations = SmallVec<[u64; 7]>;

/// Answers a round took itself that the background must still handle: each is sent
/// again or reported as if the background had taken it.
pub(crate) type Taken = SmallVec<[(usize, NodeOutcome); 7]>;

/// Finishes `rest`, the undos still in flight on the nodes `pending`, in the background;
/// `taken` are answers of the round that it must handle as its own (see [`Taken`]);
/// `tracked` is the undos' registration, if any.
pub(crate) fn finish<F, M: Remake>(
    undos: Undos<M>,
    rest: Rest<F>,
    mut pending: Nodes,
    taken: Taken,
    tracked: Option<Tracked>,
    place: Place,
) where
    F: Future<Output = (usize, NodeOutcome)> + Send + 'static,
{
    // Made on the first retry: most rounds never need one.
    let mut retries: Option<Retries> = None;
    for (i, outcome) in taken {
        undos.core.undos.note_outcome(i, &outcome);
        if undos.sends_again(i, &outcome, &mut retries) {
            pending.push(i);
        } else {
            report(&undos, i, &outcome);
        }
    }
    if rest.is_empty() && retries.is_none() {
        return;
    }
    let tasks = undos.core.tasks.clone();
    let left = Arc::new(Mutex::new(Left { nodes: pending, taken: false }));
    // Built outside the task: a task dropped before its first poll still hands its undos on.
    let unfinished = Unfinished {
        left: left.clone(),
        undos: undos.clone(),
        hand_over: place == Place::Caller,
        _tracked: tracked,
    };
    // A current-thread runtime may sit idle with the task in flight: watched from the
    // client's own thread.
    let watched = (place == Place::Caller && on_current_thread_runtime()).then(|| undos.clone());
    let task = async move {
        let mut rest = rest;
        // Once only undos sent again after a failure are left: a shutdown names their
        // nodes rather than wait for them (see `Tasks::park`).
        let mut parked = None;
        loop {
            if rest.is_empty() && parked.is_none() {
                parked = Some(undos.core.tasks.park());
            }
            let Some((i, outcome)) = next(&mut rest, &mut retries).await else { break };
            {
                let mut left = lock(&unfinished.left);
                if left.taken {
                    // The client's own thread took the rest over: nothing more to do here.
                    break;
                }
                undos.core.undos.note_outcome(i, &outcome);
                if undos.sends_again(i, &outcome, &mut retries) {
                    continue;
                }
                left.nodes.retain(|node| *node != i);
            }
            report(&undos, i, &outcome);
        }
        drop(parked);
        drop(unfinished);
    };
    match place {
        Place::Caller => {
            tasks.spawn(task);
            if let Some(undos) = watched {
                take_over_if_idle(undos, left);
            }
        }
        Place::Own => drop(tasks.spawn_own(task)),
    }
}

/// Whether the caller runs on a current-thread runtime: it runs its tasks only while its
/// `block_on` does, which a synchronous wrapper calls now and then.
fn on_current_thread_runtime() -> bool {
    tokio::runtime::Handle::try_current().is_ok_and(|runtime| {
        runtime.runtime_flavor() == tokio::runtime::RuntimeFlavor::CurrentThread
    })
}

/// How long undos left on a caller's runtime may take there before the client's own
/// thread takes them over: a connect, then a node timeout for the send and each of its
/// quick re-sends after a lost connection, and their pauses.
fn idle_after(core: &Core) -> Duration {
    let config = &core.config;
    let sends = u32::try_from(timing::UNDO_AGAIN.len() + 1).unwrap_or(u32::MAX);
    let pauses: Duration = timing::UNDO_AGAIN.iter().sum();
    config.connect_timeout + config.node_timeout.saturating_mul(sends) + pauses
}

/// Watches undos left on a current-thread runtime from the client's own thread: a
/// current-thread runtime may sit idle with them in flight (a synchronous wrapper between
/// two calls), so that an undo lost with its connection would not be sent again until the
/// next call, and its key would stay meanwhile. Once [`idle_after`] has passed, the nodes
/// still unanswered get their undos anew on the own thread (every undo is safe to repeat,
/// and answers as the first send would), and the caller's task stops at its next answer.
/// Their first sends went out in the round: nothing is needed sooner.
fn take_over_if_idle<M: Remake>(undos: Undos<M>, left: Arc<Mutex<Left>>) {
    let tasks = undos.core.tasks.clone();
    let after = idle_after(&undos.core);
    let watch = async move {
        // Not waited for by a shutdown: it only stands by for undos already sent.
        let _parked = undos.core.tasks.park();
        tokio::time::sleep(after).await;
        let nodes = {
            let mut left = lock(&left);
            if left.nodes.is_empty() {
                return;
            }
            left.taken = true;
            std::mem::take(&mut left.nodes)
        };
        let slots = Slots::new(undos.core.nodes.len());
        let remake = undos.remake.clone();
        let requests = Rest::new(&slots, nodes.iter().map(|&i| remake(i, slots.get(i))));
        finish(undos, requests, nodes, Taken::new(), None, Place::Own);
    };
    drop(tasks.spawn_own(watch));
}

/// The nodes whose undo has not answered yet, and whether the client's own thread took
/// them over (see [`take_over_if_idle`]).
struct Left {
    nodes: Nodes,
    taken: bool,
}

fn lock(left: &Mutex<Left>) -> MutexGuard<'_, Left> {
    left.lock().unwrap_or_else(PoisonError::into_inner)
}

impl<M: Remake> Undos<M> {
    /// Sends node `i`'s undo again if it failed for a reason that may pass (a timeout, a
    /// reset, a node down that may come back with its data) while what it undoes may have
    /// reached the node (see the module's rules); `false` if it is over.
    fn sends_again(&self, i: usize, outcome: &NodeOutcome, retries: &mut Option<Retries>) -> bool {
        may_pass(outcome)
            && self.core.nodes[i].may_have_reached(self.generations[i])
            && retries.get_or_insert_with(|| Retries::new(self.core.nodes.len())).again(
                i,
                self.until,
                &self.remake,
            )
    }
}

/// Whether an undo failed for a reason that may pass: it timed out (the node may be hung,
/// with what it undoes still to run), could not reach its node (a reset, a node down that
/// may come back with its data), the node said it could not run it yet (see
/// [`crate::failure::is_put_off`]), or the node refused the client's login or certificate
/// (credentials or certificates being rotated). Not a command refused by the ACL, nor an
/// answer: sending it again changes nothing.
pub(crate) fn may_pass(outcome: &NodeOutcome) -> bool {
    match outcome {
        NodeOutcome::TimedOut | NodeOutcome::Unreachable(_) => true,
        NodeOutcome::Failed(message) => crate::failure::is_put_off(message),
        // A refused login or certificate may be a rotation under way: the undo is not
        // given up before its horizon. A command refused by the ACL stays refused.
        NodeOutcome::Denied(message) => !message.starts_with("NOPERM"),
        _ => false,
    }
}

/// Counts and logs an undo that failed for good, where what it undoes may have reached the
/// node: where no connection opened since that was made, nothing is there to undo.
fn report<M>(undos: &Undos<M>, i: usize, outcome: &NodeOutcome) {
    if outcome.is_fault() && undos.core.nodes[i].may_have_reached(undos.generations[i]) {
        undos.core.undos.note_failure(i);
        tracing::warn!(
            target: "redlock",
            node = &**undos.core.nodes[i].name(),
            resource = &*undos.resource,
            %outcome,
            "background {} failed: the key stays until its lease ends",
            undos.what
        );
    }
}

/// Undos sent again, each after a pause that doubles per node.
struct Retries {
    sent: FuturesUnordered<BoxFuture<'static, (usize, NodeOutcome)>>,
    pauses: Vec<Duration>,
}

impl Retries {
    fn new(nodes: usize) -> Self {
        Self { sent: FuturesUnordered::new(), pauses: vec![timing::RESEND_FIRST; nodes] }
    }

    /// Sends node `i`'s undo again (made by `remake`) after its pause, unless `until` (the
    /// horizon: its keys will have expired by then) comes first; `false` if not sent.
    fn again<M: Remake>(&mut self, i: usize, until: Instant, remake: &M) -> bool {
        let Some(pause) = self.pauses.get_mut(i) else { return false };
        let wait = *pause;
        if crate::clock::now() + wait >= until {
            return false;
        }
        *pause = (wait * 2).min(timing::RESEND_MAX);
        // Made (and so registered with the client's undos, its slot open) before the pause:
        // a shutdown, or the client's next acquisition of the key, counts it as in flight
        // from now on.
        let undo = remake(i, Slot::new());
        self.sent.push(
            async move {
                tokio::time::sleep(wait).await;
                undo.await
            }
            .boxed(),
        );
        true
    }
}

/// The next answer of either set of requests; `None` once both are empty.
async fn next<F>(rest: &mut Rest<F>, retries: &mut Option<Retries>) -> Option<(usize, NodeOutcome)>
where
    F: Future<Output = (usize, NodeOutcome)>,
{
    std::future::poll_fn(|cx| {
        if let Poll::Ready(Some(answer)) = rest.poll_next(cx) {
            return Poll::Ready(Some(answer));
        }
        if let Some(retries) = retries.as_mut()
            && let Poll::Ready(Some(answer)) = retries.sent.poll_next_unpin(cx)
        {
            return Poll::Ready(Some(answer));
        }
        let retrying = retries.as_ref().is_some_and(|retries| !retries.sent.is_empty());
        if rest.is_empty() && !retrying { Poll::Ready(None) } else { Poll::Pending }
    })
    .await
}

/// The nodes whose undo has not answered yet: if the task is dropped before (its runtime
/// ended), they are sent again on the client's own thread.
struct Unfinished<M: Remake> {
    left: Arc<Mutex<Left>>,
    undos: Undos<M>,
    hand_over: bool,
    /// The undos' registration, held for its `Drop`: as a field it goes only after `drop`
    /// has registered the undos sent again, so a new attempt of the client always finds one.
    _tracked: Option<Tracked>,
}

impl<M: Remake> Drop for Unfinished<M> {
    fn drop(&mut self) {
        let left = {
            let mut left = lock(&self.left);
            if !self.hand_over || left.taken || left.nodes.is_empty() {
                return;
            }
            left.taken = true;
            std::mem::take(&mut left.nodes)
        };
        let remake = self.undos.remake.clone();
        let slots = Slots::new(self.undos.core.nodes.len());
        let requests = Rest::new(&slots, left.iter().map(|&i| remake(i, slots.get(i))));
        finish(self.undos.clone(), requests, left, Taken::new(), None, Place::Own);
    }
}

#[cfg(test)]
mod tests {
    use std::sync::Mutex;

    use super::*;

    /// An undo that never gets through: each send is recorded (node, when after `start`)
    /// as it goes out, and times out at once.
    fn failing(
        start: tokio::time::Instant,
        sent: &Arc<Mutex<Vec<(usize, Duration)>>>,
    ) -> impl Remake + use<> {
        let sent = sent.clone();
        move |node, _slot| {
            let sent = sent.clone();
            async move {
                sent.lock().unwrap().push((node, start.elapsed()));
                (node, NodeOutcome::TimedOut)
            }
            .boxed()
        }
    }

    #[tokio::test(start_paused = true)]
    async fn undos_are_resent_with_a_doubling_pause_up_to_the_maximum_until_the_horizon() {
        let start = tokio::time::Instant::now();
        let horizon = crate::clock::now() + Duration::from_secs(5);
        let sent = Arc::new(Mutex::new(Vec::new()));
        let remake = failing(start, &sent);
        let mut retries = Retries::new(2);
        // Node 0's undo failed at once; node 1's a second later.
        assert!(retries.again(0, horizon, &remake));
        let mut node_1 = false;
        while let Some((i, outcome)) = retries.sent.next().await {
            assert!(may_pass(&outcome));
            if !node_1 && start.elapsed() >= Duration::from_secs(1) {
                node_1 = retries.again(1, horizon, &remake);
            }
            retries.again(i, horizon, &remake);
        }
        let sent = sent.lock().unwrap();
        let at = |node| -> Vec<u64> {
            let times = sent.iter().filter(|(i, _)| *i == node);
            times.map(|(_, at)| u64::try_from(at.as_millis()).unwrap()).collect()
        };
        // 50, 100, 200, 400, 800 ms, then 1 s each: none that would go out at or past the
        // horizon (the next would be at 5.55 s).
        assert_eq!(at(0), [50, 150, 350, 750, 1550, 2550, 3550, 4550]);
        // Each node's pauses double on their own, from the first.
        assert_eq!(at(1), [1600, 1700, 1900, 2300, 3100, 4100]);
    }

    #[test]
    fn only_an_undo_that_may_pass_is_sent_again_not_one_the_acl_refused_or_the_node_answered() {
        assert!(may_pass(&NodeOutcome::TimedOut));
        assert!(may_pass(&NodeOutcome::Unreachable("reset".into())));
        for put_off in [
            "LOADING Redis is loading the dataset in memory",
            "BUSY Redis is busy running a script.",
            "MASTERDOWN Link with MASTER is down",
        ] {
            assert!(may_pass(&NodeOutcome::Failed(put_off.into())), "{put_off}");
        }
        for rotated in
            ["WRONGPASS the node refused the login", "the TLS handshake refused a certificate"]
        {
            assert!(may_pass(&NodeOutcome::Denied(rotated.into())), "{rotated}");
        }
        for answered in [
            NodeOutcome::Ok,
            NodeOutcome::Absent,
            NodeOutcome::Held,
            NodeOutcome::WrongType,
            NodeOutcome::Denied("NOPERM".into()),
            NodeOutcome::Failed("ERR unknown command".into()),
            NodeOutcome::Failed("unexpected reply BUSY".into()),
        ] {
            assert!(!may_pass(&answered), "{answered:?}");
        }
    }
}
