//! Review of `lanes` (a8ad4bb): one connection per lane (per multi-thread runtime, plus
//! the client's own thread), each driven on its own runtime; undos go on their claim's
//! lane.
//!
//! **Context.** Written against the `lanes` branch (a connection per multi-thread runtime,
//! not merged: see "Connections per runtime" in `benches/PROFILE.md`; the `FAILED`/`FAILS`
//! notes below are about that branch). On the design main runs (every request goes on the
//! client's own thread's one connection per node) every test here passes: they stay as
//! regression tests for releases, extensions and clean-ups across runtimes that end, block
//! or come and go.
//!
//! What the change gave up: before, every connection of a node was the client's own
//! thread's single connection, and it was never closed while it worked. Now a lane's
//! connection is closed *by the client, while it works*, in two new ways: its runtime
//! ends (the redis-rs driver task is dropped with it), or the lane is evicted (a fifth
//! runtime) and its last request in flight lets go of it. A request already written on
//! such a connection is not lost: like any TCP data it still reaches the node, and runs
//! there, later. The undo then goes out on a new connection, and nothing orders the two:
//! - when the undo times out, the background sends it again until the keys expire
//!   (rule 1 of the change, unchanged): fine (`control_*` tests);
//! - when the undo is *answered* first ("nothing to remove"), nothing sends it again, and
//!   the request it undid lands after it and stays for its whole lease (the `FAILED` tests
//!   below). A per-connection delay (the proxy's `hold_requests_containing`, or a TCP
//!   retransmission on one connection) is all it takes.
//!
//! Every `// FAILED` test failed on a8ad4bb and passed on `main` (03f847d); every
//! `control_*` test passed on both. Fixed since: an undo goes on its claim's lane only
//! where the acquisition had no reply (elsewhere the acquisition has run: the caller's
//! lane will do, and a runtime with blocked workers holds nothing up); an undo that finds
//! nothing after a reconnect where the acquisition had no reply is sent again until the
//! keys expire, like one that timed out; a connection whose runtime ended is never handed
//! out (a send on it wrote nothing, so it is not "sent again"); lanes give way dead first,
//! then least recently used. The runtime without I/O is not fixed: the builder's
//! `runtime_connections(false)` is the documented way out.

use crate::common;

use crate::common::runtimes::*;

use std::future::Future;
use std::sync::atomic::{AtomicUsize, Ordering};

use std::time::{Duration, Instant};

use redlock::{ErrorKind, Guard, Redlock, Retry};
use redlock_testkit::{Cluster, FaultyCluster};
use tokio::runtime::Runtime;

const NODE_TIMEOUT: Duration = Duration::from_millis(200);

/// Only acquisitions carry the lease (10 s, from `common::builder_for`) as a bulk string
/// of its own: releases never do, so a proxy holding this holds the acquisition alone.
const ACQUISITION: &[u8] = b"\r\n10000\r\n";

/// How long node 2's proxy holds an acquisition (the node itself is healthy).
const HOLD: Duration = Duration::from_millis(1500);

/// A lock on `key` taken on a new multi-thread runtime, returned with it (alive).
async fn taken_on_a_new_runtime(rl: &Redlock, key: &'static str) -> (Runtime, redlock::Lock) {
    let rl = rl.clone();
    on_thread(move || {
        let a = multi_thread(2);
        let lock = a.block_on(async { rl.try_lock(key).await.unwrap() });
        (a, lock)
    })
    .await
}

/// Three nodes behind proxies, a client with a 200 ms node timeout, and a helper
/// multi-thread runtime whose lane is warm (its connections open).
async fn warm_runtime_over_proxies() -> (FaultyCluster, Redlock, Runtime) {
    let faulty = FaultyCluster::start(3).unwrap();
    let rl = common::builder_for(faulty.urls(), NODE_TIMEOUT).build().unwrap();
    let a = warm_runtime(&rl).await;
    (faulty, rl, a)
}

fn pttl(cluster: &Cluster, i: usize, key: &str) -> i64 {
    cluster.node(i).pttl(key).unwrap()
}

/// Waits for the proxy's hold to be over (the acquisition has landed on node 2 by then),
/// then asserts that `key` is gone from node 2.
async fn assert_gone_from_node_2_after_the_hold(cluster: &Cluster, key: &str, what: &str) {
    tokio::time::sleep(HOLD + Duration::from_millis(500)).await;
    let gone = common::eventually(Duration::from_secs(2), || !cluster.node(2).exists(key).unwrap());
    assert!(
        gone.await,
        "{what}: `{key}` is still on node 2 (value {:?}, fields {:?}), pttl {} ms: it stays \
         for its lease",
        cluster.node(2).get(key).ok().flatten(),
        cluster.node(2).hgetall(key).ok(),
        pttl(cluster, 2, key)
    );
}

// FAILED on a8ad4bb (every run; passes on main); fixed since (see the module doc).
//
// A lock taken on a multi-thread runtime that then ends, released from another runtime:
// `release()` says Ok, and node 2 keeps the token for its whole lease.
// 1. Runtime A (multi-thread, lane A warm). Node 2's proxy holds acquisitions for 1.5 s.
// 2. On A: try_lock("k"): nodes 0 and 1 grant, node 2's SET is written on lane A's
//    connection and sits in the proxy. A ends: its driver task goes, the socket is closed
//    by the client, and the SET is still in flight (the proxy, like TCP, delivers it).
// 3. On the test's runtime: release(). Lane A's cached connection is dead: the release
//    is re-sent on a new connection (driven on the own thread), which nothing orders with
//    the old one; node 2 answers "absent" at once (marked re-sent, so counted as removed).
//    Nothing is sent again: only timed-out undos are.
// 4. The proxy delivers the SET: node 2 holds the released lock's token for ~8.5 s.
// On main the release goes out on the same (own thread's) connection, behind the SET.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_lock_released_after_its_runtime_ended_leaves_no_token_behind_a_held_acquisition() {
    ended_before_its_release(true).await;
}

/// A lock taken on a runtime that then ends, while node 2's acquisition is held: released
/// (or dropped) from the test's runtime, it must not stay on node 2.
async fn ended_before_its_release(release: bool) {
    let (faulty, rl, a) = warm_runtime_over_proxies().await;
    faulty.proxy(2).hold_requests_containing(ACQUISITION, HOLD);
    let lock = then_end(a, &rl, |rl| async move { rl.try_lock("k").await.unwrap() }).await;
    let cluster = faulty.cluster();
    assert!(!cluster.node(2).exists("k").unwrap(), "staging: node 2's SET was not held");
    let what = format!("ended before its release (release() {release}, token {})", lock.token());
    if release {
        lock.release().await.unwrap();
    } else {
        drop(lock);
    }
    assert_gone_from_node_2_after_the_hold(cluster, "k", &what).await;
}

// FAILED on a8ad4bb (every run; passes on main); fixed since (see the module doc).
//
// The same with a dropped guard (no release() call): the drop's release goes out from the
// own thread on lane A's dead connection, is re-sent on a new one, and finds nothing.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_lock_dropped_after_its_runtime_ended_leaves_no_token_behind_a_held_acquisition() {
    ended_before_its_release(false).await;
}

// FAILED on a8ad4bb (every run; passes on main); fixed since (see the module doc).
//
// The reentrant kind, same interleaving: its hold (a hash field of its own) lands on node
// 2 after its release and stays for its lease (the other owners are refused there).
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_reentrant_hold_released_after_its_runtime_ended_leaves_no_field_behind() {
    let (faulty, rl, a) = warm_runtime_over_proxies().await;
    faulty.proxy(2).hold_requests_containing(ACQUISITION, HOLD);
    let hold =
        then_end(a, &rl, |rl| async move { rl.reentrant("r", "worker-1").await.unwrap() }).await;
    let cluster = faulty.cluster();
    assert!(!cluster.node(2).exists("r").unwrap(), "staging: node 2's acquisition was not held");
    let what = format!("reentrant hold released (its field: {})", hold.field());
    hold.release().await.unwrap();
    assert_gone_from_node_2_after_the_hold(cluster, "r", &what).await;
}

// FAILED on a8ad4bb (every run; passes on main); fixed since (see the module doc).
//
// A refused attempt's clean-up, from a multi-thread runtime that ends right after the
// refusal (the multi-thread twin of review_runtime_driver's first test):
// 1. "k" is held by a foreign owner on nodes 0 and 1; node 2's proxy holds acquisitions.
// 2. On A: try_lock("k") is refused (NotAcquired); node 2's clean-up waits behind its SET
//    (in flight, held) in a task on A. A ends: the task is handed over to the own thread,
//    which sends the clean-up on lane A: dead connection, re-sent on a new one, answered
//    "absent" (node 2 has not seen the SET yet).
// 3. The SET lands: the refused attempt's token stays on node 2 for its whole lease.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_refused_attempt_from_a_multi_thread_runtime_that_ended_leaves_no_token() {
    let (faulty, rl, a) = warm_runtime_over_proxies().await;
    for i in [0, 1] {
        faulty.cluster().node(i).set("k", "foreign").unwrap();
    }
    faulty.proxy(2).hold_requests_containing(ACQUISITION, HOLD);
    let refused = then_end(a, &rl, |rl| async move { rl.try_lock("k").await.map(drop) }).await;
    assert_eq!(refused.unwrap_err().kind(), ErrorKind::NotAcquired);
    assert_gone_from_node_2_after_the_hold(faulty.cluster(), "k", "refused attempt").await;
}

// FAILED on a8ad4bb (every run; passes on main); fixed since (see the module doc).
//
// Lane eviction, with every runtime alive: the evicted connection is not dead, it carries
// the SET in flight until its request lets go; the release goes out on a new one.
// 1. The test's runtime T takes "k"; node 2's SET is held by its proxy (1.5 s).
// 2. Four more multi-thread runtimes lock and release other keys: node 2 keeps 4 lanes,
//    T's (the oldest) is evicted; the started-connections counter moves.
// 3. T releases "k": lane T has no connection, a new one is opened, node 2 answers
//    "absent" at once; nothing sends it again (it did not time out). release() is Ok.
// 4. The SET lands: node 2 keeps the token for its lease.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_lock_whose_lane_was_evicted_leaves_no_token_behind_a_held_acquisition() {
    let faulty = FaultyCluster::start(3).unwrap();
    let rl = common::builder_for(faulty.urls(), NODE_TIMEOUT).build().unwrap();
    rl.try_lock("warm").await.unwrap().release().await.unwrap();
    faulty.proxy(2).hold_requests_containing(ACQUISITION, HOLD);
    let lock = rl.try_lock("k").await.unwrap();
    faulty.proxy(2).release_holds();
    let runtimes = more_runtimes(&rl, 4).await;
    let cluster = faulty.cluster();
    assert!(!cluster.node(2).exists("k").unwrap(), "staging: node 2's SET was not held");
    let what = format!("released after its lane was evicted (its token: {})", lock.token());
    lock.release().await.unwrap();
    assert_gone_from_node_2_after_the_hold(cluster, "k", &what).await;
    on_thread(move || drop(runtimes)).await;
}

// FAILED on a8ad4bb (every run; passes on main); fixed since (see the module doc).
//
// `release()` must say Ok only when the lock was held until the call. After its runtime
// ended, a lock's release goes out on a dead cached connection first (the send fails
// before anything is written), is re-sent, and every "absent" is then read as "the first
// send removed it": a lock that was taken from us meanwhile is reported held.
// 1. Runtime A takes "k" and ends.
// 2. An operator force-releases "k"; another client takes it, works, and releases it.
// 3. The first holder's release(): Ok on lanes (NotHeld on main), so both clients believe
//    they held "k" over the same interval.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_release_after_its_runtime_ended_reports_a_lock_taken_meanwhile_as_not_held() {
    let cluster = common::cluster(3);
    let rl = common::client(&cluster);
    let taker = rl.clone();
    let lock = on_thread(move || {
        let a = multi_thread(2);
        let lock = a.block_on(async { taker.try_lock("k").await.unwrap() });
        drop(a);
        lock
    })
    .await;
    common::take_over(&cluster, "k").await;
    assert!(lock.is_valid(), "staging: the lease ran out");
    let released = lock.release().await;
    assert_eq!(
        released.as_ref().map_err(|err| err.kind()),
        Err(ErrorKind::NotHeld),
        "release() of a lock another client held meanwhile: {released:?}"
    );
}

// Control (passes on lanes and main): the interleaving above with runtime A still alive:
// the release goes out on A's live connection, finds nothing, and says NotHeld.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn control_a_release_while_its_runtime_lives_reports_a_lock_taken_meanwhile_as_not_held() {
    let cluster = common::cluster(3);
    let rl = common::client(&cluster);
    let (a, lock) = taken_on_a_new_runtime(&rl, "k").await;
    common::take_over(&cluster, "k").await;
    let released = lock.release().await;
    on_thread(move || drop(a)).await;
    assert_eq!(released.map_err(|err| err.kind()), Err(ErrorKind::NotHeld));
}

// FAILED on a8ad4bb (every run; passes on main); fixed since (see the module doc).
//
// A lock taken on runtime A whose workers are then all busy (synchronous work) cannot be
// released from another runtime, with every node healthy: the release goes on lane A's
// connection, whose driver only A's workers poll. Every node times out, release() fails,
// and the keys stay until A's workers are free again (for the whole lease if A ends
// meanwhile, or never gets to them).
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_lock_taken_on_a_runtime_whose_workers_are_blocked_is_released_from_another() {
    let cluster = common::cluster(3);
    let rl = common::client(&cluster);
    let taker = rl.clone();
    let (a, lock) = on_thread(move || {
        let a = multi_thread(2);
        let lock = a.block_on(async {
            let lock = taker.try_lock("k").await.unwrap();
            // Every node's SET answered.
            tokio::time::sleep(Duration::from_millis(100)).await;
            lock
        });
        (a, lock)
    })
    .await;
    let token = lock.token().to_owned();
    assert_eq!(cluster.nodes_holding("k", &token).len(), 3);
    let blocked = block_workers(&a, Duration::from_millis(1500)).await;
    let released = lock.release().await;
    let left = cluster.nodes_holding("k", &token);
    wait_and_end(a, blocked).await;
    assert!(
        released.is_ok() && left.is_empty(),
        "release() from another runtime while the acquiring runtime is busy: {released:?}; \
         the token is left on nodes {left:?}"
    );
}

static IO_DISABLED_PANICS: AtomicUsize = AtomicUsize::new(0);

// FAILED on a8ad4bb (every run: one panic per node). Tokio offers no way to ask whether a
// runtime has I/O without panicking, so with connections per runtime on (the default) the
// first connect of such a runtime is a panic caught in a Tokio task ("IO is disabled"),
// after which the client falls back to its own thread's connections
// (`connection::a_runtime_without_io_still_locks_through_the_clients_own_thread`); the
// builder's docs say to turn them off for such a runtime, and with them off (here) nothing
// panics.
#[test]
fn a_runtime_without_io_locks_without_any_task_panicking() {
    let previous = std::panic::take_hook();
    std::panic::set_hook(Box::new(move |info| {
        if info.to_string().contains("IO is disabled") {
            IO_DISABLED_PANICS.fetch_add(1, Ordering::SeqCst);
        }
        previous(info);
    }));
    let cluster = common::cluster(3);
    let rl =
        common::builder(&cluster, NODE_TIMEOUT).connections_per_runtime(false).build().unwrap();
    let runtime = tokio::runtime::Builder::new_multi_thread()
        .worker_threads(2)
        .enable_time()
        .build()
        .unwrap();
    runtime.block_on(async {
        for key in ["first", "second"] {
            rl.try_lock(key).await.unwrap().release().await.unwrap();
        }
    });
    assert_eq!(
        IO_DISABLED_PANICS.load(Ordering::SeqCst),
        0,
        "tasks panicked (tokio: IO is disabled) while locking on a runtime without I/O"
    );
}

/// A hold of any kind taken on runtime `a` (kept alive) while node 2's proxy holds its
/// acquisition, released from the test's runtime: the release goes on lane A, behind the
/// held acquisition, and the keys are gone once the hold is over.
async fn released_from_another_runtime<G, F, Fut>(keys: &[&str], acquire: F)
where
    G: Guard + Send + 'static,
    F: FnOnce(Redlock) -> Fut + Send + 'static,
    Fut: Future<Output = G> + Send + 'static,
{
    let (faulty, rl, a) = warm_runtime_over_proxies().await;
    faulty.proxy(2).hold_requests_containing(ACQUISITION, HOLD);
    let (a, guard) = on_thread(move || {
        let guard = a.block_on(acquire(rl));
        (a, guard)
    })
    .await;
    let cluster = faulty.cluster();
    for key in keys {
        assert!(!cluster.node(2).exists(key).unwrap(), "staging: node 2's {key} was not held");
    }
    guard.release().await.unwrap();
    for key in keys {
        assert_gone_from_node_2_after_the_hold(cluster, key, "released from another runtime").await;
    }
    on_thread(move || drop(a)).await;
}

// Control (passes on lanes and main): while the acquiring runtime lives, a release sent
// from another runtime keeps its place behind the acquisition, for every kind.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn control_a_plain_lock_released_from_another_runtime_stays_behind_its_acquisition() {
    released_from_another_runtime(&["k"], |rl| async move { rl.try_lock("k").await.unwrap() })
        .await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn control_a_reentrant_hold_released_from_another_runtime_stays_behind_its_acquisition() {
    released_from_another_runtime(&["r"], |rl| async move {
        rl.reentrant("r", "worker-1").await.unwrap()
    })
    .await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn control_a_write_lock_released_from_another_runtime_stays_behind_its_acquisition() {
    released_from_another_runtime(&["w"], |rl| async move { rl.write("w").await.unwrap() }).await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn control_a_multi_lock_released_from_another_runtime_stays_behind_its_acquisition() {
    released_from_another_runtime(&["m1", "m2"], |rl| async move {
        rl.many(&["m1", "m2"]).await.unwrap()
    })
    .await;
}

// Control (passes on lanes and main): the runtime-ended interleaving with a hung node
// instead of a held connection: the release on the new connection times out, the
// counter moved, and the background sends it again until the SET, run when the node
// wakes up, is gone.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn control_a_lock_released_after_its_runtime_ended_is_gone_once_a_hung_node_wakes() {
    let mut cluster = common::cluster(3);
    let rl = common::client(&cluster);
    let a = warm_runtime(&rl).await;
    let wake = cluster.node_mut(2).pause_for(Duration::from_millis(800)).unwrap();
    let taker = rl.clone();
    let lock = on_thread(move || {
        let lock = a.block_on(async {
            let lock = taker.try_lock("k").await.unwrap();
            // Node 2's SET is written (the node is hung: it sits in its socket buffer).
            tokio::time::sleep(Duration::from_millis(20)).await;
            lock
        });
        drop(a);
        lock
    })
    .await;
    let token = lock.token().to_owned();
    lock.release().await.unwrap();
    tokio::task::spawn_blocking(move || wake.join().unwrap()).await.unwrap();
    let gone = common::eventually(Duration::from_secs(4), || {
        cluster.nodes_holding("k", &token).is_empty()
    });
    assert!(gone.await, "left on {:?}", cluster.nodes_holding("k", &token));
}

// Control (passes on lanes and main): fencing tokens follow grant order when grants
// alternate between two multi-thread runtimes (their own lanes), and when the first
// runtime ends between grants.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn control_fencing_tokens_follow_grant_order_across_runtimes() {
    let cluster = common::cluster(3);
    let rl = common::client(&cluster);
    let mut last = 0;
    let mut a = Some(on_thread(|| multi_thread(2)).await);
    for round in 0..4 {
        let (runtime, taker) = (a.take().unwrap(), rl.clone());
        let (runtime, token) = on_thread(move || {
            let token = runtime.block_on(async {
                let lock = taker.try_lock("f").fenced().await.unwrap();
                let token = lock.fencing_token().unwrap();
                lock.release().await.unwrap();
                token
            });
            // The last round ends the runtime: the next grant comes from another lane.
            if round == 3 {
                drop(runtime);
                return (None, token);
            }
            (Some(runtime), token)
        })
        .await;
        a = runtime;
        assert!(token > last, "round {round}: token {token} after {last}");
        last = token;
        let lock = rl.try_lock("f").fenced().await.unwrap();
        let token = lock.fencing_token().unwrap();
        assert!(token > last, "round {round}: token {token} after {last}");
        last = token;
        drop(lock);
        // The dropped lock's release is in the background: wait until "f" is free.
        assert!(common::eventually(Duration::from_secs(2), || cluster.count_key("f") == 0).await);
    }
}

// Control (passes on lanes and main): a waiting writer on runtime A that gives up
// withdraws its intent on every node, while readers are held from another runtime.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn control_a_writer_waiting_on_another_runtime_withdraws_its_intent() {
    let cluster = common::cluster(3);
    let rl = common::client(&cluster);
    let reader = rl.read("doc").await.unwrap();
    let writer = rl.clone();
    let refused = on_thread(move || {
        let a = multi_thread(2);
        let patient = Retry::new()
            .with_delay(Duration::from_millis(50))
            .with_jitter(Duration::from_millis(20))
            .with_max_wait(Duration::from_millis(400));
        let refused = a.block_on(async { writer.write("doc").retry(patient).await.map(drop) });
        drop(a);
        refused
    })
    .await;
    assert!(refused.is_err(), "the writer got in past a held reader");
    let no_intent = || {
        cluster
            .hash_fields("doc")
            .unwrap()
            .iter()
            .flatten()
            .all(|fields| fields.keys().all(|field| !field.starts_with("i:")))
    };
    let withdrawn = common::eventually(Duration::from_secs(2), no_intent).await;
    assert!(withdrawn, "intent left: {:?}", cluster.hash_fields("doc").unwrap());
    reader.release().await.unwrap();
}

// Control (passes on lanes and main): an auto-extended lock stays held while every worker
// of the runtime that took it is blocked, also when that runtime still runs the
// acquisition's request to a lagging node (whose later extensions wait behind it).
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn control_an_auto_extended_lock_stays_held_while_its_runtime_is_blocked_and_a_node_lags() {
    let faulty = FaultyCluster::start(3).unwrap();
    let rl = common::builder_for(faulty.urls(), Duration::from_millis(300))
        .ttl(Duration::from_millis(900))
        .build()
        .unwrap();
    let a = warm_runtime(&rl).await;
    faulty.proxy(2).set_fault(common::latency(60));
    let taker = rl.clone();
    let (a, auto) = on_thread(move || {
        let auto = a.block_on(async { taker.try_lock("job").await.unwrap().auto_extend() });
        (a, auto)
    })
    .await;
    let lease = auto.lease();
    let blocked = block_workers(&a, Duration::from_millis(2700)).await;
    tokio::time::sleep(Duration::from_millis(2500)).await;
    let (held, pttls) = (lease.is_held(), faulty.cluster().pttls("job").unwrap());
    wait_and_end(a, blocked).await;
    assert!(held, "the lease was lost while the nodes were healthy (pttls {pttls:?})");
    assert!(pttls[..2].iter().all(|pttl| pttl.is_some_and(|ms| ms > 0)), "pttls {pttls:?}");
    auto.release().await.unwrap();
}

// Control (passes on lanes and main): shutdown keeps its deadline and never says Ok while
// a dropped lock's keys are left, also when that lock's runtime is blocked.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn control_shutdown_keeps_its_deadline_with_a_release_stuck_behind_a_blocked_runtime() {
    let cluster = common::cluster(3);
    let rl = common::client(&cluster);
    let (a, lock) = taken_on_a_new_runtime(&rl, "k").await;
    let token = lock.token().to_owned();
    let blocked = block_workers(&a, Duration::from_millis(2000)).await;
    drop(lock);
    let started = Instant::now();
    let shut = rl.shutdown(Duration::from_millis(500)).await;
    let took = started.elapsed();
    let left = cluster.nodes_holding("k", &token);
    wait_and_end(a, blocked).await;
    assert!(took < Duration::from_millis(1200), "shutdown(500 ms) took {took:?}");
    assert!(shut.is_err() || left.is_empty(), "shutdown said Ok, the keys are on {left:?}");
}

/// How many connections node `i` accepted since it started.
fn connections_received(cluster: &Cluster, i: usize) -> u64 {
    let info = cluster.node(i).command(&["INFO", "stats"]).unwrap();
    let info: String = redis::from_redis_value(info).unwrap();
    let line = info.lines().find(|line| line.starts_with("total_connections_received:"));
    line.and_then(|line| line.split(':').nth(1)).unwrap().trim().parse().unwrap()
}

// FAILED on a8ad4bb (every run: the busy runtime reconnects twice; passes on main); fixed
// since (see the module doc). Not a
// safety break, but it is what turns the eviction interleaving above into a common one.
//
// `MAX_LANES` says "the lane used longest ago gives its connection up", but
// `Connections::lane` evicts the lane *added* longest ago: a busy long-lived runtime (the
// application's) is evicted every fourth time a short-lived multi-thread runtime (a sync
// wrapper's runtime per call) uses the client, although it used its connection a moment
// ago, while the dead lanes of the runtimes that ended keep their slots. Each eviction of
// the busy lane is a reconnect (connect, SCRIPT LOAD, INFO) and, for whatever that lane
// still had in flight, the undo-on-another-connection interleaving of
// `a_lock_whose_lane_was_evicted_leaves_no_token_behind_a_held_acquisition`.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_busy_runtimes_lane_is_not_evicted_by_runtimes_made_per_call() {
    let cluster = common::cluster(3);
    let rl = common::client(&cluster);
    rl.try_lock("busy").await.unwrap().release().await.unwrap();
    let before = connections_received(&cluster, 0);
    let calls = 8;
    for i in 0..calls {
        let caller = rl.clone();
        on_thread(move || {
            let per_call = multi_thread(2);
            per_call.block_on(async {
                caller.try_lock(&format!("call{i}")).await.unwrap().release().await.unwrap()
            });
        })
        .await;
        rl.try_lock("busy").await.unwrap().release().await.unwrap();
    }
    // Less the connection that read the count.
    let opened = connections_received(&cluster, 0) - before - 1;
    assert!(
        opened <= calls,
        "node 0 accepted {opened} connections for {calls} per-call runtimes: the busy \
         runtime's lane was evicted and reconnected {} times",
        opened - calls
    );
}
