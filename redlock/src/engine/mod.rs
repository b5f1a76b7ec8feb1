//! The engine every lock kind runs on: one round over the nodes per operation, the quorum
//! and validity accounting, clean-up of failed attempts, release everywhere, extension,
//! fencing after the grant, waiting woken by notifications, and the ordering rules that
//! keep an undo behind what it undoes.
//!
//! A kind only says what to send to one node and what the reply means ([`Protocol`]).
//! Nothing in here knows the client or the builder.

mod background;
mod call;
pub(crate) mod claim;
mod fencing;
mod notify;
pub(crate) mod protocol;
mod queue;
mod round;
mod slot;
mod undo;
mod wait;

use std::sync::Arc;

pub(crate) use crate::channel::channel;
pub(crate) use claim::Claim;
pub(crate) use protocol::{Answer, Op, Protocol};

use crate::command::Command;
use crate::config::{Config, Ttl};
use crate::error::{ErrorKind, NodeOutcome, Result, ShutdownReport};
use crate::node::{Node, Routes};
use crate::retry::Retry;
use crate::tasks::Tasks;

use notify::Releases;
use queue::Lines;
use undo::Undos;

/// What every lock of one client shares.
pub(crate) struct Core {
    pub(crate) nodes: Box<[Arc<Node>]>,
    pub(crate) config: Config,
    pub(crate) tasks: Arc<Tasks>,
    releases: Releases,
    /// This client's waiters for exclusive holds, one line per request.
    lines: Arc<Lines>,
    undos: Arc<Undos>,
}

impl std::fmt::Debug for Core {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Core").field("nodes", &self.nodes).field("config", &self.config).finish()
    }
}

impl Core {
    pub(crate) fn new(nodes: Vec<Arc<Node>>, config: Config, tasks: Arc<Tasks>) -> Self {
        let releases = Releases::new(&nodes);
        let undos = Undos::new(nodes.len());
        Self { nodes: nodes.into(), config, tasks, releases, lines: Arc::default(), undos }
    }
}

impl Core {
    /// Opens every node's connection at once (see `Redlock::connect`): `Ok` with each
    /// node's outcome when a quorum connected.
    pub(crate) async fn connect(&self) -> Result<Vec<crate::NodeReport>> {
        let started = crate::clock::now();
        let connects = self.nodes.iter().map(|node| async move {
            match node.open_now().await {
                Ok(()) => NodeOutcome::Ok,
                Err(failure) => failure.outcome(),
            }
        });
        let outcomes: round::Outcomes = futures::future::join_all(connects).await.into();
        let connected = outcomes.iter().filter(|o| **o == NodeOutcome::Ok).count();
        let round = round::Round {
            outcomes,
            settled: crate::quorum::Settled::Reached,
            started_at: started,
            decided_at: crate::clock::now(),
            lingered: Default::default(),
        };
        let report = round.report(&self.nodes);
        if connected >= report.quorum {
            return Ok(report.nodes);
        }
        let message =
            format!("only {connected} of {} nodes could be connected to", self.nodes.len());
        Err(crate::error::Error::client(ErrorKind::Unavailable, message, report))
    }
}

impl Core {
    /// Takes no new locks, has every auto-extended lock released, stops the notification
    /// subscribers and the waits, and waits until `deadline` for the acquisitions under
    /// way (each answers `Shutdown` and takes back what it set, unless decided before)
    /// and the background work (releases above all).
    ///
    /// `Ok` with a report naming the nodes where a release was still in flight or failed
    /// (their keys stay there until their leases end), as long as they are no more than a
    /// quorum can spare: each of those releases was then confirmed on a quorum. An error
    /// when more nodes than that are unconfirmed, or an acquisition was not over.
    pub(crate) async fn shutdown(&self, deadline: std::time::Instant) -> Result<ShutdownReport> {
        let started = std::time::Instant::now();
        let failed_before = self.undos.failures();
        self.tasks.close();
        self.releases.stop();
        self.tasks.idle_by(deadline).await;
        let acquisitions = self.tasks.acquisitions();
        let failed_after = self.undos.failures();
        let (in_flight, faults) = (self.undos.in_flight(), self.undos.faults());
        let outcomes: round::Outcomes = (0..self.nodes.len())
            .map(|i| {
                let unconfirmed = in_flight[i] || failed_after[i] > failed_before[i];
                match (unconfirmed, &faults[i]) {
                    (false, _) => NodeOutcome::Ok,
                    (true, Some(fault)) => fault.clone(),
                    // Sent, and not answered by the deadline.
                    (true, None) => NodeOutcome::TimedOut,
                }
            })
            .collect();
        let round = round::Round {
            outcomes,
            settled: crate::quorum::Settled::Reached,
            started_at: started,
            decided_at: std::time::Instant::now(),
            lingered: Default::default(),
        };
        let report = ShutdownReport::new(round.report(&self.nodes));
        let unconfirmed = report.unconfirmed().count();
        let spare = self.nodes.len().saturating_sub(report.quorum());
        if acquisitions == 0 && unconfirmed <= spare {
            return Ok(report);
        }
        let mut problems = Vec::with_capacity(2);
        if unconfirmed > spare {
            problems.push(format!(
                "releases not confirmed on {unconfirmed} of {} nodes, more than the {spare} a \
                 quorum can spare: a hold may still be held until its lease ends",
                self.nodes.len()
            ));
        }
        if acquisitions > 0 {
            // Their futures were not polled to their end (a blocked runtime, a future
            // kept but no longer awaited): a process exiting now leaves what they set.
            problems.push(format!(
                "{acquisitions} acquisition(s) still under way: what they set stays until \
                 their lease ends if the process exits before they answer"
            ));
        }
        let message = problems.join("; ");
        Err(crate::error::Error::client(ErrorKind::Shutdown, message, report.into_round()))
    }
}

/// How to acquire: the lease, whether to wait, whether to fence.
#[derive(Clone, Debug)]
pub(crate) struct Plan {
    pub(crate) ttl: Ttl,
    /// `None`: a single attempt.
    pub(crate) retry: Option<Retry>,
    pub(crate) fenced: bool,
}

/// Acquires per `plan`, with a fresh protocol value (a fresh token) from `attempt` for each
/// attempt; `resource` names the lock in errors and logs. `withdrawal`, if any, goes to
/// every node when a wait ends, with or without the lock (given up, failed or cancelled),
/// but only to the nodes where the grant was not seen when the first attempt was granted
/// (see [`GiveUp`]).
pub(crate) async fn obtain<P, F>(
    core: &Arc<Core>,
    plan: &Plan,
    resource: Arc<str>,
    mut attempt: F,
    withdrawal: Option<(Command, Routes)>,
) -> Result<Claim<P>>
where
    P: Protocol,
    F: FnMut() -> P,
{
    let started = std::time::Instant::now();
    let first = attempt();
    let kind = first.kind();
    let result = async {
        // Dropped last (after the withdrawal's `GiveUp`): a shutdown waits for the wait,
        // which it ends, and for the withdrawal sent when it ends.
        let _acquisition = core.tasks.acquisition();
        let (ttl, fenced) = (plan.ttl, plan.fenced);
        let Some(retry) = &plan.retry else {
            return Claim::acquire(core, first, ttl, resource, fenced).await;
        };
        let keys = first.keys().clone();
        let request = queue::Request::of(&first);
        // In this client's line for the request, if it queues; left when the wait ends.
        let mut ticket = request.queues().then(|| core.lines.join(&request));
        let generations = core.nodes.iter().map(|node| node.generation()).collect();
        let nodes = (0..core.nodes.len()).collect();
        let (withdrawal, routes) = withdrawal.unzip();
        let routes = routes.unwrap_or_else(|| Routes::new(core.nodes.len()));
        let mut give_up = GiveUp {
            core,
            keys,
            resource: resource.clone(),
            withdrawal,
            nodes,
            generations,
            routes,
        };
        let mut next = Some(first);
        let mut attempts = 0u32;
        // Woken by the releases of any of its keys.
        let claim = wait::until_acquired(core, retry, &request, ticket.as_mut(), &resource, || {
            attempts = attempts.saturating_add(1);
            let proto = next.take().unwrap_or_else(&mut attempt);
            Claim::acquire(core, proto, ttl, resource.clone(), fenced)
        })
        .await?;
        if let Some(ticket) = ticket {
            ticket.granted(claim.proto().token(), claim.deadline());
        }
        // The wait's intent, recorded by refusals and kept by grants (a grant of an
        // attempt that fails is cleaned up, and the wait must still hold readers back
        // there), would refuse readers where it is for its whole lifetime: it is withdrawn
        // now (an attempt of the wait still on its way then records no intent, and the
        // grant itself is not refused). Granted at the first attempt, it can be only where
        // that attempt saw no grant (refused, or no answer by the decision), which spares an
        // uncontended writer a round; after a failed attempt, anywhere. (A node that refused
        // a first send and granted its re-send keeps it until the release removes it or it
        // expires, refusing no one the grant does not.)
        if attempts > 1 {
            give_up.nodes = (0..core.nodes.len()).collect();
        } else {
            give_up.nodes = claim.ungranted().iter().copied().collect();
        }
        if give_up.nodes.is_empty() {
            give_up.withdrawal = None;
        }
        Ok(claim)
    }
    .await;
    let outcome = match &result {
        Ok(_) => "granted",
        Err(err) => err.kind().as_str(),
    };
    crate::telemetry::acquired(kind, outcome, started.elapsed());
    result
}

/// Acquires per `plan` where one attempt is `attempt()` (which may run several rounds, as a
/// counting lock's try of its slots does), waiting between attempts for a release
/// published on `wake_key`'s channel or the policy's pause. The hold is one that does not
/// exclude every other on `wake_key`: this client's waiters do not queue behind each other
/// (see `queue`).
pub(crate) async fn obtain_any<T, F, Fut>(
    core: &Arc<Core>,
    plan: &Plan,
    kind: &'static str,
    wake_key: Arc<str>,
    mut attempt: F,
) -> Result<T>
where
    F: FnMut() -> Fut,
    Fut: std::future::Future<Output = Result<T>>,
{
    let started = std::time::Instant::now();
    let result = async {
        // Held across the wait: a shutdown waits for it and ends it.
        let _acquisition = core.tasks.acquisition();
        let Some(retry) = &plan.retry else { return attempt().await };
        let request = queue::Request::shared(kind, wake_key);
        wait::until_acquired(core, retry, &request, None, "", attempt).await
    }
    .await;
    let outcome = match &result {
        Ok(_) => "granted",
        Err(err) => err.kind().as_str(),
    };
    crate::telemetry::acquired(kind, outcome, started.elapsed());
    result
}

/// Sends a wait's withdrawal (of a writer's intent) when the wait ends, however it ends:
/// to every node, or, when its first attempt was granted, to the nodes where that grant
/// was not seen.
struct GiveUp<'a> {
    core: &'a Arc<Core>,
    keys: protocol::Keys,
    resource: Arc<str>,
    withdrawal: Option<Command>,
    /// The nodes it goes to.
    nodes: background::Nodes,
    /// Where the wait's attempts went out: the withdrawal goes behind them.
    routes: Routes,
    /// Per node, the connection generation when the wait began (see `background`).
    generations: background::Generations,
}

impl Drop for GiveUp<'_> {
    fn drop(&mut self) {
        let Some(command) = self.withdrawal.take() else { return };
        // Issued here: no attempt of the wait goes out from now on, and the withdrawal goes
        // behind those not answered yet. One whose connection broke with it written may
        // still record the intent after it: the intent then lives its short lifetime.
        self.routes.close();
        let command = Arc::new(command);
        let core = self.core;
        let n = core.nodes.len();
        let slots = slot::Slots::new(n);
        let nodes = std::mem::take(&mut self.nodes);
        let sent = (0..n).map(|i| nodes.contains(&i).then(|| slots.get(i))).collect();
        let tracked = core.undos.track(&self.keys, undo::Sent::Some(sent));
        let at = crate::clock::now();
        let requests = round::Rest::new(
            &slots,
            nodes.iter().map(|&i| {
                let request = call::NodeCall {
                    node: i,
                    op: Op::Release,
                    command: command.clone(),
                    slot: slots.get(i),
                    since: self.generations[i],
                    at,
                    route: Some(self.routes.get(i)),
                    also: None,
                    everywhere: true,
                };
                request.send(core, protocol::script_answer)
            }),
        );
        // Rare (a writer giving up): on the client's own thread from the start. An intent
        // lives for a lease at most.
        let remake = background::remake(
            core,
            (&self.keys, Some(self.routes.clone())),
            (Op::Release, &command),
            protocol::script_answer,
        );
        let undos = background::Undos {
            core: core.clone(),
            remake,
            until: crate::clock::now() + core.config.ttl.duration(),
            what: "withdrawal",
            resource: self.resource.clone(),
            generations: self.generations.clone(),
        };
        let pending = nodes.clone();
        let taken = background::Taken::new();
        background::finish(undos, requests, pending, taken, Some(tracked), background::Place::Own);
    }
}
