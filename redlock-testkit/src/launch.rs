//! Spawning `redis-server` with a node's command line, and waiting until it answers.

use std::{
    fs,
    path::Path,
    process::{Child, Command, Stdio},
    thread,
    time::{Duration, Instant},
};

use crate::{
    access::{self, Credentials},
    config::{NodeConfig, Persistence},
    error::{Error, Result},
    ready::{self, Probe},
    tls::Certificates,
};

/// How long a node may take to answer PING after being spawned.
const READY_TIMEOUT: Duration = Duration::from_secs(5);
/// Delay between readiness probes: short, so tests don't wait for nothing.
const POLL_INTERVAL: Duration = Duration::from_millis(5);
/// The log file's name in the node's data dir.
pub(crate) const LOG_FILE: &str = "redis.log";

/// Why a launch failed: a taken port is worth retrying on another one.
pub(crate) enum Launch {
    PortTaken(Error),
    Failed(Error),
}

impl Launch {
    pub(crate) fn into_error(self) -> Error {
        match self {
            Launch::PortTaken(e) | Launch::Failed(e) => e,
        }
    }
}

/// Spawns redis-server and waits until it answers PING; kills it if it doesn't.
pub(crate) fn launch(
    binary: &Path,
    dir: &Path,
    port: u16,
    config: &NodeConfig,
) -> Result<Child, Launch> {
    let log_offset = read_log(dir).len();
    // The client the probe uses: as the testkit's own connections (TLS, password).
    let client = access::client(config, &access::url(config, port, Credentials::Default))
        .map_err(Launch::Failed)?;
    let mut command = Command::new(binary);
    command.arg("--bind").arg("127.0.0.1");
    match config.tls {
        None => command.arg("--port").arg(port.to_string()),
        Some(client_certs) => {
            let certificates = Certificates::get().map_err(Launch::Failed)?;
            command
                .args(["--port", "0", "--tls-port", &port.to_string()])
                .arg("--tls-cert-file")
                .arg(certificates.server_cert().path())
                .arg("--tls-key-file")
                .arg(certificates.server_key().path())
                .arg("--tls-ca-cert-file")
                .arg(certificates.ca().path())
                .args(["--tls-auth-clients", client_certs.redis_arg()])
        }
    };
    if let Some(password) = &config.requirepass {
        command.arg("--requirepass").arg(password);
    }
    command
        .arg("--daemonize")
        .arg("no")
        .arg("--protected-mode")
        .arg("no")
        // Redis 7's default, set for every server: on Redis 6.2 (default `allchannels`) a
        // new ACL user could publish and subscribe anywhere, and a test of a missing
        // channel rule could not fail.
        .arg("--acl-pubsub-default")
        .arg("resetchannels")
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
        if ready::probe(&client, child.id()) == Probe::Ready {
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

/// The node's log file, all runs (redis appends to it on restart).
pub(crate) fn read_log(dir: &Path) -> String {
    fs::read(dir.join(LOG_FILE))
        .map(|bytes| String::from_utf8_lossy(&bytes).into_owned())
        .unwrap_or_default()
}
