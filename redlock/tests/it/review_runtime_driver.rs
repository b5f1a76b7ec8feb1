//! Review (second round): the connection's driver lived on the runtime of the caller that opened it
//! (`Node::connect` spawns the connect, and with it redis-rs's driver task, on the caller's
//! runtime when there is one). The review fixed clean-ups and extenders to run on the
//! client's own thread, and tested it with connections opened by a long-lived runtime.
//! Here a short-lived runtime (a sync wrapper's per-call runtime) is the first user, so it
//! owns the connections' drivers.
//!
//! Fixed by opening every connection on the client's own thread, where its driver then
//! lives (`node.rs`); the first three tests failed before that fix.

use crate::common;

use std::time::Duration;

// Found by the review (failed every run before the fix): a refused attempt from a short-lived runtime that OPENED the connections leaves
// its key. Interleaving (3 nodes, node timeout 200 ms, no network fault at all):
// 1. A helper thread's current-thread runtime is the client's first user: it opens the
//    connections (their drivers run on that runtime).
// 2. "k" is held by a foreign owner on nodes 0 and 1; node 2 is paused (500 ms).
// 3. The helper's try_lock("k") is refused by nodes 0 and 1 (NotAcquired); its SET is in
//    node 2's socket buffer; the clean-up (on the client's own thread) waits behind it.
// 4. The helper runtime ends: the connection drivers die with it, node 2's socket closes.
// 5. The clean-up's send fails (driver gone), is re-sent on a new connection whose connect
//    hangs on the paused node, times out, and is dropped: never retried.
// 6. Node 2 wakes up and runs the SET: the key stays for its whole 10 s lease.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_refused_attempt_from_a_runtime_that_opened_the_connections_leaves_no_key() {
    let mut cluster = common::cluster(3);
    let rl = common::client(&cluster);
    let warm = {
        let rl = rl.clone();
        std::thread::spawn(move || {
            let runtime =
                tokio::runtime::Builder::new_current_thread().enable_all().build().unwrap();
            runtime.block_on(async move {
                rl.try_lock("warm-up").await.unwrap().release().await.unwrap();
            });
            runtime
        })
    };
    // Keep the helper runtime (and the drivers on it) alive until the attempt.
    let runtime = warm.join().unwrap();
    for i in [0, 1] {
        cluster.node(i).set("k", "foreign").unwrap();
    }
    let wake = cluster.node_mut(2).pause_for(Duration::from_millis(500)).unwrap();
    let helper = {
        let rl = rl.clone();
        std::thread::spawn(move || {
            let result = runtime.block_on(async move {
                let result = rl.try_lock("k").await.map(drop);
                // A little more work on this runtime (its drivers flush the SET).
                tokio::time::sleep(Duration::from_millis(20)).await;
                result
            });
            drop(runtime);
            result
        })
    };
    let err = helper.join().unwrap().unwrap_err();
    assert_eq!(err.kind(), redlock::ErrorKind::NotAcquired, "{err}");
    wake.join().unwrap();
    tokio::time::sleep(Duration::from_millis(1000)).await;
    let left = cluster.node(2).get("k").unwrap();
    assert_eq!(
        left,
        None,
        "the refused attempt's token is still on node 2 (pttl {} ms)",
        cluster.node(2).pttl("k").unwrap()
    );
}

// Found by the review (same root cause, for a release; failed every run before the fix): `release()` returns
// Ok, yet node 2 keeps the released lock's key for the extension's whole 20 s lease. The
// extension is in node 2's buffer; the release waits behind it; the helper runtime that
// owns the drivers ends; the release is re-sent on a new connection to the hung node,
// times out, and is never retried.
// Same mechanism for a release: a lock taken and released from a short-lived runtime that
// opened the connections, while node 2 is hung, with an extension in flight before the
// release (so the release is not yet written when the runtime ends).
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_release_from_a_runtime_that_opened_the_connections_leaves_no_key() {
    let mut cluster = common::cluster(3);
    let rl = common::client(&cluster);
    let (runtime, mut lock) = {
        let rl = rl.clone();
        std::thread::spawn(move || {
            let runtime =
                tokio::runtime::Builder::new_current_thread().enable_all().build().unwrap();
            let lock = runtime.block_on(async move {
                let lock = rl.try_lock("r").await.unwrap();
                // Lets the last node's SET finish on this runtime.
                tokio::time::sleep(Duration::from_millis(300)).await;
                lock
            });
            (runtime, lock)
        })
        .join()
        .unwrap()
    };
    let token = lock.token().to_owned();
    let all = || cluster.nodes_holding("r", &token).len() == 3;
    assert!(common::eventually(Duration::from_secs(1), all).await);
    let wake = cluster.node_mut(2).pause_for(Duration::from_millis(600)).unwrap();
    let helper = std::thread::spawn(move || {
        let result = runtime.block_on(async move {
            lock.extend(Duration::from_secs(20)).await?;
            let released = lock.release().await;
            tokio::time::sleep(Duration::from_millis(20)).await;
            released
        });
        drop(runtime);
        result
    });
    helper.join().unwrap().unwrap();
    wake.join().unwrap();
    tokio::time::sleep(Duration::from_millis(1000)).await;
    let left = cluster.node(2).get("r").unwrap();
    assert_ne!(
        left.as_deref(),
        Some(token.as_str()),
        "the released lock's key is still on node 2 (pttl {} ms)",
        cluster.node(2).pttl("r").unwrap()
    );
}

// Found by the review: an auto-extended lock is lost with every node healthy, when the connections were
// opened by a runtime that is kept but not driven (the usual sync wrapper: one runtime kept
// in a struct, `block_on` per call). The extender runs on the client's own thread, but its
// requests go through connections whose redis-rs drivers live on the idle runtime: they are
// never written, every extension times out, and the lease ends at its first deadline.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn an_auto_extended_lock_from_a_sync_wrapper_runtime_stays_held_while_nodes_are_healthy() {
    let cluster = common::cluster(3);
    let rl = common::builder(&cluster, Duration::from_millis(100))
        .ttl(Duration::from_millis(600))
        .build()
        .unwrap();
    // The sync wrapper: a runtime kept alive, entered only during calls.
    let (runtime, auto) = std::thread::spawn(move || {
        let runtime = tokio::runtime::Builder::new_current_thread().enable_all().build().unwrap();
        let auto = runtime.block_on(async move {
            let lock = rl.try_lock("job").await.unwrap();
            tokio::time::sleep(Duration::from_millis(50)).await;
            lock.auto_extend()
        });
        (runtime, auto)
    })
    .join()
    .unwrap();
    let lease = auto.lease();
    // Three leases later, with every node up and fast.
    tokio::time::sleep(Duration::from_millis(1800)).await;
    let held = lease.is_held();
    let pttls = cluster.pttls("job").unwrap();
    drop(auto);
    std::thread::spawn(move || drop(runtime)).join().unwrap();
    assert!(held, "the lease was lost with every node healthy (pttls {pttls:?})");
}

// Control for the test above: the same, with the helper runtime kept running. Passes.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn control_an_auto_extended_lock_from_a_driven_runtime_stays_held() {
    let cluster = common::cluster(3);
    let rl = common::builder(&cluster, Duration::from_millis(100))
        .ttl(Duration::from_millis(600))
        .build()
        .unwrap();
    let (tx, rx) = std::sync::mpsc::channel();
    let driver = std::thread::spawn(move || {
        let runtime = tokio::runtime::Builder::new_current_thread().enable_all().build().unwrap();
        runtime.block_on(async move {
            let lock = rl.try_lock("job").await.unwrap();
            tx.send(lock.auto_extend()).unwrap();
            tokio::time::sleep(Duration::from_millis(2500)).await;
        });
    });
    let auto = rx.recv().unwrap();
    let lease = auto.lease();
    tokio::time::sleep(Duration::from_millis(1800)).await;
    assert!(lease.is_held());
    drop(auto);
    tokio::task::spawn_blocking(move || driver.join().unwrap()).await.unwrap();
}
