//! Acquisition: quorum, tokens, foreign owners, interoperability with plain SET NX PX.

use crate::common;

use std::time::Duration;

use redlock::{ErrorKind, NodeOutcome};

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_lock_is_the_token_on_every_node() {
    let cluster = common::cluster(5);
    let rl = common::client(&cluster);
    let lock = rl.try_lock("orders:42").await.unwrap();
    assert_eq!(lock.resource(), "orders:42");
    assert!(lock.token().len() * 4 >= 128, "token has at least 128 bits");
    assert!(lock.validity() > Duration::from_secs(9) && lock.validity() < Duration::from_secs(10));
    // Nodes that had not answered at the decision still get the SET shortly after.
    assert!(
        common::eventually(Duration::from_secs(2), || cluster
            .nodes_holding("orders:42", lock.token())
            .len()
            == 5)
        .await
    );
    let pttl = cluster.node(0).pttl("orders:42").unwrap();
    assert!(pttl > 9_000 && pttl <= 10_000, "PX is the lease: {pttl}");

    let token = lock.token().to_owned();
    lock.release().await.unwrap();
    // Released at the quorum; the last nodes follow in the background.
    let gone = || cluster.count_key("orders:42") == 0;
    assert!(common::eventually(Duration::from_secs(1), gone).await);
    assert!(cluster.nodes_holding("orders:42", &token).is_empty());
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn each_attempt_gets_a_fresh_token() {
    let cluster = common::cluster(3);
    let rl = common::client(&cluster);
    let first = rl.try_lock("fresh").await.unwrap();
    let first_token = first.token().to_owned();
    first.release().await.unwrap();
    let second = rl.try_lock("fresh").await.unwrap();
    assert_ne!(first_token, second.token());
    second.release().await.unwrap();
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_second_client_is_refused_while_the_lock_is_held() {
    let cluster = common::cluster(5);
    let a = common::client(&cluster);
    let b = common::client(&cluster);
    let lock = a.try_lock("job").await.unwrap();
    // Every node first: a's slowest SET must not race b's attempt below.
    assert!(
        common::eventually(Duration::from_secs(1), || cluster
            .nodes_holding("job", lock.token())
            .len()
            == 5)
        .await
    );
    let err = b.try_lock("job").await.unwrap_err();
    assert_eq!(err.kind(), ErrorKind::NotAcquired, "{err}");
    assert!(err.held_by_others() >= 3, "{err}");
    // The refused attempt left the holder's keys alone.
    assert!(
        common::eventually(Duration::from_secs(1), || cluster
            .nodes_holding("job", lock.token())
            .len()
            == 5)
        .await
    );
    lock.release().await.unwrap();
    b.try_lock("job").await.unwrap().release().await.unwrap();
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_foreign_owner_on_a_minority_does_not_block_and_keeps_its_keys() {
    let cluster = common::cluster(5);
    for i in [0, 1] {
        cluster.node(i).set("shared", "foreign").unwrap();
    }
    let rl = common::client(&cluster);
    let lock = rl.try_lock("shared").await.unwrap();
    assert_eq!(cluster.nodes_holding("shared", "foreign"), vec![0, 1]);
    assert!(
        common::eventually(Duration::from_secs(1), || cluster
            .nodes_holding("shared", lock.token())
            == vec![2, 3, 4])
        .await
    );
    lock.release().await.unwrap();
    assert_eq!(
        cluster.nodes_holding("shared", "foreign"),
        vec![0, 1],
        "release never deletes another owner's key"
    );
    assert_eq!(cluster.count_key("shared"), 2);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_foreign_owner_on_a_majority_wins_and_our_partial_keys_are_removed() {
    let cluster = common::cluster(5);
    for i in [0, 2, 4] {
        cluster.node(i).set("contended", "foreign").unwrap();
    }
    let rl = common::client(&cluster);
    let err = rl.try_lock("contended").await.unwrap_err();
    assert_eq!(err.kind(), ErrorKind::NotAcquired, "{err}");
    assert_eq!(err.held_by_others(), 3, "{err}");
    assert_eq!(err.quorum(), Some(3));
    assert_eq!(cluster.nodes_holding("contended", "foreign"), vec![0, 2, 4]);
    assert!(
        common::eventually(Duration::from_secs(1), || cluster.count_key("contended") == 3).await,
        "the failed attempt's keys on nodes 1 and 3 are gone"
    );
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_seed_protocol_interoperates() {
    let cluster = common::cluster(3);
    let rl = common::client(&cluster);
    // Another client speaking plain SET NX PX blocks us...
    for node in cluster.nodes() {
        let mut con = node.connection().unwrap();
        let set: Option<String> = redis::cmd("SET")
            .arg("seed")
            .arg("other")
            .arg("NX")
            .arg("PX")
            .arg(10_000)
            .query(&mut con)
            .unwrap();
        assert_eq!(set.as_deref(), Some("OK"));
    }
    assert_eq!(rl.try_lock("seed").await.unwrap_err().kind(), ErrorKind::NotAcquired);
    for node in cluster.nodes() {
        node.flushall().unwrap();
    }
    // ...and its compare-and-delete releases ours.
    let lock = rl.try_lock("seed").await.unwrap();
    assert!(
        common::eventually(Duration::from_secs(1), || cluster
            .nodes_holding("seed", lock.token())
            .len()
            == 3)
        .await
    );
    for node in cluster.nodes() {
        let mut con = node.connection().unwrap();
        let deleted: i64 = redis::Script::new("if redis.call('GET', KEYS[1]) == ARGV[1] then return redis.call('DEL', KEYS[1]) else return 0 end")
            .key("seed")
            .arg(lock.token())
            .invoke(&mut con)
            .unwrap();
        assert_eq!(deleted, 1);
    }
    assert_eq!(lock.release().await.unwrap_err().kind(), ErrorKind::NotHeld);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_key_of_another_type_is_an_error_and_is_left_alone() {
    let cluster = common::cluster(3);
    for node in cluster.nodes() {
        let mut con = node.connection().unwrap();
        let _: i64 = redis::cmd("RPUSH").arg("queue").arg("item").query(&mut con).unwrap();
    }
    let rl = common::client(&cluster);
    let err = rl.try_lock("queue").await.unwrap_err();
    assert_eq!(err.kind(), ErrorKind::WrongType, "{err}");
    assert!(err.nodes().iter().any(|n| *n.outcome() == NodeOutcome::WrongType));
    assert!(!err.is_retryable());
    for node in cluster.nodes() {
        let mut con = node.connection().unwrap();
        let len: i64 = redis::cmd("LLEN").arg("queue").query(&mut con).unwrap();
        assert_eq!(len, 1);
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn an_empty_resource_name_is_a_config_error() {
    let cluster = common::cluster(1);
    let rl = common::client(&cluster);
    assert_eq!(rl.try_lock("").await.unwrap_err().kind(), ErrorKind::Config);
    assert_eq!(rl.lock("").await.unwrap_err().kind(), ErrorKind::Config);
    assert_eq!(rl.try_lock("x").ttl(Duration::ZERO).await.unwrap_err().kind(), ErrorKind::Config);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_key_prefix_is_put_before_the_resource() {
    let cluster = common::cluster(3);
    let rl =
        common::builder(&cluster, Duration::from_millis(200)).key_prefix("locks:").build().unwrap();
    let lock = rl.try_lock("orders:1").await.unwrap();
    assert_eq!(lock.resource(), "orders:1");
    assert_eq!(lock.key(), "locks:orders:1");
    assert!(
        common::eventually(Duration::from_secs(1), || cluster
            .nodes_holding("locks:orders:1", lock.token())
            .len()
            == 3)
        .await
    );
    lock.release().await.unwrap();
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn even_node_counts_need_more_than_half() {
    let cluster = common::cluster(4);
    for i in [0, 1] {
        cluster.node(i).set("even", "foreign").unwrap();
    }
    let rl = common::client(&cluster);
    assert_eq!(rl.quorum(), 3);
    let err = rl.try_lock("even").await.unwrap_err();
    assert_eq!(err.kind(), ErrorKind::NotAcquired, "two of four is not a quorum: {err}");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_split_vote_is_told_apart_from_a_holder_of_a_quorum() {
    let cluster = common::cluster(3);
    let rl = common::client(&cluster);
    common::warm(&rl).await;
    // Two other owners, one node each: nobody holds the lock.
    common::run(&cluster, 1, &["SET", "job", "owner-b", "PX", "10000"]);
    common::run(&cluster, 2, &["SET", "job", "owner-c", "PX", "10000"]);
    // The round is decided at the second refusal; a third answer that comes later than the
    // round waits for (a loaded machine) leaves that node's holder unknown, which could
    // make a quorum with either refusal: only an attempt that heard every node can tell.
    let heard_all = |err: &redlock::Error| {
        err.nodes().iter().filter_map(|n| n.holder()).count() == 2
            && err.nodes().iter().all(|n| *n.outcome() != NodeOutcome::Pending)
    };
    let mut err = rl.try_lock("job").await.unwrap_err();
    for _ in 0..20 {
        if heard_all(&err) {
            break;
        }
        err = rl.try_lock("job").await.unwrap_err();
    }
    let holders: Vec<_> = err.nodes().iter().filter_map(|n| n.holder()).collect();
    assert_eq!(holders.len(), 2, "{holders:?}");
    assert_eq!(err.kind(), ErrorKind::NotAcquired);
    assert!(err.is_split_vote(), "{err}");
    assert!(err.to_string().contains("split vote"), "{err}");
    assert!(!err.to_string().contains("held by another owner:"), "{err}");
    // One other owner on two of three nodes holds the lock.
    common::run(&cluster, 2, &["SET", "job", "owner-b", "PX", "10000"]);
    let err = rl.try_lock("job").await.unwrap_err();
    assert_eq!(err.kind(), ErrorKind::NotAcquired);
    assert!(!err.is_split_vote(), "{err}");
    assert!(err.to_string().contains("held by another owner"), "{err}");
}

/// A 10 MB resource name is refused before anything is sent, for every kind, with a short
/// message that does not repeat it.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn an_oversized_resource_name_is_refused_as_configuration_with_a_short_message() {
    let cluster = common::cluster(3);
    let rl = common::client(&cluster);
    let name = "x".repeat(10 << 20);
    let errors = [
        rl.try_lock(&name).await.unwrap_err(),
        rl.lock(&name).await.unwrap_err(),
        rl.many(&["a", &name]).await.unwrap_err(),
        rl.read(&name).await.unwrap_err(),
        rl.reentrant(&name, "owner").await.unwrap_err(),
        rl.semaphore(&name, 2).await.unwrap_err(),
    ];
    for err in errors {
        assert_eq!(err.kind(), ErrorKind::Config, "{}", &err.to_string()[..200]);
        let text = err.to_string();
        assert!(text.len() < 300, "{} bytes", text.len());
        assert!(text.contains("10485760 bytes long") && text.contains("at most 4096"), "{text}");
    }
    // The bound itself is accepted.
    rl.try_lock(&"y".repeat(4096)).await.unwrap().release().await.unwrap();
    assert_eq!(cluster.keys_everywhere("*").unwrap(), 0);
}
