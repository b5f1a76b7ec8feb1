//! Connections: lazy, shared, and re-established after a node restarts; a cold start over
//! slow links is bounded by the connect timeout, not by the first request's node timeout.
//! Scripts run by hash from a new connection's first request, with the `EVAL` fallback and a
//! reload after a script flush; a dead cached connection is replaced; cancelled attempts
//! never make two holders nor hang.

use crate::common;

use std::future::{Future, IntoFuture};
use std::sync::Arc;
use std::sync::atomic::{AtomicUsize, Ordering};
use std::task::Poll;
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
    // Staging: every node answered the acquisition (a round is decided by the first two),
    // so the extension goes out on open connections, not behind a connect still under way.
    common::held_on(&cluster, "k", lock.token(), &[0, 1, 2]).await;
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
/// the round is decided (the two fast nodes hold another owner's key): its clean-up is
/// issued before the acquisition is queued, so the acquisition is never sent, and no key
/// of ours ever appears on the slow node.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_refused_attempts_create_still_connecting_at_its_clean_up_is_never_sent() {
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
    assert!(seen.iter().all(Option::is_none), "a key of the refused attempt appeared: {seen:?}");
    assert_eq!(common::create_calls(node), 0, "the slow node ran the acquisition: {seen:?}");
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
    runtime.block_on(async { common::warm(&rl).await });
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

// Scripts and connections under script flushes, stale connections and cancellation.

/// A clean-up round that sends to some nodes only (nodes 0-2 answered Held: no clean-up
/// there, their entries of the clean-up's `Slots` are never used), with its clean-up on
/// node 4 still in flight behind the abandoned SET. The next attempt of the same client
/// must wait, on node 4 only, for that clean-up (Pending filtered to node 4), and is then
/// granted on node 4 too (not refused by its own abandoned SET).
///
/// Order on node 4's connection if Pending were filtered to the wrong node / the slot
/// index were wrong: SET(a1) [held], SET(a2) -> refused by a1's token, clean-up(a1).
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_partial_clean_up_is_waited_for_on_its_own_node_only() {
    let faulty = FaultyCluster::start(5).unwrap();
    let rl = common::builder_for(faulty.urls(), Duration::from_millis(150)).build().unwrap();
    common::warm(&rl).await;
    let cluster = faulty.cluster();
    for round in 0..5 {
        let key = format!("k{round}");
        for i in [0, 1, 2] {
            cluster.node(i).set(&key, "foreign").unwrap();
        }
        // a1's SET on node 4 is held 400 ms: it times out (150 ms) and its clean-up there
        // is queued behind it, in the background.
        faulty.proxy(4).hold_requests_containing(b"NX", Duration::from_millis(400));
        let err = rl.try_lock(&key).await.unwrap_err();
        assert_eq!(err.kind(), ErrorKind::NotAcquired, "{err}");
        faulty.proxy(4).release_holds();
        for i in [0, 1, 2] {
            cluster.node(i).command(&["DEL", &key]).unwrap();
        }
        // a2 at once: node 4 has a1's SET (held) then a1's clean-up in flight. Node timeout
        // 150 ms: a2's SET on node 4 may time out while it waits; that is fine. What must
        // never happen is a2's SET on node 4 refused as Held by a1's token.
        let a2 = rl.try_lock(&key).await.unwrap_or_else(|err| panic!("round {round}: {err}"));
        let token = a2.token().to_string();
        tokio::time::sleep(Duration::from_millis(700)).await;
        let on4 = cluster.node(4).get(&key).unwrap();
        // a1's token must be gone from node 4 (its clean-up ran after its SET), and never
        // a token other than a2's.
        assert!(
            on4.is_none() || on4.as_deref() == Some(token.as_str()),
            "round {round}: node 4 holds {on4:?}, a2 is {token}"
        );
        a2.release().await.unwrap();
        assert!(common::eventually(Duration::from_secs(2), || cluster.count_key(&key) == 0).await);
    }
}

/// Same, but with a node timeout long enough that a2's SET on node 4 waits for the clean-up
/// and goes out: it must be granted there (a2 on all 5 nodes), which fails if the wait is
/// skipped (a1's SET refuses a2) or waits for the wrong slot.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_next_attempt_is_granted_on_the_node_of_the_abandoned_set() {
    let faulty = FaultyCluster::start(5).unwrap();
    let rl = common::builder_for(faulty.urls(), Duration::from_millis(2000)).build().unwrap();
    common::warm(&rl).await;
    let cluster = faulty.cluster();
    for i in [0, 1, 2] {
        faulty.proxy(i).set_fault(common::latency(5));
    }
    for round in 0..4 {
        let key = format!("j{round}");
        for i in [0, 1, 2] {
            cluster.node(i).set(&key, "foreign").unwrap();
        }
        faulty.proxy(4).hold_requests_containing(b"NX", Duration::from_millis(300));
        // Decided by the three Held answers (~10 ms) while node 4's SET is held.
        let started = Instant::now();
        let err = rl.try_lock(&key).await.unwrap_err();
        assert_eq!(err.kind(), ErrorKind::NotAcquired, "{err}");
        assert!(started.elapsed() < Duration::from_millis(250), "{:?}", started.elapsed());
        faulty.proxy(4).release_holds();
        for i in [0, 1, 2] {
            cluster.node(i).command(&["DEL", &key]).unwrap();
        }
        let a2 = rl.try_lock(&key).await.unwrap_or_else(|err| panic!("round {round}: {err}"));
        let token = a2.token().to_string();
        let everywhere = common::eventually(Duration::from_secs(2), || {
            cluster.nodes_holding(&key, &token).len() == 5
        })
        .await;
        assert!(
            everywhere,
            "round {round}: a2 holds {:?}; node 4 has {:?}",
            cluster.nodes_holding(&key, &token),
            cluster.node(4).get(&key).unwrap()
        );
        a2.release().await.unwrap();
    }
}

/// Scripts flushed on every node behind warm connections: every kind's scripted steps get
/// NOSCRIPT and fall back to EVAL.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn every_kind_works_after_a_script_flush() {
    let faulty = FaultyCluster::start(3).unwrap();
    let cluster = faulty.cluster();
    let rl = common::builder_for(faulty.urls(), Duration::from_millis(500)).build().unwrap();
    let flush = || {
        for i in 0..3 {
            cluster.node(i).command(&["SCRIPT", "FLUSH"]).unwrap();
        }
    };
    let mut plain = rl.try_lock("p").fenced().await.unwrap();
    let mut re = rl.reentrant("r", "me").once().await.unwrap();
    let multi = rl.many(&["m1", "m2"]).once().await.unwrap();
    let read = rl.read("rw").once().await.unwrap();
    flush();
    plain.extend(Duration::from_secs(10)).await.unwrap();
    re.extend(Duration::from_secs(10)).await.unwrap();
    assert!(plain.check_held().await.unwrap());
    flush();
    let re2 = rl.reentrant("r", "me").once().await.unwrap();
    flush();
    re2.release().await.unwrap();
    re.release().await.unwrap();
    plain.release().await.unwrap();
    multi.release().await.unwrap();
    read.release().await.unwrap();
    flush();
    let w = rl.write("rw").once().await.unwrap();
    flush();
    w.release().await.unwrap();
    for key in ["p", "r", "m1", "m2", "rw"] {
        assert!(
            common::eventually(Duration::from_secs(1), || cluster.count_key(key) == 0).await,
            "{key} left on {:?}",
            cluster.nodes_with_key(key).unwrap()
        );
    }
}

const PASSWORD: &str = "slots-pass";

/// Stale connection AND NOSCRIPT on the re-send: an ACL user that may not SCRIPT LOAD (the
/// new connection's preload is refused), scripts flushed, connections reset under warm
/// clients. A release then goes: EVALSHA on the dead cached connection (stale) -> re-sent
/// on a new one -> NOSCRIPT -> EVAL (boxed) -> deleted. Then a new lock must be granted.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_stale_connection_then_noscript_on_the_resend_still_releases() {
    let faulty = FaultyCluster::start(3).unwrap();
    let cluster = faulty.cluster();
    let rules = [
        "on",
        "~*",
        "&*",
        "+get",
        "+set",
        "+del",
        "+pttl",
        "+hset",
        "+hdel",
        "+hgetall",
        "+pexpire",
        "+pexpireat",
        "+time",
        "+publish",
        "+eval",
        "+evalsha",
        "+subscribe",
        "+unsubscribe",
        "+info",
        "+incr",
        "+incrby",
        "+ping",
        "+hello",
        "+client",
        "+select",
    ];
    for node in cluster.nodes() {
        node.acl_setuser("noload", PASSWORD, &rules).unwrap();
    }
    let urls: Vec<String> = (0..3)
        .map(|i| format!("redis://noload:{PASSWORD}@127.0.0.1:{}", faulty.proxy(i).port()))
        .collect();
    let rl = common::builder_for(urls, Duration::from_millis(500)).build().unwrap();
    for round in 0..4 {
        let key = format!("s{round}");
        let mut lock = rl.try_lock(&key).await.unwrap();
        let mut re = rl.reentrant(&format!("re{round}"), "o").once().await.unwrap();
        for i in 0..3 {
            cluster.node(i).command(&["SCRIPT", "FLUSH"]).unwrap();
            faulty.proxy(i).heal();
            faulty.proxy(i).reset_connections();
        }
        if round % 2 == 0 {
            lock.extend(Duration::from_secs(10)).await.unwrap();
            for i in 0..3 {
                cluster.node(i).command(&["SCRIPT", "FLUSH"]).unwrap();
                faulty.proxy(i).heal();
                faulty.proxy(i).reset_connections();
            }
        }
        lock.release().await.unwrap_or_else(|err| panic!("round {round}: {err}"));
        re.extend(Duration::from_secs(5)).await.unwrap();
        re.release().await.unwrap();
        assert!(common::eventually(Duration::from_secs(1), || cluster.count_key(&key) == 0).await);
        assert!(
            common::eventually(Duration::from_secs(1), || cluster.count_key(&format!("re{round}"))
                == 0)
            .await
        );
        rl.try_lock(&key).await.unwrap().release().await.unwrap();
    }
}

/// A killed then restarted node (same port) behind a warm client: its cached connection
/// is dead; the next SET and release go out on a new one (stale detection through
/// `ready()`), and the node counts again at once. The nodes restart without their data:
/// the release after the second restarts finds nothing and says so (nothing was written
/// on the dead connections, so "absent" is not read as "removed by an earlier try"), and
/// nothing is left.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_dead_cached_connection_is_replaced_on_the_fast_path() {
    let mut cluster = common::cluster(3);
    let rl = common::builder(&cluster, Duration::from_millis(500)).build().unwrap();
    for round in 0..4 {
        common::warm(&rl).await;
        for i in 0..3 {
            cluster.node_mut(i).restart().unwrap();
        }
        // Every cached connection is dead: each SET is re-sent.
        let lock = rl.try_lock("x").await.unwrap_or_else(|err| panic!("round {round}: {err}"));
        // The grant returns at the quorum: the third SET may still be on its way.
        let everywhere = || cluster.nodes_holding("x", lock.token()).len() == 3;
        assert!(
            common::eventually(Duration::from_secs(1), everywhere).await,
            "round {round}: held on {:?}",
            cluster.nodes_holding("x", lock.token())
        );
        for i in 0..3 {
            cluster.node_mut(i).restart().unwrap();
        }
        // NotHeld: the keys went with the restarts. (Ok only if a driver had not yet seen
        // its node's EOF when the release went out: a known limit.)
        let released = lock.release().await.map_err(|err| err.kind());
        assert!(
            matches!(released, Ok(()) | Err(redlock::ErrorKind::NotHeld)),
            "round {round}: {released:?}"
        );
        assert!(
            common::eventually(Duration::from_secs(1), || cluster.count_key("x") == 0).await,
            "round {round}: left on {:?}",
            cluster.nodes_with_key("x").unwrap()
        );
    }
}

/// Attempts cancelled at random points (before the first poll, mid-round, during the
/// clean-up) by two clients on slow links, while the others lock: never two holders, and
/// every cancelled attempt's keys removed (nothing waits forever: every task ends).
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn cancelled_attempts_never_make_two_holders_nor_hang() {
    let faulty = FaultyCluster::start(5).unwrap();
    for i in 0..5 {
        faulty.proxy(i).set_fault(NetFault::Latency {
            fixed: Duration::from_millis(2 + i as u64 * 3),
            jitter: Duration::from_millis(6),
        });
    }
    let holders = Arc::new(AtomicUsize::new(0));
    let granted = Arc::new(AtomicUsize::new(0));
    let end = Instant::now() + Duration::from_secs(6);
    let tasks: Vec<_> = (0..4u64)
        .map(|c| {
            let rl = common::builder_for(faulty.urls(), Duration::from_millis(80))
                .retry(
                    Retry::new()
                        .with_unbounded_attempts()
                        .with_delay(Duration::from_millis(3))
                        .with_jitter(Duration::from_millis(5))
                        .with_max_wait(Duration::from_millis(300)),
                )
                .build()
                .unwrap();
            let (holders, granted) = (holders.clone(), granted.clone());
            tokio::spawn(async move {
                let mut seed = 0x9e37_79b9_7f4a_7c15u64 ^ (c + 1);
                while Instant::now() < end {
                    seed ^= seed << 13;
                    seed ^= seed >> 7;
                    seed ^= seed << 17;
                    let cancel_after = Duration::from_millis(seed % 40);
                    let attempt = rl.lock("shared");
                    let lock = if seed.is_multiple_of(3) {
                        attempt.await
                    } else {
                        match tokio::time::timeout(cancel_after, attempt.into_future()).await {
                            Ok(result) => result,
                            Err(_) => continue,
                        }
                    };
                    let Ok(lock) = lock else { continue };
                    assert_eq!(holders.fetch_add(1, Ordering::SeqCst), 0, "two holders");
                    granted.fetch_add(1, Ordering::SeqCst);
                    tokio::time::sleep(Duration::from_millis(seed % 5)).await;
                    holders.fetch_sub(1, Ordering::SeqCst);
                    if seed.is_multiple_of(4) {
                        drop(lock);
                    } else {
                        let _ = lock.release().await;
                    }
                }
            })
        })
        .collect();
    for task in tasks {
        tokio::time::timeout(Duration::from_secs(30), task).await.expect("a task hung").unwrap();
    }
    assert!(granted.load(Ordering::SeqCst) > 5, "only {} grants", granted.load(Ordering::SeqCst));
    let cluster = faulty.cluster();
    assert!(
        common::eventually(Duration::from_secs(3), || cluster.count_key("shared") == 0).await,
        "keys left on {:?}",
        cluster.nodes_with_key("shared").unwrap()
    );
}

// Scripts by hash from a connection's first request, and the EVAL fallback.

/// How long the node answering after the quorum may take.
const SETTLE: Duration = Duration::from_secs(2);

/// One poll of a `try_lock` on a task whose coop budget is (almost) used up, then the
/// future is dropped (a `select!` whose other branch is ready): some request futures may
/// never have been polled. Each must still settle its slot when dropped, or the armed
/// claim's detached release on that node (which waits for it) would wait forever, its
/// registration would stay, and this client's next attempt on the key would wait for it.
async fn cancelled_first_poll(n: usize) {
    let cluster = common::cluster(n);
    let rl: Redlock = common::builder(&cluster, Duration::from_millis(200)).build().unwrap();
    // Connections up on every node.
    common::warm(&rl).await;
    // Same task poll: use up the budget, then poll the attempt once and drop it.
    let polled_once = tokio::spawn({
        let rl = rl.clone();
        async move {
            for _ in 0..128 {
                tokio::task::consume_budget().await;
            }
            let mut attempt = std::pin::pin!(rl.try_lock("k").into_future());
            std::future::poll_fn(|cx| Poll::Ready(attempt.as_mut().poll(cx).is_pending())).await
        }
    })
    .await
    .unwrap();
    assert!(polled_once, "the attempt finished in one poll");
    tokio::time::sleep(Duration::from_millis(500)).await;
    let started = Instant::now();
    let again = rl.try_lock("k").await;
    let took = started.elapsed();
    let shutdown = rl.shutdown(Duration::from_secs(2)).await;
    assert!(
        again.is_ok(),
        "{n} nodes: the next attempt (after {took:?}) was refused: {:?}",
        again.err()
    );
    if let Ok(lock) = again {
        let _ = lock.release().await;
    }
    assert!(shutdown.is_ok(), "{n} nodes: shutdown: {:?}", shutdown.err());
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_cancelled_attempt_over_5_nodes_leaves_nothing_waiting() {
    cancelled_first_poll(5).await;
}

/// Every node forgets its scripts before each step, so each script call goes EVALSHA ->
/// NOSCRIPT -> EVAL (the fallback rebuilt from the EVALSHA's arguments).
fn flush_scripts(cluster: &redlock_testkit::Cluster) {
    for i in 0..cluster.len() {
        common::run(cluster, i, &["SCRIPT", "FLUSH"]);
    }
}

fn evals(cluster: &redlock_testkit::Cluster) -> u64 {
    (0..cluster.len())
        .map(|i| {
            let mut con = cluster.node(i).connection().unwrap();
            let info: String = redis::cmd("INFO").arg("commandstats").query(&mut con).unwrap();
            info.lines()
                .find(|l| l.starts_with("cmdstat_eval:"))
                .and_then(|l| l.split("calls=").nth(1))
                .and_then(|l| l.split(',').next())
                .map(|n| n.parse::<u64>().unwrap())
                .unwrap_or(0)
        })
        .sum()
}

/// Scripts are loaded when a connection opens, before its first request: a fresh client on
/// fresh nodes runs every kind's scripts by hash, with no `NOSCRIPT` and no `EVAL`. (Were they
/// loaded only on demand, a release queued behind a `SET` on a hung node would meet `NOSCRIPT`
/// after its caller gave up, and the late `SET` would stay; see the command module.)
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_new_connection_runs_every_script_by_hash_from_its_first_request() {
    let cluster = common::cluster(3);
    let rl = common::client(&cluster);
    let mut lock = rl.try_lock("p").fenced().await.unwrap();
    lock.extend(Duration::from_secs(20)).await.unwrap();
    lock.release().await.unwrap();
    rl.many(&["m1", "m2"]).once().await.unwrap().release().await.unwrap();
    rl.read("rw").once().await.unwrap().release().await.unwrap();
    rl.write("rw").once().await.unwrap().release().await.unwrap();
    rl.reentrant("re", "job-1").once().await.unwrap().release().await.unwrap();
    tokio::time::sleep(Duration::from_millis(200)).await;
    assert_eq!(evals(&cluster), 0, "a script ran through the EVAL fallback");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn every_kind_works_through_the_eval_fallback() {
    let cluster = common::cluster(3);
    let rl = common::client(&cluster);
    let before = evals(&cluster);

    // Plain: extend + check_held + release, fenced too.
    flush_scripts(&cluster);
    let mut lock = rl.try_lock("p").fenced().await.unwrap();
    flush_scripts(&cluster);
    lock.extend(Duration::from_secs(20)).await.unwrap();
    // Decided at two nodes: the third may answer a moment later.
    let extended = || cluster.pttls("p").unwrap().iter().all(|t| t.is_some_and(|t| t > 10_000));
    assert!(common::eventually(SETTLE, extended).await, "extend via EVAL");
    flush_scripts(&cluster);
    assert!(lock.check_held().await.unwrap());
    flush_scripts(&cluster);
    lock.release().await.unwrap();
    assert!(common::eventually(SETTLE, || cluster.count_key("p") == 0).await, "release via EVAL");

    // Multi: three keys.
    flush_scripts(&cluster);
    let mut many = rl.many(&["m1", "m2", "m3"]).once().await.unwrap();
    for k in ["m1", "m2", "m3"] {
        let set = common::eventually(SETTLE, || cluster.count_key(k) == 3).await;
        assert!(set, "{k} not set by multi_acquire via EVAL");
    }
    flush_scripts(&cluster);
    many.extend(Duration::from_secs(20)).await.unwrap();
    flush_scripts(&cluster);
    assert!(many.check_held().await.unwrap());
    flush_scripts(&cluster);
    many.release().await.unwrap();
    for k in ["m1", "m2", "m3"] {
        let gone = common::eventually(SETTLE, || cluster.count_key(k) == 0).await;
        assert!(gone, "{k} left by multi_release via EVAL");
    }
    // A foreign holder of one of them refuses the set (the keys and args line up).
    cluster.node(0).set("m2", "x").unwrap();
    cluster.node(1).set("m2", "x").unwrap();
    flush_scripts(&cluster);
    assert!(rl.many(&["m1", "m2", "m3"]).once().await.is_err());
    let clean = common::eventually(SETTLE, || cluster.count_key("m1") == 0).await;
    assert!(clean, "a refused multi set left m1 behind");

    // Read/write.
    flush_scripts(&cluster);
    let r1 = rl.read("rw").once().await.unwrap();
    flush_scripts(&cluster);
    let r2 = rl.read("rw").once().await.unwrap();
    flush_scripts(&cluster);
    assert!(rl.write("rw").once().await.is_err(), "a writer got in past two readers");
    flush_scripts(&cluster);
    r1.release().await.unwrap();
    flush_scripts(&cluster);
    r2.release().await.unwrap();
    flush_scripts(&cluster);
    let w = rl.write("rw").once().await.unwrap();
    flush_scripts(&cluster);
    assert!(rl.read("rw").once().await.is_err(), "a reader got in past a writer");
    flush_scripts(&cluster);
    w.release().await.unwrap();

    // Reentrant.
    flush_scripts(&cluster);
    let a = rl.reentrant("re", "job-1").once().await.unwrap();
    flush_scripts(&cluster);
    let b = rl.reentrant("re", "job-1").once().await.unwrap();
    flush_scripts(&cluster);
    assert!(rl.reentrant("re", "job-2").once().await.is_err());
    flush_scripts(&cluster);
    a.release().await.unwrap();
    flush_scripts(&cluster);
    assert!(rl.reentrant("re", "job-2").once().await.is_err(), "still held by b");
    flush_scripts(&cluster);
    b.release().await.unwrap();
    flush_scripts(&cluster);
    rl.reentrant("re", "job-2").once().await.unwrap().release().await.unwrap();

    // Inspect / force release (no arguments / one).
    flush_scripts(&cluster);
    let _held = rl.try_lock("ins").await.unwrap();
    flush_scripts(&cluster);
    let _ = rl.inspect("ins").await.unwrap();
    flush_scripts(&cluster);
    assert!(rl.force_release("ins").await.unwrap() > 0);
    assert!(common::eventually(SETTLE, || cluster.count_key("ins") == 0).await);

    assert!(evals(&cluster) > before + 20, "the fallback was not exercised");
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
    runtime.block_on(async { common::warm(&rl).await });
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

/// A node that is down (its connections end as soon as they open) while many releases
/// wait to reach it, each sent again in the background until its key's horizon, gets a few
/// connects a second from the client, not one per release and re-send: the client neither
/// floods the node's address nor burns its own CPU on connects bound to fail.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_node_that_is_down_gets_a_few_connects_a_second_not_one_per_request() {
    let mut faulty = FaultyCluster::start(3).unwrap();
    let rl = common::builder_for(faulty.urls(), Duration::from_millis(200)).build().unwrap();
    let mut locks = Vec::new();
    for i in 0..100 {
        locks.push(rl.try_lock(&format!("connects:{i}")).await.unwrap());
    }
    // Behind its proxy: each connect is accepted (and counted), then closed.
    faulty.cluster_mut().node_mut(2).kill().unwrap();
    for lock in locks {
        lock.release().await.unwrap();
    }
    let before = faulty.proxy(2).accepted();
    let started = Instant::now();
    for i in 0..100 {
        let lock = rl.try_lock(&format!("connects:more:{i}")).await.unwrap();
        lock.release().await.unwrap();
    }
    tokio::time::sleep(Duration::from_secs(2).saturating_sub(started.elapsed())).await;
    let connects = faulty.proxy(2).accepted() - before;
    eprintln!("{connects} connects in {:?}", started.elapsed());
    assert!(connects <= 20, "{connects} connects in {:?}", started.elapsed());
}
