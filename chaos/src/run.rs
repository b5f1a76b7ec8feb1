//! Runs one scenario: contending clients, the fault schedule, the checks.

use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use rand::Rng;
use redis::AsyncCommands;
use redis::aio::MultiplexedConnection;
use redlock::fence::{FencedWrite, fenced_set};
use redlock::{Guard, Lock, MultiLock, Permit, ReadLock, Redlock, ReentrantLock, Retry, WriteLock};

use crate::Fence;
use redlock_testkit::{FaultyCluster, Grant, History, NodeConfig, Persistence, RedisNode};

use crate::report::Report;
use crate::scenario::{Kind, PERMITS, Scenario};

const NODES: usize = 5;
const RESOURCE: &str = "chaos:job";
const COUNTER: &str = "chaos:counter";
/// The second resource of the multi-resource kind.
const SECOND: &str = "chaos:job2";

/// A hold of any kind.
enum Held {
    Plain(Lock),
    Reentrant(ReentrantLock),
    Multi(MultiLock),
    Read(ReadLock),
    Write(WriteLock),
    Permit(Permit),
}

/// The counter of a counting lock's slot: each slot is exclusive, so its holders' updates
/// add up exactly as a plain lock's do.
fn slot_counter(slot: u32) -> String {
    format!("{COUNTER}:{slot}")
}

/// The key of a counting lock's slot (no key prefix), as `redlock::guide::semaphore` lays it
/// out. The count key next to them, `{R}:permits`, is left to its lease after the last
/// release, so it is not a leftover.
fn slot_key(slot: u32) -> String {
    format!("{{{RESOURCE}}}:permit:{slot}")
}

/// What the clients count, shared.
#[derive(Default)]
struct Tally {
    refused: AtomicU64,
    sections: AtomicU64,
    stale_writes: AtomicU64,
    rejected_writes: AtomicU64,
    granted_while_faulted: AtomicU64,
    /// One bit per client that was granted a lock at least once.
    clients_in: AtomicU64,
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
    // The counting lock's slots, each an exclusive lock of its own.
    let slots: Vec<History> = (0..PERMITS).map(|_| History::new()).collect();
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

    let clients: Vec<_> = (0..scenario.kind.clients())
        .map(|id| {
            let client = Client {
                id,
                rl: redlock(scenario, cluster.urls()),
                scenario: scenario.clone(),
                history: history.clone(),
                slots: slots.clone(),
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
    let keys_left = cluster.cluster().count_key(RESOURCE)
        + cluster.cluster().count_key(SECOND)
        + (0..PERMITS).map(|slot| cluster.cluster().count_key(&slot_key(slot))).sum::<usize>();
    let read = |key: &str| -> u64 {
        store.get(key).ok().flatten().and_then(|v| v.parse().ok()).unwrap_or(0)
    };
    let counter = read(COUNTER) + (0..PERMITS).map(|slot| read(&slot_counter(slot))).sum::<u64>();
    let sections = tally.sections.load(Ordering::Relaxed);
    let mut violations = history.violations();
    violations.extend(slots.iter().flat_map(History::violations));
    let over_limit = match scenario.kind {
        Kind::Semaphore => history.over_limit(PERMITS as usize),
        _ => Vec::new(),
    };
    Report {
        scenario: scenario.clone(),
        grants: history.len(),
        clients: scenario.kind.clients(),
        clients_granted: tally.clients_in.load(Ordering::Relaxed).count_ones() as usize,
        shared_overlaps: history.shared_overlaps(),
        fencing_violations: history.fencing_violations().len(),
        granted_while_faulted: tally.granted_while_faulted.load(Ordering::Relaxed),
        refused: tally.refused.load(Ordering::Relaxed),
        violations,
        over_limit,
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
    slots: Vec<History>,
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
        let owner = format!("client-{}", self.id);
        let pair: [&str; 2] =
            if self.id.is_multiple_of(2) { [RESOURCE, SECOND] } else { [SECOND, RESOURCE] };
        // Read-write: the first two clients read, the others write.
        let reader = self.scenario.kind == Kind::ReadWrite && self.id < 2;
        while Instant::now() < self.deadline {
            let attempt_started = Instant::now();
            // The stall applies to the first hold actually granted.
            let hold = if stall_pending { self.scenario.ttl * 2 } else { self.scenario.section };
            let held = match self.scenario.kind {
                Kind::Plain => self.rl.try_lock(RESOURCE).await.map(Held::Plain),
                Kind::Fenced => self.rl.try_lock(RESOURCE).fenced().await.map(Held::Plain),
                Kind::Reentrant => {
                    self.rl.reentrant(RESOURCE, &owner).once().await.map(Held::Reentrant)
                }
                Kind::Multi => self.rl.many(&pair).once().await.map(Held::Multi),
                Kind::ReadWrite if reader => self.rl.read(RESOURCE).once().await.map(Held::Read),
                Kind::ReadWrite => self.rl.write(RESOURCE).once().await.map(Held::Write),
                // Eight clients for two permits: each waits (woken by any slot's release)
                // rather than tries once.
                Kind::Semaphore => self
                    .rl
                    .semaphore(RESOURCE, PERMITS)
                    .retry(
                        Retry::new()
                            .with_unbounded_attempts()
                            .with_delay(Duration::from_millis(2))
                            .with_jitter(Duration::from_millis(8))
                            .with_max_wait(Duration::from_millis(300)),
                    )
                    .await
                    .map(Held::Permit),
            };
            let outcome = match held {
                Ok(Held::Plain(lock)) => self.hold(lock, attempt_started, hold, &mut store).await,
                Ok(Held::Reentrant(lock)) => {
                    // Re-enter once: the inner hold must come and go without touching the
                    // outer one's count.
                    let inner = self.rl.reentrant(RESOURCE, &owner).once().await;
                    if let Ok(inner) = inner {
                        let _ = inner.release().await;
                    }
                    self.hold(lock, attempt_started, hold, &mut store).await
                }
                Ok(Held::Multi(lock)) => self.hold(lock, attempt_started, hold, &mut store).await,
                Ok(Held::Read(lock)) => self.share(lock, attempt_started, hold).await,
                Ok(Held::Write(lock)) => self.hold(lock, attempt_started, hold, &mut store).await,
                Ok(Held::Permit(permit)) => {
                    self.permit(permit, attempt_started, hold, &mut store).await
                }
                Err(_) => Err(()),
            };
            if outcome.is_ok() {
                stall_pending = false;
            } else {
                self.tally.refused.fetch_add(1, Ordering::Relaxed);
                let pause = rand::rng().random_range(2..10);
                tokio::time::sleep(Duration::from_millis(pause)).await;
                continue;
            }
            // Step back a moment, so that the others get their turn.
            tokio::time::sleep(Duration::from_millis(1)).await;
        }
    }

    /// An exclusive hold: recorded, a critical section on the counter, released.
    async fn hold<G: Guard + Fence>(
        &self,
        lock: G,
        attempt_started: Instant,
        hold: Duration,
        store: &mut MultiplexedConnection,
    ) -> Result<(), ()> {
        let granted_at = Instant::now();
        self.count_if_faulted(attempt_started, granted_at);
        let mut grant = Grant::new(self.id, lock.token(), granted_at, granted_at + lock.validity());
        if let Some(fence) = lock.fencing() {
            grant = grant.with_fence(fence);
        }
        let id = self.history.record(grant);
        self.critical_section(store, &lock, hold, COUNTER).await;
        self.history.released(id, Instant::now());
        // The lock may have expired (a stall): the release then reports it; either way
        // the keys are gone or going.
        let _ = lock.release().await;
        Ok(())
    }

    /// A permit: recorded as counted, and as an exclusive hold of its slot; a critical
    /// section on its slot's counter; released.
    async fn permit(
        &self,
        permit: Permit,
        attempt_started: Instant,
        hold: Duration,
        store: &mut MultiplexedConnection,
    ) -> Result<(), ()> {
        let granted_at = Instant::now();
        self.count_if_faulted(attempt_started, granted_at);
        let (token, until) = (permit.token().to_owned(), granted_at + permit.validity());
        let slot = permit.slot();
        let id = self.history.record(Grant::permit(self.id, token.clone(), granted_at, until));
        // A slot outside 0..L would be one holder too many whatever the windows say: its
        // history is missing, and the grant shows up in the count over the limit instead.
        let of_slot = self.slots.get(slot as usize).map(|holders| {
            (holders, holders.record(Grant::new(self.id, token, granted_at, until)))
        });
        self.critical_section(store, &permit, hold, &slot_counter(slot)).await;
        let now = Instant::now();
        self.history.released(id, now);
        if let Some((holders, id)) = of_slot {
            holders.released(id, now);
        }
        let _ = permit.release().await;
        Ok(())
    }

    /// Counts a grant whose whole attempt ran while the fault was in force.
    fn count_if_faulted(&self, attempt_started: Instant, granted_at: Instant) {
        self.tally.clients_in.fetch_or(1 << self.id, Ordering::Relaxed);
        if self.window.covers(attempt_started, granted_at) {
            self.tally.granted_while_faulted.fetch_add(1, Ordering::Relaxed);
        }
    }

    /// A read share: recorded as shared, held, released; it writes nothing.
    async fn share(
        &self,
        lock: ReadLock,
        attempt_started: Instant,
        hold: Duration,
    ) -> Result<(), ()> {
        let granted_at = Instant::now();
        self.count_if_faulted(attempt_started, granted_at);
        let grant = Grant::shared(self.id, lock.token(), granted_at, granted_at + lock.validity());
        let id = self.history.record(grant);
        tokio::time::sleep(hold * 2).await;
        self.history.released(id, Instant::now());
        let _ = lock.release().await;
        Ok(())
    }

    /// A non-atomic read-modify-write of `counter`: correct only under exclusion.
    async fn critical_section(
        &self,
        store: &mut MultiplexedConnection,
        lock: &(impl Guard + Fence),
        hold: Duration,
        counter: &str,
    ) {
        let Ok(value) = store.get::<_, Option<u64>>(counter).await else { return };
        let next = value.unwrap_or(0) + 1;
        tokio::time::sleep(hold).await;
        if lock.validity().is_zero() {
            // Writing after the lease: outside the model; the history check cannot see it.
            self.tally.stale_writes.fetch_add(1, Ordering::Relaxed);
        }
        match lock.fencing() {
            Some(token) => {
                match fenced_set(store, counter, next.to_string().as_bytes(), token).await {
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
                if store.set::<_, _, ()>(counter, next).await.is_ok() {
                    self.tally.sections.fetch_add(1, Ordering::Relaxed);
                }
            }
        }
    }
}
