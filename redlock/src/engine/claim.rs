//! A lock of any kind that may be set on some nodes: an attempt in progress, then the lock
//! it becomes. One acquisition round over every node, decided at the quorum, validity from
//! the round's own start; clean-up of a failed attempt; extension; release everywhere; and
//! release in the background when dropped.

use std::sync::Arc;
use std::time::{Duration, Instant};

use tracing::Instrument;

use crate::clock;
use crate::command::Command;
use crate::config::Ttl;
use crate::error::{Error, ErrorKind, NodeOutcome, Result};
use crate::node::Routes;
use crate::quorum::{self, Settled};
use crate::telemetry;
use crate::timing;

use super::Core;
use super::background::{self, Place};
use super::call::NodeCall;
use super::fencing;
use super::protocol::{Args, Op, Protocol};
use super::round::{self, Round};
use super::slot::Slots;
use super::undo::{Sent, Tracked};

/// What a hold that an extension found gone answers from then on.
const LOST: &str = "an extension found the hold gone; its keys were released then";

/// A hold of any kind on the nodes, released in the background if dropped while armed
/// (never blocking in `Drop`).
pub(crate) struct Claim<P: Protocol> {
    core: Arc<Core>,
    proto: Arc<P>,
    /// What errors and logs name: the resource, or the resources joined by `", "`.
    resource: Arc<str>,
    ttl: Ttl,
    deadline: Instant,
    /// How long a key of this claim may live on a node, as far as the requests sent so
    /// far could set it.
    reach: Reach,
    fence: Option<u64>,
    armed: bool,
    /// Whether it was granted (not an attempt still in progress).
    granted: bool,
    /// Whether an extension found the hold gone (see [`Claim::lose`]).
    lost: bool,
    /// Per node, the connection generation when the claim's first request was made: an
    /// undo that times out after it changed is sent again (see [`background`]).
    generations: background::Generations,
    /// When the granting round started: the hold's duration counts from here.
    since: Instant,
    /// Where its requests went out on each node: its undos follow them (see
    /// [`crate::route`]).
    routes: Routes,
    /// The nodes where the granting round saw no grant (refused, or no answer by the
    /// decision): a waiting writer's intent may be left there.
    ungranted: background::Nodes,
}

impl<P: Protocol> Claim<P> {
    /// One acquisition attempt: `proto`'s acquisition on every node at once, decided at the
    /// quorum; with `fenced`, a fencing token fixed on a quorum before the lock is handed
    /// out. A failed attempt takes back whatever it may have set.
    pub(crate) async fn acquire(
        core: &Arc<Core>,
        proto: P,
        ttl: Ttl,
        resource: Arc<str>,
        fenced: bool,
    ) -> Result<Self> {
        let span = tracing::debug_span!(
            target: "redlock",
            "lock_attempt",
            kind = proto.kind(),
            resource = &*resource,
            ttl_ms = ttl.ms(),
            outcome = tracing::field::Empty,
            elapsed = tracing::field::Empty,
            nodes = tracing::field::Empty,
        );
        let kind = proto.kind();
        let attempt = Self::acquire_round(core, proto, ttl, resource, fenced);
        let result = attempt.instrument(span.clone()).await;
        let outcome = match &result {
            Ok(_) => "granted",
            Err((err, _)) => err.kind().as_str(),
        };
        telemetry::attempted(kind, outcome);
        if !span.is_disabled() {
            let (outcome, round) = match &result {
                Ok((_, round)) => ("granted", round),
                Err((err, round)) => (err.kind().as_str(), round),
            };
            span.record("outcome", outcome);
            span.record("elapsed", tracing::field::debug(round.elapsed()));
            span.record("nodes", tracing::field::display(round.summary()));
            tracing::debug!(target: "redlock", parent: &span, "attempt decided");
        }
        result.map(|(claim, _)| claim).map_err(|(err, _)| err)
    }

    async fn acquire_round(
        core: &Arc<Core>,
        proto: P,
        ttl: Ttl,
        resource: Arc<str>,
        fenced: bool,
    ) -> Result<(Self, Round), (Error, Round)> {
        let started_at = clock::now();
        // Counted before the check, and dropped after the claim (declared later): a
        // shutdown waits for the round, the fencing round and the clean-up or take-back.
        let _acquisition = core.tasks.acquisition();
        if core.tasks.is_closing() {
            let report = Round::none(core.nodes.len(), started_at);
            let message = "the client takes no new locks";
            let err =
                Error::round(ErrorKind::Shutdown, message, &resource, report.report(&core.nodes));
            return Err((err, report));
        }
        let proto = Arc::new(proto);
        let command = Arc::new(proto.command(Op::Acquire, &Args::lease(ttl)));
        let n = core.nodes.len();
        // Armed from here: if this future is dropped mid-round, Drop releases whatever the
        // round may have set (behind it, and no create of it goes out after: see `route`).
        let mut claim = Self {
            core: core.clone(),
            proto: proto.clone(),
            resource,
            ttl,
            deadline: ttl.deadline(started_at),
            reach: Reach::of(started_at, ttl),
            fence: None,
            armed: true,
            granted: false,
            lost: false,
            generations: core.nodes.iter().map(|node| node.generation()).collect(),
            since: started_at,
            routes: Routes::new(n),
            ungranted: background::Nodes::new(),
        };
        let slots = Slots::new(n);
        let requests = round::Rest::new(
            &slots,
            (0..n).map(|i| claim.request(&slots, i, (Op::Acquire, &command), started_at)),
        );
        // Unanswered requests go on in the background: a lock held on more nodes than the
        // bare quorum survives more failures.
        let (round, rest) = round::run_acquire(requests, started_at, &core.nodes).await;
        round::finish(&core.tasks, rest);
        let err = match verdict(round.settled, round.decided_at, claim.deadline) {
            Verdict::Granted => {
                let fence = match fenced {
                    false => Ok(None),
                    true => {
                        let key = &proto.keys()[0];
                        fencing::fix_token(core, key, &claim.resource, claim.deadline)
                            .await
                            .map(Some)
                    }
                };
                match fence {
                    // Decided once the shutdown began, which waits for the take-back: the
                    // caller may never see the lock, nor the process live to release it.
                    Ok(_) if core.tasks.is_closing() => Error::round(
                        ErrorKind::Shutdown,
                        "the client shut down while the lock was being acquired: taken back",
                        &claim.resource,
                        round.report(&core.nodes),
                    ),
                    Ok(fence) => {
                        claim.fence = fence;
                        claim.ungranted = (round.outcomes.iter().enumerate())
                            .filter(|(_, outcome)| **outcome != NodeOutcome::Ok)
                            .map(|(i, _)| i)
                            .collect();
                        claim.note_hold();
                        return Ok((claim, round));
                    }
                    Err(err) => err,
                }
            }
            Verdict::Expired => Error::round(
                ErrorKind::Expired,
                format!(
                    "the round took {:?}, which with the drift allowance of {:?} leaves nothing of a {:?} lease",
                    round.elapsed(),
                    ttl.drift(),
                    ttl.duration()
                ),
                &claim.resource,
                round.report(&core.nodes),
            ),
            Verdict::Refused(kind) => {
                let mut report = round.report(&core.nodes);
                for (node, holder) in proto.holders() {
                    report.note_holder(node, holder);
                }
                Error::refused(kind, &claim.resource, report)
            }
        };
        claim.clean_up(&round).await;
        Err((err, round))
    }

    /// A request of this claim on node `i`; its slot is node `i`'s of `slots`.
    fn request(
        &self,
        slots: &Slots,
        i: usize,
        (op, command): (Op, &Arc<Command>),
        at: Instant,
    ) -> impl Future<Output = (usize, NodeOutcome)> + Send + 'static + use<P> {
        let proto = self.proto.clone();
        let command = command.clone();
        let since = self.generations[i];
        let (route, everywhere) = (Some(self.routes.get(i)), self.proto.records_intent());
        let also = self.proto.intent_routes().filter(|_| op == Op::Acquire).map(|r| r.get(i));
        let slot = slots.get(i);
        let request = NodeCall { node: i, op, command, slot, since, at, route, also, everywhere };
        request.send(&self.core, move |reply| {
            if op == Op::Acquire {
                proto.note_holder(i, reply);
            }
            proto.answer(op, reply)
        })
    }

    /// Takes back a failed attempt: awaited on the nodes that granted (they answered a
    /// moment ago), in the background on the nodes whose answer is unknown, not at all
    /// where the node answered about someone else's lock (ours is not there).
    async fn clean_up(mut self, round: &Round) {
        let refused = |outcome: &NodeOutcome| {
            matches!(
                outcome,
                NodeOutcome::Held | NodeOutcome::WriterWaiting | NodeOutcome::WrongType
            )
        };
        self.routes.close();
        let at = clock::now();
        let (mut args, until) = self.undo_args();
        // Short of a quorum even where its answer is unknown, the attempt never held the
        // key: its clean-up frees no quorum and tells no waiter. A node the attempt never
        // reached (down: no connection opened since it started) holds nothing of it, or
        // with one node down every split attempt would still tell.
        let nodes = &self.core.nodes;
        let may_hold = (round.outcomes.iter().enumerate())
            .filter(|&(i, outcome)| {
                !refused(outcome) && nodes[i].may_have_reached(self.generations[i])
            })
            .count();
        args.quiet = may_hold < quorum::quorum(round.outcomes.len());
        let command = Arc::new(self.proto.command(Op::CleanUp, &args));
        let slots = Slots::new(round.outcomes.len());
        let mut requests = Vec::with_capacity(round.outcomes.len());
        let mut outcomes = round::Outcomes::with_capacity(round.outcomes.len());
        for (i, outcome) in round.outcomes.iter().enumerate() {
            match outcome {
                outcome if refused(outcome) => outcomes.push(NodeOutcome::Absent),
                _ => {
                    requests.push(self.request(&slots, i, (Op::CleanUp, &command), at));
                    outcomes.push(NodeOutcome::Pending);
                }
            }
        }
        let granted: Vec<usize> = (round.outcomes.iter().enumerate())
            .filter(|(_, o)| matches!(o, NodeOutcome::Ok | NodeOutcome::Quarantined))
            .map(|(i, _)| i)
            .collect();
        // Registered before anything is awaited: a shutdown meanwhile names its nodes.
        let sent = (outcomes.iter().enumerate())
            .map(|(i, outcome)| (*outcome == NodeOutcome::Pending).then(|| slots.get(i)))
            .collect();
        let tracked = self.core.undos.track(self.proto.keys(), Sent::Some(sent));
        let answered = |_: &quorum::Tally, outcomes: &[NodeOutcome]| {
            let done = granted.iter().all(|&i| outcomes[i] != NodeOutcome::Pending);
            done.then_some(Settled::Reached)
        };
        let requests = round::Rest::new(&slots, requests);
        let (round, rest) = round::run_until(requests, outcomes, clock::now(), answered).await;
        let what = (Op::CleanUp, &command);
        self.finish_undos(rest, &round, tracked, what, ("clean-up", until), Place::Caller);
        self.armed = false;
    }

    /// Renews the lease to `ttl` from now on every node that still holds this claim, decided
    /// at the quorum. An extension that reached too few nodes deletes nothing and keeps the
    /// old validity; one that finds the hold gone ends it (see [`Claim::lose`]).
    pub(crate) async fn extend(&mut self, ttl: Duration) -> Result<()> {
        let result = self.extend_round(ttl).await;
        let outcome = telemetry::outcome(result.as_ref().map(|_| ()).map_err(Error::kind));
        telemetry::extended(self.proto.kind(), outcome);
        result
    }

    async fn extend_round(&mut self, ttl: Duration) -> Result<()> {
        if self.lost {
            return Err(self.local_error(ErrorKind::NotHeld, LOST));
        }
        let ttl = self.core.config.ttl(Some(ttl))?;
        if !self.is_valid() {
            return Err(self.local_error(ErrorKind::NotHeld, "validity is over: not extending"));
        }
        let started_at = clock::now();
        self.reach.cover(started_at, ttl);
        let command = Arc::new(self.proto.command(Op::Extend, &Args::lease(ttl)));
        let requests = self.everywhere(Op::Extend, &command, started_at);
        let deadline = ttl.deadline(started_at);
        // A node that refused scripts when the requests were made (read after them: that
        // only ever turns on) may get one that sets the lease outright, and it may land
        // whatever becomes of the round (a reply too late, this future dropped): from now
        // the hold counts no more than this lease.
        let outright = command.native().is_some_and(|native| native.outright().is_some());
        if outright && self.core.nodes.iter().any(|node| node.refuses_scripts()) {
            self.deadline = self.deadline.min(deadline);
        }
        let (round, rest) =
            round::run(requests, started_at, quorum::settle_hold, &self.core.nodes).await;
        // Unanswered extensions renew the nodes that answer late; they set nothing where the
        // key is gone, so one that lands after the release brings nothing back.
        round::finish(&self.core.tasks, rest);
        if round.decided_at >= self.deadline {
            // The lease ran out while we asked: another client may already hold the lock.
            let message = "validity ran out during the extension";
            let err = self.round_error(ErrorKind::NotHeld, message, &round);
            self.lose();
            return Err(err);
        }
        match round.settled {
            Settled::Reached => {
                let renewed = (round.outcomes.iter().enumerate())
                    .filter(|(_, outcome)| **outcome == NodeOutcome::Ok)
                    .map(|(i, _)| self.routes.get(i).bound(started_at).map(|b| started_at + b));
                let quorum = quorum::quorum(self.core.nodes.len());
                match renewed_until(deadline, renewed, quorum) {
                    Some(until) if until > round.decided_at => {
                        self.deadline = until;
                        self.ttl = ttl;
                        self.note_hold();
                        Ok(())
                    }
                    until => {
                        let message = match until {
                            Some(until) if until < deadline => {
                                "too many nodes keep the lease only as long as an earlier \
                                 extension that may still land there: over already"
                            }
                            _ => "the extension took the whole new lease",
                        };
                        Err(self.round_error(ErrorKind::Expired, message, &round))
                    }
                }
            }
            Settled::Failed(kind) => {
                let err = self.lost_error(kind, "extend", &round);
                if kind == ErrorKind::NotHeld {
                    self.lose();
                }
                Err(err)
            }
        }
    }

    /// Extends the hold to `hold` from now, then lets go of it without releasing it: its
    /// keys stay on the nodes until they expire. Whatever the extension's outcome nothing
    /// is released (a hold the extension found gone was released by it already): a keep
    /// exists so that nobody else gets the lock until then, and a release would undo that.
    pub(crate) async fn keep(mut self, hold: Duration) -> Result<()> {
        let result = self.extend(hold).await;
        if self.armed {
            self.count_end_unawaited("kept");
            self.armed = false;
        }
        result
    }

    /// Ends a hold that an extension found gone from too many nodes, or out of validity:
    /// its validity is over, and its keys are released in the background on every node,
    /// wherever they are left or the extension itself renewed them (an extension never
    /// sets a key again where it is gone). Otherwise a lock known to be lost would keep those
    /// nodes from everyone else for a whole lease. Later extensions, checks and the release
    /// answer from this without asking the nodes; the hold's end and its release are
    /// counted here, once.
    fn lose(&mut self) {
        self.count_end_unawaited(ErrorKind::NotHeld.as_str());
        self.deadline = self.deadline.min(clock::now());
        self.lost = true;
        // Tells this client's waiters, as any release does: they try again, and a release
        // of the key counted on a quorum within a node timeout is taken for this one.
        self.release_detached();
        self.granted = false;
        self.armed = false;
    }

    /// Releases on every node, returning at the quorum; the other nodes finish in the
    /// background. `Ok` means the lock was held until this call.
    pub(crate) async fn release(self) -> Result<()> {
        if self.lost {
            return Err(self.local_error(ErrorKind::NotHeld, LOST));
        }
        let kind = self.proto.kind();
        telemetry::held(kind, clock::since(self.since));
        let result = self.release_round().await;
        telemetry::released(
            kind,
            telemetry::outcome(result.as_ref().map(|_| ()).map_err(Error::kind)),
        );
        result
    }

    async fn release_round(mut self) -> Result<()> {
        let was_valid = self.is_valid();
        self.routes.close();
        let at = clock::now();
        let (args, until) = self.undo_args();
        let command = Arc::new(self.proto.command(Op::Release, &args));
        let (round, rest, tracked) = self.undo_round(Op::Release, &command, at).await;
        let what = (Op::Release, &command);
        self.finish_undos(rest, &round, tracked, what, ("release", until), Place::Caller);
        // Only now: if this future is dropped mid-round, Drop releases again (every
        // release is safe to repeat).
        self.armed = false;
        // A lease that ran out is over whatever the nodes answer: the client's own clock
        // says so, and too few answers must not turn that into "try again later".
        match round.settled {
            Settled::Reached if was_valid => Ok(()),
            _ if !was_valid => Err(self.round_error(
                ErrorKind::NotHeld,
                "the validity had run out before the release",
                &round,
            )),
            Settled::Reached => Ok(()),
            Settled::Failed(kind) => Err(self.lost_error(kind, "release", &round)),
        }
    }

    /// Asks the nodes whether a quorum still has this hold: `Ok(true)` if so, `Ok(false)`
    /// if too many no longer do, [`ErrorKind::Unavailable`] if too few answered.
    pub(crate) async fn check_held(&self) -> Result<bool> {
        if self.lost {
            return Ok(false);
        }
        let command = Arc::new(self.proto.command(Op::Check, &Args::lease(self.ttl)));
        let n = self.core.nodes.len();
        let slots = Slots::new(n);
        let at = clock::now();
        let requests = round::Rest::new(
            &slots,
            (0..n).map(|i| {
                let proto = self.proto.clone();
                let request = NodeCall::check(i, command.clone(), slots.get(i), at);
                request.send(&self.core, move |reply| proto.answer(Op::Check, reply))
            }),
        );
        let (round, rest) = round::run(requests, at, quorum::settle_hold, &self.core.nodes).await;
        round::finish(&self.core.tasks, rest);
        match round.settled {
            Settled::Reached => Ok(true),
            Settled::Failed(ErrorKind::NotHeld) => {
                self.note_release();
                Ok(false)
            }
            Settled::Failed(kind) => Err(self.lost_error(kind, "check", &round)),
        }
    }

    /// One undo round over every node, started `at`, decided at the quorum.
    async fn undo_round(
        &mut self,
        op: Op,
        command: &Arc<Command>,
        at: Instant,
    ) -> (
        Round,
        round::Rest<impl Future<Output = (usize, NodeOutcome)> + Send + 'static + use<P>>,
        Tracked,
    ) {
        let requests = self.everywhere(op, command, at);
        let tracked = self.track(&requests);
        let (round, rest) = round::run(requests, at, quorum::settle_hold, &self.core.nodes).await;
        // Decided: the key is free on a quorum (or the hold is gone), so the next waiter's
        // attempt is not refused by this hold.
        if op == Op::Release {
            self.note_releasing();
        }
        (round, rest, tracked)
    }

    /// Records the grant or extension, and tells this client's line for the request, if
    /// this hold has its turn, how long it keeps it (see `queue`).
    fn note_hold(&mut self) {
        self.granted = true;
        if self.proto.is_exclusive() {
            self.core.lines.extended(&*self.proto, self.deadline);
        }
    }

    /// Tells this client's line for the request that this hold is being released: if it
    /// has the line's turn, the next waiter attempts at once.
    fn note_releasing(&self) {
        self.note_release();
    }

    /// Counts the hold's end and its release, sent in the background, as `outcome`.
    fn count_end_unawaited(&self, outcome: &'static str) {
        telemetry::held(self.proto.kind(), clock::since(self.since));
        telemetry::released(self.proto.kind(), outcome);
    }

    /// Tells this client's line for the request that this hold is gone (if it was granted,
    /// and exclusive): if it had the line's turn, the next waiter attempts at once.
    fn note_release(&self) {
        if self.granted && self.proto.is_exclusive() {
            self.core.lines.released(&*self.proto);
        }
    }

    /// `op` on every node, in a round started `at`.
    fn everywhere(
        &self,
        op: Op,
        command: &Arc<Command>,
        at: Instant,
    ) -> round::Rest<impl Future<Output = (usize, NodeOutcome)> + Send + 'static + use<P>> {
        let n = self.core.nodes.len();
        let slots = Slots::new(n);
        round::Rest::new(&slots, (0..n).map(|i| self.request(&slots, i, (op, command), at)))
    }

    /// Registers `undos`, a round on every node, while they are in flight (a shutdown
    /// names their nodes).
    fn track<F>(&self, undos: &round::Rest<F>) -> Tracked
    where
        F: Future<Output = (usize, NodeOutcome)>,
    {
        let sent = Sent::Everywhere(undos.slots().clone());
        self.core.undos.track(self.proto.keys(), sent)
    }

    /// Leaves the undos of `round` still in flight to the background, in `place`; see
    /// [`background`]. `tracked` is the undos' registration: it stays until they are over.
    fn finish_undos<F>(
        &self,
        rest: round::Rest<F>,
        round: &Round,
        tracked: Tracked,
        (op, command): (Op, &Arc<Command>),
        (what, until): (&'static str, Instant),
        place: Place,
    ) where
        F: Future<Output = (usize, NodeOutcome)> + Send + 'static,
    {
        let pending: background::Nodes = (round.outcomes.iter().enumerate())
            .filter(|(_, outcome)| **outcome == NodeOutcome::Pending)
            .map(|(i, _)| i)
            .collect();
        let undos = background::Undos {
            core: self.core.clone(),
            remake: self.remake(op, command),
            until,
            what,
            resource: self.resource.clone(),
            generations: self.generations.clone(),
        };
        // What the round took itself and a task of the background would have handled:
        // the answers that came while it waited for its stragglers, and the undos that
        // failed: sent again whenever they came where the reason may pass, counted (for a
        // shutdown's report) and logged otherwise.
        let taken: background::Taken = (round.outcomes.iter().enumerate())
            .filter(|&(i, outcome)| round.lingered.contains(&i) || outcome.is_fault())
            .map(|(i, outcome)| (i, outcome.clone()))
            .collect();
        background::finish(undos, rest, pending, taken, Some(tracked), place);
    }

    /// Makes `command` again for a node: for undos sent again from the background.
    fn remake(&self, op: Op, command: &Arc<Command>) -> impl background::Remake + use<P> {
        let proto = self.proto.clone();
        let read = move |reply: &_| proto.answer(op, reply);
        let undone = (self.proto.keys(), Some(self.routes.clone()));
        background::remake(&self.core, undone, (op, command), read)
    }

    /// The release of a claim dropped while armed: on the client's own thread, so that it
    /// neither blocks nor depends on the runtime (if any) that dropped it. Its requests
    /// are made here and first polled there: on the caller's runtime they would wait for
    /// that runtime to run again, which a synchronous wrapper's current-thread runtime does
    /// only at its next call, and a multi-thread runtime only once a worker is free (the
    /// key would stay meanwhile, up to its lease).
    fn release_detached(&mut self) {
        // Issued here, not where its requests are first polled: from now on no create or
        // extension of the claim goes out, wherever its future runs.
        self.routes.close();
        let at = clock::now();
        let (args, until) = self.undo_args();
        let command = Arc::new(self.proto.command(Op::Release, &args));
        let requests = self.everywhere(Op::Release, &command, at);
        let tracked = self.track(&requests);
        self.note_releasing();
        let unsent = Round::none(self.core.nodes.len(), at);
        let what = (Op::Release, &command);
        self.finish_undos(requests, &unsent, tracked, what, ("release", until), Place::Own);
    }

    /// An undo's arguments, with the time it is sent again until at most (see
    /// [`resend_until`]).
    fn undo_args(&self) -> (Args, Instant) {
        let config = &self.core.config;
        let until = resend_until(self.reach, (config.connect_timeout, config.node_timeout));
        let held = self.granted && !self.lost && self.is_valid();
        (Args { quiet: false, held, ..Args::lease(self.ttl) }, until)
    }

    /// The nodes where the granting round saw no grant: refused there, or not answered by
    /// the time the round was decided.
    pub(crate) fn ungranted(&self) -> &[usize] {
        &self.ungranted
    }

    pub(crate) fn proto(&self) -> &P {
        &self.proto
    }

    pub(crate) fn core(&self) -> &Arc<Core> {
        &self.core
    }

    pub(crate) fn resource(&self) -> &str {
        &self.resource
    }

    pub(crate) fn deadline(&self) -> Instant {
        self.deadline
    }

    pub(crate) fn validity(&self) -> Duration {
        self.deadline.saturating_duration_since(clock::now())
    }

    pub(crate) fn is_valid(&self) -> bool {
        clock::now() < self.deadline
    }

    /// The TTL of the last grant or extension, as sent to Redis.
    pub(crate) fn ttl(&self) -> Duration {
        self.ttl.duration()
    }

    pub(crate) fn fence(&self) -> Option<u64> {
        self.fence
    }

    fn local_error(&self, kind: ErrorKind, message: &str) -> Error {
        Error::local(kind, message, &self.resource)
    }

    fn round_error(&self, kind: ErrorKind, message: &str, round: &Round) -> Error {
        Error::round(kind, message, &self.resource, round.report(&self.core.nodes))
    }

    /// The error of a release, extend or check round that missed the quorum.
    fn lost_error(&self, kind: ErrorKind, what: &str, round: &Round) -> Error {
        let message = match kind {
            ErrorKind::NotHeld => {
                format!("{} {what}: the hold is gone from too many nodes", self.proto.kind())
            }
            _ => format!("{} {what} reached too few nodes", self.proto.kind()),
        };
        Error::round(kind, message, &self.resource, round.report(&self.core.nodes))
    }
}

/// What an acquisition round makes of its attempt.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
enum Verdict {
    /// A quorum said yes before the validity deadline.
    Granted,
    /// A quorum said yes, but the round was decided at or past the deadline: nothing of the
    /// lease is left to hand out.
    Expired,
    /// No quorum, for the reason given.
    Refused(ErrorKind),
}

/// The verdict of an acquisition round settled as `settled` at `decided_at`, for a lease
/// valid until `deadline` (counted from the round's start, less the drift allowance).
fn verdict(settled: Settled, decided_at: Instant, deadline: Instant) -> Verdict {
    match settled {
        Settled::Reached if decided_at < deadline => Verdict::Granted,
        Settled::Reached => Verdict::Expired,
        Settled::Failed(kind) => Verdict::Refused(kind),
    }
}

/// How long the keys of a claim may live on a node: until `expires_by` by the client's
/// clock, plus `drift` if the node's clock runs slow; the widest of the leases its
/// creates and renewals were sent with, granted or not. And when the last of those
/// rounds started (`last_sent`).
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
struct Reach {
    expires_by: Instant,
    drift: Duration,
    last_sent: Instant,
}

impl Reach {
    /// A lease of `ttl` sent at `at`.
    fn of(at: Instant, ttl: Ttl) -> Self {
        Self { expires_by: at + ttl.duration(), drift: ttl.drift(), last_sent: at }
    }

    /// Counts a renewal to `ttl` sent at `at` as well: a longer lease's drift allowance
    /// is longer too, whether or not the renewal was granted.
    fn cover(&mut self, at: Instant, ttl: Ttl) {
        let other = Self::of(at, ttl);
        self.expires_by = self.expires_by.max(other.expires_by);
        self.drift = self.drift.max(other.drift);
        self.last_sent = self.last_sent.max(at);
    }
}

/// The validity deadline an extension round that reached its quorum counts: its own
/// (`own`), or less where the nodes that renewed it (with each one's bound, see
/// [`crate::route::Route::bound`]) cannot all keep it that long; the latest
/// that `quorum` of them keep. `None` if fewer than `quorum` renewed it.
fn renewed_until(
    own: Instant,
    caps: impl Iterator<Item = Option<Instant>>,
    quorum: usize,
) -> Option<Instant> {
    let mut kept: smallvec::SmallVec<[Instant; 8]> =
        caps.map(|cap| cap.map_or(own, |cap| cap.min(own))).collect();
    kept.sort_unstable_by(|a, b| b.cmp(a));
    kept.get(quorum.checked_sub(1)?).copied()
}

/// Until when an undo of a hold whose creates and renewals may set keys living as long as
/// `reach` says is sent again, on nodes given `(connect_timeout, node_timeout)`: the last of
/// them went out within [`timing::written_within`] of its round's start (a connect timeout,
/// then a node timeout for a send again on a new connection), and what it set lives its
/// lease, longer by the drift allowance if the node's clock runs slow. Past that nothing it
/// removes can exist.
fn resend_until(reach: Reach, (connect_timeout, node_timeout): (Duration, Duration)) -> Instant {
    reach.expires_by + timing::written_within(connect_timeout, node_timeout) + reach.drift
}

impl<P: Protocol> Drop for Claim<P> {
    fn drop(&mut self) {
        if self.armed {
            self.count_end_unawaited("dropped");
            self.release_detached();
        }
    }
}

#[cfg(test)]
mod tests {
    use smallvec::smallvec;

    use super::*;
    use crate::engine::slot::Slots;

    /// A round over nodes that answer `Ok` or `Held` after the given milliseconds, or never,
    /// decided like an acquisition; with the verdict for a lease of `ttl` counted from its
    /// start.
    async fn attempt(answers: &[(NodeOutcome, Option<u64>)], ttl: Ttl) -> (Verdict, Duration) {
        let started_at = clock::now();
        let answers = answers.to_vec();
        let slots = Slots::new(answers.len());
        let requests = round::Rest::new(
            &slots,
            answers.into_iter().enumerate().map(|(i, (outcome, after))| async move {
                match after {
                    Some(ms) => tokio::time::sleep(Duration::from_millis(ms)).await,
                    None => std::future::pending().await,
                }
                (i, outcome)
            }),
        );
        let outcomes = smallvec![NodeOutcome::Pending; slots.len()];
        let (round, _rest) =
            round::run_until(requests, outcomes, started_at, |t, _| quorum::settle_acquire(t))
                .await;
        (verdict(round.settled, round.decided_at, ttl.deadline(started_at)), round.elapsed())
    }

    #[tokio::test(start_paused = true)]
    async fn a_grant_needs_a_quorum_of_ok_replies_decided_within_the_validity() {
        use NodeOutcome::{Held, Ok};
        // 1 s, less a drift of 10 + 2 ms: valid for 988 ms from the round's start.
        let ttl = Ttl::new(Duration::from_secs(1), 0.01).unwrap();
        let ms = Duration::from_millis;
        let quick = [(Ok, Some(10)), (Ok, Some(20)), (Ok, Some(30)), (Held, None), (Ok, None)];
        assert_eq!(attempt(&quick, ttl).await, (Verdict::Granted, ms(30)), "the third yes");
        let late = [(Ok, Some(10)), (Ok, Some(20)), (Ok, Some(987)), (Ok, None), (Ok, None)];
        assert_eq!(attempt(&late, ttl).await, (Verdict::Granted, ms(987)));
        let late = [(Ok, Some(10)), (Ok, Some(20)), (Ok, Some(988)), (Ok, None), (Ok, None)];
        assert_eq!(attempt(&late, ttl).await, (Verdict::Expired, ms(988)), "nothing left");
        let held =
            [(Ok, Some(10)), (Held, Some(20)), (Held, Some(30)), (Held, Some(40)), (Ok, None)];
        let refused = Verdict::Refused(ErrorKind::NotAcquired);
        assert_eq!(attempt(&held, ttl).await, (refused, ms(40)), "a quorum is out of reach");
    }

    #[test]
    fn undos_are_sent_again_until_the_last_lease_plus_a_connect_two_node_timeouts_and_the_drift() {
        let at = clock::now();
        let ttl = Ttl::new(Duration::from_secs(10), 0.01).unwrap();
        let timeouts = (Duration::from_secs(1), Duration::from_millis(50));
        let reach = Reach::of(at, ttl);
        // 10 s + 1 s + 2 x 50 ms + (100 + 2) ms.
        let expected = at + Duration::from_millis(10_000 + 1_000 + 100 + 102);
        assert_eq!(resend_until(reach, timeouts), expected);
        // Each term counts in full.
        let later = |by: u64| expected + Duration::from_millis(by);
        assert_eq!(resend_until(reach, (timeouts.0 * 2, timeouts.1)), later(1000));
        assert_eq!(resend_until(reach, (timeouts.0, timeouts.1 * 2)), later(100));
        let mut longer = reach;
        longer.cover(at + Duration::from_secs(5), ttl);
        assert_eq!(resend_until(longer, timeouts), later(5000));
    }

    #[test]
    fn a_renewal_counts_no_longer_than_a_quorum_of_its_nodes_keep_it() {
        let t0 = clock::now();
        let own = t0 + Duration::from_secs(60);
        let early = t0 + Duration::from_secs(5);
        // Unbounded nodes: its own deadline.
        assert_eq!(renewed_until(own, [None, None, None].into_iter(), 2), Some(own));
        // An outright extension unanswered on one node of three: the others keep it.
        assert_eq!(renewed_until(own, [Some(early), None, None].into_iter(), 2), Some(own));
        // On two: what they keep, the latest that two nodes keep.
        let later = t0 + Duration::from_secs(7);
        let caps = [Some(early), Some(later), None].into_iter();
        assert_eq!(renewed_until(own, caps, 2), Some(later));
        // A bound past its own deadline bounds nothing.
        let past = own + Duration::from_secs(1);
        assert_eq!(renewed_until(own, [Some(past), Some(past)].into_iter(), 2), Some(own));
        assert_eq!(renewed_until(own, [None].into_iter(), 2), None);
    }

    #[test]
    fn a_renewal_to_a_longer_lease_counts_its_drift_allowance_granted_or_not() {
        let at = clock::now();
        let ttl = |secs| Ttl::new(Duration::from_secs(secs), 0.01).unwrap();
        let mut reach = Reach::of(at, ttl(10));
        reach.cover(at + Duration::from_secs(1), ttl(60));
        assert_eq!(reach, Reach::of(at + Duration::from_secs(1), ttl(60)), "60 s: 602 ms");
        // A shorter renewal later takes back neither.
        reach.cover(at + Duration::from_secs(2), ttl(10));
        let widest = Reach::of(at + Duration::from_secs(1), ttl(60));
        assert_eq!((reach.expires_by, reach.drift), (widest.expires_by, widest.drift));
        assert_eq!(reach.last_sent, at + Duration::from_secs(2), "the last round sent");
    }
}
