//! The multi-resource lock: all or nothing per node, the quorum over the whole set, release
//! and extend of the whole set, never touching other owners' keys.

use crate::common;

use std::time::Duration;

use redlock::{ErrorKind, NodeOutcome};
use redlock_testkit::{Cluster, NodeConfig};

const SET: [&str; 3] = ["a", "b", "c"];

/// On which nodes every key of `SET` holds `token`.
fn nodes_holding_all(cluster: &Cluster, token: &str) -> Vec<usize> {
    let holding: Vec<Vec<usize>> = SET.iter().map(|k| cluster.nodes_holding(k, token)).collect();
    holding[0].iter().copied().filter(|i| holding.iter().all(|h| h.contains(i))).collect()
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_granted_set_is_on_every_node_and_release_removes_all_of_it() {
    let cluster = common::cluster(5);
    let rl = common::client(&cluster);
    let lock = rl.many(&SET).once().await.unwrap();
    assert_eq!(lock.resources(), SET);
    assert_eq!(lock.keys(), SET);
    assert!(lock.validity() > Duration::from_secs(9) && lock.validity() < Duration::from_secs(10));
    assert!(
        common::eventually(Duration::from_secs(2), || nodes_holding_all(&cluster, lock.token())
            .len()
            == 5)
        .await
    );
    for key in SET {
        let pttl = cluster.node(0).pttl(key).unwrap();
        assert!(pttl > 9_000 && pttl <= 10_000, "PX is the lease: {pttl}");
    }
    // Each resource is locked for plain locks too.
    assert_eq!(rl.try_lock("b").await.unwrap_err().kind(), ErrorKind::NotAcquired);
    lock.release().await.unwrap();
    let gone = || SET.iter().all(|k| cluster.count_key(k) == 0);
    assert!(common::eventually(Duration::from_secs(1), gone).await);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn one_key_held_on_a_majority_refuses_the_set_and_leaves_none_of_it() {
    let cluster = common::cluster(5);
    for i in [0, 1, 2] {
        cluster.node(i).set("b", "foreign").unwrap();
    }
    let rl = common::client(&cluster);
    let err = rl.many(&SET).once().await.unwrap_err();
    assert_eq!(err.kind(), ErrorKind::NotAcquired, "{err}");
    assert_eq!(err.held_by_others(), 3, "{err}");
    assert_eq!(err.resource(), Some("a, b, c"));
    assert!(
        common::eventually(Duration::from_secs(1), || cluster.count_key("a") == 0
            && cluster.count_key("c") == 0
            && cluster.count_key("b") == 3)
        .await,
        "the refused attempt left keys behind"
    );
    assert_eq!(cluster.nodes_holding("b", "foreign"), vec![0, 1, 2]);
    for i in [0, 1, 2] {
        assert_eq!(cluster.node(i).pttl("b").unwrap(), -1, "the foreign key is untouched");
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_foreign_key_on_a_minority_blocks_only_those_nodes_and_survives_the_release() {
    let cluster = common::cluster(5);
    for i in [0, 1] {
        cluster.node(i).set("b", "foreign").unwrap();
    }
    let rl = common::client(&cluster);
    let lock = rl.many(&SET).once().await.unwrap();
    assert!(
        common::eventually(Duration::from_secs(1), || nodes_holding_all(&cluster, lock.token())
            == vec![2, 3, 4])
        .await
    );
    // All or nothing on each node: nothing of the set on the nodes that refused it.
    assert_eq!(cluster.count_key("a"), 3);
    assert_eq!(cluster.count_key("c"), 3);
    lock.release().await.unwrap();
    assert!(
        common::eventually(Duration::from_secs(1), || cluster.count_key("a")
            + cluster.count_key("c")
            == 0)
        .await
    );
    assert_eq!(cluster.nodes_holding("b", "foreign"), vec![0, 1]);
    assert_eq!(cluster.count_key("b"), 2);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn release_never_deletes_another_owners_key() {
    let cluster = common::cluster(5);
    let rl = common::client(&cluster);
    let lock = rl.many(&SET).once().await.unwrap();
    assert!(
        common::eventually(Duration::from_secs(1), || nodes_holding_all(&cluster, lock.token())
            .len()
            == 5)
        .await
    );
    // Another owner took "b" on a majority (as after our lease ran out there).
    for i in [0, 1, 2] {
        cluster.node(i).set("b", "foreign").unwrap();
    }
    let err = lock.release().await.unwrap_err();
    assert_eq!(err.kind(), ErrorKind::NotHeld, "{err}");
    assert_eq!(err.held_by_others(), 3, "{err}");
    assert_eq!(cluster.nodes_holding("b", "foreign"), vec![0, 1, 2]);
    assert!(
        common::eventually(Duration::from_secs(1), || cluster.count_key("a") == 0
            && cluster.count_key("c") == 0
            && cluster.count_key("b") == 3)
        .await,
        "our own keys are gone, the foreign ones stay"
    );
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn extend_renews_every_key_and_one_that_finds_the_set_gone_releases_it() {
    let cluster = common::cluster(5);
    let rl = common::client(&cluster);
    let mut lock = rl.many(&SET).ttl(Duration::from_millis(500)).once().await.unwrap();
    tokio::time::sleep(Duration::from_millis(300)).await;
    lock.extend(Duration::from_secs(5)).await.unwrap();
    assert!(lock.validity() > Duration::from_millis(4_800), "{:?}", lock.validity());
    assert!(
        common::eventually(Duration::from_secs(1), || cluster
            .nodes()
            .iter()
            .all(|n| SET.iter().all(|k| n.pttl(k).unwrap() > 4_500)))
        .await,
        "every key renewed on every node"
    );
    tokio::time::sleep(Duration::from_millis(300)).await;
    assert_eq!(rl.try_lock("a").await.unwrap_err().kind(), ErrorKind::NotAcquired);

    // Another owner has "c" on a majority; node 3 lost "b": the extension renews the set on
    // node 4 only (node 3 no longer holds all of it, and nothing is set again there), then
    // finds the set gone.
    for i in [0, 1, 2] {
        cluster.node(i).set("c", "foreign").unwrap();
    }
    common::run(&cluster, 3, &["DEL", "b"]);
    let err = lock.extend(Duration::from_secs(30)).await.unwrap_err();
    assert_eq!(err.kind(), ErrorKind::NotHeld, "{err}");
    assert_eq!(lock.validity(), Duration::ZERO);
    let ours = || SET.iter().map(|k| cluster.nodes_holding(k, lock.token()).len()).sum::<usize>();
    assert!(
        common::eventually(Duration::from_secs(2), || ours() == 0).await,
        "every key of ours is released, none left for the 30 s lease"
    );
    for i in [0, 1, 2] {
        assert_eq!(cluster.node(i).pttl("c").unwrap(), -1, "the foreign key is untouched");
    }
    lock.release().await.unwrap_err();
    assert_eq!(cluster.nodes_holding("c", "foreign"), vec![0, 1, 2]);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_killed_minority_still_grants() {
    let mut cluster = common::cluster(5);
    for i in [0, 3] {
        cluster.node_mut(i).kill().unwrap();
    }
    let rl = common::builder(&cluster, Duration::from_millis(250)).build().unwrap();
    let lock = rl.many(&SET).await.unwrap();
    lock.release().await.unwrap();
    let gone = || SET.iter().all(|k| cluster.count_key(k) == 0);
    assert!(common::eventually(Duration::from_secs(1), gone).await);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_key_of_another_type_is_an_error_and_nothing_is_set() {
    let cluster = common::cluster(3);
    for node in cluster.nodes() {
        let mut con = node.connection().unwrap();
        let _: i64 = redis::cmd("RPUSH").arg("b").arg("item").query(&mut con).unwrap();
    }
    let rl = common::client(&cluster);
    let err = rl.many(&SET).once().await.unwrap_err();
    assert_eq!(err.kind(), ErrorKind::WrongType, "{err}");
    assert!(err.nodes().iter().any(|n| *n.outcome() == NodeOutcome::WrongType), "{err}");
    assert_eq!(cluster.count_key("a") + cluster.count_key("c"), 0);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_dropped_multi_lock_is_released_in_the_background() {
    let cluster = common::cluster(3);
    let rl = common::client(&cluster);
    let lock = rl.many(&SET).once().await.unwrap();
    let lock = tokio::spawn(async move { lock }).await.unwrap();
    drop(lock);
    assert!(
        common::eventually(Duration::from_secs(1), || SET
            .iter()
            .all(|k| cluster.count_key(k) == 0))
        .await
    );
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn bad_sets_are_config_errors() {
    let cluster = common::cluster(1);
    let rl = common::client(&cluster);
    for set in [&[][..], &["a", ""], &["a", "b", "a"]] {
        assert_eq!(rl.many(set).once().await.unwrap_err().kind(), ErrorKind::Config, "{set:?}");
        assert_eq!(rl.many(set).await.unwrap_err().kind(), ErrorKind::Config, "{set:?}");
    }
    let err = rl.many(&["a"]).ttl(Duration::ZERO).once().await.unwrap_err();
    assert_eq!(err.kind(), ErrorKind::Config);
    assert_eq!(cluster.count_key("a"), 0);
}

/// With one hash tag the whole set lives in one slot, so a Redis Cluster node runs the
/// scripts; without it the node refuses them (`CROSSSLOT`).
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_shared_hash_tag_works_on_a_cluster_node() {
    let cluster =
        Cluster::start_with(1, NodeConfig::new().extra_arg("--cluster-enabled").extra_arg("yes"))
            .unwrap();
    {
        let mut con = cluster.node(0).connection().unwrap();
        // Every slot named (ADDSLOTSRANGE is Redis 7.0+; CI also runs this against 6.2).
        let _: () = redis::cmd("CLUSTER")
            .arg("ADDSLOTS")
            .arg((0..16384).collect::<Vec<u16>>())
            .query(&mut con)
            .unwrap();
    }
    let ready = common::eventually(Duration::from_secs(5), || {
        let mut con = cluster.node(0).connection().unwrap();
        let info: String = redis::cmd("CLUSTER").arg("INFO").query(&mut con).unwrap();
        info.contains("cluster_state:ok")
    })
    .await;
    assert!(ready, "the one-node cluster did not come up");
    let rl =
        common::builder(&cluster, Duration::from_millis(500)).key_prefix("locks:").build().unwrap();
    let mut lock = rl.many(&["{orders}:1", "{orders}:2"]).once().await.unwrap();
    assert_eq!(lock.keys(), ["locks:{orders}:1", "locks:{orders}:2"]);
    lock.extend(Duration::from_secs(5)).await.unwrap();
    lock.release().await.unwrap();

    let err = rl.many(&["orders:1", "orders:2"]).once().await.unwrap_err();
    assert_eq!(err.kind(), ErrorKind::Unavailable, "{err}");
    assert!(
        matches!(err.nodes()[0].outcome(), NodeOutcome::Failed(why) if why.contains("same slot")),
        "{err:?}"
    );
}

/// Each released key is published, so a plain `lock()` waiting on one of them starts at once.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_release_wakes_a_waiter_on_any_of_its_resources() {
    let cluster = common::cluster(3);
    let patient =
        redlock::Retry::new().with_delay(Duration::from_secs(5)).with_jitter(Duration::ZERO);
    let rl = common::builder(&cluster, Duration::from_millis(200)).retry(patient).build().unwrap();
    let lock = rl.many(&SET).once().await.unwrap();
    let waiter = {
        let rl = rl.clone();
        tokio::spawn(async move { rl.lock("c").await })
    };
    // Once the waiter has failed and subscribed (a release before that is found by polling).
    assert!(
        common::eventually(Duration::from_secs(3), || common::subscribers(&cluster, "c")
            == [1, 1, 1])
        .await
    );
    assert!(!waiter.is_finished());
    lock.release().await.unwrap();
    let plain = tokio::time::timeout(Duration::from_secs(2), waiter).await.unwrap().unwrap();
    plain.unwrap().release().await.unwrap();
}
