//! Review findings: requests re-sent after a dropped connection (`Resend::Safe`).
//!
//! A request that ran on the node but whose reply was lost with its connection is sent
//! again on a new connection. The library claims every command is idempotent per hold.
//! `rw_read_acquire.lua` says "Returns 1 when the share is set (or was already: a re-sent
//! request)", but it checks for a waiting writer's intent BEFORE looking for its own share:
//! when an intent arrived between the two sends, the re-sent request answers -2 ("a writer
//! waits"), which the engine counts as `Held`, and a node that answered `Held` gets no
//! clean-up ("ours is not there"). The reader's share stays on that node for its whole
//! lease after the attempt failed: the node refuses every writer meanwhile (and with a
//! few such nodes, writers are refused outright).

use crate::common;

use std::time::{Duration, Instant};

use redlock::{ErrorKind, Retry};
use redlock_testkit::{Cluster, FaultyCluster, NetFault, NodeConfig};

fn fields(cluster: &Cluster, node: usize, key: &str, prefix: &str) -> Vec<String> {
    let Ok(map) = cluster.node(node).hgetall(key) else { return Vec::new() };
    map.into_keys().filter(|f| f.starts_with(prefix)).collect()
}

async fn wait_for(within: Duration, what: &str, mut check: impl FnMut() -> bool) {
    assert!(common::eventually(within, &mut check).await, "timed out waiting for {what}");
}

/// Interleaving (3 nodes; R = reader, client 0; W = writer holding the lock on nodes 0
/// and 1, client 1; V = a waiting writer, client 2):
/// 1. W is granted "doc" on nodes 0 and 1 (node 2 is partitioned from W).
/// 2. R's links: node 2 with 500 ms latency each way, node 1 with 5 s. R tries to read
///    (one attempt): node 0 answers Held at once.
/// 3. R's request reaches node 2 and sets R's share `r:<token>` there (no writer on node
///    2); the reply is on its way back.
/// 4. V starts waiting to write: node 2 refuses it (R's share) and records V's intent.
/// 5. R's connection to node 2 is reset before the reply arrives and healed at once: R
///    reconnects and re-sends the read acquisition; node 2 sees the intent first and
///    answers -2 although R's own share is there.
/// 6. R's round: Held on nodes 0 and 2 -> NotAcquired. Clean-up goes to node 1 only.
///
/// Observed: R's share stays on node 2 for its 10 s lease after R's attempt failed.
/// Fails deterministically (every step is awaited on the nodes' state).
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]

async fn a_resent_read_acquisition_that_lands_twice_leaves_no_share_behind() {
    let cluster = FaultyCluster::start_for_clients(3, 3, NodeConfig::new()).unwrap();
    let nodes = cluster.cluster();
    let r = common::retrying(cluster.urls_for(0), Duration::from_secs(3), Retry::never());
    let w = common::retrying(cluster.urls_for(1), Duration::from_millis(100), Retry::never());
    let v_retry = Retry::new()
        .with_unbounded_attempts()
        .with_delay(Duration::from_millis(200))
        .with_max_wait(Duration::from_secs(3));
    let v = common::retrying(cluster.urls_for(2), Duration::from_millis(200), v_retry);

    // R's connections are warm: a broken one is then "stale" and its request re-sent.
    r.try_lock("warm-up").await.unwrap().release().await.unwrap();
    common::connect_all(&r).await;

    cluster.client_proxy(1, 2).set_fault(NetFault::Blackhole);
    let writer = w.write("doc").once().await.unwrap();
    cluster.client_proxy(1, 2).heal();

    let latency =
        |ms| NetFault::Latency { fixed: Duration::from_millis(ms), jitter: Duration::ZERO };
    cluster.client_proxy(0, 2).set_fault(latency(500));
    cluster.client_proxy(0, 1).set_fault(latency(5000));
    let started = Instant::now();
    let reader = tokio::spawn({
        let r = r.clone();
        async move { r.read("doc").once().await }
    });

    wait_for(Duration::from_secs(2), "R's share on node 2", || {
        !fields(nodes, 2, "doc", "r:").is_empty()
    })
    .await;
    let share = fields(nodes, 2, "doc", "r:").remove(0);
    let waiting_writer = tokio::spawn({
        let v = v.clone();
        async move { v.write("doc").await.map(drop) }
    });
    wait_for(Duration::from_secs(2), "V's intent on node 2", || {
        !fields(nodes, 2, "doc", "i:").is_empty()
    })
    .await;
    assert!(started.elapsed() < Duration::from_millis(950), "too slow: R's reply already came");
    cluster.client_proxy(0, 2).set_fault(NetFault::Reset);
    cluster.client_proxy(0, 2).heal();

    let err = reader.await.unwrap().unwrap_err();
    assert_eq!(err.kind(), ErrorKind::NotAcquired, "{err}");
    waiting_writer.abort();
    writer.release().await.unwrap();

    // Every clean-up has had ample time (node 1's is queued behind a 5 s latency, but node
    // 2 is healthy now).
    tokio::time::sleep(Duration::from_millis(1500)).await;
    assert!(
        !fields(nodes, 2, "doc", "r:").contains(&share),
        "R's attempt failed ({err}) but its share {share} is still on node 2 (pttl {} ms): \
         the re-sent acquisition answered 'a writer waits' for a node that holds R's share",
        nodes.node(2).pttl("doc").unwrap()
    );
}
