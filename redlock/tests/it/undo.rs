//! Undos (the clean-up of a failed attempt, a release, a withdrawal) never leave a key for a
//! whole lease: an undo lost with a connection that broke after it went out is sent again on
//! a new one (a few times at once, then from the background until its horizon); a create
//! that reaches a node late, after its undo, sets nothing there; an undo never overtakes the
//! request it undoes, even behind a request that has not gone out yet, a chain of cancelled
//! calls, a hung node whose connection breaks, or requests still in flight when the round is
//! decided; and a clean-up under way never refuses the same client's next attempt.

use crate::common;

use std::sync::Arc;
use std::time::{Duration, Instant};

use futures::FutureExt;
use redlock::{ErrorKind, Lock, Redlock};
use redlock_testkit::{Cluster, FaultyCluster, NetFault};

const LEASE: Duration = Duration::from_secs(10);

/// Node 4 resets every connection while the release goes out, then heals at once: the
/// release's first send (on the open connection) and its re-send (a new connection) are
/// lost; a later try on a healed connection removes the key.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_release_lost_with_its_connection_is_sent_again() {
    let faulty = FaultyCluster::start(5).unwrap();
    let rl =
        common::builder_for(faulty.urls(), Duration::from_millis(250)).ttl(LEASE).build().unwrap();
    common::warm(&rl).await;
    for round in 0..3 {
        let key = format!("reset:{round}");
        let lock = rl.try_lock(&key).await.unwrap();
        // Granted at the quorum: the rest of its requests may still be on their way.
        let everywhere = || faulty.cluster().nodes_holding(&key, lock.token()).len() == 5;
        assert!(common::eventually(Duration::from_secs(2), everywhere).await);
        faulty.proxy(4).set_fault(NetFault::Reset);
        lock.release().await.unwrap();
        faulty.proxy(4).heal();
        let gone = || faulty.cluster().count_key(&key) == 0;
        assert!(
            common::eventually(Duration::from_secs(2), gone).await,
            "round {round}: the released key stays on nodes {:?} (pttl {} ms on node 4)",
            (0..5)
                .filter(|&i| faulty.cluster().node(i).get(&key).unwrap().is_some())
                .collect::<Vec<_>>(),
            faulty.cluster().node(4).pttl(&key).unwrap()
        );
    }
}

/// Heals node 4's proxy `ms` from now, from another thread.
fn heal_after(faulty: &Arc<FaultyCluster>, ms: u64) -> std::thread::JoinHandle<()> {
    let faulty = faulty.clone();
    std::thread::spawn(move || {
        std::thread::sleep(Duration::from_millis(ms));
        faulty.proxy(4).heal();
    })
}

/// Two releases meet one reset: one finds the connection broken, the other finds it
/// gone and cannot open a new one. Both are sent again.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn two_releases_in_one_reset_are_both_sent_again() {
    let faulty = Arc::new(FaultyCluster::start(5).unwrap());
    let rl =
        common::builder_for(faulty.urls(), Duration::from_millis(250)).ttl(LEASE).build().unwrap();
    common::warm(&rl).await;
    for round in 0..3 {
        let (ka, kb) = (format!("a:{round}"), format!("b:{round}"));
        let a = rl.try_lock(&ka).await.unwrap();
        let b = rl.try_lock(&kb).await.unwrap();
        // Staging: node 4 answered both acquisitions (a round is decided by the first three
        // of five), so both releases have something to remove there.
        common::held_on(faulty.cluster(), &ka, a.token(), &[4]).await;
        common::held_on(faulty.cluster(), &kb, b.token(), &[4]).await;
        faulty.proxy(4).set_fault(NetFault::Reset);
        let healer = heal_after(&faulty, 30);
        let (ra, rb) = tokio::join!(a.release(), b.release());
        ra.unwrap();
        rb.unwrap();
        healer.join().unwrap();
        let gone = || faulty.cluster().count_key(&ka) == 0 && faulty.cluster().count_key(&kb) == 0;
        assert!(
            common::eventually(Duration::from_secs(2), gone).await,
            "round {round}: a key is left"
        );
    }
}

/// The runtime that released ends while node 4's release waits to be sent again: the
/// client's own thread takes it over, and sends it again too.
#[test]
fn a_release_handed_over_mid_retry_is_sent_again() {
    let faulty = Arc::new(FaultyCluster::start(5).unwrap());
    let rl =
        common::builder_for(faulty.urls(), Duration::from_millis(250)).ttl(LEASE).build().unwrap();
    let (client, staged) = (rl.clone(), faulty.clone());
    let lock = common::on_short_runtime(async move {
        common::warm(&client).await;
        let lock = client.try_lock("handed").await.unwrap();
        // Staging: node 4 answered (a round is decided by the first three of five), so the
        // release has something to remove there.
        common::held_on(staged.cluster(), "handed", lock.token(), &[4]).await;
        lock
    });
    faulty.proxy(4).set_fault(NetFault::Reset);
    let healer = heal_after(&faulty, 40);
    common::on_short_runtime(async move { lock.release().await.unwrap() });
    healer.join().unwrap();
    let deadline = Instant::now() + Duration::from_secs(2);
    while faulty.cluster().count_key("handed") != 0 && Instant::now() < deadline {
        std::thread::sleep(Duration::from_millis(20));
    }
    assert_eq!(
        faulty.cluster().count_key("handed"),
        0,
        "key left on node 4, pttl {} ms",
        faulty.cluster().node(4).pttl("handed").unwrap()
    );
}

/// A release on dead nodes answers at once (refused connections are not waited out), is
/// sent again from the background (a node with its data on disk may come back within the
/// lease), and a shutdown names those nodes without waiting for the re-sends.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_release_on_dead_nodes_answers_at_once_and_holds_up_no_shutdown() {
    let mut cluster = common::cluster(3);
    let rl = common::builder(&cluster, Duration::from_millis(250)).build().unwrap();
    common::warm(&rl).await;
    let lock = rl.try_lock("dead").await.unwrap();
    // Staging: every node answered the acquisition (a round is decided by the first two).
    common::held_on(&cluster, "dead", lock.token(), &[0, 1, 2]).await;
    cluster.node_mut(1).kill().unwrap();
    cluster.node_mut(2).kill().unwrap();
    let started = Instant::now();
    let err = lock.release().await.unwrap_err();
    let took = started.elapsed();
    assert!(took < Duration::from_millis(250), "a release on dead nodes took {took:?}: {err}");
    // Decided as soon as the dead nodes refused: the live node's answer may come after.
    let gone = || cluster.count_key("dead") == 0;
    assert!(common::eventually(Duration::from_secs(1), gone).await, "the live node's release ran");
    let started = Instant::now();
    let err = rl.shutdown(Duration::from_secs(3)).await.unwrap_err();
    assert_eq!(err.kind(), redlock::ErrorKind::Shutdown, "{err}");
    let took = started.elapsed();
    assert!(
        took < Duration::from_secs(1),
        "undos still going on dead nodes: shutdown took {took:?}"
    );
}

/// Node 2 resets every connection for three seconds while the lock is released: the
/// release returns at the quorum, its re-sends go on from the background, and the key is
/// gone from node 2 soon after it heals, long before its lease ends.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_release_through_a_reset_of_several_seconds_removes_the_key_once_it_heals() {
    let faulty = FaultyCluster::start(3).unwrap();
    let rl =
        common::builder_for(faulty.urls(), Duration::from_millis(250)).ttl(LEASE).build().unwrap();
    common::warm(&rl).await;
    let lock = rl.try_lock("long-reset").await.unwrap();
    let everywhere = || faulty.cluster().nodes_holding("long-reset", lock.token()).len() == 3;
    assert!(common::eventually(Duration::from_secs(2), everywhere).await);
    faulty.proxy(2).set_fault(NetFault::Reset);
    lock.release().await.unwrap();
    tokio::time::sleep(Duration::from_secs(3)).await;
    assert_eq!(faulty.cluster().count_key("long-reset"), 1, "the premise: node 2 kept it");
    faulty.proxy(2).heal();
    let gone = || faulty.cluster().count_key("long-reset") == 0;
    assert!(
        common::eventually(Duration::from_secs(3), gone).await,
        "the released key stays on node 2 for {} ms more",
        faulty.cluster().node(2).pttl("long-reset").unwrap()
    );
}

/// Node 2 is busy in another client's script when the lock is released: it answers
/// `BUSY`, which runs nothing (so would `LOADING`, from a node restarting with its data).
/// The release is sent again from the background, and the key is gone from node 2 soon
/// after the script ends, long before its lease does.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_release_a_busy_node_put_off_is_sent_again_once_it_is_free() {
    let faulty = FaultyCluster::start(3).unwrap();
    let rl =
        common::builder_for(faulty.urls(), Duration::from_millis(250)).ttl(LEASE).build().unwrap();
    let lock = rl.try_lock("busy-release").await.unwrap();
    let everywhere = || faulty.cluster().nodes_holding("busy-release", lock.token()).len() == 3;
    assert!(common::eventually(Duration::from_secs(2), everywhere).await);
    let script = busy_for(&faulty, 2, Duration::from_millis(800));
    // Past the busy threshold (10 ms): other clients get `BUSY` now.
    tokio::time::sleep(Duration::from_millis(100)).await;
    lock.release().await.unwrap();
    script.join().unwrap();
    assert_eq!(faulty.cluster().count_key("busy-release"), 1, "the premise: node 2 kept it");
    let gone = || faulty.cluster().count_key("busy-release") == 0;
    assert!(
        common::eventually(Duration::from_secs(2), gone).await,
        "the released key stays on node 2 for {} ms more",
        faulty.cluster().node(2).pttl("busy-release").unwrap()
    );
}

/// Keeps node `i` busy in a script for `busy` (other clients get `BUSY` replies meanwhile:
/// its busy threshold is set to 10 ms first), on a thread of its own.
fn busy_for(faulty: &FaultyCluster, i: usize, busy: Duration) -> std::thread::JoinHandle<()> {
    // Redis 7 calls it `busy-reply-threshold`, Redis 6.2 `lua-time-limit`.
    let node = faulty.cluster().node(i);
    if node.command(&["CONFIG", "SET", "busy-reply-threshold", "10"]).is_err() {
        node.command(&["CONFIG", "SET", "lua-time-limit", "10"]).unwrap();
    }
    let mut con = faulty.cluster().node(i).connection().unwrap();
    let script = "local s = redis.call('TIME') \
                  local start = s[1] * 1000000 + s[2] \
                  while true do \
                    local t = redis.call('TIME') \
                    if t[1] * 1000000 + t[2] - start > tonumber(ARGV[1]) then return 1 end \
                  end";
    let micros = busy.as_micros().to_string();
    std::thread::spawn(move || {
        let _: redis::Value =
            redis::cmd("EVAL").arg(script).arg(0).arg(micros).query(&mut con).unwrap();
    })
}

// A reset before the round is decided still gets the failed attempt's key removed.

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn reset_before_the_decision_still_gets_the_failed_attempts_key_removed() {
    let mut faulty = FaultyCluster::start(3).unwrap();
    // A node timeout well above the 80 ms the Held answers take, even on a loaded machine:
    // with 100 ms they sometimes timed out, and the attempt failed as Unavailable.
    let rl = common::builder_for(faulty.urls(), Duration::from_millis(300)).build().unwrap();
    common::warm(&rl).await;
    for i in [0, 1] {
        faulty.cluster().node(i).set("k", "foreign").unwrap();
        // Held answers arrive after ~80 ms: the round is decided after the reset below.
        faulty.proxy(i).set_fault(NetFault::Latency {
            fixed: Duration::from_millis(40),
            jitter: Duration::ZERO,
        });
    }
    let wake = faulty.cluster_mut().node_mut(2).pause_for(Duration::from_millis(800)).unwrap();
    let attempt = tokio::spawn({
        let rl = rl.clone();
        async move { rl.try_lock("k").await }
    });
    tokio::time::sleep(Duration::from_millis(30)).await;
    faulty.proxy(2).heal();
    faulty.proxy(2).reset_connections();
    let err = attempt.await.unwrap().unwrap_err();
    assert_eq!(err.kind(), ErrorKind::NotAcquired, "{err}");
    wake.join().unwrap();
    tokio::time::sleep(Duration::from_millis(1500)).await;
    let left = faulty.cluster().node(2).get("k").unwrap();
    let pttl = faulty.cluster().node(2).pttl("k").unwrap();
    assert_eq!(left, None, "failed attempt's key left on node 2 (pttl {pttl} ms)");
}

// A clean-up under way never refuses the same client's next attempt.

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn an_abandoned_attempt_never_refuses_a_new_attempt_during_its_clean_up_round() {
    let faulty = FaultyCluster::start(5).unwrap();
    let rl = common::builder_for(faulty.urls(), Duration::from_secs(2)).build().unwrap();
    common::warm(&rl).await;
    for i in [0, 1, 2] {
        faulty.cluster().node(i).set("k", "foreign").unwrap();
        faulty.proxy(i).set_fault(common::latency(20));
    }
    faulty.proxy(4).set_fault(common::latency(150));
    // The clean-up round waits for node 3 (granted): hold it there for 300 ms.
    faulty
        .proxy(3)
        .hold_requests_containing_any(&common::plain_releases(), Duration::from_millis(300));
    let a1 = tokio::spawn({
        let rl = rl.clone();
        async move { rl.try_lock("k").await.map(|_| ()) }
    });
    tokio::time::sleep(Duration::from_millis(100)).await;
    // A1 has failed (3 Held) and is in its clean-up round; node 2 frees up.
    faulty.cluster().node(2).command(&["DEL", "k"]).unwrap();
    let a2 = rl.try_lock("k").await;
    let a1 = a1.await.unwrap();
    assert!(a1.is_err(), "A1 should have failed");
    assert!(a2.is_ok(), "A2 refused (by A1's own abandoned SET on node 4?): {:?}", a2.err());
}

// Undos behind a request buffered in a hung node whose connection breaks.

/// Breaks client 0's connection to node `i` (already-forwarded bytes stay in the node's
/// buffer), then lets new connections through again at once.
fn break_connection(cluster: &FaultyCluster, i: usize) {
    cluster.proxy(i).heal();
    cluster.proxy(i).reset_connections();
}

// A clean-up that times out on a re-opening connection is tried again. Interleaving (3
// nodes, node timeout 100 ms; the break lands in the window in most runs, not all):
// 1. "k" is held by a foreign owner on nodes 0 and 1; node 2 is paused (SIGSTOP, 800 ms).
// 2. A's try_lock("k"): nodes 0, 1 answer Held -> NotAcquired at once. A's `SET k tA NX PX`
//    sits in node 2's socket buffer; the clean-up for node 2 is queued behind it.
// 3. 30 ms later A's connection to node 2 breaks (proxy reset; the SET already reached the
//    node's buffer). The SET's request fails as "connection dropped", is re-sent on a new
//    connection whose connect hangs (node paused), and times out at 100 ms.
// 4. The clean-up then goes to that same still-opening connection and times out after
//    100 ms: it must be sent again.
// 5. Node 2 wakes up and runs the original SET: A's token must not stay on node 2 for its
//    whole 10 s lease ("a failed attempt is taken back on every node where it may have
//    landed").
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_failed_attempt_on_a_hung_node_whose_connection_breaks_leaves_no_key() {
    let mut faulty = FaultyCluster::start(3).unwrap();
    let rl = common::single_attempt(faulty.urls());
    // Plenty of time for any clean-up to land after the node woke up.
    let (pause, settle) = (Duration::from_millis(800), Duration::from_millis(1500));
    a_failed_attempt_on_a_hung_node_whose_connection_breaks(&mut faulty, &rl, pause, settle).await;
}

/// A failed attempt on "k" whose acquisition sits in paused node 2's buffer when its
/// connection there breaks; asserts that the key is gone from node 2 `settle` after the
/// node woke up.
async fn a_failed_attempt_on_a_hung_node_whose_connection_breaks(
    faulty: &mut FaultyCluster,
    rl: &redlock::Redlock,
    pause: Duration,
    settle: Duration,
) {
    common::warm(rl).await;
    for i in [0, 1] {
        faulty.cluster().node(i).set("k", "foreign").unwrap();
    }
    let wake = faulty.cluster_mut().node_mut(2).pause_for(pause).unwrap();
    let attempt = tokio::spawn({
        let rl = rl.clone();
        async move { rl.try_lock("k").await }
    });
    tokio::time::sleep(Duration::from_millis(30)).await;
    break_connection(faulty, 2);
    let err = attempt.await.unwrap().unwrap_err();
    assert_eq!(err.kind(), ErrorKind::NotAcquired, "{err}");
    wake.join().unwrap();
    tokio::time::sleep(settle).await;
    let left = faulty.cluster().node(2).get("k").unwrap();
    let pttl = faulty.cluster().node(2).pttl("k").unwrap();
    assert_eq!(
        left, None,
        "the failed attempt's key is left on node 2 (pttl {pttl} ms) with nobody holding it"
    );
}

// The same for a release: A holds "r" on every node; node 2 pauses; A's extension is
// written to node 2's buffer (the round succeeds on nodes 0, 1); A releases (Ok on nodes
// 0, 1), the release for node 2 not yet written. A's connection to node 2 breaks: the
// release times out on the re-opening connection and must be sent again. Node 2 wakes up
// and runs the extension (PEXPIRE GT: 20 s): the released lock's key must not stay.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_release_behind_an_extension_on_a_hung_node_whose_connection_breaks_leaves_no_key() {
    let mut faulty = FaultyCluster::start(3).unwrap();
    let rl = common::single_attempt(faulty.urls());
    let mut lock = rl.try_lock("r").await.unwrap();
    let everywhere = || faulty.cluster().nodes_holding("r", lock.token()).len() == 3;
    assert!(common::eventually(Duration::from_secs(1), everywhere).await);
    let token = lock.token().to_owned();
    let wake = faulty.cluster_mut().node_mut(2).pause_for(Duration::from_millis(800)).unwrap();
    lock.extend(Duration::from_secs(20)).await.unwrap();
    let release = tokio::spawn(lock.release());
    tokio::time::sleep(Duration::from_millis(30)).await;
    break_connection(&faulty, 2);
    release.await.unwrap().unwrap();
    wake.join().unwrap();
    tokio::time::sleep(Duration::from_millis(1500)).await;
    let left = faulty.cluster().node(2).get("r").unwrap();
    let pttl = faulty.cluster().node(2).pttl("r").unwrap();
    assert_ne!(
        left.as_deref(),
        Some(token.as_str()),
        "the released lock's key is left on node 2 (pttl {pttl} ms)"
    );
}

// The same hung node without a broken connection: once the node wakes up and runs the
// attempt's SET, no key is left.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_failed_attempt_on_a_hung_node_leaves_no_key() {
    let mut faulty = FaultyCluster::start(3).unwrap();
    let rl = common::single_attempt(faulty.urls());
    common::warm(&rl).await;
    for i in [0, 1] {
        faulty.cluster().node(i).set("k", "foreign").unwrap();
    }
    let wake = faulty.cluster_mut().node_mut(2).pause_for(Duration::from_millis(800)).unwrap();
    let err = rl.try_lock("k").await.unwrap_err();
    assert_eq!(err.kind(), ErrorKind::NotAcquired, "{err}");
    wake.join().unwrap();
    tokio::time::sleep(Duration::from_millis(500)).await;
    assert_eq!(faulty.cluster().node(2).get("k").unwrap(), None);
}

// The same failed attempt, with a hang that outlasts the connect timeout (150 ms, under the
// 400 ms node timeout): every connect of the undo sent again times out before its request
// does. A connect that timed out means the node may be hung with the request in its buffer,
// just like a request that timed out: the undo is sent again until the node wakes up.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn an_undo_whose_connects_time_out_on_a_hung_node_is_sent_again() {
    let mut faulty = FaultyCluster::start(3).unwrap();
    let rl = common::builder_for(faulty.urls(), Duration::from_millis(400))
        .connect_timeout(Duration::from_millis(150))
        .build()
        .unwrap();
    let (pause, settle) = (Duration::from_millis(1200), Duration::from_millis(2000));
    a_failed_attempt_on_a_hung_node_whose_connection_breaks(&mut faulty, &rl, pause, settle).await;
}

// Undos behind an acquisition that has not gone out yet, after a cancelled call.

/// Node 4's `SET` of a2 waits, unsent, behind a1's release there (itself behind a1's `SET`,
/// held by the proxy). a2's release is cancelled after its first poll (its request on
/// node 4 still waiting for a2's `SET`), and the lock is dropped: the release sent from
/// `Drop` must still go out after a2's `SET`, or that `SET` lands last and leaves a2's key
/// on node 4 for the whole lease.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_release_after_a_cancelled_one_waits_for_the_unsent_acquisition() {
    let (faulty, rl) = common::five_slowed_nodes(Duration::from_secs(2)).await;
    let cluster = faulty.cluster();
    for round in 0..3 {
        let key = format!("k{round}");
        let hold = Duration::from_millis(400);
        let a2 = common::lock_behind_an_unsent_acquisition(&faulty, &rl, &key, hold).await;
        let token = a2.token().to_string();
        let cancelled = tokio::time::timeout(Duration::ZERO, a2.release()).await;
        assert!(
            cancelled.is_err(),
            "round {round}: the release ended in its first poll: {cancelled:?}"
        );
        common::assert_gone_after_the_hold(cluster, &key, &token, round).await;
    }
}

/// The same with a cancelled extension in between: the release that follows waits for the
/// acquisition the extension was waiting for.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_release_after_a_cancelled_extension_waits_for_the_unsent_acquisition() {
    let (faulty, rl) = common::five_slowed_nodes(Duration::from_secs(2)).await;
    let cluster = faulty.cluster();
    for round in 0..3 {
        let key = format!("e{round}");
        let hold = Duration::from_millis(400);
        let mut a2 = common::lock_behind_an_unsent_acquisition(&faulty, &rl, &key, hold).await;
        let token = a2.token().to_string();
        let extend = a2.extend(Duration::from_secs(10));
        let cancelled = tokio::time::timeout(Duration::ZERO, extend).await;
        assert!(
            cancelled.is_err(),
            "round {round}: the extension ended in its first poll: {cancelled:?}"
        );
        a2.release().await.unwrap();
        common::assert_gone_after_the_hold(cluster, &key, &token, round).await;
    }
}

// Chains of cancelled calls behind an acquisition that has not gone out yet.

/// Holds node 4's next request naming `key` (the acquisition) for `hold`.
fn hold_acquisition(faulty: &FaultyCluster, key: &str, hold: Duration) {
    faulty.proxy(4).hold_requests_containing(key.as_bytes(), hold);
}

async fn clean(cluster: &Cluster, keys: &[&str], within: Duration) -> bool {
    common::eventually(within, || keys.iter().all(|key| cluster.count_key(key) == 0)).await
}

fn holders(cluster: &Cluster, keys: &[&str], token: &str) -> Vec<(String, Vec<usize>)> {
    keys.iter().map(|key| (key.to_string(), cluster.nodes_holding(key, token))).collect()
}

/// A chain of several cancelled calls (extension, extension, release) before the
/// release sent by `Drop`. Each cancelled call's request on node 4 is dropped unsent while
/// what it follows is still unsent: the links must compose.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_chain_of_cancelled_calls_keeps_the_release_behind_the_unsent_acquisition() {
    let (faulty, rl) = common::five_slowed_nodes(Duration::from_secs(2)).await;
    let cluster = faulty.cluster();
    for round in 0..2 {
        let key = format!("chain{round}");
        let hold = Duration::from_millis(400);
        let mut a2 = common::lock_behind_an_unsent_acquisition(&faulty, &rl, &key, hold).await;
        let token = a2.token().to_string();
        for _ in 0..3 {
            let extend = a2.extend(Duration::from_secs(10));
            assert!(extend.now_or_never().is_none(), "round {round}: an extension ended at once");
        }
        assert!(a2.release().now_or_never().is_none(), "round {round}: the release ended at once");
        common::assert_gone_after_the_hold(cluster, &key, &token, round).await;
    }
}

/// The clean-up of a failed attempt is cancelled while its request on node 4
/// waits for that attempt's unsent acquisition (nodes 0-2 hold a foreign value: refused;
/// node 3 granted, its clean-up held by the proxy so the call is mid clean-up when
/// cancelled). `Drop` then releases behind the dropped clean-up, and a new attempt of the
/// same client on the key (`Undos::pending`, following the chain) comes right after: a2's
/// acquisition must not land after a2's undos, and a3 must be granted on node 4.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_cancelled_clean_up_and_a_new_attempt_stay_behind_the_unsent_acquisition() {
    let (faulty, rl) = common::five_slowed_nodes(Duration::from_secs(2)).await;
    let cluster = faulty.cluster();
    // Node 3's grant comes in before the three refusals decide the round: its clean-up is
    // awaited.
    faulty.proxy(3).heal();
    for round in 0..2 {
        let key = format!("cu{round}");
        hold_acquisition(&faulty, &key, Duration::from_millis(500));
        let a1 = rl.try_lock(&key).await.unwrap();
        faulty.proxy(4).release_holds();
        a1.release().await.unwrap();
        for i in 0..3 {
            cluster.node(i).set(&key, "foreign").unwrap();
        }
        let clean_up = common::plain_releases();
        faulty.proxy(3).hold_requests_containing_any(&clean_up, Duration::from_millis(300));
        let a2 = tokio::time::timeout(Duration::from_millis(100), rl.try_lock(&key)).await;
        assert!(a2.is_err(), "round {round}: the failed attempt ended before its clean-up: {a2:?}");
        faulty.proxy(3).release_holds();
        for i in 0..3 {
            cluster.node(i).command(&["DEL", &key]).unwrap();
        }
        let started = Instant::now();
        let a3 = rl.try_lock(&key).await.unwrap_or_else(|err| panic!("round {round}: {err}"));
        assert!(started.elapsed() < Duration::from_millis(2500), "a3 took {:?}", started.elapsed());
        let token = a3.token().to_string();
        // Past every hold: whatever a2 sent has landed.
        tokio::time::sleep(Duration::from_millis(900)).await;
        let on4 = cluster.node(4).get(&key).unwrap();
        assert_eq!(on4.as_deref(), Some(token.as_str()), "round {round}: node 4, a3 is {token}");
        a3.release().await.unwrap();
        assert!(
            clean(cluster, &[&key], Duration::from_secs(3)).await,
            "round {round}: left {:?}",
            (0..5).map(|i| cluster.node(i).get(&key).unwrap()).collect::<Vec<_>>()
        );
    }
}

/// A short node timeout: a2's acquisition on node 4 times out while it waits its
/// turn (a1's release there is stuck behind a1's held acquisition); a2's cancelled release,
/// the release from `Drop`, and a new attempt all follow it. Nothing may hang past the node
/// timeout, and node 4 must end clean.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn an_acquisition_timing_out_in_line_stalls_nothing() {
    let timeout = Duration::from_millis(300);
    let (faulty, rl) = common::five_slowed_nodes(timeout).await;
    let cluster = faulty.cluster();
    for round in 0..2 {
        let key = format!("to{round}");
        let hold = Duration::from_millis(1200);
        let mut a2 = common::lock_behind_an_unsent_acquisition(&faulty, &rl, &key, hold).await;
        let token = a2.token().to_string();
        assert!(a2.extend(Duration::from_secs(10)).now_or_never().is_none());
        assert!(a2.release().now_or_never().is_none());
        // The dropped release runs in the background: gone from nodes 0-3 first.
        let released = || (0..4).all(|i| !cluster.node(i).exists(&key).unwrap());
        assert!(common::eventually(Duration::from_secs(2), released).await, "round {round}");
        let started = Instant::now();
        let a3 = rl.try_lock(&key).await.unwrap_or_else(|err| panic!("round {round}: {err}"));
        assert!(
            started.elapsed() < timeout + Duration::from_millis(200),
            "{:?}",
            started.elapsed()
        );
        let started = Instant::now();
        let token3 = a3.token().to_string();
        a3.release().await.unwrap();
        assert!(
            started.elapsed() < timeout + Duration::from_millis(200),
            "{:?}",
            started.elapsed()
        );
        // Past the hold: node 4 ran a1's SET, then whatever was still queued behind it.
        assert!(
            clean(cluster, &[&key], Duration::from_secs(4)).await,
            "round {round}: a2 ({token}) on {:?}, a3 ({token3}) on {:?}",
            cluster.nodes_holding(&key, &token),
            cluster.nodes_holding(&key, &token3)
        );
    }
}

/// The other kinds (reentrant, read, write, multi-resource), each staged as in
/// [`a_chain_of_cancelled_calls_keeps_the_release_behind_the_unsent_acquisition`] with a
/// cancelled extension then a cancelled release.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn every_kind_keeps_the_release_behind_the_unsent_acquisition() {
    let (faulty, rl) = common::five_slowed_nodes(Duration::from_secs(2)).await;
    let cluster = faulty.cluster();
    macro_rules! stage {
        ($what:literal, $keys:expr, $acquire:expr) => {{
            let keys: Vec<&str> = $keys;
            hold_acquisition(&faulty, keys[0], Duration::from_millis(400));
            let a1 = $acquire.await.unwrap();
            faulty.proxy(4).release_holds();
            a1.release().await.unwrap();
            let mut a2 = $acquire.await.unwrap();
            let token = a2.token().to_string();
            assert!(a2.extend(Duration::from_secs(10)).now_or_never().is_none(), $what);
            assert!(a2.release().now_or_never().is_none(), $what);
            tokio::time::sleep(Duration::from_millis(800)).await;
            assert!(
                clean(cluster, &keys, Duration::from_secs(3)).await,
                "{}: a2 ({token}) left on {:?}",
                $what,
                holders(cluster, &keys, &token)
            );
        }};
    }
    stage!("reentrant", vec!["re"], rl.reentrant("re", "job-1").once());
    stage!("read", vec!["rd"], rl.read("rd").once());
    stage!("write", vec!["wr"], rl.write("wr").once());
    stage!("many", vec!["m1", "m2"], rl.many(&["m1", "m2"]).once());
}

/// a2 (with a cancelled release in its chain) dropped inside a current-thread
/// runtime that is then shut down: its unsent acquisition and its undos die with the
/// runtime; the undos handed over to the client's thread must still leave node 4 clean.
#[test]
fn a_chain_dropped_with_its_runtime_leaves_nothing() {
    let faulty = FaultyCluster::start(5).unwrap();
    let cluster = faulty.cluster();
    let rl = common::builder_for(faulty.urls(), Duration::from_secs(2)).build().unwrap();
    let main = tokio::runtime::Builder::new_current_thread().enable_all().build().unwrap();
    main.block_on(common::warm_and_slow(&faulty, &rl));
    for round in 0..2 {
        let key = format!("rt{round}");
        let short = tokio::runtime::Builder::new_current_thread().enable_all().build().unwrap();
        let token = short.block_on(async {
            let hold = Duration::from_millis(400);
            let mut a2 = common::lock_behind_an_unsent_acquisition(&faulty, &rl, &key, hold).await;
            let token = a2.token().to_string();
            assert!(a2.extend(Duration::from_secs(10)).now_or_never().is_none());
            drop(a2);
            token
        });
        drop(short);
        main.block_on(async {
            common::assert_gone_after_the_hold(cluster, &key, &token, round).await;
        });
    }
}

/// A writer waiting in line gives up (its wait is cancelled) while its last
/// attempt's acquisition on node 4 is unsent behind its own earlier clean-up; the
/// withdrawal waits for the undos. Nothing of the writer (key or intent) may stay.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_writer_giving_up_behind_an_unsent_attempt_leaves_nothing() {
    let (faulty, rl) = common::five_slowed_nodes(Duration::from_secs(2)).await;
    let cluster = faulty.cluster();
    let reader = rl.read("wkey-gives-up").once().await.unwrap();
    hold_acquisition(&faulty, "wkey-gives-up", Duration::from_millis(400));
    let waiting = rl.write("wkey-gives-up").retry(
        redlock::Retry::new()
            .with_delay(Duration::from_millis(30))
            .with_jitter(Duration::ZERO)
            .with_max_attempts(100),
    );
    let gave_up = tokio::time::timeout(Duration::from_millis(250), waiting).await;
    assert!(gave_up.is_err(), "{gave_up:?}");
    faulty.proxy(4).release_holds();
    reader.release().await.unwrap();
    tokio::time::sleep(Duration::from_millis(500)).await;
    assert!(
        clean(cluster, &["wkey-gives-up"], Duration::from_secs(4)).await,
        "left: {:?}",
        cluster.hash_fields("wkey-gives-up").unwrap()
    );
    let writer = rl.write("wkey-gives-up").once().await.unwrap_or_else(|err| {
        assert_ne!(err.kind(), ErrorKind::NotAcquired, "the writer's intent stayed: {err}");
        panic!("{err}")
    });
    writer.release().await.unwrap();
}

/// Many extensions cancelled while node 4's acquisition is held: whatever the client keeps
/// for each cancelled request while the first is in flight must neither grow in cost per
/// cancellation nor be dropped recursively when the first settles (a stack overflow
/// aborts the process). Run on a thread with a 512 KiB stack so that a recursive drop
/// overflows at a few thousand links within the test budget (the test thread's 2 MiB
/// would take ~8k in a debug build); `CHAIN` and `STACK_KIB` change both.
#[test]
fn a_long_chain_of_cancelled_extensions_is_dropped_without_overflow() {
    let links: usize = std::env::var("CHAIN").ok().and_then(|s| s.parse().ok()).unwrap_or(4000);
    let stack: usize = std::env::var("STACK_KIB").ok().and_then(|s| s.parse().ok()).unwrap_or(512);
    std::thread::Builder::new()
        .stack_size(stack * 1024)
        .spawn(move || {
            let rt = tokio::runtime::Builder::new_current_thread().enable_all().build().unwrap();
            rt.block_on(Box::pin(long_chain(links)));
        })
        .unwrap()
        .join()
        .unwrap();
}

async fn long_chain(links: usize) {
    let hold = Duration::from_millis(3000);
    let faulty = FaultyCluster::start(5).unwrap();
    let cluster = faulty.cluster();
    let rl = common::builder_for(faulty.urls(), hold + Duration::from_secs(2))
        .ttl(Duration::from_secs(60))
        .build()
        .unwrap();
    common::warm_and_slow(&faulty, &rl).await;
    hold_acquisition(&faulty, "long", hold);
    let acquired = Instant::now();
    let mut lock = rl.try_lock("long").await.unwrap();
    faulty.proxy(4).release_holds();
    let token = lock.token().to_string();
    for k in 0..links {
        let extend = lock.extend(Duration::from_secs(60)).now_or_never();
        assert!(extend.is_none(), "extension {k} ended in its first poll: {extend:?}");
    }
    let cancelled = acquired.elapsed();
    assert!(cancelled < hold, "the chain was cut: {links} cancellations took {cancelled:?}");
    tokio::time::sleep(hold + Duration::from_millis(300) - cancelled).await;
    // The head is over: this extension's request on node 4 goes out and lets the chain go.
    lock.extend(Duration::from_secs(60)).await.unwrap();
    lock.release().await.unwrap();
    assert!(
        clean(cluster, &["long"], Duration::from_secs(3)).await,
        "left on {:?}",
        cluster.nodes_holding("long", &token)
    );
}

// Requests still in flight when a round is decided.

// An undo whose connection broke is sent again until the keys it removes have expired
// anyway (README "Guarantees"), also when its time-out comes in the short wait for
// stragglers after the round was decided (up to 2 ms), not only before the decision.
// Interleaving (3 nodes, node timeout T = 100 ms), in 8 trials with node 1 answering
// 1.5-1.8 ms before node 0's time-out (the window is that narrow):
// 1. lock "k" on nodes 0, 1, 2; node 0's connection breaks and is re-opened by a check
//    (node 0 answers it in time, so the round waits for it).
// 2. node 0's proxy holds every release (by script SHA); node 1's proxy holds its release
//    for just under T.
// 3. release: node 2 answers at once, node 1 just before T: decided (quorum), node 0 still
//    pending, waited for. Node 0's release times out at T, inside that wait.
// 4. node 0's held release is lost with its connection (reset after the time-out): it
//    must be sent again on the new connection, or node 0 keeps "k" for its whole lease.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn an_undo_timing_out_during_the_linger_is_still_sent_again() {
    let faulty = FaultyCluster::start(3).unwrap();
    let timeout = Duration::from_millis(100);
    let rl = common::builder_for(faulty.urls(), timeout).build().unwrap();
    common::warm(&rl).await;
    let releases = common::plain_releases();
    let offsets_us = [1500u64, 1700, 1600, 1800, 1500, 1700, 1600, 1800];
    let mut left = Vec::new();
    for (trial, offset) in offsets_us.iter().enumerate() {
        let key = format!("k{trial}");
        let lock = rl.try_lock(&key).await.unwrap();
        // Staging: node 0 answered the acquisition (a round is decided by the first two
        // nodes), so its release has something to remove there.
        common::held_on(faulty.cluster(), &key, lock.token(), &[0]).await;
        // The connection the acquisition went out on breaks; the next one is a new
        // generation.
        break_connection(&faulty, 0);
        // Node 0 re-connects and answers in time (node 1 slowed: the check needs node 0).
        let slow = NetFault::Latency { fixed: Duration::from_millis(20), jitter: Duration::ZERO };
        faulty.proxy(1).set_fault(slow);
        assert!(lock.check_held().await.unwrap());
        assert!(lock.check_held().await.unwrap());
        faulty.proxy(1).heal();
        faulty.proxy(0).hold_requests_containing_any(&releases, Duration::from_secs(10));
        // Node 1's release is held until just before node 0's times out: the round is
        // decided then, and node 0's time-out comes while it waits for the straggler.
        faulty
            .proxy(1)
            .hold_requests_containing_any(&releases, timeout - Duration::from_micros(*offset));
        let started = Instant::now();
        // Node 1 held for nearly the node timeout may time out too: the release then
        // fails (`Unavailable`), and its undos on both nodes must still go out.
        let released = lock.release().await;
        let took = started.elapsed();
        faulty.proxy(1).release_holds();
        // Past node 0's time-out: its held release dies with the connection.
        tokio::time::sleep(
            (started + timeout + Duration::from_millis(10))
                .saturating_duration_since(Instant::now()),
        )
        .await;
        faulty.proxy(0).release_holds();
        break_connection(&faulty, 0);
        // Any re-send (50 ms after the time-out) has landed by then.
        tokio::time::sleep(Duration::from_millis(500)).await;
        let on_0 = faulty.cluster().node(0).exists(&key).unwrap();
        eprintln!(
            "trial {trial}: node 1 answers {offset} us before node 0's time-out, release took \
             {took:?} ({:?}), key left on node 0: {on_0}",
            released.map_err(|err| err.kind())
        );
        if on_0 {
            left.push(key);
        }
    }
    assert!(
        left.is_empty(),
        "released keys {left:?} stay on node 0 for their whole lease: the release there timed \
         out after a reconnect and was never sent again"
    );
}

// Validity after the wait for stragglers: a round decided, then waiting up to 2 ms more,
// counts its deadline from the round's start and checks it at the end of the wait. With
// tiny leases and slow nodes (so that the wait often crosses the deadline), the deadline
// of a lock or an extension handed out is never later than its round's start + lease; a
// refused one is `Expired`/`NotHeld`, and nothing is left on the nodes. (A lock can be
// seen already invalid by the caller: the check is at the decision, and returning takes
// time on a loaded machine; counted, not asserted.)
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_lock_or_extension_handed_out_after_the_linger_is_still_valid() {
    let faulty = FaultyCluster::start(3).unwrap();
    let rl = common::builder_for(faulty.urls(), Duration::from_millis(200)).build().unwrap();
    common::warm(&rl).await;
    faulty.proxy(1).set_fault(common::latency(1));
    faulty.proxy(2).set_fault(NetFault::Latency {
        fixed: Duration::from_millis(2),
        jitter: Duration::from_millis(3),
    });
    let (mut granted, mut expired, mut invalid_on_return) = (0, 0, 0);
    for round in 0..60u64 {
        let ttl = Duration::from_millis(8 + (round % 16) * 2);
        let key = format!("tiny{round}");
        let started = Instant::now();
        match rl.try_lock(&key).ttl(ttl).await {
            Ok(mut lock) => {
                granted += 1;
                invalid_on_return += usize::from(!lock.is_valid());
                assert!(lock.deadline() <= started + ttl, "round {round}: deadline past the lease");
                let extended_at = Instant::now();
                match lock.extend(ttl).await {
                    Ok(()) => {
                        invalid_on_return += usize::from(!lock.is_valid());
                        assert!(lock.deadline() <= extended_at + ttl);
                    }
                    Err(err) => assert!(
                        matches!(err.kind(), ErrorKind::NotHeld | ErrorKind::Expired),
                        "round {round}: {err}"
                    ),
                }
                let _ = lock.release().await;
            }
            Err(err) => {
                assert_eq!(err.kind(), ErrorKind::Expired, "round {round}: {err}");
                expired += 1;
            }
        }
    }
    eprintln!("granted {granted}, expired {expired}, seen invalid on return {invalid_on_return}");
    for i in 0..3 {
        faulty.proxy(i).heal();
    }
    let clean = common::eventually(Duration::from_secs(3), || {
        faulty.cluster().keys_everywhere("tiny*").unwrap() == 0
    })
    .await;
    assert!(clean, "keys left: {}", faulty.cluster().keys_everywhere("tiny*").unwrap());
}

// Cancellation during the wait for stragglers: the round's requests still in flight are
// owned by the caller's future until the wait ends, so dropping the future there drops
// them. Swept: an attempt, a release and an extension cancelled at every millisecond of a
// round that decides at ~2-8 ms and waits up to 2 ms more (nodes behind latency, one
// slower). Nothing is left on any node, and a new attempt on the key succeeds once the old
// lease could have ended.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn cancelling_during_the_linger_leaves_nothing() {
    let faulty = FaultyCluster::start(3).unwrap();
    let rl = common::builder_for(faulty.urls(), Duration::from_millis(200)).build().unwrap();
    common::warm(&rl).await;
    faulty.proxy(0).set_fault(common::latency(1));
    faulty.proxy(1).set_fault(common::latency(1));
    faulty.proxy(2).set_fault(common::latency(2));
    for step in 0..24u64 {
        let cut = Duration::from_micros(500 * step);
        let key = format!("cut{step}");
        // The attempt, cut.
        let _ = tokio::time::timeout(cut, rl.try_lock(&key)).await;
        // A release, cut.
        if let Ok(lock) = rl.try_lock(&format!("{key}r")).await {
            let _ = tokio::time::timeout(cut, lock.release()).await;
        }
        // An extension, cut, then a release.
        if let Ok(mut lock) = rl.try_lock(&format!("{key}e")).await {
            let _ = tokio::time::timeout(cut, lock.extend(Duration::from_secs(10))).await;
            let _ = lock.release().await;
        }
    }
    for i in 0..3 {
        faulty.proxy(i).heal();
    }
    let clean = common::eventually(Duration::from_secs(5), || {
        faulty.cluster().keys_everywhere("cut*").unwrap() == 0
    })
    .await;
    assert!(
        clean,
        "keys left after cancellations: {}",
        faulty.cluster().keys_everywhere("cut*").unwrap()
    );
}

/// A lock on `key` whose nodes `broken` had their connection replaced since it was
/// granted (a new generation), then hold every release sent to them for 10 s: a release
/// there times out after a reconnect.
async fn reconnected_and_held(
    faulty: &FaultyCluster,
    rl: &Redlock,
    key: &str,
    broken: &[usize],
) -> Lock {
    let lock = rl.try_lock(key).await.unwrap();
    // Staging: the broken nodes answered the acquisition (a round is decided by the first
    // two nodes): one whose acquisition never went out has no release to send there.
    common::held_on(faulty.cluster(), key, lock.token(), broken).await;
    for &i in broken {
        break_connection(faulty, i);
    }
    // Re-opens the connections (a check is re-sent on a new one); the nodes that did not
    // count finish in the background.
    let _ = lock.check_held().await;
    tokio::time::sleep(Duration::from_millis(100)).await;
    let _ = lock.check_held().await;
    tokio::time::sleep(Duration::from_millis(50)).await;
    let releases = common::plain_releases();
    for &i in broken {
        faulty.proxy(i).hold_requests_containing_any(&releases, Duration::from_secs(10));
    }
    lock
}

/// Lets the held releases go: drops them with their connections, and holds nothing more.
fn unhold(faulty: &FaultyCluster, nodes: &[usize]) {
    for &i in nodes {
        faulty.proxy(i).release_holds();
        break_connection(faulty, i);
    }
}

// `shutdown` says `Ok` only when every undo was confirmed: an undo that timed out after a
// reconnect and waits in the pause before its re-send (50 ms, doubling) counts as in
// flight. Interleaving (3 nodes, T = 100 ms):
// 1. lock "k"; nodes 0 and 1 reconnect; their proxies hold releases.
// 2. release: nodes 0 and 1 time out at T, before the decision (`Unavailable`); both
//    releases are to be sent again in 50 ms.
// 3. `shutdown(20 ms)` at once, inside that pause: the release was confirmed on neither
//    node 0 nor 1 (their keys stay if the re-sends fail), so shutdown must name them.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn shutdown_names_nodes_whose_taken_undo_waits_for_its_resend() {
    let faulty = FaultyCluster::start(3).unwrap();
    let rl = common::builder_for(faulty.urls(), Duration::from_millis(100)).build().unwrap();
    common::warm(&rl).await;
    let lock = reconnected_and_held(&faulty, &rl, "k", &[0, 1]).await;
    let started = Instant::now();
    let released = lock.release().await;
    let took = started.elapsed();
    let shutdown = rl.shutdown(Duration::from_millis(20)).await;
    eprintln!(
        "release {:?} after {took:?}; shutdown: {:?}",
        released.as_ref().map_err(|err| err.kind()),
        shutdown.as_ref().map_err(|err| err.to_string())
    );
    assert_eq!(released.unwrap_err().kind(), ErrorKind::Unavailable);
    // Whatever shutdown said, the re-sends finish the job once the nodes answer.
    unhold(&faulty, &[0, 1]);
    let gone =
        common::eventually(Duration::from_secs(3), || faulty.cluster().count_key("k") == 0).await;
    assert!(gone, "k left on {:?}", faulty.cluster().nodes_with_key("k").unwrap());
    let err = shutdown.expect_err(
        "shutdown returned Ok while the releases on nodes 0 and 1 timed out and were only \
         scheduled to be sent again (the pause of `Retries::again` is not registered)",
    );
    assert_eq!(err.kind(), ErrorKind::Shutdown);
}

// The same pause for an undo left to the background after the decision. Release Ok
// (nodes 1, 2); node 0 (reconnected, holding releases) times out at T = 100 ms in the
// background and is to be sent again 50 ms later. `shutdown(125 ms)`, called right after
// the release, ends inside that pause: it must name node 0.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn shutdown_names_a_node_whose_background_undo_waits_for_its_resend() {
    let faulty = FaultyCluster::start(3).unwrap();
    let rl = common::builder_for(faulty.urls(), Duration::from_millis(100)).build().unwrap();
    common::warm(&rl).await;
    let lock = reconnected_and_held(&faulty, &rl, "k", &[0]).await;
    lock.release().await.unwrap();
    let shutdown = rl.shutdown(Duration::from_millis(125)).await;
    eprintln!("shutdown: {:?}", shutdown.as_ref().map_err(|err| err.to_string()));
    unhold(&faulty, &[0]);
    let gone =
        common::eventually(Duration::from_secs(3), || faulty.cluster().count_key("k") == 0).await;
    assert!(gone, "k left on {:?}", faulty.cluster().nodes_with_key("k").unwrap());
    // Released on a quorum (1 and 2): `Ok`, naming node 0 as unconfirmed.
    let report = shutdown.expect("released on a quorum");
    let unconfirmed: Vec<&str> = report.unconfirmed().map(|node| node.node()).collect();
    assert_eq!(unconfirmed, [report.nodes()[0].node()], "{report}");
}

// Re-sends handed over when their runtime ends in their pause. The release runs on a
// short-lived runtime: nodes 0 and 1 (reconnected, holding releases) time out before the
// decision, their re-sends are scheduled in a task there, and the runtime ends at once,
// dropping that task in its pause: the client's own thread must send both again. Then
// the held releases are dropped with their connections. The key is gone from every node,
// and a later lock of the same key by the same client is granted and survives every
// possible re-send (a re-sent undo removes only its own token).
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_hand_over_of_taken_undos_leaves_nothing_and_spares_the_next_hold() {
    let faulty = FaultyCluster::start(3).unwrap();
    let rl = common::builder_for(faulty.urls(), Duration::from_millis(100)).build().unwrap();
    common::warm(&rl).await;
    for trial in 0..3 {
        let key = format!("h{trial}");
        let lock = reconnected_and_held(&faulty, &rl, &key, &[0, 1]).await;
        let released =
            common::on_short_runtime(async move { lock.release().await.map_err(|e| e.kind()) });
        assert_eq!(released, Err(ErrorKind::Unavailable), "trial {trial}");
        tokio::time::sleep(Duration::from_millis(20 * trial)).await;
        unhold(&faulty, &[0, 1]);
        let gone =
            common::eventually(Duration::from_secs(3), || faulty.cluster().count_key(&key) == 0)
                .await;
        assert!(
            gone,
            "trial {trial}: {key} left on {:?}",
            faulty.cluster().nodes_with_key(&key).unwrap()
        );
        // The same client's next hold of the key: granted, and untouched by any re-send.
        let next = rl.try_lock(&key).await.unwrap();
        let token = next.token().to_owned();
        tokio::time::sleep(Duration::from_millis(1500)).await;
        assert_eq!(
            faulty.cluster().nodes_holding(&key, &token),
            vec![0, 1, 2],
            "trial {trial}: a re-sent undo removed the next hold"
        );
        next.release().await.unwrap();
    }
}

// Re-sends never remove the next owner's hold. Another client takes the key as soon as the
// re-sent releases free it; the re-sends (more may still be scheduled on node 0, whose
// first re-send is held again) remove only the old token.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn taken_resends_never_remove_another_owners_hold() {
    let faulty = FaultyCluster::start_for_clients(3, 2, Default::default()).unwrap();
    let rl = common::builder_for(faulty.urls_for(0), Duration::from_millis(100)).build().unwrap();
    let other =
        common::builder_for(faulty.urls_for(1), Duration::from_millis(100)).build().unwrap();
    common::warm(&rl).await;
    common::warm(&other).await;
    let lock = reconnected_and_held(&faulty, &rl, "k", &[0, 1]).await;
    assert_eq!(lock.release().await.unwrap_err().kind(), ErrorKind::Unavailable);
    // Node 1 answers the first re-send; node 0 holds it too (it times out and is re-sent
    // 100 ms after), then is let go.
    unhold(&faulty, &[1]);
    let deadline = Instant::now() + Duration::from_secs(5);
    let theirs = loop {
        if let Ok(lock) = other.try_lock("k").await {
            break lock;
        }
        assert!(Instant::now() < deadline, "the other client never got k");
        tokio::time::sleep(Duration::from_millis(5)).await;
    };
    let token = theirs.token().to_owned();
    tokio::time::sleep(Duration::from_millis(200)).await;
    unhold(&faulty, &[0]);
    tokio::time::sleep(Duration::from_millis(1500)).await;
    let holding = faulty.cluster().nodes_holding("k", &token);
    assert!(holding.len() >= 2 && holding.contains(&1), "their hold is on {holding:?} only");
    theirs.release().await.unwrap();
}
