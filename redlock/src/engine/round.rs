//! One round: a request per node, all at once, each bounded by its own timeout, decided as
//! soon as its outcome is certain; the requests still in flight then finish in the
//! background.

use std::future::Future;
use std::pin::Pin;
use std::sync::Arc;
use std::task::{Context, Poll, ready};
use std::time::{Duration, Instant};

use futures::FutureExt;
use futures::future::{JoinAll, join_all};
use pin_project_lite::pin_project;
use smallvec::{SmallVec, smallvec};

use crate::error::{NodeOutcome, NodeReport, RoundReport};
use crate::node::Node;
use crate::quorum::{self, Settled, Tally};
use crate::tasks::Tasks;

use super::slot::Slots;

/// Per node, what it answered: inline for up to seven nodes, the deployments this is for.
pub(crate) type Outcomes = SmallVec<[NodeOutcome; 7]>;

/// The result of a round.
#[derive(Debug)]
pub(crate) struct Round {
    /// Per node, in configuration order; `Pending` for nodes not answered at the decision.
    pub(crate) outcomes: Outcomes,
    pub(crate) settled: Settled,
    pub(crate) started_at: Instant,
    /// When the round was decided: the end of the round for validity accounting.
    pub(crate) decided_at: Instant,
}

impl Round {
    /// A round that never ran (every node `Pending`).
    pub(crate) fn none(nodes: usize, at: Instant) -> Self {
        let outcomes = smallvec![NodeOutcome::Pending; nodes];
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

/// Requests in flight, polled in place by one future: one allocation for all of them and
/// no task of their own (a round's requests are few, and each is cheap to poll). Each
/// leaves its answer in its node's slot of the round, where the round takes it.
pub(crate) struct Rest<F: Future<Output = (usize, NodeOutcome)>> {
    /// `None` once every request is over.
    all: Option<JoinAll<Answering<F>>>,
    slots: Slots,
    /// Answers not taken yet.
    left: usize,
}

pin_project! {
    /// A request that leaves its answer with its round, then drops in place.
    ///
    /// It never completes: the round counts answers, not finished requests, and a
    /// `JoinAll` whose elements complete moves each of them (a request is about 1.7 KB)
    /// out of its box at the end.
    #[project = AnsweringProj]
    #[project_replace = AnsweringDone]
    enum Answering<F> {
        Asking { #[pin] request: F, slots: Slots },
        Answered,
    }
}

impl<F: Future<Output = (usize, NodeOutcome)>> Future for Answering<F> {
    type Output = ();

    fn poll(mut self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<()> {
        let AnsweringProj::Asking { request, slots } = self.as_mut().project() else {
            return Poll::Pending;
        };
        let (i, outcome) = ready!(request.poll(cx));
        slots.answer(i, outcome);
        // The request ends here (its slot settles as it drops), not with the round.
        self.project_replace(Answering::Answered);
        Poll::Pending
    }
}

impl<F: Future<Output = (usize, NodeOutcome)>> Rest<F> {
    /// Starts nothing yet: the requests go out when first polled. Each answers for a
    /// different node, and leaves its answer in that node's slot of `slots`.
    pub(crate) fn new(slots: &Slots, requests: impl IntoIterator<Item = F>) -> Self {
        let mut left = 0;
        let all = join_all(requests.into_iter().map(|request| {
            left += 1;
            Answering::Asking { request, slots: slots.clone() }
        }));
        Self { all: Some(all), slots: slots.clone(), left }
    }

    /// The slots the requests answer in.
    pub(crate) fn slots(&self) -> &Slots {
        &self.slots
    }

    /// Whether every answer was taken.
    pub(crate) fn is_empty(&self) -> bool {
        self.left == 0
    }

    /// The next answer; `None` once all were taken.
    pub(crate) fn poll_next(&mut self, cx: &mut Context<'_>) -> Poll<Option<(usize, NodeOutcome)>> {
        if self.left == 0 {
            // Every request has answered, and so is over.
            self.all = None;
            return Poll::Ready(None);
        }
        if let Some(answer) = self.take() {
            return Poll::Ready(Some(answer));
        }
        if let Some(all) = &mut self.all {
            // Never ready (see `Answering`): what counts is the answers it leaves.
            let _ = all.poll_unpin(cx);
        }
        match self.take() {
            Some(answer) => Poll::Ready(Some(answer)),
            None => Poll::Pending,
        }
    }

    /// The next answer; `None` once all were taken.
    pub(crate) async fn next(&mut self) -> Option<(usize, NodeOutcome)> {
        std::future::poll_fn(|cx| self.poll_next(cx)).await
    }

    /// An answer that is already in, without waiting.
    fn take_ready(&mut self) -> Option<(usize, NodeOutcome)> {
        let mut cx = Context::from_waker(futures::task::noop_waker_ref());
        match self.poll_next(&mut cx) {
            Poll::Ready(answer) => answer,
            Poll::Pending => None,
        }
    }

    fn take(&mut self) -> Option<(usize, NodeOutcome)> {
        let answer = self.slots.take_answer()?;
        self.left -= 1;
        Some(answer)
    }
}

/// Runs `requests` (each answering for its node index) concurrently until `settle` decides
/// the round; every node has a request. Returns the round and the requests still in flight.
pub(crate) async fn run<F>(
    requests: Rest<F>,
    started_at: Instant,
    settle: fn(&Tally) -> Option<Settled>,
) -> (Round, Rest<F>)
where
    F: Future<Output = (usize, NodeOutcome)>,
{
    let outcomes = smallvec![NodeOutcome::Pending; requests.left];
    run_until(requests, outcomes, started_at, |tally, _| settle(tally)).await
}

/// Runs `requests` until `decide` settles the round; `outcomes` holds every node's outcome
/// before the round (`Pending` for each node a request goes to).
pub(crate) async fn run_until<F>(
    mut in_flight: Rest<F>,
    mut outcomes: Outcomes,
    started_at: Instant,
    decide: impl Fn(&Tally, &[NodeOutcome]) -> Option<Settled>,
) -> (Round, Rest<F>)
where
    F: Future<Output = (usize, NodeOutcome)>,
{
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
    while let Some((i, outcome)) = in_flight.take_ready() {
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

#[cfg(test)]
mod tests {
    use std::sync::atomic::{AtomicUsize, Ordering};

    use super::*;

    /// `n` requests answering `Ok` after pseudo-random delays of 0-3 ms; each counts itself
    /// in `answered` when it is over.
    fn requests(
        n: usize,
        seed: u64,
        answered: &Arc<AtomicUsize>,
    ) -> Rest<impl Future<Output = (usize, NodeOutcome)> + Send + 'static + use<>> {
        Rest::new(
            &Slots::new(n),
            (0..n).map(move |i| {
                let answered = answered.clone();
                let delay = (seed.wrapping_mul(31).wrapping_add(i as u64 * 7919)) % 4;
                async move {
                    if delay > 0 {
                        tokio::time::sleep(Duration::from_millis(delay)).await;
                    }
                    answered.fetch_add(1, Ordering::AcqRel);
                    (i, NodeOutcome::Ok)
                }
            }),
        )
    }

    async fn every_answer_arrives(n: usize) {
        let answered = Arc::new(AtomicUsize::new(0));
        let tasks = Tasks::default();
        let rounds = 100;
        for seed in 0..rounds {
            let (round, rest) =
                run(requests(n, seed, &answered), Instant::now(), quorum::settle_acquire).await;
            assert_eq!(round.settled, Settled::Reached);
            let answers = round.outcomes.iter().filter(|o| **o == NodeOutcome::Ok).count();
            assert!(answers >= quorum::quorum(n), "{answers} of {n}");
            assert_eq!(answers + rest.left, n, "each answer counted once");
            finish(&tasks, rest);
        }
        assert!(tasks.idle_by(Instant::now() + Duration::from_secs(5)).await, "a rest hung");
        assert_eq!(answered.load(Ordering::Acquire), n * rounds as usize);
    }

    #[tokio::test(flavor = "multi_thread", worker_threads = 2)]
    async fn every_request_ends_and_is_counted_once() {
        every_answer_arrives(5).await;
    }

    #[tokio::test(flavor = "multi_thread", worker_threads = 2)]
    async fn more_requests_than_join_all_polls_in_place_are_handled_alike() {
        every_answer_arrives(41).await;
    }

    #[tokio::test]
    async fn an_empty_round_is_over_at_once() {
        let answered = Arc::new(AtomicUsize::new(0));
        let mut rest = requests(0, 0, &answered);
        assert!(rest.is_empty());
        assert_eq!(rest.next().await, None);
    }
}
