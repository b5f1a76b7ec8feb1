//! Review of 3a10a43 (answers in slots, undo registrations, connect timeouts as TimedOut,
//! hand-over ordering): attacks on real nodes.
//!
//! Broken at 3a10a43 (and already at 6a95076), fixed since:
//! `a_release_handed_over_from_another_runtime_waits_for_the_set_it_undoes` and
//! `a_reentrant_hold_dropped_on_a_short_lived_runtime_leaves_no_field` failed every time.
//! The hand-over (`background::Unfinished::drop`) re-sent an undo on its own
//! (`NodeCall::resent_undo` with no `previous`), assuming the request it undoes died with
//! the same runtime; when that request lives on another runtime and has not gone out yet
//! (waiting for its turn), the re-sent undo overtook it. Now the hand-over queues each
//! re-sent undo behind the original one's slot, which (dropped unsent) hands on to the
//! request it waited for.
//!
//! The other tests passed at 3a10a43; kept as regression tests.

use crate::common;

use std::time::{Duration, Instant};

use redlock_testkit::{FaultyCluster, NetFault};

/// Attack: the hand-over re-sends an undo "on its own" (no `previous`), assuming the
/// request it undoes died with the same runtime. Here the request it undoes (a2's SET on
/// node 4, still waiting for its turn behind a1's release) lives on the main runtime; a2
/// is released from a short-lived runtime, whose end hands a2's release over to the
/// client's thread.
///
/// Node 4's connection then carries: SET(a1) [held by the proxy], release(a2) [re-sent at
/// once], release(a1), SET(a2): a2's key stays on node 4 for its whole lease.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_release_handed_over_from_another_runtime_waits_for_the_set_it_undoes() {
    let (faulty, rl) = common::five_slowed_nodes(Duration::from_secs(2)).await;
    let cluster = faulty.cluster();
    let key = "cross";
    // a2's SET on node 4 waits (unsent, on this runtime) behind a1's release there.
    let a2 =
        common::lock_behind_an_unsent_acquisition(&faulty, &rl, key, Duration::from_millis(600))
            .await;
    let token = a2.token().to_string();
    common::on_short_runtime(async move { a2.release().await }).unwrap();
    tokio::time::sleep(Duration::from_millis(1200)).await;
    let left = cluster.node(4).get(key).unwrap();
    assert_ne!(
        left.as_deref(),
        Some(token.as_str()),
        "a2 was released, its key is on node 4 (pttl {} ms); nodes holding it: {:?}",
        cluster.node(4).pttl(key).unwrap(),
        cluster.nodes_holding(key, &token)
    );
}

/// Control for the attack above: the same staging, a2 released on the main runtime (its
/// release on node 4 stays queued behind its SET).
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn control_a_release_on_the_same_runtime_waits_for_the_set_it_undoes() {
    let (faulty, rl) = common::five_slowed_nodes(Duration::from_secs(2)).await;
    let cluster = faulty.cluster();
    let key = "same";
    // a2's SET on node 4 waits (unsent, on this runtime) behind a1's release there.
    let a2 =
        common::lock_behind_an_unsent_acquisition(&faulty, &rl, key, Duration::from_millis(600))
            .await;
    let token = a2.token().to_string();
    a2.release().await.unwrap();
    tokio::time::sleep(Duration::from_millis(1200)).await;
    let left = cluster.node(4).get(key).unwrap();
    assert_ne!(left.as_deref(), Some(token.as_str()), "a2's key is on node 4");
}

/// Attack (connect timeouts are now `TimedOut`): a release to a node whose connection was
/// reset and whose new connects hang (a blackhole: accepted, nothing answered) times out
/// connecting, and is sent again with doubling pauses. It must stop once nothing it removes
/// can exist (1 s lease): no retry loop beyond the hold's horizon, no spin.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_release_whose_connects_time_out_is_retried_only_until_the_lease_ends() {
    common::logs();
    let faulty = FaultyCluster::start(3).unwrap();
    let rl = common::builder_for(faulty.urls(), Duration::from_millis(200))
        .connect_timeout(Duration::from_millis(100))
        .ttl(Duration::from_secs(1))
        .build()
        .unwrap();
    let url = faulty.urls()[2].clone();
    let started = Instant::now();
    let lock = rl.try_lock("bh").await.unwrap();
    let token = lock.token().to_string();
    assert!(
        common::eventually(Duration::from_secs(1), || {
            faulty.cluster().nodes_holding("bh", &token).len() == 3
        })
        .await
    );
    faulty.proxy(2).set_fault(NetFault::Reset);
    faulty.proxy(2).set_fault(NetFault::Blackhole);
    lock.release().await.unwrap();
    // The hold's horizon: the lease (1 s, + 12 ms drift), the connect timeout and twice
    // the node timeout after `started`, and the clock reading's error (a few ms): retries
    // stop by then; the last one may still run for a connect timeout.
    let until = started + Duration::from_millis(1012 + 100 + 400 + 50);
    tokio::time::sleep_until((until + Duration::from_millis(400)).into()).await;
    let sent = common::requests_ended(&url, "release");
    tokio::time::sleep(Duration::from_millis(1500)).await;
    let later = common::requests_ended(&url, "release");
    eprintln!("releases sent to node 2: {sent}");
    assert!(sent >= 2, "the release was not sent again ({sent} sent)");
    assert!(sent <= 12, "{sent} releases sent to node 2 within the lease: a spin");
    assert_eq!(sent, later, "releases still sent to node 2 after its keys expired");
    faulty.proxy(2).heal();
}

/// A node whose process is dead (its proxy accepts, then closes at once): the release
/// there is sent again, a few times with growing pauses and never in a spin (a node with
/// its data on disk may come back within the lease), and a shutdown stops the re-sends
/// instead of waiting for them.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_release_to_a_dead_node_is_sent_again_and_shutdown_does_not_wait_for_it() {
    common::logs();
    let mut faulty = FaultyCluster::start(3).unwrap();
    let rl = common::builder_for(faulty.urls(), Duration::from_millis(200))
        .connect_timeout(Duration::from_millis(100))
        .build()
        .unwrap();
    let url = faulty.urls()[2].clone();
    let lock = rl.try_lock("dead").await.unwrap();
    faulty.cluster_mut().node_mut(2).kill().unwrap();
    lock.release().await.unwrap();
    tokio::time::sleep(Duration::from_millis(800)).await;
    let sent = common::requests_ended(&url, "release");
    assert!((2..=12).contains(&sent), "{sent} releases sent to the dead node in 800 ms");
    // The re-sends stop: shutdown does not wait for its deadline.
    let started = Instant::now();
    let _ = rl.shutdown(Duration::from_secs(3)).await;
    let waited = started.elapsed();
    assert!(waited < Duration::from_millis(500), "shutdown waited {waited:?}");
}

/// The same attack through `Drop` and another kind: a reentrant hold, whose acquisition on
/// node 4 still waits (on the main runtime) behind the previous hold's release there, is
/// dropped on a short-lived runtime. The release `Drop` leaves to that runtime is handed
/// over when it ends and must still land after the acquisition it undoes.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_reentrant_hold_dropped_on_a_short_lived_runtime_leaves_no_field() {
    let (faulty, rl) = common::five_slowed_nodes(Duration::from_secs(2)).await;
    let cluster = faulty.cluster();
    let key = "nested";
    faulty.proxy(4).hold_requests_containing(key.as_bytes(), Duration::from_millis(600));
    let h1 = rl.reentrant(key, "job").await.unwrap();
    faulty.proxy(4).release_holds();
    h1.release().await.unwrap();
    let h2 = rl.reentrant(key, "job").await.unwrap();
    let field = h2.field().to_string();
    common::on_short_runtime(async move { drop(h2) });
    tokio::time::sleep(Duration::from_millis(1200)).await;
    let fields = cluster.node(4).hgetall(key).unwrap();
    assert!(
        !fields.contains_key(&field),
        "h2 was dropped (released), its field is on node 4: {fields:?}, pttl {} ms",
        cluster.node(4).pttl(key).unwrap()
    );
}

/// Answers in slots, for rounds decided before every node answered: fenced acquisitions
/// (acquire, read and write rounds) and `is_held` checks while node 4 answers 300 ms late
/// each time (its answers land in the slots of rounds already decided). Tokens must grow
/// strictly, every check must say held, and no two grants overlap.
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
        assert!(lock.is_held().await.unwrap(), "round {round}");
        let err = rl.try_lock("fenced").await.unwrap_err();
        assert_eq!(err.kind(), redlock::ErrorKind::NotAcquired, "round {round}: {err}");
        lock.release().await.unwrap();
    }
    faulty.proxy(4).heal();
}
