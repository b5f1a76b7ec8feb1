//! Auto-extension: the lock outlives its TTL while held, and its loss is signalled.

use crate::common;

use std::time::{Duration, Instant};

use redlock::{ErrorKind, Redlock};
use redlock_testkit::Cluster;

const TTL: Duration = Duration::from_millis(300);

fn client(cluster: &Cluster) -> Redlock {
    common::builder(cluster, Duration::from_millis(50)).ttl(TTL).build().unwrap()
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn work_three_times_the_ttl_keeps_the_lock() {
    let cluster = common::cluster(5);
    let rl = client(&cluster);
    let other = client(&cluster);
    let output = rl
        .with_lock("long-job", |lease| {
            let other = other.clone();
            async move {
                let end = Instant::now() + TTL * 3;
                while Instant::now() < end {
                    let err = other.try_lock("long-job").await.unwrap_err();
                    assert_eq!(err.kind(), ErrorKind::NotAcquired, "{err}");
                    assert!(lease.validity() > Duration::ZERO);
                    tokio::time::sleep(TTL / 5).await;
                }
                assert!(!lease.is_lost());
                42
            }
        })
        .await
        .unwrap();
    assert_eq!(output, 42);
    common::gone_everywhere(&cluster, &["long-job"], "released when the work returned").await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_foreign_owner_taking_the_key_fires_lost_within_one_ttl() {
    let cluster = common::cluster(3);
    let rl = client(&cluster);
    let auto = rl.try_lock("k").await.unwrap().auto_extend();
    for node in cluster.nodes() {
        node.set("k", "foreign").unwrap();
    }
    let taken = Instant::now();
    let err = tokio::time::timeout(TTL, auto.lost()).await.expect("lost() within one TTL");
    assert_eq!(err.kind(), ErrorKind::NotHeld, "{err}");
    assert!(taken.elapsed() < TTL);
    assert!(auto.release().await.is_err());
    assert_eq!(cluster.nodes_holding("k", "foreign"), vec![0, 1, 2], "the foreign keys stay");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn with_lock_returns_the_loss_when_the_lock_was_lost_during_the_work() {
    let cluster = common::cluster(3);
    let rl = client(&cluster);
    let result = rl
        .with_lock("k", |lease| {
            for node in cluster.nodes() {
                node.set("k", "foreign").unwrap();
            }
            async move {
                let err = lease.lost().await;
                assert_eq!(err.kind(), ErrorKind::NotHeld);
                "done without the lock"
            }
        })
        .await;
    let err = result.unwrap_err();
    assert_eq!(err.kind(), ErrorKind::NotHeld, "{err}");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_killed_minority_does_not_lose_the_lock() {
    let mut cluster = common::cluster(5);
    let rl = client(&cluster);
    let auto = rl.try_lock("k").await.unwrap().auto_extend();
    cluster.node_mut(0).kill().unwrap();
    cluster.node_mut(4).kill().unwrap();
    tokio::time::sleep(TTL * 3).await;
    assert!(auto.validity() > Duration::ZERO);
    assert!(!auto.lease().is_lost());
    auto.release().await.unwrap();
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_killed_majority_loses_the_lock_and_says_so() {
    let mut cluster = common::cluster(5);
    let rl = client(&cluster);
    let auto = rl.try_lock("k").await.unwrap().auto_extend();
    for i in [0, 1, 2] {
        cluster.node_mut(i).kill().unwrap();
    }
    let err = tokio::time::timeout(TTL * 2, auto.lost()).await.expect("lost() fires");
    assert_eq!(err.kind(), ErrorKind::NotHeld, "{err}");
    assert!(err.to_string().contains("validity ran out"), "{err}");
    assert_eq!(auto.validity(), Duration::ZERO);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_capped_lock_stops_extending_at_the_cap() {
    let cluster = common::cluster(3);
    let rl = client(&cluster);
    let started = Instant::now();
    let auto = rl.try_lock("k").await.unwrap().auto_extend_capped(TTL * 2);
    let err = tokio::time::timeout(TTL * 5, auto.lost()).await.expect("lost() fires");
    assert!(err.to_string().contains("maximum hold time"), "{err}");
    let held = started.elapsed();
    assert!(held >= TTL * 2 - TTL / 3 && held < TTL * 4, "held {held:?}");
    assert!(common::eventually(Duration::from_secs(1), || cluster.count_key("k") == 0).await);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn dropping_an_auto_lock_stops_the_extender_and_releases() {
    let cluster = common::cluster(3);
    let rl = client(&cluster);
    let auto = rl.try_lock("k").await.unwrap().auto_extend();
    let lease = auto.lease();
    drop(auto);
    assert!(common::eventually(Duration::from_secs(1), || cluster.count_key("k") == 0).await);
    // Nothing keeps extending: the key stays gone, and the lease just runs out.
    tokio::time::sleep(TTL).await;
    assert_eq!(cluster.count_key("k"), 0);
    assert_eq!(lease.validity(), Duration::ZERO);
    assert!(lease.is_lost(), "a dropped AutoLock's lease reports the end (issue 9, item 8)");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn releasing_waits_for_the_extender_and_leaves_nothing() {
    let cluster = common::cluster(3);
    let rl = client(&cluster);
    for _ in 0..20 {
        let auto = rl.try_lock("k").await.unwrap().auto_extend();
        tokio::time::sleep(Duration::from_millis(7)).await;
        auto.release().await.unwrap();
        assert!(common::eventually(Duration::from_secs(1), || cluster.count_key("k") == 0).await);
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_fenced_lease_carries_the_fencing_token_through_its_extensions() {
    let cluster = common::cluster(3);
    let rl = client(&cluster);
    let plain = rl.with_lock("job", |lease| async move { lease.fencing_token() }).await.unwrap();
    assert_eq!(plain, None, "not requested fenced");
    let first = rl.with_lock(rl.lock("job").fenced(), |lease| async move {
        let token = lease.fencing_token();
        // Past two extensions: the token stays the grant's.
        tokio::time::sleep(TTL).await;
        assert!(!lease.is_lost());
        assert_eq!(lease.fencing_token(), token);
        token
    });
    let first = first.await.unwrap().expect("a fenced lease has a token");
    let auto = rl.lock("job").fenced().await.unwrap().auto_extend();
    let second = auto.fencing_token().expect("a fenced auto-lock has a token");
    assert_eq!(auto.lease().fencing_token(), Some(second));
    assert!(second > first, "{second} after {first}");
    auto.release().await.unwrap();
}

/// Extensions that fail because two of three nodes are gone (one dead, one paused) do not
/// end the hold at once: its validity runs out. The loss then names each node's cause from
/// the last extension that failed, the paused node's timeout included.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_lease_lost_to_failed_extensions_names_each_nodes_cause() {
    let mut cluster = common::cluster(3);
    let rl = client(&cluster);
    common::warm(&rl).await;
    let lock = rl.try_lock("causes").await.unwrap();
    common::held_on(&cluster, "causes", lock.token(), &[0, 1, 2]).await;
    let auto = lock.auto_extend();
    cluster.node_mut(1).kill().unwrap();
    cluster.node_mut(2).pause().unwrap();
    let err = tokio::time::timeout(TTL * 3, auto.lost()).await.expect("lost() within its lease");
    cluster.node_mut(2).resume().unwrap();
    assert_eq!(err.kind(), ErrorKind::NotHeld, "{err}");
    let text = err.to_string();
    assert!(text.contains("the validity ran out before an extension landed"), "{text}");
    assert!(text.contains("the last extension: too few nodes answered"), "{text}");
    let dead = format!("127.0.0.1:{}/0", cluster.node(1).port());
    let paused = format!("127.0.0.1:{}/0", cluster.node(2).port());
    assert!(text.contains(&format!("[{dead}: unreachable")), "{text}");
    assert!(text.contains(&format!("[{paused}: timed out]")), "{text}");
    drop(auto);
}

/// Work that ends well within the lease, then a release slowed in the network past the
/// keys' expiry (no other client): `with_lock` returns the work's output, since the lock
/// was held to the end of the work; a bare `release()` in the same case says `NotHeld`
/// (its first send found the keys gone).
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn with_lock_whose_release_arrives_after_the_lease_ran_out_returns_the_output() {
    let faulty = std::sync::Arc::new(redlock_testkit::FaultyCluster::start(3).unwrap());
    let rl = common::builder_for(faulty.urls(), Duration::from_millis(1500))
        .ttl(Duration::from_millis(400))
        .build()
        .unwrap();
    common::warm(&rl).await;
    let slow_links = || {
        for i in 0..3 {
            faulty.proxy(i).set_fault(redlock_testkit::NetFault::Latency {
                fixed: Duration::from_millis(450),
                jitter: Duration::ZERO,
            });
        }
    };
    let result = rl
        .with_lock(rl.try_lock("slow-release"), |lease| async move {
            tokio::time::sleep(Duration::from_millis(30)).await;
            slow_links();
            lease.is_valid()
        })
        .await;
    assert!(result.as_ref().is_ok_and(|&valid| valid), "{result:?}");
    for i in 0..3 {
        faulty.proxy(i).heal();
    }
    let lock = rl.try_lock("slow-release").await.unwrap();
    slow_links();
    let err = lock.release().await.unwrap_err();
    assert_eq!(err.kind(), ErrorKind::NotHeld, "{err}");
    for i in 0..3 {
        faulty.proxy(i).heal();
    }
    assert!(
        common::eventually(Duration::from_secs(1), || faulty.cluster().count_key("slow-release")
            == 0)
        .await
    );
}

/// Keys taken by another owner during the work, found by the release while the lease is
/// still running: the lock was not held to the end, and `with_lock` says so.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn with_lock_whose_release_finds_another_owner_within_the_lease_returns_the_loss() {
    let cluster = common::cluster(3);
    let rl = client(&cluster);
    let result = rl
        .with_lock("taken", |_lease| {
            for node in cluster.nodes() {
                node.set("taken", "foreign").unwrap();
            }
            async { "done without the lock" }
        })
        .await;
    let err = result.unwrap_err();
    assert_eq!(err.kind(), ErrorKind::NotHeld, "{err}");
    assert_eq!(cluster.nodes_holding("taken", "foreign"), vec![0, 1, 2]);
}
