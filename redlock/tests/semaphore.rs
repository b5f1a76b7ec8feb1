//! The counting lock: at most L holders at once, as L slot locks over the quorum; waiters
//! woken by the release of any slot; one count per resource.

mod common;

use std::collections::BTreeSet;
use std::time::{Duration, Instant};

use redlock::{ErrorKind, Permit, Retry};

const RESOURCE: &str = "exports";

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn l_holders_at_once_and_the_next_is_refused_as_not_acquired() {
    let cluster = common::cluster(3);
    let rl = common::client(&cluster);
    let mut permits = Vec::new();
    for _ in 0..3 {
        permits.push(rl.semaphore(RESOURCE, 3).once().await.unwrap());
    }
    let slots: BTreeSet<u32> = permits.iter().map(Permit::slot).collect();
    assert_eq!(slots, BTreeSet::from([0, 1, 2]), "each permit holds its own slot");
    for permit in &permits {
        assert!(permit.is_valid() && permit.validity() > Duration::from_secs(9));
        assert_eq!(permit.resource(), RESOURCE);
        assert_eq!(permit.permits(), 3);
        // Each slot is a plain lock key holding its token, on every node.
        let key = format!("{{{RESOURCE}}}:permit:{}", permit.slot());
        assert_eq!(permit.key(), key);
        assert!(
            common::eventually(Duration::from_secs(2), || {
                cluster.nodes_holding(&key, permit.token()).len() == 3
            })
            .await
        );
    }
    let err = rl.semaphore(RESOURCE, 3).once().await.unwrap_err();
    assert_eq!(err.kind(), ErrorKind::NotAcquired, "{err}");
    // Another client sees the same.
    let other = common::client(&cluster);
    let err = other.semaphore(RESOURCE, 3).once().await.unwrap_err();
    assert_eq!(err.kind(), ErrorKind::NotAcquired, "{err}");
    for permit in permits {
        permit.release().await.unwrap();
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_release_lets_exactly_one_more_in() {
    let cluster = common::cluster(3);
    let rl = common::client(&cluster);
    let first = rl.semaphore(RESOURCE, 2).once().await.unwrap();
    let second = rl.semaphore(RESOURCE, 2).once().await.unwrap();
    let freed = first.slot();
    first.release().await.unwrap();
    let third = rl.semaphore(RESOURCE, 2).once().await.unwrap();
    assert_eq!(third.slot(), freed, "the freed slot is the only one");
    let err = rl.semaphore(RESOURCE, 2).once().await.unwrap_err();
    assert_eq!(err.kind(), ErrorKind::NotAcquired, "{err}");
    second.release().await.unwrap();
    third.release().await.unwrap();
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_waiter_is_woken_by_the_release_of_any_slot() {
    let cluster = common::cluster(3);
    let rl = common::client(&cluster);
    // A pause far longer than the test: only a notification can wake the waiter in time.
    let slow = Retry::new()
        .with_delay(Duration::from_secs(30))
        .with_jitter(Duration::ZERO)
        .with_max_wait(Duration::from_secs(120));
    for round in 0..3 {
        let mut held = vec![
            rl.semaphore(RESOURCE, 3).once().await.unwrap(),
            rl.semaphore(RESOURCE, 3).once().await.unwrap(),
            rl.semaphore(RESOURCE, 3).once().await.unwrap(),
        ];
        held.sort_by_key(Permit::slot);
        let waiter = {
            let rl = rl.clone();
            tokio::spawn(async move { rl.semaphore(RESOURCE, 3).retry(slow).await })
        };
        // Let it fail its first attempt and subscribe.
        let key = format!("{{{RESOURCE}}}:permits");
        assert!(
            common::eventually(Duration::from_secs(10), || {
                common::subscribers(&cluster, &key).iter().all(|n| *n >= 1)
            })
            .await,
            "the waiter subscribed to the count key's channel"
        );
        // Each round frees another slot.
        let freed = held.remove(round);
        let slot = freed.slot();
        let released = Instant::now();
        freed.release().await.unwrap();
        let permit = tokio::time::timeout(Duration::from_secs(10), waiter)
            .await
            .expect("woken by the release, not by its 30 s pause")
            .unwrap()
            .unwrap();
        assert!(released.elapsed() < Duration::from_secs(10));
        assert_eq!(permit.slot(), slot);
        permit.release().await.unwrap();
        for permit in held {
            permit.release().await.unwrap();
        }
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn zero_permits_is_a_config_error() {
    let cluster = common::cluster(3);
    let rl = common::client(&cluster);
    let err = rl.semaphore(RESOURCE, 0).await.unwrap_err();
    assert_eq!(err.kind(), ErrorKind::Config, "{err}");
    assert_eq!(cluster.keys_everywhere("*").unwrap(), 0);
}
