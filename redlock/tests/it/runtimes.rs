//! Locks, releases, extensions and clean-ups across runtimes that end, block or come and go
//! (a sync wrapper's per-call runtime, a helper runtime, a runtime whose workers are blocked):
//! every request goes out on the client's own thread, so a release or drop after the
//! acquiring runtime ended leaves no key behind an acquisition still held up, a lock taken
//! meanwhile is reported as not held, an auto-extended lock stays held while its runtime is
//! blocked, fencing tokens follow grant order, and `shutdown` keeps its deadline.

use crate::common;
use crate::common::runtimes::*;

use std::future::Future;
use std::sync::mpsc;
use std::time::{Duration, Instant};

use redlock::{AutoLock, ErrorKind, Guard, Lock, Redlock, Retry};
use redlock_testkit::{Cluster, FaultyCluster};
use tokio::runtime::Runtime;

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

// A lock taken on a multi-thread runtime that then ends, released from another runtime,
// leaves no token on node 2, whose acquisition was still in flight:
// 1. Runtime A's connections are warm; node 2's proxy holds acquisitions for 1.5 s.
// 2. On A: try_lock("k"): nodes 0 and 1 grant, node 2's SET sits in the proxy. A ends and
//    its connections close with the SET still in flight (the proxy, like TCP, delivers it).
// 3. On the test's runtime: release(). Node 2 has not seen the SET yet, so the release
//    reaches it first, on another connection.
// 4. The proxy delivers the SET: it must not create the released token's key.
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
    assert_left_at_most_for_its_lease(cluster, (2, "k"), HOLD, &what).await;
}

// The same with a dropped guard (no release() call): the drop's release reaches node 2
// before the held SET does.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_lock_dropped_after_its_runtime_ended_leaves_no_token_behind_a_held_acquisition() {
    ended_before_its_release(false).await;
}

// The reentrant kind, same interleaving: its hold (a hash field of its own) must not land
// on node 2 after its release, where it would refuse the other owners for its lease.
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
    assert_left_at_most_for_its_lease(cluster, (2, "r"), HOLD, &what).await;
}

// A refused attempt's clean-up, from a multi-thread runtime that ends right after the
// refusal:
// 1. "k" is held by a foreign owner on nodes 0 and 1; node 2's proxy holds acquisitions.
// 2. On A: try_lock("k") is refused (NotAcquired) while node 2's SET is still held. A
//    ends: its connections close, and the clean-up for node 2 reaches it on another
//    connection before the SET (it finds nothing there).
// 3. The SET lands, written on a connection that closed: the ordering's limit. If it runs
//    after its clean-up, its key holds the refused attempt's token and ends with its lease.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_refused_attempt_from_a_multi_thread_runtime_that_ended_leaves_at_most_its_lease() {
    let (faulty, rl, a) = warm_runtime_over_proxies().await;
    for i in [0, 1] {
        faulty.cluster().node(i).set("k", "foreign").unwrap();
    }
    faulty.proxy(2).hold_requests_containing(ACQUISITION, HOLD);
    let refused = then_end(a, &rl, |rl| async move { rl.try_lock("k").await.map(drop) }).await;
    assert_eq!(refused.unwrap_err().kind(), ErrorKind::NotAcquired);
    assert_left_at_most_for_its_lease(faulty.cluster(), (2, "k"), HOLD, "refused attempt").await;
}

// A runtime's connection given up for newer runtimes, with every runtime alive: the old
// connection still carries the SET in flight; the release goes out on a new one.
// 1. The test's runtime T takes "k"; node 2's SET is held by its proxy (4.5 s).
// 2. Four more multi-thread runtimes lock and release other keys, so that node 2 gives
//    T's connection up (the started-connections counter moves).
// 3. T releases "k" on a new connection: node 2 has not seen the SET yet.
// 4. The SET lands: it must not leave the released token on node 2.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_lock_whose_lane_was_evicted_leaves_no_token_behind_a_held_acquisition() {
    let faulty = FaultyCluster::start(3).unwrap();
    let rl = common::builder_for(faulty.urls(), NODE_TIMEOUT).build().unwrap();
    common::warm(&rl).await;
    // Longer than the others' hold: the four runtimes' connects and rounds must end
    // before the SET lands, and on a loaded machine they once took more than 1.5 s.
    let hold = HOLD * 3;
    faulty.proxy(2).hold_requests_containing(ACQUISITION, hold);
    let lock = rl.try_lock("k").await.unwrap();
    faulty.proxy(2).release_holds();
    let runtimes = more_runtimes(&rl, 4).await;
    let cluster = faulty.cluster();
    assert!(!cluster.node(2).exists("k").unwrap(), "staging: node 2's SET was not held");
    let what = format!("released after its lane was evicted (its token: {})", lock.token());
    lock.release().await.unwrap();
    assert_gone_after_hold(cluster, (2, "k"), hold, &what).await;
    on_thread(move || drop(runtimes)).await;
}

// `release()` must say Ok only when the lock was held until the call. After its runtime
// ended, a lock's release finds its cached connection dead (the send fails before anything
// is written) and is sent again: its "absent" must not be read as "the first send removed
// it", or a lock taken from us meanwhile is reported held.
// 1. Runtime A takes "k" and ends.
// 2. An operator force-releases "k"; another client takes it, works, and releases it.
// 3. The first holder's release() must say NotHeld: with Ok, both clients would believe
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

// The interleaving above with runtime A still alive: the release goes out on A's live
// connection, finds nothing, and says NotHeld.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_release_while_its_runtime_lives_reports_a_lock_taken_meanwhile_as_not_held() {
    let cluster = common::cluster(3);
    let rl = common::client(&cluster);
    let (a, lock) = taken_on_a_new_runtime(&rl, "k").await;
    common::take_over(&cluster, "k").await;
    let released = lock.release().await;
    on_thread(move || drop(a)).await;
    assert_eq!(released.map_err(|err| err.kind()), Err(ErrorKind::NotHeld));
}

// A lock taken on runtime A whose workers are then all busy (synchronous work) is released
// from another runtime, with every node healthy: the release must not depend on A's
// workers (were it sent on a connection only they drive, every node would time out and
// the keys would stay until A runs again, or for the whole lease if it never does).
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_lock_taken_on_a_runtime_whose_workers_are_blocked_is_released_from_another() {
    let cluster = common::cluster(3);
    let rl = common::client(&cluster);
    let taker = rl.clone();
    let (a, lock) = on_thread(move || {
        let a = multi_thread(2);
        let lock = a.block_on(async { taker.try_lock("k").await.unwrap() });
        (a, lock)
    })
    .await;
    let token = lock.token().to_owned();
    // Staging: every node's SET answered (a round is decided by the first two nodes; the
    // third may be behind runtime A's first connect).
    common::held_on(&cluster, "k", &token, &[0, 1, 2]).await;
    let blocked = block_workers(&a, Duration::from_millis(1500)).await;
    let released = lock.release().await;
    // Decided at the quorum too (the test's runtime opens its own connections here): the
    // last node's release may still be on its way. A's workers stay blocked past this wait.
    let gone = || cluster.nodes_holding("k", &token).is_empty();
    common::eventually(Duration::from_millis(800), gone).await;
    let left = cluster.nodes_holding("k", &token);
    wait_and_end(a, blocked).await;
    assert!(
        released.is_ok() && left.is_empty(),
        "release() from another runtime while the acquiring runtime is busy: {released:?}; \
         the token is left on nodes {left:?}"
    );
}

/// A hold of any kind taken on runtime `a` (kept alive) while node 2's proxy holds its
/// acquisition, released from the test's runtime before that acquisition lands: the keys
/// must be gone once the hold is over.
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
        assert_gone_after_hold(cluster, (2, key), HOLD, "released from another runtime").await;
    }
    on_thread(move || drop(a)).await;
}

// While the acquiring runtime lives, a release sent from another runtime before the
// acquisition landed leaves no key behind it, for every kind.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_plain_lock_released_from_another_runtime_stays_behind_its_acquisition() {
    released_from_another_runtime(&["k"], |rl| async move { rl.try_lock("k").await.unwrap() })
        .await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_reentrant_hold_released_from_another_runtime_stays_behind_its_acquisition() {
    released_from_another_runtime(&["r"], |rl| async move {
        rl.reentrant("r", "worker-1").await.unwrap()
    })
    .await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_write_lock_released_from_another_runtime_stays_behind_its_acquisition() {
    released_from_another_runtime(&["w"], |rl| async move { rl.write("w").await.unwrap() }).await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_multi_lock_released_from_another_runtime_stays_behind_its_acquisition() {
    released_from_another_runtime(&["m1", "m2"], |rl| async move {
        rl.many(&["m1", "m2"]).await.unwrap()
    })
    .await;
}

// The runtime-ended interleaving with a hung node instead of a held connection: the
// release on a new connection times out, and the background sends it again, so that
// nothing is left once the node wakes up and runs the SET.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_lock_released_after_its_runtime_ended_is_gone_once_a_hung_node_wakes() {
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

// Fencing tokens follow grant order when grants alternate between two multi-thread
// runtimes (each with its own connections), and when the first runtime ends between
// grants.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn fencing_tokens_follow_grant_order_across_runtimes() {
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
            // The last round ends the runtime: the next grant comes from another connection.
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

// A waiting writer on runtime A that gives up withdraws its intent on every node, while
// readers are held from another runtime.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_writer_waiting_on_another_runtime_withdraws_its_intent() {
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

// An auto-extended lock stays held while every worker of the runtime that took it is
// blocked, also when that runtime still runs the acquisition's request to a lagging node.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn an_auto_extended_lock_stays_held_while_its_runtime_is_blocked_and_a_node_lags() {
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
    let (held, pttls) = (lease.is_valid(), faulty.cluster().pttls("job").unwrap());
    wait_and_end(a, blocked).await;
    assert!(held, "the lease was lost while the nodes were healthy (pttls {pttls:?})");
    assert!(pttls[..2].iter().all(|pttl| pttl.is_some_and(|ms| ms > 0)), "pttls {pttls:?}");
    auto.release().await.unwrap();
}

// Shutdown keeps its deadline and never says Ok while a dropped lock's keys are left, also
// when that lock's runtime is blocked.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn shutdown_keeps_its_deadline_with_a_release_stuck_behind_a_blocked_runtime() {
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

// When runtimes come and go, the connection given up is the one used longest ago: a busy
// long-lived runtime (the application's) keeps its connection while a short-lived
// multi-thread runtime per call (a sync wrapper's) uses the client. Not a safety matter:
// each needless reconnect costs a connect, SCRIPT LOAD and INFO, and sends whatever that
// runtime still had in flight down the interleaving of
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
    // Less the connection that read the count. One more is let pass: with the cores
    // saturated, a short-lived connection more shows up now and then (2 runs in 15, the
    // busy runtime's own connection still there at the end); an evicted busy lane would
    // cost a reconnect per call.
    let opened = connections_received(&cluster, 0) - before - 1;
    assert!(
        opened <= calls + 1,
        "node 0 accepted {opened} connections for {calls} per-call runtimes: the busy \
         runtime's lane was evicted and reconnected {} times",
        opened - calls - 1
    );
}

/// An extension's lease no acquisition carries (acquisitions carry 10000).
const EXTENSION_MS: u64 = 7777;

const EXTENSION: &[u8] = b"\r\n7777\r\n";

// A plain lock's extension heals: extend.lua SETs the key again where it is absent. An
// extension sent from runtime B and the release from the test's runtime T go out on
// different connections. Node 2's proxy holds the extension: it times out, the release
// overtakes it (Ok: the key was there), and the extension then lands on an absent key: it
// must not set it again with the released token (for 7.8 s).
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_plain_lock_extended_from_another_runtime_leaves_no_key_after_its_release() {
    let (faulty, rl, b) = warm_on_two_runtimes(NODE_TIMEOUT).await;
    let lock = rl.try_lock("k").await.unwrap();
    faulty.proxy(2).hold_requests_containing(EXTENSION, HOLD);
    let ext = Duration::from_millis(EXTENSION_MS);
    let (b, lock) = extended_on(b, lock, ext).await;
    let cluster = faulty.cluster();
    let what = format!("released after an extension from another runtime (token {})", lock.token());
    lock.release().await.unwrap();
    // Node 2's release runs before the held extension lands there.
    assert_gone_after_hold(cluster, (2, "k"), HOLD, &what).await;
    end(b).await;
}

// The same with a multi-key lock: multi_extend.lua also sets absent keys again.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_multi_lock_extended_from_another_runtime_leaves_no_key_after_its_release() {
    let (faulty, rl, b) = warm_on_two_runtimes(NODE_TIMEOUT).await;
    let lock = rl.many(&["m1", "m2"]).await.unwrap();
    faulty.proxy(2).hold_requests_containing(EXTENSION, HOLD);
    let ext = Duration::from_millis(EXTENSION_MS);
    let (b, lock) = extended_on(b, lock, ext).await;
    let cluster = faulty.cluster();
    let what = format!(
        "multi lock released after an extension from another runtime (token {})",
        lock.token()
    );
    lock.release().await.unwrap();
    assert_gone_after_hold(cluster, (2, "m1"), HOLD, &what).await;
    assert_gone_after_hold(cluster, (2, "m2"), HOLD, &what).await;
    end(b).await;
}

// The common form: an auto-extended lock (its extensions go out from the client's own
// thread, on that thread's connection), released from the application's multi-thread
// runtime (on that runtime's connection; every acquisition replied). One extension is slow
// on node 2 (held by its proxy, as a TCP retransmission on that one connection would): the
// release overtakes it, and the extension must not set the released key again.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn an_auto_extended_lock_released_from_its_runtime_leaves_no_key_behind_a_slow_extension() {
    let faulty = FaultyCluster::start(3).unwrap();
    let ttl = Duration::from_millis(6000);
    let rl = common::builder_for(faulty.urls(), NODE_TIMEOUT).ttl(ttl).build().unwrap();
    common::warm(&rl).await;
    faulty.proxy(2).hold_requests_containing_any(&common::plain_extensions(), HOLD);
    let auto = rl.try_lock("job").await.unwrap().auto_extend();
    let cluster = faulty.cluster();
    // The first extension has landed on node 0 (its pttl went back up), not on node 2.
    let started = Instant::now();
    let extended = common::eventually(Duration::from_secs(5), || {
        started.elapsed() > Duration::from_millis(300)
            && cluster.node(0).pttl("job").unwrap() > 5700
    });
    assert!(extended.await, "staging: no extension on node 0");
    // Node 2's extension times out (200 ms) before the release is sent there.
    tokio::time::sleep(Duration::from_millis(300)).await;
    assert!(auto.lease().is_valid(), "staging: the lease was lost");
    let what = "auto-extended lock released from its runtime";
    auto.release().await.unwrap();
    assert_gone_after_hold(cluster, (2, "job"), HOLD, what).await;
}

/// Three proxied nodes, a client, and a lock on `key` taken on a multi-thread runtime A that
/// then ended while node 2's proxy holds its acquisition there (it lands after `HOLD`).
async fn lock_of_an_ended_runtime_with_a_held_acquisition(
    key: &'static str,
) -> (FaultyCluster, Redlock, redlock::Lock) {
    let faulty = FaultyCluster::start(3).unwrap();
    let rl = common::builder_for(faulty.urls(), NODE_TIMEOUT).build().unwrap();
    let a = warm_runtime(&rl).await;
    faulty.proxy(2).hold_requests_containing(b"\r\n10000\r\n", HOLD);
    let taker = rl.clone();
    let lock = on_thread(move || {
        let lock = a.block_on(async { taker.try_lock(key).await.unwrap() });
        drop(a);
        lock
    })
    .await;
    assert!(!faulty.cluster().node(2).exists(key).unwrap(), "staging: node 2's SET was not held");
    (faulty, rl, lock)
}

// The release of a lock whose runtime ended finds nothing on node 2 (its SET is still
// held, written on a connection that closed with the runtime); shutdown(500 ms) must keep
// its deadline. The SET may land after the release (the ordering's limit): then its key
// holds the released token and expires with its lease.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn shutdown_keeps_its_deadline_while_an_unconfirmed_release_is_resent() {
    let (faulty, rl, lock) = lock_of_an_ended_runtime_with_a_held_acquisition("k").await;
    lock.release().await.unwrap();
    let started = Instant::now();
    let shut = rl.shutdown(Duration::from_millis(500)).await;
    let took = started.elapsed();
    assert!(took < Duration::from_millis(1200), "shutdown(500 ms) took {took:?}");
    assert!(shut.is_ok(), "the release was confirmed on a quorum: {shut:?}");
    let cluster = faulty.cluster();
    assert_left_at_most_for_its_lease(cluster, (2, "k"), HOLD, "after the shutdown").await;
}

// The background re-sends of an unconfirmed release must not remove a later hold of the
// same key (the same client's next lock, taken while they run).
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_resends_of_an_unconfirmed_release_leave_the_next_hold_alone() {
    let (faulty, rl, lock) = lock_of_an_ended_runtime_with_a_held_acquisition("k").await;
    lock.release().await.unwrap();
    let cluster = faulty.cluster();
    assert_left_at_most_for_its_lease(cluster, (2, "k"), HOLD, "released").await;
    faulty.proxy(2).release_holds();
    // Granted on nodes 0 and 1 at least (node 2 may keep the released key until its lease
    // ends): the re-sends must not remove it anywhere.
    let next = rl.try_lock("k").await.unwrap();
    let granted = cluster.nodes_holding("k", next.token());
    tokio::time::sleep(Duration::from_millis(1500)).await;
    assert_eq!(cluster.nodes_holding("k", next.token()), granted, "the next hold was removed");
    next.release().await.unwrap();
}

// A cached connection that the node closed (CLIENT KILL: the driver has seen EOF) fails
// its send before anything is written, and the release is sent again: its "absent" must
// not be read as "the first send removed it", or release() says Ok for a lock that was
// force-released and held by another client meanwhile.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_release_after_the_nodes_closed_its_connections_reports_a_lock_taken_meanwhile() {
    let cluster = common::cluster(3);
    let rl = common::client(&cluster);
    let staging = || async {
        let lock = rl.try_lock("k").await.unwrap();
        common::kill_clients(&cluster);
        tokio::time::sleep(Duration::from_millis(100)).await;
        common::take_over(&cluster, "k").await;
        assert!(lock.is_valid(), "staging: the lease ran out");
        lock.release().await.map_err(|err| err.kind())
    };
    let what = "release() of a lock another client held meanwhile";
    common::in_three_tries(what, Err(redlock::ErrorKind::NotHeld), staging).await;
}

// Liveness: a lock taken on runtime A while node 2 lags (its acquisition there still
// without a reply), released from the test's runtime while A's workers are all blocked:
// release() returns with the quorum of nodes 0 and 1, and no key is left on node 2 once A
// runs again and its acquisition there has landed.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_release_from_another_runtime_while_the_acquiring_one_is_blocked_and_a_node_lags() {
    let faulty = FaultyCluster::start(3).unwrap();
    let rl = common::builder_for(faulty.urls(), NODE_TIMEOUT).build().unwrap();
    common::warm(&rl).await;
    let a = warm_runtime(&rl).await;
    faulty.proxy(2).set_fault(common::latency(150));
    let taker = rl.clone();
    let (a, lock) = on_thread(move || {
        let lock = a.block_on(async { taker.try_lock("k").await.unwrap() });
        (a, lock)
    })
    .await;
    let token = lock.token().to_owned();
    let blocked = block_workers(&a, Duration::from_millis(1500)).await;
    let started = Instant::now();
    let released = lock.release().await;
    let took = started.elapsed();
    on_thread(move || {
        for task in blocked {
            a.block_on(task).unwrap();
        }
        a.block_on(async { tokio::time::sleep(Duration::from_millis(1000)).await });
        drop(a);
    })
    .await;
    let cluster = faulty.cluster();
    let gone = common::eventually(Duration::from_secs(2), || {
        cluster.nodes_holding("k", &token).is_empty()
    });
    assert!(released.is_ok(), "release(): {released:?}");
    assert!(took < Duration::from_millis(800), "release() took {took:?}");
    assert!(gone.await, "left on {:?}", cluster.nodes_holding("k", &token));
}

// Extensions that timed out, and releases after the nodes closed the connections.

/// A lock on "k" whose two extensions both timed out on nodes 1 and 2 (their proxies hold
/// each for 600 ms), then released: nodes 1 and 2 are *unordered* (two creators each may
/// still land), and their releases are re-sent until the old lease is over (~10 s).
async fn released_after_two_extensions_timed_out_on_a_majority() -> (FaultyCluster, Redlock) {
    let faulty = FaultyCluster::start(3).unwrap();
    let rl = common::builder_for(faulty.urls(), NODE_TIMEOUT).build().unwrap();
    common::warm(&rl).await;
    let mut lock = rl.try_lock("k").await.unwrap();
    for i in [1, 2] {
        faulty.proxy(i).hold_requests_containing(EXTENSION, Duration::from_millis(600));
    }
    let ext = Duration::from_millis(EXTENSION_MS);
    assert!(lock.extend(ext).await.is_err(), "staging: the first extension reached a quorum");
    assert!(lock.is_valid(), "staging: the lease ran out");
    assert!(lock.extend(ext).await.is_err(), "staging: the second extension reached a quorum");
    let _ = lock.release().await;
    (faulty, rl)
}

// After release() returns, nodes 1 and 2 keep re-sending the release for the rest of the
// old lease (50 ms doubling to 1 s). The same client's next acquisitions must not wait
// behind those re-sends: were they queued there, each would time out on nodes 1 and 2
// (200 ms node timeout) and try_lock would fail for up to ~10 s, although every key is
// gone (another client takes the lock at once).
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn after_two_extensions_timed_out_on_a_majority_the_same_client_can_lock_the_key_again() {
    let (faulty, rl) = released_after_two_extensions_timed_out_on_a_majority().await;
    let cluster = faulty.cluster();
    for i in [1, 2] {
        faulty.proxy(i).release_holds();
    }
    // The held extensions and the releases behind them have landed.
    tokio::time::sleep(Duration::from_millis(2000)).await;
    let gone = common::eventually(Duration::from_secs(2), || cluster.count_key("k") == 0);
    assert!(gone.await, "staging: the key stayed: {}", describe(cluster, 2, "k"));
    let mut failures = Vec::new();
    for _ in 0..6 {
        match rl.try_lock("k").await {
            Ok(lock) => lock.release().await.unwrap(),
            Err(err) => failures.push(err.to_string()),
        }
        tokio::time::sleep(Duration::from_millis(250)).await;
    }
    let other = common::builder_for(faulty.urls(), NODE_TIMEOUT).build().unwrap();
    other.try_lock("k").await.expect("another client takes the free key").release().await.unwrap();
    assert!(
        failures.is_empty(),
        "{} of 6 try_lock of a free key by the client that released it failed: {failures:#?}",
        failures.len()
    );
}

// shutdown(500 ms) keeps its deadline while unordered re-sends run for the rest of the old
// lease.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn shutdown_keeps_its_deadline_while_unordered_releases_are_resent() {
    let (faulty, rl) = released_after_two_extensions_timed_out_on_a_majority().await;
    tokio::time::sleep(Duration::from_millis(300)).await;
    let started = Instant::now();
    let _ = rl.shutdown(Duration::from_millis(500)).await;
    let took = started.elapsed();
    assert!(took < Duration::from_millis(1200), "shutdown(500 ms) took {took:?}");
    for i in [1, 2] {
        faulty.proxy(i).release_holds();
    }
    tokio::time::sleep(Duration::from_millis(1500)).await;
    let cluster = faulty.cluster();
    let gone = common::eventually(Duration::from_secs(2), || cluster.count_key("k") == 0);
    assert!(gone.await, "the released key stayed: {}", describe(cluster, 2, "k"));
}

// The lock is taken and released from a task of a ONE-worker multi-thread runtime. Between
// the two, the task keeps the worker busy (synchronous work, as applications do): the
// nodes close every connection (CLIENT KILL), and another client force-releases the lock,
// takes it and releases it. The connections' drivers have not seen the kill when the
// release is sent, so its first try is queued on a connection about to drop: nothing
// tells whether it was written, and the try that follows counts as done whatever it finds
// (`guide::order`: a release sent again cannot tell its own removal from a forced one).
#[test]
fn a_release_queued_before_the_driver_saw_the_nodes_close_counts_as_done() {
    let released = release_after_a_kill_and_a_takeover_meanwhile(false);
    assert_eq!(released, Ok(()), "release() queued on connections about to drop");
}

// The same, but the task awaits 100 ms before the release: the drivers run, see the EOF
// and end; the first try is refused before anything is written, so the next one is exact
// and the release says NotHeld. Refused at once is told by the time the refusal took
// (`timing::UNWRITTEN_WITHIN`): a caller's thread preempted in that very poll counts it
// maybe written and says Ok; so does a debug build's slow first poll on a loaded host
// (seen three times in a row on a fresh clone's run), so the staging gets six tries.
#[test]
fn a_release_after_the_drivers_saw_the_kill_reports_not_held() {
    let mut answers = Vec::new();
    for _ in 0..6 {
        let released = release_after_a_kill_and_a_takeover_meanwhile(true);
        if released == Err(redlock::ErrorKind::NotHeld) {
            return;
        }
        answers.push(released);
    }
    panic!("release() of a lock another client held meanwhile, six times: {answers:?}");
}

/// [`a_release_queued_before_the_driver_saw_the_nodes_close_counts_as_done`]'s
/// staging, and what the release answered; `yield_first`: the task awaits (lets the
/// drivers run) before the release.
fn release_after_a_kill_and_a_takeover_meanwhile(
    yield_first: bool,
) -> Result<(), redlock::ErrorKind> {
    let cluster = common::cluster(3);
    let rl = common::client(&cluster);
    let runtime = multi_thread(1);
    let urls = cluster.urls();
    let kill = cluster.urls();
    let task = runtime.spawn(async move {
        let lock = rl.try_lock("k").await.unwrap();
        // From here to the release's first poll, this task keeps the only worker.
        for url in &kill {
            let client = redis::Client::open(url.as_str()).unwrap();
            let mut con = client.get_connection().unwrap();
            let _: redis::Value = redis::cmd("CLIENT")
                .arg(&["KILL", "SKIPME", "yes", "TYPE", "normal"])
                .query(&mut con)
                .unwrap();
        }
        std::thread::spawn(move || {
            let other = multi_thread(1);
            other.block_on(async {
                let rl = common::builder_for(urls, NODE_TIMEOUT).build().unwrap();
                assert_eq!(rl.force_release("k").await.unwrap(), 3);
                rl.try_lock("k").await.unwrap().release().await.unwrap();
            });
        })
        .join()
        .unwrap();
        if yield_first {
            tokio::time::sleep(Duration::from_millis(100)).await;
        } else {
            std::thread::sleep(Duration::from_millis(100));
        }
        assert!(lock.is_valid(), "staging: the lease ran out");
        lock.release().await.map_err(|err| err.kind())
    });
    // Queued before its driver saw the close, the first send may have been written: sent
    // again, it counts as done (`guide::order`). Refused at once, it was not: exact.
    runtime.block_on(task).unwrap()
}

// Lease 2 s. Node 2's proxy holds E1 (an extension from runtime B, on B's connection) for
// 3 s, then E2 (from the test's runtime T, on T's) for 500 ms. Both time out (200 ms), so
// two extensions may still land on node 2; the release from T is re-sent until
// max(t0 + 2 s, t(E2) + 1.5 s) + drift. E1 lands at t(E1) + 3 s, after the last re-send,
// on the released (absent) key: extend.lua must not set it again with the released token.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_healing_extension_landing_after_the_resends_leaves_no_key() {
    let faulty = FaultyCluster::start(3).unwrap();
    let rl = common::builder_for(faulty.urls(), NODE_TIMEOUT)
        .ttl(Duration::from_millis(2000))
        .build()
        .unwrap();
    common::warm(&rl).await;
    let b = warm_runtime(&rl).await;
    let ext = Duration::from_millis(1500);
    let needle = b"\r\n1500\r\n";
    let lock = rl.try_lock("k").await.unwrap();
    let t0 = Instant::now();
    faulty.proxy(2).hold_requests_containing(needle, Duration::from_millis(3000));
    let (b, mut lock) = on_thread(move || {
        let mut lock = lock;
        b.block_on(async { lock.extend(ext).await.unwrap() });
        (b, lock)
    })
    .await;
    faulty.proxy(2).hold_requests_containing(needle, Duration::from_millis(500));
    lock.extend(ext).await.unwrap();
    let token = lock.token().to_owned();
    lock.release().await.unwrap();
    let cluster = faulty.cluster();
    // E1 lands at ~t0 + 3 s; the re-sends stop at ~t0 + 2.1 s.
    while t0.elapsed() < Duration::from_millis(3600) {
        tokio::time::sleep(Duration::from_millis(50)).await;
    }
    let left = cluster.node(2).get("k").unwrap();
    let pttl = cluster.node(2).pttl("k").unwrap();
    end(b).await;
    assert_ne!(
        left.as_deref(),
        Some(token.as_str()),
        "node 2 holds the released lock's token again, pttl {pttl} ms (an extension landed \
         after the release's last re-send)"
    );
}

// 1. "k" taken on the test's runtime T (every node replied). Node 2's proxy holds requests
//    carrying 7777 (the extension's lease).
// 2. On runtime B: extend(7777 ms). Nodes 0, 1: Ok; node 2's extension sits in the proxy
//    and times out: it may land later. B ends: its connections close, the extension still
//    in flight (the proxy delivers what the client wrote before closing).
// 3. On T: release(). Node 2's release goes out on a new connection, finds the key (the
//    acquisition's) and deletes it: Ok, answered at once, so not sent again.
// 4. The held extension lands on an absent key: extend.lua must not SET it again with the
//    released token.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_plain_lock_extended_on_a_runtime_that_then_ended_leaves_no_key_after_its_release() {
    let (faulty, rl, b) = warm_on_two_runtimes(NODE_TIMEOUT).await;
    let lock = rl.try_lock("k").await.unwrap();
    faulty.proxy(2).hold_requests_containing(EXTENSION, HOLD);
    let ext = Duration::from_millis(EXTENSION_MS);
    let (b, lock) = extended_on(b, lock, ext).await;
    end(b).await;
    faulty.proxy(2).release_holds();
    let cluster = faulty.cluster();
    let what = format!("released after an extension on a runtime that ended ({})", lock.token());
    lock.release().await.unwrap();
    assert_gone_after_hold(cluster, (2, "k"), HOLD, &what).await;
}

// The same with a multi-key lock (multi_extend.lua heals too).
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_multi_lock_extended_on_a_runtime_that_then_ended_leaves_no_key_after_its_release() {
    let (faulty, rl, b) = warm_on_two_runtimes(NODE_TIMEOUT).await;
    let lock = rl.many(&["m1", "m2"]).await.unwrap();
    faulty.proxy(2).hold_requests_containing(EXTENSION, HOLD);
    let ext = Duration::from_millis(EXTENSION_MS);
    let (b, lock) = extended_on(b, lock, ext).await;
    end(b).await;
    faulty.proxy(2).release_holds();
    let cluster = faulty.cluster();
    lock.release().await.unwrap();
    assert_gone_after_hold(cluster, (2, "m1"), HOLD, "multi lock, extension on an ended runtime")
        .await;
    assert!(!cluster.node(2).exists("m2").unwrap(), "m2: {}", describe(cluster, 2, "m2"));
}

// No runtime ends: the extension's connection is given up for four newer runtimes.
// 1-2. As above, but B stays alive; its extension on node 2 is held and times out.
// 3. Four more runtimes lock and release other keys: node 2 gives B's connection up (used
//    longest ago).
// 4. On T: release(). Node 2's release, on a new connection, overtakes the held extension
//    and deletes the key: Ok, not sent again. The extension then lands and must not set
//    the key again.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_plain_lock_whose_extension_lane_was_evicted_leaves_no_key_after_its_release() {
    let (faulty, rl, b) = warm_on_two_runtimes(NODE_TIMEOUT).await;
    let lock = rl.try_lock("k").await.unwrap();
    faulty.proxy(2).hold_requests_containing(EXTENSION, HOLD);
    let ext = Duration::from_millis(EXTENSION_MS);
    let (b, lock) = extended_on(b, lock, ext).await;
    faulty.proxy(2).release_holds();
    let runtimes = more_runtimes(&rl, 4).await;
    let cluster = faulty.cluster();
    let what = format!("released after its extension's lane was evicted ({})", lock.token());
    lock.release().await.unwrap();
    assert_gone_after_hold(cluster, (2, "k"), HOLD, &what).await;
    on_thread(move || drop((b, runtimes))).await;
}

// Only the acquisition is held; the extension that overtakes it heals the key.
// 1. On runtime B: try_lock("k"). Nodes 0, 1 grant; node 2's SET NX is held by the proxy
//    and times out: it may land later. B ends.
// 2. On T: extend(7777 ms). Node 2, on a new connection: the key is absent, extend.lua
//    SETs it (heals): Ok.
// 3. On T: release(). The key is there (the extension's): deleted, Ok, not sent again.
// 4. The held SET NX lands on an absent key: it must not leave the released token there
//    for 10 s.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_lock_healed_after_its_runtime_ended_leaves_no_key_behind_its_held_acquisition() {
    let (faulty, rl, b) = warm_on_two_runtimes(NODE_TIMEOUT).await;
    faulty.proxy(2).hold_requests_containing(ACQUISITION, HOLD);
    let taker = rl.clone();
    let mut lock = on_thread(move || {
        let lock = b.block_on(async { taker.try_lock("k").await.unwrap() });
        drop(b);
        lock
    })
    .await;
    faulty.proxy(2).release_holds();
    let cluster = faulty.cluster();
    assert!(!cluster.node(2).exists("k").unwrap(), "staging: node 2's SET was not held");
    lock.extend(Duration::from_millis(EXTENSION_MS)).await.unwrap();
    // The extension may have returned on the quorum of nodes 0 and 1: its heal on node 2
    // follows on a connection still opening.
    let healed = common::eventually(Duration::from_millis(800), || {
        cluster.node(2).pttl("k").unwrap() > 7000
    });
    let healed = healed.await;
    let what =
        format!("released after a healing extension (healed: {healed}; token {})", lock.token());
    lock.release().await.unwrap();
    assert_left_at_most_for_its_lease(cluster, (2, "k"), HOLD, &what).await;
}

// Undos handed over to the client's own thread when their runtime ends.

/// How a short-lived runtime ends.
#[derive(Clone, Copy, Debug)]
enum End {
    Drop,
    Background,
    TimeoutZero,
}

/// Runs `fut` on a short-lived multi-thread runtime (2 workers) of its own thread, ended
/// per `end` as soon as `fut` is over.
fn on_short_multi_thread<T: Send + 'static>(
    end: End,
    fut: impl Future<Output = T> + Send + 'static,
) -> T {
    std::thread::spawn(move || {
        let runtime = tokio::runtime::Builder::new_multi_thread()
            .worker_threads(2)
            .enable_all()
            .build()
            .unwrap();
        let output = runtime.block_on(fut);
        match end {
            End::Drop => drop(runtime),
            End::Background => runtime.shutdown_background(),
            End::TimeoutZero => runtime.shutdown_timeout(Duration::ZERO),
        }
        output
    })
    .join()
    .unwrap()
}

/// Asserts a2's token is not on node 4 once the hold is over (and the key gone everywhere).
async fn assert_not_left(cluster: &Cluster, key: &str, token: &str, what: &str) {
    tokio::time::sleep(Duration::from_millis(700)).await;
    let left = cluster.node(4).get(key).unwrap();
    assert_ne!(
        left.as_deref(),
        Some(token),
        "{what}: a2 was released, its key is on node 4 (pttl {} ms); nodes holding it: {:?}",
        cluster.node(4).pttl(key).unwrap(),
        cluster.nodes_holding(key, token)
    );
    let gone = common::eventually(Duration::from_secs(2), || cluster.count_key(key) == 0).await;
    assert!(gone, "{what}: {key} left on nodes {:?}", cluster.nodes_with_key(key).unwrap());
}

/// A release handed over from a short-lived multi-thread runtime, ended three ways (drop,
/// `shutdown_background`, `shutdown_timeout(0)`): the background task holding a2's release
/// on node 4 is dropped on a worker thread (at once or in the background), and a2's
/// acquisition there, sent before it, must not leave a2's token behind.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_release_handed_over_from_a_multi_thread_runtime_waits_for_the_set() {
    let (faulty, rl) = common::five_slowed_nodes(Duration::from_secs(2)).await;
    let cluster = faulty.cluster();
    for end in [End::Drop, End::Background, End::TimeoutZero] {
        let key = format!("mt-{end:?}");
        let hold = Duration::from_millis(400);
        let a2 = common::lock_behind_an_unsent_acquisition(&faulty, &rl, &key, hold).await;
        let token = a2.token().to_string();
        on_short_multi_thread(end, async move { a2.release().await }).unwrap();
        assert_not_left(cluster, &key, &token, &format!("{end:?}")).await;
    }
}

/// The guard is dropped by its runtime's shutdown (it lives in a task that never
/// ends). `Drop` then builds the release in the middle of the shutdown: its background task
/// is spawned onto a runtime that is closing (dropped before its first poll: `Unfinished`
/// and the unpolled `Rest` drop in the unresumed state's order), or on the client's thread.
/// Either way the release must land after a2's unsent acquisition. Current-thread and
/// multi-thread runtimes.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_guard_dropped_by_its_runtimes_shutdown_stays_behind_the_set() {
    let (faulty, rl) = common::five_slowed_nodes(Duration::from_secs(2)).await;
    let cluster = faulty.cluster();
    for multi in [false, true] {
        let key = format!("shut-{multi}");
        let hold = Duration::from_millis(400);
        let a2 = common::lock_behind_an_unsent_acquisition(&faulty, &rl, &key, hold).await;
        let token = a2.token().to_string();
        let park = async move {
            tokio::spawn(async move {
                let _held = a2;
                std::future::pending::<()>().await
            });
            tokio::time::sleep(Duration::from_millis(5)).await;
        };
        if multi {
            on_short_multi_thread(End::Drop, park);
        } else {
            common::on_short_runtime(park);
        }
        assert_not_left(cluster, &key, &token, &format!("multi={multi}")).await;
    }
}

/// The acquisition a handed-over release follows lives on a second
/// short-lived runtime A (the staging runs there), which ends before or after the release's
/// runtime B. Both orders: nothing may be left on node 4, and nothing may wait for long.
#[test]
fn the_acquisitions_runtime_ending_before_or_after_the_releases_keeps_the_order() {
    let main =
        tokio::runtime::Builder::new_multi_thread().worker_threads(2).enable_all().build().unwrap();
    let (faulty, rl) = main.block_on(common::five_slowed_nodes(Duration::from_secs(2)));
    for a_first in [true, false] {
        let key = format!("two-{a_first}");
        let (given, a2) = mpsc::channel();
        let (end_a, ended) = mpsc::channel::<()>();
        let staging = std::thread::scope(|scope| {
            let (faulty, rl, key) = (&faulty, &rl, &key);
            let runtime_a = scope.spawn(move || {
                let runtime =
                    tokio::runtime::Builder::new_current_thread().enable_all().build().unwrap();
                let hold = Duration::from_millis(400);
                let lock = runtime
                    .block_on(common::lock_behind_an_unsent_acquisition(faulty, rl, key, hold));
                given.send(lock).unwrap();
                // A idles (its tasks unpolled) until told to end.
                ended.recv().unwrap();
                drop(runtime);
            });
            let a2 = a2.recv().unwrap();
            let token = a2.token().to_string();
            if a_first {
                end_a.send(()).unwrap();
                runtime_a.join().unwrap();
                common::on_short_runtime(async move { a2.release().await }).unwrap();
            } else {
                common::on_short_runtime(async move { a2.release().await }).unwrap();
                std::thread::sleep(Duration::from_millis(100));
                end_a.send(()).unwrap();
                runtime_a.join().unwrap();
            }
            token
        });
        let what = format!("A ended first: {a_first}");
        main.block_on(assert_not_left(faulty.cluster(), &key, &staging, &what));
    }
    let started = Instant::now();
    main.block_on(rl.shutdown(Duration::from_secs(3))).unwrap();
    assert!(
        started.elapsed() < Duration::from_millis(500),
        "shutdown waited {:?}",
        started.elapsed()
    );
}

/// The acquisition a handed-over release follows lives on a current-thread runtime A that
/// is alive but idle (a synchronous wrapper between two `block_on`), so it is still unsent
/// when the release goes out. `shutdown(within)` must return by its deadline (naming node
/// 4), and once A runs again, sending that acquisition 1.5 s past its node timeout, a2's
/// key must not stay on node 4.
#[test]
fn a_handover_behind_an_idle_runtime_waits_for_it_and_shutdown_keeps_its_deadline() {
    let runtime_a = tokio::runtime::Builder::new_current_thread().enable_all().build().unwrap();
    let node_timeout = Duration::from_millis(500);
    let key = "idle";
    let (faulty, rl, a2) = runtime_a.block_on(async {
        let (faulty, rl) = common::five_slowed_nodes(node_timeout).await;
        let hold = Duration::from_millis(300);
        let a2 = common::lock_behind_an_unsent_acquisition(&faulty, &rl, key, hold).await;
        (faulty, rl, a2)
    });
    let cluster = faulty.cluster();
    let token = a2.token().to_string();
    common::on_short_runtime(async move { a2.release().await }).unwrap();
    // Idle A for three node timeouts: the hold is long over.
    std::thread::sleep(node_timeout * 3);
    let shut = rl.clone();
    let started = Instant::now();
    let result =
        common::on_short_runtime(async move { shut.shutdown(Duration::from_millis(300)).await });
    let waited = started.elapsed();
    eprintln!("shutdown while A idles: {waited:?}, {result:?}");
    assert!(waited < Duration::from_millis(600), "shutdown waited {waited:?}");
    // Released on a quorum: `Ok`, naming node 4, where a release was still in flight.
    let report = result.expect("released on a quorum");
    let node4 = faulty.urls()[4].trim_start_matches("redis://").to_string();
    let unconfirmed: Vec<&str> = report.unconfirmed().map(|node| node.node()).collect();
    assert_eq!(unconfirmed, [format!("{node4}/0")], "{report}");
    // A runs again: a1's acquisition completes, a1's release goes, a2's acquisition times
    // out unsent (its node timeout passed while A idled), a2's release goes.
    runtime_a.block_on(async {
        let gone = common::eventually(Duration::from_secs(2), || cluster.count_key(key) == 0).await;
        assert!(
            gone,
            "left on {:?}; a2's on {:?}",
            cluster.nodes_with_key(key).unwrap(),
            cluster.nodes_holding(key, &token)
        );
        rl.shutdown(Duration::from_secs(2)).await.unwrap();
    });
}

/// A waiting writer (retry policy, so an intent and a withdrawal) gives up on a
/// short-lived runtime; its failed attempt's clean-up on node 4 waits there behind its
/// unsent acquisition (itself behind the client's earlier write lock's release) and is
/// handed over when the runtime ends, while the withdrawal runs on the client's thread
/// after that clean-up. Nothing of the attempt (grant or intent) may stay on any node.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_writer_giving_up_on_a_short_lived_runtime_leaves_no_grant_nor_intent() {
    let (faulty, rl) = common::five_slowed_nodes(Duration::from_secs(2)).await;
    let cluster = faulty.cluster();
    // A reader on nodes 0-2 only, through a client of its own.
    let readers =
        common::builder_for(faulty.urls()[..3].to_vec(), Duration::from_secs(1)).build().unwrap();
    for multi in [false, true] {
        let key = format!("writer-{multi}");
        faulty.proxy(4).hold_requests_containing(key.as_bytes(), Duration::from_millis(400));
        let w1 = rl.write(&key).once().await.unwrap();
        faulty.proxy(4).release_holds();
        w1.release().await.unwrap();
        let reader = readers.read(&key).once().await.unwrap();
        let reader_field = reader.field().to_string();
        // Staging: the reader's share is on all of nodes 0-2, a quorum of five (its round
        // is decided by two of three): with one still on its way, the writer could take
        // that node and nodes 3-4.
        let shared = || {
            let fields = cluster.hash_fields(&key).unwrap();
            fields[..3].iter().all(|f| f.as_ref().is_some_and(|f| f.contains_key(&reader_field)))
        };
        assert!(common::eventually(Duration::from_secs(2), shared).await, "staging");
        let (rl2, key2) = (rl.clone(), key.clone());
        let attempt = async move {
            let retry = Retry::new().with_max_attempts(1).with_delay(Duration::from_millis(10));
            rl2.write(&key2).retry(retry).await.map(|_| ())
        };
        let result = if multi {
            on_short_multi_thread(End::Drop, attempt)
        } else {
            common::on_short_runtime(attempt)
        };
        let err = result.expect_err("a reader holds a quorum");
        assert_eq!(err.kind(), ErrorKind::NotAcquired, "{err}");
        tokio::time::sleep(Duration::from_millis(700)).await;
        let only_reader = common::eventually(Duration::from_secs(2), || {
            cluster.hash_fields(&key).unwrap().iter().enumerate().all(|(i, fields)| {
                let fields: Vec<&String> = fields.iter().flatten().map(|(f, _)| f).collect();
                if i < 3 { fields == [&reader_field] } else { fields.is_empty() }
            })
        })
        .await;
        assert!(only_reader, "multi={multi}: {:?}", cluster.hash_fields(&key).unwrap());
        reader.release().await.unwrap();
    }
}

/// A chain across three runtimes: an extension left on node 4 by a first short-lived
/// runtime (dropped with it), then the release from a second one, handed over: nothing of
/// a2's stays on nodes 0-3, and on node 4 at most its own key until its lease ends.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn an_extension_and_a_release_from_two_short_lived_runtimes_leave_at_most_the_extended_lease()
{
    let (faulty, rl) = common::five_slowed_nodes(Duration::from_secs(2)).await;
    let cluster = faulty.cluster();
    let key = "ext";
    let hold = Duration::from_millis(400);
    let a2 = common::lock_behind_an_unsent_acquisition(&faulty, &rl, key, hold).await;
    let token = a2.token().to_string();
    let a2 = common::on_short_runtime(async move {
        let mut a2 = a2;
        a2.extend(Duration::from_secs(10)).await.unwrap();
        a2
    });
    on_short_multi_thread(End::Drop, async move { a2.release().await }).unwrap();
    // The first runtime ended with the extension written (the ordering's limit): node 4 may
    // keep a2's key, with its token, for at most the 10 s it was extended to.
    tokio::time::sleep(Duration::from_millis(800)).await;
    let left = cluster.node(4).get(key).unwrap();
    assert!(left.is_none() || left.as_deref() == Some(token.as_str()), "{left:?}");
    assert!(cluster.node(4).pttl(key).unwrap() <= 10_000);
    for i in 0..4 {
        assert!(!cluster.node(i).exists(key).unwrap(), "left on node {i}");
    }
}

// Auto-extension and refused attempts on runtimes that end.

/// Interleaving (3 nodes):
/// 1. A helper thread runs a current-thread runtime, takes "k" (10 s lease) and calls
///    `auto_extend()`; the `AutoLock` is returned out of the thread and the helper runtime
///    is dropped (its tasks with it).
/// 2. The dropped extender drops its guard: the lock is released on every node.
/// 3. The main runtime keeps the `AutoLock`: its lease must not say held (~9.9 s left)
///    with `lost()` silent while a second client is granted "k".
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]

async fn an_auto_lock_outliving_its_runtime_never_reports_held_while_released() {
    let cluster = common::cluster(3);
    let rl = common::client(&cluster);
    let helper = {
        let rl = rl.clone();
        std::thread::spawn(move || -> AutoLock<Lock> {
            let runtime =
                tokio::runtime::Builder::new_current_thread().enable_all().build().unwrap();
            runtime.block_on(async move { rl.try_lock("k").await.unwrap().auto_extend() })
        })
    };
    let auto = helper.join().unwrap();
    let lease = auto.lease();

    tokio::time::sleep(Duration::from_millis(300)).await;
    let lost_fired = tokio::time::timeout(Duration::from_millis(10), lease.lost()).await.is_ok();
    let other = common::client(&cluster);
    let second = other.try_lock("k").await;
    assert!(
        second.is_err() || lost_fired || !lease.is_valid(),
        "a second client holds \"k\" while the first one's lease is held for {:?} and \
         lost() has not fired (keys now on {:?})",
        lease.validity(),
        cluster.nodes_with_key("k").unwrap(),
    );
    drop(auto);
}

/// A refused attempt's clean-up must outlive the caller's runtime: the docs say "a refused
/// attempt releases its token on every node that may hold it, including nodes that never
/// answered", also when that runtime shuts down right after the call returned while the
/// attempt's `SET` is still in flight on a hung node.
///
/// Interleaving (3 nodes): the main runtime opens the connections; "k" is held by a
/// foreign owner on nodes 0 and 1; node 2 is paused; a helper runtime's `try_lock("k")` is
/// refused by nodes 0 and 1 while its `SET` waits in node 2's socket buffer; the helper
/// runtime ends; node 2 resumes and runs the `SET`: the token must not stay there.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]

async fn a_refused_attempt_from_a_short_lived_runtime_leaves_no_key() {
    let mut cluster = common::cluster(3);
    let rl = common::client(&cluster);
    rl.try_lock("warm-up").await.unwrap().release().await.unwrap();
    for i in [0, 1] {
        cluster.node(i).set("k", "foreign").unwrap();
    }
    let wake = cluster.node_mut(2).pause_for(Duration::from_millis(500)).unwrap();
    let helper = {
        let rl = rl.clone();
        std::thread::spawn(move || {
            let runtime =
                tokio::runtime::Builder::new_current_thread().enable_all().build().unwrap();
            runtime.block_on(async move { rl.try_lock("k").await.map(drop) })
        })
    };
    let err = helper.join().unwrap().unwrap_err();
    assert_eq!(err.kind(), redlock::ErrorKind::NotAcquired, "{err}");
    wake.join().unwrap();
    tokio::time::sleep(Duration::from_millis(700)).await;
    let left = cluster.node(2).get("k").unwrap();
    assert_eq!(
        left,
        None,
        "the refused attempt's token is still on node 2 (pttl {} ms)",
        cluster.node(2).pttl("k").unwrap()
    );
}

// Runtimes that opened the connections, then ended.

// A refused attempt from a short-lived runtime that opened the connections leaves no key.
// Interleaving (3 nodes, node timeout 200 ms, no network fault at all):
// 1. A helper thread's current-thread runtime is the client's first user: it opens the
//    connections.
// 2. "k" is held by a foreign owner on nodes 0 and 1; node 2 is paused (500 ms).
// 3. The helper's try_lock("k") is refused by nodes 0 and 1 (NotAcquired); its SET is in
//    node 2's socket buffer.
// 4. The helper runtime ends, and node 2's socket with it.
// 5. The clean-up for node 2 is sent on a new connection whose connect hangs on the paused
//    node and times out: it must be tried again.
// 6. Node 2 wakes up and runs the SET: the key must not stay for its whole 10 s lease.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_refused_attempt_from_a_runtime_that_opened_the_connections_leaves_no_key() {
    let mut cluster = common::cluster(3);
    let rl = common::client(&cluster);
    let warm = {
        let rl = rl.clone();
        std::thread::spawn(move || {
            let runtime =
                tokio::runtime::Builder::new_current_thread().enable_all().build().unwrap();
            runtime.block_on(async move {
                rl.try_lock("warm-up").await.unwrap().release().await.unwrap();
            });
            runtime
        })
    };
    // Keep the helper runtime (and the drivers on it) alive until the attempt.
    let runtime = warm.join().unwrap();
    for i in [0, 1] {
        cluster.node(i).set("k", "foreign").unwrap();
    }
    let wake = cluster.node_mut(2).pause_for(Duration::from_millis(500)).unwrap();
    let helper = {
        let rl = rl.clone();
        std::thread::spawn(move || {
            let result = runtime.block_on(async move {
                let result = rl.try_lock("k").await.map(drop);
                // A little more work on this runtime (its drivers flush the SET).
                tokio::time::sleep(Duration::from_millis(20)).await;
                result
            });
            drop(runtime);
            result
        })
    };
    let err = helper.join().unwrap().unwrap_err();
    assert_eq!(err.kind(), redlock::ErrorKind::NotAcquired, "{err}");
    wake.join().unwrap();
    tokio::time::sleep(Duration::from_millis(1000)).await;
    let left = cluster.node(2).get("k").unwrap();
    assert_eq!(
        left,
        None,
        "the refused attempt's token is still on node 2 (pttl {} ms)",
        cluster.node(2).pttl("k").unwrap()
    );
}

// The same for a release: a lock taken and released from a short-lived runtime that
// opened the connections, while node 2 is hung, with an extension in flight there before
// the release (so the release is not yet written when the runtime ends). The release's
// try on a new connection to the hung node times out and must be tried again: `release()`
// returns Ok, and node 2 must not keep the key for the extension's whole 20 s lease.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_release_from_a_runtime_that_opened_the_connections_leaves_no_key() {
    let mut cluster = common::cluster(3);
    let rl = common::client(&cluster);
    let (runtime, mut lock) = {
        let rl = rl.clone();
        std::thread::spawn(move || {
            let runtime =
                tokio::runtime::Builder::new_current_thread().enable_all().build().unwrap();
            let lock = runtime.block_on(async move {
                let lock = rl.try_lock("r").await.unwrap();
                // Lets the last node's SET finish on this runtime.
                tokio::time::sleep(Duration::from_millis(300)).await;
                lock
            });
            (runtime, lock)
        })
        .join()
        .unwrap()
    };
    let token = lock.token().to_owned();
    let all = || cluster.nodes_holding("r", &token).len() == 3;
    assert!(common::eventually(Duration::from_secs(1), all).await);
    let wake = cluster.node_mut(2).pause_for(Duration::from_millis(600)).unwrap();
    let helper = std::thread::spawn(move || {
        let result = runtime.block_on(async move {
            lock.extend(Duration::from_secs(20)).await?;
            let released = lock.release().await;
            tokio::time::sleep(Duration::from_millis(20)).await;
            released
        });
        drop(runtime);
        result
    });
    helper.join().unwrap().unwrap();
    wake.join().unwrap();
    tokio::time::sleep(Duration::from_millis(1000)).await;
    let left = cluster.node(2).get("r").unwrap();
    assert_ne!(
        left.as_deref(),
        Some(token.as_str()),
        "the released lock's key is still on node 2 (pttl {} ms)",
        cluster.node(2).pttl("r").unwrap()
    );
}

// An auto-extended lock stays held with every node healthy when the connections were
// opened by a runtime that is kept but not driven (the usual sync wrapper: one runtime kept
// in a struct, `block_on` per call): the extender's requests must not depend on that idle
// runtime, or every extension times out and the lease ends at its first deadline.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn an_auto_extended_lock_from_a_sync_wrapper_runtime_stays_held_while_nodes_are_healthy() {
    let cluster = common::cluster(3);
    let rl = common::builder(&cluster, Duration::from_millis(100))
        .ttl(Duration::from_millis(600))
        .build()
        .unwrap();
    // The sync wrapper: a runtime kept alive, entered only during calls.
    let (runtime, auto) = std::thread::spawn(move || {
        let runtime = tokio::runtime::Builder::new_current_thread().enable_all().build().unwrap();
        let auto = runtime.block_on(async move {
            let lock = rl.try_lock("job").await.unwrap();
            tokio::time::sleep(Duration::from_millis(50)).await;
            lock.auto_extend()
        });
        (runtime, auto)
    })
    .join()
    .unwrap();
    let lease = auto.lease();
    // Three leases later, with every node up and fast.
    tokio::time::sleep(Duration::from_millis(1800)).await;
    let held = lease.is_valid();
    let pttls = cluster.pttls("job").unwrap();
    drop(auto);
    std::thread::spawn(move || drop(runtime)).join().unwrap();
    assert!(held, "the lease was lost with every node healthy (pttls {pttls:?})");
}

// The test above with the helper runtime kept running.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn an_auto_extended_lock_from_a_driven_runtime_stays_held() {
    let cluster = common::cluster(3);
    let rl = common::builder(&cluster, Duration::from_millis(100))
        .ttl(Duration::from_millis(600))
        .build()
        .unwrap();
    let (tx, rx) = std::sync::mpsc::channel();
    let driver = std::thread::spawn(move || {
        let runtime = tokio::runtime::Builder::new_current_thread().enable_all().build().unwrap();
        runtime.block_on(async move {
            let lock = rl.try_lock("job").await.unwrap();
            tx.send(lock.auto_extend()).unwrap();
            tokio::time::sleep(Duration::from_millis(2500)).await;
        });
    });
    let auto = rx.recv().unwrap();
    let lease = auto.lease();
    tokio::time::sleep(Duration::from_millis(1800)).await;
    assert!(lease.is_valid());
    drop(auto);
    tokio::task::spawn_blocking(move || driver.join().unwrap()).await.unwrap();
}

// Releases and drops handed over from another runtime.

/// The request a handed-over release undoes need not have died with the releasing
/// runtime. Here a2's SET on node 4, still waiting for its turn behind a1's release, lives
/// on the main runtime; a2 is released from a short-lived runtime, whose end hands a2's
/// release over to the client's thread, so the release can reach node 4 before the SET:
/// SET(a1) [held by the proxy], release(a2), release(a1), SET(a2). a2's key must not stay
/// on node 4 for its whole lease.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_release_handed_over_from_another_runtime_waits_for_the_set_it_undoes() {
    let (faulty, rl) = common::five_slowed_nodes(Duration::from_secs(2)).await;
    let cluster = faulty.cluster();
    let key = "cross";
    // a2's SET on node 4 waits (unsent, on this runtime) behind a1's release there.
    let a2 =
        common::lock_behind_an_unsent_acquisition(&faulty, &rl, key, Duration::from_millis(600))
            .await;
    let token = a2.token().to_string();
    common::on_short_runtime(async move { a2.release().await }).unwrap();
    tokio::time::sleep(Duration::from_millis(1200)).await;
    let left = cluster.node(4).get(key).unwrap();
    assert_ne!(
        left.as_deref(),
        Some(token.as_str()),
        "a2 was released, its key is on node 4 (pttl {} ms); nodes holding it: {:?}",
        cluster.node(4).pttl(key).unwrap(),
        cluster.nodes_holding(key, &token)
    );
}

/// The same staging, a2 released on the main runtime: nothing of a2's stays on node 4.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_release_on_the_same_runtime_waits_for_the_set_it_undoes() {
    let (faulty, rl) = common::five_slowed_nodes(Duration::from_secs(2)).await;
    let cluster = faulty.cluster();
    let key = "same";
    // a2's SET on node 4 waits (unsent, on this runtime) behind a1's release there.
    let a2 =
        common::lock_behind_an_unsent_acquisition(&faulty, &rl, key, Duration::from_millis(600))
            .await;
    let token = a2.token().to_string();
    a2.release().await.unwrap();
    tokio::time::sleep(Duration::from_millis(1200)).await;
    let left = cluster.node(4).get(key).unwrap();
    assert_ne!(left.as_deref(), Some(token.as_str()), "a2's key is on node 4");
}

/// The same through `Drop` and another kind: a reentrant hold, whose acquisition on
/// node 4 still waits (on the main runtime) behind the previous hold's release there, is
/// dropped on a short-lived runtime. The release `Drop` leaves to that runtime is handed
/// over when it ends and must still land after the acquisition it undoes.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_reentrant_hold_dropped_on_a_short_lived_runtime_leaves_no_field() {
    let (faulty, rl) = common::five_slowed_nodes(Duration::from_secs(2)).await;
    let cluster = faulty.cluster();
    let key = "nested";
    faulty.proxy(4).hold_requests_containing(key.as_bytes(), Duration::from_millis(600));
    let h1 = rl.reentrant(key, "job").await.unwrap();
    faulty.proxy(4).release_holds();
    h1.release().await.unwrap();
    let h2 = rl.reentrant(key, "job").await.unwrap();
    let field = h2.field().to_string();
    common::on_short_runtime(async move { drop(h2) });
    tokio::time::sleep(Duration::from_millis(1200)).await;
    let fields = cluster.node(4).hgetall(key).unwrap();
    assert!(
        !fields.contains_key(&field),
        "h2 was dropped (released), its field is on node 4: {fields:?}, pttl {} ms",
        cluster.node(4).pttl(key).unwrap()
    );
}
