//! With a key prefix and a long owner label: every kind's release wakes the waiters
//! subscribed to its key's channel (the channel a release publishes to is written in place
//! into the script's arguments), names stay unprefixed and keys prefixed; and a plain lock
//! of either key of a multi lock waits for the multi's undo on a slow node, after a release
//! or a hand-over from a runtime that ended.

use crate::common;

use std::time::{Duration, Instant};

use redlock::{Redlock, Retry};
use redlock_testkit::Cluster;

const PREFIX: &str = "pfx:";

fn label() -> String {
    "L".repeat(64)
}

fn holder(cluster: &Cluster) -> Redlock {
    common::builder(cluster, Duration::from_millis(300))
        .key_prefix(PREFIX)
        .owner_label(label())
        .build()
        .unwrap()
}

/// Polls only every five seconds: a grant sooner than that came from a notification.
fn patient(cluster: &Cluster, max_wait: Duration) -> Redlock {
    common::builder(cluster, Duration::from_millis(300))
        .key_prefix(PREFIX)
        .owner_label(label())
        .retry(
            Retry::new()
                .with_unbounded_attempts()
                .with_delay(Duration::from_secs(5))
                .with_jitter(Duration::ZERO)
                .with_max_wait(max_wait),
        )
        .build()
        .unwrap()
}

async fn subscribed(cluster: &Cluster, resource: &str) {
    let key = format!("{PREFIX}{resource}");
    let every = || common::subscribers(cluster, &key).iter().all(|&n| n >= 1);
    assert!(
        common::eventually(Duration::from_secs(2), every).await,
        "waiter not subscribed to redlock:released:{key}: {:?}",
        common::subscribers(cluster, &key)
    );
}

async fn woken<T: Send + 'static>(
    what: &str,
    waiter: tokio::task::JoinHandle<T>,
    release: impl std::future::Future<Output = ()>,
) -> T {
    release.await;
    let released = Instant::now();
    let out = tokio::time::timeout(Duration::from_secs(4), waiter)
        .await
        .unwrap_or_else(|_| panic!("{what}: waiter not woken by the release notification"))
        .unwrap();
    assert!(released.elapsed() < Duration::from_secs(2), "{what}: {:?}", released.elapsed());
    out
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn every_kind_wakes_its_waiters_on_the_prefixed_channel() {
    let cluster = common::cluster(3);
    let a = holder(&cluster);
    let b = patient(&cluster, Duration::from_secs(20));

    let l = a.try_lock("p").await.unwrap();
    assert_eq!((l.resource(), l.key()), ("p", "pfx:p"));
    assert_eq!(l.token().len(), 40 + 1 + 64);
    assert!(l.token().ends_with(&format!(".{}", label())));
    // Granted at two nodes: the third's SET may still be on its way.
    let everywhere = || cluster.nodes_holding("pfx:p", l.token()) == [0, 1, 2];
    assert!(common::eventually(Duration::from_secs(1), everywhere).await);
    assert_eq!(cluster.count_key("p"), 0);
    let err = a.try_lock("p").await.unwrap_err();
    assert_eq!(err.resource(), Some("p"), "{err}");
    let w = tokio::spawn({
        let b = b.clone();
        async move {
            let l = b.lock("p").await.unwrap();
            assert_eq!((l.resource(), l.key()), ("p", "pfx:p"));
            l.release().await.unwrap();
        }
    });
    subscribed(&cluster, "p").await;
    woken("plain", w, async { l.release().await.unwrap() }).await;

    let h = a.reentrant("r", "o1").await.unwrap();
    assert_eq!((h.resource(), h.key()), ("r", "pfx:r"));
    assert!(h.field().contains(h.token()));
    let w = tokio::spawn({
        let b = b.clone();
        async move { b.reentrant("r", "o2").await.unwrap().release().await.unwrap() }
    });
    subscribed(&cluster, "r").await;
    woken("reentrant", w, async { h.release().await.unwrap() }).await;

    let wl = a.write("rw1").await.unwrap();
    assert_eq!((wl.resource(), wl.key()), ("rw1", "pfx:rw1"));
    let w = tokio::spawn({
        let b = b.clone();
        async move { b.read("rw1").await.unwrap().release().await.unwrap() }
    });
    subscribed(&cluster, "rw1").await;
    woken("write then read", w, async { wl.release().await.unwrap() }).await;

    let rl = a.read("rw2").await.unwrap();
    let w = tokio::spawn({
        let b = b.clone();
        async move { b.write("rw2").await.unwrap().release().await.unwrap() }
    });
    subscribed(&cluster, "rw2").await;
    woken("read then write", w, async { rl.release().await.unwrap() }).await;

    let m = a.many(&["m1", "m2"]).await.unwrap();
    assert_eq!(m.keys(), vec!["pfx:m1", "pfx:m2"]);
    assert_eq!(cluster.nodes_holding("pfx:m2", m.token()), vec![0, 1, 2]);
    let w = tokio::spawn({
        let b = b.clone();
        async move { b.lock("m2").await.unwrap().release().await.unwrap() }
    });
    subscribed(&cluster, "m2").await;
    woken("multi then plain on its second key", w, async { m.release().await.unwrap() }).await;

    let m = a.many(&["m1", "m2"]).await.unwrap();
    let w = tokio::spawn({
        let b = b.clone();
        async move { b.many(&["m1", "m2"]).await.unwrap().release().await.unwrap() }
    });
    subscribed(&cluster, "m1").await;
    woken("multi then multi", w, async { m.release().await.unwrap() }).await;

    for k in ["p", "r", "rw1", "rw2", "m1", "m2"] {
        assert_eq!(cluster.count_key(k), 0, "{k}");
        let prefixed = format!("{PREFIX}{k}");
        let gone = || cluster.count_key(&prefixed) == 0;
        assert!(common::eventually(Duration::from_secs(2), gone).await, "{prefixed} left");
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_plain_lock_of_a_multis_key_waits_for_the_multis_undo_on_a_slow_node() {
    let (faulty, rl) = common::five_slowed_nodes(Duration::from_secs(2)).await;
    let cluster = faulty.cluster();
    for round in 0..6 {
        let (k1, k2) = (format!("qq{round}x"), format!("zz{round}y"));
        let (target, needle) =
            if round % 2 == 0 { (k2.clone(), k1.clone()) } else { (k1.clone(), k2.clone()) };
        // The multi's acquisition lands late on node 4: its undo there queues behind it.
        faulty.proxy(4).hold_requests_containing(needle.as_bytes(), Duration::from_millis(600));
        let m = rl.many(&[k1.as_str(), k2.as_str()]).once().await.unwrap();
        faulty.proxy(4).release_holds();
        if round < 4 {
            m.release().await.unwrap();
        } else {
            let token = m.token().to_owned();
            common::on_short_runtime(async move { drop(m) });
            // Released in the background: gone from a quorum before the next lock.
            let released = || cluster.nodes_holding(&target, &token).len() <= 1;
            assert!(common::eventually(Duration::from_secs(2), released).await);
        }
        let l = rl.try_lock(&target).await.unwrap();
        tokio::time::sleep(Duration::from_millis(1200)).await;
        assert_eq!(
            cluster.nodes_holding(&target, l.token()),
            vec![0, 1, 2, 3, 4],
            "round {round}: a plain lock of {target} refused on node 4 by the multi's own key"
        );
        l.release().await.unwrap();
        let gone = || cluster.count_key(&k1) == 0 && cluster.count_key(&k2) == 0;
        assert!(common::eventually(Duration::from_secs(2), gone).await, "round {round}: keys left");
    }
}
