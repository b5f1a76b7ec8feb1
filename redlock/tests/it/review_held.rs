//! Review: attacks that held up (kept as regression tests). Each test names the
//! interleaving it drives on real nodes.

use crate::common;

use std::time::Duration;

use redlock::{ErrorKind, Redlock, Retry};
use redlock_testkit::{Cluster, FaultyCluster, NetFault};

fn field_prefixes(cluster: &Cluster, key: &str) -> Vec<String> {
    let mut out = Vec::new();
    for i in 0..cluster.len() {
        if let Ok(map) = cluster.node(i).hgetall(key) {
            out.extend(map.into_keys().map(|f| format!("{i}:{}", &f[..2])));
        }
    }
    out
}

/// Cancels acquisitions at every offset from 0 to ~120 ms (each node 10-20 ms away each
/// way, so the cancellation hits the acquisition round, the fencing read and write
/// rounds, the clean-up, the retry pause), then checks that nothing is left: no plain key,
/// no reentrant field, no write grant, no writer intent (only the reader's share that
/// made the writer wait).
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn cancellation_at_any_await_point_leaves_nothing() {
    let cluster = FaultyCluster::start(3).unwrap();
    for i in 0..3 {
        cluster.proxy(i).set_fault(NetFault::Latency {
            fixed: Duration::from_millis(10),
            jitter: Duration::from_millis(10),
        });
    }
    let retry = Retry::new()
        .with_unbounded_attempts()
        .with_delay(Duration::from_millis(20))
        .with_jitter(Duration::from_millis(10))
        .with_max_wait(Duration::from_secs(5));
    let rl = common::retrying(cluster.urls(), Duration::from_millis(300), retry);
    let direct =
        common::retrying(cluster.cluster().urls(), Duration::from_millis(300), Retry::never());
    let reader = direct.read("doc").once().await.unwrap();
    let held = direct.try_lock("busy").await.unwrap();

    for offset_ms in (0..120).step_by(7) {
        let offset = Duration::from_millis(offset_ms);
        let _ = tokio::time::timeout(offset, rl.lock("k").fenced()).await;
        let _ = tokio::time::timeout(offset, rl.reentrant("r", "o")).await;
        let _ = tokio::time::timeout(offset, rl.write("doc")).await;
        let _ = tokio::time::timeout(offset, rl.lock("busy")).await;
        let _ = tokio::time::timeout(offset, rl.many(&["m1", "m2"])).await;
    }
    let nodes = cluster.cluster();
    let clean = || {
        nodes.count_key("k") == 0
            && nodes.count_key("r") == 0
            && nodes.count_key("m1") + nodes.count_key("m2") == 0
            && field_prefixes(nodes, "doc").iter().all(|f| f.ends_with("r:"))
            && nodes.nodes_holding("busy", held.token()).len() == 3
    };
    assert!(
        common::eventually(Duration::from_secs(3), clean).await,
        "left behind: k on {:?}, r on {:?}, doc fields {:?}",
        nodes.nodes_with_key("k").unwrap(),
        nodes.nodes_with_key("r").unwrap(),
        field_prefixes(nodes, "doc")
    );
    reader.release().await.unwrap();
    held.release().await.unwrap();
}

/// A client's own abandoned attempt: its SET sits in a paused node's socket buffer, its
/// clean-up is queued behind it. The next attempt of the same client, made as soon as the
/// foreign holder is gone, waits for that clean-up on that node instead of being refused
/// by its own stale SET, and nothing of the first attempt is left.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn an_abandoned_attempt_on_a_paused_node_does_not_refuse_the_next_one() {
    let mut cluster = common::cluster(3);
    let rl = common::retrying(cluster.urls(), Duration::from_millis(300), Retry::never());
    rl.try_lock("warm").await.unwrap().release().await.unwrap();
    for i in [0, 1] {
        cluster.node(i).set("k", "foreign").unwrap();
    }
    let wake = cluster.node_mut(2).pause_for(Duration::from_millis(400)).unwrap();
    let err = rl.try_lock("k").await.unwrap_err();
    assert_eq!(err.kind(), ErrorKind::NotAcquired, "{err}");
    for i in [0, 1] {
        common::run(&cluster, i, &["DEL", "k"]);
    }
    wake.join().unwrap();
    let lock = rl.try_lock("k").await.unwrap();
    let everywhere = || cluster.nodes_holding("k", lock.token()).len() == 3;
    assert!(common::eventually(Duration::from_secs(1), everywhere).await);
    lock.release().await.unwrap();
    assert!(common::eventually(Duration::from_secs(1), || cluster.count_key("k") == 0).await);
}

/// Extension racing release: an extension still in flight to a slow node when the lock is
/// released. The release is queued behind it on that node, so the slow node ends without
/// the key (the extension's heal does not resurrect it).
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_release_right_after_an_extension_in_flight_leaves_no_key() {
    let cluster = FaultyCluster::start(3).unwrap();
    let rl = common::retrying(cluster.urls(), Duration::from_millis(1000), Retry::never());
    let mut lock = rl.try_lock("k").await.unwrap();
    // The grant returns at the quorum: node 2's SET (its connection perhaps still opening)
    // must have landed first, or it lands after the DEL below, behind the latency, and the
    // release then arrives after the one-second check.
    let everywhere = || cluster.cluster().nodes_holding("k", lock.token()).len() == 3;
    assert!(common::eventually(Duration::from_secs(1), everywhere).await);
    // The key vanishes on node 2, so the late extension there would set it again.
    cluster.cluster().node(2).command(&["DEL", "k"]).unwrap();
    cluster
        .proxy(2)
        .set_fault(NetFault::Latency { fixed: Duration::from_millis(300), jitter: Duration::ZERO });
    lock.extend(Duration::from_secs(20)).await.unwrap();
    lock.release().await.unwrap();
    tokio::time::sleep(Duration::from_millis(1000)).await;
    assert_eq!(cluster.cluster().count_key("k"), 0);
}

/// Fuzzed contention across kinds: three clients, each behind its own fuzzed proxies
/// (random delays, replies swallowed after the command ran, requests reset: re-sends),
/// take fenced write grants and read shares of one resource with short leases, some kept
/// alive by auto-extension. No write overlaps another grant (by the clients' validity
/// windows), and fencing tokens follow grant order.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn fuzzed_readers_and_fenced_writers_keep_exclusion_and_token_order() {
    use redlock_testkit::{Fuzz, Grant, History};
    use std::time::Instant;
    let cluster =
        FaultyCluster::start_for_clients(3, 3, redlock_testkit::NodeConfig::new()).unwrap();
    let seed = Fuzz::seed_from_env_or_random();
    for c in 0..3 {
        let fuzz = Fuzz::new(seed.wrapping_add(c as u64))
            .with_max_delay(Duration::from_millis(4))
            .with_drop_reply(0.03)
            .with_reset_request(0.03);
        cluster.fuzz_client(c, fuzz);
    }
    let history = History::new();
    let end = Instant::now() + Duration::from_secs(5);
    let tasks: Vec<_> = (0..3)
        .map(|c| {
            let retry = Retry::new()
                .with_unbounded_attempts()
                .with_delay(Duration::from_millis(2))
                .with_jitter(Duration::from_millis(5))
                .with_max_wait(Duration::from_secs(1));
            let rl = Redlock::builder()
                .nodes(cluster.urls_for(c))
                .ttl(Duration::from_millis(300))
                .node_timeout(Duration::from_millis(30))
                .retry(retry)
                .build()
                .unwrap();
            let history = history.clone();
            tokio::spawn(async move {
                let mut n = 0usize;
                while Instant::now() < end {
                    n += 1;
                    if n % 3 == c % 3 {
                        let Ok(lock) = rl.write("doc").fenced().await else { continue };
                        let now = Instant::now();
                        let fence = lock.fencing_token().unwrap();
                        let grant =
                            Grant::new(c, lock.token(), now, lock.deadline()).with_fence(fence);
                        let id = history.record(grant);
                        tokio::time::sleep(Duration::from_millis(3)).await;
                        history.released(id, Instant::now());
                        let _ = lock.release().await;
                    } else if n.is_multiple_of(5) {
                        let Ok(lock) = rl.read("doc").await else { continue };
                        let auto = lock.auto_extend();
                        let lease = auto.lease();
                        let now = Instant::now();
                        let id = history.record(Grant::shared(
                            c,
                            lease.token(),
                            now,
                            now + Duration::from_secs(60),
                        ));
                        tokio::select! {
                            () = tokio::time::sleep(Duration::from_millis(250)) => {}
                            _ = lease.lost() => {}
                        }
                        // Held until here only if the lease says so by the clock.
                        let until = if lease.is_held() { Instant::now() } else { lease.deadline() };
                        history.released(id, until);
                        let _ = auto.release().await;
                    } else {
                        let Ok(lock) = rl.read("doc").await else { continue };
                        let now = Instant::now();
                        let id =
                            history.record(Grant::shared(c, lock.token(), now, lock.deadline()));
                        tokio::time::sleep(Duration::from_millis(2)).await;
                        history.released(id, Instant::now());
                        let _ = lock.release().await;
                    }
                }
            })
        })
        .collect();
    for task in tasks {
        task.await.unwrap();
    }
    let grants = history.grants();
    let writes = grants.iter().filter(|g| g.fence.is_some()).count();
    eprintln!("seed {seed}: {} grants, {writes} fenced writes", grants.len());
    let violations = history.violations();
    assert!(
        violations.is_empty(),
        "seed {seed}: {} violations, first {}",
        violations.len(),
        violations[0]
    );
    let fencing = history.fencing_violations();
    assert!(
        fencing.is_empty(),
        "seed {seed}: {} fencing violations, first {}",
        fencing.len(),
        fencing[0]
    );
    assert!(history.len() > 20, "seed {seed}: too few grants ({})", history.len());
}

/// Shutdown while an auto-extended lock and a `with_lock` run: both leases end, the keys
/// are released before `shutdown` returns, `with_lock` does not return `Ok`, and new
/// acquisitions are refused as `Shutdown`.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn shutdown_ends_every_lease_and_releases_before_returning() {
    let cluster = common::cluster(3);
    let rl = common::retrying(cluster.urls(), Duration::from_millis(200), Retry::never());
    let auto = rl.try_lock("a").ttl(Duration::from_millis(600)).await.unwrap().auto_extend();
    let lease = auto.lease();
    let work = tokio::spawn({
        let rl = rl.clone();
        async move {
            rl.with_lock(rl.write("w").ttl(Duration::from_millis(600)), |lease| async move {
                let _ = lease.lost().await;
                tokio::time::sleep(Duration::from_millis(50)).await;
            })
            .await
        }
    });
    tokio::time::sleep(Duration::from_millis(900)).await;
    assert!(lease.is_held());
    rl.shutdown(Duration::from_secs(2)).await.unwrap();
    assert!(lease.is_lost());
    assert_eq!(cluster.count_key("a") + cluster.count_key("w"), 0);
    let res = tokio::time::timeout(Duration::from_secs(2), work).await.unwrap().unwrap();
    assert!(res.is_err(), "with_lock must not report a hold across the shutdown");
    assert_eq!(rl.try_lock("b").await.unwrap_err().kind(), ErrorKind::Shutdown);
    drop(auto);
}
