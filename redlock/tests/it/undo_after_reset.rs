//! An undo lost with a connection that broke after it went out is sent again on a new one
//! (a few times at once, then from the background until its horizon): a reset connection
//! does not leave a released key, or a failed attempt's, for a whole lease; and a create
//! that reaches a node late, after its undo, sets nothing there.

use crate::common;

use std::sync::Arc;
use std::time::{Duration, Instant};

use redlock_testkit::{Fault, FaultyCluster, NetFault};

const LEASE: Duration = Duration::from_secs(10);

/// Node 4 resets every connection while the release goes out, then heals at once: the
/// release's first send (on the open connection) and its re-send (a new connection) are
/// lost; a later try on a healed connection removes the key.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_release_lost_with_its_connection_is_sent_again() {
    let faulty = FaultyCluster::start(5).unwrap();
    let rl =
        common::builder_for(faulty.urls(), Duration::from_millis(250)).ttl(LEASE).build().unwrap();
    rl.try_lock("warm").await.unwrap().release().await.unwrap();
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
    rl.try_lock("warm").await.unwrap().release().await.unwrap();
    for round in 0..3 {
        let (ka, kb) = (format!("a:{round}"), format!("b:{round}"));
        let a = rl.try_lock(&ka).await.unwrap();
        let b = rl.try_lock(&kb).await.unwrap();
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
    let client = rl.clone();
    let lock = common::on_short_runtime(async move {
        client.try_lock("warm").await.unwrap().release().await.unwrap();
        client.try_lock("handed").await.unwrap()
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
    rl.try_lock("warm").await.unwrap().release().await.unwrap();
    let lock = rl.try_lock("dead").await.unwrap();
    cluster.node_mut(1).kill().unwrap();
    cluster.node_mut(2).kill().unwrap();
    let started = Instant::now();
    let err = lock.release().await.unwrap_err();
    let took = started.elapsed();
    assert!(took < Duration::from_millis(250), "a release on dead nodes took {took:?}: {err}");
    assert_eq!(cluster.count_key("dead"), 0, "the live node's release ran");
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
    rl.try_lock("warm").await.unwrap().release().await.unwrap();
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

/// A lock's acquisition reaches node 2 while it hangs (SIGSTOP) and waits in its socket
/// buffer; the connection is reset once; the release answers at the quorum and its
/// re-sends to node 2 stop at the claim's horizon; node 2 wakes up well after that and
/// runs the buffered acquisition: past its deadline, it sets nothing.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn an_acquisition_buffered_in_a_node_that_wakes_after_the_lease_sets_nothing() {
    let mut faulty = FaultyCluster::start(3).unwrap();
    let ttl = Duration::from_secs(1);
    let rl = common::builder_for(faulty.urls(), Duration::from_millis(100))
        .connect_timeout(Duration::from_millis(200))
        .ttl(ttl)
        .build()
        .unwrap();
    rl.try_lock("warm").await.unwrap().release().await.unwrap();
    faulty.inject(Fault::Pause, &[2]).unwrap();
    let started = Instant::now();
    let lock = rl.try_lock("late").await.unwrap();
    tokio::time::sleep(Duration::from_millis(50)).await;
    faulty.proxy(2).set_fault(NetFault::Reset);
    tokio::time::sleep(Duration::from_millis(50)).await;
    faulty.proxy(2).heal();
    lock.release().await.unwrap();
    // Past the lease, the connect and node timeouts, and the clock's error: the horizon.
    tokio::time::sleep_until((started + Duration::from_millis(3_000)).into()).await;
    faulty.cluster_mut().node_mut(2).resume().unwrap();
    tokio::time::sleep(Duration::from_millis(500)).await;
    let cluster = faulty.cluster();
    assert!(
        common::refusals(cluster.node(2), "LATE") + common::refusals(cluster.node(2), "UNDONE") > 0,
        "the premise: node 2 ran the buffered acquisition when it woke up, and refused it"
    );
    assert_eq!(
        cluster.count_key("late"),
        0,
        "the late acquisition set the key on node 2 for {} ms",
        cluster.node(2).pttl("late").unwrap()
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

/// Whether the released key came back: node 2 paused with the acquisition buffered, the
/// connection reset, the release `Ok`, and the node woken 5 s later, after the release's
/// tries stopped (the claim's horizon: the lease, the connect timeout, two node timeouts,
/// the clock's error; under 4 s here). The buffered `SET` must then find itself past its
/// deadline. With `busy`, the client's first connection to node 2 opened while the node
/// turned busy in another client's script between the connect's `SCRIPT LOAD` and its
/// `TIME` (held back 300 ms by the proxy): that `TIME` was answered `BUSY`.
async fn late_set_comes_back(busy: bool) -> bool {
    let mut faulty = FaultyCluster::start(3).unwrap();
    let ttl = Duration::from_millis(500);
    let rl =
        common::builder_for(faulty.urls(), Duration::from_millis(200)).ttl(ttl).build().unwrap();
    faulty.proxy(2).hold_requests_containing(b"$4\r\nTIME\r\n", Duration::from_millis(300));
    let warm = {
        let rl = rl.clone();
        tokio::spawn(async move { rl.try_lock("warm").await.unwrap().release().await.unwrap() })
    };
    tokio::time::sleep(Duration::from_millis(100)).await;
    let script = busy.then(|| busy_for(&faulty, 2, Duration::from_millis(1000)));
    warm.await.unwrap();
    if let Some(script) = script {
        script.join().unwrap();
    }
    faulty.proxy(2).release_holds();
    // The connection to node 2 works now.
    let deadline = Instant::now() + Duration::from_secs(3);
    loop {
        if let Ok(lock) = rl.try_lock("ready").await {
            let on_2 = faulty.cluster().nodes_holding("ready", lock.token()).contains(&2);
            lock.release().await.unwrap();
            if on_2 {
                break;
            }
        }
        assert!(Instant::now() < deadline, "node 2 never granted");
        tokio::time::sleep(Duration::from_millis(50)).await;
    }

    let key = "late-set";
    faulty.cluster_mut().node_mut(2).pause().unwrap();
    let lock = rl.try_lock(key).await.unwrap();
    let token = lock.token().to_owned();
    tokio::time::sleep(Duration::from_millis(30)).await;
    faulty.proxy(2).set_fault(NetFault::Reset);
    lock.release().await.unwrap();
    tokio::time::sleep(Duration::from_secs(5)).await;
    faulty.cluster_mut().node_mut(2).resume().unwrap();
    let back = || faulty.cluster().nodes_holding(key, &token) == vec![2];
    common::eventually(Duration::from_millis(400), back).await
}

/// The late `SET` of a released lock, run by a node woken after the release's tries
/// stopped, is past its deadline and leaves nothing.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_set_run_after_the_releases_tries_stopped_leaves_nothing() {
    assert!(!late_set_comes_back(false).await, "the released key came back on node 2");
}

/// The same late `SET`, where the node's `TIME` was answered `BUSY` when the connection
/// opened (a moment's state of the node, not a user without `+time`): that connect fails
/// and the next one reads the clock, so the late `SET` still carries its deadline.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_node_busy_when_its_connection_opened_still_refuses_a_late_set() {
    assert!(!late_set_comes_back(true).await, "the released key came back on node 2 for a lease");
}
