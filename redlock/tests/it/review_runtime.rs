//! Review findings: background work on a borrowed runtime.
//!
//! `AutoLock` is `Send + 'static` and its `Lease` is meant to be handed to whatever task
//! does the work, but the extender is spawned on the runtime that called `auto_extend()`.
//! When that runtime shuts down (a sync wrapper's `Runtime::block_on`, a helper runtime,
//! a per-request runtime) the extender task is dropped with it: the guard inside it is
//! dropped, which releases the lock on the nodes at once (on the library's own thread),
//! but nothing tells the `Lease`: its status sender is still owned by the `AutoLock`, so
//! `is_held()` stays true and `lost()` only fires at the old validity deadline. Meanwhile
//! another client can take the lock.

use crate::common;

use std::time::Duration;

use redlock::{AutoLock, Lock};

/// Interleaving (3 nodes):
/// 1. A helper thread runs a current-thread runtime, takes "k" (10 s lease) and calls
///    `auto_extend()`; the `AutoLock` is returned out of the thread and the helper runtime
///    is dropped (its tasks with it).
/// 2. The dropped extender drops its guard: the lock is released on every node.
/// 3. The main runtime keeps the `AutoLock`: its lease says held (~9.9 s left), `lost()`
///    does not fire, yet a second client is granted "k".
///
/// Fails deterministically.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]

async fn an_auto_lock_outliving_its_runtime_never_reports_held_while_released() {
    let cluster = common::cluster(3);
    let rl = common::client(&cluster);
    let helper = {
        let rl = rl.clone();
        std::thread::spawn(move || -> AutoLock<Lock> {
            let runtime =
                tokio::runtime::Builder::new_current_thread().enable_all().build().unwrap();
            runtime.block_on(async move { rl.try_lock("k").await.unwrap().auto_extend() })
        })
    };
    let auto = helper.join().unwrap();
    let lease = auto.lease();

    tokio::time::sleep(Duration::from_millis(300)).await;
    let lost_fired = tokio::time::timeout(Duration::from_millis(10), lease.lost()).await.is_ok();
    let other = common::client(&cluster);
    let second = other.try_lock("k").await;
    assert!(
        second.is_err() || lost_fired || !lease.is_held(),
        "a second client holds \"k\" while the first one's lease is held for {:?} and \
         lost() has not fired (keys now on {:?})",
        lease.validity(),
        cluster.nodes_with_key("k").unwrap(),
    );
    drop(auto);
}

/// The same class for a refused attempt's clean-up: it is left to the caller's runtime
/// ("Place::Caller"), queued behind a `SET` still in flight on a hung node. When the
/// caller's runtime shuts down right after the call returned, the clean-up is dropped
/// unsent; the `SET` (already written on a connection driven by another, long-lived
/// runtime) lands when the node wakes up and stays for its whole lease, although the
/// docs say "a refused attempt releases its token on every node that may hold it,
/// including nodes that never answered".
///
/// Interleaving (3 nodes): the main runtime opens the connections; "k" is held by a
/// foreign owner on nodes 0 and 1; node 2 is paused; a helper runtime's `try_lock("k")` is
/// refused by nodes 0 and 1, its clean-up for node 2 waits behind the `SET`; the helper
/// runtime ends; node 2 resumes, runs the `SET`, and the clean-up never comes.
///
/// Fails deterministically.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]

async fn a_refused_attempt_from_a_short_lived_runtime_leaves_no_key() {
    let mut cluster = common::cluster(3);
    let rl = common::client(&cluster);
    rl.try_lock("warm-up").await.unwrap().release().await.unwrap();
    for i in [0, 1] {
        cluster.node(i).set("k", "foreign").unwrap();
    }
    let wake = cluster.node_mut(2).pause_for(Duration::from_millis(500)).unwrap();
    let helper = {
        let rl = rl.clone();
        std::thread::spawn(move || {
            let runtime =
                tokio::runtime::Builder::new_current_thread().enable_all().build().unwrap();
            runtime.block_on(async move { rl.try_lock("k").await.map(drop) })
        })
    };
    let err = helper.join().unwrap().unwrap_err();
    assert_eq!(err.kind(), redlock::ErrorKind::NotAcquired, "{err}");
    wake.join().unwrap();
    tokio::time::sleep(Duration::from_millis(700)).await;
    let left = cluster.node(2).get("k").unwrap();
    assert_eq!(
        left,
        None,
        "the refused attempt's token is still on node 2 (pttl {} ms)",
        cluster.node(2).pttl("k").unwrap()
    );
}
