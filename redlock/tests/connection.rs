//! Connections: lazy, shared, and re-established after a node restarts; a cold start over
//! slow links is bounded by the connect timeout, not by the first request's node timeout.

mod common;

use std::time::{Duration, Instant};

use redlock::{ErrorKind, NodeOutcome, Redlock, Retry};
use redlock_testkit::{FaultyCluster, NetFault};

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn nodes_down_at_build_time_are_used_once_they_come_up() {
    let mut cluster = common::cluster(3);
    cluster.node_mut(0).kill().unwrap();
    let rl = common::client(&cluster);
    rl.try_lock("k").await.unwrap().release().await.unwrap();
    cluster.node_mut(0).start_again().unwrap();
    let lock = rl.try_lock("k").await.unwrap();
    assert!(
        common::eventually(Duration::from_secs(1), || cluster
            .nodes_holding("k", lock.token())
            .len()
            == 3)
        .await
    );
    lock.release().await.unwrap();
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn every_node_reconnects_after_a_restart() {
    let mut cluster = common::cluster(3);
    let rl = common::client(&cluster);
    rl.try_lock("k").await.unwrap().release().await.unwrap();
    for i in 0..3 {
        cluster.node_mut(i).restart().unwrap();
    }
    // The cached connections are dead; the first request on each notices and reconnects,
    // and the restarted nodes' empty script caches are refilled.
    let lock = rl.try_lock("k").await.unwrap();
    assert!(
        common::eventually(Duration::from_secs(1), || cluster
            .nodes_holding("k", lock.token())
            .len()
            == 3)
        .await
    );
    lock.release().await.unwrap();
    // Decided at the quorum: the last node's release may still be on its way.
    assert!(common::eventually(Duration::from_secs(1), || cluster.count_key("k") == 0).await);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_restart_between_lock_and_release_still_releases_everywhere() {
    let mut cluster = common::cluster(3);
    let rl = common::client(&cluster);
    let lock = rl.try_lock("k").await.unwrap();
    cluster.node_mut(1).restart().unwrap();
    // Node 1 lost the key (no persistence) and its script cache; the others release.
    lock.release().await.unwrap();
    // Decided at the quorum: the last node's release may still be on its way.
    assert!(common::eventually(Duration::from_secs(1), || cluster.count_key("k") == 0).await);
    let lock = rl.try_lock("k").await.unwrap();
    let err_free = lock.release().await;
    assert!(err_free.is_ok());
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_killed_node_is_reported_unreachable() {
    let mut cluster = common::cluster(3);
    // A refusal comes at once; the room is for a loaded CI machine, where noticing the
    // dead connection and the refused reconnect once took over 200 ms (reported timed out).
    let rl = common::builder(&cluster, Duration::from_secs(1)).build().unwrap();
    let mut lock = rl.try_lock("k").await.unwrap();
    cluster.node_mut(0).kill().unwrap();
    cluster.node_mut(1).kill().unwrap();
    let err = lock.extend(Duration::from_secs(1)).await.unwrap_err();
    let outcomes: Vec<_> = err.nodes().iter().map(|n| n.outcome().clone()).collect();
    assert!(matches!(outcomes[0], NodeOutcome::Unreachable(_)), "{err}");
    assert!(matches!(outcomes[1], NodeOutcome::Unreachable(_)), "{err}");
    assert!(err.nodes()[0].node().starts_with("127.0.0.1:"), "{err}");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn one_server_under_two_urls_gets_one_vote() {
    let mut cluster = common::cluster(2);
    let first = cluster.node(0).url();
    let alias = first.replace("127.0.0.1", "localhost");
    let rl = redlock::Redlock::builder()
        .nodes([first, alias, cluster.node(1).url()])
        .node_timeout(Duration::from_millis(500))
        .retry(redlock::Retry::never())
        .build()
        .unwrap();
    // Both distinct servers up: granted by two votes of three, the alias refused.
    rl.try_lock("k").await.unwrap().release().await.unwrap();
    // One real server left: it must not win the lock with two votes.
    cluster.node_mut(1).kill().unwrap();
    let err = rl.try_lock("k").await.unwrap_err();
    assert_eq!(err.kind(), redlock::ErrorKind::Unavailable, "{err}");
    assert!(err.to_string().contains("same server as node"), "{err}");
}

/// Each way, on every link of the slow-link tests.
const SLOW: u64 = 10;

/// Opening a connection is several round trips (TCP, `SCRIPT LOAD`, `INFO`): over links
/// of 10 ms each way (a 20 ms round trip, 25-30 ms through the proxies on a loaded
/// machine) that is more than the default 50 ms node timeout, which bounds only the
/// request once its node has a connection. The first attempt of a fresh client with the
/// defaults is granted. (At 20 ms each way a warm request alone, 40 ms and more, has no
/// room in a 50 ms node timeout: such links need a longer one.)
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_first_attempt_over_slow_links_with_the_default_timeouts_is_granted() {
    let faulty = FaultyCluster::start(3).unwrap();
    for i in 0..faulty.len() {
        faulty.proxy(i).set_fault(common::latency(SLOW));
    }
    let rl = Redlock::builder().nodes(faulty.urls()).retry(Retry::never()).build().unwrap();
    let lock = rl.try_lock("k").await.unwrap();
    // Decided at the quorum: the third node's yes may still be on its way.
    assert!(faulty.cluster().nodes_holding("k", lock.token()).len() >= 2);
    lock.release().await.unwrap();
}

/// `Redlock::connect` opens every node's connection at once and reports each; after it,
/// the first attempt over slow links finds them open.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn connect_opens_every_node_at_once_and_reports_each() {
    let faulty = FaultyCluster::start(3).unwrap();
    for i in 0..faulty.len() {
        faulty.proxy(i).set_fault(common::latency(SLOW));
    }
    let rl = Redlock::builder().nodes(faulty.urls()).retry(Retry::never()).build().unwrap();
    let reports = rl.connect().await.unwrap();
    assert_eq!(reports.len(), 3);
    assert!(reports.iter().all(|r| *r.outcome() == NodeOutcome::Ok), "{reports:?}");
    assert!((0..3).all(|i| faulty.proxy(i).connections() >= 1));
    rl.try_lock("k").await.unwrap().release().await.unwrap();

    // A majority that cannot be connected to: `Unavailable`, naming each node's failure.
    let mut faulty = faulty;
    faulty.cluster_mut().node_mut(0).kill().unwrap();
    faulty.cluster_mut().node_mut(1).kill().unwrap();
    let rl = Redlock::builder().nodes(faulty.urls()).build().unwrap();
    let err = rl.connect().await.unwrap_err();
    assert_eq!(err.kind(), ErrorKind::Unavailable, "{err}");
    assert_eq!(err.faulty(), 2, "{err}");
    assert_eq!(*err.nodes()[2].outcome(), NodeOutcome::Ok, "{err}");
}

/// A node that accepts connections and never answers (a blackholed link) from the start:
/// the first attempt that needs its vote (the two others split) waits for its connect at
/// most the connect timeout and then its node timeout, and is refused; the next attempt
/// does not wait for a connect again, only its node timeout, while the node stays silent.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_node_that_never_answers_holds_an_attempt_at_most_one_connect_timeout() {
    const CONNECT: Duration = Duration::from_secs(2);
    const NODE: Duration = Duration::from_millis(100);
    let faulty = FaultyCluster::start(3).unwrap();
    faulty.proxy(2).set_fault(NetFault::Blackhole);
    // Another owner on node 1: node 0's yes needs node 2's to make a quorum.
    faulty.cluster().node(1).set("k", "another-owner").unwrap();
    let rl = Redlock::builder()
        .nodes(faulty.urls())
        .node_timeout(NODE)
        .connect_timeout(CONNECT)
        .retry(Retry::never())
        .build()
        .unwrap();
    for attempt in 0..2 {
        let started = Instant::now();
        let err = rl.try_lock("k").await.unwrap_err();
        let took = started.elapsed();
        assert_eq!(err.kind(), ErrorKind::NotAcquired, "{err}");
        let bound = if attempt == 0 { CONNECT + NODE } else { NODE };
        // Generous: a loaded machine is slow, but not by a second.
        assert!(took < bound + Duration::from_secs(1), "attempt {attempt} took {took:?}");
    }
    assert_eq!(faulty.cluster().count_key("k"), 1, "only the other owner's key");
}

/// A refused attempt whose acquisition on a slow node is still waiting for its connect when
/// the round is decided (the two fast nodes hold another owner's key): the acquisition goes
/// on in the background and its `SET` lands once the connect opens, so its clean-up must not
/// be skipped as "never left the client": no key of ours is left on the slow node.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_refused_attempt_whose_slow_connect_opens_after_the_round_leaves_no_key() {
    let faulty = FaultyCluster::start(3).unwrap();
    // A connect is several round trips: 150 ms each way makes it take about a second.
    faulty.proxy(2).set_fault(common::latency(150));
    for i in 0..2 {
        faulty.cluster().node(i).set("k", "another-owner").unwrap();
    }
    let rl = Redlock::builder()
        .nodes(faulty.urls())
        .node_timeout(Duration::from_millis(500))
        .connect_timeout(Duration::from_secs(5))
        .ttl(Duration::from_secs(30))
        .retry(Retry::never())
        .build()
        .unwrap();
    let started = Instant::now();
    let err = rl.try_lock("k").await.unwrap_err();
    assert_eq!(err.kind(), ErrorKind::NotAcquired, "{err}");
    assert!(started.elapsed() < Duration::from_millis(900), "decided without the slow node");
    // The slow node's acquisition and then its clean-up: well within 8 s.
    let node = faulty.cluster().node(2);
    let mut seen = Vec::new();
    for _ in 0..80 {
        tokio::time::sleep(Duration::from_millis(100)).await;
        seen.push(node.get("k").unwrap());
    }
    assert_eq!(node.get("k").unwrap(), None, "a key of the refused attempt was left: {seen:?}");
    // The acquisition did land there: the clean-up had something to undo.
    assert!(common::create_calls(node) >= 1, "the slow node never ran the SET: {seen:?}");
}

/// The client's connections to node `i` as the node lists them: ordinary clients (not
/// pub/sub), not the one asking.
fn connections_to(cluster: &redlock_testkit::Cluster, i: usize) -> usize {
    let list: String =
        redis::cmd("CLIENT").arg("LIST").query(&mut cluster.node(i).connection().unwrap()).unwrap();
    list.lines()
        .filter(|line| line.contains(" flags=N ") && !line.contains("cmd=client|list"))
        .count()
}

/// Requests go out on a connection driven where their caller runs (no thread crossed on
/// the way out or back): each multi-thread runtime that uses a client gets its own
/// connection to every node, next to the one of the client's own thread (its background
/// work), and a runtime's connections close when it ends, however many runtimes come and
/// go.
#[test]
fn each_multi_thread_runtime_has_its_own_connections_closed_when_it_ends() {
    let cluster = common::cluster(3);
    let rl = common::client(&cluster);
    let each_node_has = |n: usize| {
        let deadline = Instant::now() + Duration::from_secs(5);
        loop {
            let counts: Vec<usize> =
                (0..cluster.len()).map(|i| connections_to(&cluster, i)).collect();
            if counts.iter().all(|&count| count == n) || Instant::now() >= deadline {
                return counts;
            }
            std::thread::sleep(Duration::from_millis(20));
        }
    };
    let lock_and_release = |runtime: &tokio::runtime::Runtime, key: &'static str| {
        runtime.block_on(async { rl.try_lock(key).await.unwrap().release().await.unwrap() });
    };
    let a = common::runtimes::multi_thread(2);
    lock_and_release(&a, "a");
    assert_eq!(each_node_has(2), [2, 2, 2], "runtime a's and the own thread's");
    let b = common::runtimes::multi_thread(2);
    lock_and_release(&b, "b");
    assert_eq!(each_node_has(3), [3, 3, 3], "runtime b has connections of its own");
    drop(a);
    assert_eq!(each_node_has(2), [2, 2, 2], "runtime a's connections closed with it");
    for _ in 0..5 {
        let short = common::runtimes::multi_thread(1);
        lock_and_release(&short, "short");
        drop(short);
    }
    assert_eq!(each_node_has(2), [2, 2, 2], "short-lived runtimes leave no connection");
    lock_and_release(&b, "b");
    assert_eq!(each_node_has(2), [2, 2, 2], "runtime b still uses its own");
}

/// A multi-thread runtime built without I/O cannot open a connection of its own (Tokio
/// panics, once per node, in the connect's task): its requests then go out on the client's
/// own thread's connections, and locks still work there.
#[test]
fn a_runtime_without_io_still_locks_through_the_clients_own_thread() {
    let cluster = common::cluster(3);
    let rl = common::client(&cluster);
    let runtime = tokio::runtime::Builder::new_multi_thread()
        .worker_threads(2)
        .enable_time()
        .build()
        .unwrap();
    runtime.block_on(async {
        // The first connect on such a runtime panics inside its task (no I/O driver), and
        // the client turns to its own thread's connection: on a loaded machine that can
        // cost the first attempt its node timeouts, never more than that one.
        let first = rl.try_lock("first").await;
        if let Err(err) = &first {
            assert_eq!(err.kind(), redlock::ErrorKind::Unavailable, "{err}");
        }
        for key in ["second", "third"] {
            rl.try_lock(key).await.unwrap().release().await.unwrap();
        }
        if let Ok(lock) = first {
            lock.release().await.unwrap();
        }
    });
}

/// A multi-thread runtime kept between calls (a synchronous wrapper's, entered with
/// `block_on` per call) drives its connections while no call runs: what a call left to
/// the background (an acquisition's and a release's slowest node) still goes out and is
/// answered without another call.
#[test]
fn a_sync_wrappers_multi_thread_runtime_finishes_its_requests_between_calls() {
    let faulty = FaultyCluster::start(3).unwrap();
    let rl = common::builder_for(faulty.urls(), Duration::from_millis(500)).build().unwrap();
    let runtime = common::runtimes::multi_thread(2);
    runtime.block_on(async { rl.try_lock("warm").await.unwrap().release().await.unwrap() });
    faulty.proxy(2).set_fault(common::latency(100));
    let lock = runtime.block_on(async { rl.try_lock("k").await.unwrap() });
    let token = lock.token().to_owned();
    let holding = |n: usize| {
        let deadline = Instant::now() + Duration::from_secs(5);
        loop {
            let on = faulty.cluster().nodes_holding("k", &token).len();
            if on == n || Instant::now() >= deadline {
                return on;
            }
            std::thread::sleep(Duration::from_millis(10));
        }
    };
    assert_eq!(holding(3), 3, "the acquisition's slowest node, while no call runs");
    let started = Instant::now();
    runtime.block_on(async { lock.release().await.unwrap() });
    assert!(started.elapsed() < Duration::from_millis(200), "the release waited for node 2");
    assert_eq!(holding(0), 0, "the release's slowest node, while no call runs");
    faulty.proxy(2).heal();
}

/// An acquisition's slowest node (its connection still opening when the quorum decided)
/// is left to the caller's runtime; if that runtime then sits idle (a synchronous
/// wrapper's current-thread runtime between calls) past the point where nothing of the
/// lock may exist any more, the request must not go out fresh when the runtime runs again:
/// the lock was released meanwhile (dropped on another thread), and a create sent then
/// would set the key again for a whole lease, after its release's tombstone expired.
#[test]
fn an_acquisition_left_in_an_idle_runtime_does_not_set_the_key_after_its_release() {
    let faulty = FaultyCluster::start(3).unwrap();
    let ttl = Duration::from_secs(1);
    let rl =
        common::builder_for(faulty.urls(), Duration::from_millis(200)).ttl(ttl).build().unwrap();
    // Node 2's connect (TCP, the script preload, `TIME`, `INFO`) takes several round trips
    // of 2 x 40 ms: the quorum of nodes 0 and 1 decides first.
    faulty.proxy(2).set_fault(common::latency(40));
    let runtime = tokio::runtime::Builder::new_current_thread().enable_all().build().unwrap();
    let lock = runtime.block_on(async { rl.try_lock("k").await.unwrap() });
    let token = lock.token().to_owned();
    // Released outside any runtime: on the client's own thread, everywhere.
    std::thread::spawn(move || drop(lock)).join().unwrap();
    let node = faulty.cluster().node(2);
    // Past the lock's horizon (lease, connect timeout, node timeouts, clock errors): the
    // release's tombstone on node 2 is gone.
    std::thread::sleep(Duration::from_secs(4));
    assert_eq!(faulty.cluster().count_key("k"), 0);
    // The wrapper's next call runs the runtime again.
    runtime.block_on(async { tokio::time::sleep(Duration::from_millis(300)).await });
    assert_eq!(
        node.get("k").unwrap(),
        None,
        "the released lock's key {token} came back on node 2 (pttl {:?})",
        node.pttl("k")
    );
    drop(runtime);
}

/// A synchronous wrapper's current-thread runtime runs only during its calls. A release
/// answered by a quorum leaves its slowest node's request to the background; if that
/// node's connection then breaks with the release unanswered, the release is sent again
/// while the runtime sits idle, not at the wrapper's next call or the lease's end.
#[test]
fn a_release_whose_slow_node_resets_after_an_idle_sync_wrappers_call_still_reaches_it() {
    let faulty = FaultyCluster::start(3).unwrap();
    let rl = common::builder_for(faulty.urls(), Duration::from_millis(500))
        .ttl(Duration::from_secs(30))
        .build()
        .unwrap();
    let runtime = tokio::runtime::Builder::new_current_thread().enable_all().build().unwrap();
    runtime.block_on(async { rl.try_lock("warm").await.unwrap().release().await.unwrap() });
    let lock = runtime.block_on(async { rl.try_lock("k").await.unwrap() });
    let token = lock.token().to_owned();
    let node = faulty.cluster().node(2);
    let deadline = Instant::now() + Duration::from_secs(5);
    while node.get("k").unwrap().as_deref() != Some(&token) && Instant::now() < deadline {
        std::thread::sleep(Duration::from_millis(5));
    }
    faulty.proxy(2).set_fault(common::latency(100));
    runtime.block_on(async { lock.release().await.unwrap() });
    // The release to node 2 is still in the proxy: lost, and its connection closed.
    faulty.proxy(2).set_fault(NetFault::Blackhole);
    std::thread::sleep(Duration::from_millis(300));
    faulty.proxy(2).heal();
    let deadline = Instant::now() + Duration::from_secs(8);
    while node.exists("k").unwrap() && Instant::now() < deadline {
        std::thread::sleep(Duration::from_millis(20));
    }
    assert!(
        !node.exists("k").unwrap(),
        "left on node 2 while the wrapper's runtime sits idle (pttl {:?})",
        node.pttl("k")
    );
    drop(runtime);
}
