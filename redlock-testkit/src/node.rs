//! One `redis-server` child process: start, kill, restart, pause, inspect.

use std::{
    fs,
    path::{Path, PathBuf},
    process::{Child, Command, Stdio},
    sync::{Mutex, MutexGuard, PoisonError},
    thread,
    time::{Duration, Instant},
};

use nix::{
    errno::Errno,
    sys::signal::{self, Signal},
    unistd::Pid,
};
use tempfile::TempDir;

use crate::{
    binary,
    error::{Error, Result},
    port,
    ready::{self, Probe},
};

/// How long a node may take to answer PING after being spawned.
const READY_TIMEOUT: Duration = Duration::from_secs(5);
/// Delay between readiness probes: short, so tests don't wait for nothing.
const POLL_INTERVAL: Duration = Duration::from_millis(5);
/// Attempts with a fresh free port when another process took ours meanwhile.
const PORT_ATTEMPTS: usize = 5;
/// Connect and read/write timeout of [`RedisNode::connection`] and of `Counter`s.
pub(crate) const CONNECTION_TIMEOUT: Duration = Duration::from_secs(2);
const LOG_FILE: &str = "redis.log";

/// How a node keeps its data across [`RedisNode::restart`].
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub enum Persistence {
    /// No RDB snapshots, no AOF (`--save "" --appendonly no`): a restart comes back empty.
    #[default]
    None,
    /// `--appendonly yes --appendfsync always`: a restart comes back with its keys.
    AppendFsyncAlways,
}

/// How to start a [`RedisNode`].
#[derive(Clone, Debug, Default)]
pub struct NodeConfig {
    persistence: Persistence,
    port: Option<u16>,
    extra_args: Vec<String>,
}

impl NodeConfig {
    /// The defaults: no persistence, a free loopback port, no extra arguments.
    pub fn new() -> Self {
        Self::default()
    }

    /// How the node keeps its data across restarts.
    pub fn persistence(mut self, persistence: Persistence) -> Self {
        self.persistence = persistence;
        self
    }

    /// A fixed port instead of a free one.
    pub fn port(mut self, port: u16) -> Self {
        self.port = Some(port);
        self
    }

    /// One more argument for the `redis-server` command line, e.g. `"--maxmemory"` then `"1mb"`.
    pub fn extra_arg(mut self, arg: impl Into<String>) -> Self {
        self.extra_args.push(arg.into());
        self
    }

    /// The same config with a free port: a cluster cannot share one fixed port.
    pub(crate) fn without_port(mut self) -> Self {
        self.port = None;
        self
    }
}

/// A running (or killed, or paused) `redis-server` on `127.0.0.1`.
///
/// Dropping it kills the process and removes its data directory.
#[derive(Debug)]
pub struct RedisNode {
    config: NodeConfig,
    binary: PathBuf,
    port: u16,
    dir: TempDir,
    /// Behind a mutex only so `&self` queries can reap a process that died on its own.
    child: Mutex<Option<Child>>,
    paused: bool,
}

impl RedisNode {
    /// Starts a node with the default config and waits until it answers PING.
    pub fn start() -> Result<RedisNode> {
        Self::start_with(NodeConfig::new())
    }

    /// Starts a node with `config` and waits until it answers PING.
    pub fn start_with(config: NodeConfig) -> Result<RedisNode> {
        let binary = binary::redis_server()?;
        let dir = tempfile::Builder::new()
            .prefix("redlock-testkit-")
            .tempdir()
            .map_err(|e| Error::spawn("could not create a temp dir for redis-server", e))?;
        let attempts = if config.port.is_some() { 1 } else { PORT_ATTEMPTS };
        let mut attempt = 0;
        loop {
            attempt += 1;
            let port = match config.port {
                Some(port) => port,
                None => port::free_port()?,
            };
            match launch(&binary, dir.path(), port, &config) {
                Ok(child) => {
                    return Ok(RedisNode {
                        config,
                        binary,
                        port,
                        dir,
                        child: Mutex::new(Some(child)),
                        paused: false,
                    });
                }
                Err(Launch::PortTaken(_)) if attempt < attempts => continue,
                Err(Launch::PortTaken(e) | Launch::Failed(e)) => return Err(e),
            }
        }
    }

    /// The TCP port on 127.0.0.1; stays the same across restarts.
    pub fn port(&self) -> u16 {
        self.port
    }

    /// `redis://127.0.0.1:PORT`.
    pub fn url(&self) -> String {
        format!("redis://127.0.0.1:{}", self.port)
    }

    /// The process id, or `None` while killed (or after it exited on its own).
    pub fn pid(&self) -> Option<u32> {
        let mut child = self.child();
        if let Some(c) = child.as_mut() {
            // Reap a process that died by itself so we don't report a zombie as running.
            if !matches!(c.try_wait(), Ok(None)) {
                *child = None;
            }
        }
        child.as_ref().map(Child::id)
    }

    /// Whether the process exists (a paused node is running).
    pub fn is_running(&self) -> bool {
        self.pid().is_some()
    }

    /// SIGKILLs the process and reaps it. Idempotent.
    pub fn kill(&mut self) -> Result<()> {
        self.paused = false;
        let Some(mut child) = self.child_mut().take() else {
            return Ok(());
        };
        // SIGKILL also ends a stopped (paused) process, no SIGCONT needed.
        match signal::kill(pid_of(&child), Signal::SIGKILL) {
            Ok(()) | Err(Errno::ESRCH) => {}
            Err(source) => {
                *self.child_mut() = Some(child);
                return Err(Error::Signal { signal: Signal::SIGKILL, source });
            }
        }
        child.wait().map_err(|e| Error::spawn("could not reap the killed redis-server", e))?;
        Ok(())
    }

    /// Kills the node if running, starts it again on the same port and data
    /// dir, and waits until it answers PING (its AOF loaded, if any).
    pub fn restart(&mut self) -> Result<()> {
        self.kill()?;
        self.start_again()
    }

    /// Kills the node if running, deletes its data (AOF, RDB; the log is
    /// kept), and starts it again on the same port: it comes back empty
    /// whatever its [`Persistence`], as a node that lost its disk.
    pub fn restart_empty(&mut self) -> Result<()> {
        self.kill()?;
        self.wipe_data()?;
        self.start_again()
    }

    /// Deletes every file of the data dir but the log; only while killed,
    /// as a running node would keep writing its AOF.
    fn wipe_data(&self) -> Result<()> {
        let wipe = |e| Error::spawn("could not wipe the redis-server data dir", e);
        for entry in fs::read_dir(self.dir.path()).map_err(wipe)? {
            let entry = entry.map_err(wipe)?;
            if entry.file_name() == LOG_FILE {
                continue;
            }
            let path = entry.path();
            // Redis 7 keeps its AOF in a directory (`appendonlydir`).
            if entry.file_type().map_err(wipe)?.is_dir() {
                fs::remove_dir_all(&path).map_err(wipe)?;
            } else {
                fs::remove_file(&path).map_err(wipe)?;
            }
        }
        Ok(())
    }

    /// After [`kill`](Self::kill): starts again on the same port and data dir
    /// and waits until ready. Does nothing if the node is running.
    pub fn start_again(&mut self) -> Result<()> {
        if self.is_running() {
            return Ok(());
        }
        let child = launch(&self.binary, self.dir.path(), self.port, &self.config)
            .map_err(Launch::into_error)?;
        *self.child_mut() = Some(child);
        self.paused = false;
        Ok(())
    }

    /// SIGSTOPs the process: it stays, holds its port, and stops answering (a hung node).
    pub fn pause(&mut self) -> Result<()> {
        self.signal(Signal::SIGSTOP)?;
        self.paused = true;
        Ok(())
    }

    /// SIGCONTs a paused process.
    pub fn resume(&mut self) -> Result<()> {
        self.signal(Signal::SIGCONT)?;
        self.paused = false;
        Ok(())
    }

    /// Whether the node is paused (and still running).
    pub fn is_paused(&self) -> bool {
        self.paused && self.is_running()
    }

    /// The node's log file, all runs (redis appends to it on restart).
    pub fn log(&self) -> String {
        read_log(self.dir.path())
    }

    /// A sync connection with a 2 s connect and read/write timeout, for tests to inspect keys.
    pub fn connection(&self) -> Result<redis::Connection> {
        let client = redis::Client::open(self.url())?;
        let con = client.get_connection_with_timeout(CONNECTION_TIMEOUT)?;
        con.set_read_timeout(Some(CONNECTION_TIMEOUT))?;
        con.set_write_timeout(Some(CONNECTION_TIMEOUT))?;
        Ok(con)
    }

    /// `GET key`.
    pub fn get(&self, key: &str) -> Result<Option<String>> {
        Ok(redis::cmd("GET").arg(key).query(&mut self.connection()?)?)
    }

    /// Plain `SET key value`, no expiry.
    pub fn set(&self, key: &str, value: &str) -> Result<()> {
        redis::cmd("SET").arg(key).arg(value).query::<()>(&mut self.connection()?)?;
        Ok(())
    }

    /// `PTTL key`: milliseconds left, -1 without expiry, -2 if missing.
    pub fn pttl(&self, key: &str) -> Result<i64> {
        Ok(redis::cmd("PTTL").arg(key).query(&mut self.connection()?)?)
    }

    /// `EXISTS key`.
    pub(crate) fn exists(&self, key: &str) -> Result<bool> {
        Ok(redis::cmd("EXISTS").arg(key).query(&mut self.connection()?)?)
    }

    /// `FLUSHALL`.
    pub fn flushall(&self) -> Result<()> {
        redis::cmd("FLUSHALL").query::<()>(&mut self.connection()?)?;
        Ok(())
    }

    fn signal(&mut self, signal: Signal) -> Result<()> {
        let pid = self.pid().ok_or(Error::Signal { signal, source: Errno::ESRCH })?;
        signal::kill(Pid::from_raw(pid as i32), signal)
            .map_err(|source| Error::Signal { signal, source })
    }

    fn child(&self) -> MutexGuard<'_, Option<Child>> {
        // A poisoned lock only means a panic elsewhere; the Option is still valid.
        self.child.lock().unwrap_or_else(PoisonError::into_inner)
    }

    fn child_mut(&mut self) -> &mut Option<Child> {
        self.child.get_mut().unwrap_or_else(PoisonError::into_inner)
    }
}

impl Drop for RedisNode {
    fn drop(&mut self) {
        if let Some(mut child) = self.child_mut().take() {
            // Errors are ignored: drop must never panic, and there is nothing better to do.
            let _ = signal::kill(pid_of(&child), Signal::SIGCONT);
            let _ = child.kill();
            let _ = child.wait();
        }
    }
}

/// Why a launch failed: a taken port is worth retrying on another one.
enum Launch {
    PortTaken(Error),
    Failed(Error),
}

impl Launch {
    fn into_error(self) -> Error {
        match self {
            Launch::PortTaken(e) | Launch::Failed(e) => e,
        }
    }
}

/// Spawns redis-server and waits until it answers PING; kills it if it doesn't.
fn launch(binary: &Path, dir: &Path, port: u16, config: &NodeConfig) -> Result<Child, Launch> {
    let log_offset = read_log(dir).len();
    let mut command = Command::new(binary);
    command
        .arg("--bind")
        .arg("127.0.0.1")
        .arg("--port")
        .arg(port.to_string())
        .arg("--daemonize")
        .arg("no")
        .arg("--protected-mode")
        .arg("no")
        .arg("--dir")
        .arg(dir)
        .arg("--logfile")
        .arg(dir.join(LOG_FILE));
    match config.persistence {
        Persistence::None => command.args(["--save", "", "--appendonly", "no"]),
        Persistence::AppendFsyncAlways => {
            command.args(["--appendonly", "yes", "--appendfsync", "always"])
        }
    };
    // Config errors are printed to stderr before redis opens its log file, so
    // stdout/stderr go to the same log (append mode, as redis opens it): one
    // place with everything, and test output stays clean.
    let log = fs::OpenOptions::new()
        .create(true)
        .append(true)
        .open(dir.join(LOG_FILE))
        .map_err(|e| Launch::Failed(Error::spawn("could not open the redis-server log", e)))?;
    let log_err = log
        .try_clone()
        .map_err(|e| Launch::Failed(Error::spawn("could not open the redis-server log", e)))?;
    command.args(&config.extra_args).stdin(Stdio::null()).stdout(log).stderr(log_err);
    let mut child = command.spawn().map_err(|e| {
        Launch::Failed(Error::spawn(format!("could not spawn {}", binary.display()), e))
    })?;

    let started = Instant::now();
    loop {
        if let Ok(Some(_)) = child.try_wait() {
            break; // Exited while starting (bad args, port taken...): the log says why.
        }
        if ready::probe(port, child.id()) == Probe::Ready {
            return Ok(child);
        }
        if started.elapsed() >= READY_TIMEOUT {
            break;
        }
        thread::sleep(POLL_INTERVAL);
    }
    let _ = child.kill();
    let _ = child.wait();
    let log = read_log(dir);
    let port_taken =
        log.get(log_offset..).is_some_and(|new| new.contains("Address already in use"));
    let error = Error::NotReady { port, waited: started.elapsed(), log };
    Err(if port_taken { Launch::PortTaken(error) } else { Launch::Failed(error) })
}

fn read_log(dir: &Path) -> String {
    fs::read(dir.join(LOG_FILE))
        .map(|bytes| String::from_utf8_lossy(&bytes).into_owned())
        .unwrap_or_default()
}

fn pid_of(child: &Child) -> Pid {
    Pid::from_raw(child.id() as i32)
}
