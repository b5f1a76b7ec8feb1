//! Operators' calls: inspecting a lock, and freeing it by hand.

use crate::common;

use std::time::{Duration, Instant};

use redlock::{ErrorKind, Redlock, Retry};

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
