//! Review of `Node::send_once` (forced releases: PING the cached connection, then send the
//! unconditional delete once). Attacks: a re-send under resets and lost replies, an ACL
//! user without `+ping`, a script cache flush, a hung node, latency near the node timeout.

use crate::common;

use std::time::{Duration, Instant};

use redlock::{Redlock, Retry};
use redlock_testkit::{FaultyCluster, Fuzz, NetFault, RedisNode};

/// How many times `node` ran `cmd` so far (`INFO commandstats`; a script's `DEL` counts).
fn calls(node: &RedisNode, cmd: &str) -> u64 {
    let mut con = node.connection().unwrap();
    let info: String = redis::cmd("INFO").arg("commandstats").query(&mut con).unwrap();
    let prefix = format!("cmdstat_{cmd}:calls=");
    info.lines()
        .find_map(|line| line.strip_prefix(prefix.as_str()))
        .and_then(|rest| rest.split(',').next())
        .map_or(0, |calls| calls.parse().unwrap())
}

fn dels(faulty: &FaultyCluster) -> Vec<u64> {
    faulty.cluster().nodes().iter().map(|node| calls(node, "del")).collect()
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
    let before: Vec<u64> = cluster.nodes().iter().map(|n| calls(n, "del")).collect();
    assert_eq!(admin.force_release("job").await.unwrap(), 3, "warm connections, PING refused");
    let after: Vec<u64> = cluster.nodes().iter().map(|n| calls(n, "del")).collect();
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
