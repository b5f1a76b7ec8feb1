//! The interleavings that broke lock kinds built on a correct plain lock, each reproduced on
//! real nodes (the testkit's proxies delay, blackhole or reset connections): stale guards
//! released, extended or dropped late, requests cut after they ran, attempts landing late,
//! fencing tokens fixed before the decision, signals that wait for I/O, cancellation at any
//! await point, and an abandoned attempt on a paused node.

use crate::common;

use std::time::{Duration, Instant, SystemTime};

use redlock::{ErrorKind, Redlock, Retry};
use redlock_testkit::{Cluster, FaultyCluster, Grant, History, NetFault};

/// A client whose requests wait as long as a test needs: the node timeout never decides.
fn patient(urls: Vec<String>, ttl: Duration, node_timeout: Duration) -> Redlock {
    Redlock::builder()
        .nodes(urls)
        .ttl(ttl)
        .node_timeout(node_timeout)
        .retry(Retry::never())
        .build()
        .unwrap()
}

/// Retries soon and for as long as a test may run.
fn eager_retry() -> Retry {
    Retry::new()
        .with_unbounded_attempts()
        .with_delay(Duration::from_millis(5))
        .with_jitter(Duration::from_millis(10))
        .with_max_wait(Duration::from_secs(20))
}

fn foreign_key(cluster: &redlock_testkit::Cluster, i: usize, key: &str, ms: u64) {
    common::run(cluster, i, &["SET", key, "someone-else", "PX", &ms.to_string()]);
}

// 1. A stale hold's release must not take a newer hold of the same owner.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_stale_reentrant_hold_released_late_leaves_the_new_hold_alone() {
    let cluster = common::cluster(3);
    let rl = common::client(&cluster);
    let stale = rl.reentrant("job", "job-7").ttl(Duration::from_millis(300)).await.unwrap();
    assert!(common::eventually(Duration::from_secs(2), || cluster.count_key("job") == 0).await);
    let fresh = rl.reentrant("job", "job-7").ttl(Duration::from_secs(10)).await.unwrap();
    assert!(common::eventually(Duration::from_secs(1), || cluster.count_key("job") == 3).await);

    let err = stale.release().await.unwrap_err();
    assert_eq!(err.kind(), ErrorKind::NotHeld);
    assert_eq!(cluster.count_key("job"), 3, "the new hold is still on every node");
    let other = rl.reentrant("job", "job-8").await.unwrap_err();
    assert_eq!(other.kind(), ErrorKind::NotAcquired);
    assert!(fresh.check_held().await.unwrap());
    fresh.release().await.unwrap();
    // Decided at the quorum: the last node's release may still be on its way.
    assert!(common::eventually(Duration::from_secs(1), || cluster.count_key("job") == 0).await);
}

// 2. A release whose connection drops after the node ran it must not run twice.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_reentrant_release_cut_after_it_ran_is_not_applied_twice() {
    let faulty = FaultyCluster::start(3).unwrap();
    let rl = patient(faulty.urls(), Duration::from_secs(10), Duration::from_secs(3));
    let first = rl.reentrant("job", "job-7").await.unwrap();
    let second = rl.reentrant("job", "job-7").await.unwrap();
    // Granted at the quorum: let the last node's acquisitions land before the faults.
    let both_everywhere = || {
        let nodes = faulty.cluster().hash_fields("job").unwrap_or_default();
        nodes.iter().flatten().filter(|fields| fields.len() == 2).count() == 3
    };
    assert!(common::eventually(Duration::from_secs(1), both_everywhere).await);

    for i in 0..3 {
        let fault = NetFault::Latency { fixed: Duration::from_millis(300), jitter: Duration::ZERO };
        faulty.proxy(i).set_fault(fault);
    }
    let first_token = first.token().to_owned();
    let release = tokio::spawn(first.release());
    // The request reached the nodes at ~300 ms; the reply is on its way until ~600 ms.
    tokio::time::sleep(Duration::from_millis(450)).await;
    // Reset, then healed at once: a client that re-sends finds a working connection.
    for i in 0..3 {
        faulty.proxy(i).heal();
        faulty.proxy(i).reset_connections();
    }
    let _ = release.await.unwrap(); // its outcome is unknown to the client; either answer will do

    // Whatever the client concluded, the second hold is intact on every node.
    let cluster = faulty.cluster();
    let everywhere = cluster.hash_fields("job").unwrap();
    for fields in &everywhere {
        let fields = fields.as_ref().expect("the key is still on every node");
        assert!(
            fields.keys().any(|f| f.contains(second.token())),
            "second {} first {first_token}: {everywhere:?} pttl {:?}",
            second.token(),
            cluster.pttls("job")
        );
    }
    let other = patient(faulty.urls(), Duration::from_secs(10), Duration::from_secs(1));
    let err = other.reentrant("job", "job-8").await.unwrap_err();
    assert_eq!(err.kind(), ErrorKind::NotAcquired);
    assert!(second.check_held().await.unwrap());
    second.release().await.unwrap();
}

// 3. A failed attempt whose requests land late on a majority leaves nothing behind.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_reentrant_attempt_that_lands_late_on_a_majority_is_undone() {
    let mut cluster = common::cluster(5);
    let rl = common::builder(&cluster, Duration::from_millis(100)).build().unwrap();
    common::warm(&rl).await;
    let wakeup = cluster.pause_for(&[0, 1, 2], Duration::from_millis(400)).unwrap();
    let err = rl.reentrant("job", "job-7").once().await.unwrap_err();
    assert_eq!(err.kind(), ErrorKind::Unavailable);
    wakeup.join().unwrap();
    assert!(
        common::eventually(Duration::from_secs(2), || cluster.count_key("job") == 0).await,
        "the late increments were taken back: {:?}",
        cluster.nodes_with_key("job")
    );
    let other = common::client(&cluster);
    other.reentrant("job", "job-8").await.unwrap().release().await.unwrap();
}

// 4. Fencing tokens follow grant order, even with slow connections and counters that
// differ between nodes. Randomized: it passed on the old design too; the deterministic
// test after it is the reproduction.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn fencing_tokens_follow_grant_order_under_delays() {
    let clients = 3;
    let faulty = FaultyCluster::start_for_clients(3, clients, Default::default()).unwrap();
    // Failed attempts of the past left the counters apart.
    let counter = "redlock:fence:res";
    common::run(faulty.cluster(), 0, &["SET", counter, "9"]);
    let history = History::new();
    let mut tasks = Vec::new();
    for c in 0..clients {
        // Each client has one slow link, a different one: raises and acquisitions land late
        // there, some after the lease they belong to.
        for node in 0..3 {
            let jitter = Duration::from_millis(if node == c { 400 } else { 3 });
            let fault = NetFault::Latency { fixed: Duration::ZERO, jitter };
            faulty.client_proxy(c, node).set_fault(fault);
        }
        let rl = Redlock::builder()
            .nodes(faulty.urls_for(c))
            .ttl(Duration::from_millis(400))
            .node_timeout(Duration::from_millis(800))
            .retry(eager_retry())
            .build()
            .unwrap();
        let history = history.clone();
        tasks.push(tokio::spawn(async move {
            for round in 0..8 {
                let Ok(lock) = rl.lock("res").fenced().await else { continue };
                let fence = lock.fencing_token().unwrap();
                let grant = Grant::new(c, lock.token(), Instant::now(), lock.deadline());
                let id = history.record(grant.with_fence(fence));
                if (round + c) % 2 == 0 {
                    // Left to expire: its keys go away without a release behind the raise.
                    std::mem::forget(lock);
                    tokio::time::sleep(Duration::from_millis(50)).await;
                } else {
                    history.released(id, Instant::now());
                    let _ = lock.release().await;
                }
            }
        }));
    }
    for task in tasks {
        task.await.unwrap();
    }
    assert!(history.len() > 6, "only {} grants", history.len());
    assert!(history.violations().is_empty(), "{:?}", history.violations());
    assert!(history.fencing_violations().is_empty(), "{:?}", history.fencing_violations());
}

// 4, deterministic. The interleaving of the report, step by step: a later grant's
// acquisition lands on one node before the earlier grant's counter update reaches the
// other, and the earlier grant expires in between. Three nodes; node 0's counter is at 8
// (failed attempts of the past bumped it alone). B's acquisition reaches node 2 at once,
// node 1 only after A's lease and node 0 after everything. A is granted on nodes 0 and 1
// (node 2 refuses: B's key), while everything A sends about its counter to node 1 is held
// back for 3 s. A's lease ends; B's acquisition reaches node 1 and B is granted on nodes 1
// and 2, after A. B's token must be larger than A's: with the counters bumped during the
// acquisitions, B got max(1, 2) = 2 after A's 9.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_grant_whose_acquisition_began_before_an_earlier_grant_gets_a_larger_token() {
    use redlock::fence::{FencedWrite, fenced_set};

    let faulty = FaultyCluster::start_for_clients(3, 2, Default::default()).unwrap();
    common::run(faulty.cluster(), 0, &["SET", "redlock:fence:res", "8"]);
    let client = |c: usize, ttl: Duration| {
        let rl = patient(faulty.urls_for(c), ttl, Duration::from_secs(8));
        async move {
            // Connections open (and scripts loaded) before any request is held back.
            rl.try_lock("warm-up").await.unwrap().release().await.unwrap();
            rl
        }
    };
    let (a, b) =
        (client(0, Duration::from_millis(500)).await, client(1, Duration::from_secs(4)).await);
    let acquire = common::plain_acquisitions();
    faulty.client_proxy(1, 1).hold_requests_containing_any(&acquire, Duration::from_secs(1));
    faulty.client_proxy(1, 0).hold_requests_containing_any(&acquire, Duration::from_secs(5));
    faulty.client_proxy(0, 1).hold_requests_containing(b"redlock:fence:", Duration::from_secs(3));

    let later = tokio::spawn(async move { b.try_lock("res").fenced().await });
    assert!(
        common::eventually(Duration::from_secs(1), || faulty.cluster().count_key("res") == 1).await
    );
    let earlier = a.try_lock("res").fenced().await.unwrap();
    let earlier_token = earlier.fencing_token().unwrap();
    // The protected resource: a Redis of its own.
    let resource = redlock_testkit::RedisNode::start().unwrap();
    let mut store = resource.client().unwrap().get_multiplexed_async_connection().await.unwrap();
    let written = fenced_set(&mut store, "data", b"from A", earlier_token).await.unwrap();
    assert_eq!(written, FencedWrite::Written);

    let later = later.await.unwrap().unwrap();
    let later_token = later.fencing_token().unwrap();
    assert!(
        later_token > earlier_token,
        "granted later, token {later_token}; granted earlier, token {earlier_token}"
    );
    let written = fenced_set(&mut store, "data", b"from B", later_token).await.unwrap();
    assert_eq!(written, FencedWrite::Written, "the current holder's write is accepted");
    drop(earlier);
    later.release().await.unwrap();
}

// 5. `with_lock` answers `Ok` only when the lock was held until the work returned.
#[test]
fn with_lock_paused_past_its_lease_on_a_current_thread_runtime_is_not_ok() {
    let cluster = common::cluster(3);
    let urls = cluster.urls();
    let runtime = tokio::runtime::Builder::new_current_thread().enable_all().build().unwrap();
    let rl = runtime.block_on(async {
        patient(urls.clone(), Duration::from_millis(500), Duration::from_millis(50))
    });
    let raw = urls.clone();
    let rival = std::thread::spawn(move || {
        let runtime = tokio::runtime::Builder::new_current_thread().enable_all().build().unwrap();
        runtime.block_on(async {
            let rl = patient(urls, Duration::from_secs(5), Duration::from_millis(50));
            tokio::time::sleep(Duration::from_millis(100)).await;
            // The holder's auto-extension runs on the client's own thread, so a blocked
            // caller alone no longer loses the lock: an operator deletes the key meanwhile,
            // and the holder's next extension finds it gone.
            for url in &raw {
                let mut node = redis::Client::open(url.as_str()).unwrap().get_connection().unwrap();
                redis::cmd("DEL").arg("job").exec(&mut node).unwrap();
            }
            let lock = loop {
                if let Ok(lock) = rl.try_lock("job").await {
                    break lock;
                }
                tokio::time::sleep(Duration::from_millis(10)).await;
            };
            // Held past the first holder's return, so the loss is not a mere expiry.
            tokio::time::sleep(Duration::from_millis(1500)).await;
            lock.release().await.unwrap();
        });
    });
    let outcome = runtime.block_on(rl.with_lock("job", |_lease| async {
        // A blocking call: neither the extender nor anything else runs on this runtime.
        std::thread::sleep(Duration::from_millis(1200));
        "done"
    }));
    let err = outcome.unwrap_err();
    assert_eq!(err.kind(), ErrorKind::NotHeld, "{err}");
    rival.join().unwrap();
}

// 6. `lost()` completes at the validity deadline at the latest, whatever an extension in
// flight is doing.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn lost_fires_by_the_deadline_while_an_extension_hangs() {
    let faulty = FaultyCluster::start(5).unwrap();
    let rl = patient(faulty.urls(), Duration::from_secs(1), Duration::from_millis(900));
    let auto = rl.lock("job").await.unwrap().auto_extend();
    let lease = auto.lease();
    tokio::time::sleep(Duration::from_millis(200)).await;
    for i in 0..3 {
        faulty.proxy(i).set_fault(NetFault::Blackhole);
    }
    // No extension can succeed from here: the last deadline known is the latest the lock
    // may be relied on.
    let deadline = Instant::now() + lease.validity();
    let err = tokio::time::timeout(Duration::from_secs(3), lease.lost()).await.unwrap();
    let late = Instant::now().saturating_duration_since(deadline);
    assert!(late < Duration::from_millis(100), "lost() fired {late:?} after the deadline: {err}");
    assert!(lease.is_lost());
    for i in 0..3 {
        faulty.proxy(i).heal();
    }
    drop(auto);
}

// 7. The README's pattern compiles in a spawned task: `with_lock` whose work waits on
// `lease.lost()` is `Send`.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn with_lock_selecting_on_lost_runs_in_a_spawned_task() {
    let cluster = common::cluster(3);
    let rl = std::sync::Arc::new(common::client(&cluster));
    let task = tokio::spawn({
        let rl = rl.clone();
        async move {
            rl.with_lock("job", |lease| async move {
                tokio::select! {
                    _ = lease.lost() => "lost",
                    _ = tokio::time::sleep(Duration::from_millis(50)) => "done",
                }
            })
            .await
        }
    });
    assert_eq!(task.await.unwrap().unwrap(), "done");
}

// 8. A lease reports the end as soon as its lock is given up.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_lease_ends_when_its_auto_lock_is_dropped_or_with_lock_is_cancelled() {
    let cluster = common::cluster(3);
    let rl = std::sync::Arc::new(common::client(&cluster));
    let auto = rl.lock("job").await.unwrap().auto_extend();
    let lease = auto.lease();
    drop(auto);
    assert!(lease.is_lost());
    assert_eq!(lease.validity(), Duration::ZERO);
    tokio::time::timeout(Duration::from_millis(100), lease.lost()).await.unwrap();
    // The dropped lock is released in the background.
    assert!(common::eventually(Duration::from_secs(1), || cluster.count_key("job") == 0).await);

    let (tx, rx) = tokio::sync::oneshot::channel();
    let task = tokio::spawn({
        let rl = rl.clone();
        async move {
            rl.with_lock("job", |lease| async move {
                tx.send(lease).unwrap();
                std::future::pending::<()>().await
            })
            .await
        }
    });
    let lease = rx.await.unwrap();
    assert!(!lease.is_lost());
    task.abort();
    let _ = task.await;
    assert!(lease.is_lost());
    tokio::time::timeout(Duration::from_millis(100), lease.lost()).await.unwrap();
}

// 9. Wake-ups outlive the runtime that first waited, and woken attempts do not use up
// the retry policy.
#[test]
fn notifications_survive_the_runtime_that_first_waited() {
    let cluster = common::cluster(3);
    // Polls rarely: only a notification can make a handoff quick.
    let rl = std::sync::Arc::new(
        Redlock::builder()
            .nodes(cluster.urls())
            .ttl(Duration::from_secs(10))
            .node_timeout(Duration::from_millis(200))
            .retry(
                Retry::new()
                    .with_max_attempts(2)
                    .with_delay(Duration::from_secs(3))
                    .with_max_wait(Duration::from_secs(10)),
            )
            .build()
            .unwrap(),
    );
    let holder = common::client(&cluster);
    let first = tokio::runtime::Builder::new_current_thread().enable_all().build().unwrap();
    first.block_on(async {
        let lock = holder.lock("job").await.unwrap();
        let waiter = rl.lock("job");
        let release = async {
            tokio::time::sleep(Duration::from_millis(200)).await;
            lock.release().await.unwrap();
        };
        let (waited, ()) = tokio::join!(waiter, release);
        waited.unwrap().release().await.unwrap();
    });
    drop(first);

    let second =
        tokio::runtime::Builder::new_multi_thread().worker_threads(2).enable_all().build().unwrap();
    second.block_on(async {
        // Three handoffs in a row, each woken by the release, with two attempts allowed.
        for _ in 0..3 {
            let lock = holder.lock("job").await.unwrap();
            let waiting = tokio::spawn({
                let rl = rl.clone();
                async move {
                    let started = Instant::now();
                    let lock = rl.lock("job").await?;
                    let waited = started.elapsed();
                    lock.release().await?;
                    Ok::<_, redlock::Error>(waited)
                }
            });
            tokio::time::sleep(Duration::from_millis(200)).await;
            lock.release().await.unwrap();
            let waited = waiting.await.unwrap().unwrap();
            assert!(
                waited < Duration::from_millis(1500),
                "woken by the release, not the 3 s poll: {waited:?}"
            );
        }
    });
}

// 10. Contention with a dead minority is contention, not unavailability.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn contention_with_two_dead_nodes_of_five_is_not_acquired_for_every_kind() {
    let mut cluster = common::cluster(5);
    let holder = common::client(&cluster);
    let rl = common::client(&cluster);
    let plain = holder.lock("p").await.unwrap();
    let held = holder.reentrant("r", "owner-a").await.unwrap();
    let set = holder.many(&["m1", "m2"]).await.unwrap();
    common::warm(&rl).await;
    cluster.node_mut(3).kill().unwrap();
    cluster.node_mut(4).kill().unwrap();

    assert_eq!(rl.try_lock("p").await.unwrap_err().kind(), ErrorKind::NotAcquired);
    assert_eq!(rl.reentrant("r", "owner-b").await.unwrap_err().kind(), ErrorKind::NotAcquired);
    assert_eq!(rl.many(&["m2", "m3"]).await.unwrap_err().kind(), ErrorKind::NotAcquired);
    assert_eq!(rl.write("p").await.unwrap_err().kind(), ErrorKind::WrongType);
    drop((plain, held, set));
}

// 11. A writer that gives up withdraws its intent after its acquisition, on every node,
// also on connections still opening.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_writer_giving_up_on_fresh_connections_leaves_no_intent() {
    let faulty = FaultyCluster::start(3).unwrap();
    // The writer's connection to node 2 opens slowly: the two others refuse it (a reader
    // holds a share), and it gives up while its acquisition on node 2 still waits for that
    // connection.
    let fault =
        NetFault::Latency { fixed: Duration::from_millis(40), jitter: Duration::from_millis(10) };
    faulty.proxy(2).set_fault(fault);
    let cluster = faulty.cluster();
    let reader = common::client(cluster);
    let share = reader.read("doc").once().await.unwrap();
    for round in 0..8 {
        // Fresh connections every round; waits a little, then gives up.
        let writer = Redlock::builder()
            .nodes(faulty.urls())
            .node_timeout(Duration::from_millis(500))
            .retry(
                Retry::new()
                    .with_delay(Duration::from_millis(5))
                    .with_max_wait(Duration::from_millis(15)),
            )
            .build()
            .unwrap();
        let err = writer.write("doc").await.unwrap_err();
        assert_eq!(err.kind(), ErrorKind::NotAcquired);
        drop(writer);
        // The withdrawal runs in the background, on each node before or after the attempt
        // there: soon no node keeps an intent (an attempt that lands after it records none;
        // one left behind would refuse readers there for its lifetime).
        let intents = || {
            cluster
                .hash_fields("doc")
                .unwrap()
                .iter()
                .flatten()
                .filter(|fields| fields.keys().any(|f| f.starts_with("i:")))
                .count()
        };
        // Everything delayed on node 2 lands first.
        tokio::time::sleep(Duration::from_millis(300)).await;
        let withdrawn = common::eventually(Duration::from_secs(1), || intents() == 0).await;
        assert!(withdrawn, "round {round}: an intent stayed on {} node(s)", intents());
        reader.read("doc").once().await.unwrap().release().await.unwrap();
    }
    share.release().await.unwrap();
    assert!(common::eventually(Duration::from_secs(1), || cluster.count_key("doc") == 0).await);
}

// 12. A client's immediate retry is not refused by its own failed attempt.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn an_immediate_retry_is_not_refused_by_the_clients_own_failed_attempt() {
    let faulty = FaultyCluster::start(4).unwrap();
    // The two free nodes answer late: the attempt is decided (refused) by the two held
    // ones while its SETs on the free ones are still in flight.
    for i in [2, 3] {
        let fault = NetFault::Latency { fixed: Duration::from_millis(20), jitter: Duration::ZERO };
        faulty.proxy(i).set_fault(fault);
    }
    let cluster = faulty.cluster();
    let rl = patient(faulty.urls(), Duration::from_secs(10), Duration::from_secs(1));
    for round in 0..5 {
        let key = format!("k{round}");
        foreign_key(cluster, 0, &key, 10_000);
        foreign_key(cluster, 1, &key, 10_000);
        let err = rl.try_lock(&key).await.unwrap_err();
        assert_eq!(err.kind(), ErrorKind::NotAcquired);
        common::run(cluster, 0, &["DEL", &key]);
        let lock = rl.try_lock(&key).await;
        assert!(lock.is_ok(), "round {round}: refused by our own attempt: {lock:?}");
        lock.unwrap().release().await.unwrap();
        common::run(cluster, 1, &["DEL", &key]);
    }
}

// Cancellation, abandoned attempts and extensions in flight.

fn field_prefixes(cluster: &Cluster, key: &str) -> Vec<String> {
    let mut out = Vec::new();
    for i in 0..cluster.len() {
        if let Ok(map) = cluster.node(i).hgetall(key) {
            out.extend(map.into_keys().map(|f| format!("{i}:{}", &f[..2])));
        }
    }
    out
}

/// Cancels acquisitions at every offset from 0 to ~120 ms (each node 10-20 ms away each
/// way, so the cancellation hits the acquisition round, the fencing read and write
/// rounds, the clean-up, the retry pause), then checks that nothing is left: no plain key,
/// no reentrant field, no write grant, no writer intent (only the reader's share that
/// made the writer wait).
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn cancellation_at_any_await_point_leaves_nothing() {
    let cluster = FaultyCluster::start(3).unwrap();
    for i in 0..3 {
        cluster.proxy(i).set_fault(NetFault::Latency {
            fixed: Duration::from_millis(10),
            jitter: Duration::from_millis(10),
        });
    }
    let retry = Retry::new()
        .with_unbounded_attempts()
        .with_delay(Duration::from_millis(20))
        .with_jitter(Duration::from_millis(10))
        .with_max_wait(Duration::from_secs(5));
    let rl = common::retrying(cluster.urls(), Duration::from_millis(300), retry);
    let direct =
        common::retrying(cluster.cluster().urls(), Duration::from_millis(300), Retry::never());
    let reader = direct.read("doc").once().await.unwrap();
    let held = direct.try_lock("busy").await.unwrap();

    for offset_ms in (0..120).step_by(7) {
        let offset = Duration::from_millis(offset_ms);
        let _ = tokio::time::timeout(offset, rl.lock("k").fenced()).await;
        let _ = tokio::time::timeout(offset, rl.reentrant("r", "o")).await;
        let _ = tokio::time::timeout(offset, rl.write("doc")).await;
        let _ = tokio::time::timeout(offset, rl.lock("busy")).await;
        let _ = tokio::time::timeout(offset, rl.many(&["m1", "m2"])).await;
    }
    let nodes = cluster.cluster();
    let clean = || {
        nodes.count_key("k") == 0
            && nodes.count_key("r") == 0
            && nodes.count_key("m1") + nodes.count_key("m2") == 0
            && field_prefixes(nodes, "doc").iter().all(|f| f.ends_with("r:"))
            && nodes.nodes_holding("busy", held.token()).len() == 3
    };
    assert!(
        common::eventually(Duration::from_secs(3), clean).await,
        "left behind: k on {:?}, r on {:?}, doc fields {:?}",
        nodes.nodes_with_key("k").unwrap(),
        nodes.nodes_with_key("r").unwrap(),
        field_prefixes(nodes, "doc")
    );
    reader.release().await.unwrap();
    held.release().await.unwrap();
}

/// A client's own abandoned attempt: its SET sits in a paused node's socket buffer, its
/// clean-up is queued behind it. The next attempt of the same client, made as soon as the
/// foreign holder is gone, waits for that clean-up on that node instead of being refused
/// by its own stale SET, and nothing of the first attempt is left.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn an_abandoned_attempt_on_a_paused_node_does_not_refuse_the_next_one() {
    let mut cluster = common::cluster(3);
    let rl = common::retrying(cluster.urls(), Duration::from_millis(300), Retry::never());
    common::warm(&rl).await;
    for i in [0, 1] {
        cluster.node(i).set("k", "foreign").unwrap();
    }
    let wake = cluster.node_mut(2).pause_for(Duration::from_millis(400)).unwrap();
    let err = rl.try_lock("k").await.unwrap_err();
    assert_eq!(err.kind(), ErrorKind::NotAcquired, "{err}");
    for i in [0, 1] {
        common::run(&cluster, i, &["DEL", "k"]);
    }
    wake.join().unwrap();
    let lock = rl.try_lock("k").await.unwrap();
    let everywhere = || cluster.nodes_holding("k", lock.token()).len() == 3;
    assert!(common::eventually(Duration::from_secs(1), everywhere).await);
    lock.release().await.unwrap();
    assert!(common::eventually(Duration::from_secs(1), || cluster.count_key("k") == 0).await);
}

/// Extension racing release: an extension still in flight to a slow node when the lock is
/// released. The release is queued behind it on that node, so the slow node ends without
/// the key (and an extension never sets a key again where it is gone).
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_release_right_after_an_extension_in_flight_leaves_no_key() {
    let cluster = FaultyCluster::start(3).unwrap();
    let rl = common::retrying(cluster.urls(), Duration::from_millis(1000), Retry::never());
    // Opened first: on a loaded machine node 2's first connect may outlast the staging.
    common::warm(&rl).await;
    let mut lock = rl.try_lock("k").await.unwrap();
    // The grant returns at the quorum: node 2's SET must have landed first, or it lands
    // after the DEL below, behind the latency, and the release then arrives after the
    // one-second check.
    common::held_on(cluster.cluster(), "k", lock.token(), &[0, 1, 2]).await;
    // The key vanishes on node 2: the late extension there must not set it again.
    cluster.cluster().node(2).command(&["DEL", "k"]).unwrap();
    cluster
        .proxy(2)
        .set_fault(NetFault::Latency { fixed: Duration::from_millis(300), jitter: Duration::ZERO });
    lock.extend(Duration::from_secs(20)).await.unwrap();
    lock.release().await.unwrap();
    tokio::time::sleep(Duration::from_millis(1000)).await;
    assert_eq!(cluster.cluster().count_key("k"), 0);
}

/// Fuzzed contention across kinds: three clients, each behind its own fuzzed proxies
/// (random delays, replies swallowed after the command ran, requests reset: re-sends),
/// take fenced write grants and read shares of one resource with short leases, some kept
/// alive by auto-extension. No write overlaps another grant (by the clients' validity
/// windows), and fencing tokens follow grant order.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn fuzzed_readers_and_fenced_writers_keep_exclusion_and_token_order() {
    use redlock_testkit::{Fuzz, Grant, History};
    use std::time::Instant;
    let cluster =
        FaultyCluster::start_for_clients(3, 3, redlock_testkit::NodeConfig::new()).unwrap();
    let seed = Fuzz::seed_from_env_or_random();
    for c in 0..3 {
        let fuzz = Fuzz::new(seed.wrapping_add(c as u64))
            .with_max_delay(Duration::from_millis(4))
            .with_drop_reply(0.03)
            .with_reset_request(0.03);
        cluster.fuzz_client(c, fuzz);
    }
    let history = History::new();
    let end = Instant::now() + Duration::from_secs(5);
    let tasks: Vec<_> = (0..3)
        .map(|c| {
            let retry = Retry::new()
                .with_unbounded_attempts()
                .with_delay(Duration::from_millis(2))
                .with_jitter(Duration::from_millis(5))
                .with_max_wait(Duration::from_secs(1));
            let rl = Redlock::builder()
                .nodes(cluster.urls_for(c))
                .ttl(Duration::from_millis(300))
                .node_timeout(Duration::from_millis(30))
                .retry(retry)
                .build()
                .unwrap();
            let history = history.clone();
            tokio::spawn(async move {
                let mut n = 0usize;
                while Instant::now() < end {
                    n += 1;
                    if n % 3 == c % 3 {
                        let Ok(lock) = rl.write("doc").fenced().await else { continue };
                        let now = Instant::now();
                        let fence = lock.fencing_token().unwrap();
                        let grant =
                            Grant::new(c, lock.token(), now, lock.deadline()).with_fence(fence);
                        let id = history.record(grant);
                        tokio::time::sleep(Duration::from_millis(3)).await;
                        history.released(id, Instant::now());
                        let _ = lock.release().await;
                    } else if n.is_multiple_of(5) {
                        let Ok(lock) = rl.read("doc").await else { continue };
                        let auto = lock.auto_extend();
                        let lease = auto.lease();
                        let now = Instant::now();
                        let id = history.record(Grant::shared(
                            c,
                            lease.token(),
                            now,
                            now + Duration::from_secs(60),
                        ));
                        tokio::select! {
                            () = tokio::time::sleep(Duration::from_millis(250)) => {}
                            _ = lease.lost() => {}
                        }
                        // Held until here only if the lease says so by the clock.
                        let until =
                            if lease.is_valid() { Instant::now() } else { lease.deadline() };
                        history.released(id, until);
                        let _ = auto.release().await;
                    } else {
                        let Ok(lock) = rl.read("doc").await else { continue };
                        let now = Instant::now();
                        let id =
                            history.record(Grant::shared(c, lock.token(), now, lock.deadline()));
                        tokio::time::sleep(Duration::from_millis(2)).await;
                        history.released(id, Instant::now());
                        let _ = lock.release().await;
                    }
                }
            })
        })
        .collect();
    for task in tasks {
        task.await.unwrap();
    }
    let grants = history.grants();
    let writes = grants.iter().filter(|g| g.fence.is_some()).count();
    eprintln!("seed {seed}: {} grants, {writes} fenced writes", grants.len());
    let violations = history.violations();
    assert!(
        violations.is_empty(),
        "seed {seed}: {} violations, first {}",
        violations.len(),
        violations[0]
    );
    let fencing = history.fencing_violations();
    assert!(
        fencing.is_empty(),
        "seed {seed}: {} fencing violations, first {}",
        fencing.len(),
        fencing[0]
    );
    assert!(history.len() > 20, "seed {seed}: too few grants ({})", history.len());
}

// Stale guards used after another owner took the resource.

fn client(cluster: &redlock_testkit::Cluster) -> Redlock {
    Redlock::builder()
        .nodes(cluster.urls())
        .ttl(Duration::from_secs(10))
        .node_timeout(Duration::from_millis(200))
        .retry(Retry::never())
        .build()
        .unwrap()
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_stale_multi_guard_never_touches_an_overlapping_newer_set() {
    let cluster = common::cluster(3);
    let (a, b) = (client(&cluster), client(&cluster));
    let mut stale = a.many(&["x", "y"]).ttl(Duration::from_millis(300)).await.unwrap();
    assert!(common::eventually(Duration::from_secs(2), || cluster.count_key("y") == 0).await);
    let fresh = b.many(&["y", "z"]).await.unwrap();
    // Staging: every node answered the fresh set (a round is decided by the first two
    // nodes), before the stale guard's calls.
    common::held_on(&cluster, "y", fresh.token(), &[0, 1, 2]).await;
    common::held_on(&cluster, "z", fresh.token(), &[0, 1, 2]).await;
    let err = stale.extend(Duration::from_secs(10)).await.unwrap_err();
    assert_eq!(err.kind(), ErrorKind::NotHeld);
    assert_eq!(stale.release().await.unwrap_err().kind(), ErrorKind::NotHeld);
    tokio::time::sleep(Duration::from_millis(200)).await;
    assert_eq!(cluster.nodes_holding("y", fresh.token()).len(), 3);
    assert_eq!(cluster.nodes_holding("z", fresh.token()).len(), 3);
    assert_eq!(cluster.count_key("x"), 0, "the stale set's free key was not re-set");
    // Nobody else gets y while the fresh set is valid.
    assert_eq!(a.try_lock("y").await.unwrap_err().kind(), ErrorKind::NotAcquired);
    fresh.release().await.unwrap();
    assert!(
        common::eventually(Duration::from_secs(1), || cluster.keys_everywhere("*").unwrap() == 0)
            .await
    );
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_stale_read_share_released_and_extended_late_leaves_the_writer_alone() {
    let cluster = common::cluster(3);
    let (r, w) = (client(&cluster), client(&cluster));
    let mut share = r.read("doc").ttl(Duration::from_millis(300)).await.unwrap();
    // Every node stamped the share's expiry with this clock before the read returned.
    let share_expiry_bound = unix_ms() + 300;
    let writer = w
        .write("doc")
        .fenced()
        .retry(
            Retry::new()
                .with_unbounded_attempts()
                .with_delay(Duration::from_millis(20))
                .with_max_wait(Duration::from_secs(3)),
        )
        .await
        .unwrap();
    assert!(!share.is_valid());
    assert!(share.extend(Duration::from_secs(10)).await.is_err());
    // The writer needs a majority only: where the share was stamped a little later it may
    // still be there, expired or about to, and is purged by the next script. Never renewed.
    let fields = cluster.hash_fields("doc").unwrap();
    let renewed = |(field, expiry): (&String, &String)| {
        field.starts_with("r:") && expiry.parse::<u128>().unwrap() > share_expiry_bound
    };
    assert!(
        !fields.iter().flatten().flat_map(|f| f.iter()).any(renewed),
        "the stale share was renewed somewhere: {fields:?}"
    );
    let granted = fields.iter().flatten().filter(|f| f.keys().any(|k| k.starts_with("w:")));
    assert!(granted.count() >= 2, "the writer holds a majority: {fields:?}");
    assert!(share.release().await.is_err());
    // A new reader is refused while the writer is valid.
    assert_eq!(r.read("doc").once().await.unwrap_err().kind(), ErrorKind::NotAcquired);
    assert!(writer.check_held().await.unwrap());
    writer.release().await.unwrap();
    assert!(common::eventually(Duration::from_secs(1), || cluster.count_key("doc") == 0).await);
}

/// Owner O re-enters right as its first hold expires, while owner P polls hard: P never
/// gets the lock while one of O's holds is valid.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn reentry_racing_the_expiry_of_the_first_hold_never_lets_another_owner_in() {
    let cluster = common::cluster(3);
    let (o, p) = (client(&cluster), client(&cluster));
    for round in 0..10u64 {
        let key = format!("job{round}");
        let first = o.reentrant(&key, "O").ttl(Duration::from_millis(200)).await.unwrap();
        let deadline = first.deadline();
        let poller = {
            let (p, key) = (p.clone(), key.clone());
            tokio::spawn(async move {
                let stop = Instant::now() + Duration::from_millis(700);
                let mut grants = Vec::new();
                while Instant::now() < stop {
                    if let Ok(hold) =
                        p.reentrant(&key, "P").once().ttl(Duration::from_millis(100)).await
                    {
                        let granted = Instant::now();
                        tokio::time::sleep(Duration::from_millis(3)).await;
                        // Held until the release starts (or its deadline, if earlier).
                        grants.push((granted, Instant::now().min(hold.deadline())));
                        let _ = hold.release().await;
                    }
                }
                grants
            })
        };
        // Re-enter a little before, at, or a little after the first hold's deadline.
        let offset = Duration::from_millis(round * 4);
        tokio::time::sleep_until((deadline - Duration::from_millis(20) + offset).into()).await;
        let second = o.reentrant(&key, "O").ttl(Duration::from_millis(400)).await;
        let second_window = second.as_ref().ok().map(|h| (Instant::now(), h.deadline()));
        let grants = poller.await.unwrap();
        for (start, end) in &grants {
            let overlaps_first = *start < deadline;
            let overlaps_second = second_window.is_some_and(|(s, e)| *start < e && s < *end);
            assert!(
                !overlaps_first && !overlaps_second,
                "round {round}: P held [{start:?}, {end:?}] while O held: first until {deadline:?}, second {second_window:?}"
            );
        }
        drop(first);
        if let Ok(second) = second {
            let _ = second.release().await;
        }
    }
}

/// The wall clock in milliseconds, as the local nodes' `TIME` gives it to the scripts.
fn unix_ms() -> u128 {
    SystemTime::now().duration_since(SystemTime::UNIX_EPOCH).unwrap().as_millis()
}
