//! Connections: lazy, shared, and re-established after a node restarts.

mod common;

use std::time::Duration;

use redlock::NodeOutcome;

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
