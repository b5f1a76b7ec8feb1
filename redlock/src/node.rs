//! One Redis master: a lazily opened multiplexed connection, shared by every caller,
//! re-opened after it breaks.
//!
//! Ordering matters for safety: commands sent over one multiplexed connection reach the
//! server in the order they were queued, so a release queued after a `SET` that has not
//! been answered yet (a hung node) is processed after that `SET` once the node wakes up.

use std::sync::{Arc, Mutex, MutexGuard, PoisonError};
use std::time::{Duration, Instant};

use futures::future::{BoxFuture, FutureExt, Shared};
use redis::aio::MultiplexedConnection;
use redis::{AsyncConnectionConfig, Client, Cmd, RedisError, Value};

use crate::error::NodeOutcome;
use crate::quarantine;
use crate::script::{self, Call, Script};

/// Why a request to a node did not produce a reply.
#[derive(Clone, Debug)]
pub(crate) enum Failure {
    /// No connection could be used.
    Unreachable(Arc<str>),
    /// The node answered with an error reply.
    Server { code: Arc<str>, message: Arc<str> },
}

impl Failure {
    fn from_redis(err: &RedisError) -> Self {
        match err.code() {
            // "CODE detail", as the server said it: the code is what operators search for.
            Some(code) => Self::Server {
                code: code.into(),
                message: format!("{code} {}", err.detail().unwrap_or_default()).into(),
            },
            None => Self::Unreachable(err.to_string().into()),
        }
    }

    pub(crate) fn is_wrong_type(&self) -> bool {
        match self {
            Self::Server { code, message } => {
                &**code == "WRONGTYPE" || message.contains("WRONGTYPE")
            }
            Self::Unreachable(_) => false,
        }
    }

    fn is_noscript(&self) -> bool {
        matches!(self, Self::Server { code, .. } if &**code == "NOSCRIPT")
    }

    pub(crate) fn into_outcome(self) -> NodeOutcome {
        match self {
            _ if self.is_wrong_type() => NodeOutcome::WrongType,
            Self::Unreachable(why) => NodeOutcome::Unreachable(why),
            Self::Server { message, .. } => NodeOutcome::Failed(message),
        }
    }
}

/// Requests one connection may have queued and not yet written (redis-rs defaults to 50).
const PIPELINE_BUFFER: usize = 4096;

type Connecting = Shared<BoxFuture<'static, Result<MultiplexedConnection, Failure>>>;

enum State {
    Idle,
    Connecting { generation: u64, future: Connecting },
    Ready { generation: u64, connection: MultiplexedConnection },
}

/// A connection and the generation that identifies it, so that a caller who saw it fail
/// only discards that very connection, never a newer one.
struct Handle {
    generation: u64,
    connection: MultiplexedConnection,
    fresh: bool,
}

/// One master, as the coordinator sees it.
pub(crate) struct Node {
    name: Arc<str>,
    client: Client,
    connect_timeout: Duration,
    state: Mutex<(u64, State)>,
    /// Zero when restart quarantine is off.
    quarantine: Duration,
    /// When the quarantine of the node's current process ends, as of the last connect.
    quarantined_until: Arc<Mutex<Option<Instant>>>,
}

impl std::fmt::Debug for Node {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Node").field("name", &self.name).finish_non_exhaustive()
    }
}

impl Node {
    pub(crate) fn new(client: Client, connect_timeout: Duration, quarantine: Duration) -> Self {
        let info = client.get_connection_info();
        let name = format!("{}/{}", info.addr(), info.redis_settings().db()).into();
        Self {
            name,
            client,
            connect_timeout,
            state: Mutex::new((0, State::Idle)),
            quarantine,
            quarantined_until: Arc::default(),
        }
    }

    /// Whether the node's process started less than the restart quarantine ago, so that its
    /// answers must not count toward a quorum. Every restart breaks our connection, and
    /// every new connection re-reads the node's uptime before it is used.
    pub(crate) fn in_quarantine(&self) -> bool {
        !self.quarantine.is_zero()
            && lock_ignoring_poison(&self.quarantined_until).is_some_and(|end| Instant::now() < end)
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

    /// `host:port/db`, the identity used in reports and to detect duplicate nodes.
    pub(crate) fn name(&self) -> &Arc<str> {
        &self.name
    }

    /// Sends one command and returns the reply, reconnecting once if the cached connection
    /// turns out to be broken. The caller bounds the whole call with its node timeout.
    pub(crate) async fn request(&self, cmd: &Cmd) -> Result<Value, Failure> {
        let handle = self.connection().await?;
        match self.send(handle, cmd).await {
            Sent::Reply(reply) => reply,
            // A connection opened before this call may have died since (a node restart):
            // one retry on a new connection spares the caller a spurious failure.
            Sent::Stale => match self.send(self.connection().await?, cmd).await {
                Sent::Reply(reply) => reply,
                Sent::Stale => Err(Failure::Unreachable("connection closed".into())),
            },
        }
    }

    /// Runs a script by its hash, sending the source once if the node does not know it
    /// (a restarted node forgets its script cache).
    pub(crate) async fn eval(
        &self,
        script: &Script,
        keys: &[&str],
        args: &[&[u8]],
    ) -> Result<Value, Failure> {
        match self.request(&script.evalsha(keys, args)).await {
            Err(failure) if failure.is_noscript() => self.request(&script.eval(keys, args)).await,
            other => other,
        }
    }

    /// Runs a prepared script invocation, like [`eval`](Node::eval).
    pub(crate) async fn call(&self, call: &Call) -> Result<Value, Failure> {
        match self.request(call.evalsha()).await {
            Err(failure) if failure.is_noscript() => self.request(&call.eval()).await,
            other => other,
        }
    }

    async fn send(&self, mut handle: Handle, cmd: &Cmd) -> Sent {
        let reply = match handle.connection.send_packed_command(cmd).await {
            Ok(Value::ServerError(err)) => Err(Failure::from_redis(&RedisError::from(err))),
            Ok(value) => Ok(value),
            Err(err) if err.is_unrecoverable_error() || err.is_connection_dropped() => {
                self.discard(handle.generation);
                if !handle.fresh {
                    return Sent::Stale;
                }
                Err(Failure::from_redis(&err))
            }
            Err(err) => Err(Failure::from_redis(&err)),
        };
        Sent::Reply(reply)
    }

    /// The shared connection, opening it if needed. Concurrent callers wait on the same
    /// connect, each under its own timeout, never one after another.
    async fn connection(&self) -> Result<Handle, Failure> {
        let (generation, future) = {
            let mut guard = self.lock_state();
            let (counter, state) = &mut *guard;
            match state {
                State::Ready { generation, connection } => {
                    return Ok(Handle {
                        generation: *generation,
                        connection: connection.clone(),
                        fresh: false,
                    });
                }
                State::Connecting { generation, future } => (*generation, future.clone()),
                State::Idle => {
                    *counter += 1;
                    let future = self.connect().boxed().shared();
                    *state = State::Connecting { generation: *counter, future: future.clone() };
                    (*counter, future)
                }
            }
        };
        let result = future.await;
        let mut guard = self.lock_state();
        let (_, state) = &mut *guard;
        if matches!(state, State::Connecting { generation: g, .. } if *g == generation) {
            *state = match &result {
                Ok(connection) => State::Ready { generation, connection: connection.clone() },
                Err(_) => State::Idle,
            };
        }
        result.map(|connection| Handle { generation, connection, fresh: true })
    }

    fn connect(&self) -> impl Future<Output = Result<MultiplexedConnection, Failure>> + use<> {
        let client = self.client.clone();
        let timeout = self.connect_timeout;
        let (quarantine, quarantined_until) = (self.quarantine, self.quarantined_until.clone());
        let config = AsyncConnectionConfig::new()
            // Room for many requests queued to a hung node: a release that cannot be queued
            // behind its SET before its timeout is lost, and the SET then outlives it.
            .set_pipeline_buffer_size(PIPELINE_BUFFER)
            .set_connection_timeout(Some(timeout))
            .set_response_timeout(None);
        async move {
            // The deadline counts from the first poll, so a connect that nobody waited on
            // for a while cannot hand out a connection to a node that stopped answering.
            let open = async {
                let mut connection =
                    client.get_multiplexed_async_connection_with_config(&config).await?;
                // Before any command of ours: see the script module for why this is safety.
                if let Err(err) = load_scripts().query_async::<()>(&mut connection).await {
                    // A node that refuses SCRIPT LOAD still works through EVAL on demand.
                    if err.code().is_none() {
                        return Err(err);
                    }
                    tracing::debug!(target: "redlock", %err, "scripts not preloaded");
                }
                if !quarantine.is_zero() {
                    let end = read_quarantine_end(&mut connection, quarantine).await?;
                    *lock_ignoring_poison(&quarantined_until) = end;
                }
                Ok::<_, RedisError>(connection)
            };
            match tokio::time::timeout(timeout, open).await {
                Ok(Ok(connection)) => Ok(connection),
                Ok(Err(err)) => Err(Failure::Unreachable(err.to_string().into())),
                Err(_) => Err(Failure::Unreachable("connect timed out".into())),
            }
        }
    }

    fn discard(&self, generation: u64) {
        let mut guard = self.lock_state();
        let (_, state) = &mut *guard;
        if matches!(state, State::Ready { generation: g, .. } if *g == generation) {
            *state = State::Idle;
        }
    }

    fn lock_state(&self) -> MutexGuard<'_, (u64, State)> {
        lock_ignoring_poison(&self.state)
    }
}

/// The critical sections never panic; if one ever did, its state is still usable.
fn lock_ignoring_poison<T>(mutex: &Mutex<T>) -> MutexGuard<'_, T> {
    mutex.lock().unwrap_or_else(PoisonError::into_inner)
}

/// `SCRIPT LOAD` of every script, in one pipeline whose replies are ignored.
fn load_scripts() -> redis::Pipeline {
    let mut pipe = redis::pipe();
    for script in script::all() {
        pipe.add_command(script.load()).ignore();
    }
    pipe
}

/// Asks a freshly opened connection how long its node has been up.
async fn read_quarantine_end(
    connection: &mut MultiplexedConnection,
    quarantine: Duration,
) -> Result<Option<Instant>, RedisError> {
    let reply = connection.send_packed_command(redis::cmd("INFO").arg("server")).await?;
    let replied_at = Instant::now();
    let info: String = redis::from_redis_value(reply)?;
    let uptime = quarantine::parse_uptime(&info).unwrap_or_else(|| {
        // Without an uptime, the safe assumption is a process that just started.
        tracing::warn!(target: "redlock", "INFO server reports no uptime: assuming a restart");
        Duration::ZERO
    });
    Ok(quarantine::end(replied_at, uptime, quarantine))
}

enum Sent {
    Reply(Result<Value, Failure>),
    /// The connection, cached from an earlier call, was already dead: the command may be
    /// sent again on a new one.
    Stale,
}
