//! One `redis-server` child process: start, kill, restart, pause.
//!
//! What tests send to a node (inspection, raw commands, ACL users) is in `commands`.

use std::{
    fs,
    path::PathBuf,
    sync::Arc,
    time::{Duration, Instant},
};

use tempfile::TempDir;

use crate::{
    access::{self, Credentials},
    binary,
    config::NodeConfig,
    error::{Error, Result},
    launch::{self, LOG_FILE, Launch},
    port,
    process::Process,
    wakeup::Wakeup,
};

/// Attempts with a fresh free port when another process took ours meanwhile.
const PORT_ATTEMPTS: usize = 5;

/// A running (or killed, or paused) `redis-server` on `127.0.0.1`.
///
/// Dropping it kills the process and removes its data directory.
#[derive(Debug)]
pub struct RedisNode {
    pub(crate) config: NodeConfig,
    binary: PathBuf,
    port: u16,
    dir: TempDir,
    /// Shared with the threads of [`pause_for`](Self::pause_for).
    process: Arc<Process>,
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
            match launch::launch(&binary, dir.path(), port, &config) {
                Ok(child) => {
                    let process = Process::new(child);
                    return Ok(RedisNode { config, binary, port, dir, process });
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

    /// The URL clients use: `redis://127.0.0.1:PORT`, `rediss://` for a
    /// [TLS node](NodeConfig::tls) (see [`tls`](crate::tls) for what a client needs),
    /// with `:PASSWORD@` (percent-encoded) for a node with a
    /// [password](NodeConfig::requirepass).
    pub fn url(&self) -> String {
        self.url_via(self.port)
    }

    /// [`url`](Self::url) with `port` instead of the node's: a proxy's in front of it.
    pub(crate) fn url_via(&self, port: u16) -> String {
        access::url(&self.config, port, Credentials::Default)
    }

    /// [`url_as`](Self::url_as) with another port (a proxy's).
    pub(crate) fn url_as_via(&self, name: &str, password: &str, port: u16) -> String {
        access::url(&self.config, port, Credentials::User { name, password })
    }

    /// The URL for the ACL user `name` (see [`acl_setuser`](Self::acl_setuser)), with the
    /// node's scheme: `redis://NAME:PASSWORD@127.0.0.1:PORT` (both percent-encoded).
    pub fn url_as(&self, name: &str, password: &str) -> String {
        access::url(&self.config, self.port, Credentials::User { name, password })
    }

    /// The process id, or `None` while killed (or after it exited on its own).
    pub fn pid(&self) -> Option<u32> {
        self.process.pid()
    }

    /// Whether the process exists (a paused node is running).
    pub fn is_running(&self) -> bool {
        self.pid().is_some()
    }

    /// SIGKILLs the process and reaps it. Idempotent.
    pub fn kill(&mut self) -> Result<()> {
        self.process.kill()
    }

    /// Kills the node if running, starts it again on the same port and data
    /// dir, and waits until it answers PING (its AOF loaded, if any).
    pub fn restart(&mut self) -> Result<()> {
        self.kill()?;
        self.start_again()
    }

    /// Kills the node if running, deletes its data (AOF, RDB; the log is
    /// kept), and starts it again on the same port: it comes back empty
    /// whatever its [`Persistence`](crate::Persistence), as a node that lost its disk.
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
        let child = launch::launch(&self.binary, self.dir.path(), self.port, &self.config)
            .map_err(Launch::into_error)?;
        self.process.started(child);
        Ok(())
    }

    /// SIGSTOPs the process: it stays, holds its port, and stops answering (a hung node).
    pub fn pause(&mut self) -> Result<()> {
        self.process.pause().map(drop)
    }

    /// Pauses the node now (SIGSTOP) and resumes it (SIGCONT) after `duration`
    /// from a plain thread, whatever the test does meanwhile: a node that is slow
    /// rather than dead, also while the test's runtime is blocked.
    ///
    /// [`is_paused`](Self::is_paused) turns false when the thread resumes it. A
    /// [`start_again`](Self::start_again), [`kill`](Self::kill), [`pause`](Self::pause)
    /// or [`resume`](Self::resume) before then takes over, and the wake-up does nothing.
    ///
    /// # Errors
    /// When the node is not running (then nothing is paused), or no thread can be spawned
    /// (then the node is resumed at once).
    pub fn pause_for(&mut self, duration: Duration) -> Result<Wakeup> {
        self.pause_until(Instant::now() + duration)
    }

    /// [`pause_for`](Self::pause_for) with a deadline, so nodes paused together wake together.
    pub(crate) fn pause_until(&mut self, until: Instant) -> Result<Wakeup> {
        Ok(Wakeup::new(vec![self.process.pause_until(until)?]))
    }

    /// SIGCONTs a paused process.
    pub fn resume(&mut self) -> Result<()> {
        self.process.resume()
    }

    /// Whether the node is paused (and still running).
    pub fn is_paused(&self) -> bool {
        self.process.is_paused()
    }

    /// The node's log file, all runs (redis appends to it on restart).
    pub fn log(&self) -> String {
        launch::read_log(self.dir.path())
    }
}

impl Drop for RedisNode {
    fn drop(&mut self) {
        self.process.shut_down();
    }
}
