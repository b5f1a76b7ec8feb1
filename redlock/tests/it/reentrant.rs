//! The reentrant lock: nested holds of one owner, each its own field on the nodes, other
//! owners refused.

use crate::common;

use std::time::Duration;

use redlock::{ErrorKind, NodeOutcome};
use redlock_testkit::Cluster;

/// The owner's live holds on each live, unpaused node (`None`: none, or node skipped).
fn counts(cluster: &Cluster, key: &str, owner: &str) -> Vec<Option<i64>> {
    cluster
        .nodes()
        .iter()
        .map(|node| {
            if !node.is_running() || node.is_paused() {
                return None;
            }
            let mut con = node.connection().ok()?;
            let (secs, micros): (i64, i64) = redis::cmd("TIME").query(&mut con).ok()?;
            let now = secs * 1000 + micros / 1000;
            let fields: Vec<(String, i64)> = redis::cmd("HGETALL").arg(key).query(&mut con).ok()?;
            let suffix = format!(":{owner}");
            let live = fields
                .iter()
                .filter(|(field, expiry)| {
                    field.starts_with("h:") && field.ends_with(&suffix) && *expiry > now
                })
                .count();
            (live > 0).then(|| i64::try_from(live).unwrap())
        })
        .collect()
}

async fn counts_become(cluster: &Cluster, key: &str, owner: &str, expected: &[Option<i64>]) {
    let settled =
        common::eventually(Duration::from_secs(5), || counts(cluster, key, owner) == expected)
            .await;
    assert!(settled, "counts {:?}, expected {expected:?}", counts(cluster, key, owner));
}

/// Plants a hold of `owner` on node `i` by hand, expiring `ms` from the node's now.
fn plant_hold(cluster: &Cluster, i: usize, key: &str, owner: &str, ms: i64) {
    let mut con = cluster.node(i).connection().unwrap();
    let (secs, micros): (i64, i64) = redis::cmd("TIME").query(&mut con).unwrap();
    let expiry = secs * 1000 + micros / 1000 + ms;
    let field = format!("h:{}:{owner}", "0".repeat(40));
    let _: () = redis::cmd("HSET").arg(key).arg(field).arg(expiry).query(&mut con).unwrap();
    let _: () = redis::cmd("PEXPIREAT").arg(key).arg(expiry).query(&mut con).unwrap();
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn reentry_counts_holds_and_the_last_release_deletes_the_key_everywhere() {
    let cluster = common::cluster(5);
    let rl = common::client(&cluster);
    let first = rl.reentrant("job", "worker-1").once().await.unwrap();
    assert_eq!((first.resource(), first.owner(), first.key()), ("job", "worker-1", "job"));
    assert!(first.field().starts_with("h:") && first.field().ends_with(":worker-1"));
    assert!(
        first.validity() > Duration::from_secs(9) && first.validity() < Duration::from_secs(10)
    );
    counts_become(&cluster, "job", "worker-1", &[Some(1); 5]).await;

    let second = rl.reentrant("job", "worker-1").once().await.unwrap();
    assert_ne!(first.token(), second.token(), "every hold is its own");
    counts_become(&cluster, "job", "worker-1", &[Some(2); 5]).await;
    let pttl = cluster.node(0).pttl("job").unwrap();
    assert!(pttl > 9_000 && pttl <= 10_000, "the key lives as long as its longest hold: {pttl}");

    second.release().await.unwrap();
    counts_become(&cluster, "job", "worker-1", &[Some(1); 5]).await;
    first.release().await.unwrap();
    assert!(common::eventually(Duration::from_secs(1), || cluster.count_key("job") == 0).await);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_short_hold_never_shortens_the_lease_of_a_longer_one() {
    let cluster = common::cluster(3);
    let rl = common::client(&cluster);
    let long = rl.reentrant("job", "w").ttl(Duration::from_secs(10)).once().await.unwrap();
    let mut short = rl.reentrant("job", "w").ttl(Duration::from_millis(500)).once().await.unwrap();
    short.extend(Duration::from_millis(500)).await.unwrap();
    assert!(short.validity() <= Duration::from_millis(500));
    // Every node (some answer after the decision) keeps the longer lease.
    let long_lease = || cluster.nodes().iter().all(|n| n.pttl("job").unwrap() > 9_000);
    assert!(common::eventually(Duration::from_secs(1), long_lease).await);
    short.release().await.unwrap();
    long.release().await.unwrap();
    assert!(common::eventually(Duration::from_secs(1), || cluster.count_key("job") == 0).await);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn another_owner_is_refused_and_cannot_release_or_extend() {
    let cluster = common::cluster(5);
    let rl = common::client(&cluster);
    let ours = rl.reentrant("job", "a").once().await.unwrap();
    // Every node first: a's slowest request must not race b's attempt below.
    counts_become(&cluster, "job", "a", &[Some(1); 5]).await;
    let err = rl.reentrant("job", "b").once().await.unwrap_err();
    assert_eq!(err.kind(), ErrorKind::NotAcquired, "{err}");
    assert!(err.held_by_others() >= 3, "{err}");
    counts_become(&cluster, "job", "a", &[Some(1); 5]).await;
    assert_eq!(counts(&cluster, "job", "b"), [None; 5], "the refused attempt left no field");

    // b holds "other"; then, on every node, a takes it over (as after b's lease ran out).
    let mut theirs = rl.reentrant("other", "b").once().await.unwrap();
    counts_become(&cluster, "other", "b", &[Some(1); 5]).await;
    for i in 0..5 {
        common::run(&cluster, i, &["DEL", "other"]);
        plant_hold(&cluster, i, "other", "a", 60_000);
    }
    let err = theirs.extend(Duration::from_secs(10)).await.unwrap_err();
    assert_eq!(err.kind(), ErrorKind::NotHeld, "{err}");
    assert!(err.held_by_others() >= 3, "{err}");
    let err = theirs.release().await.unwrap_err();
    assert_eq!(err.kind(), ErrorKind::NotHeld, "{err}");
    assert_eq!(counts(&cluster, "other", "a"), [Some(1); 5], "a's hold is untouched");
    assert_eq!(counts(&cluster, "other", "b"), [None; 5]);
    for node in cluster.nodes() {
        let pttl = node.pttl("other").unwrap();
        assert!(pttl > 59_000 && pttl <= 60_000, "a's lease is untouched: {pttl}");
    }
    ours.release().await.unwrap();
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn plain_and_reentrant_locks_on_one_resource_exclude_each_other() {
    let cluster = common::cluster(3);
    let rl = common::client(&cluster);
    let plain = rl.try_lock("res").await.unwrap();
    let err = rl.reentrant("res", "a").once().await.unwrap_err();
    assert_eq!(err.kind(), ErrorKind::WrongType, "{err}");
    assert!(err.nodes().iter().any(|n| *n.outcome() == NodeOutcome::WrongType));
    plain.release().await.unwrap();

    let hold = rl.reentrant("res", "a").once().await.unwrap();
    assert_eq!(rl.try_lock("res").await.unwrap_err().kind(), ErrorKind::WrongType);
    hold.release().await.unwrap();
    assert!(common::eventually(Duration::from_secs(1), || cluster.count_key("res") == 0).await);
}

/// An acquisition that timed out on a slow node still lands there once the node wakes (it
/// carries no deadline); the hold's release then removes it there too, and the other hold
/// is untouched.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_late_acquisition_on_a_slow_node_is_released_with_its_hold() {
    let mut cluster = common::cluster(5);
    let rl = common::builder(&cluster, Duration::from_millis(100)).build().unwrap();
    let lease = Duration::from_millis(1_500);
    let first = rl.reentrant("job", "a").ttl(lease).once().await.unwrap();
    counts_become(&cluster, "job", "a", &[Some(1); 5]).await;

    let slow = cluster.pause_for(&[0], Duration::from_millis(400)).unwrap();
    let second = rl.reentrant("job", "a").ttl(lease).once().await.unwrap();
    slow.join().unwrap();
    counts_become(&cluster, "job", "a", &[Some(2); 5]).await;

    second.release().await.unwrap();
    counts_become(&cluster, "job", "a", &[Some(1); 5]).await;
    assert_eq!(rl.reentrant("job", "b").once().await.unwrap_err().kind(), ErrorKind::NotAcquired);
    first.release().await.unwrap();
    assert!(common::eventually(Duration::from_secs(1), || cluster.count_key("job") == 0).await);
}

/// A node that restarted empty gets the next hold only; the older hold's release finds
/// nothing of its own there, and the quorum keeps the lock for the newer hold.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_node_restarted_empty_rejoins_and_the_quorum_keeps_the_lock() {
    let mut cluster = common::cluster(5);
    let rl = common::client(&cluster);
    let first = rl.reentrant("job", "a").once().await.unwrap();
    counts_become(&cluster, "job", "a", &[Some(1); 5]).await;
    cluster.node_mut(0).restart().unwrap();
    assert_eq!(cluster.count_key("job"), 4);

    let second = rl.reentrant("job", "a").once().await.unwrap();
    counts_become(&cluster, "job", "a", &[Some(1), Some(2), Some(2), Some(2), Some(2)]).await;
    first.release().await.unwrap();
    counts_become(&cluster, "job", "a", &[Some(1); 5]).await;
    assert_eq!(rl.reentrant("job", "b").once().await.unwrap_err().kind(), ErrorKind::NotAcquired);
    second.release().await.unwrap();
    assert!(common::eventually(Duration::from_secs(1), || cluster.count_key("job") == 0).await);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_killed_minority_still_grants_and_releases() {
    let mut cluster = common::cluster(5);
    for i in [0, 3] {
        cluster.node_mut(i).kill().unwrap();
    }
    let rl = common::builder(&cluster, Duration::from_millis(250)).build().unwrap();
    let first = rl.reentrant("job", "a").once().await.unwrap();
    let second = rl.reentrant("job", "a").await.unwrap();
    counts_become(&cluster, "job", "a", &[None, Some(2), Some(2), None, Some(2)]).await;
    second.release().await.unwrap();
    first.release().await.unwrap();
    assert!(common::eventually(Duration::from_secs(1), || cluster.count_key("job") == 0).await);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_dropped_hold_is_released_in_the_background() {
    let cluster = common::cluster(3);
    let rl = common::client(&cluster);
    let first = rl.reentrant("job", "a").once().await.unwrap();
    let second = rl.reentrant("job", "a").once().await.unwrap();
    counts_become(&cluster, "job", "a", &[Some(2); 3]).await;
    drop(second);
    counts_become(&cluster, "job", "a", &[Some(1); 3]).await;
    let moved = tokio::spawn(async move { first }).await.unwrap();
    drop(moved);
    assert!(common::eventually(Duration::from_secs(1), || cluster.count_key("job") == 0).await);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn empty_names_are_config_errors() {
    let cluster = common::cluster(1);
    let rl = common::client(&cluster);
    assert_eq!(rl.reentrant("job", "").once().await.unwrap_err().kind(), ErrorKind::Config);
    assert_eq!(rl.reentrant("", "a").once().await.unwrap_err().kind(), ErrorKind::Config);
    assert_eq!(rl.reentrant("job", "").await.unwrap_err().kind(), ErrorKind::Config);
    let err = rl.reentrant("job", "a").ttl(Duration::ZERO).once().await.unwrap_err();
    assert_eq!(err.kind(), ErrorKind::Config);
}

/// A release or an acquisition cancelled mid-round takes back exactly its own hold (in the
/// background, queued behind what it undoes), and the other hold survives.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn cancelled_calls_take_back_exactly_their_own_hold() {
    let mut cluster = common::cluster(5);
    let rl = common::builder(&cluster, Duration::from_secs(2)).build().unwrap();
    let first = rl.reentrant("job", "a").once().await.unwrap();
    let second = rl.reentrant("job", "a").once().await.unwrap();
    counts_become(&cluster, "job", "a", &[Some(2); 5]).await;

    // With a majority hung, both calls are still in flight when we give up on them.
    for i in [0, 1, 2] {
        cluster.node_mut(i).pause().unwrap();
    }
    let release = tokio::time::timeout(Duration::from_millis(100), second.release()).await;
    assert!(release.is_err(), "the release should still have been running");
    let attempt = tokio::time::timeout(Duration::from_millis(100), rl.reentrant("job", "a")).await;
    assert!(attempt.is_err(), "the attempt should still have been running");
    for i in [0, 1, 2] {
        cluster.node_mut(i).resume().unwrap();
    }
    counts_become(&cluster, "job", "a", &[Some(1); 5]).await;
    tokio::time::sleep(Duration::from_millis(200)).await;
    assert_eq!(counts(&cluster, "job", "a"), [Some(1); 5], "only the first hold is left");
    first.release().await.unwrap();
    assert!(common::eventually(Duration::from_secs(1), || cluster.count_key("job") == 0).await);
}

/// The owner's last release is published, so a waiting `lock_reentrant` of another owner
/// starts at once instead of after its retry pause.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_last_release_wakes_a_waiting_owner() {
    let cluster = common::cluster(3);
    let patient =
        redlock::Retry::new().with_delay(Duration::from_secs(5)).with_jitter(Duration::ZERO);
    let rl = common::builder(&cluster, Duration::from_millis(200)).retry(patient).build().unwrap();
    let first = rl.reentrant("job", "a").once().await.unwrap();
    let second = rl.reentrant("job", "a").once().await.unwrap();
    let waiter = {
        let rl = rl.clone();
        tokio::spawn(async move { rl.reentrant("job", "b").await })
    };
    tokio::time::sleep(Duration::from_millis(300)).await;
    second.release().await.unwrap();
    tokio::time::sleep(Duration::from_millis(300)).await;
    assert!(!waiter.is_finished(), "b must wait for a's last hold");
    let released = std::time::Instant::now();
    first.release().await.unwrap();
    let theirs = tokio::time::timeout(Duration::from_secs(2), waiter).await.unwrap().unwrap();
    assert!(released.elapsed() < Duration::from_secs(2));
    assert_eq!(theirs.unwrap().owner(), "b");
}
