//! Review findings: extensions of string-keyed locks (plain, multi-resource) that fail but
//! still change the nodes.
//!
//! `Lock::extend` documents: "A failed extension deletes nothing and leaves the current
//! validity as it was". The plain and multi extend scripts run `PEXPIRE key <new lease>`,
//! which also SHORTENS a key. When the new lease is shorter than what is left of the
//! current one and the round fails (nodes slow beyond the node timeout, so every request
//! times out on the client but still runs on the node), the client keeps its old, long
//! validity while every node's key now expires after the short lease: a second client is
//! granted the lock while the first one's `validity()` still says it holds it for seconds.
//!
//! The hash-based kinds (reentrant, read-write) never shorten a field (`hold()` in
//! `hash_common.lua`), so they hold up; see the last test.

use crate::common;

use std::time::Duration;

use redlock::ErrorKind;
use redlock_testkit::{FaultyCluster, NetFault, NodeConfig};

fn slow(cluster: &FaultyCluster, client: usize, delay: Duration) {
    for node in 0..cluster.len() {
        cluster
            .client_proxy(client, node)
            .set_fault(NetFault::Latency { fixed: delay, jitter: Duration::ZERO });
    }
}

/// Interleaving (3 nodes, every node seen through client A's own proxies):
/// 1. A takes "k" with a 10 s lease (validity ~9.9 s).
/// 2. A's links get 300 ms latency each way; A calls `extend(400 ms)` with a 100 ms node
///    timeout: every request times out, the round fails (`Unavailable`), and A keeps its
///    old deadline, as documented.
/// 3. The requests were written, so ~300 ms later every node runs `PEXPIRE k 400`.
/// 4. ~700 ms after the extension, the key is gone everywhere; B is granted "k" while A's
///    `validity()` still reports ~9 s: two holders.
///
/// Fails deterministically.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]

async fn a_failed_shorter_extend_must_not_shorten_the_keys_of_a_valid_lock() {
    let cluster = FaultyCluster::start_for_clients(3, 2, NodeConfig::new()).unwrap();
    let a = common::single_attempt(cluster.urls_for(0));
    let b = common::single_attempt(cluster.urls_for(1));
    let mut lock = a.try_lock("k").await.unwrap();
    let before = lock.deadline();

    slow(&cluster, 0, Duration::from_millis(300));
    let err = lock.extend(Duration::from_millis(400)).await.unwrap_err();
    assert_eq!(err.kind(), ErrorKind::Unavailable, "{err}");
    assert_eq!(lock.deadline(), before, "a failed extension keeps the old validity");

    tokio::time::sleep(Duration::from_millis(1200)).await;
    assert!(lock.validity() > Duration::from_secs(8), "A still believes it holds the lock");
    let second = b.try_lock("k").await;
    assert!(
        second.is_err(),
        "B was granted \"k\" while A's lock is valid for another {:?}: the failed \
         extension shortened the keys on the nodes (pttls now {:?})",
        lock.validity(),
        cluster.cluster().pttls("k").unwrap(),
    );
}

/// The same interleaving for a multi-resource lock (`multi_extend.lua` also runs
/// `PEXPIRE` with the new, shorter lease). Fails deterministically.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]

async fn a_failed_shorter_multi_extend_must_not_shorten_the_keys_of_a_valid_set() {
    let cluster = FaultyCluster::start_for_clients(3, 2, NodeConfig::new()).unwrap();
    let a = common::single_attempt(cluster.urls_for(0));
    let b = common::single_attempt(cluster.urls_for(1));
    let mut set = a.many(&["x", "y"]).once().await.unwrap();

    slow(&cluster, 0, Duration::from_millis(300));
    let err = set.extend(Duration::from_millis(400)).await.unwrap_err();
    assert_eq!(err.kind(), ErrorKind::Unavailable, "{err}");

    tokio::time::sleep(Duration::from_millis(1200)).await;
    assert!(set.validity() > Duration::from_secs(8));
    let second = b.try_lock("x").await;
    assert!(
        second.is_err(),
        "B was granted \"x\" while A's set is valid for another {:?}",
        set.validity()
    );
}

/// What held up: the same interleaving against a reentrant hold and a write grant. Their
/// extension never shortens a field, so the second owner stays out.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn hash_kinds_never_shorten_on_a_failed_extend() {
    let cluster = FaultyCluster::start_for_clients(3, 2, NodeConfig::new()).unwrap();
    let a = common::single_attempt(cluster.urls_for(0));
    let b = common::single_attempt(cluster.urls_for(1));
    let mut hold = a.reentrant("r", "owner-a").once().await.unwrap();
    let mut grant = a.write("w").once().await.unwrap();

    slow(&cluster, 0, Duration::from_millis(300));
    let err = hold.extend(Duration::from_millis(400)).await.unwrap_err();
    assert_eq!(err.kind(), ErrorKind::Unavailable, "{err}");
    let err = grant.extend(Duration::from_millis(400)).await.unwrap_err();
    assert_eq!(err.kind(), ErrorKind::Unavailable, "{err}");

    tokio::time::sleep(Duration::from_millis(1200)).await;
    assert_eq!(
        b.reentrant("r", "owner-b").once().await.unwrap_err().kind(),
        ErrorKind::NotAcquired
    );
    assert_eq!(b.read("w").once().await.unwrap_err().kind(), ErrorKind::NotAcquired);
    assert!(hold.is_valid() && grant.is_valid());
}

/// The same root cause through the public auto-extension: `auto_extend_capped` extends
/// with `min(cap left, ttl)`, usually shorter than what is left of the current lease.
///
/// Interleaving (3 nodes, A's links slow from the start of the hold, 300 ms each way,
/// 100 ms node timeout; lease 3 s, cap 2.2 s):
/// 1. t=0: A is granted (deadline ~2.97 s) and starts `auto_extend_capped(2.2 s)`.
/// 2. t=1.0 s: the extender sends `extend(1.2 s)`; it times out on the client (Unavailable,
///    logged, the deadline stays ~2.97 s) but lands on every node at ~1.3 s: the keys now
///    expire at ~2.5 s.
/// 3. t=2.03 s: less than a third of the lease is left of the cap: the extender lets the
///    lease run out, `lost()` is due at ~2.97 s.
/// 4. t=2.65 s: B is granted the lock while A's `Lease::is_held()` is still true and its
///    `lost()` has not fired.
///
/// Fails deterministically.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]

async fn a_capped_auto_extension_never_lets_another_client_in_before_lost() {
    let cluster = FaultyCluster::start_for_clients(3, 2, NodeConfig::new()).unwrap();
    let a = common::single_attempt(cluster.urls_for(0));
    let b = common::single_attempt(cluster.urls_for(1));
    let lock = a.try_lock("k").ttl(Duration::from_secs(3)).await.unwrap();
    let granted = std::time::Instant::now();
    let auto = lock.auto_extend_capped(Duration::from_millis(2200));
    let lease = auto.lease();
    slow(&cluster, 0, Duration::from_millis(300));

    tokio::time::sleep_until((granted + Duration::from_millis(2650)).into()).await;
    assert!(lease.is_held(), "A's lease is still held by its own account");
    let second = b.try_lock("k").await;
    let a_still_held = lease.is_held();
    assert!(
        second.is_err() || !a_still_held,
        "B was granted the lock while A's lease is held for another {:?} (lost() not fired)",
        lease.validity()
    );
    drop(auto);
}
