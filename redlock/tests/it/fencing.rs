//! Fencing tokens: strictly increasing across clients and node restarts, also for rounds
//! decided before a slow node answered, and a stale holder's write rejected by the fenced
//! resource.

use crate::common;

use std::sync::{Arc, Mutex};
use std::time::Duration;

use redlock::fence::{FencedWrite, fenced_set};
use redlock::{ErrorKind, Redlock, Retry};
use redlock_testkit::{Cluster, NodeConfig, Persistence, RedisNode};

fn contender(cluster_urls: Vec<String>) -> Redlock {
    Redlock::builder()
        .nodes(cluster_urls)
        .ttl(Duration::from_secs(2))
        .node_timeout(Duration::from_millis(100))
        .retry(
            Retry::new()
                .with_unbounded_attempts()
                .with_delay(Duration::from_millis(1))
                .with_jitter(Duration::from_millis(5))
                .with_max_wait(Duration::from_secs(30)),
        )
        .build()
        .unwrap()
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn tokens_strictly_increase_across_clients_while_a_minority_restarts() {
    let cluster =
        Cluster::start_with(5, NodeConfig::new().persistence(Persistence::AppendFsyncAlways))
            .unwrap();
    let urls = cluster.urls();
    let cluster = Arc::new(Mutex::new(cluster));
    const CLIENTS: usize = 4;
    const GRANTS: usize = 500;
    // Tokens in grant order: pushed inside the critical section, so the order of the
    // pushes is the order of the grants.
    let tokens = Arc::new(Mutex::new(Vec::new()));
    let clients: Vec<_> = (0..CLIENTS)
        .map(|_| {
            let (rl, tokens) = (contender(urls.clone()), tokens.clone());
            tokio::spawn(async move {
                for _ in 0..GRANTS {
                    let lock = rl.lock("fenced").fenced().await.unwrap();
                    tokens.lock().unwrap().push(lock.fencing_token().unwrap());
                    // With a node restarting and others holding a failed attempt's partial
                    // keys, a release may not confirm a quorum: that is reported, and the
                    // keys expire; the lock itself was held.
                    if let Err(err) = lock.release().await {
                        assert_eq!(err.kind(), redlock::ErrorKind::Unavailable, "{err}");
                    }
                }
            })
        })
        .collect();
    // Meanwhile, one node at a time (a minority) is killed and restarted with its data.
    let restarts = {
        let cluster = cluster.clone();
        tokio::task::spawn_blocking(move || {
            for round in 0..6 {
                std::thread::sleep(Duration::from_millis(150));
                cluster.lock().unwrap().node_mut(round % 5).restart().unwrap();
            }
        })
    };
    for client in clients {
        client.await.unwrap();
    }
    restarts.await.unwrap();
    let tokens = tokens.lock().unwrap();
    assert_eq!(tokens.len(), CLIENTS * GRANTS);
    for pair in tokens.windows(2) {
        assert!(pair[0] < pair[1], "fencing tokens went {} then {}", pair[0], pair[1]);
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_holder_paused_past_its_lease_has_its_late_write_rejected() {
    let cluster = common::cluster(3);
    let store = RedisNode::start().unwrap();
    let mut store_con =
        redis::Client::open(store.url()).unwrap().get_multiplexed_async_connection().await.unwrap();
    let rl = common::builder(&cluster, Duration::from_millis(100))
        .ttl(Duration::from_millis(200))
        .build()
        .unwrap();

    let stalled = rl.try_lock("invoice").fenced().await.unwrap();
    let stale_token = stalled.fencing_token().unwrap();
    // The holder stalls (a GC pause) past its lease; another client takes the lock and writes.
    tokio::time::sleep(Duration::from_millis(300)).await;
    assert!(!stalled.is_valid());
    let fresh = rl.try_lock("invoice").fenced().await.unwrap();
    let fresh_token = fresh.fencing_token().unwrap();
    assert!(fresh_token > stale_token);
    assert_eq!(
        fenced_set(&mut store_con, "invoice:status", b"refunded", fresh_token).await.unwrap(),
        FencedWrite::Written
    );
    // The stalled holder wakes up and writes as if it still held the lock: rejected.
    assert_eq!(
        fenced_set(&mut store_con, "invoice:status", b"paid", stale_token).await.unwrap(),
        FencedWrite::Rejected
    );
    assert_eq!(store.get("invoice:status").unwrap().as_deref(), Some("refunded"));
    // The same holder may write again under one token.
    assert_eq!(
        fenced_set(&mut store_con, "invoice:status", b"closed", fresh_token).await.unwrap(),
        FencedWrite::Written
    );
    assert_eq!(stalled.release().await.unwrap_err().kind(), ErrorKind::NotHeld);
    fresh.release().await.unwrap();
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_plain_lock_has_no_fencing_token_and_costs_no_counter() {
    let cluster = common::cluster(3);
    let rl = common::client(&cluster);
    let lock = rl.try_lock("plain").await.unwrap();
    assert_eq!(lock.fencing_token(), None);
    lock.release().await.unwrap();
    assert_eq!(cluster.count_key("redlock:fence:plain"), 0);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_counter_is_raised_on_a_quorum_before_the_token_is_handed_out() {
    let cluster = common::cluster(5);
    // Nodes disagree: a later grant by nodes 2-4 must still see a larger counter than a
    // token that came from nodes 0-2.
    for (i, value) in [(0, "100"), (1, "5"), (2, "5"), (3, "5"), (4, "5")] {
        cluster.node(i).set("redlock:fence:k", value).unwrap();
    }
    let rl = common::client(&cluster);
    let first = rl.try_lock("k").fenced().await.unwrap();
    let token = first.fencing_token().unwrap();
    assert!(token >= 6);
    first.release().await.unwrap();
    // Whatever quorum the next grant gets, it overlaps the raised quorum.
    let second = rl.try_lock("k").fenced().await.unwrap();
    assert!(second.fencing_token().unwrap() > token);
    let raised = (0..5)
        .filter(|&i| {
            cluster.node(i).get("redlock:fence:k").unwrap().unwrap().parse::<u64>().unwrap()
                >= token
        })
        .count();
    assert!(raised >= 3, "the counter was raised on a quorum");
    second.release().await.unwrap();
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_counter_of_another_type_fails_the_grant_and_leaves_no_key() {
    let cluster = common::cluster(3);
    let rl = common::client(&cluster);
    for i in 0..3 {
        common::run(&cluster, i, &["HSET", "redlock:fence:k", "f", "v"]);
    }
    let err = rl.try_lock("k").fenced().await.unwrap_err();
    assert_eq!(err.kind(), ErrorKind::WrongType, "{err}");
    assert!(common::eventually(Duration::from_secs(1), || cluster.count_key("k") == 0).await);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn no_resource_name_reaches_a_fencing_counter() {
    let cluster = common::cluster(3);
    let rl = common::client(&cluster);
    let counter = "redlock:fence:k";
    let err = rl.try_lock(counter).await.unwrap_err();
    assert_eq!(err.kind(), ErrorKind::Config);
    // A resource whose name ends like the old counter key is just another resource.
    rl.try_lock("k:fence").await.unwrap().release().await.unwrap();
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn fenced_writes_compare_tokens_beyond_two_to_the_53() {
    let store = RedisNode::start().unwrap();
    let mut con = store.client().unwrap().get_multiplexed_async_connection().await.unwrap();
    // 2^53 + 1 and 2^53 are the same Lua double; as numbers they differ.
    let high = (1u64 << 53) + 1;
    assert_eq!(fenced_set(&mut con, "v", b"new", high).await.unwrap(), FencedWrite::Written);
    assert_eq!(fenced_set(&mut con, "v", b"old", high - 1).await.unwrap(), FencedWrite::Rejected);
    assert_eq!(fenced_set(&mut con, "v", b"max", u64::MAX).await.unwrap(), FencedWrite::Written);
    assert_eq!(store.get("v").unwrap().as_deref(), Some("max"));
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_value_key_and_its_braced_form_keep_separate_tokens() {
    let node = RedisNode::start().unwrap();
    let mut con = node.client().unwrap().get_multiplexed_async_connection().await.unwrap();
    // The holder of `a` is far ahead of the holder of `{a}`: neither rejects the other.
    assert_eq!(fenced_set(&mut con, "a", b"x", 500).await.unwrap(), FencedWrite::Written);
    assert_eq!(fenced_set(&mut con, "{a}", b"y", 1).await.unwrap(), FencedWrite::Written);
    assert_eq!(fenced_set(&mut con, "{a}", b"z", 1).await.unwrap(), FencedWrite::Written);
    assert_eq!(fenced_set(&mut con, "a", b"w", 499).await.unwrap(), FencedWrite::Rejected);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_token_store_is_refused_as_a_value_key_and_left_alone() {
    let node = RedisNode::start().unwrap();
    let mut con = node.client().unwrap().get_multiplexed_async_connection().await.unwrap();
    assert_eq!(fenced_set(&mut con, "a", b"x", 7).await.unwrap(), FencedWrite::Written);
    for store in [redlock::fence::token_key("a"), redlock::fence::token_key("{a}")] {
        let err = fenced_set(&mut con, &store, b"junk", 9).await.unwrap_err();
        assert_eq!(err.kind(), redis::ErrorKind::InvalidClientConfig, "{store}: {err}");
    }
    assert_eq!(node.get(&redlock::fence::token_key("a")).unwrap().as_deref(), Some("7"));
}

/// Rounds decided before every node answered: fenced acquisitions and `check_held` checks
/// while node 4 answers 300 ms late each time, so its answers arrive after their rounds
/// were decided. Tokens must grow strictly, every check must say held, and no two grants
/// overlap.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn fenced_rounds_and_checks_decided_without_a_slow_node_count_right() {
    let (faulty, rl) = common::five_slowed_nodes(Duration::from_secs(1)).await;
    faulty.proxy(4).set_fault(common::latency(150));
    let mut last = 0;
    for round in 0..4 {
        let lock = rl.try_lock("fenced").fenced().await.unwrap();
        let token = lock.fencing_token().unwrap();
        assert!(token > last, "round {round}: token {token} after {last}");
        last = token;
        assert!(lock.check_held().await.unwrap(), "round {round}");
        let err = rl.try_lock("fenced").await.unwrap_err();
        assert_eq!(err.kind(), redlock::ErrorKind::NotAcquired, "round {round}: {err}");
        lock.release().await.unwrap();
    }
    faulty.proxy(4).heal();
}
