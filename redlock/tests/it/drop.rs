//! Dropping: a dropped lock is released in the background, with or without a runtime; a
//! dropped `lock()` future leaves nothing behind.

use crate::common;

use std::time::Duration;

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_dropped_lock_is_released_in_the_background() {
    let cluster = common::cluster(5);
    let rl = common::client(&cluster);
    let lock = rl.try_lock("k").await.unwrap();
    assert!(common::eventually(Duration::from_secs(1), || cluster.count_key("k") == 5).await);
    drop(lock);
    assert!(common::eventually(Duration::from_secs(1), || cluster.count_key("k") == 0).await);
}

#[tokio::test(flavor = "current_thread")]
async fn a_dropped_lock_is_released_on_a_current_thread_runtime_too() {
    let cluster = common::cluster(3);
    let rl = common::client(&cluster);
    let lock = rl.try_lock("k").await.unwrap();
    drop(lock);
    assert!(common::eventually(Duration::from_secs(1), || cluster.count_key("k") == 0).await);
}

#[test]
fn a_lock_dropped_outside_a_runtime_is_released_on_the_library_thread() {
    let cluster = common::cluster(3);
    let runtime = tokio::runtime::Builder::new_current_thread().enable_all().build().unwrap();
    let (rl, lock) = runtime.block_on(async {
        let rl = common::client(&cluster);
        let lock = rl.try_lock("k").ttl(Duration::from_secs(30)).await.unwrap();
        // Let every node answer before the runtime goes away.
        while cluster.count_key("k") < 3 {
            tokio::time::sleep(Duration::from_millis(5)).await;
        }
        (rl, lock)
    });
    // The runtime that made the connections is gone: the release must not depend on it.
    drop(runtime);
    drop(lock); // no runtime: no panic, no blocking; the library's own thread releases
    let deadline = std::time::Instant::now() + Duration::from_secs(5);
    while cluster.count_key("k") > 0 && std::time::Instant::now() < deadline {
        std::thread::sleep(Duration::from_millis(10));
    }
    assert_eq!(cluster.count_key("k"), 0, "released long before its 30 s lease");
    drop(rl);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_cancelled_lock_call_leaves_no_key() {
    let mut cluster = common::cluster(5);
    let rl = common::builder(&cluster, Duration::from_secs(2)).build().unwrap();
    common::warm(&rl).await;
    // With a majority hung the attempt is still in flight when we give up on it; its SETs
    // are queued on the hung nodes.
    for i in [0, 1, 2] {
        cluster.node_mut(i).pause().unwrap();
    }
    let attempt = tokio::time::timeout(Duration::from_millis(100), rl.lock("k")).await;
    assert!(attempt.is_err(), "the attempt should still have been running");
    for i in [0, 1, 2] {
        cluster.node_mut(i).resume().unwrap();
    }
    assert!(
        common::eventually(Duration::from_secs(2), || cluster.count_key("k") == 0).await,
        "a cancelled lock() left a key behind"
    );
    // And the resource is free.
    rl.try_lock("k").await.unwrap().release().await.unwrap();
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_lock_moves_into_a_spawned_task() {
    let cluster = common::cluster(3);
    let rl = common::client(&cluster);
    let lock = rl.try_lock("k").await.unwrap();
    let token = tokio::spawn(async move {
        let token = lock.token().to_owned();
        lock.release().await.unwrap();
        token
    })
    .await
    .unwrap();
    // release() returns once a quorum released; the last node follows in the background.
    let released = || cluster.nodes_holding("k", &token).is_empty();
    assert!(common::eventually(Duration::from_secs(2), released).await);
}

/// A synchronous wrapper keeps a current-thread runtime and enters it with `block_on` per
/// call; between calls nothing runs on it. A lock dropped at the end of a call (the usual
/// scope guard) is still released at once, not at the wrapper's next call or its lease's
/// end.
#[test]
fn a_lock_dropped_in_a_sync_wrappers_idle_runtime_is_released_at_once() {
    let cluster = common::cluster(3);
    let rl = common::client(&cluster);
    let runtime = tokio::runtime::Builder::new_current_thread().enable_all().build().unwrap();
    runtime.block_on(async {
        let _lock = rl.try_lock("k").ttl(Duration::from_secs(30)).await.unwrap();
        // Every node answered before the scope ends.
        while cluster.count_key("k") < 3 {
            tokio::time::sleep(Duration::from_millis(5)).await;
        }
    });
    // The runtime now sits idle, as a wrapper's does between calls.
    let deadline = std::time::Instant::now() + Duration::from_secs(5);
    while cluster.count_key("k") > 0 && std::time::Instant::now() < deadline {
        std::thread::sleep(Duration::from_millis(10));
    }
    assert_eq!(cluster.count_key("k"), 0, "left on the nodes while the runtime sits idle");
    drop(runtime);
}

/// A lock dropped on a multi-thread runtime whose workers then all block (synchronous work
/// in async code) is released anyway: its release does not wait for those workers.
#[test]
fn a_lock_dropped_before_its_runtimes_workers_all_block_is_released_at_once() {
    let cluster = common::cluster(3);
    let rl = common::client(&cluster);
    let runtime = common::runtimes::multi_thread(1);
    runtime.block_on(async {
        let lock = rl.try_lock("k").ttl(Duration::from_secs(30)).await.unwrap();
        while cluster.count_key("k") < 3 {
            tokio::time::sleep(Duration::from_millis(5)).await;
        }
        let blocked = tokio::spawn(async move {
            drop(lock);
            // The only worker is busy for a while right after the drop.
            std::thread::sleep(Duration::from_secs(6));
        });
        let deadline = std::time::Instant::now() + Duration::from_secs(5);
        let left = tokio::task::spawn_blocking({
            let urls = cluster.urls();
            move || {
                let count = |urls: &[String]| {
                    urls.iter()
                        .filter(|url| {
                            let client = redis::Client::open(url.as_str()).unwrap();
                            let mut con = client.get_connection().unwrap();
                            redis::cmd("EXISTS").arg("k").query::<bool>(&mut con).unwrap()
                        })
                        .count()
                };
                while count(&urls) > 0 && std::time::Instant::now() < deadline {
                    std::thread::sleep(Duration::from_millis(10));
                }
                count(&urls)
            }
        });
        let left = left.await.unwrap();
        blocked.await.unwrap();
        assert_eq!(left, 0, "left on the nodes while the runtime's workers were blocked");
    });
}

/// A lock granted before a shutdown is the caller's to release as usual: dropped after the
/// shutdown returned, it is still released at once, not left for its lease.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_lock_dropped_after_shutdown_is_still_released() {
    let cluster = common::cluster(3);
    let rl = common::client(&cluster);
    let lock = rl.try_lock("k").ttl(Duration::from_secs(30)).await.unwrap();
    assert!(common::eventually(Duration::from_secs(2), || cluster.count_key("k") == 3).await);
    rl.shutdown(Duration::from_secs(2)).await.unwrap();
    drop(lock);
    let gone = common::eventually(Duration::from_secs(5), || cluster.count_key("k") == 0).await;
    assert!(gone, "released long before its 30 s lease: {} nodes keep it", cluster.count_key("k"));
}

/// A lock dropped right after a cancelled extension (held back by every node's proxy) is
/// released on the client's own connection, which overtakes the extension: the extension
/// that lands after the release is refused by its tombstone and sets nothing again.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn an_extension_in_flight_when_its_lock_drops_leaves_no_key() {
    let faulty = redlock_testkit::FaultyCluster::start(3).unwrap();
    let cluster = faulty.cluster();
    let rl = common::builder_for(faulty.urls(), Duration::from_secs(1)).build().unwrap();
    common::warm(&rl).await;
    let mut lock = rl.try_lock("k").await.unwrap();
    for i in 0..3 {
        let extend = common::plain_extensions();
        faulty.proxy(i).hold_requests_containing_any(&extend, Duration::from_millis(600));
    }
    let extension =
        tokio::time::timeout(Duration::from_millis(100), lock.extend(Duration::from_secs(30)));
    assert!(extension.await.is_err(), "the extension is still on its way");
    drop(lock);
    // The release goes behind the extension, on its connection: once both ran, no key.
    tokio::time::sleep(Duration::from_millis(700)).await;
    assert!(common::eventually(Duration::from_secs(1), || cluster.count_key("k") == 0).await);
    tokio::time::sleep(Duration::from_millis(300)).await;
    assert_eq!(cluster.count_key("k"), 0, "the late extension set the key again");
}
