//! Runs one scenario: clients contending for one resource over the containers, the fault
//! injected a quarter into the run and healed at three quarters, then the checks.

use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::{Arc, Mutex, MutexGuard, PoisonError};
use std::time::{Duration, Instant};

use rand::Rng;
use redis::AsyncCommands;
use redis::aio::MultiplexedConnection;
use redlock::{ErrorKind, Redlock, Retry};
use redlock_testkit::{Grant, History};
use tokio::task::JoinSet;
use tokio::time::sleep_until;

use crate::docker::Container;
use crate::fault::Fault;
use crate::node;
use crate::report::Report;
use crate::scenario::Scenario;

const CLIENTS: usize = 4;
const RESOURCE: &str = "compose:job";
const COUNTER: &str = "compose:counter";
/// Written to a master before it is killed, read back after it restarts.
const MARKER: &str = "compose:before-crash";
/// The lease: short, so that a lock held on a crashed master expires within the run.
const TTL: Duration = Duration::from_secs(1);
/// Per master and request; the containers answer through docker's port proxy.
const NODE_TIMEOUT: Duration = Duration::from_millis(100);
const CONNECT_TIMEOUT: Duration = Duration::from_millis(500);
/// How long a critical section lasts between its read and its write of the counter.
const SECTION: Duration = Duration::from_millis(5);
/// How long a master may take to serve again after a heal (a restart reads its AOF back).
const READY_TIMEOUT: Duration = Duration::from_secs(30);

/// What the clients count, shared.
#[derive(Default)]
struct Tally {
    refused: AtomicU64,
    unavailable: AtomicU64,
    sections: AtomicU64,
    granted_while_faulted: AtomicU64,
}

/// When the fault was in force: from the moment its injection completed on every master
/// it hits to the moment its healing began.
#[derive(Clone, Default)]
struct Window(Arc<Mutex<(Option<Instant>, Option<Instant>)>>);

impl Window {
    fn open(&self) {
        self.lock().0 = Some(Instant::now());
    }

    fn close(&self) {
        self.lock().1 = Some(Instant::now());
    }

    /// Whether an attempt that started at `started` and was granted at `granted` ran
    /// entirely while the fault was in force.
    fn covers(&self, started: Instant, granted: Instant) -> bool {
        let (from, to) = *self.lock();
        from.is_some_and(|from| started >= from) && to.is_none_or(|to| granted < to)
    }

    fn lock(&self) -> MutexGuard<'_, (Option<Instant>, Option<Instant>)> {
        self.0.lock().unwrap_or_else(PoisonError::into_inner)
    }
}

/// Runs `scenario` for `duration` against `masters`, with the counter on `store_url`.
pub async fn run(
    scenario: &Scenario,
    masters: &[Container],
    store_url: &str,
    duration: Duration,
) -> Result<Report, String> {
    let victims = scenario
        .nodes
        .iter()
        .map(|&i| masters.get(i).ok_or_else(|| format!("{}: no master {i}", scenario.name)))
        .collect::<Result<Vec<_>, _>>()?;
    // A clean start: every master serves and holds no lock, the counter is at zero.
    for master in masters {
        node::wait_ready(&master.url, READY_TIMEOUT).await?;
        node::query::<()>(&master.url, redis::cmd("DEL").arg(RESOURCE)).await?;
    }
    node::query::<()>(store_url, redis::cmd("DEL").arg(COUNTER)).await?;

    let history = History::new();
    let tally = Arc::new(Tally::default());
    let window = Window::default();
    let started = Instant::now();
    let deadline = started + duration;
    let urls: Vec<String> = masters.iter().map(|m| m.url.clone()).collect();
    // Dropping the set (on an early return) aborts the clients.
    let mut clients = JoinSet::new();
    for id in 0..CLIENTS {
        let client = Client {
            id,
            rl: redlock(&urls)?,
            store: node::connect(store_url).await?,
            history: history.clone(),
            tally: tally.clone(),
            window: window.clone(),
            deadline,
        };
        clients.spawn(client.run());
    }

    let (data_kept, recovery) = match scenario.fault {
        Some(fault) => {
            sleep_until((started + duration / 4).into()).await;
            let marker = if fault == Fault::Crash { Some(mark(&victims).await?) } else { None };
            for victim in &victims {
                fault.inject(victim).await?;
            }
            window.open();
            sleep_until((started + duration * 3 / 4).into()).await;
            window.close();
            let healing = Instant::now();
            for victim in &victims {
                fault.heal(victim).await?;
            }
            for victim in &victims {
                node::wait_ready(&victim.url, READY_TIMEOUT).await?;
            }
            let recovery = healing.elapsed();
            let data_kept = match marker {
                Some(value) => Some(marked(&victims, &value).await?),
                None => None,
            };
            (data_kept, Some(recovery))
        }
        None => (None, None),
    };
    while let Some(done) = clients.join_next().await {
        done.map_err(|err| format!("a client failed: {err}"))?;
    }

    // Let releases still in flight land, then look for leftovers.
    tokio::time::sleep(Duration::from_millis(300)).await;
    let mut keys_left = 0;
    for master in masters {
        keys_left += node::query::<usize>(&master.url, redis::cmd("EXISTS").arg(RESOURCE)).await?;
    }
    let counter: Option<u64> = node::query(store_url, redis::cmd("GET").arg(COUNTER)).await?;
    let sections = tally.sections.load(Ordering::Relaxed);
    Ok(Report {
        scenario: scenario.clone(),
        grants: history.len(),
        granted_while_faulted: tally.granted_while_faulted.load(Ordering::Relaxed),
        refused: tally.refused.load(Ordering::Relaxed),
        unavailable: tally.unavailable.load(Ordering::Relaxed),
        violations: history.violations(),
        lost_updates: sections.saturating_sub(counter.unwrap_or(0)),
        keys_left,
        data_kept,
        recovery,
    })
}

/// Writes a fresh marker to every master about to crash; returns its value.
async fn mark(victims: &[&Container]) -> Result<String, String> {
    let value = format!("{:016x}", rand::rng().random::<u64>());
    for victim in victims {
        node::query::<()>(&victim.url, redis::cmd("SET").arg(MARKER).arg(&value)).await?;
    }
    Ok(value)
}

/// Whether every restarted master still has the marker; removes it.
async fn marked(victims: &[&Container], value: &str) -> Result<bool, String> {
    let mut kept = true;
    for victim in victims {
        let found: Option<String> = node::query(&victim.url, redis::cmd("GET").arg(MARKER)).await?;
        kept &= found.as_deref() == Some(value);
        node::query::<()>(&victim.url, redis::cmd("DEL").arg(MARKER)).await?;
    }
    Ok(kept)
}

fn redlock(urls: &[String]) -> Result<Redlock, String> {
    Redlock::builder()
        .nodes(urls.iter().cloned())
        .ttl(TTL)
        .node_timeout(NODE_TIMEOUT)
        .connect_timeout(CONNECT_TIMEOUT)
        .retry(Retry::never())
        .build()
        .map_err(|err| format!("configuration: {err}"))
}

/// One contending client: try_lock, a critical section, release, again, until the deadline.
struct Client {
    id: usize,
    rl: Redlock,
    store: MultiplexedConnection,
    history: History,
    tally: Arc<Tally>,
    window: Window,
    deadline: Instant,
}

impl Client {
    async fn run(mut self) {
        while Instant::now() < self.deadline {
            let attempt_started = Instant::now();
            let lock = match self.rl.try_lock(RESOURCE).await {
                Ok(lock) => lock,
                Err(err) => {
                    self.tally.refused.fetch_add(1, Ordering::Relaxed);
                    if err.kind() == ErrorKind::Unavailable {
                        self.tally.unavailable.fetch_add(1, Ordering::Relaxed);
                    }
                    let pause = rand::rng().random_range(2..10);
                    tokio::time::sleep(Duration::from_millis(pause)).await;
                    continue;
                }
            };
            let granted_at = Instant::now();
            if self.window.covers(attempt_started, granted_at) {
                self.tally.granted_while_faulted.fetch_add(1, Ordering::Relaxed);
            }
            let grant = Grant::new(self.id, lock.token(), granted_at, granted_at + lock.validity());
            let id = self.history.record(grant);
            self.critical_section().await;
            // Before the release: others may take the lock as soon as it reaches the masters.
            self.history.released(id, Instant::now());
            // A release that fails (a master down) leaves keys that expire with the lease.
            let _ = lock.release().await;
            // Step back a moment, so that the others get their turn.
            tokio::time::sleep(Duration::from_millis(1)).await;
        }
    }

    /// A non-atomic read-modify-write of the counter: correct only under exclusion.
    async fn critical_section(&mut self) {
        let Ok(value) = self.store.get::<_, Option<u64>>(COUNTER).await else { return };
        tokio::time::sleep(SECTION).await;
        if self.store.set::<_, _, ()>(COUNTER, value.unwrap_or(0) + 1).await.is_ok() {
            self.tally.sections.fetch_add(1, Ordering::Relaxed);
        }
    }
}
