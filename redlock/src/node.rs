//! One Redis master: lazily opened multiplexed connections, one per place a caller runs in,
//! each shared by every caller there and re-opened after it breaks.
//!
//! A request goes out on a connection whose driver (the redis-rs task that writes and reads
//! the socket) runs where its caller does, so that it crosses no thread: each multi-thread
//! runtime that uses the client gets its own connection to each node, opened on first use
//! there and dropped when that runtime ends; the client's own thread has one for its
//! background work and for every caller whose runtime may sit idle (see [`Place`]). Nothing
//! orders one connection's requests with another's: an undo goes out behind what it undoes
//! on that request's connection (see [`crate::route`]).
//!
//! Requests carry no timer: callers bound them. A connect is bounded by the connect
//! timeout, and a caller may wait for it first ([`Node::connect_first`]) so that its own
//! timer covers only its exchange with the node: a cold start over a slow link (TCP, TLS,
//! `SCRIPT LOAD`, `INFO`: several round trips) does not eat the node timeout of the
//! first request. Every new connection reads the node's `INFO server` before it is used
//! (restart quarantine, the server check).

use crate::timing;

use std::future::Future;
use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::sync::{Arc, LazyLock, Mutex, MutexGuard, PoisonError, Weak};
use std::time::{Duration, Instant};

use futures::future::{BoxFuture, FutureExt, Shared};
use redis::aio::MultiplexedConnection;
use redis::{AsyncConnectionConfig, Client, Cmd, RedisError, RedisResult, Value};
use tokio::runtime::{Handle as Runtime, Id as RuntimeId, RuntimeFlavor};
use tokio::sync::oneshot;
use tokio::task::JoinHandle;

use crate::command::{self, Command, Resend};
use crate::denied;
use crate::failure::Failure;
use crate::native::{self, Native, Offers};
use crate::quarantine;
use crate::route::{self, Extension, Fate};
use crate::server;
use crate::tasks::Tasks;

/// Why a connect failed when it panicked: Tokio panics when a runtime without I/O opens a
/// socket, and nothing else in a connect does.
const NO_IO: &str = "the connect panicked: a runtime without I/O (built without `enable_io`)";

/// What `err` says went wrong, with the explanation of a refusal where one is known.
fn failure_of(err: &RedisError) -> Failure {
    match err.code() {
        // "CODE detail", as the server said it: the code is what operators search for.
        Some(code) => {
            let message = format!("{code} {}", err.detail().unwrap_or_default());
            let explained = command::explain_refusal(&message)
                .or_else(|| command::explain_scripting_refusal(&message));
            match explained {
                Some(explained) => Failure::Denied(explained.into()),
                None if code == "NOPERM" => Failure::Denied(message.into()),
                None if code == "NOAUTH" => Failure::Denied(denied::NOAUTH.into()),
                None => Failure::Server { code: code.into(), message: message.into() },
            }
        }
        None => Failure::Unreachable(err.to_string().into()),
    }
}

/// A hold's routes (see [`crate::route`]) over this module's connections.
pub(crate) type Routes = route::Routes<Handle>;
/// One node's route of a hold.
pub(crate) type Route = route::Route<Handle>;
/// Where an undo goes on one node.
pub(crate) type Undo = route::Undo<Handle>;

/// A node's answer to one command.
#[derive(Debug)]
pub(crate) struct Reply {
    pub(crate) value: Result<Value, Failure>,
    /// An earlier send of the command may have run before the one this answers (its
    /// connection dropped with it, and it was sent again): an undo's answer then cannot
    /// tell what it found from what that earlier send left.
    pub(crate) resent: bool,
    /// The command may have reached the node (false when no connection could be had).
    pub(crate) sent: bool,
}

impl Reply {
    /// No connection could be had: nothing left the client.
    pub(crate) fn unconnected(failure: Failure) -> Self {
        Reply { value: Err(failure), resent: false, sent: false }
    }

    /// A reply to `value`, the command's first send.
    pub(crate) fn of(value: Result<Value, Failure>) -> Self {
        Reply { value, resent: false, sent: true }
    }

    /// What the reply says of whether the node hangs: `Some(false)` when the node itself
    /// answered (a value or an error reply), `Some(true)` when a connection to it could not
    /// be opened in time, `None` when no connection could be had or it broke (a dead node:
    /// whether requests that do reach it stall is not known).
    pub(crate) fn hangs(&self) -> Option<bool> {
        match &self.value {
            Ok(_) | Err(Failure::Server { .. } | Failure::Denied(_)) => Some(false),
            Err(Failure::ConnectTimedOut) => Some(true),
            Err(Failure::Unreachable(_) | Failure::Refused(_)) => None,
        }
    }

    /// Whether the node could not be reached for a reason that rarely lasts: a connection
    /// that broke (with the command perhaps sent) or could not be opened. Not a refused
    /// connection (nothing listens there), a timeout (the node may be hung) or a reply.
    pub(crate) fn is_lost(&self) -> bool {
        matches!(self.value, Err(Failure::Unreachable(_)))
    }
}

/// Asks whether a cached connection is still open before a command that must not run twice.
static PING: LazyLock<Cmd> = LazyLock::new(|| redis::cmd("PING"));

/// An open connection and what its server was found to offer.
type Opened = (MultiplexedConnection, Arc<Offers>);

type Connecting = Shared<BoxFuture<'static, Result<Opened, Failure>>>;

enum State {
    Idle,
    Connecting { generation: u64, future: Connecting },
    Ready { generation: u64, connection: MultiplexedConnection, offers: Arc<Offers> },
}

/// Where a connection's driver (the redis-rs task that writes and reads its socket) runs,
/// and so which requests use it: a request goes out on a connection driven where its
/// caller runs, so that it crosses no thread on its way out nor on its way back.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
enum Place {
    /// The client's own thread: its background work (auto-extension, undos handed over
    /// from a runtime that ended, locks dropped outside any runtime), callers outside any
    /// runtime, and current-thread runtimes. A current-thread runtime runs its tasks only
    /// while its `block_on` does: a synchronous wrapper that calls it now and then would
    /// leave what a call queued last (a release's slowest nodes, handed to the background
    /// at the quorum) unwritten until its next call.
    Own,
    /// A multi-thread runtime: its workers drive the connection whatever its callers do.
    Runtime(RuntimeId),
}

impl Place {
    /// Where the caller runs.
    fn here() -> Self {
        match Runtime::try_current() {
            Ok(runtime) if runtime.runtime_flavor() == RuntimeFlavor::MultiThread => {
                Self::Runtime(runtime.id())
            }
            _ => Self::Own,
        }
    }
}

/// A multi-thread runtime's connection to the node.
struct Lane {
    runtime: RuntimeId,
    /// Tells this lane from a later one of a runtime that got the same id (ids are unique
    /// only among the runtimes still running).
    serial: u64,
    state: State,
    /// The runtime has no I/O driver (built without `enable_io`): a connect there panicked,
    /// and its callers use the own thread's connection instead.
    no_io: bool,
    /// Dropped with the lane: ends the task that removes it when its runtime ends.
    _watched: oneshot::Sender<()>,
}

/// Every connection of a node: one per place.
struct Lanes {
    /// Connections started so far, in every place: each one's generation.
    started: u64,
    /// Lanes made so far: each one's serial.
    made: u64,
    own: State,
    /// One per multi-thread runtime that sent something to the node and still runs: a
    /// service has one or two.
    runtimes: Vec<Lane>,
    /// While the node's connects keep failing: no new one before a pause.
    down: Option<Down>,
}

impl Default for Lanes {
    fn default() -> Self {
        Self { started: 0, made: 0, own: State::Idle, runtimes: Vec::new(), down: None }
    }
}

/// What the node's last connects found while they kept failing, and when the next may
/// start: at once after one failed connect (a reset, a restart: the next one is likely to
/// open), then after a pause from [`timing::CONNECT_BACKOFF`]'s first, doubling per failed
/// connect up to its last. Without it, every request and every undo sent again in the
/// background opened a connect of its own to a node that is down: over a thousand a second
/// with a few hundred undos waiting, each costing the client a socket and a task.
#[derive(Clone, Debug)]
struct Down {
    failure: Failure,
    pause: Duration,
    until: Instant,
    /// The connects started when it was recorded: one started since failing too counts
    /// as the next failure; one started before it (another place's, in the same outage)
    /// does not.
    known_at: u64,
}

impl Down {
    /// After a connect that found `failure` at `now`, following `before` (if the connects
    /// before it failed too).
    /// `known_at`: the connects started so far.
    fn after(before: Option<&Down>, failure: Failure, now: Instant, known_at: u64) -> Self {
        let (first, last) = timing::CONNECT_BACKOFF;
        // Failures long apart are not in a row (a lane that failed twice once, then none
        // tried for a while): the first again.
        let before = before.filter(|down| now.saturating_duration_since(down.until) < last * 2);
        let pause = match before {
            None => Duration::ZERO,
            Some(down) if down.pause.is_zero() => first,
            Some(down) => (down.pause * 2).min(last),
        };
        Self { failure, pause, until: now + pause, known_at }
    }

    /// What a request that finds no connection at `now` answers, if it is too soon for a
    /// connect: what the last one found, as if it had found it itself (a connect that timed
    /// out says the node may hang, as the request's own would have).
    fn refusal(&self, now: Instant) -> Option<Failure> {
        (now < self.until).then(|| self.failure.clone())
    }
}

impl Lanes {
    /// Where `place`'s requests go out: the own thread's for a runtime without I/O.
    fn resolve(&self, place: Place) -> Place {
        match place {
            Place::Runtime(id)
                if self.runtimes.iter().any(|lane| lane.runtime == id && lane.no_io) =>
            {
                Place::Own
            }
            place => place,
        }
    }

    fn state(&mut self, place: Place) -> Option<&mut State> {
        self.counted(place).map(|(_, state)| state)
    }

    /// `place`'s connection state with the count of connections started, to number a new
    /// one; `None` for a runtime that has no lane yet.
    fn counted(&mut self, place: Place) -> Option<(&mut u64, &mut State)> {
        let Self { started, own, runtimes, .. } = self;
        let state = match place {
            Place::Own => own,
            Place::Runtime(id) => match runtimes.iter_mut().find(|lane| lane.runtime == id)? {
                lane if lane.no_io => own,
                lane => &mut lane.state,
            },
        };
        Some((started, state))
    }

    fn states(&mut self) -> impl Iterator<Item = &mut State> {
        std::iter::once(&mut self.own).chain(self.runtimes.iter_mut().map(|lane| &mut lane.state))
    }
}

/// A node's connections, and what their connects found.
#[derive(Default)]
struct Connections {
    lanes: Mutex<Lanes>,
    /// The generation of the newest connection that opened (0: none ever did).
    opened: AtomicU64,
    /// The last connect failed (refused, timed out, a certificate or login refused): the
    /// next one is waited for no longer than a request's node timeout, so that a node that
    /// swallows connections costs each round at most one connect timeout per outage.
    connect_failed: AtomicBool,
}

impl Connections {
    /// Records how the connect of `place`'s connection numbered `generation` ended: by the
    /// connect's task as soon as it ends (a connect nobody waits for any more still leaves
    /// its connection ready), and again by whoever waited for it (the task may have been
    /// dropped unfinished, with its runtime).
    ///
    /// `reached`: the result is the connect's own (not a cancellation or a panic seen by a
    /// waiter), so that a failure says the node is down.
    fn settle(
        &self,
        place: Place,
        generation: u64,
        result: &Result<Opened, Failure>,
        reached: bool,
    ) {
        let mut lanes = lock_ignoring_poison(&self.lanes);
        if result.is_ok() {
            self.opened.fetch_max(generation, Ordering::AcqRel);
        }
        let Some(state) = lanes.state(place) else { return };
        if !matches!(state, State::Connecting { generation: g, .. } if *g == generation) {
            return;
        }
        self.connect_failed.store(result.is_err(), Ordering::Relaxed);
        *state = match result {
            Ok((connection, offers)) => {
                State::Ready { generation, connection: connection.clone(), offers: offers.clone() }
            }
            Err(_) => State::Idle,
        };
        match result {
            Ok(_) => lanes.down = None,
            // Not a connect that began before the last failure was known: places that
            // connect at the same moment of an outage (a reset) make one failure.
            Err(failure)
                if reached && lanes.down.as_ref().is_none_or(|down| generation > down.known_at) =>
            {
                let now = crate::clock::now();
                lanes.down =
                    Some(Down::after(lanes.down.as_ref(), failure.clone(), now, lanes.started));
            }
            Err(_) => {}
        }
    }
}

/// Removes a runtime's lane once the runtime ends: held by a task on that runtime, which
/// the runtime drops when it shuts down (and which ends by itself when the lane goes).
/// The lane's connection then has no driver: keeping it would leak it.
struct Watch {
    connections: Weak<Connections>,
    runtime: RuntimeId,
    serial: u64,
}

impl Drop for Watch {
    fn drop(&mut self) {
        let Some(connections) = self.connections.upgrade() else { return };
        let gone = {
            let mut lanes = lock_ignoring_poison(&connections.lanes);
            let at = lanes
                .runtimes
                .iter()
                .position(|lane| lane.runtime == self.runtime && lane.serial == self.serial);
            at.map(|at| lanes.runtimes.swap_remove(at))
        };
        // Outside the lock: dropping a lane ends this very task's wait.
        drop(gone);
    }
}

/// What [`Node::connect_first`] found: the caller's connection if it was open already.
#[derive(Default)]
pub(crate) struct Connected(Option<Handle>);

impl Connected {
    /// On `handle`'s connection (an undo's route).
    pub(crate) fn on(handle: Handle) -> Self {
        Self(Some(handle))
    }
}

/// A connection and the generation that identifies it, so that a caller who saw it fail
/// only discards that very connection, never a newer one.
#[derive(Clone)]
pub(crate) struct Handle {
    generation: u64,
    connection: MultiplexedConnection,
    offers: Arc<Offers>,
    fresh: bool,
}

/// One master, as the coordinator sees it.
pub(crate) struct Node {
    name: Arc<str>,
    client: Client,
    connect_timeout: Duration,
    tasks: Arc<Tasks>,
    /// Shared with the connect tasks, which record what they opened, and with the tasks
    /// that remove the lanes of runtimes that ended.
    connections: Arc<Connections>,
    /// Whether multi-thread runtimes get connections of their own (see [`Place`]).
    per_runtime: bool,
    /// Zero when restart quarantine is off.
    quarantine: Duration,
    /// When the quarantine of the node's current process ends, as of the last connect.
    quarantined_until: Arc<Mutex<Option<Instant>>>,
    /// Whether a refused release notification was already reported.
    notify_refused: AtomicBool,
    /// Whether the node refused this user `SCRIPT LOAD` (`NOPERM`: a user without
    /// scripting; or an unknown command: a proxy without `SCRIPT`): its later connections
    /// do not ask again, and the plain lock's extensions go native there.
    scripts_refused: Arc<AtomicBool>,
    /// Until when the node counts as late, in nanoseconds from `epoch` (0: not late): its
    /// last answer timed out, or came only after a wait for a round's stragglers that
    /// counted on it (see `round::run`). A slow or hung node is not waited for again until
    /// it answers in time or [`timing::LATE_FOR`] has passed.
    late_until: AtomicU64,
    /// Until when the node counts as hung, in nanoseconds from `epoch` (0: not hung): a
    /// request to it timed out less than [`timing::LATE_FOR`] ago, in a round or in the background,
    /// and it has not answered one since. An acquisition refused for contention does not
    /// wait for it.
    hung_until: AtomicU64,
    /// What `late_until` and `hung_until` count from.
    epoch: Instant,
    /// The server processes the client's nodes reached, shared by all of them.
    servers: Arc<server::Servers>,
}

impl std::fmt::Debug for Node {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Node").field("name", &self.name).finish_non_exhaustive()
    }
}

impl Node {
    pub(crate) fn new(
        client: Client,
        connect_timeout: Duration,
        quarantine: Duration,
        tasks: Arc<Tasks>,
        servers: Arc<server::Servers>,
    ) -> Self {
        let info = client.get_connection_info();
        let name = format!("{}/{}", info.addr(), info.redis_settings().db()).into();
        Self {
            name,
            client,
            connect_timeout,
            tasks,
            connections: Arc::default(),
            per_runtime: true,
            quarantine,
            quarantined_until: Arc::default(),
            notify_refused: AtomicBool::new(false),
            scripts_refused: Arc::default(),
            late_until: AtomicU64::new(0),
            hung_until: AtomicU64::new(0),
            epoch: crate::clock::now(),
            servers,
        }
    }

    /// With `false`, every request goes out on the client's own thread's connection, as
    /// from a current-thread runtime (see [`Place`]).
    pub(crate) fn connections_per_runtime(mut self, on: bool) -> Self {
        self.per_runtime = on;
        self
    }

    /// Whether the node's process started less than the restart quarantine ago, so that its
    /// answers must not count toward a quorum. Every restart breaks our connection, and
    /// every new connection re-reads the node's uptime before it is used.
    pub(crate) fn in_quarantine(&self) -> bool {
        !self.quarantine.is_zero()
            && lock_ignoring_poison(&self.quarantined_until).is_some_and(|end| Instant::now() < end)
    }

    /// A mark to give [`Node::may_have_reached`] for a request made now: whether a
    /// connection that was open then, or opened since, could have carried it. Every place
    /// (the own thread, each multi-thread runtime) has its connection, and a request made
    /// in one may be sent again from another, so the mark covers them all: while any
    /// connection is open, anything made now may reach the node; while none is, only what
    /// goes out on a connection under way now or started later.
    pub(crate) fn generation(&self) -> u64 {
        let mut lanes = self.lock_lanes();
        let started = lanes.started;
        let mut mark = started + 1;
        for state in lanes.states() {
            match state {
                // Already opened: `opened` is at least this.
                State::Ready { generation, .. } => return *generation,
                State::Connecting { generation, .. } => mark = mark.min(*generation),
                State::Idle => {}
            }
        }
        mark
    }

    /// Whether a request made when [`Node::generation`] said `generation` may have reached
    /// the node, or may still: a connection of that generation or a later one opened, or
    /// one is opening, in any place (a request waiting for it goes out once it opens). When
    /// none did and none is opening (every connect since failed: a refused certificate, a
    /// wrong password, nothing listening), nothing made since then left the client.
    pub(crate) fn may_have_reached(&self, generation: u64) -> bool {
        self.connections.opened.load(Ordering::Acquire) >= generation.max(1)
            || self.lock_lanes().states().any(|state| matches!(state, State::Connecting { .. }))
    }

    /// The node's client, for connections of other kinds (pub/sub).
    pub(crate) fn client(&self) -> &Client {
        &self.client
    }

    /// How long one connection attempt may run.
    pub(crate) fn connect_timeout(&self) -> Duration {
        self.connect_timeout
    }

    /// `host:port`: one Redis process, whichever database is used.
    pub(crate) fn address(&self) -> String {
        self.client.get_connection_info().addr().to_string()
    }

    /// `host:port/db`, the identity used in reports (never a password).
    /// Whether the node refused this user scripts (see [`Node::scripts_refused`]).
    pub(crate) fn refuses_scripts(&self) -> bool {
        self.scripts_refused.load(Ordering::Relaxed)
    }

    pub(crate) fn name(&self) -> &Arc<str> {
        &self.name
    }

    /// Whether the node timed out, or missed a wait for stragglers that counted on it, less
    /// than [`timing::LATE_FOR`] before `now`, and has not answered in time since.
    pub(crate) fn is_late(&self, now: Instant) -> bool {
        self.holds(&self.late_until, now)
    }

    /// Records at `now` whether the node answered a round in time.
    pub(crate) fn set_late(&self, late: bool, now: Instant) {
        self.mark(&self.late_until, late.then_some(now));
    }

    /// Whether a request to the node timed out less than [`timing::LATE_FOR`] before `now`, and the
    /// node has not answered one since.
    pub(crate) fn is_hung(&self, now: Instant) -> bool {
        self.holds(&self.hung_until, now)
    }

    /// Records how a request to the node ended: it timed out (`true`), or the node answered
    /// it, whatever the answer.
    pub(crate) fn set_hung(&self, timed_out: bool) {
        // Every answer lands here: clearing reads no clock.
        self.mark(&self.hung_until, timed_out.then(crate::clock::now));
    }

    /// Whether the mark `until` (nanoseconds from `epoch`, 0 when unset) holds at `now`.
    fn holds(&self, until: &AtomicU64, now: Instant) -> bool {
        let until = until.load(Ordering::Relaxed);
        until != 0 && self.nanos(now) < until
    }

    /// Sets the mark `until` for [`timing::LATE_FOR`] from `set_at`, or clears it (`None`;
    /// cleared only on a change: every round or request of every task reads it).
    fn mark(&self, until: &AtomicU64, set_at: Option<Instant>) {
        if let Some(now) = set_at {
            until.store(self.nanos(now + timing::LATE_FOR).max(1), Ordering::Relaxed);
        } else if until.load(Ordering::Relaxed) != 0 {
            until.store(0, Ordering::Relaxed);
        }
    }

    fn nanos(&self, at: Instant) -> u64 {
        u64::try_from(at.saturating_duration_since(self.epoch).as_nanos()).unwrap_or(u64::MAX)
    }

    /// Reports, once per node, that the node refused to publish a release notification.
    pub(crate) fn note_notify_refused(&self) {
        if !self.notify_refused.swap(true, Ordering::Relaxed) {
            tracing::warn!(
                target: "redlock",
                node = &*self.name,
                "the node refused a release notification (an ACL user without the channel?): \
                 releases still work, waiters fall back to polling"
            );
        }
    }

    /// Waits until the node has a connection, opening one if it has none, for at most the
    /// connect timeout, so that the caller's node timeout starts only once it has one. Not
    /// when the node's last connect failed: the caller's own timeout then bounds the next
    /// connect, as it bounds the rest of its request (a node that swallows connections
    /// costs a caller one connect timeout per outage, not one per request). `Err` when the
    /// connect it waited for failed: nothing was sent.
    ///
    /// `Ok` carries the connection when it was open already (the common case): the send
    /// that follows at once takes it from there instead of looking it up again.
    pub(crate) async fn connect_first(&self) -> Result<Connected, Failure> {
        if let Some(handle) = self.ready() {
            return Ok(Connected(Some(handle)));
        }
        if self.connections.connect_failed.load(Ordering::Relaxed) {
            return Ok(Connected::default());
        }
        self.open_now().await.map(|()| Connected::default())
    }

    /// Opens the node's connection if it has none (for at most the connect timeout),
    /// whatever happened to the last connect; within the pause after connects that kept
    /// failing (see `Down`), answers what the last one found, at once.
    pub(crate) async fn open_now(&self) -> Result<(), Failure> {
        // The connect bounds itself; this bounds a wait for one whose task never ends.
        match tokio::time::timeout(self.connect_timeout, self.connection()).await {
            Ok(connection) => connection.map(drop),
            Err(_) => Err(Failure::ConnectTimedOut),
        }
    }

    /// Sends one command and returns the reply. A script unknown to the node (restarted:
    /// its script cache is empty) is sent once more in full. A connection cached from an
    /// earlier call that turns out to be broken is replaced, and the command re-sent on
    /// the new one only if it is [`Resend::Safe`]: it may have run before the drop.
    ///
    /// A [creating](Command::creating) command is not sent at all once `by` has passed,
    /// nor once an undo of its hold was issued (its `route`: see [`Route::queue`]); it
    /// answers `LATE` or `WITHHELD` then: the client's bounds on what a create may still
    /// set count on every create going out by then, however late its future is polled (a
    /// caller's runtime idle or blocked meanwhile). A create is recorded on its routes
    /// (the hold's, and `also` its wait's); an extension (`renews`: its round's start) only
    /// checked, and kept until answered where it sets the lease outright.
    ///
    /// `connected` is what [`Node::connect_first`] found, if it was just now.
    pub(crate) async fn send(
        &self,
        command: &Command,
        (by, route, also, renews): (
            Option<Instant>,
            Option<&Route>,
            Option<&Route>,
            Option<Renewal>,
        ),
        connected: Connected,
    ) -> Reply {
        // A create without a time to go out by goes out by now: never later than asked.
        let by = command.creates().then(|| by.unwrap_or_else(crate::clock::now));
        let records = command.creates() && renews.is_none();
        let bound = Bound { by, route, also, records, renews, outright: None };
        let first = (command.first(), command.native());
        let reply = self.send_cmd(first, command.resend(), &bound, connected.0).await;
        if !matches!(&reply.value, Err(failure) if failure.is_noscript()) {
            return reply;
        }
        let Some(eval) = command.fallback() else { return reply };
        // NOSCRIPT: the script did not run, so sending it in full is no repetition. Boxed,
        // like every rare path here: the request future stays smaller, and a round moves
        // its requests around.
        let resent = reply.resent;
        let reply = Box::pin(self.send_cmd((&eval, None), command.resend(), &bound, None)).await;
        Reply { resent: resent || reply.resent, sent: true, ..reply }
    }

    /// `cmd` on `first` if given (the caller's connection, looked up a moment ago), or on
    /// the caller's connection now.
    async fn send_cmd(
        &self,
        cmd: Forms<'_>,
        resend: Resend,
        bound: &Bound<'_>,
        first: Option<Handle>,
    ) -> Reply {
        if resend == Resend::Never {
            return Box::pin(self.send_once(cmd.0)).await;
        }
        let mut first = match first.or_else(|| self.ready()) {
            Some(handle) => handle,
            None => match Box::pin(self.connection()).await {
                Ok(handle) => handle,
                Err(failure) => return Reply::unconnected(failure),
            },
        };
        match self.send_on(&mut first, cmd, bound).await {
            Sent::Reply(value) => Reply::of(value),
            // Safe to repeat (every lock operation is): once more on a new connection.
            Sent::Stale(_, written) => {
                // This request's hold on the dead connection ends before the send again (its
                // driver stops with the last one).
                drop(first);
                let reply = Box::pin(self.send_anew(cmd, bound)).await;
                Reply { resent: written || reply.resent, sent: written || reply.sent, ..reply }
            }
        }
    }

    /// Sends a command that must never run twice, once, on a connection that has just
    /// answered: a cached connection is first asked a `PING`, and replaced if that finds
    /// it closed (a restart, an idle timeout), so that the command itself is never the one
    /// to find out. Whatever happens to the command, it is not sent again: a refusal on
    /// its first poll is no proof that nothing was written (the driver may run on another
    /// thread, and the caller's can be preempted between queueing the command and waiting
    /// for its reply while the driver writes it and sees the connection drop).
    async fn send_once(&self, cmd: &Cmd) -> Reply {
        let mut connection = self.connection().await;
        if let Ok(handle) = &mut connection
            && !handle.fresh
            && !matches!(self.send_on(handle, (&PING, None), &Bound::NONE).await, Sent::Reply(_))
        {
            // Found closed (and discarded): a new one.
            connection = self.connection().await;
        }
        let mut handle = match connection {
            Ok(handle) => handle,
            Err(failure) => return Reply::unconnected(failure),
        };
        let value = match self.send_on(&mut handle, (cmd, None), &Bound::NONE).await {
            Sent::Reply(value) => value,
            Sent::Stale(failure, _) => Err(failure),
        };
        Reply::of(value)
    }

    /// Sends `cmd` on a new connection: a connection opened before this call may have
    /// died since (a node restart, an idle timeout), and one more try spares the caller a
    /// spurious failure.
    async fn send_anew(&self, cmd: Forms<'_>, bound: &Bound<'_>) -> Reply {
        match self.connection().await {
            Ok(mut handle) => match self.send_on(&mut handle, cmd, bound).await {
                Sent::Reply(value) => Reply::of(value),
                Sent::Stale(failure, true) => Reply::of(Err(failure)),
                Sent::Stale(failure, false) => Reply::unconnected(failure),
            },
            Err(failure) => Reply::unconnected(failure),
        }
    }

    /// `cmd` on `handle`'s connection, or its native form where the connection's server
    /// may run it (see [`crate::native`]).
    async fn send_on(
        &self,
        handle: &mut Handle,
        (cmd, native): Forms<'_>,
        bound: &Bound<'_>,
    ) -> Sent {
        // An extension that sets the lease outright costs the hold's later rounds what it
        // may cut (see `crate::route`): only where the script cannot run.
        let worth = |native: &&Native| {
            handle.offers.may(native.feature())
                && (native.outright().is_none() || bound.renews.is_some_and(|r| r.outright))
        };
        if let Some(native) = native.filter(worth)
            && let Some(sent) = self.send_native(handle, native, bound).await
        {
            return sent;
        }
        self.write(handle, Packet::One(cmd), bound).await
    }

    /// `native` on `handle`'s connection, answering what its script would; `None` when the
    /// server lacks it (it ran nothing: the script goes next, on the same connection).
    async fn send_native(
        &self,
        handle: &mut Handle,
        native: &Native,
        bound: &Bound<'_>,
    ) -> Option<Sent> {
        let feature = native.feature();
        let known = handle.offers.known(feature);
        // With its notification in one message only once the server is known to run it:
        // one that lacks it would publish a release that has not happened yet.
        let (packet, publish_after) = match native.publish() {
            Some((_, both)) if known => (Packet::Both(both), None),
            Some((publish, _)) => (Packet::One(native.command()), Some(publish)),
            None => (Packet::One(native.command()), None),
        };
        let native_bound = Bound { outright: native.outright(), ..*bound };
        let (sent, mut published) = match self.write(handle, packet, &native_bound).await {
            Sent::Reply(Ok(Value::Array(replies))) if matches!(packet, Packet::Both(_)) => {
                let mut replies = replies.into_iter().map(value_or_failure);
                let first = replies.next().unwrap_or(Ok(Value::Nil));
                (Sent::Reply(first), replies.next())
            }
            sent => (sent, None),
        };
        let reply = match sent {
            Sent::Reply(Err(failure)) if native::lacks(&failure) => {
                handle.offers.note(feature, false);
                tracing::debug!(
                    target: "redlock",
                    node = &*self.name,
                    ?feature,
                    ?failure,
                    "the server lacks a native command: its script serves on this connection"
                );
                return None;
            }
            Sent::Reply(Ok(reply)) => reply,
            sent => return Some(sent),
        };
        if !known {
            handle.offers.note(feature, true);
        }
        if let Some(publish) = publish_after {
            published = Some(match self.write(handle, Packet::One(publish), &Bound::NONE).await {
                Sent::Reply(published) => published,
                Sent::Stale(failure, _) => Err(failure),
            });
        }
        Some(Sent::Reply(Ok(native.as_script(reply, published.as_ref()))))
    }

    /// `packet` on `handle`'s connection; a create or extension within its `bound` (not
    /// sent past its time to go out, nor once an undo of its hold was issued).
    async fn write(&self, handle: &mut Handle, packet: Packet<'_>, bound: &Bound<'_>) -> Sent {
        if bound.by.is_some_and(|by| crate::clock::now() > by) {
            let message = "LATE the request was due to go out earlier: not sent";
            return Sent::Reply(Err(Failure::Server {
                code: "LATE".into(),
                message: message.into(),
            }));
        }
        // Recorded as not fresh: an undo that goes behind it finds the connection used.
        let recorded = (bound.route.is_some() && bound.records)
            .then(|| Handle { fresh: false, ..handle.clone() });
        let (generation, fresh) = (handle.generation, handle.fresh);
        let connection = &mut handle.connection;
        // Boxed: each layer it goes through (routes, timeouts, the round) would otherwise
        // hold its own copies of it, and a round's request grew to 27 KB, moved around
        // whole (a fifth of a busy client's time went to those moves).
        let send = Box::pin(with_first_poll(async move {
            match packet {
                Packet::One(cmd) => connection.send_packed_command(cmd).await,
                Packet::Both(pipe) => {
                    connection.send_packed_commands(pipe, 0, pipe.len()).await.map(Value::Array)
                }
            }
        }));
        let queued = match (bound.route, bound.also, &recorded) {
            (None, ..) => Some(send.await),
            // Not recorded (an extension): gated on the hold's route instead.
            (Some(route), _, None) => {
                let at = bound.renews.map_or_else(crate::clock::now, |renewal| renewal.at);
                let outright = bound.outright.map(|ttl| ttl.duration() - ttl.drift());
                route.gate(send, Extension { at, outright }, fate).await
            }
            (Some(route), None, Some(recorded)) => route.queue(recorded, send, answered).await,
            // Not recorded on the wait's route either when its own refuses it.
            (Some(route), Some(_), _) if route.is_undone() => None,
            // Rare (a writer's wait): boxed, so that every request's future stays small.
            (Some(route), Some(also), Some(recorded)) => {
                Box::pin(queue_both(route, also, recorded, send)).await
            }
        };
        let Some((sent, at_once)) = queued else {
            return Sent::Reply(Err(Failure::withheld()));
        };
        match sent {
            Ok(Value::ServerError(err)) => Sent::Reply(Err(failure_of(&err.into()))),
            Ok(value) => Sent::Reply(Ok(value)),
            Err(err) if err.is_unrecoverable_error() || err.is_connection_dropped() => {
                self.discard(generation);
                let failure = failure_of(&err);
                if fresh { Sent::Reply(Err(failure)) } else { Sent::Stale(failure, !at_once) }
            }
            Err(err) => Sent::Reply(Err(failure_of(&err))),
        }
    }

    /// The caller's connection if it is open: the common case, with nothing to wait for.
    fn ready(&self) -> Option<Handle> {
        match self.lock_lanes().state(self.place()) {
            Some(State::Ready { generation, connection, offers }) => Some(Handle {
                generation: *generation,
                connection: connection.clone(),
                offers: offers.clone(),
                fresh: false,
            }),
            _ => None,
        }
    }

    /// The caller's connection (its place's: see [`Place`]), opening it if needed.
    /// Concurrent callers wait on the same connect, each under its own timeout, never one
    /// after another.
    async fn connection(&self) -> Result<Handle, Failure> {
        let mut place = self.place();
        let mut watch = None;
        let connecting = {
            let mut guard = self.lock_lanes();
            let lanes = &mut *guard;
            place = lanes.resolve(place);
            if let Place::Runtime(runtime) = place
                && lanes.state(place).is_none()
            {
                lanes.made += 1;
                let (watched, ended) = oneshot::channel();
                let serial = lanes.made;
                lanes.runtimes.push(Lane {
                    runtime,
                    serial,
                    state: State::Idle,
                    no_io: false,
                    _watched: watched,
                });
                watch = Some((
                    Watch { connections: Arc::downgrade(&self.connections), runtime, serial },
                    ended,
                ));
            }
            let refusal = lanes.down.as_ref().and_then(|down| down.refusal(crate::clock::now()));
            let Some((started, state)) = lanes.counted(place) else {
                // Made above if it was missing.
                return Err(Failure::Unreachable("no connection for this runtime".into()));
            };
            match state {
                State::Ready { generation, connection, offers } => {
                    return Ok(Handle {
                        generation: *generation,
                        connection: connection.clone(),
                        offers: offers.clone(),
                        fresh: false,
                    });
                }
                State::Connecting { generation, future } => Ok((*generation, future.clone())),
                State::Idle => match refusal {
                    // The node's last connects failed a moment ago: not yet another.
                    Some(failure) => Err(failure),
                    None => {
                        *started += 1;
                        let future = self.connect(place, *started);
                        *state = State::Connecting { generation: *started, future: future.clone() };
                        Ok((*started, future))
                    }
                },
            }
        };
        if let Some((watch, ended)) = watch {
            // Not counted as the client's work: it lasts as long as the runtime or the
            // node. Spawned outside the lock: a runtime that is shutting down drops it at
            // once, and its `Drop` takes the lock.
            if let Ok(runtime) = Runtime::try_current() {
                drop(runtime.spawn(async move {
                    let _watch = watch;
                    let _ = ended.await;
                }));
            }
        }
        // After the watch: a lane made for a runtime stays when its first request is refused.
        let (generation, future) = connecting?;
        let result = future.await;
        self.connections.settle(place, generation, &result, false);
        if result.is_ok() && place != Place::Own {
            self.open_own();
        }
        if let (Err(Failure::Unreachable(why)), Place::Runtime(runtime)) = (&result, place)
            && **why == *NO_IO
        {
            if let Some(lane) =
                self.lock_lanes().runtimes.iter_mut().find(|lane| lane.runtime == runtime)
            {
                lane.no_io = true;
            }
            tracing::warn!(
                target: "redlock",
                node = &*self.name,
                "a multi-thread runtime without I/O (built without `enable_io`): its requests \
                 go out on the client's own thread (turn `connections_per_runtime` off to \
                 spare the panic of the first connect)"
            );
            return Box::pin(self.connection()).await;
        }
        result.map(|(connection, offers)| Handle { generation, connection, offers, fresh: true })
    }

    /// Opens a connection in a task of its own, shared by every caller that waits for it,
    /// in `place`, where its driver then lives. A connection must not die with a runtime
    /// that happened to open it while others use it, nor stall while its runtime is idle
    /// (a synchronous wrapper that calls `block_on` now and then): each place has its own,
    /// and current-thread runtimes use the own thread's (see [`Place`]).
    fn connect(&self, place: Place, generation: u64) -> Connecting {
        let client = self.client.clone();
        let timeout = self.connect_timeout;
        let (quarantine, quarantined_until) = (self.quarantine, self.quarantined_until.clone());
        let (servers, name) = (self.servers.clone(), self.name.clone());
        let scripts_refused = self.scripts_refused.clone();
        let connections = self.connections.clone();
        let task = self.spawn_in(place, async move {
            let seen = Seen { servers: &servers, name: &name, scripts_refused: &scripts_refused };
            let open = open(&client, timeout, quarantine, &quarantined_until, seen);
            let result = match tokio::time::timeout(timeout, open).await {
                Ok(result) => result,
                Err(_) => Err(Failure::ConnectTimedOut),
            };
            connections.settle(place, generation, &result, true);
            result
        });
        async move {
            match task {
                Some(task) => task.await.unwrap_or_else(|err| {
                    Err(if err.is_panic() {
                        Failure::Unreachable(NO_IO.into())
                    } else {
                        Failure::Unreachable("the connect was cancelled".into())
                    })
                }),
                None => Err(Failure::Unreachable("no runtime to connect on".into())),
            }
        }
        .boxed()
        .shared()
    }

    /// Opens the own thread's connection in the background if it has none, once a
    /// runtime's opened: the own thread's work (an auto-extension, the undos of a runtime
    /// that ends) then finds it open, as do callers on current-thread runtimes, instead of
    /// paying a connect (several round trips) when it matters. Not where connects fail (a
    /// refused certificate): that would double the handshakes.
    fn open_own(&self) {
        let mut lanes = self.lock_lanes();
        if matches!(lanes.own, State::Idle) {
            lanes.started += 1;
            let future = self.connect(Place::Own, lanes.started);
            lanes.own = State::Connecting { generation: lanes.started, future };
        }
    }

    /// Where the caller's requests go out.
    fn place(&self) -> Place {
        if self.per_runtime { Place::here() } else { Place::Own }
    }

    /// Runs `task` in `place`: on the caller's runtime, or on the client's own thread.
    fn spawn_in<F>(&self, place: Place, task: F) -> Option<JoinHandle<F::Output>>
    where
        F: Future + Send + 'static,
        F::Output: Send + 'static,
    {
        match place {
            Place::Own => self.tasks.spawn_own(task),
            Place::Runtime(_) => self.tasks.spawn_with_handle(task),
        }
    }

    /// Forgets the connection of that generation, wherever it is (a request made in one
    /// place may have been polled on to the end in another), so that the next request
    /// there opens a new one; never a newer connection.
    fn discard(&self, generation: u64) {
        let mut lanes = self.lock_lanes();
        if let Some(state) = lanes
            .states()
            .find(|state| matches!(state, State::Ready { generation: g, .. } if *g == generation))
        {
            *state = State::Idle;
        }
    }

    fn lock_lanes(&self) -> MutexGuard<'_, Lanes> {
        lock_ignoring_poison(&self.connections.lanes)
    }
}

/// Connects, preloads the scripts, and checks the server from its `INFO server` (where the
/// user may read it): a server this library cannot work with is refused, and with restart
/// quarantine on, the node's uptime sets its quarantine.
async fn open(
    client: &Client,
    timeout: Duration,
    quarantine: Duration,
    quarantined_until: &Mutex<Option<Instant>>,
    seen: Seen<'_>,
) -> Result<Opened, Failure> {
    let unreachable = |err: RedisError| {
        if let Some(failure) = denied::certificate(&err).or_else(|| denied::not_redis(&err)) {
            failure
        } else if err.is_timeout() {
            Failure::ConnectTimedOut
        } else if err.is_connection_refusal() {
            Failure::Refused(err.to_string().into())
        } else if err.to_string().contains("NOAUTH") {
            // The first commands (the script preload) of a connection that gave no login.
            Failure::Denied(denied::NOAUTH.into())
        } else {
            Failure::Unreachable(err.to_string().into())
        }
    };
    let config = AsyncConnectionConfig::new()
        // Room for many requests queued to a hung node: a release that cannot be queued
        // behind its SET before its timeout is lost, and the SET then outlives it.
        .set_pipeline_buffer_size(timing::PIPELINE_BUFFER)
        .set_connection_timeout(Some(timeout))
        .set_response_timeout(None);
    let mut connection = match client.get_multiplexed_async_connection_with_config(&config).await {
        Ok(connection) => connection,
        // The node answered: calling it unreachable would send operators to the network.
        Err(err) if err.kind() == redis::ErrorKind::AuthenticationFailed => {
            return Err(denied::login(client, &config).await);
        }
        Err(err) => return Err(unreachable(err)),
    };
    // Before any command of ours: see the command module for why this is safety. Not
    // where the node refused it to this user before: each try would only add refusals to
    // its `ACL LOG` and `INFO commandstats`.
    let preload = !seen.scripts_refused.load(Ordering::Relaxed);
    if preload && let Err(err) = load_scripts().query_async::<()>(&mut connection).await {
        // A node that refuses SCRIPT LOAD still works through EVAL on demand.
        if err.code().is_none() {
            return Err(unreachable(err));
        }
        // Refused this user (the ACL), or unknown where it goes (a proxy without `SCRIPT`):
        // from now on the plain lock goes native there where it can (see `native`).
        // (A pipeline's error has no detail of its own: its text names each failure.)
        let unknown = err.to_string().contains("unknown command");
        let refused = err.code() == Some("NOPERM") || unknown;
        if !(refused && seen.scripts_refused.swap(true, Ordering::Relaxed)) {
            tracing::warn!(
                target: "redlock",
                %err,
                "scripts not preloaded (an ACL user without `script|load`?): they still run, \
                 but a release queued behind a SET on a hung node may then be lost"
            );
        }
    }
    let reply = connection.send_packed_command(redis::cmd("INFO").arg("server")).await;
    let replied_at = Instant::now();
    let info = match reply {
        Ok(Value::ServerError(err)) => Err(failure_of(&err.into())),
        Ok(value) => Ok(redis::from_redis_value::<String>(value).unwrap_or_else(|err| {
            tracing::warn!(target: "redlock", %err, "unexpected INFO server reply");
            String::new()
        })),
        Err(err) if err.code().is_some() => Err(failure_of(&err)),
        Err(err) => return Err(unreachable(err)),
    };
    let info = match info {
        Ok(info) => info,
        Err(failure) if quarantine.is_zero() => {
            // Only the server check is skipped: nothing else needs INFO.
            tracing::debug!(target: "redlock", ?failure, "INFO server refused: server not checked");
            return Ok((connection, Arc::default()));
        }
        // Refused by the ACL: what to allow. Any other error reply (`BUSY`, `LOADING`) keeps
        // its own meaning.
        Err(Failure::Denied(message)) => {
            return Err(Failure::Denied(
                format!(
                    "{message} (restart_quarantine needs the `info` command: allow `+info` for \
                     this user, or turn restart_quarantine off)"
                )
                .into(),
            ));
        }
        Err(failure) => return Err(failure),
    };
    let server = server::parse(&info);
    server
        .check()
        .map_err(|why| Failure::Server { code: "UNSUPPORTED".into(), message: why.into() })?;
    if let Some(run_id) = &server.run_id {
        seen.servers
            .claim(seen.name, run_id)
            .map_err(|why| Failure::Server { code: "DUPLICATE".into(), message: why.into() })?;
    }
    if !quarantine.is_zero() {
        let uptime = quarantine::parse_uptime(&info).unwrap_or_else(|| {
            // Without an uptime, the safe assumption is a process that just started.
            tracing::warn!(target: "redlock", "INFO server reports no uptime: assuming a restart");
            Duration::ZERO
        });
        *lock_ignoring_poison(quarantined_until) = quarantine::end(replied_at, uptime, quarantine);
    }
    Ok((connection, Arc::new(Offers::for_server(&server))))
}

/// Where a connecting node records the server it reached.
#[derive(Clone, Copy)]
struct Seen<'a> {
    servers: &'a server::Servers,
    name: &'a Arc<str>,
    /// See [`Node::scripts_refused`].
    scripts_refused: &'a AtomicBool,
}

/// The critical sections never panic; if one ever did, its state is still usable.
fn lock_ignoring_poison<T>(mutex: &Mutex<T>) -> MutexGuard<'_, T> {
    mutex.lock().unwrap_or_else(PoisonError::into_inner)
}

/// `SCRIPT LOAD` of every script, in one pipeline whose replies are ignored.
fn load_scripts() -> redis::Pipeline {
    let mut pipe = redis::pipe();
    for script in command::all_scripts() {
        pipe.add_command(script.load()).ignore();
    }
    pipe
}

/// A command, and its native form if it has one.
type Forms<'a> = (&'a Cmd, Option<&'a Native>);

/// What goes out in one message.
#[derive(Clone, Copy)]
enum Packet<'a> {
    One(&'a Cmd),
    /// A native undo and its release's notification.
    Both(&'a redis::Pipeline),
}

/// A reply inside a pipeline's: an error reply as a failure.
fn value_or_failure(value: Value) -> Result<Value, Failure> {
    match value {
        Value::ServerError(err) => Err(failure_of(&err.into())),
        value => Ok(value),
    }
}

/// An extension's round, as its requests see it.
#[derive(Clone, Copy, Debug)]
pub(crate) struct Renewal {
    /// When the round started.
    pub(crate) at: Instant,
    /// Whether it may set the lease outright: the node refused this user scripts when the
    /// round began (see `crate::route`; the claim counts the round from then on).
    pub(crate) outright: bool,
}

/// What bounds a create or extension: the time it goes out by, and its hold's route on
/// the node.
#[derive(Clone, Copy)]
struct Bound<'a> {
    by: Option<Instant>,
    route: Option<&'a Route>,
    /// A second route it is recorded on (its wait's, for a writer's withdrawal).
    also: Option<&'a Route>,
    /// It creates (recorded on its routes), rather than extends (only refused by them).
    records: bool,
    /// An extension's round.
    renews: Option<Renewal>,
    /// The lease of an extension that sets it outright (see [`crate::route`]).
    outright: Option<crate::config::Ttl>,
}

impl Bound<'_> {
    /// For a command that creates nothing.
    const NONE: Self =
        Self { by: None, route: None, also: None, records: false, renews: None, outright: None };
}

enum Sent {
    Reply(Result<Value, Failure>),
    /// The connection, cached from an earlier call, was already dead (or died with the
    /// command): it may or may not have run, unless it was refused at once, before
    /// anything was written (`written` false: see [`with_first_poll`]).
    Stale(Failure, bool),
}

pin_project_lite::pin_project! {
    /// `send` and whether it was refused unwritten: it ended at its first poll, and sooner
    /// than anything written could have failed ([`timing::UNWRITTEN_WITHIN`]). A send
    /// refused that fast found its connection closed before it; one that took longer may
    /// have been written, run and failed with the connection while the caller's thread was
    /// preempted in that poll (the driver runs on another), and counts as maybe written.
    ///
    /// A future of its own rather than an `async fn`, which would hold `send` twice.
    struct FirstPoll<F> {
        #[pin]
        send: F,
        first: bool,
    }
}

impl<F: Future> Future for FirstPoll<F> {
    type Output = (F::Output, bool);

    fn poll(
        self: std::pin::Pin<&mut Self>,
        cx: &mut std::task::Context<'_>,
    ) -> std::task::Poll<Self::Output> {
        let this = self.project();
        if !std::mem::replace(this.first, false) {
            return this.send.poll(cx).map(|output| (output, false));
        }
        let began = std::time::Instant::now();
        this.send.poll(cx).map(|output| (output, began.elapsed() < timing::UNWRITTEN_WITHIN))
    }
}

fn with_first_poll<F: Future>(send: F) -> FirstPoll<F> {
    FirstPoll { send, first: true }
}

/// Whether a queued create's send was answered (its route then counts it as run).
fn answered((sent, _): &(RedisResult<Value>, bool)) -> bool {
    sent.is_ok()
}

/// What became of an extension's send, for its route (see [`crate::route`]).
fn fate((sent, at_once): &(RedisResult<Value>, bool)) -> Fate {
    match sent {
        Ok(_) => Fate::Ran,
        Err(_) if *at_once => Fate::Unsent,
        Err(_) => Fate::Unknown,
    }
}

/// A create queued on its hold's route and recorded on its wait's (`also`) too.
async fn queue_both<F>(
    route: &Route,
    also: &Route,
    recorded: &Handle,
    send: F,
) -> Option<(RedisResult<Value>, bool)>
where
    F: Future<Output = (RedisResult<Value>, bool)> + Send,
{
    let inner = route.queue(recorded, send, answered);
    let answered_too = |sent: &Option<_>| sent.as_ref().is_some_and(answered);
    also.queue(recorded, inner, answered_too).await.flatten()
}

#[cfg(test)]
mod tests {
    use super::*;

    fn node() -> Node {
        let client = Client::open("redis://127.0.0.1:1").unwrap();
        Node::new(client, Duration::from_millis(50), Duration::ZERO, Arc::default(), Arc::default())
    }

    fn multi_thread() -> tokio::runtime::Runtime {
        tokio::runtime::Builder::new_multi_thread().worker_threads(1).enable_all().build().unwrap()
    }

    fn lanes(node: &Node) -> usize {
        node.lock_lanes().runtimes.len()
    }

    #[test]
    fn a_nodes_next_connect_after_two_failed_ones_waits_10_ms_doubling_to_a_second() {
        let ms = Duration::from_millis;
        let now = crate::clock::now();
        let refused = Failure::Refused("refused".into());
        let mut down = Down::after(None, refused.clone(), now, 1);
        assert!(down.refusal(now).is_none(), "one failed connect: the next at once");
        down = Down::after(Some(&down), refused.clone(), now, 1);
        assert_eq!(down.pause, ms(10));
        assert!(matches!(down.refusal(now + ms(9)), Some(Failure::Refused(_))), "what it found");
        assert!(down.refusal(now + ms(10)).is_none(), "then a connect again");
        down = Down::after(Some(&down), refused.clone(), now, 1);
        assert_eq!(down.pause, ms(20));
        for _ in 0..10 {
            down = Down::after(Some(&down), refused.clone(), now, 1);
        }
        assert_eq!(down.pause, Duration::from_secs(1));
        let timed_out = Down::after(Some(&down), Failure::ConnectTimedOut, now, 1);
        assert!(
            matches!(timed_out.refusal(now), Some(Failure::ConnectTimedOut)),
            "a node whose connects time out may hang"
        );
        let long_after = now + Duration::from_secs(4);
        let again = Down::after(Some(&down), refused.clone(), long_after, 1);
        assert!(again.refusal(long_after).is_none(), "failures seconds apart are not in a row");
    }

    #[test]
    fn a_multi_thread_runtime_gets_a_lane_that_goes_when_the_runtime_ends() {
        let node = Arc::new(node());
        let (a, b) = (multi_thread(), multi_thread());
        for runtime in [&a, &b, &a] {
            let node = node.clone();
            let refused = runtime.block_on(async move { node.connection().await.map(drop) });
            assert!(refused.is_err(), "nothing listens there");
        }
        assert_eq!(lanes(&node), 2, "one per runtime");
        drop(a);
        let deadline = Instant::now() + Duration::from_secs(5);
        while lanes(&node) > 1 && Instant::now() < deadline {
            std::thread::sleep(Duration::from_millis(5));
        }
        assert_eq!(lanes(&node), 1, "the lane of the runtime that ended is gone");
        // A node dropped first ends the tasks that watch its runtimes.
        drop(node);
        drop(b);
    }

    #[test]
    fn current_thread_runtimes_and_no_runtime_use_the_own_threads_connection() {
        assert_eq!(Place::here(), Place::Own);
        let runtime = tokio::runtime::Builder::new_current_thread().enable_all().build().unwrap();
        assert_eq!(runtime.block_on(async { Place::here() }), Place::Own);
        let runtime = multi_thread();
        assert!(matches!(runtime.block_on(async { Place::here() }), Place::Runtime(_)));
    }

    #[test]
    fn nothing_made_while_every_connect_fails_may_have_reached_the_node() {
        let node = Arc::new(node());
        let runtime = multi_thread();
        let mark = node.generation();
        assert!(!node.may_have_reached(mark), "no connection ever opened");
        let connecting = node.clone();
        let refused = runtime.block_on(async move { connecting.connection().await.map(drop) });
        assert!(refused.is_err());
        assert!(!node.may_have_reached(mark), "the connect since failed");
        assert!(!node.may_have_reached(node.generation()));
    }

    #[test]
    fn a_late_node_is_late_for_a_second_or_until_it_answers_in_time() {
        let (node, at) = (node(), crate::clock::now());
        assert!(!node.is_late(at));
        node.set_late(true, at);
        assert!(node.is_late(at + timing::LATE_FOR - Duration::from_millis(1)));
        assert!(!node.is_late(at + timing::LATE_FOR), "waited for again once it has been a while");
        node.set_late(true, at);
        node.set_late(false, at + Duration::from_millis(5));
        assert!(!node.is_late(at + Duration::from_millis(5)), "answered in time");
    }

    #[test]
    fn a_hung_node_stays_hung_until_it_answers_not_while_it_is_unreachable() {
        let node = node();
        assert!(!node.is_hung(crate::clock::now()));
        node.set_hung(true);
        assert!(node.is_hung(crate::clock::now()));
        assert!(
            !node.is_hung(crate::clock::now() + timing::LATE_FOR),
            "waited for again after a while"
        );
        let reply = Reply::of;
        // A dead node's quick refusals say nothing of whether requests that reach it stall
        // (an acquisition queued behind its clean-ups' retries times out).
        assert_eq!(reply(Err(Failure::Unreachable("reset".into()))).hangs(), None);
        assert_eq!(reply(Err(Failure::Refused("refused".into()))).hangs(), None);
        assert_eq!(reply(Err(Failure::ConnectTimedOut)).hangs(), Some(true));
        let busy = Failure::Server { code: "BUSY".into(), message: "BUSY script".into() };
        assert_eq!(reply(Err(busy)).hangs(), Some(false), "an error reply is an answer");
        assert_eq!(reply(Ok(Value::Okay)).hangs(), Some(false));
        node.set_hung(false);
        assert!(!node.is_hung(crate::clock::now()));
    }

    #[tokio::test]
    async fn a_request_waits_for_a_connect_unless_the_nodes_last_connect_failed() {
        let node = node();
        // Nothing listens there: the connect waited for is refused, and nothing is sent.
        assert!(matches!(node.connect_first().await, Err(Failure::Refused(_))));
        // From then on the request's own node timeout bounds its connect.
        assert!(node.connect_first().await.is_ok(), "not waited for");
    }

    #[tokio::test]
    async fn only_a_send_refused_within_a_few_microseconds_of_its_first_poll_counts_unwritten() {
        // (Tried a few times: a preemption of this very poll would count it maybe written.)
        let mut unwritten = false;
        for _ in 0..100 {
            unwritten |= with_first_poll(std::future::ready(())).await.1;
        }
        assert!(unwritten, "refused at once: its connection was closed before it");
        // Ready in its first poll, but that poll took a round trip's time: it may have been
        // written, run and failed while the caller's thread was preempted.
        let slow = std::future::poll_fn(|_| {
            std::thread::sleep(timing::UNWRITTEN_WITHIN * 5);
            std::task::Poll::Ready(())
        });
        assert!(!with_first_poll(slow).await.1);
        let mut polls = 0;
        let later = std::future::poll_fn(|cx| {
            polls += 1;
            if polls == 1 {
                cx.waker().wake_by_ref();
                return std::task::Poll::Pending;
            }
            std::task::Poll::Ready(())
        });
        assert!(!with_first_poll(later).await.1, "failed after a later poll");
    }
}
