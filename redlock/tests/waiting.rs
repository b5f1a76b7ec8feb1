//! Waiting: woken on release, polling as a fallback, bounded, and leaving nothing behind.

mod common;

use std::time::{Duration, Instant};

use redlock::{ErrorKind, Redlock, Retry};
use redlock_testkit::Cluster;

/// A client whose polling is far too slow to explain a fast handoff.
fn patient(cluster: &Cluster, poll: Duration, max_wait: Duration) -> Redlock {
    Redlock::builder()
        .nodes(cluster.urls())
        .node_timeout(Duration::from_millis(200))
        .retry(
            Retry::new()
                .with_unbounded_attempts()
                .with_delay(poll)
                .with_jitter(Duration::ZERO)
                .with_max_wait(max_wait),
        )
        .build()
        .unwrap()
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_waiter_is_woken_by_the_release_not_by_its_poll() {
    let cluster = common::cluster(5);
    let holder = common::client(&cluster);
    let waiter = patient(&cluster, Duration::from_secs(5), Duration::from_secs(20));
    let lock = holder.try_lock("hot").await.unwrap();
    let waiting = tokio::spawn(async move {
        let lock = waiter.lock("hot").await.unwrap();
        let granted_at = Instant::now();
        lock.release().await.unwrap();
        granted_at
    });
    // Let the waiter fail once and subscribe.
    assert!(
        common::eventually(Duration::from_secs(2), || common::subscribers(&cluster, "hot")
            .iter()
            .all(|&n| n == 1))
        .await
    );
    let released_at = Instant::now();
    lock.release().await.unwrap();
    let granted_at = waiting.await.unwrap();
    let gap = granted_at - released_at;
    assert!(
        gap < Duration::from_secs(1),
        "handoff took {gap:?}: the 5 s poll, not the release, woke the waiter"
    );
    // The waiter is done: no subscription is left.
    assert!(
        common::eventually(Duration::from_secs(2), || common::subscribers(&cluster, "hot")
            .iter()
            .all(|&n| n == 0))
        .await
    );
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_lock_left_to_expire_is_found_by_polling() {
    let cluster = common::cluster(3);
    let holder = common::client(&cluster);
    let waiter = patient(&cluster, Duration::from_millis(50), Duration::from_secs(5));
    let lock = holder.try_lock("expiring").ttl(Duration::from_millis(300)).await.unwrap();
    let started = Instant::now();
    let token = lock.token().to_owned();
    std::mem::forget(lock); // a crashed holder: no release, no notification
    let lock = waiter.lock("expiring").await.unwrap();
    assert!(started.elapsed() >= Duration::from_millis(250));
    assert_ne!(lock.token(), token);
    lock.release().await.unwrap();
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn waiting_is_bounded_by_the_max_wait() {
    let cluster = common::cluster(3);
    let holder = common::client(&cluster);
    let waiter = patient(&cluster, Duration::from_millis(50), Duration::from_millis(400));
    let lock = holder.try_lock("busy").await.unwrap();
    let started = Instant::now();
    let err = waiter.lock("busy").await.unwrap_err();
    let waited = started.elapsed();
    assert_eq!(err.kind(), ErrorKind::NotAcquired);
    assert!(waited >= Duration::from_millis(300) && waited < Duration::from_secs(2), "{waited:?}");
    lock.release().await.unwrap();
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_dropped_waiter_leaves_no_lock_and_no_subscription() {
    let cluster = common::cluster(3);
    let holder = common::client(&cluster);
    let waiter = patient(&cluster, Duration::from_secs(5), Duration::from_secs(20));
    let lock = holder.try_lock("k").await.unwrap();
    let waiting = tokio::spawn(async move { waiter.lock("k").await });
    assert!(
        common::eventually(Duration::from_secs(2), || common::subscribers(&cluster, "k")
            .iter()
            .all(|&n| n == 1))
        .await
    );
    waiting.abort();
    assert!(waiting.await.unwrap_err().is_cancelled());
    assert!(
        common::eventually(Duration::from_secs(2), || common::subscribers(&cluster, "k")
            .iter()
            .all(|&n| n == 0))
        .await
    );
    assert_eq!(cluster.nodes_holding("k", lock.token()).len(), 3);
    lock.release().await.unwrap();
    // Decided at the quorum: the last node's release may still be on its way.
    assert!(common::eventually(Duration::from_secs(1), || cluster.count_key("k") == 0).await);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn waiters_share_one_subscription_per_node() {
    let cluster = common::cluster(3);
    let holder = common::client(&cluster);
    let shared = patient(&cluster, Duration::from_secs(5), Duration::from_secs(20));
    let lock = holder.try_lock("shared").await.unwrap();
    let waiters: Vec<_> = (0..4)
        .map(|_| {
            let rl = shared.clone();
            tokio::spawn(async move { rl.lock("shared").await.unwrap().release().await.unwrap() })
        })
        .collect();
    tokio::time::sleep(Duration::from_millis(300)).await;
    // Four waiters of one client: one subscriber connection per node.
    assert_eq!(common::subscribers(&cluster, "shared"), vec![1, 1, 1]);
    let clients: Vec<usize> = cluster
        .nodes()
        .iter()
        .map(|node| {
            let mut con = node.connection().unwrap();
            let list: String = redis::cmd("CLIENT").arg("LIST").query(&mut con).unwrap();
            list.lines().filter(|l| l.contains("cmd=subscribe") || l.contains("sub=1")).count()
        })
        .collect();
    assert_eq!(clients, vec![1, 1, 1]);
    lock.release().await.unwrap();
    for waiter in waiters {
        tokio::time::timeout(Duration::from_secs(3), waiter).await.unwrap().unwrap();
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_task_asking_again_right_after_its_release_queues_behind_the_clients_waiter() {
    let cluster = common::cluster(5);
    // Polling far too slow to explain either grant: both come from release notifications.
    let rl = patient(&cluster, Duration::from_secs(5), Duration::from_secs(20));
    let first = rl.lock("turns").await.unwrap();
    let waiting = tokio::spawn({
        let rl = rl.clone();
        async move {
            let lock = rl.lock("turns").await.unwrap();
            let granted_at = Instant::now();
            tokio::time::sleep(Duration::from_millis(100)).await;
            let released_at = Instant::now();
            lock.release().await.unwrap();
            (granted_at, released_at)
        }
    });
    // The waiter failed once and is in line (subscribed).
    assert!(
        common::eventually(Duration::from_secs(2), || common::subscribers(&cluster, "turns")
            .iter()
            .all(|&n| n == 1))
        .await
    );
    first.release().await.unwrap();
    // At once, as a loop taking turns would: without the line, this attempt races the
    // waiter woken by the release above, and usually wins or splits the votes.
    let again = rl.lock("turns").await.unwrap();
    let again_at = Instant::now();
    let (waiter_granted_at, waiter_released_at) = waiting.await.unwrap();
    assert!(
        waiter_granted_at < again_at && waiter_released_at <= again_at,
        "the task that asked again was served before the waiter already in line"
    );
    assert!(
        again_at - waiter_released_at < Duration::from_secs(1),
        "woken by the waiter's release, not by the 5 s poll"
    );
    again.release().await.unwrap();
}
