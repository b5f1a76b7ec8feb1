//! One round: a request per node, all at once, each bounded by its own timeout, decided as
//! soon as its outcome is certain; the requests still in flight then finish in the
//! background.

use crate::timing;
use std::future::Future;
use std::pin::Pin;
use std::sync::Arc;
use std::task::{Context, Poll, ready};
use std::time::{Duration, Instant};

use futures::FutureExt;
use futures::future::{JoinAll, join_all};
use pin_project_lite::pin_project;
use smallvec::{SmallVec, smallvec};

use crate::clock;
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
    /// The nodes whose answer came only while the round waited for its stragglers after
    /// the decision (see [`linger`]): answers a task of their own would otherwise have
    /// taken, and which the background must still see (an undo's retries, its reports).
    pub(crate) lingered: SmallVec<[usize; 7]>,
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
            lingered: SmallVec::new(),
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
    /// `JoinAll` whose elements complete moves each of them (a request is about 3 KB)
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
///
/// Once decided, it waits a little for the stragglers (see [`linger`]) before the round is
/// over: a rest that ends here needs no task of its own.
pub(crate) async fn run<F>(
    requests: Rest<F>,
    started_at: Instant,
    settle: fn(&Tally) -> Option<Settled>,
    nodes: &[Arc<Node>],
) -> (Round, Rest<F>)
where
    F: Future<Output = (usize, NodeOutcome)>,
{
    run_and_linger(requests, started_at, nodes, |tally, _| settle(tally)).await
}

/// [`run`] for an acquisition ([`quorum::settle_acquire_sparing`]): refused for contention
/// without waiting for the nodes that were hung when it started.
pub(crate) async fn run_acquire<F>(
    requests: Rest<F>,
    started_at: Instant,
    nodes: &[Arc<Node>],
) -> (Round, Rest<F>)
where
    F: Future<Output = (usize, NodeOutcome)>,
{
    let now = clock::now();
    let hung: SmallVec<[usize; 7]> = (0..nodes.len()).filter(|&i| nodes[i].is_hung(now)).collect();
    run_and_linger(requests, started_at, nodes, |tally, outcomes| {
        let pending = |&i: &usize| outcomes.get(i) == Some(&NodeOutcome::Pending);
        quorum::settle_acquire_sparing(tally, hung.iter().filter(|i| pending(i)).count())
    })
    .await
}

/// [`run_until`] from no answers, then [`linger`]: what [`run`] and [`run_acquire`] share.
async fn run_and_linger<F>(
    requests: Rest<F>,
    started_at: Instant,
    nodes: &[Arc<Node>],
    decide: impl Fn(&Tally, &[NodeOutcome]) -> Option<Settled>,
) -> (Round, Rest<F>)
where
    F: Future<Output = (usize, NodeOutcome)>,
{
    let outcomes = smallvec![NodeOutcome::Pending; requests.left];
    let (mut round, mut rest) = run_until(requests, outcomes, started_at, decide).await;
    linger(&mut round, &mut rest, nodes).await;
    (round, rest)
}

/// Waits for the requests still in flight at the decision, at most as long again as the
/// round took to decide (and [`timing::LINGER_MAX`]), unless one of their nodes missed such a wait
/// before and has not answered in time since: a slow or hung node is not waited for.
///
/// Healthy nodes answer within a moment of each other, and the stragglers polled here cost
/// far less than a task of their own for them (half the client's CPU under load: see
/// `benches/PROFILE.md`). The decision stands; the answers that arrive only complete the
/// round's outcomes, and the round ends (`decided_at`, which validity counts to) after the
/// wait.
async fn linger<F>(round: &mut Round, rest: &mut Rest<F>, nodes: &[Arc<Node>])
where
    F: Future<Output = (usize, NodeOutcome)>,
{
    await_stragglers(round, rest, nodes, grace(round)).await;
}

/// How long [`linger`] waits: as long again as the round took to decide, capped.
fn grace(round: &Round) -> Duration {
    round.elapsed().min(timing::LINGER_MAX)
}

/// [`linger`] with its wait given.
async fn await_stragglers<F>(
    round: &mut Round,
    rest: &mut Rest<F>,
    nodes: &[Arc<Node>],
    grace: Duration,
) where
    F: Future<Output = (usize, NodeOutcome)>,
{
    let pending =
        |outcomes: &[NodeOutcome], i: usize| outcomes.get(i) == Some(&NodeOutcome::Pending);
    let waits = !rest.is_empty()
        && (0..nodes.len())
            .all(|i| !pending(&round.outcomes, i) || !nodes[i].is_late(round.decided_at));
    // Answers that came after the wait's end: the timer ticks by the millisecond, so a
    // wait may outlast its grace; such a node is not waited for next time.
    let mut overdue: SmallVec<[usize; 7]> = SmallVec::new();
    if waits {
        let until = tokio::time::Instant::now() + grace;
        let grace = tokio::time::sleep_until(until);
        tokio::pin!(grace);
        let answers = std::future::poll_fn(|cx| match rest.poll_next(cx) {
            Poll::Ready(answer) => Poll::Ready(answer),
            Poll::Pending => grace.as_mut().poll(cx).map(|()| None),
        });
        tokio::pin!(answers);
        while let Some((i, outcome)) = answers.as_mut().await {
            if tokio::time::Instant::now() > until {
                overdue.push(i);
            }
            round.outcomes[i] = outcome;
            round.lingered.push(i);
        }
        round.decided_at = clock::now();
    }
    let now = round.decided_at;
    for (i, (node, outcome)) in nodes.iter().zip(&round.outcomes).enumerate() {
        match outcome {
            // Still in flight after a wait, or over its node timeout: not waited for next.
            NodeOutcome::Pending if waits => node.set_late(true, now),
            NodeOutcome::TimedOut => node.set_late(true, now),
            NodeOutcome::Pending => {}
            _ => node.set_late(overdue.contains(&i), now),
        }
    }
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
    let decided_at = clock::now();
    // Answers already in are collected without waiting: replies often arrive together, and
    // a rest that is over needs no task of its own.
    while let Some((i, outcome)) = in_flight.take_ready() {
        outcomes[i] = outcome;
    }
    let round = Round { outcomes, settled, started_at, decided_at, lingered: SmallVec::new() };
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
            let (round, rest) = run(
                requests(n, seed, &answered),
                Instant::now(),
                quorum::settle_acquire,
                &nodes(n),
            )
            .await;
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

    /// Nodes that are never connected to: `linger` only reads and sets their flags.
    fn nodes(n: usize) -> Vec<Arc<Node>> {
        (0..n)
            .map(|i| {
                let client = redis::Client::open(format!("redis://127.0.0.1:{}", 1 + i)).unwrap();
                Arc::new(Node::new(
                    client,
                    Duration::from_millis(50),
                    Duration::ZERO,
                    Arc::default(),
                    Arc::default(),
                ))
            })
            .collect()
    }

    /// `n` requests; node `i` answers `Ok` after `delays[i]`, or never if `None`.
    fn delayed(
        delays: &[Option<u64>],
    ) -> Rest<impl Future<Output = (usize, NodeOutcome)> + Send + 'static + use<>> {
        let delays = delays.to_vec();
        Rest::new(
            &Slots::new(delays.len()),
            delays.into_iter().enumerate().map(|(i, delay)| async move {
                match delay {
                    Some(ms) => tokio::time::sleep(Duration::from_millis(ms)).await,
                    None => std::future::pending().await,
                }
                (i, NodeOutcome::Ok)
            }),
        )
    }

    /// A round over `delays` (see [`delayed`]), decided at the quorum, then waiting up to
    /// `grace` for the rest; with how long it took by Tokio's clock and the requests left.
    async fn round_of(
        delays: &[Option<u64>],
        nodes: &[Arc<Node>],
        grace: u64,
    ) -> (Round, tokio::time::Duration, usize) {
        let started = tokio::time::Instant::now();
        let outcomes = smallvec![NodeOutcome::Pending; delays.len()];
        let (mut round, mut rest) =
            run_until(delayed(delays), outcomes, clock::now(), |tally, _| {
                quorum::settle_acquire(tally)
            })
            .await;
        await_stragglers(&mut round, &mut rest, nodes, Duration::from_millis(grace)).await;
        (round, started.elapsed(), rest.left)
    }

    #[tokio::test(start_paused = true)]
    async fn stragglers_that_answer_within_the_wait_are_waited_for() {
        let nodes = nodes(5);
        // Decided at 4 ms (the third answer); the stragglers answer 1 and 3 ms later.
        let (round, took, left) =
            round_of(&[Some(1), Some(2), Some(4), Some(5), Some(7)], &nodes, 4).await;
        assert_eq!(left, 0, "no request left for a task of its own");
        assert!(round.outcomes.iter().all(|o| *o == NodeOutcome::Ok), "{:?}", round.outcomes);
        assert_eq!(took, Duration::from_millis(7), "over with the last answer");
        assert!(nodes.iter().all(|node| !node.is_late(clock::now())));
    }

    #[tokio::test(start_paused = true)]
    async fn the_wait_is_bounded_and_a_node_that_missed_it_is_not_waited_for_again() {
        let nodes = nodes(5);
        // Decided at 1 ms: node 3 answers within the 1 ms wait, node 4 does not.
        let (round, took, left) =
            round_of(&[Some(1), Some(1), Some(1), Some(2), Some(30)], &nodes, 1).await;
        assert_eq!((left, took), (1, Duration::from_millis(2)));
        assert_eq!(round.outcomes[3], NodeOutcome::Ok);
        assert_eq!(round.outcomes[4], NodeOutcome::Pending);
        assert!(nodes[4].is_late(clock::now()) && !nodes[3].is_late(clock::now()));
        // Node 4 is late: the next round does not wait for it at all.
        let (_, took, left) =
            round_of(&[Some(1), Some(1), Some(1), Some(1), None], &nodes, 1).await;
        assert_eq!((left, took), (1, Duration::from_millis(1)));
        assert!(nodes[4].is_late(clock::now()), "still late: it did not answer in time");
        // It answers within a decision again: waited for once more.
        let (_, _, left) =
            round_of(&[Some(1), Some(1), Some(1), Some(1), Some(1)], &nodes, 1).await;
        assert_eq!(left, 0);
        assert!(!nodes[4].is_late(clock::now()));
    }

    #[tokio::test(start_paused = true)]
    async fn a_node_that_timed_out_is_not_waited_for() {
        let nodes = nodes(5);
        let slots = Slots::new(5);
        let answers = [(1, NodeOutcome::Ok), (1, NodeOutcome::TimedOut), (2, NodeOutcome::Ok)];
        let requests = Rest::new(
            &slots,
            answers.into_iter().enumerate().map(|(i, (ms, outcome))| async move {
                tokio::time::sleep(Duration::from_millis(ms)).await;
                (i, outcome)
            }),
        );
        let outcomes = smallvec![NodeOutcome::Pending; 3];
        let (mut round, mut rest) =
            run_until(requests, outcomes, clock::now(), |tally, _| quorum::settle_acquire(tally))
                .await;
        await_stragglers(&mut round, &mut rest, &nodes[..3], Duration::from_millis(5)).await;
        assert!(nodes[1].is_late(clock::now()), "timed out: not answered in time");
        assert!(!nodes[0].is_late(clock::now()) && !nodes[2].is_late(clock::now()));
    }

    /// The timer ticks by the millisecond: a wait of a few microseconds lasts until the
    /// next tick, and an answer that comes in that overshoot is taken, but its node counts
    /// as late (the next round does not wait for it).
    #[tokio::test]
    async fn an_answer_after_the_grace_but_before_the_timer_fired_counts_as_late() {
        let nodes = nodes(3);
        let (send, answer) = tokio::sync::oneshot::channel::<()>();
        let mut answer = Some(answer);
        let slots = Slots::new(3);
        let requests = Rest::new(
            &slots,
            (0..3).map(|i| {
                let answer = if i == 2 { answer.take() } else { None };
                async move {
                    if let Some(answer) = answer {
                        let _ = answer.await;
                    }
                    (i, NodeOutcome::Ok)
                }
                .boxed()
            }),
        );
        let sender = std::thread::spawn(move || {
            std::thread::sleep(Duration::from_micros(300));
            let _ = send.send(());
        });
        let outcomes = smallvec![NodeOutcome::Pending; 3];
        let (mut round, mut rest) =
            run_until(requests, outcomes, clock::now(), |tally, _| quorum::settle_acquire(tally))
                .await;
        await_stragglers(&mut round, &mut rest, &nodes, Duration::from_micros(50)).await;
        sender.join().unwrap();
        // Taken within the timer's tick, or left pending past it: late either way.
        assert!(nodes[2].is_late(clock::now()), "{:?}", round.outcomes);
        assert!(!nodes[0].is_late(clock::now()) && !nodes[1].is_late(clock::now()));
    }

    #[test]
    fn the_wait_is_the_decision_time_capped() {
        let at = Instant::now();
        let round = |ms| Round { decided_at: at + Duration::from_millis(ms), ..Round::none(3, at) };
        assert_eq!(grace(&round(1)), Duration::from_millis(1));
        assert_eq!(grace(&round(30)), timing::LINGER_MAX);
    }

    /// Node `i` answers `answers[i].0` after `answers[i].1` milliseconds.
    fn answering(
        answers: &[(NodeOutcome, u64)],
    ) -> Rest<impl Future<Output = (usize, NodeOutcome)> + Send + 'static + use<>> {
        let answers = answers.to_vec();
        Rest::new(
            &Slots::new(answers.len()),
            answers.into_iter().enumerate().map(|(i, (outcome, ms))| async move {
                tokio::time::sleep(Duration::from_millis(ms)).await;
                (i, outcome)
            }),
        )
    }

    #[tokio::test(start_paused = true)]
    async fn a_round_is_decided_at_the_quorum_or_once_it_is_out_of_reach() {
        use NodeOutcome::{Absent, Ok};
        let (first, second) = (nodes(5), nodes(5));
        let ms = Duration::from_millis;
        // The third yes decides; the stragglers are not waited for past the short linger.
        let answers = [(Ok, 1), (Ok, 2), (Ok, 4), (Ok, 40), (Ok, 40)];
        let (round, _) = run(answering(&answers), clock::now(), quorum::settle_hold, &first).await;
        assert_eq!(round.settled, Settled::Reached);
        assert_eq!(round.elapsed(), ms(4) + timing::LINGER_MAX, "decided at 4 ms, then lingered");
        // Three nodes without the hold: no quorum can say yes any more.
        let answers = [(Absent, 1), (Ok, 2), (Absent, 3), (Absent, 5), (Ok, 40)];
        let (round, _) = run(answering(&answers), clock::now(), quorum::settle_hold, &second).await;
        assert_eq!(round.settled, Settled::Failed(crate::error::ErrorKind::NotHeld));
        assert_eq!(round.elapsed(), ms(5) + timing::LINGER_MAX);
    }

    #[tokio::test(start_paused = true)]
    async fn an_attempt_refused_for_contention_does_not_wait_for_a_hung_node() {
        use NodeOutcome::{Held, Ok, TimedOut};
        let refused = Settled::Failed(crate::error::ErrorKind::NotAcquired);
        // Node 4 times out at the node timeout (50 ms); the others split 2 against 2.
        let answers = [(Held, 1), (Held, 2), (Ok, 3), (Ok, 4), (TimedOut, 50)];
        let nodes = nodes(5);
        let (round, _) = run_acquire(answering(&answers), clock::now(), &nodes).await;
        assert_eq!(round.settled, refused);
        assert_eq!(round.elapsed(), Duration::from_millis(50), "its yes could make a quorum");
        assert!(nodes[4].is_late(clock::now()), "timed out");
        // Once a request to it timed out, a refusal the others show does not wait for it.
        nodes[4].set_hung(true);
        let (round, _) = run_acquire(answering(&answers), clock::now(), &nodes).await;
        assert_eq!(round.settled, refused);
        // At 3 ms only node 4's yes could still make a quorum with node 3's; nor is the
        // decision lingered on: node 4 is late.
        assert_eq!(round.elapsed(), Duration::from_millis(3));
        assert_eq!(round.outcomes[4], NodeOutcome::Pending);
    }

    #[tokio::test]
    async fn an_empty_round_is_over_at_once() {
        let answered = Arc::new(AtomicUsize::new(0));
        let mut rest = requests(0, 0, &answered);
        assert!(rest.is_empty());
        assert_eq!(rest.next().await, None);
    }
}
