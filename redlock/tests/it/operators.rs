//! Operators' calls: inspecting a lock, and freeing it by hand.
//! A forced release runs once on each node: under lost replies and resets, after a script
//! flush, for an ACL user without `PING`, and bounded on a hung node.

use crate::common;

use std::time::{Duration, Instant};

use redlock::{ErrorKind, Redlock, Retry};
use redlock_testkit::{FaultyCluster, Fuzz, NetFault};

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn inspect_shows_each_nodes_holder_and_lease_and_the_quorums_holder() {
    let mut cluster = common::cluster(3);
    let rl = common::client(&cluster);
    let lock = rl.try_lock("job").await.unwrap();
    assert!(common::eventually(Duration::from_secs(1), || cluster.count_key("job") == 3).await);
    let seen = rl.inspect("job").await.unwrap();
    assert_eq!(seen.holder.as_deref(), Some(lock.token()));
    for view in &seen.nodes {
        assert_eq!(view.holder.as_deref(), Some(lock.token()));
        assert!(view.ttl.is_some_and(|ttl| ttl <= lock.ttl() && ttl > Duration::ZERO), "{view:?}");
    }
    let hold = rl.reentrant("job2", "worker-1").await.unwrap();
    let seen = rl.inspect("job2").await.unwrap();
    assert!(seen.nodes.iter().filter_map(|v| v.holder.as_deref()).any(|h| h.contains("worker-1")));
    cluster.node_mut(2).kill().unwrap();
    let seen = rl.inspect("job").await.unwrap();
    assert!(seen.nodes[2].error.is_some(), "{seen:?}");
    assert_eq!(seen.holder.as_deref(), Some(lock.token()));
    drop((lock, hold));
}

/// An inspection prints one line for the resource, with how many nodes hold it of how
/// many and the quorum apart, then one line per node.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn an_inspection_prints_how_many_nodes_hold_it_and_each_nodes_view() {
    let mut cluster = common::cluster(5);
    let rl = common::client(&cluster);
    let lock = rl.try_lock("shown").await.unwrap();
    common::held_on(&cluster, "shown", lock.token(), &[0, 1, 2, 3, 4]).await;
    let text = rl.inspect("shown").await.unwrap().to_string();
    let first = text.lines().next().unwrap();
    assert_eq!(first, format!("shown: held by {} on 5 of 5 nodes (quorum 3)", lock.token()));
    assert_eq!(text.lines().count(), 6, "{text}");
    let node = format!("127.0.0.1:{}/0: {}, ", cluster.node(0).port(), lock.token());
    assert!(text.lines().nth(1).unwrap().trim_start().starts_with(&node), "{text}");
    lock.release().await.unwrap();
    common::gone_everywhere(&cluster, &["shown"], "released").await;
    cluster.node_mut(4).kill().unwrap();
    let text = rl.inspect("shown").await.unwrap().to_string();
    let first = text.lines().next().unwrap();
    assert_eq!(first, "shown: no holder on a quorum; 4 of 5 nodes hold nothing (quorum 3)");
    let dead = format!("127.0.0.1:{}/0: not asked: ", cluster.node(4).port());
    assert!(text.lines().last().unwrap().trim_start().starts_with(&dead), "{text}");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_forced_release_frees_the_lock_wakes_a_waiter_and_fails_the_holders_extension() {
    let cluster = common::cluster(3);
    let holder = common::client(&cluster);
    let mut lock = holder.try_lock("job").await.unwrap();
    // Polls only every 5 s: a quick grant can only come from the release notification.
    let waiter = Redlock::builder()
        .nodes(cluster.urls())
        .retry(
            Retry::new()
                .with_unbounded_attempts()
                .with_delay(Duration::from_secs(5))
                .with_max_wait(Duration::from_secs(20)),
        )
        .build()
        .unwrap();
    let waiting = tokio::spawn(async move {
        let started = Instant::now();
        let lock = waiter.lock("job").await.unwrap();
        (started.elapsed(), lock)
    });
    tokio::time::sleep(Duration::from_millis(300)).await;
    let admin = common::client(&cluster);
    assert_eq!(admin.force_release("job").await.unwrap(), 3);
    let (waited, granted) = waiting.await.unwrap();
    assert!(waited < Duration::from_secs(3), "woken by the forced release: {waited:?}");
    let err = lock.extend(Duration::from_secs(10)).await.unwrap_err();
    assert_eq!(err.kind(), ErrorKind::NotHeld);
    granted.release().await.unwrap();
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn an_owner_label_is_shown_with_the_token_and_changes_nothing_else() {
    let cluster = common::cluster(3);
    let labelled = |label: &str| {
        common::builder(&cluster, Duration::from_millis(200)).owner_label(label).build().unwrap()
    };
    let (a, b) = (labelled("host-a/41"), labelled("host-b/42"));
    let lock = a.try_lock("job").await.unwrap();
    assert!(lock.token().ends_with(".host-a/41"), "{}", lock.token());
    let seen = a.inspect("job").await.unwrap();
    assert!(seen.holder.as_deref().is_some_and(|h| h.ends_with(".host-a/41")), "{seen:?}");
    assert_eq!(b.try_lock("job").await.unwrap_err().kind(), ErrorKind::NotAcquired);
    lock.release().await.unwrap();

    // One owner id from two labelled processes is still one owner; another id is not.
    let first = a.reentrant("batch", "job-7").await.unwrap();
    let second = b.reentrant("batch", "job-7").await.unwrap();
    let other = b.reentrant("batch", "job-8").await.unwrap_err();
    assert_eq!(other.kind(), ErrorKind::NotAcquired);
    first.release().await.unwrap();
    second.release().await.unwrap();
    b.reentrant("batch", "job-8").await.unwrap().release().await.unwrap();

    let bad = common::builder(&cluster, Duration::from_millis(200)).owner_label("a:b").build();
    assert_eq!(bad.unwrap_err().kind(), ErrorKind::Config);
}

/// A forced release's removal, once written, is never re-sent: a node whose connection
/// dropped with it in flight is reported as not answered, and the next call, on a new
/// connection, reaches it. One that a connection already dead refused before writing
/// anything goes out on a new connection at once.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_forced_release_is_not_sent_again_on_a_new_connection() {
    let faulty = redlock_testkit::FaultyCluster::start(3).unwrap();
    let admin = common::builder_for(faulty.urls(), Duration::from_millis(250)).build().unwrap();
    assert_eq!(admin.force_release("warm").await.unwrap(), 3, "connections opened");
    let holder = common::builder_for(faulty.urls(), Duration::from_millis(250)).build().unwrap();
    let lock = holder.try_lock("job").await.unwrap();
    assert!(
        common::eventually(Duration::from_secs(1), || faulty.cluster().count_key("job") == 3).await
    );
    // Node 0's removal (the only request that carries the holder's token) is written,
    // held by its proxy, and its connection reset under it.
    faulty.proxy(0).hold_requests_containing(lock.token().as_bytes(), Duration::from_secs(5));
    let forced = tokio::spawn({
        let admin = admin.clone();
        async move { admin.force_release("job").await }
    });
    tokio::time::sleep(Duration::from_millis(50)).await;
    faulty.proxy(0).set_fault(redlock_testkit::NetFault::Reset);
    faulty.proxy(0).heal();
    faulty.proxy(0).release_holds();
    assert_eq!(forced.await.unwrap().unwrap(), 2, "node 0's delete was not re-sent");
    assert_eq!(admin.force_release("job").await.unwrap(), 3, "a new connection reaches node 0");
    // What is left on node 0 alone keeps no one out: it is left to its lease.
    assert_eq!(faulty.cluster().nodes_holding("job", lock.token()), [0]);
    drop(lock);
}

/// The same delete on an idle connection the node closed before the call (a reset, an idle
/// timeout): nothing was written on it, so it goes out on a new one, and reaches every node.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_forced_release_on_a_connection_closed_before_the_call_reaches_every_node() {
    let faulty = redlock_testkit::FaultyCluster::start(3).unwrap();
    let admin = common::builder_for(faulty.urls(), Duration::from_millis(250)).build().unwrap();
    assert_eq!(admin.force_release("warm").await.unwrap(), 3, "connections opened");
    // Held on two of three nodes: it keeps everyone else out.
    faulty.cluster().node(0).set("job", "someone").unwrap();
    faulty.cluster().node(1).set("job", "someone").unwrap();
    faulty.proxy(0).set_fault(redlock_testkit::NetFault::Reset);
    faulty.proxy(0).heal();
    tokio::time::sleep(Duration::from_millis(50)).await;
    assert_eq!(admin.force_release("job").await.unwrap(), 3, "every node reached");
    assert!(!faulty.cluster().node(0).exists("job").unwrap());
}

/// A forced release removes the holds it saw when it began, never a hold granted while it
/// runs: here the old holder H (gone) had the lock on nodes 0 and 1, the operator reaches
/// node 2 over a slow link, and a waiter W, cut off from node 1, is granted on {0, 2} as
/// soon as node 0 is freed, long before the removal reaches node 2. W keeps node 2, so a
/// third client X cannot be granted {1, 2} while W holds the lock.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_forced_release_spares_a_holder_granted_while_it_runs() {
    let faulty =
        redlock_testkit::FaultyCluster::start_for_clients(3, 3, Default::default()).unwrap();
    let (admin_at, waiter_at, third_at) = (0, 1, 2);
    for i in 0..2 {
        common::run(faulty.cluster(), i, &["SET", "job", "gone-holder", "PX", "20000"]);
    }
    let admin =
        common::builder_for(faulty.urls_for(admin_at), Duration::from_millis(800)).build().unwrap();
    assert!(admin.inspect("warm").await.unwrap().nodes.iter().all(|v| v.error.is_none()));
    faulty.client_proxy(admin_at, 2).set_fault(common::latency(150));
    faulty.client_proxy(waiter_at, 1).set_fault(redlock_testkit::NetFault::Blackhole);
    let waiter = common::retrying(
        faulty.urls_for(waiter_at),
        Duration::from_millis(100),
        Retry::new()
            .with_unbounded_attempts()
            .with_delay(Duration::from_millis(10))
            .with_jitter(Duration::from_millis(10))
            .with_max_wait(Duration::from_secs(10)),
    );
    let waiting = tokio::spawn(async move { waiter.lock("job").await });
    tokio::time::sleep(Duration::from_millis(200)).await;
    admin.force_release("job").await.unwrap();
    let w = waiting.await.unwrap().unwrap();
    // Whatever the removal did on node 2, it has landed by now (it was awaited).
    let third = common::single_attempt(faulty.urls_for(third_at));
    let err = third.try_lock("job").await.unwrap_err();
    assert!(w.is_valid());
    assert_eq!(err.kind(), ErrorKind::NotAcquired, "{err}");
    let holding = faulty.cluster().nodes_holding("job", w.token());
    assert!(holding.contains(&0) && holding.contains(&2), "W's hold on {holding:?}");
    w.release().await.unwrap();
}

/// The hold `force_release` meant to remove expires on its own while a slow node is still
/// being read, and another client is granted the lock on every node meanwhile: that new
/// holder, granted after the call began and after the old hold was gone, keeps its lock on
/// a quorum, so no third client can take it while it is valid.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_holder_granted_after_the_old_hold_expired_during_a_forced_release_keeps_its_lock() {
    let faulty =
        redlock_testkit::FaultyCluster::start_for_clients(3, 2, Default::default()).unwrap();
    let admin = common::builder_for(faulty.urls_for(0), Duration::from_secs(4)).build().unwrap();
    let rl = common::builder_for(faulty.urls_for(1), Duration::from_millis(500)).build().unwrap();
    common::connect_all(&admin).await;
    common::connect_all(&rl).await;
    // The old holder: a 300 ms lease on every node.
    for i in 0..3 {
        common::run(faulty.cluster(), i, &["SET", "job", "old-holder", "PX", "300"]);
    }
    // The admin's link to node 2 is slow: its read lands there after the old hold expired.
    faulty.client_proxy(0, 2).set_fault(common::latency(600));
    let forced = tokio::spawn({
        let admin = admin.clone();
        async move { admin.force_release("job").await }
    });
    // The old hold expires; a new holder takes the lock on every node while node 2 is read.
    assert!(
        common::eventually(Duration::from_secs(2), || faulty.cluster().count_key("job") == 0).await
    );
    let lock = rl.try_lock("job").await.unwrap();
    forced.await.unwrap().unwrap();
    let holding = faulty.cluster().nodes_holding("job", lock.token());
    assert!(lock.validity() > Duration::ZERO);
    assert!(
        holding.len() >= 2,
        "the new holder, still valid for {:?}, holds only {holding:?}",
        lock.validity()
    );
    let third = common::client(faulty.cluster());
    let err = third.try_lock("job").await.map(drop).unwrap_err();
    assert_eq!(err.kind(), ErrorKind::NotAcquired);
    lock.release().await.unwrap();
}

/// A reentrant owner whose id contains spaces, held twice, and a read-write lock with two
/// readers: a forced release removes every one of those holds on every node and leaves
/// no key.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_forced_release_removes_every_hold_of_hash_kinds_even_an_owner_id_with_spaces() {
    let cluster = common::cluster(3);
    let rl = common::client(&cluster);
    let first = rl.reentrant("job", "worker a b").await.unwrap();
    let second = rl.reentrant("job", "worker a b").await.unwrap();
    let readers = (rl.read("doc").await.unwrap(), rl.read("doc").await.unwrap());
    let admin = common::client(&cluster);
    assert_eq!(admin.force_release("job").await.unwrap(), 3);
    assert_eq!(admin.force_release("doc").await.unwrap(), 3);
    assert_eq!(cluster.nodes_with_key("job").unwrap(), Vec::<usize>::new());
    assert_eq!(cluster.nodes_with_key("doc").unwrap(), Vec::<usize>::new());
    drop((first, second, readers));
}

// Forced releases run once, under resets, lost replies, script flushes and hung nodes.

fn dels(faulty: &FaultyCluster) -> Vec<u64> {
    faulty.cluster().nodes().iter().map(|node| common::calls(node, "del")).collect()
}

/// Sequential forced releases through proxies that drop replies and reset requests at
/// random: no call may run its delete twice on a node (the PING may be re-sent, the delete
/// never). `DEL` is counted on the nodes themselves.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_forced_release_never_runs_twice_under_lost_replies_and_resets() {
    let faulty = FaultyCluster::start(3).unwrap();
    let admin = common::builder_for(faulty.urls(), Duration::from_millis(300)).build().unwrap();
    common::connect_all(&admin).await;
    let seed = Fuzz::seed_from_env_or_random();
    for i in 0..3 {
        let fuzz = Fuzz::new(seed).derive(i as u64).with_drop_reply(0.08).with_reset_request(0.08);
        faulty.proxy(i).set_fault(NetFault::Fuzz(fuzz));
    }
    let (mut ok, mut pings_replaced) = (0, 0);
    for round in 0..60 {
        let before = dels(&faulty);
        let conns_before: usize = (0..3).map(|i| faulty.proxy(i).connections()).sum();
        if admin.force_release("f").await.is_ok() {
            ok += 1;
        }
        // Replies may still be in flight: let the proxies deliver or drop them.
        tokio::time::sleep(Duration::from_millis(20)).await;
        let after = dels(&faulty);
        for node in 0..3 {
            assert!(
                after[node] - before[node] <= 1,
                "seed {seed}, round {round}: node {node} ran the forced delete {} times",
                after[node] - before[node]
            );
        }
        let conns_after: usize = (0..3).map(|i| faulty.proxy(i).connections()).sum();
        pings_replaced += usize::from(conns_after != conns_before);
    }
    eprintln!("seed {seed}: {ok} of 60 forced releases reached a quorum ({pings_replaced})");
}

/// The README's rule sets for locking and for operators have no `+ping`: the PING's
/// `NOPERM` must count as an answer (the connection is open), not as a dead connection, on warm connections.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn an_acl_user_without_ping_force_releases_over_warm_connections() {
    // A forced release reads the holds first: it needs what `inspect` needs too.
    let rules: Vec<&str> =
        common::MINIMAL_ACL.iter().copied().chain(["+type", "+pttl", "+hkeys"]).collect();
    let cluster = common::cluster(3);
    for node in cluster.nodes() {
        node.acl_setuser("locker", "pw", &rules).unwrap();
    }
    let urls: Vec<String> = cluster.nodes().iter().map(|n| n.url_as("locker", "pw")).collect();
    let build = || {
        Redlock::builder()
            .nodes(urls.clone())
            .key_prefix("app:")
            .node_timeout(Duration::from_millis(500))
            .retry(Retry::never())
            .build()
            .unwrap()
    };
    let (admin, holder) = (build(), build());
    // Opens every connection (a first send on fresh ones: no PING yet).
    assert_eq!(admin.force_release("warm").await.unwrap(), 3);
    let lock = holder.try_lock("job").await.unwrap();
    assert!(common::eventually(Duration::from_secs(1), || cluster.count_key("app:job") == 3).await);
    let before: Vec<u64> = cluster.nodes().iter().map(|n| common::calls(n, "del")).collect();
    assert_eq!(admin.force_release("job").await.unwrap(), 3, "warm connections, PING refused");
    let after: Vec<u64> = cluster.nodes().iter().map(|n| common::calls(n, "del")).collect();
    assert_eq!(cluster.count_key("app:job"), 0);
    for node in 0..3 {
        assert_eq!(after[node] - before[node], 1, "node {node}");
    }
    // Each forced release leaves a NOPERM entry per node in the ACL log.
    let mut con = cluster.node(0).connection().unwrap();
    let log: Vec<redis::Value> = redis::cmd("ACL").arg("LOG").query(&mut con).unwrap();
    eprintln!("ACL LOG entries on node 0 after one forced release: {}", log.len());
    // A second call on the same warm connections: not replaced after the refused PING.
    assert_eq!(admin.force_release("job").await.unwrap(), 3);
    drop(lock);
}

/// After a script cache flush the forced release's EVALSHA gets NOSCRIPT and the script is
/// sent whole (a second `send_once`, PING first): it runs exactly once per node.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_forced_release_after_a_script_flush_runs_once() {
    let faulty = FaultyCluster::start(3).unwrap();
    let admin = common::builder_for(faulty.urls(), Duration::from_millis(500)).build().unwrap();
    common::connect_all(&admin).await;
    for node in faulty.cluster().nodes() {
        node.set("f", "someone").unwrap();
        node.command(&["SCRIPT", "FLUSH"]).unwrap();
    }
    let before = dels(&faulty);
    assert_eq!(admin.force_release("f").await.unwrap(), 3);
    let after = dels(&faulty);
    assert_eq!(faulty.cluster().count_key("f"), 0);
    for node in 0..3 {
        assert_eq!(after[node] - before[node], 1, "node {node}");
    }
}

/// A hung node (SIGSTOP): the call is bounded by the node timeout per node. Behaviour
/// change: before, the delete was queued on the connection and ran when the node woke up
/// (whatever the key held by then); now the PING is queued, the caller gives up, and the
/// delete is never written: the key stays until its lease ends (as `force_release`'s
/// `Unavailable` doc allows for nodes that did not answer).
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_forced_release_to_a_hung_node_is_bounded_and_not_written_late() {
    let mut faulty = FaultyCluster::start(3).unwrap();
    let admin = common::builder_for(faulty.urls(), Duration::from_millis(250)).build().unwrap();
    common::connect_all(&admin).await;
    for node in faulty.cluster().nodes() {
        node.set("f", "someone").unwrap();
    }
    let wakeup = faulty.cluster_mut().node_mut(0).pause_for(Duration::from_millis(1200)).unwrap();
    let started = Instant::now();
    assert_eq!(admin.force_release("f").await.unwrap(), 2);
    let took = started.elapsed();
    assert!(took < Duration::from_millis(250 * 3 + 400), "bounded by the node timeouts: {took:?}");
    wakeup.join().unwrap();
    tokio::time::sleep(Duration::from_millis(300)).await;
    assert!(
        faulty.cluster().node(0).exists("f").unwrap(),
        "the hung node ran a forced delete written after its caller gave up"
    );
}

/// A node whose round trip fits the node timeout once, not twice: the forced release used
/// to answer in one round trip; the PING now comes first, so it takes two.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_forced_release_whose_round_trip_fits_the_node_timeout_succeeds() {
    let faulty = FaultyCluster::start(3).unwrap();
    let admin = common::builder_for(faulty.urls(), Duration::from_millis(400)).build().unwrap();
    common::connect_all(&admin).await;
    for i in 0..3 {
        faulty.cluster().node(i).set("f", "someone").unwrap();
        faulty.proxy(i).set_fault(common::latency(120));
    }
    // ~250 ms a round trip: inside 400 ms once, not twice.
    let inspect_started = Instant::now();
    let seen = admin.inspect("f").await.unwrap();
    let inspect_took = inspect_started.elapsed();
    assert!(seen.nodes.iter().all(|v| v.error.is_none()), "one round trip fits: {seen:?}");
    let result = admin.force_release("f").await;
    tokio::time::sleep(Duration::from_millis(600)).await;
    let left = faulty.cluster().count_key("f");
    assert!(
        result.is_ok(),
        "inspect answered in {inspect_took:?}; forced release: {result:?}, key left on {left} nodes"
    );
}
