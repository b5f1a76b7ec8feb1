//! Runs one scenario: contending clients, the fault schedule, the checks.

use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use rand::Rng;
use redis::AsyncCommands;
use redis::aio::MultiplexedConnection;
use redlock::fence::{FencedWrite, fenced_set};
use redlock::{Lock, Redlock};
use redlock_testkit::{FaultyCluster, Grant, History, NodeConfig, Persistence, RedisNode};

use crate::report::Report;
use crate::scenario::Scenario;

const NODES: usize = 5;
const CLIENTS: usize = 4;
const RESOURCE: &str = "chaos:job";
const COUNTER: &str = "chaos:counter";

/// What the clients count, shared.
#[derive(Default)]
struct Tally {
    refused: AtomicU64,
    sections: AtomicU64,
    stale_writes: AtomicU64,
    rejected_writes: AtomicU64,
    granted_while_faulted: AtomicU64,
}

/// When the fault was in force: from the moment its injection completed to the moment
/// its healing began.
#[derive(Clone, Default)]
struct Window(Arc<Mutex<(Option<Instant>, Option<Instant>)>>);

impl Window {
    fn open(&self) {
        lock(&self.0).0 = Some(Instant::now());
    }

    fn close(&self) {
        lock(&self.0).1 = Some(Instant::now());
    }

    /// Whether an attempt that started at `started` and was granted at `granted` ran
    /// entirely while the fault was in force.
    fn covers(&self, started: Instant, granted: Instant) -> bool {
        let (from, to) = *lock(&self.0);
        from.is_some_and(|from| started >= from) && to.is_none_or(|to| granted < to)
    }
}

fn lock<T>(mutex: &Mutex<T>) -> std::sync::MutexGuard<'_, T> {
    mutex.lock().unwrap_or_else(std::sync::PoisonError::into_inner)
}

/// Runs `scenario` for `duration` and reports what happened.
///
/// # Panics
/// When the test nodes cannot be started or driven (a broken test set-up, not a finding).
pub async fn run(scenario: &Scenario, duration: Duration) -> Report {
    let persistence =
        if scenario.persistent { Persistence::AppendFsyncAlways } else { Persistence::None };
    let mut cluster = FaultyCluster::start_with(NODES, NodeConfig::new().persistence(persistence))
        .unwrap_or_else(|err| panic!("cannot start the nodes: {err}"));
    let store =
        RedisNode::start().unwrap_or_else(|err| panic!("cannot start the counter node: {err}"));
    if !scenario.quarantine.is_zero() {
        // A brand-new cluster is in quarantine too: start once it is over.
        tokio::time::sleep(scenario.quarantine + Duration::from_millis(1100)).await;
    }

    let history = History::new();
    let tally = Arc::new(Tally::default());
    let started = Instant::now();
    let deadline = started + duration;
    let window = Window::default();
    if scenario.whole_run
        && let Some(fault) = scenario.fault
    {
        cluster.inject(fault, scenario.nodes).unwrap_or_else(|err| panic!("inject: {err}"));
        window.open();
    }

    let clients: Vec<_> = (0..CLIENTS)
        .map(|id| {
            let client = Client {
                id,
                rl: redlock(scenario, cluster.urls()),
                scenario: scenario.clone(),
                history: history.clone(),
                tally: tally.clone(),
                store_url: store.url(),
                window: window.clone(),
                deadline,
            };
            tokio::spawn(client.run())
        })
        .collect();

    if !scenario.whole_run
        && let Some(fault) = scenario.fault
    {
        tokio::time::sleep_until((started + duration / 4).into()).await;
        cluster.inject(fault, scenario.nodes).unwrap_or_else(|err| panic!("inject: {err}"));
        window.open();
        tokio::time::sleep_until((started + duration * 3 / 4).into()).await;
        window.close();
        cluster.heal(scenario.nodes).unwrap_or_else(|err| panic!("heal: {err}"));
    }
    for client in clients {
        client.await.unwrap_or_else(|err| panic!("a client failed: {err}"));
    }
    cluster.heal_all().unwrap_or_else(|err| panic!("heal: {err}"));

    // Let releases queued behind faults drain, then look for leftovers.
    tokio::time::sleep(Duration::from_millis(300)).await;
    let keys_left = cluster.cluster().count_key(RESOURCE);
    let counter = store.get(COUNTER).ok().flatten().and_then(|v| v.parse().ok()).unwrap_or(0);
    let sections = tally.sections.load(Ordering::Relaxed);
    Report {
        scenario: scenario.clone(),
        grants: history.len(),
        granted_while_faulted: tally.granted_while_faulted.load(Ordering::Relaxed),
        refused: tally.refused.load(Ordering::Relaxed),
        violations: history.violations(),
        lost_updates: sections.saturating_sub(counter),
        stale_writes: tally.stale_writes.load(Ordering::Relaxed),
        rejected_writes: tally.rejected_writes.load(Ordering::Relaxed),
        keys_left,
    }
}

fn redlock(scenario: &Scenario, urls: Vec<String>) -> Redlock {
    Redlock::builder()
        .nodes(urls)
        .ttl(scenario.ttl)
        .node_timeout(scenario.node_timeout)
        .connect_timeout(Duration::from_millis(500))
        .restart_quarantine(scenario.quarantine)
        .build()
        .unwrap_or_else(|err| panic!("configuration: {err}"))
}

struct Client {
    id: usize,
    rl: Redlock,
    scenario: Scenario,
    history: History,
    tally: Arc<Tally>,
    store_url: String,
    window: Window,
    deadline: Instant,
}

impl Client {
    async fn run(self) {
        let mut store = redis::Client::open(self.store_url.as_str())
            .unwrap_or_else(|err| panic!("counter node URL: {err}"))
            .get_multiplexed_async_connection()
            .await
            .unwrap_or_else(|err| panic!("counter node: {err}"));
        let mut stall_pending = self.scenario.stall && self.id == 0;
        while Instant::now() < self.deadline {
            let attempt_started = Instant::now();
            let attempt = if self.scenario.fenced {
                self.rl.try_lock(RESOURCE).fenced().await
            } else {
                self.rl.try_lock(RESOURCE).await
            };
            let lock = match attempt {
                Ok(lock) => lock,
                Err(_) => {
                    self.tally.refused.fetch_add(1, Ordering::Relaxed);
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
            let hold = if std::mem::take(&mut stall_pending) {
                self.scenario.ttl * 2
            } else {
                self.scenario.section
            };
            self.critical_section(&mut store, &lock, hold).await;
            self.history.released(id, Instant::now());
            // The lock may have expired (a stall): the release then reports it; either way
            // the keys are gone or going.
            let _ = lock.release().await;
            // Step back a moment, so that the others get their turn.
            tokio::time::sleep(Duration::from_millis(1)).await;
        }
    }

    /// A non-atomic read-modify-write of the counter: correct only under exclusion.
    async fn critical_section(
        &self,
        store: &mut MultiplexedConnection,
        lock: &Lock,
        hold: Duration,
    ) {
        let Ok(value) = store.get::<_, Option<u64>>(COUNTER).await else { return };
        let next = value.unwrap_or(0) + 1;
        tokio::time::sleep(hold).await;
        if !lock.is_valid() {
            // Writing after the lease: outside the model; the history check cannot see it.
            self.tally.stale_writes.fetch_add(1, Ordering::Relaxed);
        }
        match lock.fencing_token() {
            Some(token) => {
                match fenced_set(store, COUNTER, next.to_string().as_bytes(), token).await {
                    Ok(FencedWrite::Written) => {
                        self.tally.sections.fetch_add(1, Ordering::Relaxed);
                    }
                    Ok(FencedWrite::Rejected) => {
                        self.tally.rejected_writes.fetch_add(1, Ordering::Relaxed);
                    }
                    Err(_) => {}
                }
            }
            None => {
                if store.set::<_, _, ()>(COUNTER, next).await.is_ok() {
                    self.tally.sections.fetch_add(1, Ordering::Relaxed);
                }
            }
        }
    }
}
