//! Many clients, one resource: the critical sections never overlap.
//! The exclusive kinds at once on overlapping resources behind fuzzed proxies: no two
//! exclusive windows overlap and fencing tokens grow with grant order.

use crate::common;

use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use redis::Commands;
use redlock::{Redlock, Retry};
use redlock_testkit::{FaultyCluster, Fuzz, Grant, History, NodeConfig, RedisNode};

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn contending_clients_lose_no_update() {
    let cluster = common::cluster(5);
    let counter = RedisNode::start().unwrap();
    const CLIENTS: usize = 8;
    const SECTIONS: usize = 25;
    let tasks: Vec<_> = (0..CLIENTS)
        .map(|_| {
            // Separate clients (separate connections), as separate processes would have.
            let rl = Redlock::builder()
                .nodes(cluster.urls())
                .ttl(Duration::from_secs(5))
                .node_timeout(Duration::from_millis(200))
                .retry(
                    Retry::new()
                        .with_unbounded_attempts()
                        .with_delay(Duration::from_millis(1))
                        .with_jitter(Duration::from_millis(10))
                        .with_max_wait(Duration::from_secs(60)),
                )
                .build()
                .unwrap();
            let mut counter = counter.connection().unwrap();
            tokio::spawn(async move {
                for _ in 0..SECTIONS {
                    let lock = rl.lock("counter").await.unwrap();
                    // A non-atomic read-modify-write: only mutual exclusion keeps it right.
                    let value: i64 = counter.get("count").unwrap_or(0);
                    tokio::time::sleep(Duration::from_millis(1)).await;
                    let () = counter.set("count", value + 1).unwrap();
                    assert!(lock.is_valid());
                    lock.release().await.unwrap();
                }
            })
        })
        .collect();
    for task in tasks {
        task.await.unwrap();
    }
    let count: i64 = counter.connection().unwrap().get("count").unwrap();
    assert_eq!(count, (CLIENTS * SECTIONS) as i64);
    common::gone_everywhere(&cluster, &["counter"], "the last release removed it").await;
}

// Every exclusive kind at once, on overlapping resources, behind fuzzed proxies.

struct Rng(u64);

impl Rng {
    fn next(&mut self) -> u64 {
        self.0 ^= self.0 << 13;
        self.0 ^= self.0 >> 7;
        self.0 ^= self.0 << 17;
        self.0
    }
    fn below(&mut self, n: u64) -> u64 {
        self.next() % n
    }
}

const RESOURCES: [&str; 3] = ["a", "b", "c"];

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn fuzzed_plain_multi_with_lock_and_reentrant_keep_exclusion_and_fencing() {
    let clients = 3;
    let cluster = FaultyCluster::start_for_clients(3, clients, NodeConfig::new()).unwrap();
    let seed = Fuzz::seed_from_env_or_random();
    for c in 0..clients {
        let fuzz = Fuzz::new(seed.wrapping_add(c as u64))
            .with_max_delay(Duration::from_millis(5))
            .with_drop_reply(0.02)
            .with_reset_request(0.02);
        cluster.fuzz_client(c, fuzz);
    }
    let histories: Arc<Vec<History>> = Arc::new((0..4).map(|_| History::new()).collect());
    let with_lock_errors = Arc::new(Mutex::new(0usize));
    let end = Instant::now() + Duration::from_secs(6);
    let tasks: Vec<_> = (0..clients)
        .map(|c| {
            let retry = Retry::new()
                .with_unbounded_attempts()
                .with_delay(Duration::from_millis(2))
                .with_jitter(Duration::from_millis(5))
                .with_max_wait(Duration::from_millis(600));
            let rl = Redlock::builder()
                .nodes(cluster.urls_for(c))
                .ttl(Duration::from_millis(250))
                .node_timeout(Duration::from_millis(25))
                .retry(retry)
                .build()
                .unwrap();
            let histories = histories.clone();
            let with_lock_errors = with_lock_errors.clone();
            tokio::spawn(async move {
                let mut rng = Rng(seed.wrapping_mul(31).wrapping_add(c as u64 * 7919) | 1);
                while Instant::now() < end {
                    let r = rng.below(3) as usize;
                    match rng.below(6) {
                        0 | 1 => {
                            let Ok(lock) = rl.lock(RESOURCES[r]).fenced().await else { continue };
                            let now = Instant::now();
                            let fence = lock.fencing_token().unwrap();
                            let id = histories[r].record(
                                Grant::new(c, lock.token(), now, lock.deadline()).with_fence(fence),
                            );
                            tokio::time::sleep(Duration::from_millis(rng.below(5))).await;
                            histories[r].released(id, Instant::now());
                            if rng.below(2) == 0 {
                                let _ = lock.release().await;
                            } else {
                                drop(lock);
                            }
                        }
                        2 => {
                            let Ok(lock) = rl.lock(RESOURCES[r]).fenced().await else { continue };
                            let fence = lock.fencing_token().unwrap();
                            let now = Instant::now();
                            let auto = lock.auto_extend();
                            let lease = auto.lease();
                            let id = histories[r].record(
                                Grant::new(c, lease.token(), now, now + Duration::from_secs(60))
                                    .with_fence(fence),
                            );
                            tokio::select! {
                                () = tokio::time::sleep(Duration::from_millis(rng.below(120))) => {}
                                _ = lease.lost() => {}
                            }
                            let until = if lease.is_valid() {
                                Instant::now()
                            } else {
                                lease.deadline().min(Instant::now())
                            };
                            histories[r].released(id, until);
                            let _ = auto.release().await;
                        }
                        3 => {
                            let pair = [RESOURCES[r], RESOURCES[(r + 1) % 3]];
                            let Ok(lock) = rl.many(&pair).await else { continue };
                            let now = Instant::now();
                            let ids: Vec<_> = [r, (r + 1) % 3]
                                .iter()
                                .map(|&i| {
                                    (
                                        i,
                                        histories[i].record(Grant::new(
                                            c,
                                            lock.token(),
                                            now,
                                            lock.deadline(),
                                        )),
                                    )
                                })
                                .collect();
                            tokio::time::sleep(Duration::from_millis(rng.below(5))).await;
                            let at = Instant::now();
                            for (i, id) in ids {
                                histories[i].released(id, at);
                            }
                            let _ = lock.release().await;
                        }
                        4 => {
                            let hist = histories.clone();
                            let work_ms = rng.below(100);
                            let slot: Arc<Mutex<Option<redlock_testkit::GrantId>>> = Arc::default();
                            let slot2 = slot.clone();
                            let result = rl
                                .with_lock(RESOURCES[r], move |lease| async move {
                                    let now = Instant::now();
                                    let id = hist[r].record(Grant::new(
                                        c,
                                        lease.token(),
                                        now,
                                        now + Duration::from_secs(60),
                                    ));
                                    *slot2.lock().unwrap() = Some(id);
                                    tokio::time::sleep(Duration::from_millis(work_ms)).await;
                                    Instant::now()
                                })
                                .await;
                            let id = *slot.lock().unwrap();
                            if let Some(id) = id {
                                match result {
                                    // Ok claims: held from the grant until the work ended.
                                    Ok(ended) => histories[r].released(id, ended),
                                    Err(_) => {
                                        *with_lock_errors.lock().unwrap() += 1;
                                        let start = histories[r].grants()[id_index(&id)].granted_at;
                                        histories[r].released(id, start);
                                    }
                                }
                            }
                        }
                        _ => {
                            let owner = format!("owner-{c}");
                            let Ok(hold) = rl.reentrant("e", &owner).await else { continue };
                            let now = Instant::now();
                            let id = histories[3].record(Grant::new(
                                c,
                                hold.token(),
                                now,
                                hold.deadline(),
                            ));
                            // Sometimes a second hold of the same owner on top.
                            let second = if rng.below(2) == 0 {
                                rl.reentrant("e", &owner).once().await.ok()
                            } else {
                                None
                            };
                            tokio::time::sleep(Duration::from_millis(rng.below(5))).await;
                            let at = Instant::now();
                            histories[3].released(id, at);
                            if let Some(second) = second {
                                let deadline = second.deadline();
                                // The owner still holds the lock through its second hold.
                                let id2 = histories[3].record(Grant::new(
                                    c,
                                    second.token(),
                                    at,
                                    deadline,
                                ));
                                tokio::time::sleep(Duration::from_millis(rng.below(5))).await;
                                histories[3].released(id2, Instant::now());
                                let _ = hold.release().await;
                                let _ = second.release().await;
                            } else {
                                let _ = hold.release().await;
                            }
                        }
                    }
                }
            })
        })
        .collect();
    for task in tasks {
        task.await.unwrap();
    }
    let mut total = 0;
    for (i, history) in histories.iter().enumerate() {
        total += history.len();
        let violations = history.violations();
        assert!(
            violations.is_empty(),
            "seed {seed}: resource {i}: {} violations, first {}",
            violations.len(),
            violations[0]
        );
        let fencing = history.fencing_violations();
        assert!(
            fencing.is_empty(),
            "seed {seed}: resource {i}: {} fencing violations, first {}",
            fencing.len(),
            fencing[0]
        );
    }
    eprintln!("seed {seed}: {total} grants, with_lock errors {}", with_lock_errors.lock().unwrap());
    assert!(total > 15, "seed {seed}: too few grants ({total})");
}

/// GrantIds are handed out in order from 0 (the testkit's index into `grants()`).
fn id_index(id: &redlock_testkit::GrantId) -> usize {
    format!("{id:?}").trim_start_matches("GrantId(").trim_end_matches(')').parse().unwrap()
}

// Split votes: several clients, several tasks each, one key (or overlapping keys) with no
// holder on a quorum between holds. Whatever the failed attempts' clean-ups tell (or do
// not tell) the waiters, the key keeps being taken: the split voters try again on their
// own.

/// Each kind a storm of split votes can hit.
#[derive(Clone, Copy, Debug)]
enum Storm {
    Plain,
    Reentrant,
    Writers,
    Semaphore,
    Multi,
}

/// Runs `CLIENTS` clients of `TASKS` tasks each, every task taking and releasing `kind`
/// (held 2 ms) for `span`: how long each acquisition waited.
async fn storm(cluster: &redlock_testkit::Cluster, kind: Storm, span: Duration) -> Vec<Duration> {
    const CLIENTS: usize = 4;
    const TASKS: usize = 3;
    let waits = Arc::new(Mutex::new(Vec::new()));
    let start = Instant::now();
    let mut tasks = Vec::new();
    for c in 0..CLIENTS {
        let rl = Redlock::builder()
            .nodes(cluster.urls())
            .ttl(Duration::from_secs(5))
            // Split votes are decided without a timeout; what times out here is a loaded
            // machine: with the whole `it` binary and two busy loops on 2 cores, a
            // reentrant release once timed out on all three nodes after 500 ms with 300.
            .node_timeout(Duration::from_secs(1))
            .retry(Retry::new().with_unbounded_attempts().with_max_wait(Duration::from_secs(60)))
            .build()
            .unwrap();
        rl.connect().await.unwrap();
        for t in 0..TASKS {
            let (rl, waits) = (rl.clone(), waits.clone());
            tasks.push(tokio::spawn(async move {
                let owner = if (c + t) % 2 == 0 { "a" } else { "b" };
                let keys: [&[&str]; 3] = [&["{m}a", "{m}b"], &["{m}b", "{m}c"], &["{m}c", "{m}a"]];
                let keys = keys[(c * TASKS + t) % 3];
                while start.elapsed() < span {
                    let asked = Instant::now();
                    let pause = || tokio::time::sleep(Duration::from_millis(2));
                    match kind {
                        Storm::Plain => {
                            let hold = rl.lock("k").await.unwrap();
                            pause().await;
                            hold.release().await.unwrap();
                        }
                        Storm::Reentrant => {
                            let hold = rl.reentrant("k", owner).await.unwrap();
                            pause().await;
                            hold.release().await.unwrap();
                        }
                        Storm::Writers => {
                            let hold = rl.write("k").await.unwrap();
                            pause().await;
                            hold.release().await.unwrap();
                        }
                        Storm::Semaphore => {
                            let hold = rl.semaphore("k", 2).await.unwrap();
                            pause().await;
                            hold.release().await.unwrap();
                        }
                        Storm::Multi => {
                            let hold = rl.many(keys).await.unwrap();
                            pause().await;
                            hold.release().await.unwrap();
                        }
                    }
                    // The wait alone (the hold and its release are ours, not the storm's).
                    let waited = asked.elapsed().saturating_sub(Duration::from_millis(2));
                    waits.lock().unwrap().push(waited);
                }
            }));
        }
    }
    for task in tasks {
        task.await.unwrap();
    }
    let mut waits = std::mem::take(&mut *waits.lock().unwrap());
    waits.sort();
    waits
}

/// Every kind keeps being taken under a storm of split votes from several clients: no
/// kind's waiters stall on a key no one holds (the failed attempts' clean-ups free no
/// quorum and tell no one; the split voters try again by themselves).
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn split_votes_among_many_clients_keep_every_kind_taken() {
    let cluster = common::cluster(3);
    let span = Duration::from_secs(2);
    let mut report = Vec::new();
    for kind in [Storm::Plain, Storm::Reentrant, Storm::Writers, Storm::Semaphore, Storm::Multi] {
        let waits = storm(&cluster, kind, span).await;
        assert!(!waits.is_empty(), "{kind:?}: no acquisition in {span:?}");
        let at = |q: f64| waits[((waits.len() - 1) as f64 * q) as usize];
        let line = format!(
            "{kind:?}: {} acquisitions in {span:?}, wait p50 {:?} p99 {:?} max {:?}",
            waits.len(),
            at(0.5),
            at(0.99),
            waits[waits.len() - 1]
        );
        eprintln!("{line}");
        report.push((kind, waits.len(), waits[waits.len() - 1], line));
    }
    for (kind, count, max, line) in report {
        // Generous: a 2-core machine running other suites; a stall is seconds per task.
        assert!(count >= 20, "{kind:?} barely taken: {line}");
        assert!(max < Duration::from_secs(20), "{kind:?} stalled: {line}");
    }
}
