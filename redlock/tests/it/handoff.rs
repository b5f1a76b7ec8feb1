//! A release of this client's exclusive hold hands the lock to its waiters through the
//! nodes' notifications: a waiter's requests never overtake the release (also one that must
//! reconnect, or one dropped as its runtime ends), releases that free nothing (a late release
//! of an expired lease, a cancelled attempt) swallow no later release, read and reentrant
//! releases wake no one early, tasks of one client taking turns do not starve another
//! client's waiter, and a release re-sent after a lost reply says `Ok` without touching
//! another client's hold. Same-client handoffs of every kind keep exclusion under faults.

use crate::common;

use std::future::Future;
use std::pin::Pin;
use std::sync::Arc;
use std::task::Poll;
use std::time::{Duration, Instant};

use redlock::{Redlock, Retry};
use redlock_testkit::{Cluster, FaultyCluster, NetFault, Proxy};

fn ms(n: u64) -> Duration {
    Duration::from_millis(n)
}

/// Waits that poll every `poll` (no jitter) for up to 30 s: far too slow to explain a
/// quick grant, which only a release notification can then explain.
fn patient(urls: Vec<String>, node_timeout: Duration, poll: Duration) -> Redlock {
    common::builder_for(urls, node_timeout)
        .retry(
            Retry::new()
                .with_unbounded_attempts()
                .with_delay(poll)
                .with_jitter(Duration::ZERO)
                .with_max_wait(Duration::from_secs(30)),
        )
        .build()
        .unwrap()
}

/// Exactly one subscriber to `key`'s releases on every node (a first waiter in line).
async fn subscribed(cluster: &Cluster, key: &str) {
    let ok = common::eventually(Duration::from_secs(5), || {
        common::subscribers(cluster, key).iter().all(|&n| n == 1)
    })
    .await;
    assert!(ok, "the waiter never got in line: {:?}", common::subscribers(cluster, key));
}

/// A waiter of `rl` for the plain lock `key`; answers when it was granted (and releases).
fn waiter(rl: &Redlock, key: &'static str) -> tokio::task::JoinHandle<Instant> {
    let rl = rl.clone();
    tokio::spawn(async move {
        let lock = rl.lock(key).await.unwrap();
        let granted_at = Instant::now();
        lock.release().await.unwrap();
        granted_at
    })
}

/// Polls `fut` once; whether it completed.
async fn poll_once<F: Future + Unpin>(fut: &mut F) -> bool {
    std::future::poll_fn(|cx| Poll::Ready(Pin::new(&mut *fut).poll(cx).is_ready())).await
}

/// Every connection of the client through `faulty`'s proxies breaks (a network blip), and
/// the proxies heal at once: the client's drivers see their sockets end.
async fn blip(faulty: &FaultyCluster) {
    for i in 0..faulty.len() {
        faulty.proxy(i).set_fault(NetFault::Reset);
    }
    for i in 0..faulty.len() {
        faulty.proxy(i).heal();
    }
    tokio::time::sleep(ms(300)).await;
}

// ---------------------------------------------------------------------------------------
// A release that must reconnect first.

/// Releases `lock` on a current-thread runtime of its own thread that, right after the
/// release's first poll, is busy for `stall` (another task of that runtime computing, or a
/// synchronous caller between two `block_on`s).
fn release_on_a_busy_runtime(
    lock: redlock::Lock,
    stall: Duration,
) -> std::thread::JoinHandle<redlock::Result<()>> {
    std::thread::spawn(move || {
        let runtime = tokio::runtime::Builder::new_current_thread().enable_all().build().unwrap();
        runtime.block_on(async move {
            let mut release = Box::pin(lock.release());
            assert!(!poll_once(&mut release).await, "released without a round trip");
            std::thread::sleep(stall);
            release.await
        })
    })
}

/// The client's connections broke while a task held the lock (a network blip; a server
/// `timeout` closing idle connections does the same), so the release must wait for a new
/// connection. The releaser's runtime is then busy for 100 ms while the waiter's is free:
/// a waiter that tried at once would send its `SET NX` first on every node and be refused
/// by the releaser's own key. The waiter must still be granted well before its 5 s poll,
/// woken by the release's publications once the release has run.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_release_that_must_reconnect_does_not_cost_the_woken_waiter_its_turn() {
    let faulty = FaultyCluster::start(3).unwrap();
    let rl = patient(faulty.urls(), ms(500), Duration::from_secs(5));
    common::warm(&rl).await;
    let held = rl.lock("reconnect").await.unwrap();
    let waiting = waiter(&rl, "reconnect");
    subscribed(faulty.cluster(), "reconnect").await;
    blip(&faulty).await;
    subscribed(faulty.cluster(), "reconnect").await;
    let released_at = Instant::now();
    let releasing = release_on_a_busy_runtime(held, ms(100));
    let granted_at = tokio::time::timeout(Duration::from_secs(8), waiting)
        .await
        .expect("the waiter never got the free lock")
        .unwrap();
    releasing.join().unwrap().unwrap();
    let gap = granted_at - released_at;
    assert!(gap < Duration::from_secs(1), "the free lock reached the waiter after {gap:?}");
}

// ---------------------------------------------------------------------------------------
// A release that frees nothing.

/// The holder's lease ran out (a slow task) and another client took the lock. The late
/// release frees nothing on any node; the other client's release, coming within the node
/// timeout (1 s here), must still wake the waiter, well before its 5 s poll.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_late_release_that_frees_nothing_does_not_swallow_the_next_release() {
    let cluster = common::cluster(3);
    let a = patient(cluster.urls(), Duration::from_secs(1), Duration::from_secs(5));
    let b = common::client(&cluster);
    let held = a.lock("late").ttl(ms(300)).await.unwrap();
    let waiting = waiter(&a, "late");
    subscribed(&cluster, "late").await;
    tokio::time::sleep(ms(400)).await;
    let other = b.try_lock("late").await.unwrap();
    let late = held.release().await;
    assert!(late.is_err(), "a release of an expired lease said Ok");
    tokio::time::sleep(ms(100)).await;
    let release = async { other.release().await.unwrap() };
    let gap = gap_to_grant(release, waiting, Duration::from_secs(8)).await;
    assert!(gap < Duration::from_secs(1), "the free lock reached the waiter after {gap:?}");
}

// ---------------------------------------------------------------------------------------
// A cancelled acquisition attempt, released from `Drop`.

/// Five nodes 20 ms away (each way), client `a` (waits poll every 5 s, 1 s node timeout)
/// and client `b`, both through the proxies, connections open.
async fn far_nodes() -> (FaultyCluster, Redlock, Redlock) {
    let faulty = FaultyCluster::start(5).unwrap();
    let a = patient(faulty.urls(), Duration::from_secs(1), Duration::from_secs(5));
    let b = common::builder_for(faulty.urls(), Duration::from_secs(1)).build().unwrap();
    common::warm(&a).await;
    common::warm(&b).await;
    for i in 0..5 {
        faulty.proxy(i).set_fault(common::latency(20));
    }
    (faulty, a, b)
}

/// Another task of `a` gives up a `try_lock` mid-round (a timeout around it) while `b`
/// holds the lock. The attempt's claim is dropped armed and released from `Drop`, which
/// frees no hold; `b`'s real release, within the node timeout, must still wake `a`'s
/// waiter, well before its 5 s poll.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_cancelled_attempt_does_not_swallow_the_next_release() {
    let (faulty, a, b) = far_nodes().await;
    let other = b.try_lock("cancel").await.unwrap();
    let waiting = waiter(&a, "cancel");
    subscribed(faulty.cluster(), "cancel").await;
    // Cancelled after 5 ms: its SETs are on their way (40 ms round trips).
    let gave_up = tokio::time::timeout(ms(5), a.try_lock("cancel")).await;
    assert!(gave_up.is_err());
    tokio::time::sleep(ms(150)).await;
    let release = async { other.release().await.unwrap() };
    let gap = gap_to_grant(release, waiting, Duration::from_secs(8)).await;
    assert!(gap < Duration::from_secs(1), "the free lock reached the waiter after {gap:?}");
}

/// Ten `try_lock`s of `a` given up mid-round while `b` holds the lock: their releases from
/// `Drop` free no hold, so they must not wake `a`'s waiter into attempts that can only
/// fail: ten SETs on a node, one per `try_lock`, not twenty.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn cancelled_attempts_do_not_wake_the_waiter() {
    let (faulty, a, b) = far_nodes().await;
    let other = b.try_lock("storm").await.unwrap();
    let waiting = waiter(&a, "storm");
    subscribed(faulty.cluster(), "storm").await;
    tokio::time::sleep(ms(100)).await;
    let before = common::create_calls(faulty.cluster().node(0));
    for _ in 0..10 {
        assert!(tokio::time::timeout(ms(5), a.try_lock("storm")).await.is_err());
        tokio::time::sleep(ms(100)).await;
    }
    let sets = common::create_calls(faulty.cluster().node(0)) - before;
    other.release().await.unwrap();
    tokio::time::timeout(Duration::from_secs(8), waiting).await.unwrap().unwrap();
    assert!(sets <= 12, "{sets} SETs for 10 cancelled try_locks: the waiter was woken by them");
}

/// [`a_release_that_must_reconnect_does_not_cost_the_woken_waiter_its_turn`] without a
/// busy runtime, eight times: after each blip, the release (on the test's own runtime) and
/// the waiter race for the new connection on each node. A waiter whose SET won on a
/// majority would be refused (the releaser's key) and sleep until its 2 s poll; every
/// handoff must come well before it.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn handoffs_right_after_a_blip_do_not_wait_for_the_poll() {
    let faulty = FaultyCluster::start(5).unwrap();
    let rl = patient(faulty.urls(), ms(500), Duration::from_secs(2));
    common::warm(&rl).await;
    let mut stalls = Vec::new();
    for round in 0..8 {
        let key: &'static str = Box::leak(format!("blip:{round}").into_boxed_str());
        let held = rl.lock(key).await.unwrap();
        let waiting = waiter(&rl, key);
        subscribed(faulty.cluster(), key).await;
        blip(&faulty).await;
        subscribed(faulty.cluster(), key).await;
        let release = async { held.release().await.unwrap() };
        let gap = gap_to_grant(release, waiting, Duration::from_secs(5)).await;
        if gap > Duration::from_secs(1) {
            stalls.push((round, gap));
        }
    }
    assert!(stalls.is_empty(), "handoffs that waited for the poll: {stalls:?}");
}

// ---------------------------------------------------------------------------------------
// Failed attempts per handoff, tasks of one client taking turns.

/// `tasks` tasks of one client take turns on one key for `run`, each holding it for
/// `hold`; returns the grants and the SETs node 0 ran meanwhile.
async fn taking_turns(
    rl: &Redlock,
    cluster: &Cluster,
    tasks: usize,
    hold: Duration,
    run: Duration,
) -> (u64, u64) {
    let before = common::create_calls(cluster.node(0));
    let grants = Arc::new(std::sync::atomic::AtomicU64::new(0));
    let end = Instant::now() + run;
    let handles: Vec<_> = (0..tasks)
        .map(|_| {
            let (rl, grants) = (rl.clone(), grants.clone());
            tokio::spawn(async move {
                while Instant::now() < end {
                    let lock = rl.lock("turns").await.unwrap();
                    grants.fetch_add(1, std::sync::atomic::Ordering::Relaxed);
                    if !hold.is_zero() {
                        tokio::time::sleep(hold).await;
                    }
                    lock.release().await.unwrap();
                }
            })
        })
        .collect();
    for handle in handles {
        handle.await.unwrap();
    }
    (
        grants.load(std::sync::atomic::Ordering::Relaxed),
        common::create_calls(cluster.node(0)) - before,
    )
}

/// Four tasks of one client take turns (no hold, then 2 ms), waits polling every 100 ms:
/// every grant past the first comes from a handoff; each failed attempt is a SET on node 0
/// beyond one per grant (0.00-0.01 failed per grant are usual).
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn tasks_taking_turns_fail_few_attempts_per_handoff() {
    let cluster = common::cluster(5);
    let rl = patient(cluster.urls(), ms(200), ms(100));
    common::warm(&rl).await;
    for hold in [Duration::ZERO, ms(2)] {
        let (grants, sets) = taking_turns(&rl, &cluster, 4, hold, Duration::from_secs(2)).await;
        let failed = sets.saturating_sub(grants) as f64 / grants.max(1) as f64;
        println!(
            "hold {hold:?}: {grants} grants, {sets} SETs on node 0, {failed:.2} failed per grant"
        );
        assert!(grants > 20, "hold {hold:?}: only {grants} grants in 2 s");
        assert!(failed < 0.5, "hold {hold:?}: {failed:.2} failed attempts per handoff");
    }
}

// ---------------------------------------------------------------------------------------
// Exclusion under faults, with same-client handoffs of every kind.

struct Rng(u64);

impl Rng {
    fn below(&mut self, n: u64) -> u64 {
        self.0 ^= self.0 << 13;
        self.0 ^= self.0 >> 7;
        self.0 ^= self.0 << 17;
        self.0 % n
    }
}

/// The resources: plain "p" (sometimes fenced) and "q", the multi-resource lock of both,
/// the read-write lock "rw", the reentrant lock "re" (one owner per task: exclusive).
const RESOURCES: [&str; 4] = ["p", "q", "rw", "re"];

/// Two clients of four tasks each, every client behind its own fuzzed proxies (delays,
/// replies swallowed after the command ran, requests reset: re-sent undos, and reconnects
/// racing the acquisitions of the same client's next holder). Each task waits for a lock
/// of a random kind, holds it for a moment, then releases it, drops it (a release from
/// `Drop`), or has given up its wait mid-attempt (a timeout around it). No two exclusive
/// windows overlap, fencing tokens grow with grants, and once every task is done no lock
/// key is left on any node (the fuzz seed is printed; the environment can fix it to replay).
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn same_client_handoffs_of_every_kind_keep_exclusion_under_faults() {
    use redlock_testkit::{Fuzz, Grant, History, NodeConfig};

    let clients = 2;
    let faulty = FaultyCluster::start_for_clients(5, clients, NodeConfig::new()).unwrap();
    let seed = Fuzz::seed_from_env_or_random();
    println!("seed {seed}");
    let histories: Arc<Vec<History>> = Arc::new(RESOURCES.iter().map(|_| History::new()).collect());
    let rls: Vec<Redlock> = (0..clients)
        .map(|c| {
            Redlock::builder()
                .nodes(faulty.urls_for(c))
                .ttl(Duration::from_secs(5))
                .node_timeout(ms(50))
                .retry(
                    Retry::new()
                        .with_unbounded_attempts()
                        .with_delay(ms(20))
                        .with_jitter(ms(20))
                        .with_max_wait(ms(1500)),
                )
                .build()
                .unwrap()
        })
        .collect();
    for rl in &rls {
        common::warm(rl).await;
    }
    for c in 0..clients {
        faulty.fuzz_client(
            c,
            Fuzz::new(seed.wrapping_add(c as u64))
                .with_max_delay(ms(3))
                .with_drop_reply(0.01)
                .with_reset_request(0.01),
        );
    }
    let end = Instant::now() + Duration::from_secs(6);
    let mut tasks = Vec::new();
    for (c, rl) in rls.iter().enumerate() {
        for t in 0..4u64 {
            let (rl, histories) = (rl.clone(), histories.clone());
            let owner = format!("owner-{c}-{t}");
            tasks.push(tokio::spawn(async move {
                let mut rng = Rng(seed
                    .wrapping_mul(6364136223846793005)
                    .wrapping_add(c as u64 * 101 + t)
                    | 1);
                let mut granted = 0u32;
                while Instant::now() < end {
                    let kind = rng.below(7);
                    let cancel_after = (rng.below(5) == 0).then(|| ms(rng.below(30)));
                    let hold = ms(rng.below(4));
                    let dropped = rng.below(4) == 0;
                    let fenced = rng.below(2) == 0;
                    // (history indices, token, deadline, fence, shared) and a release.
                    type Release = Pin<Box<dyn Future<Output = ()> + Send>>;
                    type Info = (Vec<usize>, String, Instant, Option<u64>, bool);
                    /// What the checker records of `guard` (on histories `indices`), and
                    /// its release (or drop).
                    fn held<G: redlock::Guard + Send + 'static>(
                        guard: G,
                        indices: Vec<usize>,
                        shared: bool,
                        dropped: bool,
                    ) -> (Info, Release) {
                        let token = guard.token().to_owned();
                        let info = (indices, token, guard.deadline(), None, shared);
                        let release = Box::pin(async move {
                            if dropped {
                                drop(guard);
                            } else {
                                let _ = guard.release().await;
                            }
                        });
                        (info, release)
                    }
                    let acquire = async {
                        Some(match kind {
                            0 | 1 => {
                                let lock = if fenced {
                                    rl.lock("p").fenced().await.ok()?
                                } else {
                                    rl.lock("p").await.ok()?
                                };
                                let fence = lock.fencing_token();
                                let ((indices, token, deadline, _, shared), release) =
                                    held(lock, vec![0], false, dropped);
                                ((indices, token, deadline, fence, shared), release)
                            }
                            2 => {
                                let lock = rl.lock("q").await.ok()?;
                                held(lock, vec![1], false, dropped)
                            }
                            3 => {
                                let lock = rl.many(&["p", "q"]).await.ok()?;
                                held(lock, vec![0, 1], false, dropped)
                            }
                            4 => {
                                let lock = rl.write("rw").await.ok()?;
                                held(lock, vec![2], false, dropped)
                            }
                            5 => {
                                let lock = rl.read("rw").await.ok()?;
                                held(lock, vec![2], true, dropped)
                            }
                            _ => {
                                let lock = rl.reentrant("re", &owner).await.ok()?;
                                held(lock, vec![3], false, dropped)
                            }
                        })
                    };
                    let got = match cancel_after {
                        Some(after) => tokio::time::timeout(after, acquire).await.ok().flatten(),
                        None => acquire.await,
                    };
                    let Some(((indices, token, deadline, fence, shared), release)) = got else {
                        continue;
                    };
                    granted += 1;
                    let now = Instant::now();
                    let ids: Vec<_> = indices
                        .iter()
                        .map(|&i| {
                            let grant = if shared {
                                Grant::shared(c, token.clone(), now, deadline)
                            } else {
                                Grant::new(c, token.clone(), now, deadline)
                            };
                            let grant = match fence {
                                Some(fence) => grant.with_fence(fence),
                                None => grant,
                            };
                            (i, histories[i].record(grant))
                        })
                        .collect();
                    if !hold.is_zero() {
                        tokio::time::sleep(hold).await;
                    }
                    let at = Instant::now();
                    for (i, id) in ids {
                        histories[i].released(id, at);
                    }
                    release.await;
                }
                granted
            }));
        }
    }
    let mut granted = 0;
    for task in tasks {
        granted += task.await.unwrap();
    }
    for c in 0..clients {
        faulty.heal_client(c);
    }
    println!("{granted} grants: {:?}", histories.iter().map(History::len).collect::<Vec<_>>());
    assert!(granted > 50, "only {granted} grants");
    for (r, history) in RESOURCES.iter().zip(histories.iter()) {
        let violations = history.violations();
        assert!(violations.is_empty(), "{r}: overlapping holds (seed {seed}): {violations:?}");
        let fencing = history.fencing_violations();
        assert!(fencing.is_empty(), "{r}: fencing tokens out of order (seed {seed}): {fencing:?}");
    }
    // Leases are 5 s: a key still there 2 s after the last release was never released.
    let gone = common::eventually(Duration::from_secs(2), || {
        RESOURCES.iter().all(|key| faulty.cluster().count_key(key) == 0)
    })
    .await;
    let left: Vec<_> = RESOURCES.iter().map(|key| (key, faulty.cluster().count_key(key))).collect();
    assert!(gone, "lock keys left behind (seed {seed}): {left:?}");
}

// ---------------------------------------------------------------------------------------
// A guard dropped as its runtime ends: its release is handed over to the client's thread.

/// A guard of an exclusive kind ("plain", "multi": `key` and "other", "write"), as
/// something to drop.
type Dropped = Box<dyn std::any::Any + Send>;

async fn acquire_kind(rl: &Redlock, key: &'static str, kind: &str) -> Dropped {
    match kind {
        "plain" => Box::new(rl.lock(key).await.unwrap()),
        "multi" => Box::new(rl.many(&[key, "other"]).await.unwrap()),
        _ => Box::new(rl.write(key).await.unwrap()),
    }
}

/// Drops `guard` on a current-thread runtime of its own thread, which is busy for `busy`
/// before it ends (its last task, the release from `Drop`, is never polled there).
fn drop_on_a_runtime_that_ends(guard: Dropped, busy: Duration) -> std::thread::JoinHandle<()> {
    std::thread::spawn(move || {
        let runtime = tokio::runtime::Builder::new_current_thread().enable_all().build().unwrap();
        runtime.block_on(async move {
            drop(guard);
            std::thread::sleep(busy);
        });
        drop(runtime);
    })
}

/// A guard dropped at the end of a short-lived runtime (plain, multi-resource, write): its
/// release from `Drop` is spawned there and left unsent when the runtime ends, then handed
/// over to the client's own thread. A waiter that tried before that release went out
/// would be refused by the dropped guard's key (the race is per node); the handed-over
/// release's publications must still wake it, well before its 3 s poll.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_guard_dropped_as_its_runtime_ends_still_hands_over_at_once() {
    let cluster = common::cluster(3);
    let rl = patient(cluster.urls(), ms(500), Duration::from_secs(3));
    common::warm(&rl).await;
    let mut gaps = Vec::new();
    for kind in ["plain", "multi", "write"] {
        let key: &'static str = Box::leak(format!("ending-{kind}").into_boxed_str());
        let held = acquire_kind(&rl, key, kind).await;
        let waiting = tokio::spawn({
            let rl = rl.clone();
            async move {
                let next = acquire_kind(&rl, key, kind).await;
                let granted_at = Instant::now();
                drop(next);
                granted_at
            }
        });
        subscribed(&cluster, key).await;
        let dropped_at = Instant::now();
        drop_on_a_runtime_that_ends(held, ms(50)).join().unwrap();
        let granted_at = tokio::time::timeout(Duration::from_secs(8), waiting)
            .await
            .expect("the waiter never got the free lock")
            .unwrap();
        gaps.push((kind, granted_at - dropped_at));
        // The waiter's guard, dropped, is released in the background.
        assert!(common::eventually(Duration::from_secs(2), || cluster.count_key(key) == 0).await);
    }
    assert!(
        gaps.iter().all(|(_, gap)| *gap < Duration::from_secs(1)),
        "from the drop to the waiter's grant: {gaps:?}"
    );
}

// ---------------------------------------------------------------------------------------
// Releases of holds that leave the lock held (read shares, reentrant holds) wake no one.

/// Client `a`'s writer waits behind two read shares, `a`'s and `b`'s. `a`'s share goes
/// first (the lock stays held: no publication); `b`'s, 100 ms later, frees the lock and
/// must wake the writer, although `a`'s own release came just before it.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_read_release_that_leaves_the_lock_held_wakes_no_one() {
    let cluster = common::cluster(3);
    let a = patient(cluster.urls(), Duration::from_secs(1), Duration::from_secs(5));
    let b = common::client(&cluster);
    let mine = a.read("shares").await.unwrap();
    let theirs = b.read("shares").await.unwrap();
    let writer = tokio::spawn({
        let a = a.clone();
        async move {
            let lock = a.write("shares").await.unwrap();
            let granted_at = Instant::now();
            lock.release().await.unwrap();
            granted_at
        }
    });
    subscribed(&cluster, "shares").await;
    let gap = woken_by_the_last_release(mine.release(), theirs.release(), writer).await;
    assert!(gap < Duration::from_secs(1), "the free lock reached the writer after {gap:?}");
}

/// The same with reentrant holds: owner "one" holds twice; its first release leaves the
/// lock held (no publication), its second frees it and must wake `a`'s waiter for owner
/// "two".
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_reentrant_release_that_leaves_the_lock_held_wakes_no_one() {
    let cluster = common::cluster(3);
    let a = patient(cluster.urls(), Duration::from_secs(1), Duration::from_secs(5));
    let first = a.reentrant("owned", "one").await.unwrap();
    let second = a.reentrant("owned", "one").await.unwrap();
    let other = tokio::spawn({
        let a = a.clone();
        async move {
            let hold = a.reentrant("owned", "two").await.unwrap();
            let granted_at = Instant::now();
            hold.release().await.unwrap();
            granted_at
        }
    });
    subscribed(&cluster, "owned").await;
    let gap = woken_by_the_last_release(first.release(), second.release(), other).await;
    assert!(gap < Duration::from_secs(1), "the free lock reached the waiter after {gap:?}");
}

/// Runs `first` (a release that leaves the lock held), then 100 ms later `last` (the one
/// that frees it); returns how long after `last` started `waiter` got the lock.
async fn woken_by_the_last_release(
    first: impl Future<Output = redlock::Result<()>>,
    last: impl Future<Output = redlock::Result<()>>,
    waiter: tokio::task::JoinHandle<Instant>,
) -> Duration {
    first.await.unwrap();
    tokio::time::sleep(ms(100)).await;
    gap_to_grant(async { last.await.unwrap() }, waiter, Duration::from_secs(8)).await
}

/// How long after `release` starts the task `waiting` is granted the lock (within `within`).
async fn gap_to_grant(
    release: impl Future<Output = ()>,
    waiting: tokio::task::JoinHandle<Instant>,
    within: Duration,
) -> Duration {
    let released_at = Instant::now();
    release.await;
    let granted_at =
        tokio::time::timeout(within, waiting).await.expect("the waiter never got the free lock");
    granted_at.unwrap() - released_at
}

// ---------------------------------------------------------------------------------------
// A handoff while the releaser's acquisition is still in flight on a node.

/// Node 4's proxy holds every request on the key for 300 ms: the lock is granted by nodes
/// 0-3 while its SET on node 4 is on its way; the release follows it there. The waiter is
/// woken by the release; once the held requests have run, the holder is on no node.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_handoff_behind_the_releasers_acquisition_in_flight_leaves_nothing_of_the_holder() {
    let faulty = FaultyCluster::start(5).unwrap();
    let rl = patient(faulty.urls(), ms(800), Duration::from_secs(5));
    common::warm(&rl).await;
    for round in 0..3 {
        let key: &'static str = Box::leak(format!("straggler:{round}").into_boxed_str());
        faulty.proxy(4).hold_requests_containing(key.as_bytes(), ms(300));
        let held = rl.lock(key).await.unwrap();
        let held_token = held.token().to_owned();
        let (granted_tx, granted_rx) = tokio::sync::oneshot::channel();
        let (done_tx, done_rx) = tokio::sync::oneshot::channel::<()>();
        let next = tokio::spawn({
            let rl = rl.clone();
            async move {
                let lock = rl.lock(key).await.unwrap();
                let _ = granted_tx.send((Instant::now(), lock.token().to_owned()));
                let _ = done_rx.await;
                lock.release().await.unwrap();
            }
        });
        subscribed(faulty.cluster(), key).await;
        faulty.proxy(4).release_holds();
        let released_at = Instant::now();
        held.release().await.unwrap();
        let (granted_at, token) =
            tokio::time::timeout(Duration::from_secs(8), granted_rx).await.unwrap().unwrap();
        let gap = granted_at - released_at;
        // Woken by the release's notification, not the 5 s poll; room for a loaded machine
        // (250 ms failed once with the whole `it` binary running beside other builds).
        assert!(gap < Duration::from_secs(2), "round {round}: the handoff took {gap:?}");
        // The holder's straggler SET on node 4 is undone there; the waiter holds a quorum
        // (not always every node: under load its SET reached a node or two before the
        // release did, and was refused there).
        let holder_gone = || faulty.cluster().nodes_holding(key, &held_token).is_empty();
        assert!(
            common::eventually(Duration::from_secs(2), holder_gone).await,
            "round {round}: the holder's lock is still on nodes {:?}",
            faulty.cluster().nodes_holding(key, &held_token),
        );
        assert!(faulty.cluster().nodes_holding(key, &token).len() >= 3, "round {round}");
        let _ = done_tx.send(());
        next.await.unwrap();
        assert!(
            common::eventually(Duration::from_secs(2), || faulty.cluster().count_key(key) == 0)
                .await
        );
    }
}

// ---------------------------------------------------------------------------------------
// A release re-sent after its reply was lost.

/// Swallows every reply of the proxy (and closes its connection): a command that went
/// out runs, but its caller sees its connection drop.
fn drop_replies() -> NetFault {
    NetFault::Fuzz(redlock_testkit::Fuzz::new(7).with_drop_reply(1.0))
}

/// One round of a release whose replies are lost: `holder` holds `key` while a task of
/// `next` waits for it (and holds it 1.5 s once granted); every node's `proxy` drops the
/// replies for the first 40 ms of the release. Returns what the release said, the next
/// holder's token and its task.
async fn release_behind_lost_replies(
    faulty: &Arc<FaultyCluster>,
    proxy: for<'a> fn(&'a FaultyCluster, usize) -> &'a Proxy,
    holder: &Redlock,
    next: &Redlock,
    key: &'static str,
) -> (redlock::Result<()>, String, tokio::task::JoinHandle<()>) {
    let held = holder.lock(key).await.unwrap();
    let (granted_tx, granted_rx) = tokio::sync::oneshot::channel();
    let next = tokio::spawn({
        let next = next.clone();
        async move {
            let lock = next.lock(key).await.unwrap();
            let _ = granted_tx.send(lock.token().to_owned());
            tokio::time::sleep(ms(1500)).await;
            lock.release().await.unwrap();
        }
    });
    subscribed(faulty.cluster(), key).await;
    for i in 0..3 {
        proxy(faulty, i).set_fault(drop_replies());
    }
    let healer = {
        let faulty = faulty.clone();
        std::thread::spawn(move || {
            std::thread::sleep(ms(40));
            for i in 0..3 {
                proxy(&faulty, i).heal();
            }
        })
    };
    let released = held.release().await;
    healer.join().unwrap();
    let token = tokio::time::timeout(Duration::from_secs(5), granted_rx).await.unwrap().unwrap();
    (released, token, next)
}

/// Every node runs the release but its reply is lost with the connection (the proxies
/// swallow replies for 40 ms): the release is sent again. A waiter of the same client
/// woken meanwhile may have taken the key by then, so the re-sent release can find the
/// waiter's key ("held by another owner"); `release()` must still say `Ok` for a hold
/// that was valid and released, in every one of five rounds.
///
/// Under load the caller's thread can be preempted between queueing the release and
/// polling for its reply while the driver's thread writes it and sees the connection drop:
/// that first poll then ends with the failure, and must not count as "refused unsent" (the
/// re-send would be taken as a first send, find the waiter's key and say `NotHeld`).
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_release_re_sent_after_a_lost_reply_still_says_ok() {
    let faulty = Arc::new(FaultyCluster::start(3).unwrap());
    let rl = patient(faulty.urls(), ms(500), Duration::from_secs(1));
    common::warm(&rl).await;
    for round in 0..5 {
        let key: &'static str = Box::leak(format!("resent:{round}").into_boxed_str());
        let (released, token, next) =
            release_behind_lost_replies(&faulty, |f, i| f.proxy(i), &rl, &rl, key).await;
        let preempted = |err: &redlock::Error| {
            err.kind() == redlock::ErrorKind::NotHeld
                && err.nodes().iter().all(|n| *n.outcome() == redlock::NodeOutcome::Absent)
        };
        assert!(
            released.as_ref().map_or_else(preempted, |()| true),
            "round {round}: a valid hold's release said {:?} (the waiter's lock is on nodes {:?})",
            released.unwrap_err(),
            faulty.cluster().nodes_holding(key, &token)
        );
        next.await.unwrap();
    }
}

/// The same with the waiter in another client (each client behind its own proxies; only
/// `a`'s swallow replies): `b` is woken by the release's publications and takes the lock
/// before `a`'s release is re-sent, which then finds `b`'s key. A re-send cannot tell a key
/// its first send removed from one lost before the release: counting "held by another
/// owner" as removed would make a release say `Ok` for a hold another owner had taken
/// from a majority before it. So this release says `NotHeld`, a false alarm on the safe
/// side (a known limit), and `b`'s hold is never touched.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_release_re_sent_after_a_lost_reply_leaves_another_clients_hold_alone() {
    use redlock_testkit::NodeConfig;
    let faulty = Arc::new(FaultyCluster::start_for_clients(3, 2, NodeConfig::new()).unwrap());
    let a = patient(faulty.urls_for(0), ms(500), Duration::from_secs(1));
    let b = patient(faulty.urls_for(1), ms(500), Duration::from_secs(1));
    common::warm(&a).await;
    common::warm(&b).await;
    for round in 0..5 {
        let key: &'static str = Box::leak(format!("resent-b:{round}").into_boxed_str());
        let (released, token, next) =
            release_behind_lost_replies(&faulty, |f, i| f.client_proxy(0, i), &a, &b, key).await;
        assert!(
            released
                .as_ref()
                .map_or_else(|err| err.kind() == redlock::ErrorKind::NotHeld, |()| true),
            "round {round}: the release said {released:?}"
        );
        // `b` may have been granted at two nodes, its third SET refused by `a`'s key or
        // still on its way: what it holds once `a`'s release is over stays.
        let at_grant = faulty.cluster().nodes_holding(key, &token);
        assert!(at_grant.len() >= 2, "round {round}: b holds only {at_grant:?}");
        tokio::time::sleep(ms(300)).await;
        let later = faulty.cluster().nodes_holding(key, &token);
        assert!(
            at_grant.iter().all(|i| later.contains(i)),
            "round {round}: the re-sent release touched b's hold ({at_grant:?}, then {later:?})"
        );
        next.await.unwrap();
    }
}

// ---------------------------------------------------------------------------------------
// Another client's waiter while two tasks of one client take turns.

/// Two tasks of client `a` take turns on a key (5 ms holds); client `b` asks for it eight
/// times meanwhile, each wait polling every 20 ms (woken by releases too) for at most
/// 200 ms. Were each of `a`'s releases followed on every node by the next `a` task's SET
/// back to back, the lock would never be free for `b`, whose SET (woken by the
/// publication, or by its poll) would always come after. Every one of `b`'s waits must be
/// granted, usually within a few milliseconds.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn another_clients_waiter_is_not_starved_by_one_clients_turns() {
    let cluster = common::cluster(3);
    let a = patient(cluster.urls(), ms(200), ms(100));
    let b = common::builder(&cluster, ms(200))
        .retry(
            Retry::new()
                .with_unbounded_attempts()
                .with_delay(ms(20))
                .with_jitter(ms(10))
                .with_max_wait(ms(200)),
        )
        .build()
        .unwrap();
    common::warm(&a).await;
    common::warm(&b).await;
    let stop = Arc::new(std::sync::atomic::AtomicBool::new(false));
    let turns: Vec<_> = (0..2)
        .map(|_| {
            let (a, stop) = (a.clone(), stop.clone());
            tokio::spawn(async move {
                let mut grants = 0u32;
                while !stop.load(std::sync::atomic::Ordering::Relaxed) {
                    let lock = a.lock("shared-hot").await.unwrap();
                    grants += 1;
                    tokio::time::sleep(ms(5)).await;
                    lock.release().await.unwrap();
                }
                grants
            })
        })
        .collect();
    tokio::time::sleep(ms(200)).await;
    let mut waits = Vec::new();
    for _ in 0..8 {
        let started = Instant::now();
        let got = b.lock("shared-hot").await;
        waits.push((got.is_ok(), started.elapsed()));
        if let Ok(lock) = got {
            lock.release().await.unwrap();
        }
        tokio::time::sleep(ms(50)).await;
    }
    stop.store(true, std::sync::atomic::Ordering::Relaxed);
    let mut grants = 0;
    for task in turns {
        grants += task.await.unwrap();
    }
    println!("a: {grants} grants; b: {waits:?}");
    assert!(
        waits.iter().all(|(ok, _)| *ok),
        "b's waits (granted, waited) while a's tasks took {grants} turns: {waits:?}"
    );
}
