//! The coordinator: one attempt is one round over every node.

use std::fmt;
use std::future::Future;
use std::sync::Arc;
use std::sync::atomic::{AtomicU64, Ordering};
use std::time::{Duration, Instant};

use tracing::Instrument;

use crate::builder::{RedlockBuilder, check_ttl};
use crate::error::{Error, ErrorKind, NodeOutcome, Result};
use crate::fanout::{self, InFlight, Round};
use crate::lock::{Claim, Lock};
use crate::node::Node;
use crate::notify::{ReleaseWatch, Releases};
use crate::quorum::{self, Decision};
use crate::retry::{self, Retry};
use crate::script::Call;
use crate::{notify, protocol, token};

/// A client for distributed locks over N independent Redis masters.
///
/// Cheap to clone (an `Arc` inside) and `Send + Sync + 'static`: build one per process
/// and share it. Every node has one multiplexed connection, opened on first use and shared
/// by all clones and all locks.
#[derive(Clone)]
pub struct Redlock {
    inner: Arc<Inner>,
}

/// What every lock of one client shares.
pub(crate) struct Inner {
    pub(crate) nodes: Vec<Arc<Node>>,
    pub(crate) config: Config,
    releases: Releases,
}

/// The validated configuration.
#[derive(Debug)]
pub(crate) struct Config {
    pub(crate) ttl_ms: u64,
    pub(crate) node_timeout: Duration,
    pub(crate) drift_factor: f64,
    pub(crate) retry: Retry,
    pub(crate) key_prefix: String,
}

impl fmt::Debug for Redlock {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("Redlock")
            .field("nodes", &self.inner.nodes)
            .field("quorum", &self.quorum())
            .field("config", &self.inner.config)
            .finish()
    }
}

impl Redlock {
    /// Starts a [`RedlockBuilder`].
    pub fn builder() -> RedlockBuilder {
        RedlockBuilder::new()
    }

    pub(crate) fn from_config(nodes: Vec<Arc<Node>>, config: Config) -> Self {
        let releases = Releases::new(&nodes);
        Self { inner: Arc::new(Inner { nodes, config, releases }) }
    }

    /// How many nodes must agree: `N/2 + 1`.
    pub fn quorum(&self) -> usize {
        quorum::quorum(self.inner.nodes.len())
    }

    /// How many nodes are configured.
    pub fn node_count(&self) -> usize {
        self.inner.nodes.len()
    }

    /// The default lease, as sent to Redis (whole milliseconds).
    pub fn ttl(&self) -> Duration {
        Duration::from_millis(self.inner.config.ttl_ms)
    }

    /// One attempt to lock `resource` for the default TTL.
    ///
    /// Fails with [`ErrorKind::NotAcquired`] when another owner holds it,
    /// [`ErrorKind::Unavailable`] when too few nodes answered in time,
    /// [`ErrorKind::Expired`] when acquiring took the whole lease,
    /// [`ErrorKind::WrongType`] when the key is not a lock, and [`ErrorKind::Config`] for
    /// an empty resource name. A failed attempt removes whatever it may have set.
    pub async fn try_lock(&self, resource: &str) -> Result<Lock> {
        self.try_lock_for(resource, self.ttl()).await
    }

    /// One attempt to lock `resource` for `ttl`.
    pub async fn try_lock_for(&self, resource: &str, ttl: Duration) -> Result<Lock> {
        let ttl_ms = check_ttl(ttl, self.inner.config.drift_factor)?;
        let key = self.inner.key(resource)?;
        self.inner.attempt(resource, key, ttl_ms, Fencing::Off).await
    }

    /// Locks `resource` for the default TTL, retrying per the [`Retry`] policy.
    ///
    /// Between attempts it waits for a release of the resource (published by every
    /// release, received over one pub/sub connection per node shared by all waiters) or
    /// for the policy's jittered pause, whichever comes first, so a handoff does not wait
    /// for a polling interval, and a lost notification or a lock left to expire costs at
    /// most one pause.
    ///
    /// Cancellation-safe: dropping the future releases whatever the attempt in progress
    /// may have set and unsubscribes, leaving no lock and no subscription behind. Returns the last attempt's error when the
    /// policy gives up.
    pub async fn lock(&self, resource: &str) -> Result<Lock> {
        self.lock_for(resource, self.ttl()).await
    }

    /// Locks `resource` for `ttl`, retrying per the [`Retry`] policy.
    pub async fn lock_for(&self, resource: &str, ttl: Duration) -> Result<Lock> {
        let ttl_ms = check_ttl(ttl, self.inner.config.drift_factor)?;
        let key = self.inner.key(resource)?;
        self.retrying(&key, || self.inner.attempt(resource, key.clone(), ttl_ms, Fencing::Off))
            .await
    }

    /// One attempt to lock `resource` for the default TTL, with a fencing token.
    ///
    /// The lock's [`fencing_token()`](Lock::fencing_token) strictly increases with every
    /// grant of the resource, across clients, as long as the nodes keep their fencing
    /// counters (persistence): hand it to the protected resource with every write, and
    /// have the resource reject writes carrying a lower token than it has seen (see
    /// [`fence`](crate::fence)). It costs one more round trip per grant.
    ///
    /// How: a granting node bumps the resource's counter (`<key>:fence`) in the same
    /// script that sets the key and returns it; the client takes the highest counter
    /// among the granting nodes, then raises the counter to it on a quorum before handing
    /// the lock out (within the validity). Any later grant needs a quorum, which overlaps
    /// that quorum in at least one node whose counter is already at least our token, and
    /// that node's bump makes the later token larger.
    pub async fn try_lock_fenced(&self, resource: &str) -> Result<Lock> {
        let key = self.inner.key(resource)?;
        self.inner.attempt(resource, key, self.inner.config.ttl_ms, Fencing::On).await
    }

    /// [`try_lock_fenced`](Redlock::try_lock_fenced), retrying per the [`Retry`] policy.
    pub async fn lock_fenced(&self, resource: &str) -> Result<Lock> {
        let key = self.inner.key(resource)?;
        let ttl_ms = self.inner.config.ttl_ms;
        self.retrying(&key, || self.inner.attempt(resource, key.clone(), ttl_ms, Fencing::On)).await
    }

    /// The shared state, for the other lock kinds.
    pub(crate) fn inner(&self) -> &Arc<Inner> {
        &self.inner
    }

    /// Runs `attempt` until it succeeds, fails for good, or the [`Retry`] policy gives
    /// up; between attempts, waits for a release of `key` or the policy's pause.
    pub(crate) async fn retrying<T, F, Fut>(&self, key: &str, mut attempt: F) -> Result<T>
    where
        F: FnMut() -> Fut,
        Fut: Future<Output = Result<T>>,
    {
        let first = Instant::now();
        let mut attempts = 0;
        // Subscribed after the first failure only: an uncontended lock costs no subscription.
        let mut releases: Option<ReleaseWatch> = None;
        loop {
            attempts += 1;
            if let Some(releases) = &mut releases {
                releases.mark_seen();
            }
            let attempt_started = Instant::now();
            let err = match attempt().await {
                Ok(lock) => return Ok(lock),
                Err(err) => err,
            };
            if !err.is_retryable() {
                return Err(err);
            }
            let attempt_took = attempt_started.elapsed();
            let Some(pause) = self.inner.config.retry.next_pause(attempts, first.elapsed()) else {
                return Err(err);
            };
            let releases = releases.get_or_insert_with(|| self.inner.releases.watch(key));
            // Woken by a release on any node, or by the timer: notifications can be lost.
            tokio::select! {
                () = releases.released() => {
                    // Every waiter hears the same release: spread them over a few attempt
                    // durations, or they split the nodes' votes and nobody wins.
                    tokio::time::sleep(retry::random_up_to(attempt_took * 3)).await;
                }
                () = tokio::time::sleep(pause) => {}
            }
        }
    }
}

/// Whether an acquisition also takes a fencing token.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
enum Fencing {
    Off,
    On,
}

impl Inner {
    pub(crate) fn key(&self, resource: &str) -> Result<Arc<str>> {
        if resource.is_empty() {
            return Err(Error::config("the resource name is empty"));
        }
        let prefix = &self.config.key_prefix;
        Ok(if prefix.is_empty() { resource.into() } else { format!("{prefix}{resource}").into() })
    }

    fn drift(&self, lease: Duration) -> Duration {
        quorum::drift(lease, self.config.drift_factor)
    }

    /// One acquisition attempt: `SET NX` on every node, decided at the quorum.
    async fn attempt(
        self: &Arc<Self>,
        resource: &str,
        key: Arc<str>,
        ttl_ms: u64,
        fencing: Fencing,
    ) -> Result<Lock> {
        let span = tracing::debug_span!(
            target: "redlock",
            "lock_attempt",
            resource,
            ttl_ms,
            outcome = tracing::field::Empty,
            elapsed = tracing::field::Empty,
            nodes = tracing::field::Empty,
        );
        let result =
            self.acquire_round(resource, key, ttl_ms, fencing).instrument(span.clone()).await;
        if !span.is_disabled() {
            let (outcome, round) = match &result {
                Ok((_, round)) => ("granted", round),
                Err((err, round)) => (err.kind().as_str(), round),
            };
            span.record("outcome", outcome);
            span.record("elapsed", tracing::field::debug(round.elapsed()));
            span.record("nodes", tracing::field::display(outcomes_summary(&round.outcomes)));
            tracing::debug!(target: "redlock", parent: &span, "attempt decided");
        }
        result.map(|(lock, _)| lock).map_err(|(err, _)| err)
    }

    async fn acquire_round(
        self: &Arc<Self>,
        resource: &str,
        key: Arc<str>,
        ttl_ms: u64,
        fencing: Fencing,
    ) -> Result<(Lock, Round), (Error, Round)> {
        let token: Arc<str> = token::generate().into();
        let started_at = Instant::now();
        // Armed until the lock is handed out: if this future is dropped mid-round, the
        // claim releases whatever the round may have set.
        let mut claim = Claim::new(self.clone(), key.clone(), token.clone());
        let timeout = self.config.node_timeout;
        let counter: Option<Arc<str>> = (fencing == Fencing::On).then(|| fence_key(&key));
        let highest = Arc::new(AtomicU64::new(0));
        // One command for the round, shared by every node's request.
        let request = match &counter {
            None => Request::Plain(protocol::acquire_cmd(&key, &token, ttl_ms)),
            Some(counter) => {
                Request::Fenced(protocol::acquire_fenced_call(&key, counter, &token, ttl_ms))
            }
        };
        let requests: Vec<InFlight> = self
            .nodes
            .iter()
            .map(|node| match &request {
                Request::Plain(cmd) => fanout::shareable(fanout::bounded(
                    timeout,
                    protocol::acquire(node.clone(), cmd.clone(), token.clone()),
                )),
                Request::Fenced(call) => fanout::shareable(fanout::bounded(
                    timeout,
                    protocol::acquire_fenced(node.clone(), call.clone(), highest.clone()),
                )),
            })
            .collect();
        // Unanswered SETs go on in the background (one may still be waiting for its
        // connection): a lock held on more nodes than the bare quorum survives more
        // failures. Releases on their nodes wait for them.
        let round = fanout::round(requests.clone(), started_at).await;
        claim.track(fanout::still_in_flight(requests, &round));
        let lease = Duration::from_millis(ttl_ms);
        if round.decision == Decision::Reached
            && let Some(validity) = quorum::validity(lease, round.elapsed(), self.drift(lease))
        {
            let Some(counter) = counter else {
                let lock = Lock::new(claim, resource.len(), round.decided_at + validity, lease);
                return Ok((lock, round));
            };
            let fence = highest.load(Ordering::Acquire);
            let raised = self.raise_fence(&counter, fence, started_at).await;
            if raised.decision == Decision::Reached
                && let Some(validity) = quorum::validity(lease, raised.elapsed(), self.drift(lease))
            {
                let deadline = raised.decided_at + validity;
                let lock = Lock::new(claim, resource.len(), deadline, lease).with_fence(fence);
                return Ok((lock, round));
            }
            let kind = match raised.decision {
                Decision::Reached => ErrorKind::Expired,
                Decision::Failed => ErrorKind::Unavailable,
            };
            let message = "the fencing token could not be recorded on a quorum in time";
            let err = Error::round(kind, message, resource, raised.report(&self.nodes));
            self.clean_up(claim, &round).await;
            return Err((err, round));
        }
        let err = self.acquire_error(resource, &round, lease);
        self.clean_up(claim, &round).await;
        Err((err, round))
    }

    /// Raises the fencing counter to `fence` on a quorum; the round's elapsed time counts
    /// from the acquisition's start.
    async fn raise_fence(&self, counter: &Arc<str>, fence: u64, started_at: Instant) -> Round {
        let timeout = self.config.node_timeout;
        let call = protocol::raise_fence_call(counter, fence);
        let requests = self
            .nodes
            .iter()
            .map(|node| fanout::bounded(timeout, protocol::raise_fence(node.clone(), call.clone())))
            .collect();
        fanout::round(requests, started_at).await
    }

    /// Releases a failed attempt's keys: awaited on the nodes that granted (they answered
    /// a moment ago), in the background on the nodes whose answer is unknown. The claim
    /// stays armed until then: if this future is dropped, its `Drop` releases everywhere.
    async fn clean_up(&self, claim: Claim, round: &Round) {
        let call = self.release_call(claim.key(), claim.token());
        let mut granted = Vec::new();
        let mut uncertain = Vec::new();
        for (i, outcome) in round.outcomes.iter().enumerate() {
            let request = self.release_request(i, &call, claim.in_flight(i));
            match outcome {
                NodeOutcome::Ok | NodeOutcome::Quarantined => granted.push(request),
                // The node answered about someone else's key: ours is not there.
                NodeOutcome::Held | NodeOutcome::WrongType => {}
                _ => uncertain.push(request),
            }
        }
        fanout::in_background(uncertain);
        fanout::all(granted).await;
        claim.disarm();
    }

    pub(crate) fn acquire_error(&self, resource: &str, round: &Round, lease: Duration) -> Error {
        let n = self.nodes.len();
        let spare = n - quorum::quorum(n);
        // A key of another type on a minority is someone else's data: it blocks like a holder.
        let held = round.count(|o| matches!(o, NodeOutcome::Held | NodeOutcome::WrongType));
        // Quarantined nodes are as good as down for the quorum.
        let faulty = round.count(|o| o.is_fault() || *o == NodeOutcome::Quarantined);
        let (kind, message) = if round.decision == Decision::Reached {
            (
                ErrorKind::Expired,
                format!(
                    "a quorum took {:?}, which with the drift allowance of {:?} leaves nothing of a {lease:?} lease",
                    round.elapsed(),
                    self.drift(lease)
                ),
            )
        } else if round.count(|o| *o == NodeOutcome::WrongType) > spare {
            (ErrorKind::WrongType, String::new())
        } else if held > spare || (faulty <= spare && held > 0 && held >= faulty) {
            (ErrorKind::NotAcquired, String::new())
        } else {
            (ErrorKind::Unavailable, String::new())
        };
        Error::round(kind, message, resource, round.report(&self.nodes))
    }

    /// Releases `key` where it holds `token`, on every node; returns at the decision and
    /// finishes the other nodes in the background.
    pub(crate) async fn release(
        &self,
        key: &Arc<str>,
        token: &Arc<str>,
        in_flight: Vec<Option<InFlight>>,
    ) -> Round {
        let requests = self.release_requests(key, token, in_flight);
        fanout::round(requests, Instant::now()).await
    }

    /// Fire-and-forget release, for `Drop` paths. Needs a Tokio runtime.
    pub(crate) fn release_detached(
        &self,
        key: &Arc<str>,
        token: &Arc<str>,
        in_flight: Vec<Option<InFlight>>,
    ) {
        fanout::in_background(self.release_requests(key, token, in_flight));
    }

    fn release_requests(
        &self,
        key: &Arc<str>,
        token: &Arc<str>,
        mut in_flight: Vec<Option<InFlight>>,
    ) -> Vec<impl Future<Output = NodeOutcome> + Send + 'static> {
        in_flight.resize(self.nodes.len(), None);
        let call = self.release_call(key, token);
        in_flight
            .into_iter()
            .enumerate()
            .map(|(i, set)| self.release_request(i, &call, set))
            .collect()
    }

    fn release_call(&self, key: &str, token: &str) -> Arc<Call> {
        protocol::release_call(key, token, &notify::channel(key))
    }

    /// The compare-and-delete on node `i`, sent only after our `SET` there (if one is
    /// still in flight) has been answered or has timed out, so it can never overtake it.
    fn release_request(
        &self,
        i: usize,
        call: &Arc<Call>,
        in_flight: Option<InFlight>,
    ) -> impl Future<Output = NodeOutcome> + Send + 'static + use<> {
        let (node, call) = (self.nodes[i].clone(), call.clone());
        let timeout = self.config.node_timeout;
        async move {
            // Outside the timeout: the SET is bounded by its own, and a release whose clock
            // ran while it waited could time out before it is even queued.
            if let Some(set) = in_flight {
                set.await;
            }
            fanout::bounded(timeout, protocol::release(node, call)).await
        }
    }

    /// Renews `key` where it holds `token`; returns the round, the new validity, and the
    /// requests still in flight per node. Each node's request waits for the one still in
    /// flight there, and unanswered ones finish in the background (healing nodes that
    /// answer late), always ahead of a later release.
    pub(crate) async fn extend(
        &self,
        key: &Arc<str>,
        token: &Arc<str>,
        ttl_ms: u64,
        mut in_flight: Vec<Option<InFlight>>,
    ) -> (Round, Option<Duration>, Vec<Option<InFlight>>) {
        in_flight.resize(self.nodes.len(), None);
        let timeout = self.config.node_timeout;
        let call = protocol::extend_call(key, token, ttl_ms);
        let requests: Vec<InFlight> = self
            .nodes
            .iter()
            .zip(in_flight)
            .map(|(node, previous)| {
                let (node, call) = (node.clone(), call.clone());
                fanout::shareable(async move {
                    if let Some(previous) = previous {
                        previous.await;
                    }
                    fanout::bounded(timeout, protocol::extend(node, call)).await
                })
            })
            .collect();
        let round = fanout::round(requests.clone(), Instant::now()).await;
        let lease = Duration::from_millis(ttl_ms);
        let validity = match round.decision {
            Decision::Reached => quorum::validity(lease, round.elapsed(), self.drift(lease)),
            Decision::Failed => None,
        };
        let in_flight = fanout::still_in_flight(requests, &round);
        (round, validity, in_flight)
    }

    /// Asks every node whether it still holds `token`.
    pub(crate) async fn check(&self, key: &Arc<str>, token: &Arc<str>) -> Round {
        let timeout = self.config.node_timeout;
        let requests = self
            .nodes
            .iter()
            .map(|node| {
                fanout::bounded(timeout, protocol::holds(node.clone(), key.clone(), token.clone()))
            })
            .collect();
        fanout::round(requests, Instant::now()).await
    }

    /// The error for a release or extend round that missed the quorum.
    pub(crate) fn lost_error(&self, resource: &str, what: &str, round: &Round) -> Error {
        let spare = self.nodes.len() - quorum::quorum(self.nodes.len());
        let gone = round.count(|o| matches!(o, NodeOutcome::Absent | NodeOutcome::Held));
        let kind = if gone > spare { ErrorKind::NotHeld } else { ErrorKind::Unavailable };
        let message = match kind {
            ErrorKind::NotHeld => format!("{what}: the lock is gone from too many nodes"),
            _ => format!("{what} reached too few nodes"),
        };
        Error::round(kind, message, resource, round.report(&self.nodes))
    }
}

/// One acquisition command for a whole round.
enum Request {
    Plain(Arc<redis::Cmd>),
    Fenced(Arc<Call>),
}

/// The key of a resource's fencing counter.
fn fence_key(key: &str) -> Arc<str> {
    format!("{key}:fence").into()
}

fn outcomes_summary(outcomes: &[NodeOutcome]) -> String {
    let names: Vec<String> = outcomes.iter().map(ToString::to_string).collect();
    names.join(", ")
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn client_and_lock_can_move_across_tasks() {
        fn send_sync_static<T: Send + Sync + 'static>() {}
        fn send_static<T: Send + 'static>() {}
        send_sync_static::<Redlock>();
        send_static::<Lock>();
        send_sync_static::<Error>();
    }
}
