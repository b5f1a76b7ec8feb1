//! One Redis master: lazily opened multiplexed connections, one per place a caller runs in,
//! each shared by every caller there and re-opened after it breaks.
//!
//! A request goes out on a connection whose driver (the redis-rs task that writes and reads
//! the socket) runs where its caller does, so that it crosses no thread: each multi-thread
//! runtime that uses the client gets its own connection to each node, opened on first use
//! there and dropped when that runtime ends; the client's own thread has one for its
//! background work and for every caller whose runtime may sit idle (see [`Place`]). Nothing
//! orders one connection's requests with another's, and nothing needs to: every create
//! carries a deadline in the node's clock and respects its token's tombstone, and every
//! undo leaves one (see the guide's order page), so a request may reach a node before,
//! after or without the requests it undoes, on any connection.
//!
//! Requests carry no timer: callers bound them. A connect is bounded by the connect
//! timeout, and a caller may wait for it first ([`Node::connect_first`]) so that its own
//! timer covers only its exchange with the node: a cold start over a slow link (TCP, TLS,
//! `SCRIPT LOAD`, `TIME`, `INFO`: several round trips) does not eat the node timeout of the
//! first request. Every new connection reads the node's clock and its `INFO server` before
//! it is used (restart quarantine, the server check).

use crate::timing;
use std::borrow::Cow;
use std::collections::VecDeque;
use std::future::Future;
use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::sync::{Arc, LazyLock, Mutex, MutexGuard, PoisonError, Weak};
use std::time::{Duration, Instant};

use futures::future::{BoxFuture, FutureExt, Shared};
use redis::aio::MultiplexedConnection;
use redis::{AsyncConnectionConfig, Client, Cmd, RedisError, Value};
use tokio::runtime::{Handle as Runtime, Id as RuntimeId, RuntimeFlavor};
use tokio::sync::oneshot;
use tokio::task::JoinHandle;

use crate::command::{self, Command, Resend};
use crate::denied;
use crate::error::NodeOutcome;
use crate::quarantine;
use crate::route::Route;
use crate::server;
use crate::tasks::Tasks;

/// Why a request to a node did not produce a reply.
#[derive(Clone, Debug)]
pub(crate) enum Failure {
    /// No connection could be used, or it dropped before the reply.
    Unreachable(Arc<str>),
    /// The node refused the connection: no process listens there, and what it had not
    /// run is gone with it.
    Refused(Arc<str>),
    /// Opening a connection took longer than the connect timeout: like a request that
    /// timed out, the node may be hung with something sent to it before still to run.
    ConnectTimedOut,
    /// The node answered with an error reply.
    Server { code: Arc<str>, message: Arc<str> },
    /// The node refused this client itself: its login, its certificate, or a command its
    /// ACL user may not run. Nothing was run; no retry helps until something is changed.
    Denied(Arc<str>),
}

/// The error replies with which a node says it ran nothing, for now: it is loading its
/// data after a restart (`LOADING`), a script or module command is running past the busy
/// threshold (`BUSY`), or it is a replica cut off from its master (`MASTERDOWN`). Such a
/// node, restarted with the key on disk, keeps it for its lease unless the undo comes again.
const PUT_OFF: [&str; 3] = ["LOADING", "BUSY", "MASTERDOWN"];

/// Whether `message`, a [`Failure::Server`]'s (as [`Failure::outcome`] passes it on: the
/// code first, as [`Failure::from_redis`] writes it), is one of [`PUT_OFF`].
pub(crate) fn is_put_off(message: &str) -> bool {
    message.split(' ').next().is_some_and(|code| PUT_OFF.contains(&code))
}

/// Why a connect failed when it panicked: Tokio panics when a runtime without I/O opens a
/// socket, and nothing else in a connect does.
const NO_IO: &str = "the connect panicked: a runtime without I/O (built without `enable_io`)";

impl Failure {
    fn from_redis(err: &RedisError) -> Self {
        match err.code() {
            // "CODE detail", as the server said it: the code is what operators search for.
            Some(code) => {
                let message = format!("{code} {}", err.detail().unwrap_or_default());
                match command::explain_refusal(&message) {
                    Some(explained) => Self::Denied(explained.into()),
                    None if code == "NOPERM" => Self::Denied(message.into()),
                    None if code == "NOAUTH" => Self::Denied(denied::NOAUTH.into()),
                    None => Self::Server { code: code.into(), message: message.into() },
                }
            }
            None => Self::Unreachable(err.to_string().into()),
        }
    }

    fn is_wrong_type(&self) -> bool {
        match self {
            Self::Server { code, message } => {
                &**code == "WRONGTYPE" || message.contains("WRONGTYPE")
            }
            Self::Unreachable(_) | Self::Refused(_) | Self::ConnectTimedOut | Self::Denied(_) => {
                false
            }
        }
    }

    /// A create or extension not sent: an undo of its hold was issued first.
    fn withheld() -> Self {
        let message = "WITHHELD an undo of the hold was issued first: not sent";
        Self::Server { code: "WITHHELD".into(), message: message.into() }
    }

    fn is_noscript(&self) -> bool {
        matches!(self, Self::Server { code, .. } if &**code == "NOSCRIPT")
    }

    /// What the failure means for the round.
    pub(crate) fn outcome(&self) -> NodeOutcome {
        match self {
            _ if self.is_wrong_type() => NodeOutcome::WrongType,
            // The node ran it past its deadline (create_guard.lua), when its sender had
            // already given up on it: what the sender counted it as.
            // Or the client did not send it: past its time to go out, or behind its undo.
            Self::Server { code, .. } if matches!(&**code, "LATE" | "WITHHELD") => {
                NodeOutcome::TimedOut
            }
            Self::Unreachable(why) | Self::Refused(why) => NodeOutcome::Unreachable(why.clone()),
            Self::ConnectTimedOut => NodeOutcome::TimedOut,
            Self::Denied(why) => NodeOutcome::Denied(why.clone()),
            Self::Server { message, .. } => NodeOutcome::Failed(message.clone()),
        }
    }
}

/// A node's answer to one command.
#[derive(Debug)]
pub(crate) struct Reply {
    pub(crate) value: Result<Value, Failure>,
}

impl Reply {
    /// No connection could be had: nothing left the client.
    pub(crate) fn unconnected(failure: Failure) -> Self {
        Reply { value: Err(failure) }
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

type Connecting = Shared<BoxFuture<'static, Result<MultiplexedConnection, Failure>>>;

enum State {
    Idle,
    Connecting { generation: u64, future: Connecting },
    Ready { generation: u64, connection: MultiplexedConnection },
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
        result: &Result<MultiplexedConnection, Failure>,
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
            Ok(connection) => State::Ready { generation, connection: connection.clone() },
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
    /// The node's clock as last read (`TIME` when a connection opens, and again when the
    /// reading grows old): what a create's deadline is written in.
    clock: Arc<Mutex<Option<NodeClock>>>,
    /// A fresh reading of the node's clock is under way.
    reading_clock: Arc<AtomicBool>,
    /// The widest error deadlines on this node were given, by period: how late past its
    /// sender's timeout a create may still run there ([`Node::late_by`]).
    errors: Mutex<ErrorHistory>,
    /// The latest period of `errors` and its widest error so far, packed (see [`packed`]):
    /// a deadline whose error is no wider, in the same period, takes no lock.
    errors_latest: AtomicU64,
    /// When reading the node's clock last failed, in nanoseconds from `epoch` (0: it did
    /// not): it is not tried again before [`timing::CLOCK_RESYNC`] has passed.
    clock_failed_at: AtomicU64,
    /// When a create was last given no deadline (its clock never read), in nanoseconds from
    /// `epoch`, plus one (0: never): such a create may run however late.
    undated_at: AtomicU64,
}

fn duration_us(duration: Duration) -> u64 {
    u64::try_from(duration.as_micros()).unwrap_or(u64::MAX)
}

fn duration_ns(duration: Duration) -> u64 {
    u64::try_from(duration.as_nanos()).unwrap_or(u64::MAX)
}

/// `period` and the widest error `us` in one word, for a check without a lock: the period
/// in the high half (seconds since the node was made: 136 years), the error, capped, in the
/// low half (a wider error always takes the lock).
fn packed(period: u64, us: u64) -> u64 {
    (period.min(u64::from(u32::MAX) - 1) << 32) | us.min(u64::from(u32::MAX))
}

/// The widest clock errors a node's deadlines were given, by period.
#[derive(Debug, Default)]
struct ErrorHistory {
    /// `(period, widest error in µs)`, oldest first, at most
    /// [`timing::CLOCK_ERROR_PERIODS`] of them (periods without a deadline have none).
    periods: VecDeque<(u64, u64)>,
    /// The widest error of the periods dropped from `periods`.
    forgotten: u64,
}

impl ErrorHistory {
    /// Records an error of `us` given in `period`; returns the widest of that period's
    /// entry. One recorded late (its period read before a newer one began) goes to the
    /// first entry of a later period: counted from any instant before it, never lost.
    fn record(&mut self, period: u64, us: u64) -> u64 {
        let at = self.periods.iter().rposition(|(p, _)| *p < period).map_or(0, |i| i + 1);
        if let Some(entry) = self.periods.get_mut(at) {
            entry.1 = entry.1.max(us);
            return entry.1;
        }
        self.periods.push_back((period, us));
        if self.periods.len() > timing::CLOCK_ERROR_PERIODS
            && let Some((_, widest)) = self.periods.pop_front()
        {
            self.forgotten = self.forgotten.max(widest);
        }
        us
    }

    /// The widest error given in `period` or later; with the forgotten periods' when some
    /// of them may have been as late.
    fn since(&self, period: u64) -> u64 {
        let recent = self.periods.iter().rev().take_while(|(p, _)| *p >= period);
        let kept = recent.map(|(_, us)| *us).max();
        let forgotten = match self.periods.front() {
            Some((oldest, _)) if *oldest <= period => 0,
            _ => self.forgotten,
        };
        kept.unwrap_or(0).max(forgotten)
    }
}

/// One reading of a node's clock.
#[derive(Clone, Copy, Debug)]
struct NodeClock {
    /// The local instant halfway through the `TIME` round trip.
    at: Instant,
    /// What `TIME` said, in microseconds of the node's clock.
    node_us: u64,
    /// Half the round trip: how far the node's reading may be from `at`.
    error: Duration,
}

/// How a deadline treats a reading of the node's clock, by its age.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
enum Freshness {
    /// Used as it is.
    Fresh,
    /// Used, and read again in the background: its error grows with its age.
    Aging,
    /// Read again first (a node left idle): no deadline carries a stale reading's error.
    Stale,
}

impl Freshness {
    fn of(age: Duration) -> Self {
        if age <= timing::CLOCK_RESYNC {
            Self::Fresh
        } else if age <= timing::CLOCK_RESYNC * 2 {
            Self::Aging
        } else {
            Self::Stale
        }
    }
}

impl NodeClock {
    /// A `TIME` reply of `(seconds, microseconds)` to a request sent at `sent` and answered
    /// at `received`: taken for the midpoint, give or take half the round trip.
    fn taken(sent: Instant, received: Instant, (secs, micros): (u64, u64)) -> Self {
        let half = received.saturating_duration_since(sent) / 2;
        let node_us = secs.saturating_mul(1_000_000).saturating_add(micros);
        NodeClock { at: sent + half, node_us, error: half }
    }

    /// The reading's error at `now`: its round trip's, grown by the drift since.
    fn error(&self, now: Instant) -> Duration {
        self.error_at_age(now.saturating_duration_since(self.at))
    }

    /// [`NodeClock::error`] at `age` past the reading.
    fn error_at_age(&self, age: Duration) -> Duration {
        let aged = age.mul_f64(timing::CLOCK_DRIFT);
        (self.error + aged).max(timing::CLOCK_MIN_ERROR)
    }

    /// Whether `other` reads the clock this reading read: what this one says the node's
    /// clock showed at `other.at` is within both readings' errors of what `other` read.
    /// Not so when another server answers at the same address (a failover), or when the
    /// node's clock was stepped.
    fn agrees_with(&self, other: &NodeClock) -> bool {
        let (earlier, later) = if self.at <= other.at { (self, other) } else { (other, self) };
        let age = later.at.saturating_duration_since(earlier.at);
        let predicted = u128::from(earlier.node_us) + age.as_micros();
        let apart = predicted.abs_diff(u128::from(later.node_us));
        apart <= (earlier.error_at_age(age) + later.error_at_age(Duration::ZERO)).as_micros()
    }
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
            late_until: AtomicU64::new(0),
            hung_until: AtomicU64::new(0),
            epoch: crate::clock::now(),
            servers,
            clock: Arc::default(),
            reading_clock: Arc::default(),
            errors: Mutex::default(),
            errors_latest: AtomicU64::new(u64::MAX),
            clock_failed_at: AtomicU64::new(0),
            undated_at: AtomicU64::new(0),
        }
    }

    /// With `false`, every request goes out on the client's own thread's connection, as
    /// from a current-thread runtime (see [`Place`]).
    pub(crate) fn connections_per_runtime(mut self, on: bool) -> Self {
        self.per_runtime = on;
        self
    }

    /// The deadline, in the node's milliseconds, of a request sent now that its sender
    /// waits `within` for: the node's clock now as estimated, plus `within`, plus the
    /// estimate's error, so that a request that reaches the node while its sender still
    /// waits is never refused; 0 (none) while the node's clock was never read.
    ///
    /// A reading older than [`timing::CLOCK_RESYNC`] is taken again in the background; one older
    /// than twice that (a node left idle) first, so that no deadline carries the error of
    /// a stale reading.
    pub(crate) async fn deadline(&self, within: Duration) -> u64 {
        if let Some(deadline) = self.known_deadline(within, crate::clock::now()) {
            return deadline;
        }
        // Stale, or never read (its `TIME` was refused): read it first, at most once per
        // resync period while it keeps failing.
        self.read_clock_now(within).await;
        // The reading in use: the fresh one, an aged one still narrower, or one that
        // another caller took meanwhile.
        let clock = lock_ignoring_poison(&self.clock);
        let now = crate::clock::now();
        let Some(reading) = *clock else {
            self.undated_at.fetch_max(self.nanos(now).saturating_add(1), Ordering::Relaxed);
            return 0;
        };
        self.deadline_aged(reading, within, now, now.saturating_duration_since(reading.at))
    }

    /// [`Node::deadline`] at `now` without waiting: from the reading of the node's clock
    /// as it stands, when fresh enough (an aging one is taken again in the background);
    /// `None` when it must be read first.
    fn known_deadline(&self, within: Duration, now: Instant) -> Option<u64> {
        let clock = lock_ignoring_poison(&self.clock);
        let reading = (*clock)?;
        let age = now.saturating_duration_since(reading.at);
        let freshness = Freshness::of(age);
        let deadline =
            (freshness != Freshness::Stale).then(|| self.deadline_aged(reading, within, now, age));
        drop(clock);
        if freshness == Freshness::Aging {
            self.read_clock_again();
        }
        deadline
    }

    /// The deadline from `clock`, a reading `age` old at `now` (every create reads its age
    /// once). Called with the reading's lock held: a narrower reading that replaces it
    /// waits until this deadline's error is noted, so that a horizon (`Node::late_by`,
    /// which reads the reading in use, then the errors noted) counts it either way.
    fn deadline_aged(
        &self,
        clock: NodeClock,
        within: Duration,
        now: Instant,
        age: Duration,
    ) -> u64 {
        let error = clock.error_at_age(age);
        self.note_error(now, duration_us(error));
        let elapsed = age + within + error;
        let us = u128::from(clock.node_us) + elapsed.as_micros();
        u64::try_from(us.div_ceil(1000)).unwrap_or(u64::MAX)
    }

    /// Records that a deadline given at `now` carries an error of `us` microseconds.
    fn note_error(&self, now: Instant, us: u64) {
        let period = self.nanos(now) / duration_ns(timing::CLOCK_ERROR_PERIOD).max(1);
        let latest = self.errors_latest.load(Ordering::Relaxed);
        if latest != u64::MAX && latest >> 32 == period && us <= latest & u64::from(u32::MAX) {
            return;
        }
        let mut errors = lock_ignoring_poison(&self.errors);
        let widest = errors.record(period, us);
        // Stored under the lock: it always names a period `errors` holds at least as wide.
        self.errors_latest.store(packed(period, widest), Ordering::Relaxed);
    }

    /// Whether every create sent to the node since `since`, and every one still to be
    /// stamped, carries a deadline: its clock is read, and was when each was stamped
    /// (readings are replaced, never dropped).
    pub(crate) fn dates_creates_since(&self, since: Instant) -> bool {
        // Read under the reading's lock, under which an undated create notes itself.
        let clock = lock_ignoring_poison(&self.clock);
        let undated = self.undated_at.load(Ordering::Relaxed);
        clock.is_some() && (undated == 0 || undated <= self.nanos(since))
    }

    /// How far past a request's own timeout the node may still run a create of a hold whose
    /// first round started at `since`: what a client that gave up on that create must still
    /// wait out before nothing of it can appear. Twice the widest error a deadline on this
    /// node was given since then, or that the reading in use has now (the deadline adds
    /// the error once, and the node's clock may be off by as much the other way);
    /// [`timing::UNREAD_CLOCK_ERROR`], or the connect timeout if longer, while the node's clock was
    /// never read.
    ///
    /// Never narrower than any create of the hold needs: each got its deadline after
    /// `since` (kept by periods of [`timing::CLOCK_ERROR_PERIOD`] from the one `since` falls
    /// in, and beyond [`timing::CLOCK_ERROR_PERIODS`] of them the widest of the periods
    /// forgotten), or gets it later from the reading in use (its error only grows with its
    /// age until the create's deadline is given: a reading taken later replaces it only
    /// when narrower, see [`keep_reading`]). A slow reading once, long before, no
    /// longer counts: it widens the bounds of the holds whose creates it stamped only.
    ///
    /// The reading in use counts with the error it will have aged to by `now`: the latest
    /// a create still to be stamped may be stamped (a caller that asks every node reads
    /// the clock once).
    pub(crate) fn late_by(&self, since: Instant, now: Instant) -> Duration {
        let Some(reading) = *lock_ignoring_poison(&self.clock) else {
            // A first reading may still come, as slow as a connect (or a read of the clock)
            // may run: its error up to half that, twice over for a create it stamps.
            return timing::UNREAD_CLOCK_ERROR.max(self.connect_timeout);
        };
        let period = self.nanos(since) / duration_ns(timing::CLOCK_ERROR_PERIOD).max(1);
        let given = lock_ignoring_poison(&self.errors).since(period);
        let now = duration_us(reading.error(now));
        let widest = given.max(now).max(duration_us(timing::CLOCK_MIN_ERROR));
        Duration::from_micros(widest) * 2
    }

    /// Reads the node's clock on the caller's open connection now (for at most `within`), and keeps
    /// the reading (see [`keep_reading`]); not when that failed, or was wider than the reading
    /// in use, less than [`timing::CLOCK_RESYNC`] ago.
    async fn read_clock_now(&self, within: Duration) {
        let now = crate::clock::now();
        let failed = self.clock_failed_at.load(Ordering::Relaxed);
        if failed != 0 && self.nanos(now) < failed.saturating_add(duration_ns(timing::CLOCK_RESYNC))
        {
            return;
        }
        let Some(handle) = self.ready() else { return };
        let mut connection = handle.connection;
        // Within the connect timeout too: no reading's error exceeds half of it (see
        // `Node::late_by` while none was taken).
        let within = within.min(self.connect_timeout);
        match tokio::time::timeout(within, read_clock(&mut connection)).await {
            Ok(Ok(fresh)) if keep_reading(&self.clock, fresh) => {
                self.clock_failed_at.store(0, Ordering::Relaxed);
            }
            // Wider than the aged reading in use: that one stays, and is not read again
            // first for a while (each create would wait for a `TIME` meanwhile).
            _ => self.clock_failed_at.store(self.nanos(now).max(1), Ordering::Relaxed),
        }
    }

    /// Reads the node's clock again on the caller's open connection, in the background (one
    /// at a time); a reading with a smaller error replaces the old one.
    fn read_clock_again(&self) {
        let Some(handle) = self.ready() else { return };
        if self.reading_clock.swap(true, Ordering::AcqRel) {
            return;
        }
        let (clock, reading) = (self.clock.clone(), self.reading_clock.clone());
        let timeout = self.connect_timeout;
        // Where the connection's driver runs: the reading then crosses no thread either.
        let task = self.spawn_in(self.place(), async move {
            let mut connection = handle.connection;
            if let Ok(Ok(fresh)) = tokio::time::timeout(timeout, read_clock(&mut connection)).await
            {
                keep_reading(&clock, fresh);
            }
            reading.store(false, Ordering::Release);
        });
        if task.is_none() {
            self.reading_clock.store(false, Ordering::Release);
        }
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
    /// A [bounded](Command::bounded) command gets its deadline here: `within` from now in
    /// the node's clock, plus the estimate's error (see [`Node::deadline`]); it is not sent
    /// at all once `by` has passed (it answers `LATE`, as the node would): the client's
    /// bounds on what a create may still set count on every create going out by then,
    /// however late its future is polled (a caller's runtime idle or blocked meanwhile).
    ///
    /// `connected` is what [`Node::connect_first`] found, if it was just now.
    pub(crate) async fn send(
        &self,
        command: &Command,
        within: Duration,
        (by, route): (Option<Instant>, Option<&Route>),
        connected: Connected,
    ) -> Reply {
        // A create without a time to go out by goes out by now: never later than asked.
        let bound = command.is_bounded().then(|| (within, by.unwrap_or_else(crate::clock::now)));
        let bound = Bound { deadline: bound, route };
        let reply = self.send_cmd(command.first(), command.resend(), bound, connected.0).await;
        if !matches!(&reply.value, Err(failure) if failure.is_noscript()) {
            return reply;
        }
        let Some(eval) = command.fallback() else { return reply };
        // NOSCRIPT: the script did not run, so sending it in full is no repetition. Boxed,
        // like every rare path here: the request future stays smaller, and a round moves
        // its requests around.
        Box::pin(self.send_cmd(&eval, command.resend(), bound, None)).await
    }

    /// `cmd`, ending with its deadline if it is `bound` to be given up on that long after
    /// it goes out (see [`Node::deadline`]): stamped once its connection is there, so that
    /// the deadline is read from that connection's reading of the node's clock. `Err` for
    /// a bound command whose time to go out has passed: it must not go out.
    async fn stamped<'a>(
        &self,
        cmd: &'a Cmd,
        bound: Option<(Duration, Instant)>,
    ) -> Result<Cow<'a, Cmd>, Failure> {
        let Some((within, by)) = bound else { return Ok(Cow::Borrowed(cmd)) };
        let now = crate::clock::now();
        let (deadline, now) = match self.known_deadline(within, now) {
            Some(deadline) => (deadline, now),
            None => (Box::pin(self.deadline(within)).await, crate::clock::now()),
        };
        if now > by {
            let message = "LATE the request was due to go out earlier: not sent";
            return Err(Failure::Server { code: "LATE".into(), message: message.into() });
        }
        Ok(Cow::Owned(command::with_last_arg(cmd, deadline)))
    }

    /// `cmd` on `first` if given (the caller's connection, looked up a moment ago), or on
    /// the caller's connection now.
    async fn send_cmd(
        &self,
        cmd: &Cmd,
        resend: Resend,
        bound: Bound<'_>,
        first: Option<Handle>,
    ) -> Reply {
        if resend == Resend::Never {
            return Box::pin(self.send_once(cmd)).await;
        }
        let first = match first.or_else(|| self.ready()) {
            Some(handle) => handle,
            None => match Box::pin(self.connection()).await {
                Ok(handle) => handle,
                Err(failure) => return Reply::unconnected(failure),
            },
        };
        let stamped = match self.stamped(cmd, bound.deadline).await {
            Ok(stamped) => stamped,
            Err(failure) => return Reply { value: Err(failure) },
        };
        match self.send_on(first, &stamped, bound.route).await {
            Sent::Reply(value) => Reply { value },
            // Safe to repeat (every lock operation is): once more on a new connection.
            Sent::Stale(_) => Box::pin(self.send_anew(cmd, bound)).await,
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
        if let Ok(handle) = &connection
            && !handle.fresh
            && !matches!(self.send_on(handle.clone(), &PING, None).await, Sent::Reply(_))
        {
            // Found closed (and discarded): a new one.
            connection = self.connection().await;
        }
        let handle = match connection {
            Ok(handle) => handle,
            Err(failure) => return Reply::unconnected(failure),
        };
        let value = match self.send_on(handle, cmd, None).await {
            Sent::Reply(value) => value,
            Sent::Stale(failure) => Err(failure),
        };
        Reply { value }
    }

    /// Sends `cmd` on a new connection: a connection opened before this call may have
    /// died since (a node restart, an idle timeout), and one more try spares the caller a
    /// spurious failure.
    async fn send_anew(&self, cmd: &Cmd, bound: Bound<'_>) -> Reply {
        let value = match self.connection().await {
            Ok(handle) => match self.stamped(cmd, bound.deadline).await {
                Ok(stamped) => match self.send_on(handle, &stamped, bound.route).await {
                    Sent::Reply(value) => value,
                    Sent::Stale(failure) => Err(failure),
                },
                Err(failure) => Err(failure),
            },
            Err(failure) => Err(failure),
        };
        Reply { value }
    }

    /// `cmd` on `handle`'s connection; a create or extension on its hold's `route` (not
    /// sent once an undo of the hold was issued: see [`Route::queue`]).
    async fn send_on(&self, handle: Handle, cmd: &Cmd, route: Option<&Route>) -> Sent {
        let mut connection = handle.connection.clone();
        let send = connection.send_packed_command(cmd);
        let sent = match route {
            None => send.await,
            Some(route) => match route.queue(&handle, send).await {
                Some(sent) => sent,
                None => return Sent::Reply(Err(Failure::withheld())),
            },
        };
        match sent {
            Ok(Value::ServerError(err)) => Sent::Reply(Err(Failure::from_redis(&err.into()))),
            Ok(value) => Sent::Reply(Ok(value)),
            Err(err) if err.is_unrecoverable_error() || err.is_connection_dropped() => {
                self.discard(handle.generation);
                let failure = Failure::from_redis(&err);
                if handle.fresh { Sent::Reply(Err(failure)) } else { Sent::Stale(failure) }
            }
            Err(err) => Sent::Reply(Err(Failure::from_redis(&err))),
        }
    }

    /// The caller's connection if it is open: the common case, with nothing to wait for.
    fn ready(&self) -> Option<Handle> {
        match self.lock_lanes().state(self.place()) {
            Some(State::Ready { generation, connection }) => Some(Handle {
                generation: *generation,
                connection: connection.clone(),
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
                State::Ready { generation, connection } => {
                    return Ok(Handle {
                        generation: *generation,
                        connection: connection.clone(),
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
        result.map(|connection| Handle { generation, connection, fresh: true })
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
        let (clock, connections) = (self.clock.clone(), self.connections.clone());
        let task = self.spawn_in(place, async move {
            let seen = Seen { servers: &servers, name: &name };
            let open = open(&client, timeout, quarantine, &quarantined_until, seen, &clock);
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
    clock: &Mutex<Option<NodeClock>>,
) -> Result<MultiplexedConnection, Failure> {
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
    // Before any command of ours: see the command module for why this is safety.
    if let Err(err) = load_scripts().query_async::<()>(&mut connection).await {
        // A node that refuses SCRIPT LOAD still works through EVAL on demand.
        if err.code().is_none() {
            return Err(unreachable(err));
        }
        tracing::warn!(
            target: "redlock",
            %err,
            "scripts not preloaded (an ACL user without `script|load`?): they still run, but \
             a release queued behind a SET on a hung node may then be lost"
        );
    }
    // Before any create goes out on it: a create's deadline is written in the node's clock.
    match read_clock(&mut connection).await {
        Ok(reading) => {
            keep_reading(clock, reading);
        }
        Err(err) if err.is_io_error() || err.is_connection_dropped() || err.is_timeout() => {
            return Err(unreachable(err));
        }
        // A node busy with a script, loading its data, ...: not a connection to use yet
        // (creates on it would carry no deadline); the next request connects again.
        Err(err) if err.code().is_some_and(|code| !matches!(code, "NOPERM" | "ERR")) => {
            return Err(Failure::from_redis(&err));
        }
        // Refused (an ACL user without `+time`) or not understood: the node still works,
        // without deadlines (read again now and then: see `Node::deadline`).
        Err(err) => tracing::warn!(
            target: "redlock",
            %err,
            "the node's clock could not be read (an ACL user without `+time`?): creates on it \
             carry no deadline, so one that reaches it late may outlive its undo"
        ),
    }
    let reply = connection.send_packed_command(redis::cmd("INFO").arg("server")).await;
    let replied_at = Instant::now();
    let info = match reply {
        Ok(Value::ServerError(err)) => Err(Failure::from_redis(&err.into())),
        Ok(value) => Ok(redis::from_redis_value::<String>(value).unwrap_or_else(|err| {
            tracing::warn!(target: "redlock", %err, "unexpected INFO server reply");
            String::new()
        })),
        Err(err) if err.code().is_some() => Err(Failure::from_redis(&err)),
        Err(err) => return Err(unreachable(err)),
    };
    let info = match info {
        Ok(info) => info,
        Err(failure) if quarantine.is_zero() => {
            // Only the server check is skipped: nothing else needs INFO.
            tracing::debug!(target: "redlock", ?failure, "INFO server refused: server not checked");
            return Ok(connection);
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
    Ok(connection)
}

/// Makes `fresh` the reading of the node's clock in use, unless the one in use has a
/// smaller error now; `true` when `fresh` is in use. Every reading of one node's clock stays
/// good, its error growing with its age, and a hold's horizon counts the error of the
/// reading in use when it is computed (`Node::late_by`) for the creates still to be stamped:
/// a wider reading taken later (a new connection whose `TIME` was slow) would stamp them
/// with a deadline later than that horizon counts on, and such a create landing after the
/// release's tombstone would set its key again.
///
/// Unless the two disagree (see [`NodeClock::agrees_with`]): the one in use then tells the
/// clock of another server (a failover behind the same address) or of a clock since
/// stepped, and the horizons it was counted in are no better than the fresh one.
fn keep_reading(clock: &Mutex<Option<NodeClock>>, fresh: NodeClock) -> bool {
    let now = crate::clock::now();
    let mut clock = lock_ignoring_poison(clock);
    if let Some(current) = *clock
        && current.error(now) < fresh.error(now)
    {
        if current.agrees_with(&fresh) {
            return false;
        }
        tracing::warn!(
            target: "redlock",
            "a new reading of a node's clock disagrees with the one in use (another server \
             behind its address, or its clock stepped): the new one is used"
        );
    }
    *clock = Some(fresh);
    true
}

/// Reads the node's clock with `TIME`, timing the round trip.
async fn read_clock(connection: &mut MultiplexedConnection) -> Result<NodeClock, RedisError> {
    let sent = crate::clock::now();
    let reply = connection.send_packed_command(&redis::cmd("TIME")).await?;
    let received = crate::clock::now();
    if let Value::ServerError(err) = reply {
        return Err(err.into());
    }
    let time: (u64, u64) = redis::from_redis_value(reply)?;
    Ok(NodeClock::taken(sent, received, time))
}

/// Where a connecting node records the server it reached.
#[derive(Clone, Copy)]
struct Seen<'a> {
    servers: &'a server::Servers,
    name: &'a Arc<str>,
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

/// What bounds a create or extension: the time it goes out by (with its deadline's
/// `within`), and its hold's route on the node.
#[derive(Clone, Copy)]
struct Bound<'a> {
    deadline: Option<(Duration, Instant)>,
    route: Option<&'a Route>,
}

enum Sent {
    Reply(Result<Value, Failure>),
    /// The connection, cached from an earlier call, was already dead (or died with the
    /// command): it may or may not have run.
    Stale(Failure),
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
        let reply = |value| Reply { value };
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

    #[test]
    fn a_clock_readings_error_is_half_its_round_trip_grown_by_the_drift_and_at_least_a_millisecond()
    {
        let ms = Duration::from_millis;
        let sent = crate::clock::now();
        let reading = NodeClock::taken(sent, sent + ms(6), (1_700_000_000, 250));
        assert_eq!(reading.at, sent + ms(3), "the midpoint of the round trip");
        assert_eq!(reading.node_us, 1_700_000_000_000_250);
        assert_eq!(reading.error(reading.at), ms(3));
        // 1 ms a second since (CLOCK_DRIFT).
        assert_eq!(reading.error(reading.at + Duration::from_secs(10)), ms(13));
        let quick = NodeClock::taken(sent, sent + Duration::from_micros(200), (0, 0));
        assert_eq!(quick.error(quick.at), timing::CLOCK_MIN_ERROR, "never less");
    }

    #[test]
    fn a_clock_reading_is_read_again_once_ten_seconds_old_and_first_once_twenty() {
        let s = Duration::from_secs;
        assert_eq!(Freshness::of(Duration::ZERO), Freshness::Fresh);
        assert_eq!(Freshness::of(timing::CLOCK_RESYNC), Freshness::Fresh);
        assert_eq!(Freshness::of(s(10) + Duration::from_millis(1)), Freshness::Aging);
        assert_eq!(Freshness::of(s(20)), Freshness::Aging);
        assert_eq!(Freshness::of(s(20) + Duration::from_millis(1)), Freshness::Stale);
    }

    #[tokio::test(start_paused = true)]
    async fn a_creates_deadline_is_the_nodes_clock_plus_the_node_timeout_plus_the_readings_error() {
        let ms = Duration::from_millis;
        let node = node();
        let at = crate::clock::now();
        // Read with a 2 ms round trip: the node's clock said 1,000,000 s at `at`, give or
        // take 1 ms.
        *lock_ignoring_poison(&node.clock) =
            Some(NodeClock::taken(at - ms(1), at + ms(1), (1_000_000, 0)));
        tokio::time::advance(Duration::from_secs(3)).await;
        // 3 s later: the node's clock then, plus the 50 ms the sender waits, plus the
        // reading's error (1 ms, grown by 3 ms), in the node's milliseconds.
        assert_eq!(node.deadline(ms(50)).await, 1_000_000_000 + 3_000 + 50 + 4);
        // A create given up on may run that late: twice the widest error given.
        assert_eq!(node.late_by(at, crate::clock::now()), ms(8));
    }

    #[tokio::test(start_paused = true)]
    async fn a_node_whose_clock_was_never_read_gets_creates_with_no_deadline() {
        let node = node();
        assert_eq!(node.deadline(Duration::from_millis(50)).await, 0, "none");
        assert_eq!(
            node.late_by(crate::clock::now(), crate::clock::now()),
            timing::UNREAD_CLOCK_ERROR
        );
    }

    #[tokio::test(start_paused = true)]
    async fn a_hold_counts_the_widest_clock_error_given_since_it_began_not_the_widest_ever() {
        let ms = Duration::from_millis;
        let node = node();
        let before = crate::clock::now();
        // A slow reading (300 ms round trip), used for a deadline.
        *lock_ignoring_poison(&node.clock) =
            Some(NodeClock::taken(before - ms(150), before + ms(150), (1_000_000, 0)));
        node.deadline(ms(50)).await;
        tokio::time::advance(timing::CLOCK_ERROR_PERIOD * 2).await;
        // A quick one replaces it (a new connection).
        let after = crate::clock::now();
        *lock_ignoring_poison(&node.clock) =
            Some(NodeClock::taken(after - ms(1), after + ms(1), (1_000_002, 0)));
        node.deadline(ms(50)).await;
        assert!(
            node.late_by(before, crate::clock::now()) >= ms(300),
            "a hold that began before the slow reading"
        );
        assert_eq!(node.late_by(after, crate::clock::now()), ms(2), "one that began after it");
        // The reading in use counts, whenever the hold began: its creates may still use it.
        *lock_ignoring_poison(&node.clock) =
            Some(NodeClock::taken(after - ms(20), after + ms(20), (1_000_002, 0)));
        assert_eq!(node.late_by(after, crate::clock::now()), ms(40));
    }

    /// A node whose clock was read with a round trip of 2 ms, at the instant returned.
    fn node_with_a_quick_reading() -> (Node, Instant) {
        let node = node();
        let now = crate::clock::now();
        let ms = Duration::from_millis;
        let quick = NodeClock::taken(now - ms(1), now + ms(1), (1_000_000, 0));
        assert!(keep_reading(&node.clock, quick), "the first reading");
        (node, now)
    }

    #[tokio::test(start_paused = true)]
    async fn a_reading_of_the_clock_replaces_the_one_in_use_only_when_narrower() {
        let ms = Duration::from_millis;
        let (node, now) = node_with_a_quick_reading();
        // A slow one (a new connection's `TIME` held back): the quick one stays.
        let slow = NodeClock::taken(now - ms(300), now + ms(300), (1_000_000, 0));
        assert!(!keep_reading(&node.clock, slow));
        assert_eq!(node.late_by(now, now), ms(2));
        // Once the quick one aged past it, a slow one is narrower.
        tokio::time::advance(Duration::from_secs(400)).await;
        let later = crate::clock::now();
        let fresh = NodeClock::taken(later - ms(100), later + ms(100), (1_000_400, 0));
        assert!(keep_reading(&node.clock, fresh), "400 ms of drift against 100 ms");
    }

    #[tokio::test(start_paused = true)]
    async fn a_wider_reading_of_the_clock_that_disagrees_with_the_one_in_use_replaces_it() {
        let ms = Duration::from_millis;
        let (node, _) = node_with_a_quick_reading();
        // 5 s later by our clock, a slow `TIME` that reads the same clock: the quick one stays.
        tokio::time::advance(Duration::from_secs(5)).await;
        let later = crate::clock::now();
        let same = NodeClock::taken(later - ms(300), later + ms(300), (1_000_005, 0));
        assert!(!keep_reading(&node.clock, same));
        // Another server behind the address, its clock 2 s behind: it is read from now on.
        let other = NodeClock::taken(later - ms(300), later + ms(300), (1_000_003, 0));
        assert!(keep_reading(&node.clock, other));
        assert_eq!(node.late_by(later, later), ms(600), "twice the new reading's error");
        // And a clock stepped 2 s ahead, read slowly, just as well.
        let stepped = NodeClock::taken(later - ms(400), later + ms(400), (1_000_007, 0));
        assert!(keep_reading(&node.clock, stepped));
    }

    #[test]
    fn the_error_history_never_loses_an_error_it_recorded() {
        let mut errors = ErrorHistory::default();
        errors.record(5, 100);
        errors.record(7, 10);
        // Recorded late (its period read before period 7 began): counted from period 7.
        assert_eq!(errors.record(6, 50), 50);
        assert_eq!(
            (errors.since(5), errors.since(6), errors.since(7), errors.since(8)),
            (100, 50, 50, 0)
        );
        // Past the periods kept, the forgotten ones count for holds that began before the oldest kept.
        let first = 8;
        for period in first..first + u64::try_from(timing::CLOCK_ERROR_PERIODS).unwrap() {
            errors.record(period, 1);
        }
        assert_eq!(errors.since(first + 1), 1);
        assert_eq!(errors.since(6), 100, "the widest forgotten");
    }

    #[tokio::test]
    async fn a_request_waits_for_a_connect_unless_the_nodes_last_connect_failed() {
        let node = node();
        // Nothing listens there: the connect waited for is refused, and nothing is sent.
        assert!(matches!(node.connect_first().await, Err(Failure::Refused(_))));
        // From then on the request's own node timeout bounds its connect.
        assert!(node.connect_first().await.is_ok(), "not waited for");
    }
}
