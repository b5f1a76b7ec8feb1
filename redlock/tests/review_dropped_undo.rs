//! A request dropped before it went out must not let the next request of its claim on that
//! node overtake what it was itself waiting for: an undo never overtakes what it undoes,
//! even when the call in between (a release, an extension) was cancelled.

mod common;

use std::time::Duration;

use redlock_testkit::FaultyCluster;

/// Node 4's `SET` of a2 waits, unsent, behind a1's release there (itself behind a1's `SET`,
/// held by the proxy). a2's release is cancelled after its first poll (its request on
/// node 4 still waiting for a2's `SET`), and the lock is dropped: the release sent from
/// `Drop` must still go out after a2's `SET`, or that `SET` lands last and leaves a2's key
/// on node 4 for the whole lease.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_release_after_a_cancelled_one_waits_for_the_unsent_acquisition() {
    let faulty = FaultyCluster::start(5).unwrap();
    let cluster = faulty.cluster();
    let rl = common::builder_for(faulty.urls(), Duration::from_secs(2)).build().unwrap();
    rl.try_lock("warm").await.unwrap().release().await.unwrap();
    // No round can end within one poll.
    for i in 0..4 {
        faulty.proxy(i).set_fault(common::latency(5));
    }
    for round in 0..3 {
        let key = format!("k{round}");
        faulty.proxy(4).hold_requests_containing(b"NX", Duration::from_millis(400));
        let a1 = rl.try_lock(&key).await.unwrap();
        faulty.proxy(4).release_holds();
        // a1's release on node 4 is queued behind its held SET, in the background.
        a1.release().await.unwrap();
        // a2's SET on node 4 waits for a1's release there: granted by nodes 0-3.
        let a2 = rl.try_lock(&key).await.unwrap();
        let token = a2.token().to_string();
        let cancelled = tokio::time::timeout(Duration::ZERO, a2.release()).await;
        assert!(
            cancelled.is_err(),
            "round {round}: the release ended in its first poll: {cancelled:?}"
        );
        // Past the hold: a2's SET on node 4 has gone out by now, whatever the order.
        tokio::time::sleep(Duration::from_millis(800)).await;
        let clean = common::eventually(Duration::from_secs(3), || cluster.count_key(&key) == 0);
        assert!(
            clean.await,
            "round {round}: a2 ({token}) is left on nodes {:?}",
            cluster.nodes_holding(&key, &token)
        );
    }
}

/// The same with a cancelled extension in between: the release that follows waits for the
/// acquisition the extension was waiting for.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_release_after_a_cancelled_extension_waits_for_the_unsent_acquisition() {
    let faulty = FaultyCluster::start(5).unwrap();
    let cluster = faulty.cluster();
    let rl = common::builder_for(faulty.urls(), Duration::from_secs(2)).build().unwrap();
    rl.try_lock("warm").await.unwrap().release().await.unwrap();
    // No round can end within one poll.
    for i in 0..4 {
        faulty.proxy(i).set_fault(common::latency(5));
    }
    for round in 0..3 {
        let key = format!("e{round}");
        faulty.proxy(4).hold_requests_containing(b"NX", Duration::from_millis(400));
        let a1 = rl.try_lock(&key).await.unwrap();
        faulty.proxy(4).release_holds();
        a1.release().await.unwrap();
        let mut a2 = rl.try_lock(&key).await.unwrap();
        let token = a2.token().to_string();
        let extend = a2.extend(Duration::from_secs(10));
        let cancelled = tokio::time::timeout(Duration::ZERO, extend).await;
        assert!(
            cancelled.is_err(),
            "round {round}: the extension ended in its first poll: {cancelled:?}"
        );
        a2.release().await.unwrap();
        // Past the hold: a2's SET on node 4 has gone out by now, whatever the order.
        tokio::time::sleep(Duration::from_millis(800)).await;
        let clean = common::eventually(Duration::from_secs(3), || cluster.count_key(&key) == 0);
        assert!(
            clean.await,
            "round {round}: a2 ({token}) is left on nodes {:?}",
            cluster.nodes_holding(&key, &token)
        );
    }
}
