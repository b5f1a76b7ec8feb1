//! Review of c6ffc17 (one slot allocation per round, one shared `Pending` list, the
//! synchronous `ready()` connection path, the boxed re-send and NOSCRIPT paths): attacks
//! on real nodes. None broke it; kept as regression tests.

use crate::common;

use std::future::IntoFuture;
use std::sync::Arc;
use std::sync::atomic::{AtomicUsize, Ordering};
use std::time::{Duration, Instant};

use redlock::{ErrorKind, Retry};
use redlock_testkit::{FaultyCluster, NetFault};

/// A clean-up round that sends to some nodes only (nodes 0-2 answered Held: no clean-up
/// there, their entries of the clean-up's `Slots` are never used), with its clean-up on
/// node 4 still in flight behind the abandoned SET. The next attempt of the same client
/// must wait, on node 4 only, for that clean-up (Pending filtered to node 4), and is then
/// granted on node 4 too (not refused by its own abandoned SET).
///
/// Order on node 4's connection if Pending were filtered to the wrong node / the slot
/// index were wrong: SET(a1) [held], SET(a2) -> refused by a1's token, clean-up(a1).
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_partial_clean_up_is_waited_for_on_its_own_node_only() {
    let faulty = FaultyCluster::start(5).unwrap();
    let rl = common::builder_for(faulty.urls(), Duration::from_millis(150)).build().unwrap();
    rl.try_lock("warm").await.unwrap().release().await.unwrap();
    let cluster = faulty.cluster();
    for round in 0..5 {
        let key = format!("k{round}");
        for i in [0, 1, 2] {
            cluster.node(i).set(&key, "foreign").unwrap();
        }
        // a1's SET on node 4 is held 400 ms: it times out (150 ms) and its clean-up there
        // is queued behind it, in the background.
        faulty.proxy(4).hold_requests_containing(b"NX", Duration::from_millis(400));
        let err = rl.try_lock(&key).await.unwrap_err();
        assert_eq!(err.kind(), ErrorKind::NotAcquired, "{err}");
        faulty.proxy(4).release_holds();
        for i in [0, 1, 2] {
            cluster.node(i).command(&["DEL", &key]).unwrap();
        }
        // a2 at once: node 4 has a1's SET (held) then a1's clean-up in flight. Node timeout
        // 150 ms: a2's SET on node 4 may time out while it waits; that is fine. What must
        // never happen is a2's SET on node 4 refused as Held by a1's token.
        let a2 = rl.try_lock(&key).await.unwrap_or_else(|err| panic!("round {round}: {err}"));
        let token = a2.token().to_string();
        tokio::time::sleep(Duration::from_millis(700)).await;
        let on4 = cluster.node(4).get(&key).unwrap();
        // a1's token must be gone from node 4 (its clean-up ran after its SET), and never
        // a token other than a2's.
        assert!(
            on4.is_none() || on4.as_deref() == Some(token.as_str()),
            "round {round}: node 4 holds {on4:?}, a2 is {token}"
        );
        a2.release().await.unwrap();
        assert!(common::eventually(Duration::from_secs(2), || cluster.count_key(&key) == 0).await);
    }
}

/// Same, but with a node timeout long enough that a2's SET on node 4 waits for the clean-up
/// and goes out: it must be granted there (a2 on all 5 nodes), which fails if the wait is
/// skipped (a1's SET refuses a2) or waits for the wrong slot.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_next_attempt_is_granted_on_the_node_of_the_abandoned_set() {
    let faulty = FaultyCluster::start(5).unwrap();
    let rl = common::builder_for(faulty.urls(), Duration::from_millis(2000)).build().unwrap();
    rl.try_lock("warm").await.unwrap().release().await.unwrap();
    let cluster = faulty.cluster();
    for i in [0, 1, 2] {
        faulty.proxy(i).set_fault(common::latency(5));
    }
    for round in 0..4 {
        let key = format!("j{round}");
        for i in [0, 1, 2] {
            cluster.node(i).set(&key, "foreign").unwrap();
        }
        faulty.proxy(4).hold_requests_containing(b"NX", Duration::from_millis(300));
        // Decided by the three Held answers (~10 ms) while node 4's SET is held.
        let started = Instant::now();
        let err = rl.try_lock(&key).await.unwrap_err();
        assert_eq!(err.kind(), ErrorKind::NotAcquired, "{err}");
        assert!(started.elapsed() < Duration::from_millis(250), "{:?}", started.elapsed());
        faulty.proxy(4).release_holds();
        for i in [0, 1, 2] {
            cluster.node(i).command(&["DEL", &key]).unwrap();
        }
        let a2 = rl.try_lock(&key).await.unwrap_or_else(|err| panic!("round {round}: {err}"));
        let token = a2.token().to_string();
        let everywhere = common::eventually(Duration::from_secs(2), || {
            cluster.nodes_holding(&key, &token).len() == 5
        })
        .await;
        assert!(
            everywhere,
            "round {round}: a2 holds {:?}; node 4 has {:?}",
            cluster.nodes_holding(&key, &token),
            cluster.node(4).get(&key).unwrap()
        );
        a2.release().await.unwrap();
    }
}

/// Scripts flushed on every node behind warm connections: every kind's scripted steps get
/// NOSCRIPT and fall back to EVAL.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn every_kind_works_after_a_script_flush() {
    let faulty = FaultyCluster::start(3).unwrap();
    let cluster = faulty.cluster();
    let rl = common::builder_for(faulty.urls(), Duration::from_millis(500)).build().unwrap();
    let flush = || {
        for i in 0..3 {
            cluster.node(i).command(&["SCRIPT", "FLUSH"]).unwrap();
        }
    };
    let mut plain = rl.try_lock("p").fenced().await.unwrap();
    let mut re = rl.reentrant("r", "me").once().await.unwrap();
    let multi = rl.many(&["m1", "m2"]).once().await.unwrap();
    let read = rl.read("rw").once().await.unwrap();
    flush();
    plain.extend(Duration::from_secs(10)).await.unwrap();
    re.extend(Duration::from_secs(10)).await.unwrap();
    assert!(plain.is_held().await.unwrap());
    flush();
    let re2 = rl.reentrant("r", "me").once().await.unwrap();
    flush();
    re2.release().await.unwrap();
    re.release().await.unwrap();
    plain.release().await.unwrap();
    multi.release().await.unwrap();
    read.release().await.unwrap();
    flush();
    let w = rl.write("rw").once().await.unwrap();
    flush();
    w.release().await.unwrap();
    for key in ["p", "r", "m1", "m2", "rw"] {
        assert!(
            common::eventually(Duration::from_secs(1), || cluster.count_key(key) == 0).await,
            "{key} left on {:?}",
            cluster.nodes_with_key(key).unwrap()
        );
    }
}

const PASSWORD: &str = "slots-pass";

/// Stale connection AND NOSCRIPT on the re-send: an ACL user that may not SCRIPT LOAD (the
/// new connection's preload is refused), scripts flushed, connections reset under warm
/// clients. A release then goes: EVALSHA on the dead cached connection (stale) -> re-sent
/// on a new one -> NOSCRIPT -> EVAL (boxed) -> deleted. Then a new lock must be granted.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_stale_connection_then_noscript_on_the_resend_still_releases() {
    let faulty = FaultyCluster::start(3).unwrap();
    let cluster = faulty.cluster();
    let rules = [
        "on",
        "~*",
        "&*",
        "+get",
        "+set",
        "+del",
        "+pttl",
        "+hset",
        "+hdel",
        "+hgetall",
        "+pexpire",
        "+pexpireat",
        "+time",
        "+publish",
        "+eval",
        "+evalsha",
        "+subscribe",
        "+unsubscribe",
        "+info",
        "+incr",
        "+incrby",
        "+ping",
        "+hello",
        "+client",
        "+select",
    ];
    for node in cluster.nodes() {
        node.acl_setuser("noload", PASSWORD, &rules).unwrap();
    }
    let urls: Vec<String> = (0..3)
        .map(|i| format!("redis://noload:{PASSWORD}@127.0.0.1:{}", faulty.proxy(i).port()))
        .collect();
    let rl = common::builder_for(urls, Duration::from_millis(500)).build().unwrap();
    for round in 0..4 {
        let key = format!("s{round}");
        let mut lock = rl.try_lock(&key).await.unwrap();
        let mut re = rl.reentrant(&format!("re{round}"), "o").once().await.unwrap();
        for i in 0..3 {
            cluster.node(i).command(&["SCRIPT", "FLUSH"]).unwrap();
            faulty.proxy(i).set_fault(NetFault::Reset);
            faulty.proxy(i).heal();
        }
        if round % 2 == 0 {
            lock.extend(Duration::from_secs(10)).await.unwrap();
            for i in 0..3 {
                cluster.node(i).command(&["SCRIPT", "FLUSH"]).unwrap();
                faulty.proxy(i).set_fault(NetFault::Reset);
                faulty.proxy(i).heal();
            }
        }
        lock.release().await.unwrap_or_else(|err| panic!("round {round}: {err}"));
        re.extend(Duration::from_secs(5)).await.unwrap();
        re.release().await.unwrap();
        assert!(common::eventually(Duration::from_secs(1), || cluster.count_key(&key) == 0).await);
        assert!(
            common::eventually(Duration::from_secs(1), || cluster.count_key(&format!("re{round}"))
                == 0)
            .await
        );
        rl.try_lock(&key).await.unwrap().release().await.unwrap();
    }
}

/// A killed then restarted node (same port) behind a warm client: its cached connection
/// is dead; the next SET and release go out on a new one (stale detection through
/// `ready()`), and the node counts again at once. The nodes restart without their data:
/// the release after the second restarts finds nothing and says so (nothing was written
/// on the dead connections, so "absent" is not read as "removed by an earlier try"), and
/// nothing is left.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_dead_cached_connection_is_replaced_on_the_fast_path() {
    let mut cluster = common::cluster(3);
    let rl = common::builder(&cluster, Duration::from_millis(500)).build().unwrap();
    for round in 0..4 {
        rl.try_lock("warm").await.unwrap().release().await.unwrap();
        for i in 0..3 {
            cluster.node_mut(i).restart().unwrap();
        }
        // Every cached connection is dead: each SET is re-sent.
        let lock = rl.try_lock("x").await.unwrap_or_else(|err| panic!("round {round}: {err}"));
        // The grant returns at the quorum: the third SET may still be on its way.
        let everywhere = || cluster.nodes_holding("x", lock.token()).len() == 3;
        assert!(
            common::eventually(Duration::from_secs(1), everywhere).await,
            "round {round}: held on {:?}",
            cluster.nodes_holding("x", lock.token())
        );
        for i in 0..3 {
            cluster.node_mut(i).restart().unwrap();
        }
        // NotHeld: the keys went with the restarts. (Ok only if a driver had not yet seen
        // its node's EOF: the known limit of `review_lanes_third`.)
        let released = lock.release().await.map_err(|err| err.kind());
        assert!(
            matches!(released, Ok(()) | Err(redlock::ErrorKind::NotHeld)),
            "round {round}: {released:?}"
        );
        assert!(
            common::eventually(Duration::from_secs(1), || cluster.count_key("x") == 0).await,
            "round {round}: left on {:?}",
            cluster.nodes_with_key("x").unwrap()
        );
    }
}

/// Attempts cancelled at random points (before the first poll, mid-round, during the
/// clean-up) by two clients on slow links, while the others lock: never two holders, and
/// every cancelled attempt's keys removed (nothing waits forever: every task ends).
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn cancelled_attempts_never_make_two_holders_nor_hang() {
    let faulty = FaultyCluster::start(5).unwrap();
    for i in 0..5 {
        faulty.proxy(i).set_fault(NetFault::Latency {
            fixed: Duration::from_millis(2 + i as u64 * 3),
            jitter: Duration::from_millis(6),
        });
    }
    let holders = Arc::new(AtomicUsize::new(0));
    let granted = Arc::new(AtomicUsize::new(0));
    let end = Instant::now() + Duration::from_secs(6);
    let tasks: Vec<_> = (0..4u64)
        .map(|c| {
            let rl = common::builder_for(faulty.urls(), Duration::from_millis(80))
                .retry(
                    Retry::new()
                        .with_unbounded_attempts()
                        .with_delay(Duration::from_millis(3))
                        .with_jitter(Duration::from_millis(5))
                        .with_max_wait(Duration::from_millis(300)),
                )
                .build()
                .unwrap();
            let (holders, granted) = (holders.clone(), granted.clone());
            tokio::spawn(async move {
                let mut seed = 0x9e37_79b9_7f4a_7c15u64 ^ (c + 1);
                while Instant::now() < end {
                    seed ^= seed << 13;
                    seed ^= seed >> 7;
                    seed ^= seed << 17;
                    let cancel_after = Duration::from_millis(seed % 40);
                    let attempt = rl.lock("shared");
                    let lock = if seed.is_multiple_of(3) {
                        attempt.await
                    } else {
                        match tokio::time::timeout(cancel_after, attempt.into_future()).await {
                            Ok(result) => result,
                            Err(_) => continue,
                        }
                    };
                    let Ok(lock) = lock else { continue };
                    assert_eq!(holders.fetch_add(1, Ordering::SeqCst), 0, "two holders");
                    granted.fetch_add(1, Ordering::SeqCst);
                    tokio::time::sleep(Duration::from_millis(seed % 5)).await;
                    holders.fetch_sub(1, Ordering::SeqCst);
                    if seed.is_multiple_of(4) {
                        drop(lock);
                    } else {
                        let _ = lock.release().await;
                    }
                }
            })
        })
        .collect();
    for task in tasks {
        tokio::time::timeout(Duration::from_secs(30), task).await.expect("a task hung").unwrap();
    }
    assert!(granted.load(Ordering::SeqCst) > 5, "only {} grants", granted.load(Ordering::SeqCst));
    let cluster = faulty.cluster();
    assert!(
        common::eventually(Duration::from_secs(3), || cluster.count_key("shared") == 0).await,
        "keys left on {:?}",
        cluster.nodes_with_key("shared").unwrap()
    );
}
