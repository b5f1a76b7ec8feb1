//! One round: the same operation sent to every node at once, each under its own timeout,
//! decided as soon as its outcome is certain.

use std::future::Future;
use std::sync::Arc;
use std::time::{Duration, Instant};

use futures::StreamExt;
use futures::future::{BoxFuture, FutureExt, Shared};
use futures::stream::FuturesUnordered;

use crate::error::{NodeOutcome, NodeReport, RoundReport};
use crate::node::Node;
use crate::quorum::{self, Decision};

/// A request that others may wait for: an acquisition `SET` still in flight when its round
/// was decided, which a later release on the same node must not overtake.
pub(crate) type InFlight = Shared<BoxFuture<'static, NodeOutcome>>;

/// The result of a round.
#[derive(Debug)]
pub(crate) struct Round {
    pub(crate) outcomes: Vec<NodeOutcome>,
    pub(crate) decision: Decision,
    pub(crate) started_at: Instant,
    /// When the decision was made: the end of the round for validity accounting.
    pub(crate) decided_at: Instant,
}

impl Round {
    pub(crate) fn count(&self, pred: impl Fn(&NodeOutcome) -> bool) -> usize {
        self.outcomes.iter().filter(|o| pred(o)).count()
    }

    pub(crate) fn elapsed(&self) -> Duration {
        self.decided_at - self.started_at
    }

    pub(crate) fn report(&self, nodes: &[Arc<Node>]) -> RoundReport {
        RoundReport {
            nodes: nodes
                .iter()
                .zip(&self.outcomes)
                .map(|(node, outcome)| NodeReport::new(node.name().clone(), outcome.clone()))
                .collect(),
            quorum: quorum::quorum(nodes.len()),
            elapsed: self.elapsed(),
        }
    }
}

/// Runs one request per node concurrently (request `i` goes to node `i`) and returns once
/// a quorum said [`NodeOutcome::Ok`] or can no longer say it.
pub(crate) async fn round<Fut>(requests: Vec<Fut>, started_at: Instant) -> Round
where
    Fut: Future<Output = NodeOutcome> + Send + 'static,
{
    let n = requests.len();
    let mut in_flight: FuturesUnordered<_> = requests
        .into_iter()
        .enumerate()
        .map(|(i, request)| request.map(move |outcome| (i, outcome)))
        .collect();
    let mut outcomes = vec![NodeOutcome::Pending; n];
    let (mut ok, mut answered) = (0, 0);
    let decision = loop {
        let Some((i, outcome)) = in_flight.next().await else {
            // Not reached: with every node answered the round is always decided.
            break quorum::decide(n, ok, answered).unwrap_or(Decision::Failed);
        };
        answered += 1;
        ok += usize::from(outcome == NodeOutcome::Ok);
        outcomes[i] = outcome;
        if let Some(decision) = quorum::decide(n, ok, answered) {
            break decision;
        }
    };
    let decided_at = Instant::now();
    // Unanswered requests finish in the background, each within its own timeout: an
    // acquisition may still make the lock stronger (or be waiting for its connection), a
    // release must reach every node, an extension heals nodes that answer late.
    drain_in_background(in_flight);
    Round { outcomes, decision, started_at, decided_at }
}

/// Waits for every request (each bounded by its own timeout).
pub(crate) async fn all<Fut: Future<Output = NodeOutcome>>(requests: Vec<Fut>) -> Vec<NodeOutcome> {
    futures::future::join_all(requests).await
}

/// Runs the requests in the background, without waiting for any answer.
pub(crate) fn in_background<Fut>(requests: impl IntoIterator<Item = Fut>)
where
    Fut: Future + Send + 'static,
{
    drain_in_background(requests.into_iter().collect::<FuturesUnordered<Fut>>());
}

fn drain_in_background<S>(mut in_flight: FuturesUnordered<S>)
where
    S: Future + Send + 'static,
{
    if in_flight.is_empty() {
        return;
    }
    // Outside a runtime nothing can run; the Drop paths that may get here without one
    // check for a runtime first and log instead.
    if let Ok(runtime) = tokio::runtime::Handle::try_current() {
        runtime.spawn(async move { while in_flight.next().await.is_some() {} });
    }
}

/// Bounds one request by the node timeout; a request that runs out is `TimedOut`.
pub(crate) async fn bounded(
    timeout: Duration,
    request: impl Future<Output = NodeOutcome>,
) -> NodeOutcome {
    tokio::time::timeout(timeout, request).await.unwrap_or(NodeOutcome::TimedOut)
}

/// Makes a request shareable, so that a later request to the same node can wait for it.
pub(crate) fn shareable(request: impl Future<Output = NodeOutcome> + Send + 'static) -> InFlight {
    request.boxed().shared()
}

/// The requests of `round` that had not answered at its decision, per node.
pub(crate) fn still_in_flight(requests: Vec<InFlight>, round: &Round) -> Vec<Option<InFlight>> {
    requests
        .into_iter()
        .zip(&round.outcomes)
        .map(|(request, outcome)| (*outcome == NodeOutcome::Pending).then_some(request))
        .collect()
}
