//! Restart quarantine: the known Redlock weakness (a master restarted empty forgets a lock
//! that is still held) shown without it, and closed with it.

use crate::common;

use std::time::{Duration, Instant};

use redlock::{ErrorKind, NodeOutcome, Redlock};
use redlock_testkit::Cluster;

const LEASE: Duration = Duration::from_millis(1500);

fn client(cluster: &Cluster, quarantine: Duration) -> Redlock {
    common::builder(cluster, Duration::from_millis(200))
        .ttl(LEASE)
        .restart_quarantine(quarantine)
        .build()
        .unwrap()
}

/// A holds the lock on nodes 0-2 while 3 and 4 are down; 3 and 4 come back empty and
/// node 0 restarts empty. Returns when B may try.
async fn a_holds_while_a_majority_forgets(cluster: &mut Cluster, a: &Redlock) -> redlock::Lock {
    cluster.node_mut(3).kill().unwrap();
    cluster.node_mut(4).kill().unwrap();
    let lock = a.try_lock("job").await.unwrap();
    cluster.node_mut(3).start_again().unwrap();
    cluster.node_mut(4).start_again().unwrap();
    cluster.node_mut(0).restart().unwrap();
    assert_eq!(cluster.nodes_holding("job", lock.token()), vec![1, 2]);
    lock
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn without_quarantine_a_restarted_majority_grants_a_second_holder() {
    let mut cluster = common::cluster(5);
    let a = client(&cluster, Duration::ZERO);
    let b = client(&cluster, Duration::ZERO);
    let a_lock = a_holds_while_a_majority_forgets(&mut cluster, &a).await;
    let b_lock = b.try_lock("job").await.expect("the weakness: B is granted on 0, 3, 4");
    assert!(a_lock.is_valid() && b_lock.is_valid(), "two valid holders at once");
    b_lock.release().await.unwrap();
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn with_quarantine_the_second_holder_waits_for_the_period_and_the_lease() {
    let mut cluster = common::cluster(5);
    let quarantine = LEASE;
    // A locks before any restart; with quarantine on, a brand-new cluster would refuse it
    // for one period (see below), so A's client goes without.
    let a = client(&cluster, Duration::ZERO);
    let b = client(&cluster, quarantine);
    let a_lock = a_holds_while_a_majority_forgets(&mut cluster, &a).await;
    let restarted = Instant::now();

    // Nodes 1 and 2 hold A's key; the restarted 0, 3 and 4 may not vote.
    let err = b.try_lock("job").await.unwrap_err();
    assert!(matches!(err.kind(), ErrorKind::NotAcquired | ErrorKind::Unavailable), "{err}");
    assert_eq!(err.granted(), 0, "{err}");
    for report in err.nodes() {
        let outcome = report.outcome();
        let allowed = [NodeOutcome::Quarantined, NodeOutcome::Held, NodeOutcome::Pending];
        assert!(allowed.contains(outcome), "{err}");
    }
    assert!(a_lock.is_valid());

    // Once A's lease and the quarantine are over, B gets the lock.
    let b_lock = loop {
        match b.try_lock("job").await {
            Ok(lock) => break lock,
            Err(err) => {
                assert!(
                    restarted.elapsed() < quarantine + Duration::from_secs(3),
                    "still refused: {err}"
                );
                tokio::time::sleep(Duration::from_millis(50)).await;
            }
        }
    };
    assert!(!a_lock.is_valid(), "B was granted while A's lease was still valid");
    assert!(restarted.elapsed() >= quarantine, "granted before the quarantine ended");
    b_lock.release().await.unwrap();
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_new_cluster_is_quarantined_for_one_period() {
    let cluster = common::cluster(3);
    let rl = client(&cluster, Duration::from_millis(500));
    let err = rl.try_lock("k").await.unwrap_err();
    assert_eq!(err.kind(), ErrorKind::Unavailable, "{err}");
    assert!(err.to_string().contains("in restart quarantine"), "{err}");
    // Nothing of the refused attempt stays behind.
    assert!(common::eventually(Duration::from_secs(1), || cluster.count_key("k") == 0).await);
    // The period (plus the uptime's one-second resolution) passes, and the nodes vote.
    let started = Instant::now();
    loop {
        match rl.try_lock("k").await {
            Ok(lock) => break lock.release().await.unwrap(),
            Err(err) => assert!(started.elapsed() < Duration::from_secs(4), "{err}"),
        }
        tokio::time::sleep(Duration::from_millis(50)).await;
    }
}
