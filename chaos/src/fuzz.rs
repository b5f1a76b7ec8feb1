//! The interleaving fuzzer: thousands of short randomized schedules of two to four clients,
//! over every lock kind, through per-client proxies that delay every message by a random
//! amount, drop replies and reset connections after the node ran a request.
//!
//! Each schedule has its own resource, lease, node timeout, clients and operations (hold and
//! release, hold and drop, hold and let expire, extend, re-enter, wait or a single attempt,
//! `with_lock`), all drawn from the schedule's seed. After each one the fuzzer checks:
//!
//! - no two valid holds overlapped (read shares may overlap each other, nothing else);
//! - no more than [`PERMITS`] permits of a counting lock held at any instant, and no two
//!   holders of one of its slots at once;
//! - fencing tokens increased with grant order;
//! - once every client has released its holds or let them expire, no key of the schedule
//!   is left on any node (a count or a field that outlives every hold would show here);
//! - `with_lock` answered `Ok` only for work that ran while no one else held the lock.
//!
//! Schedules run several at a time, each on its own resource: the network faults are drawn
//! per connection, so a failing run is found by its seed and the schedule's number, then
//! replayed alone with [`FuzzConfig::only`].
//!
//! [`FuzzConfig::broken_quorum`] gives each client a disjoint subset of the nodes (each
//! believes it has the whole cluster): quorums no longer intersect, and the fuzzer must report
//! violations. That is how the checks themselves are tested.

use std::collections::BTreeMap;
use std::fmt::Write as _;
use std::sync::Arc;
use std::time::{Duration, Instant};

use rand::rngs::StdRng;
use rand::{Rng, SeedableRng};
use redlock::{Guard, Redlock, Retry};

use crate::Fence;
use redlock_testkit::{Cluster, FaultyCluster, Fuzz, Grant, GrantId, History, Mode, NodeConfig};
use tokio::task::JoinSet;

use crate::scenario::PERMITS;

/// The lock kinds a schedule can exercise.
#[derive(Clone, Copy, Debug, PartialEq, Eq, PartialOrd, Ord, Hash)]
pub enum FuzzKind {
    /// `lock` / `try_lock`.
    Plain,
    /// `lock(..).fenced()`: token order is checked.
    Fenced,
    /// `reentrant(.., owner)`, re-entering at random.
    Reentrant,
    /// `many(..)` over two resources, in either order.
    Multi,
    /// `read` and `write` on one resource.
    ReadWrite,
    /// `with_lock`: `Ok` must mean held from start to end.
    WithLock,
    /// `semaphore(.., PERMITS)`: at most [`PERMITS`] holders at once, one per slot, with
    /// three or four clients so that the permits run out.
    Semaphore,
}

impl FuzzKind {
    /// Every kind, in report order.
    pub const ALL: [FuzzKind; 7] = [
        FuzzKind::Plain,
        FuzzKind::Fenced,
        FuzzKind::Reentrant,
        FuzzKind::Multi,
        FuzzKind::ReadWrite,
        FuzzKind::WithLock,
        FuzzKind::Semaphore,
    ];

    /// A short stable name, for reports.
    pub fn name(self) -> &'static str {
        match self {
            FuzzKind::Plain => "plain",
            FuzzKind::Fenced => "fenced",
            FuzzKind::Reentrant => "reentrant",
            FuzzKind::Multi => "multi",
            FuzzKind::ReadWrite => "read-write",
            FuzzKind::WithLock => "with_lock",
            FuzzKind::Semaphore => "semaphore",
        }
    }
}

/// What to run.
#[derive(Clone, Debug)]
pub struct FuzzConfig {
    /// How many schedules.
    pub schedules: usize,
    /// How many schedules run at once.
    pub parallel: usize,
    /// The run's seed: schedule `i` draws from `seed + i`, each client's proxies from the
    /// seed and the client's number.
    pub seed: u64,
    /// The kinds, taken in turn by successive schedules.
    pub kinds: Vec<FuzzKind>,
    /// Give the clients disjoint node subsets, so that the checks must fire.
    pub broken_quorum: bool,
    /// Clients log in as a user the nodes refuse scripts (on Valkey 9, the plain lock then
    /// runs native commands only, extensions that set the lease outright included).
    pub unscripted: bool,
    /// Run only this schedule (a replay).
    pub only: Option<usize>,
}

impl FuzzConfig {
    /// `schedules` schedules over every kind, eight at a time.
    pub fn new(schedules: usize, seed: u64) -> Self {
        Self {
            schedules,
            parallel: 8,
            seed,
            kinds: FuzzKind::ALL.to_vec(),
            broken_quorum: false,
            unscripted: false,
            only: None,
        }
    }
}

/// What a fuzz run found.
#[derive(Debug, Default)]
pub struct FuzzReport {
    /// The run's seed.
    pub seed: u64,
    /// Schedules run, per kind.
    pub schedules: BTreeMap<&'static str, usize>,
    /// Holds granted (shares and `with_lock` runs included), per kind.
    pub grants: BTreeMap<&'static str, usize>,
    /// Attempts that failed (refused, unavailable, lost), per kind: faults at work.
    pub failures: BTreeMap<&'static str, usize>,
    /// Every violation, one line each, naming its schedule.
    pub violations: Vec<String>,
    /// How long the run took.
    pub elapsed: Duration,
}

impl FuzzReport {
    /// Schedules run in all.
    pub fn total_schedules(&self) -> usize {
        self.schedules.values().sum()
    }

    /// A Markdown table: per kind, schedules, holds granted, failed attempts, violations.
    pub fn markdown(&self) -> String {
        let mut table = String::from(
            "| kind | schedules | holds granted | failed attempts | violations |\n|---|---:|---:|---:|---:|\n",
        );
        for kind in FuzzKind::ALL {
            let name = kind.name();
            let Some(schedules) = self.schedules.get(name) else { continue };
            let violations =
                self.violations.iter().filter(|v| v.contains(&format!("[{name}]"))).count();
            let _ = writeln!(
                table,
                "| {name} | {schedules} | {} | {} | {violations} |",
                self.grants.get(name).copied().unwrap_or(0),
                self.failures.get(name).copied().unwrap_or(0),
            );
        }
        table
    }
}

/// The faults every client's connections suffer, per message.
fn network(seed: u64) -> Fuzz {
    Fuzz::new(seed)
        .with_max_delay(Duration::from_millis(10))
        .with_drop_reply(0.01)
        .with_reset_request(0.01)
}

const NODES: usize = 3;
/// The name and password of the user without scripting (`FuzzConfig::unscripted`).
const UNSCRIPTED: &str = "unscripted";
const BROKEN_NODES: usize = 4;
/// Clients with proxies of their own: the counting lock's schedules use all of them, the
/// other kinds two or three.
const CLIENTS: usize = 4;

/// Runs the schedules and reports.
///
/// # Panics
/// When the nodes or proxies cannot be started (a broken set-up, not a finding).
pub async fn fuzz(config: &FuzzConfig) -> FuzzReport {
    let started = Instant::now();
    let nodes = if config.broken_quorum { BROKEN_NODES } else { NODES };
    let faulty = FaultyCluster::start_for_clients(nodes, CLIENTS, NodeConfig::new())
        .unwrap_or_else(|err| panic!("cannot start the nodes: {err}"));
    for client in 0..CLIENTS {
        faulty.fuzz_client(client, network(config.seed.wrapping_add(client as u64 * 7919)));
    }
    if config.unscripted {
        for node in faulty.cluster().nodes() {
            let rules = ["+@all", "-@scripting", "~*", "&*"];
            node.acl_setuser(UNSCRIPTED, UNSCRIPTED, &rules)
                .unwrap_or_else(|err| panic!("cannot set up the unscripted user: {err}"));
        }
    }
    let urls: Vec<Vec<String>> = (0..CLIENTS)
        .map(|client| {
            let all = match config.unscripted {
                false => faulty.urls_for(client),
                true => faulty.urls_as(client, UNSCRIPTED, UNSCRIPTED),
            };
            if config.broken_quorum {
                // Clients 0 and 2 see nodes 0 and 1, clients 1 and 3 nodes 2 and 3: each
                // believes these are all the nodes, and two quorums need not meet.
                let half = if client % 2 == 0 { 0..2 } else { 2..4 };
                all[half].to_vec()
            } else {
                all
            }
        })
        .collect();
    let urls = Arc::new(urls);
    let inspect = Arc::new(faulty.cluster().urls());

    let mut report = FuzzReport { seed: config.seed, ..FuzzReport::default() };
    let indices: Vec<usize> = match config.only {
        Some(i) => vec![i],
        None => (0..config.schedules).collect(),
    };
    let mut running = JoinSet::new();
    let mut next = indices.into_iter();
    loop {
        while running.len() < config.parallel.max(1) {
            let Some(i) = next.next() else { break };
            let kind = config.kinds[i % config.kinds.len().max(1)];
            let schedule = Schedule { index: i, seed: config.seed.wrapping_add(i as u64), kind };
            running.spawn(schedule.run(urls.clone()));
        }
        let Some(done) = running.join_next().await else { break };
        let outcome = done.unwrap_or_else(|err| panic!("a schedule panicked: {err}"));
        let name = outcome.kind.name();
        *report.schedules.entry(name).or_default() += 1;
        *report.grants.entry(name).or_default() += outcome.grants;
        *report.failures.entry(name).or_default() += outcome.failures;
        report.violations.extend(outcome.violations);
    }
    // Keys left behind: checked once every schedule's leases have run out (and the guards
    // left to expire were dropped, at twice their lease).
    tokio::time::sleep(MAX_TTL * 2 + Duration::from_millis(300)).await;
    report.violations.extend(leftovers(faulty.cluster(), &inspect));
    report.elapsed = started.elapsed();
    report
}

/// The longest lease a schedule uses: every key is gone this long after its last client.
const MAX_TTL: Duration = Duration::from_millis(400);

/// Every schedule key still on a node once all leases are over.
fn leftovers(cluster: &Cluster, _urls: &[String]) -> Vec<String> {
    let mut found = Vec::new();
    for (i, node) in cluster.nodes().iter().enumerate() {
        // The counting lock's keys begin with their hash tag, `{fz<schedule>:a}`.
        for pattern in ["fz*", "{fz*"] {
            match node.keys(pattern) {
                Ok(keys) => {
                    for key in keys {
                        found.push(format!("key {key} left on node {i} after every hold ended"));
                    }
                }
                Err(err) => found.push(format!("node {i} cannot be inspected: {err}")),
            }
        }
    }
    found
}

/// One schedule's outcome.
struct Outcome {
    kind: FuzzKind,
    grants: usize,
    failures: usize,
    violations: Vec<String>,
}

/// One randomized schedule.
struct Schedule {
    index: usize,
    seed: u64,
    kind: FuzzKind,
}

/// What one client does in a schedule, drawn before it starts.
#[derive(Clone, Copy, Debug)]
enum Ending {
    Release,
    Drop,
    Expire,
}

impl Schedule {
    async fn run(self, urls: Arc<Vec<Vec<String>>>) -> Outcome {
        let mut rng = StdRng::seed_from_u64(self.seed);
        let ttl = Duration::from_millis(rng.random_range(150..=MAX_TTL.as_millis() as u64));
        let node_timeout = Duration::from_millis(rng.random_range(40..=120));
        let clients = match self.kind {
            FuzzKind::Semaphore => rng.random_range(PERMITS as usize + 1..=CLIENTS),
            _ => rng.random_range(2..=3),
        };
        let history = History::new();
        // Each slot of the counting lock is a plain lock of its own: its holders, apart.
        let slots: Vec<History> = (0..PERMITS).map(|_| History::new()).collect();
        let mut tasks = JoinSet::new();
        for client in 0..clients {
            let rl = Redlock::builder()
                .nodes(urls[client].clone())
                .ttl(ttl)
                .node_timeout(node_timeout)
                .retry(Retry::never())
                .build()
                .unwrap_or_else(|err| panic!("configuration: {err}"));
            let actor = Actor {
                client,
                rl,
                kind: self.kind,
                resource: format!("fz{}:a", self.index),
                second: format!("fz{}:b", self.index),
                history: history.clone(),
                slots: slots.clone(),
                rng: StdRng::seed_from_u64(rng.random()),
            };
            tasks.spawn(actor.run());
        }
        let (mut grants, mut failures) = (0, 0);
        while let Some(done) = tasks.join_next().await {
            let (g, f) = done.unwrap_or_else(|err| panic!("a client panicked: {err}"));
            grants += g;
            failures += f;
        }
        let tag = format!("schedule {} (seed {}) [{}]", self.index, self.seed, self.kind.name());
        let mut violations: Vec<String> =
            history.violations().iter().map(|v| format!("{tag}: overlap: {v}")).collect();
        violations.extend(
            history.fencing_violations().iter().map(|v| format!("{tag}: token order: {v}")),
        );
        if self.kind == FuzzKind::Semaphore {
            let limit = PERMITS as usize;
            violations.extend(
                history.over_limit(limit).iter().map(|v| format!("{tag}: over the limit: {v}")),
            );
            for (slot, holders) in slots.iter().enumerate() {
                violations.extend(
                    holders.violations().iter().map(|v| format!("{tag}: slot {slot} overlap: {v}")),
                );
            }
        }
        Outcome { kind: self.kind, grants, failures, violations }
    }
}

/// Marks every record of a hold released, now.
fn released(ids: &[(History, GrantId)]) {
    let now = Instant::now();
    for (history, id) in ids {
        history.released(*id, now);
    }
}

/// One client of a schedule.
struct Actor {
    client: usize,
    rl: Redlock,
    kind: FuzzKind,
    resource: String,
    second: String,
    history: History,
    /// Per slot of the counting lock, the permits that held it.
    slots: Vec<History>,
    rng: StdRng,
}

impl Actor {
    /// Runs one to four operations; returns (holds granted, attempts failed).
    async fn run(mut self) -> (usize, usize) {
        let (mut grants, mut failures) = (0, 0);
        let owner = format!("owner-{}", self.client);
        for _ in 0..self.rng.random_range(1..=4) {
            let pause = Duration::from_millis(self.rng.random_range(0..20));
            tokio::time::sleep(pause).await;
            let wait = self.rng.random_bool(0.5);
            let retry = if wait {
                Retry::new()
                    .with_delay(Duration::from_millis(5))
                    .with_max_wait(Duration::from_millis(150))
            } else {
                Retry::never()
            };
            let granted = match self.kind {
                FuzzKind::Plain => match self.rl.lock(&self.resource).retry(retry).await {
                    Ok(lock) => self.hold(lock, Mode::Exclusive, None).await,
                    Err(_) => false,
                },
                FuzzKind::Fenced => {
                    match self.rl.lock(&self.resource).fenced().retry(retry).await {
                        Ok(lock) => self.hold(lock, Mode::Exclusive, None).await,
                        Err(_) => false,
                    }
                }
                FuzzKind::Reentrant => {
                    match self.rl.reentrant(&self.resource, &owner).retry(retry).await {
                        Ok(lock) => {
                            if self.rng.random_bool(0.5) {
                                // Re-entered by the same owner: a hold of its own, inside.
                                if let Ok(inner) =
                                    self.rl.reentrant(&self.resource, &owner).once().await
                                {
                                    let _ = self.end(inner).await;
                                }
                            }
                            self.hold(lock, Mode::Exclusive, None).await
                        }
                        Err(_) => false,
                    }
                }
                FuzzKind::Multi => {
                    let (a, b) = (self.resource.clone(), self.second.clone());
                    let pair = if self.rng.random_bool(0.5) {
                        [a.as_str(), b.as_str()]
                    } else {
                        [b.as_str(), a.as_str()]
                    };
                    match self.rl.many(&pair).retry(retry).await {
                        Ok(lock) => self.hold(lock, Mode::Exclusive, None).await,
                        Err(_) => false,
                    }
                }
                FuzzKind::ReadWrite => {
                    if self.rng.random_bool(0.6) {
                        match self.rl.read(&self.resource).retry(retry).await {
                            Ok(lock) => self.hold(lock, Mode::Shared, None).await,
                            Err(_) => false,
                        }
                    } else {
                        match self.rl.write(&self.resource).retry(retry).await {
                            Ok(lock) => self.hold(lock, Mode::Exclusive, None).await,
                            Err(_) => false,
                        }
                    }
                }
                FuzzKind::Semaphore => {
                    match self.rl.semaphore(&self.resource, PERMITS).retry(retry).await {
                        Ok(permit) => {
                            let slot = permit.slot();
                            self.hold(permit, Mode::Counted, Some(slot)).await
                        }
                        Err(_) => false,
                    }
                }
                FuzzKind::WithLock => self.with_lock(retry).await,
            };
            if granted {
                grants += 1;
            } else {
                failures += 1;
            }
        }
        (grants, failures)
    }

    /// Records the hold (a permit also in its slot's history), keeps it a while (extending
    /// it at random), then ends it.
    async fn hold<G: Guard + Fence>(&mut self, mut lock: G, mode: Mode, slot: Option<u32>) -> bool {
        let granted_at = Instant::now();
        let window = |lock: &G| {
            let grant = Grant {
                mode,
                ..Grant::new(self.client, lock.token(), granted_at, lock.deadline())
            };
            match lock.fencing() {
                Some(fence) => grant.with_fence(fence),
                None => grant,
            }
        };
        let ids = self.record(window(&lock), slot);
        tokio::time::sleep(Duration::from_millis(self.rng.random_range(0..30))).await;
        if self.rng.random_bool(0.3) && lock.extend(lock.ttl()).await.is_ok() {
            // Recorded again with the new deadline: the same token, one lock.
            let extended = Grant { granted_at: Instant::now(), ..window(&lock) };
            let again = self.record(extended, slot);
            tokio::time::sleep(Duration::from_millis(self.rng.random_range(0..30))).await;
            released(&again);
        }
        released(&ids);
        let _ = self.end(lock).await;
        true
    }

    /// Records `grant` in the schedule's history and, for a permit, as an exclusive hold of
    /// its slot.
    fn record(&self, grant: Grant, slot: Option<u32>) -> Vec<(History, GrantId)> {
        let mut ids = Vec::with_capacity(2);
        if let Some(holders) = slot.and_then(|slot| self.slots.get(slot as usize)) {
            let of_slot = Grant { mode: Mode::Exclusive, ..grant.clone() };
            ids.push((holders.clone(), holders.record(of_slot)));
        }
        ids.push((self.history.clone(), self.history.record(grant)));
        ids
    }

    /// Ends a hold the way the schedule says: release, drop or let it expire.
    async fn end<G: Guard>(&mut self, lock: G) -> redlock::Result<()> {
        let ending = match self.rng.random_range(0..10) {
            0..=5 => Ending::Release,
            6..=7 => Ending::Drop,
            _ => Ending::Expire,
        };
        match ending {
            Ending::Release => lock.release().await,
            Ending::Drop => {
                drop(lock);
                Ok(())
            }
            Ending::Expire => {
                // Never released: its keys must go with the lease. The guard is dropped
                // only once its lease is long over everywhere (a drop releases, and that
                // release must find nothing).
                let over = lock.ttl() * 2;
                tokio::spawn(async move {
                    tokio::time::sleep(over).await;
                    drop(lock);
                });
                Ok(())
            }
        }
    }

    /// `with_lock` over a plain lock: an `Ok` run is recorded as a hold from the start of
    /// the work to its end.
    async fn with_lock(&mut self, retry: Retry) -> bool {
        let work = Duration::from_millis(self.rng.random_range(0..60));
        let request = self.rl.lock(&self.resource).retry(retry);
        let outcome = self
            .rl
            .with_lock(request, |lease| async move {
                let start = Instant::now();
                tokio::time::sleep(work).await;
                (lease.token().to_owned(), start, Instant::now())
            })
            .await;
        match outcome {
            Ok((token, start, end)) => {
                let mut grant = Grant::new(self.client, token, start, end);
                grant.released_at = Some(end);
                self.history.record(grant);
                true
            }
            Err(_) => false,
        }
    }
}
