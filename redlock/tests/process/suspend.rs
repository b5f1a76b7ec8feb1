//! A machine suspended while it holds a lock: the nodes' clocks ran on while this process's
//! monotonic clock stood still, so a suspend counts against the validity, and one past the
//! lease ends it.
//!
//! The suspend is simulated through the library's own clock
//! (`redlock::test_hooks::simulate_suspend`, which moves every lease of the process ahead as
//! a real suspend would on Linux's `CLOCK_BOOTTIME`). It is process-wide and only ever moves
//! ahead: the tests of this binary take turns (`crate::serial`), each on leases it takes
//! after the previous test's suspend, and no other binary uses it. The nodes are left as they are: only the
//! client's clock can tell (in a real suspend the keys expire, but a plain extension landing
//! after the wake would set them again, so the nodes cannot be relied on to tell).

use crate::common;

use std::time::{Duration, Instant};

use redlock::test_hooks::simulate_suspend;
use redlock::{ErrorKind, Redlock};
use redlock_testkit::Cluster;

/// Long enough that nothing expires by itself while a test runs, even on a loaded machine.
const TTL: Duration = Duration::from_secs(30);

/// How soon after the wake a timer guarding the lease must notice: the library wakes such
/// timers every quarter second; the rest is room for a loaded machine.
const NOTICED_WITHIN: Duration = Duration::from_secs(3);

fn client(cluster: &Cluster) -> Redlock {
    common::builder(cluster, Duration::from_millis(500)).ttl(TTL).build().unwrap()
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_suspend_shortens_the_validity_and_one_past_the_lease_refuses_extend_and_release() {
    let _serial = crate::serial();
    let cluster = common::cluster(3);
    let rl = client(&cluster);
    let mut lock = rl.try_lock("k").await.unwrap();
    let before = lock.validity();
    let deadline = lock.deadline();
    simulate_suspend(Duration::from_secs(10));
    let after = lock.validity();
    assert!(after <= before - Duration::from_secs(10), "{before:?} then {after:?}");
    assert!(after > Duration::from_secs(10), "{after:?}");
    assert!(lock.is_valid());
    assert!(
        lock.deadline() <= deadline - Duration::from_secs(10),
        "the deadline handed out moves earlier by the suspend"
    );
    simulate_suspend(TTL);
    assert!(!lock.is_valid());
    assert_eq!(lock.validity(), Duration::ZERO);
    assert!(lock.deadline() <= Instant::now());
    let err = lock.extend(TTL).await.unwrap_err();
    assert_eq!(err.kind(), ErrorKind::NotHeld, "{err}");
    let err = lock.release().await.unwrap_err();
    assert_eq!(err.kind(), ErrorKind::NotHeld, "{err}");
    assert!(common::eventually(Duration::from_secs(5), || cluster.count_key("k") == 0).await);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_suspend_past_the_lease_fires_lost_soon_after_the_machine_wakes() {
    let _serial = crate::serial();
    let cluster = common::cluster(3);
    let rl = client(&cluster);
    let auto = rl.try_lock("k").await.unwrap().auto_extend();
    let lease = auto.lease();
    let lost = tokio::spawn(async move { lease.lost().await });
    tokio::time::sleep(Duration::from_millis(100)).await;
    assert!(!lost.is_finished(), "held before the suspend");
    simulate_suspend(TTL + Duration::from_secs(1));
    let woke = Instant::now();
    let err = tokio::time::timeout(NOTICED_WITHIN, lost)
        .await
        .expect("lost() soon after the wake, not a lease later")
        .unwrap();
    assert_eq!(err.kind(), ErrorKind::NotHeld, "{err}");
    assert!(woke.elapsed() < NOTICED_WITHIN);
    assert_eq!(auto.validity(), Duration::ZERO);
    let err = auto.release().await.unwrap_err();
    assert_eq!(err.kind(), ErrorKind::NotHeld, "{err}");
    assert!(common::eventually(Duration::from_secs(5), || cluster.count_key("k") == 0).await);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn with_lock_whose_work_is_suspended_past_the_lease_answers_not_held() {
    let _serial = crate::serial();
    let cluster = common::cluster(3);
    let rl = client(&cluster);
    let result = rl
        .with_lock("job", |_lease| async {
            simulate_suspend(TTL + Duration::from_secs(1));
            42
        })
        .await;
    let err = result.expect_err("work done across a suspend past the lease is not Ok");
    assert_eq!(err.kind(), ErrorKind::NotHeld, "{err}");
    assert!(common::eventually(Duration::from_secs(5), || cluster.count_key("job") == 0).await);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_suspend_past_the_lease_spares_the_next_owners_keys() {
    let _serial = crate::serial();
    let cluster = common::cluster(3);
    let rl = client(&cluster);
    let result = rl
        .with_lock("job", |_lease| async {
            simulate_suspend(TTL + Duration::from_secs(1));
            // What the nodes saw meanwhile: the keys expired and another client took the lock.
            for node in cluster.nodes() {
                node.set("job", "next-owner").unwrap();
            }
        })
        .await;
    let err = result.expect_err("work done across a suspend past the lease is not Ok");
    assert_eq!(err.kind(), ErrorKind::NotHeld, "{err}");
    // The hold's release (in the background) has had time to land.
    tokio::time::sleep(Duration::from_millis(500)).await;
    assert_eq!(cluster.nodes_holding("job", "next-owner"), vec![0, 1, 2]);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn an_acquisition_the_machine_was_suspended_during_is_refused_as_expired() {
    let _serial = crate::serial();
    let mut cluster = common::cluster(3);
    let rl = common::builder(&cluster, Duration::from_secs(5)).ttl(TTL).build().unwrap();
    common::warm(&rl).await;
    // The nodes hold every answer back while the machine "sleeps" in the middle of the round.
    let paused = cluster.pause_for(&[0, 1, 2], Duration::from_millis(600)).unwrap();
    let suspend = tokio::spawn(async {
        tokio::time::sleep(Duration::from_millis(200)).await;
        simulate_suspend(TTL);
    });
    let err = rl.try_lock("k").await.unwrap_err();
    suspend.await.unwrap();
    paused.join().unwrap();
    assert_eq!(err.kind(), ErrorKind::Expired, "{err}");
    assert!(common::eventually(Duration::from_secs(5), || cluster.count_key("k") == 0).await);
}
