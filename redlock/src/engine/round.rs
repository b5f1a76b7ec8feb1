//! One round: a request per node, all at once, each bounded by its own timeout, decided as
//! soon as its outcome is certain; the requests still in flight then finish in the
//! background.

use std::future::Future;
use std::sync::Arc;
use std::time::{Duration, Instant};

use futures::stream::FuturesUnordered;
use futures::{FutureExt, StreamExt};

use crate::error::{NodeOutcome, NodeReport, RoundReport};
use crate::node::Node;
use crate::quorum::{self, Settled, Tally};
use crate::tasks::Tasks;

/// The result of a round.
#[derive(Debug)]
pub(crate) struct Round {
    /// Per node, in configuration order; `Pending` for nodes not answered at the decision.
    pub(crate) outcomes: Vec<NodeOutcome>,
    pub(crate) settled: Settled,
    pub(crate) started_at: Instant,
    /// When the round was decided: the end of the round for validity accounting.
    pub(crate) decided_at: Instant,
}

impl Round {
    /// A round that never ran (every node `Pending`).
    pub(crate) fn none(nodes: usize, at: Instant) -> Self {
        let outcomes = vec![NodeOutcome::Pending; nodes];
        Self {
            outcomes,
            settled: Settled::Failed(crate::error::ErrorKind::Shutdown),
            started_at: at,
            decided_at: at,
        }
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

    /// Every node's outcome, for logs.
    pub(crate) fn summary(&self) -> String {
        let names: Vec<String> = self.outcomes.iter().map(ToString::to_string).collect();
        names.join(", ")
    }
}

/// The requests of a round still in flight at its decision.
pub(crate) type Rest<F> = FuturesUnordered<F>;

/// Runs `requests` (each answering for its node index) concurrently until `settle` decides
/// the round; every node has a request. Returns the round and the requests still in flight.
pub(crate) async fn run<F>(
    requests: Vec<F>,
    started_at: Instant,
    settle: fn(&Tally) -> Option<Settled>,
) -> (Round, Rest<F>)
where
    F: Future<Output = (usize, NodeOutcome)>,
{
    let outcomes = vec![NodeOutcome::Pending; requests.len()];
    run_until(requests, outcomes, started_at, |tally, _| settle(tally)).await
}

/// Runs `requests` until `decide` settles the round; `outcomes` holds every node's outcome
/// before the round (`Pending` for each node a request goes to).
pub(crate) async fn run_until<F>(
    requests: Vec<F>,
    mut outcomes: Vec<NodeOutcome>,
    started_at: Instant,
    decide: impl Fn(&Tally, &[NodeOutcome]) -> Option<Settled>,
) -> (Round, Rest<F>)
where
    F: Future<Output = (usize, NodeOutcome)>,
{
    let mut in_flight: FuturesUnordered<F> = requests.into_iter().collect();
    let mut tally = Tally::of(&outcomes);
    let settled = loop {
        if let Some(settled) = decide(&tally, &outcomes) {
            break settled;
        }
        let Some((i, outcome)) = in_flight.next().await else {
            // Not reached: with every node answered, every settle rule decides.
            break Settled::Failed(crate::error::ErrorKind::Unavailable);
        };
        tally.add(&outcome);
        outcomes[i] = outcome;
    };
    let decided_at = Instant::now();
    // Answers already in are collected without waiting: replies often arrive together, and
    // a rest that is over needs no task of its own.
    while let Some(Some((i, outcome))) = in_flight.next().now_or_never() {
        outcomes[i] = outcome;
    }
    let round = Round { outcomes, settled, started_at, decided_at };
    (round, in_flight)
}

/// Runs `requests` to their end, waiting for none of them: the rest of a round.
pub(crate) fn finish<F>(tasks: &Tasks, mut rest: Rest<F>)
where
    F: Future<Output = (usize, NodeOutcome)> + Send + 'static,
{
    if !rest.is_empty() {
        tasks.spawn(async move { while rest.next().await.is_some() {} });
    }
}
