//! Release and extend: compare-the-token, quorum, validity, and never touching other owners.

use crate::common;

use std::time::Duration;

use redlock::{ErrorKind, Retry};
use redlock_testkit::{FaultyCluster, NetFault, NodeConfig};

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn release_after_expiry_reports_not_held_and_spares_the_new_owner() {
    let cluster = common::cluster(5);
    let rl = common::client(&cluster);
    // Connections first: a 50 ms lease leaves little room for a connect on a loaded machine.
    common::warm(&rl).await;
    let stale = rl.try_lock("k").ttl(Duration::from_millis(50)).await.unwrap();
    tokio::time::sleep(Duration::from_millis(120)).await;
    assert_eq!(stale.validity(), Duration::ZERO);
    let fresh = rl.try_lock("k").await.unwrap();
    let err = stale.release().await.unwrap_err();
    assert_eq!(err.kind(), ErrorKind::NotHeld, "{err}");
    assert!(
        common::eventually(Duration::from_secs(1), || cluster
            .nodes_holding("k", fresh.token())
            .len()
            == 5)
        .await
    );
    fresh.release().await.unwrap();
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn release_with_a_locally_expired_lease_still_removes_our_keys_but_says_so() {
    let cluster = common::cluster(3);
    let rl =
        common::builder(&cluster, Duration::from_millis(200)).drift_factor(0.5).build().unwrap();
    // A 100 ms lease with a 50% drift allowance is locally over after ~48 ms, while the
    // keys live 100 ms on the nodes.
    let lock = rl.try_lock("k").ttl(Duration::from_millis(100)).await.unwrap();
    tokio::time::sleep(Duration::from_millis(60)).await;
    assert!(!lock.is_valid());
    let err = lock.release().await.unwrap_err();
    assert_eq!(err.kind(), ErrorKind::NotHeld, "{err}");
    // Decided at two of three nodes, which no longer have the key: checked at once, since
    // the key lives only 100 ms on the nodes. The third may still be running the release.
    let left = cluster.count_key("k");
    assert!(left <= 1, "our keys removed: {left} nodes keep one");
    common::gone_everywhere(&cluster, &["k"], "our keys removed").await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn extend_renews_the_lease_from_its_own_start() {
    let cluster = common::cluster(5);
    let rl = common::client(&cluster);
    let mut lock = rl.try_lock("k").ttl(Duration::from_millis(500)).await.unwrap();
    tokio::time::sleep(Duration::from_millis(300)).await;
    lock.extend(Duration::from_secs(5)).await.unwrap();
    assert!(lock.validity() > Duration::from_millis(4_800), "{:?}", lock.validity());
    assert!(lock.validity() <= Duration::from_secs(5) - Duration::from_millis(52));
    // Decided at three of five nodes: the other two may still be running the extension.
    let renewed = || cluster.nodes().iter().all(|node| node.pttl("k").unwrap() > 4_500);
    assert!(common::eventually(Duration::from_secs(2), renewed).await, "{:?}", cluster.pttls("k"));
    // Still held past the original lease.
    tokio::time::sleep(Duration::from_millis(300)).await;
    assert_eq!(rl.try_lock("k").await.unwrap_err().kind(), ErrorKind::NotAcquired);
    lock.release().await.unwrap();
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn extend_does_not_set_the_key_again_on_a_node_that_lost_it() {
    let mut cluster = common::cluster(3);
    let rl = common::client(&cluster);
    let mut lock = rl.try_lock("k").await.unwrap();
    // Staging: every node answered (a round is decided by the first two nodes): an
    // acquisition still behind node 0's first connect could land after its restart.
    common::held_on(&cluster, "k", lock.token(), &[0, 1, 2]).await;
    cluster.node_mut(0).restart().unwrap();
    assert_eq!(cluster.node(0).get("k").unwrap(), None);
    // Held on a quorum (1 and 2): granted, and node 0 stays without the key.
    lock.extend(Duration::from_secs(10)).await.unwrap();
    let renewed = || (1..3).all(|i| cluster.node(i).pttl("k").unwrap() > 9_000);
    assert!(common::eventually(Duration::from_secs(1), renewed).await, "renewed on 1 and 2");
    assert_eq!(cluster.node(0).get("k").unwrap(), None, "the restarted node got no key back");
    lock.release().await.unwrap();
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn an_extension_that_finds_the_hold_gone_ends_it_and_releases_what_is_left() {
    let cluster = common::cluster(5);
    let rl = common::client(&cluster);
    let mut lock = rl.try_lock("k").await.unwrap();
    assert!(
        common::eventually(Duration::from_secs(1), || cluster
            .nodes_holding("k", lock.token())
            .len()
            == 5)
        .await
    );
    // Another owner overwrites the key on a majority (as after our lease expired there),
    // and node 3 lost it: the extension sets ours again there, renews it on node 4.
    for i in [0, 1, 2] {
        cluster.node(i).set("k", "foreign").unwrap();
    }
    common::run(&cluster, 3, &["DEL", "k"]);
    let err = lock.extend(Duration::from_secs(30)).await.unwrap_err();
    assert_eq!(err.kind(), ErrorKind::NotHeld, "{err}");
    // Decided once too many refused: the third foreign node may not have answered by then
    // (it is not waited for past the decision's short linger).
    assert!(err.held_by_others() >= 2, "{err}");
    assert_eq!(lock.validity(), Duration::ZERO, "a hold found gone is over");
    assert!(!lock.is_valid());
    assert!(
        common::eventually(Duration::from_secs(2), || cluster.nodes_holding("k", lock.token())
            == Vec::<usize>::new())
        .await,
        "our keys are released, where left and where the extension set them again: {:?}",
        cluster.nodes_holding("k", lock.token())
    );
    assert_eq!(
        cluster.nodes_holding("k", "foreign"),
        vec![0, 1, 2],
        "another owner's keys are untouched"
    );
    for i in [0, 1, 2] {
        assert_eq!(cluster.node(i).pttl("k").unwrap(), -1, "the foreign keys' expiry is untouched");
    }
    // From then on the guard answers without asking the nodes.
    let err = lock.extend(Duration::from_secs(30)).await.unwrap_err();
    assert_eq!(err.kind(), ErrorKind::NotHeld, "{err}");
    assert!(err.nodes().is_empty(), "no node was asked: {err}");
    assert!(!lock.check_held().await.unwrap());
    let err = lock.release().await.unwrap_err();
    assert_eq!(err.kind(), ErrorKind::NotHeld, "{err}");
    assert!(err.nodes().is_empty(), "no node was asked: {err}");
    assert_eq!(cluster.nodes_holding("k", "foreign"), vec![0, 1, 2]);
    assert_eq!(cluster.count_key("k"), 3, "nothing set again");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn an_extension_that_outlasts_the_validity_releases_the_keys_it_renewed() {
    let faulty = FaultyCluster::start(3).unwrap();
    let rl = common::builder_for(faulty.urls(), Duration::from_secs(2)).build().unwrap();
    common::warm(&rl).await;
    let mut lock = rl.try_lock("k").ttl(Duration::from_millis(300)).await.unwrap();
    for i in 0..3 {
        faulty.proxy(i).set_fault(common::latency(200));
    }
    // Every node renews the key for 30 s, but the answers come after the validity.
    let err = lock.extend(Duration::from_secs(30)).await.unwrap_err();
    assert_eq!(err.kind(), ErrorKind::NotHeld, "{err}");
    assert!(err.to_string().contains("validity ran out during the extension"), "{err}");
    for i in 0..3 {
        faulty.proxy(i).set_fault(NetFault::None);
    }
    let cluster = faulty.cluster();
    assert!(
        common::eventually(Duration::from_secs(3), || cluster.count_key("k") == 0).await,
        "the renewed keys are released, not left for 30 s: {:?}",
        cluster.nodes_holding("k", lock.token())
    );
    let err = lock.release().await.unwrap_err();
    assert_eq!(err.kind(), ErrorKind::NotHeld, "{err}");
    // Free at once for another client, not after 30 s.
    let other = common::single_attempt(faulty.urls());
    other.try_lock("k").await.unwrap().release().await.unwrap();
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn extend_refuses_once_the_validity_is_over() {
    let cluster = common::cluster(3);
    let rl = common::client(&cluster);
    // Connections first: a 30 ms lease leaves no room for a connect on a loaded machine.
    common::warm(&rl).await;
    let mut lock = rl.try_lock("k").ttl(Duration::from_millis(30)).await.unwrap();
    tokio::time::sleep(Duration::from_millis(60)).await;
    let err = lock.extend(Duration::from_secs(10)).await.unwrap_err();
    assert_eq!(err.kind(), ErrorKind::NotHeld);
    assert!(err.nodes().is_empty(), "no node was asked");
    assert_eq!(cluster.count_key("k"), 0, "nothing was set again");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn extend_with_a_killed_majority_is_unavailable() {
    let mut cluster = common::cluster(3);
    let rl = common::client(&cluster);
    let mut lock = rl.try_lock("k").await.unwrap();
    // The grant is decided at two nodes; the third's SET may still be on its way (on a
    // loaded machine, behind the first connect): it must be set before the check below.
    assert!(common::eventually(Duration::from_secs(1), || cluster.count_key("k") == 3).await);
    cluster.node_mut(0).kill().unwrap();
    cluster.node_mut(1).kill().unwrap();
    let deadline = lock.deadline();
    let err = lock.extend(Duration::from_secs(10)).await.unwrap_err();
    assert_eq!(err.kind(), ErrorKind::Unavailable, "{err}");
    assert!(lock.is_valid(), "the current lease is unaffected");
    assert_eq!(lock.deadline(), deadline, "the validity is left as it was");
    assert_eq!(cluster.node(2).get("k").unwrap().as_deref(), Some(lock.token()));
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn check_held_asks_the_quorum() {
    let mut cluster = common::cluster(3);
    let rl = common::client(&cluster);
    let lock = rl.try_lock("k").await.unwrap();
    assert!(common::eventually(Duration::from_secs(1), || cluster.count_key("k") == 3).await);
    assert!(lock.check_held().await.unwrap());
    cluster.node(0).set("k", "foreign").unwrap();
    assert!(lock.check_held().await.unwrap(), "two of three still hold it");
    cluster.node(1).flushall().unwrap();
    assert!(!lock.check_held().await.unwrap(), "lost early, while still locally valid");
    assert!(lock.is_valid());
    cluster.node_mut(2).kill().unwrap();
    cluster.node(1).set("k", lock.token()).unwrap();
    cluster.node_mut(0).kill().unwrap();
    let err = lock.check_held().await.unwrap_err();
    assert_eq!(err.kind(), ErrorKind::Unavailable, "{err}");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn release_after_the_validity_ran_out_is_not_held_even_when_too_few_nodes_answer() {
    let mut cluster = common::cluster(3);
    let rl = common::client(&cluster);
    let lock = rl.try_lock("k").ttl(Duration::from_millis(300)).await.unwrap();
    assert!(common::eventually(Duration::from_secs(1), || cluster.count_key("k") == 3).await);
    cluster.node_mut(0).kill().unwrap();
    cluster.node_mut(1).kill().unwrap();
    tokio::time::sleep(Duration::from_millis(400)).await;
    assert!(!lock.is_valid());
    let err = lock.release().await.unwrap_err();
    assert_eq!(err.kind(), ErrorKind::NotHeld, "{err}");
    assert!(err.to_string().contains("validity had run out"), "{err}");
    // The release was still sent: the live node's key (if it has not expired) is gone.
    assert!(
        common::eventually(Duration::from_secs(1), || cluster.node(2).get("k").unwrap().is_none())
            .await
    );
}

/// A lease that ran out while two of three nodes are paused (too few answers to settle
/// anything): its release answers `NotHeld`, not a retryable `Unavailable`.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn releasing_an_expired_lease_with_most_nodes_paused_answers_not_held() {
    let mut cluster = common::cluster(3);
    let rl = common::builder(&cluster, Duration::from_millis(200))
        .ttl(Duration::from_millis(600))
        .build()
        .unwrap();
    let lock = rl.try_lock("job").await.unwrap();
    let _wakeup = cluster.pause_for(&[1, 2], Duration::from_secs(4)).unwrap();
    tokio::time::sleep(Duration::from_millis(900)).await;
    let err = lock.release().await.unwrap_err();
    assert_eq!(err.kind(), ErrorKind::NotHeld, "{err}");
    assert!(!err.is_retryable(), "{err}");
}

/// `keep_for` extends the hold and lets go of the guard without releasing: the keys stay
/// for the new lease and refuse everyone; with a majority dead it says the hold was not
/// kept on a quorum, and still releases nothing.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn keep_for_holds_the_lock_past_the_guard_and_says_whether_a_quorum_kept_it() {
    let mut cluster = common::cluster(3);
    let rl = common::client(&cluster);
    let lock = rl.try_lock("kept").ttl(Duration::from_secs(2)).await.unwrap();
    let token = lock.token().to_owned();
    assert!(common::eventually(Duration::from_secs(1), || cluster.count_key("kept") == 3).await);
    lock.keep_for(Duration::from_secs(30)).await.unwrap();
    // Decided at two of three nodes: the third may still be running the extension.
    let kept = || cluster.pttls("kept").unwrap().iter().all(|t| t.is_some_and(|t| t > 20_000));
    assert!(
        common::eventually(Duration::from_secs(2), kept).await,
        "kept for the new lease: {:?}",
        cluster.pttls("kept")
    );
    // Well past the grant's own lease: still held for the same token, and refused to all.
    tokio::time::sleep(Duration::from_millis(2500)).await;
    assert_eq!(cluster.nodes_holding("kept", &token).len(), 3);
    let err = rl.try_lock("kept").await.unwrap_err();
    assert_eq!(err.kind(), ErrorKind::NotAcquired, "{err}");

    let lock = rl.try_lock("job").await.unwrap();
    assert!(common::eventually(Duration::from_secs(1), || cluster.count_key("job") == 3).await);
    let token = lock.token().to_owned();
    cluster.node_mut(0).kill().unwrap();
    cluster.node_mut(1).kill().unwrap();
    let err = lock.keep_for(Duration::from_secs(30)).await.unwrap_err();
    assert_eq!(err.kind(), ErrorKind::Unavailable, "{err}");
    // Not released: the survivor keeps our key, now for the longer lease.
    tokio::time::sleep(Duration::from_millis(300)).await;
    assert_eq!(cluster.node(2).get("job").unwrap().as_deref(), Some(token.as_str()));
    assert!(cluster.node(2).pttl("job").unwrap() > 20_000);
}

/// How many rounds the once-per-schedule checks run (`REDLOCK_ONCE_ROUNDS`; 3 in CI).
fn once_rounds() -> usize {
    std::env::var("REDLOCK_ONCE_ROUNDS").ok().and_then(|n| n.parse().ok()).unwrap_or(3)
}

/// One machine of a once-per-schedule job: its own client, the default retry (a few
/// attempts, which also pulls synchronised starters out of a split vote), the job, then
/// `keep_for` on success and `release` on failure. Whether it ran the job, and how.
async fn once_machine(
    urls: Vec<String>,
    resource: String,
    retry: redlock::Retry,
    job: impl std::future::Future<Output = bool>,
    keep: Duration,
) -> Option<bool> {
    let rl = common::retrying(urls, Duration::from_millis(200), retry);
    let lock = match rl.lock(&resource).await {
        Ok(lock) => lock,
        Err(err) => {
            assert_eq!(err.kind(), ErrorKind::NotAcquired, "{err}");
            return None;
        }
    };
    let succeeded = job.await;
    if succeeded {
        lock.keep_for(keep).await.unwrap();
    } else {
        lock.release().await.unwrap();
    }
    rl.shutdown(Duration::from_secs(5)).await.unwrap();
    Some(succeeded)
}

/// The "run once per schedule" recipe: three machines started together, one waiting
/// (for less than the keep), and one started a second after the job finished; in every
/// round the job ran exactly once. With the job failing on its first run, the failure is
/// released and another machine runs it (once): the waiter, or the late machine where the
/// waiter was the one that failed.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_job_kept_after_success_runs_once_per_round_and_a_failed_one_is_run_by_another_machine() {
    use std::sync::Arc;
    use std::sync::atomic::{AtomicUsize, Ordering};
    let cluster = common::cluster(3);
    let keep = Duration::from_secs(6);
    // A few attempts: the keep (6 s) is shorter than the default wait (one 10 s TTL), which
    // would outlast it.
    let starter = redlock::Retry::new().with_max_attempts(3);
    let waiter = redlock::Retry::new()
        .with_unbounded_attempts()
        .with_delay(Duration::from_millis(50))
        .with_jitter(Duration::from_millis(100))
        .with_max_wait(Duration::from_secs(2));
    for round in 0..once_rounds() {
        for fails_first in [false, true] {
            let resource = format!("draw-{round}-{fails_first}");
            let (runs, failures) = (Arc::new(AtomicUsize::new(0)), Arc::new(AtomicUsize::new(0)));
            let job = || {
                let (runs, failures) = (runs.clone(), failures.clone());
                async move {
                    tokio::time::sleep(Duration::from_millis(200)).await;
                    if fails_first && failures.fetch_add(1, Ordering::SeqCst) == 0 {
                        return false;
                    }
                    runs.fetch_add(1, Ordering::SeqCst);
                    true
                }
            };
            let mut machines = Vec::new();
            for retry in [starter, starter, starter, waiter] {
                let urls = cluster.urls();
                machines.push(tokio::spawn(once_machine(
                    urls,
                    resource.clone(),
                    retry,
                    job(),
                    keep,
                )));
            }
            let mut outcomes = Vec::new();
            for machine in machines {
                outcomes.push(machine.await.unwrap());
            }
            tokio::time::sleep(Duration::from_secs(1)).await;
            let late = once_machine(cluster.urls(), resource.clone(), starter, job(), keep).await;
            // Where the waiter got in first and failed, the starters had given up: the late
            // machine is the other machine that runs it.
            if !fails_first {
                assert_eq!(
                    late, None,
                    "round {round}: the late machine ran it again: {outcomes:?}"
                );
            }
            outcomes.push(late);
            assert_eq!(
                runs.load(Ordering::SeqCst),
                1,
                "round {round} ({fails_first}): {outcomes:?}"
            );
            let failed = outcomes.iter().filter(|o| **o == Some(false)).count();
            assert_eq!(failed, usize::from(fails_first), "round {round}: {outcomes:?}");
        }
    }
}

/// A guard whose keys were replaced by another owner's on every node while its validity
/// still runs (a forced release, then a new holder): `keep_for` asks the nodes, reports the
/// hold gone, and the new owner's key keeps its own value and lease.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn keep_for_after_the_lock_passed_to_another_owner_fails_and_leaves_the_owners_lease() {
    let cluster = common::cluster(3);
    let rl = common::builder(&cluster, Duration::from_millis(200))
        .ttl(Duration::from_secs(10))
        .build()
        .unwrap();
    common::warm(&rl).await;
    let lock = rl.try_lock("k").await.unwrap();
    for i in 0..3 {
        cluster.node(i).command(&["SET", "k", "other", "PX", "5000"]).unwrap();
    }
    let err = lock.keep_for(Duration::from_secs(60)).await.unwrap_err();
    assert_eq!(err.kind(), ErrorKind::NotHeld, "{err}");
    for i in 0..3 {
        let node = cluster.node(i);
        assert_eq!(node.get("k").unwrap().as_deref(), Some("other"));
        assert!(node.pttl("k").unwrap() <= 5000, "the other owner's lease was extended");
    }
}

// A failed extension shortens nothing.

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
/// 4. t=2.65 s: B is granted the lock while A's `Lease::is_valid()` is still true and its
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
    assert!(lease.is_valid(), "A's lease is still held by its own account");
    let second = b.try_lock("k").await;
    let a_still_held = lease.is_valid();
    assert!(
        second.is_err() || !a_still_held,
        "B was granted the lock while A's lease is held for another {:?} (lost() not fired)",
        lease.validity()
    );
    drop(auto);
}

/// An extension that reaches a node after the hold's release there (its connection slowed)
/// finds the key gone and sets nothing: the released key does not come back for the new
/// lease, for the plain, multi-resource and counting locks.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn an_extension_landing_after_the_release_brings_no_key_back() {
    let faulty = FaultyCluster::start(3).unwrap();
    let rl = common::retrying(faulty.urls(), Duration::from_secs(2), Retry::never());
    common::warm(&rl).await;
    let delay = NetFault::Latency { fixed: Duration::from_millis(300), jitter: Duration::ZERO };
    // Each hold: taken on every node, then its key removed on node 2 as a release would, then
    // extended with node 2's link slowed: the extension lands there on an absent key.
    let plain = rl.try_lock("p").await.unwrap();
    let multi = rl.many(&["{m}1", "{m}2"]).once().await.unwrap();
    let permit = rl.semaphore("s", 2).once().await.unwrap();
    let slot = permit.key().to_owned();
    let keys = ["p", "{m}1", "{m}2", slot.as_str()];
    let held = || keys.iter().all(|key| faulty.cluster().count_key(key) == 3);
    assert!(common::eventually(Duration::from_secs(2), held).await, "staged on every node");
    for key in keys {
        faulty.cluster().node(2).command(&["DEL", key]).unwrap();
    }
    faulty.proxy(2).set_fault(delay);
    let (mut plain, mut multi, mut permit) = (plain, multi, permit);
    plain.extend(Duration::from_secs(30)).await.unwrap();
    multi.extend(Duration::from_secs(30)).await.unwrap();
    permit.extend(Duration::from_secs(30)).await.unwrap();
    tokio::time::sleep(Duration::from_millis(900)).await;
    faulty.proxy(2).heal();
    for key in keys {
        assert_eq!(faulty.cluster().node(2).pttl(key).unwrap(), -2, "{key} came back on node 2");
    }
    plain.release().await.unwrap();
    multi.release().await.unwrap();
    permit.release().await.unwrap();
}
