//! The machinery the other lock kinds share with each other: one round per operation over
//! every node, the quorum, validity accounting, clean-up of failed attempts and background
//! release, for any per-node protocol.
//!
//! It mirrors what `redlock.rs` and `lock.rs` do for the plain lock, generalised over
//! [`Protocol`] (what is said to one node) instead of one key and one token.

pub(crate) mod multi;
pub(crate) mod reentrant;
pub(crate) mod rwlock;

use std::future::Future;
use std::sync::Arc;
use std::time::{Duration, Instant};

use tracing::Instrument;

use crate::builder::check_ttl;
use crate::error::{Error, ErrorKind, NodeOutcome, Result};
use crate::fanout::{self, InFlight, Round};
use crate::node::Node;
use crate::quorum::{self, Decision};
use crate::redlock::Inner;

/// What one lock kind says to one node. Each request is one Lua script, atomic on the node;
/// the caller bounds it by the node timeout.
pub(crate) trait Protocol: Send + Sync + 'static {
    /// Whether a hold exists only on the nodes where its own acquisition landed, so that
    /// release and extend must skip the others (a per-owner counter, unlike a per-attempt
    /// token, cannot tell our increment from another hold's).
    const PER_HOLD: bool;

    /// The acquisition on one node.
    fn acquire(&self, node: Arc<Node>, ttl_ms: u64) -> impl Future<Output = NodeOutcome> + Send;

    /// The release on one node; never touches another owner's state.
    fn release(&self, node: Arc<Node>) -> impl Future<Output = NodeOutcome> + Send;

    /// The extension on one node; deletes nothing.
    fn extend(&self, node: Arc<Node>, ttl_ms: u64) -> impl Future<Output = NodeOutcome> + Send;
}

/// What the caller names the lock by in errors and logs, and which kind it is.
#[derive(Clone, Copy, Debug)]
pub(crate) struct Label<'a> {
    pub(crate) kind: &'static str,
    pub(crate) resource: &'a str,
}

/// A lock of any kind that may be set on some nodes: an attempt in progress, then the lock
/// it becomes. Released in the background if dropped while armed (never blocking).
pub(crate) struct Held<P: Protocol> {
    inner: Arc<Inner>,
    proto: Arc<P>,
    /// Per node, the acquisition request: shared, so that every later request on the node
    /// waits for it (and, for [`Protocol::PER_HOLD`], learns whether it landed).
    acquired: Vec<InFlight>,
    /// Per node, the latest extension still in flight there, which a later request must
    /// not overtake.
    tail: Vec<Option<InFlight>>,
    deadline: Instant,
    /// The release requests once a release or clean-up has started, per node (`None`: not
    /// released there). A release cancelled mid-round is finished from these, never sent
    /// again: a decrement, unlike a compare-and-delete, is not idempotent.
    releasing: Option<Vec<Option<InFlight>>>,
    armed: bool,
}

impl<P: Protocol> Held<P> {
    pub(crate) fn proto(&self) -> &P {
        &self.proto
    }

    pub(crate) fn deadline(&self) -> Instant {
        self.deadline
    }

    pub(crate) fn validity(&self) -> Duration {
        self.deadline.saturating_duration_since(Instant::now())
    }

    pub(crate) fn is_valid(&self) -> bool {
        Instant::now() < self.deadline
    }

    /// One request on node `i`, queued behind our acquisition and extension there; for a
    /// per-hold protocol, skipped (`Absent`) where our acquisition did not land. Only the
    /// request itself is bounded here: what it waits for is bounded on its own.
    fn on_node<F, Fut>(
        &self,
        i: usize,
        request: F,
    ) -> impl Future<Output = NodeOutcome> + use<P, F, Fut>
    where
        F: FnOnce(Arc<P>, Arc<Node>) -> Fut + Send + 'static,
        Fut: Future<Output = NodeOutcome> + Send,
    {
        let acquired = self.acquired[i].clone();
        let tail = self.tail[i].clone();
        let (proto, node) = (self.proto.clone(), self.inner.nodes[i].clone());
        let timeout = self.inner.config.node_timeout;
        async move {
            if let Some(previous) = tail {
                previous.await;
            }
            let landed = landed(&acquired.await);
            if P::PER_HOLD && !landed {
                return NodeOutcome::Absent;
            }
            fanout::bounded(timeout, request(proto, node)).await
        }
    }

    /// Starts the release on the nodes `on` selects, once: later calls (and Drop) get the
    /// same shared requests back, whether they finished or not.
    fn start_release(&mut self, on: impl Fn(usize) -> bool) -> Vec<Option<InFlight>> {
        if self.releasing.is_none() {
            let requests = (0..self.inner.nodes.len())
                .map(|i| {
                    on(i).then(|| {
                        let release =
                            |proto: Arc<P>, node| async move { proto.release(node).await };
                        fanout::shareable(self.on_node(i, release))
                    })
                })
                .collect();
            self.releasing = Some(requests);
        }
        self.releasing.clone().unwrap_or_default()
    }

    /// Releases a failed attempt: awaited on the nodes that granted (they answered a moment
    /// ago), in the background on the nodes whose answer is unknown, not at all where the
    /// node answered about someone else's lock.
    async fn clean_up(mut self, round: &Round) {
        let skip = |o: &NodeOutcome| matches!(o, NodeOutcome::Held | NodeOutcome::WrongType);
        let requests = self.start_release(|i| !skip(&round.outcomes[i]));
        let mut granted = Vec::new();
        let mut uncertain = Vec::new();
        for (request, outcome) in requests.into_iter().zip(&round.outcomes) {
            match (request, outcome) {
                (None, _) => {}
                (Some(request), NodeOutcome::Ok | NodeOutcome::Quarantined) => {
                    granted.push(request)
                }
                (Some(request), _) => uncertain.push(request),
            }
        }
        fanout::in_background(uncertain);
        fanout::all(granted).await;
        self.armed = false;
    }

    /// Renews the lease on every node (per-hold: every node where the hold landed), decided
    /// at the quorum; a failed extension deletes nothing and keeps the old validity.
    pub(crate) async fn extend(&mut self, ttl: Duration, label: Label<'_>) -> Result<()> {
        let ttl_ms = check_ttl(ttl, self.inner.config.drift_factor)?;
        if !self.is_valid() {
            return Err(Error::local(
                ErrorKind::NotHeld,
                "validity is over: not extending",
                label.resource,
            ));
        }
        let started_at = Instant::now();
        let requests: Vec<InFlight> =
            (0..self.inner.nodes.len())
                .map(|i| {
                    fanout::shareable(self.on_node(i, move |proto, node| async move {
                        proto.extend(node, ttl_ms).await
                    }))
                })
                .collect();
        let round = fanout::round(requests.clone(), started_at).await;
        self.tail = fanout::still_in_flight(requests, &round);
        let report = || round.report(&self.inner.nodes);
        if round.decided_at >= self.deadline {
            // The lease ran out while we asked: another client may already hold the lock.
            return Err(Error::round(
                ErrorKind::NotHeld,
                "validity ran out during the extension",
                label.resource,
                report(),
            ));
        }
        let lease = Duration::from_millis(ttl_ms);
        match round.decision {
            Decision::Reached => {
                match quorum::validity(lease, round.elapsed(), self.drift(lease)) {
                    Some(validity) => {
                        self.deadline = round.decided_at + validity;
                        Ok(())
                    }
                    None => Err(Error::round(
                        ErrorKind::Expired,
                        "the extension took the whole new lease",
                        label.resource,
                        report(),
                    )),
                }
            }
            Decision::Failed => Err(self.inner.lost_error(
                label.resource,
                &format!("{} extend", label.kind),
                &round,
            )),
        }
    }

    /// Releases on every node (per-hold: every node where the hold landed), returning at
    /// the quorum; the other nodes finish in the background.
    pub(crate) async fn release(mut self, label: Label<'_>) -> Result<()> {
        let was_valid = self.is_valid();
        let requests = (self.start_release(|_| true).into_iter())
            .map(|request| {
                request.unwrap_or_else(|| fanout::shareable(async { NodeOutcome::Absent }))
            })
            .collect();
        let round = fanout::round(requests, Instant::now()).await;
        // Only now: if this future is dropped mid-round, Drop finishes the same requests.
        self.armed = false;
        match round.decision {
            Decision::Reached if was_valid => Ok(()),
            Decision::Reached => Err(Error::round(
                ErrorKind::NotHeld,
                "the validity had run out before the release",
                label.resource,
                round.report(&self.inner.nodes),
            )),
            Decision::Failed => Err(self.inner.lost_error(
                label.resource,
                &format!("{} release", label.kind),
                &round,
            )),
        }
    }

    fn drift(&self, lease: Duration) -> Duration {
        quorum::drift(lease, self.inner.config.drift_factor)
    }
}

impl<P: Protocol> Drop for Held<P> {
    fn drop(&mut self) {
        if !self.armed {
            return;
        }
        // Never block here: the release runs as tasks on the runtime, or not at all.
        if tokio::runtime::Handle::try_current().is_ok() {
            let requests = self.start_release(|_| true);
            fanout::in_background(requests.into_iter().flatten());
        } else {
            tracing::warn!(
                target: "redlock",
                "lock dropped outside a Tokio runtime: it is left to expire"
            );
        }
    }
}

/// One acquisition attempt of any kind: the protocol's acquisition on every node at once,
/// decided at the quorum, validity from the round's start; a failed attempt is released on
/// every node that may hold it.
pub(crate) async fn attempt<P: Protocol>(
    inner: &Arc<Inner>,
    proto: Arc<P>,
    ttl_ms: u64,
    label: Label<'_>,
) -> Result<Held<P>> {
    let span = tracing::debug_span!(
        target: "redlock",
        "lock_attempt",
        kind = label.kind,
        resource = label.resource,
        ttl_ms,
        outcome = tracing::field::Empty,
        elapsed = tracing::field::Empty,
        nodes = tracing::field::Empty,
    );
    let result = acquire_round(inner, proto, ttl_ms, label).instrument(span.clone()).await;
    if !span.is_disabled() {
        let (outcome, round) = match &result {
            Ok((_, round)) => ("granted", round),
            Err((err, round)) => (err.kind().as_str(), round),
        };
        let nodes: Vec<String> = round.outcomes.iter().map(ToString::to_string).collect();
        span.record("outcome", outcome);
        span.record("elapsed", tracing::field::debug(round.elapsed()));
        span.record("nodes", tracing::field::display(nodes.join(", ")));
        tracing::debug!(target: "redlock", parent: &span, "attempt decided");
    }
    result.map(|(held, _)| held).map_err(|(err, _)| err)
}

async fn acquire_round<P: Protocol>(
    inner: &Arc<Inner>,
    proto: Arc<P>,
    ttl_ms: u64,
    label: Label<'_>,
) -> Result<(Held<P>, Round), (Error, Round)> {
    let started_at = Instant::now();
    let timeout = inner.config.node_timeout;
    let acquired: Vec<InFlight> = inner
        .nodes
        .iter()
        .map(|node| {
            let (proto, node) = (proto.clone(), node.clone());
            fanout::shareable(fanout::bounded(
                timeout,
                async move { proto.acquire(node, ttl_ms).await },
            ))
        })
        .collect();
    // Armed from here: if this future is dropped mid-round, Drop releases whatever the
    // round may have set, each release queued behind its node's acquisition.
    let mut held = Held {
        inner: inner.clone(),
        proto,
        tail: vec![None; acquired.len()],
        acquired: acquired.clone(),
        deadline: started_at,
        releasing: None,
        armed: true,
    };
    // Unanswered requests go on in the background: a lock held on more nodes than the bare
    // quorum survives more failures. Releases on their nodes wait for them.
    let round = fanout::round(acquired, started_at).await;
    let lease = Duration::from_millis(ttl_ms);
    if round.decision == Decision::Reached
        && let Some(validity) = quorum::validity(lease, round.elapsed(), held.drift(lease))
    {
        held.deadline = round.decided_at + validity;
        return Ok((held, round));
    }
    let err = inner.acquire_error(label.resource, &round, lease);
    held.clean_up(&round).await;
    Err((err, round))
}

/// Whether an acquisition request did its write on the node (a quarantined node's yes is
/// written but not counted toward the quorum).
fn landed(outcome: &NodeOutcome) -> bool {
    matches!(outcome, NodeOutcome::Ok | NodeOutcome::Quarantined)
}
