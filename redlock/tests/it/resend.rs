//! Requests sent again after a lost connection: a release is re-sent a few times at once
//! (~0.26 s), nothing more, so a node killed behind a proxy, or resetting forever, holds up
//! neither a release with a quorum nor `shutdown` past its deadline; a re-send never removes
//! another owner's hold nor the same client's next one, never hides a hold lost before it,
//! and a re-sent read acquisition leaves no share behind. Known limits are ignored tests.

use crate::common;

use std::sync::Arc;
use std::time::{Duration, Instant};

use redlock::{ErrorKind, NodeOutcome, Redlock, Retry};
use redlock_testkit::{Cluster, Fault, FaultyCluster, Fuzz, NetFault, NodeConfig, Persistence};

const LEASE: Duration = Duration::from_secs(10);

const NODE_TIMEOUT: Duration = Duration::from_millis(250);

fn client(urls: Vec<String>) -> Redlock {
    common::builder_for(urls, NODE_TIMEOUT).ttl(LEASE).build().unwrap()
}

async fn sleep_ms(ms: u64) {
    tokio::time::sleep(Duration::from_millis(ms)).await;
}

// ---------------------------------------------------------------------------------------
// Liveness: dead nodes.
// ---------------------------------------------------------------------------------------

/// Node 2's process is killed but its proxy still listens, accepting each connection and
/// closing it (what HAProxy, Envoy, twemproxy or a cloud LB do when the backend is gone):
/// the client never sees `ECONNREFUSED`. The release gives up after its quick re-sends,
/// and a shutdown reports it at once instead of waiting out its `within`: `Ok`, since the
/// hold was released on a quorum, with node 2 unconfirmed.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_killed_node_behind_a_proxy_does_not_hold_up_shutdown() {
    let mut faulty = FaultyCluster::start(3).unwrap();
    let rl = client(faulty.urls());
    common::warm(&rl).await;
    let lock = rl.try_lock("dead-behind-proxy").await.unwrap();
    // Staging: node 2 holds the lock (a round is decided by the first two nodes), so its
    // release has something to undo there, and is sent again.
    common::held_on(faulty.cluster(), "dead-behind-proxy", lock.token(), &[2]).await;
    faulty.inject(Fault::Kill, &[2]).unwrap();
    lock.release().await.unwrap();
    let started = Instant::now();
    let result = rl.shutdown(Duration::from_secs(2)).await;
    let took = started.elapsed();
    assert!(took < Duration::from_millis(800), "shutdown took {took:?}: {result:?}");
    let report = result.unwrap();
    let unconfirmed: Vec<&str> = report.unconfirmed().map(|node| node.node()).collect();
    assert_eq!(unconfirmed, [report.nodes()[2].node()], "{report}");
}

/// Node 2 (AOF, fsync always) is killed before the release: its release meets refused
/// connects and is sent again from the background; the node comes back with its data, the
/// released key included, and the next send removes it.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_node_killed_before_a_release_and_restarted_with_its_data_loses_the_released_key() {
    let config = NodeConfig::new().persistence(Persistence::AppendFsyncAlways);
    let mut cluster = Cluster::start_with(3, config).unwrap();
    let rl = client(cluster.urls());
    common::warm(&rl).await;
    let lock = rl.try_lock("persisted").await.unwrap();
    let token = lock.token().to_owned();
    let everywhere = || cluster.nodes_holding("persisted", &token).len() == 3;
    assert!(common::eventually(Duration::from_secs(2), everywhere).await);
    cluster.node_mut(2).kill().unwrap();
    lock.release().await.unwrap();
    cluster.node_mut(2).start_again().unwrap();
    // The client may talk to the node again meanwhile (its connection is replaced).
    rl.try_lock("other").await.unwrap().release().await.unwrap();
    let gone = || cluster.count_key("persisted") == 0;
    assert!(
        common::eventually(Duration::from_millis(2500), gone).await,
        "the released key came back with node 2 and stays for {} ms more",
        cluster.node(2).pttl("persisted").unwrap()
    );
}

// ---------------------------------------------------------------------------------------
// Liveness: a node that resets forever.
// ---------------------------------------------------------------------------------------

/// Node 4 resets every connection for good: releases and acquisitions of
/// other keys return at the quorum, and shutdown keeps its deadline (naming node 4).
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_node_resetting_forever_holds_up_nothing_beyond_shutdowns_deadline() {
    let faulty = FaultyCluster::start(5).unwrap();
    let rl = client(faulty.urls());
    common::warm(&rl).await;
    // Set on node 4 before its resets begin: its release there is sent again until
    // shutdown. (A hold taken after them may never have reached node 4, whose undo then
    // has nothing to wait for.)
    let reached = rl.try_lock("forever:reached").await.unwrap();
    // Staging: node 4 answered (a round is decided by the first three of five).
    common::held_on(faulty.cluster(), "forever:reached", reached.token(), &[4]).await;
    faulty.proxy(4).set_fault(NetFault::Reset);
    reached.release().await.unwrap();
    let mut slowest = Duration::ZERO;
    for i in 0..20 {
        let key = format!("forever:{i}");
        let started = Instant::now();
        let lock = rl.try_lock(&key).await.unwrap();
        lock.release().await.unwrap();
        slowest = slowest.max(started.elapsed());
    }
    assert!(slowest < Duration::from_millis(300), "a lock+release took {slowest:?}");
    let started = Instant::now();
    // Released on a quorum: `Ok`, naming node 4.
    let report = rl.shutdown(Duration::from_millis(500)).await.unwrap();
    let took = started.elapsed();
    assert!(took < Duration::from_millis(900), "shutdown took {took:?}: {report}");
    let unconfirmed: Vec<usize> = (report.nodes().iter().enumerate())
        .filter(|(_, node)| *node.outcome() != NodeOutcome::Ok)
        .map(|(i, _)| i)
        .collect();
    assert_eq!(unconfirmed, [4], "{report}");
}

/// 150 locks released while node 4 resets for 1.2 s, longer than the releases' quick
/// re-sends: the background sends them again, their keys go once the node heals, and
/// nothing is left to wait for at shutdown.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn many_releases_in_one_long_reset_all_land_and_end() {
    let faulty = Arc::new(FaultyCluster::start(5).unwrap());
    let rl = client(faulty.urls());
    common::warm(&rl).await;
    let mut locks = Vec::new();
    for i in 0..150 {
        locks.push(rl.try_lock(&format!("many:{i}")).await.unwrap());
    }
    assert!(
        common::eventually(Duration::from_secs(3), || faulty
            .cluster()
            .keys_everywhere("many:*")
            .unwrap()
            == 750)
        .await
    );
    faulty.proxy(4).set_fault(NetFault::Reset);
    let mut set = tokio::task::JoinSet::new();
    for lock in locks {
        set.spawn(async move { lock.release().await });
    }
    while let Some(result) = set.join_next().await {
        result.unwrap().unwrap();
    }
    sleep_ms(1200).await;
    faulty.proxy(4).heal();
    let gone = || faulty.cluster().keys_everywhere("many:*").unwrap() == 0;
    assert!(
        common::eventually(Duration::from_millis(2500), gone).await,
        "{} keys left",
        faulty.cluster().keys_everywhere("many:*").unwrap()
    );
    // A release that landed while its answer was lost to a reset is answered at its next
    // send, after a pause of at most a second (`RESEND_MAX`) and, the node back, a connect:
    // until then a shutdown names the node rather than wait for it.
    sleep_ms(2500).await;
    let started = Instant::now();
    rl.shutdown(Duration::from_secs(2)).await.unwrap();
    assert!(started.elapsed() < Duration::from_millis(300), "background still busy");
}

/// A release after shutdown, with node 4 resetting: no panic, returns at the quorum.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_release_after_shutdown_on_a_resetting_node_returns() {
    let faulty = FaultyCluster::start(5).unwrap();
    let rl = client(faulty.urls());
    let lock = rl.try_lock("after-shutdown").await.unwrap();
    // Staging: node 4 answered the acquisition (a round is decided by the first three of
    // five). One still under way when the resets begin would leave its clean-up there for
    // the shutdown to wait for and name.
    common::held_on(faulty.cluster(), "after-shutdown", lock.token(), &[4]).await;
    faulty.proxy(4).set_fault(NetFault::Reset);
    rl.shutdown(Duration::from_millis(200)).await.unwrap();
    let started = Instant::now();
    lock.release().await.unwrap();
    assert!(started.elapsed() < Duration::from_millis(300));
    faulty.proxy(4).heal();
    let gone = || faulty.cluster().count_key("after-shutdown") == 0;
    assert!(common::eventually(Duration::from_secs(2), gone).await);
}

// ---------------------------------------------------------------------------------------
// Safety: re-sends against other holds.
// ---------------------------------------------------------------------------------------

/// Two clients, each with its own proxies. Client A's connection to node 2 resets while A
/// releases; A's stale key on node 2 goes (simulated expiry), client B takes the key on
/// every node, then A's proxy heals: B's hold must stay.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_background_re_send_spares_another_owners_plain_hold() {
    let faulty = FaultyCluster::start_for_clients(3, 2, NodeConfig::new()).unwrap();
    let (a, b) = (client(faulty.urls_for(0)), client(faulty.urls_for(1)));
    common::warm(&a).await;
    let lock = a.try_lock("plain").await.unwrap();
    let ta = lock.token().to_owned();
    assert!(
        common::eventually(Duration::from_secs(2), || faulty
            .cluster()
            .nodes_holding("plain", &ta)
            .len()
            == 3)
        .await
    );
    faulty.client_proxy(0, 2).set_fault(NetFault::Reset);
    lock.release().await.unwrap();
    sleep_ms(500).await;
    faulty.cluster().node(2).command(&["DEL", "plain"]).unwrap();
    let held = b.try_lock("plain").await.unwrap();
    let tb = held.token().to_owned();
    assert!(
        common::eventually(Duration::from_secs(2), || faulty
            .cluster()
            .nodes_holding("plain", &tb)
            .len()
            == 3)
        .await
    );
    faulty.client_proxy(0, 2).heal();
    sleep_ms(1500).await;
    assert_eq!(faulty.cluster().nodes_holding("plain", &tb), vec![0, 1, 2]);
    held.release().await.unwrap();
}

/// A forced release whose send to node 2 is lost to a reset is not sent again, from the
/// background either: B's later hold there survives A's proxy healing.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_forced_release_lost_to_a_reset_is_not_sent_again() {
    let faulty = FaultyCluster::start_for_clients(3, 2, NodeConfig::new()).unwrap();
    let (a, b) = (client(faulty.urls_for(0)), client(faulty.urls_for(1)));
    common::warm(&a).await;
    let lock = a.try_lock("forced").await.unwrap();
    let ta = lock.token().to_owned();
    assert!(
        common::eventually(Duration::from_secs(2), || faulty
            .cluster()
            .nodes_holding("forced", &ta)
            .len()
            == 3)
        .await
    );
    faulty.client_proxy(0, 2).set_fault(NetFault::Reset);
    let _ = a.force_release("forced").await;
    drop(lock);
    sleep_ms(300).await;
    faulty.cluster().node(2).command(&["DEL", "forced"]).unwrap();
    let held = b.try_lock("forced").await.unwrap();
    let tb = held.token().to_owned();
    assert!(
        common::eventually(Duration::from_secs(2), || faulty
            .cluster()
            .nodes_holding("forced", &tb)
            .len()
            == 3)
        .await
    );
    faulty.client_proxy(0, 2).heal();
    sleep_ms(1500).await;
    assert_eq!(faulty.cluster().nodes_holding("forced", &tb), vec![0, 1, 2]);
}

// A release sent again after its connection was lost.

/// Heals `client`'s proxy to `node` `ms` from now, from another thread.
fn heal_after(
    faulty: &Arc<FaultyCluster>,
    client: usize,
    node: usize,
    ms: u64,
) -> std::thread::JoinHandle<()> {
    let faulty = faulty.clone();
    std::thread::spawn(move || {
        std::thread::sleep(Duration::from_millis(ms));
        faulty.client_proxy(client, node).heal();
    })
}

/// Swallows every reply of the proxy (and closes its connection): a command that went
/// out runs, but its caller sees its connection drop.
fn drop_replies() -> NetFault {
    NetFault::Fuzz(Fuzz::new(7).with_drop_reply(1.0))
}

/// Nodes 1 and 2 lose the hold (deleted behind the client's back: what a restart without
/// persistence, an eviction or an operator's forced release does), and their proxies
/// reset every connection. A check finds the client's connections there broken and drops
/// them; the release then cannot even open a connection to either node (nothing was sent),
/// until the proxies heal 30 ms in, and its later try finds the key absent. Two of three
/// nodes no longer had the hold before the release: the release must not say `Ok`. The
/// later try's "absent" cannot mean "removed by an earlier send of this request", since
/// every earlier send failed before a connection existed.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_release_whose_sends_never_left_the_client_does_not_hide_a_lost_hold() {
    let faulty = Arc::new(FaultyCluster::start(3).unwrap());
    let rl =
        common::builder_for(faulty.urls(), Duration::from_millis(250)).ttl(LEASE).build().unwrap();
    common::warm(&rl).await;
    let lock = rl.try_lock("lost").await.unwrap();
    let everywhere = || faulty.cluster().nodes_holding("lost", lock.token()).len() == 3;
    assert!(common::eventually(Duration::from_secs(2), everywhere).await);
    for i in [1, 2] {
        common::run(faulty.cluster(), i, &["DEL", "lost"]);
        faulty.proxy(i).set_fault(NetFault::Reset);
    }
    // Finds the connections to nodes 1 and 2 broken: they are dropped, none is open now.
    let _ = lock.check_held().await;
    let healers = [heal_after(&faulty, 0, 1, 30), heal_after(&faulty, 0, 2, 30)];
    let result = lock.release().await;
    for healer in healers {
        healer.join().unwrap();
    }
    let err = result.expect_err(
        "release() said Ok (held until this call) although the hold was gone from nodes 1 \
         and 2 before any of its sends could reach them",
    );
    assert_eq!(err.kind(), ErrorKind::NotHeld, "{err}");
}

/// Clients A and B, each through its own proxies to the three nodes, connections open.
async fn two_warm_clients(faulty: &FaultyCluster) -> [redlock::Redlock; 2] {
    let clients = [0, 1].map(|client| {
        common::builder_for(faulty.urls_for(client), Duration::from_millis(250))
            .ttl(LEASE)
            .build()
            .unwrap()
    });
    for rl in &clients {
        common::warm(rl).await;
    }
    clients
}

/// Client A's release runs on node 2 but its reply is lost (and every later reply of A's
/// proxy there, until it heals 150 ms in): A keeps sending it. Meanwhile client B takes
/// the key on every node. A's re-sent release must leave B's hold alone (compare by token).
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_re_sent_release_leaves_the_next_owners_hold_alone() {
    let faulty = Arc::new(FaultyCluster::start_for_clients(3, 2, NodeConfig::new()).unwrap());
    let [a, b] = two_warm_clients(&faulty).await;
    for round in 0..3 {
        let key = format!("next:{round}");
        let lock = a.try_lock(&key).await.unwrap();
        let everywhere = || faulty.cluster().nodes_holding(&key, lock.token()).len() == 3;
        assert!(common::eventually(Duration::from_secs(2), everywhere).await);
        faulty.client_proxy(0, 2).set_fault(drop_replies());
        let healer = heal_after(&faulty, 0, 2, 150);
        lock.release().await.unwrap();
        // The first send ran on node 2: the key is free there for B.
        let gone = || faulty.cluster().count_key(&key) == 0;
        assert!(common::eventually(Duration::from_secs(1), gone).await, "round {round}");
        let next = b.try_lock(&key).await.unwrap();
        let b_everywhere = || faulty.cluster().nodes_holding(&key, next.token()).len() == 3;
        assert!(common::eventually(Duration::from_secs(1), b_everywhere).await, "round {round}");
        healer.join().unwrap();
        // A's last try (about 260 ms after the first) has run by now.
        tokio::time::sleep(Duration::from_millis(700)).await;
        assert_eq!(
            faulty.cluster().nodes_holding(&key, next.token()),
            vec![0, 1, 2],
            "round {round}: a re-sent release of A removed B's hold"
        );
        next.release().await.unwrap();
    }
}

/// The same with a reentrant lock and one owner id on two clients: A's re-sent release of
/// its hold removes that hold only, never B's hold of the same owner.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_re_sent_reentrant_release_leaves_another_hold_of_the_owner_alone() {
    let faulty = Arc::new(FaultyCluster::start_for_clients(3, 2, NodeConfig::new()).unwrap());
    let [a, b] = two_warm_clients(&faulty).await;
    let hold = a.reentrant("re", "job:1").await.unwrap();
    let field = hold.field().to_owned();
    let has = |field: &str| {
        let fields = faulty.cluster().hash_fields("re").unwrap();
        (0..3).filter(|&i| fields[i].as_ref().is_some_and(|f| f.contains_key(field))).count()
    };
    assert!(common::eventually(Duration::from_secs(2), || has(&field) == 3).await);
    faulty.client_proxy(0, 2).set_fault(drop_replies());
    let healer = heal_after(&faulty, 0, 2, 150);
    hold.release().await.unwrap();
    let other = b.reentrant("re", "job:1").await.unwrap();
    let other_field = other.field().to_owned();
    assert!(common::eventually(Duration::from_secs(1), || has(&other_field) == 3).await);
    healer.join().unwrap();
    tokio::time::sleep(Duration::from_millis(700)).await;
    assert_eq!(has(&field), 0, "A's hold is left");
    assert_eq!(has(&other_field), 3, "A's re-sent release removed B's hold of the same owner");
    other.release().await.unwrap();
}

/// The same client takes the key again while its release is being re-sent on node 2: the
/// new acquisition goes out at once (naming the released token as abandoned), and the
/// release's re-sends never remove the new hold wherever it was granted.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_clients_next_hold_survives_its_re_sent_release() {
    let faulty = Arc::new(FaultyCluster::start(3).unwrap());
    let rl =
        common::builder_for(faulty.urls(), Duration::from_millis(500)).ttl(LEASE).build().unwrap();
    common::warm(&rl).await;
    for round in 0..3 {
        let key = format!("again:{round}");
        let lock = rl.try_lock(&key).await.unwrap();
        let everywhere = || faulty.cluster().nodes_holding(&key, lock.token()).len() == 3;
        assert!(common::eventually(Duration::from_secs(2), everywhere).await);
        let lock_token = &lock.token().to_owned();
        faulty.proxy(2).set_fault(drop_replies());
        let healer = heal_after(&faulty, 0, 2, 40);
        lock.release().await.unwrap();
        let next = rl.try_lock(&key).await.unwrap();
        healer.join().unwrap();
        let granted = faulty.cluster().nodes_holding(&key, next.token());
        assert!(granted.len() >= 2, "round {round}: the next hold is on {granted:?} only");
        // The release's re-sends to node 2 go on meanwhile, and end.
        tokio::time::sleep(Duration::from_millis(1500)).await;
        let left = faulty.cluster().nodes_holding(&key, next.token());
        assert!(
            granted.iter().all(|i| left.contains(i)),
            "round {round}: the release's re-sends removed the next hold from {granted:?}: {left:?}"
        );
        assert!(faulty.cluster().nodes_holding(&key, lock_token).is_empty());
        next.release().await.unwrap();
    }
}

/// A node whose proxy resets every connection for good: the release returns at the quorum
/// (the node's tries go on in the background), and the key is gone from the other nodes.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_node_that_always_resets_does_not_hold_up_a_release_with_a_quorum() {
    let faulty = FaultyCluster::start(3).unwrap();
    let rl =
        common::builder_for(faulty.urls(), Duration::from_millis(250)).ttl(LEASE).build().unwrap();
    common::warm(&rl).await;
    let lock = rl.try_lock("stuck").await.unwrap();
    // Staging: node 2 holds the lock (a round is decided by the first two nodes), so its
    // release has something to remove there and is tried again in the background.
    common::held_on(faulty.cluster(), "stuck", lock.token(), &[2]).await;
    faulty.proxy(2).set_fault(NetFault::Reset);
    let started = Instant::now();
    lock.release().await.unwrap();
    let took = started.elapsed();
    assert!(took < Duration::from_millis(200), "the release took {took:?}");
    // The background tries go on (until the lease's end): shutdown names the node rather
    // than wait for them, as unreachable (reset), and says `Ok`: released on a quorum.
    let started = Instant::now();
    let report = rl.shutdown(Duration::from_secs(3)).await.unwrap();
    assert!(matches!(report.nodes()[2].outcome(), NodeOutcome::Unreachable(_)), "{report}");
    assert_eq!(report.unconfirmed().count(), 1, "{report}");
    assert!(started.elapsed() < Duration::from_secs(1), "shutdown waited for the re-sends");
    let left = faulty.cluster().nodes_with_key("stuck").unwrap();
    assert!(left.is_empty() || left == vec![2], "the key is left on {left:?}");
}

/// The ordering's limit (`guide::order`), on a real node: node 2 is paused (SIGSTOP) with
/// the acquisition in its socket buffer; its proxy resets the connection, so the
/// acquisition's reply is lost, and the release goes out on a new connection once the proxy
/// heals. The node resumes and may run the two in either order: where the acquisition runs
/// last, its key stays, with the released hold's token, until its own lease ends. It never
/// makes two holders: another client is granted on the other nodes at once, and node 2
/// refuses it only until that lease ends.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn an_acquisition_a_paused_node_runs_after_its_release_keeps_only_its_own_lease() {
    let mut faulty = FaultyCluster::start(3).unwrap();
    let rl =
        common::builder_for(faulty.urls(), Duration::from_millis(600)).ttl(LEASE).build().unwrap();
    let other = common::builder_for(faulty.urls(), Duration::from_millis(600)).build().unwrap();
    common::warm(&rl).await;
    common::warm(&other).await;
    for round in 0..3 {
        let key = format!("paused:{round}");
        faulty.cluster_mut().node_mut(2).pause().unwrap();
        let started = Instant::now();
        let lock = rl.try_lock(&key).await.unwrap();
        let token = lock.token().to_owned();
        // The SET on node 2 is written to the paused node's socket.
        tokio::time::sleep(Duration::from_millis(30)).await;
        faulty.proxy(2).set_fault(NetFault::Reset);
        tokio::time::sleep(Duration::from_millis(20)).await;
        lock.release().await.unwrap();
        tokio::time::sleep(Duration::from_millis(5)).await;
        faulty.proxy(2).heal();
        tokio::time::sleep(Duration::from_millis(100)).await;
        faulty.cluster_mut().node_mut(2).resume().unwrap();
        tokio::time::sleep(Duration::from_millis(300)).await;
        // Whatever node 2 ran last: at most the released hold's own key, within its lease.
        let left = faulty.cluster().node(2).get(&key).unwrap();
        assert!(left.is_none() || left.as_deref() == Some(token.as_str()), "{left:?}");
        let pttl = faulty.cluster().node(2).pttl(&key).unwrap();
        let lease_left = LEASE.saturating_sub(started.elapsed()).as_millis();
        assert!(i128::from(pttl) <= i128::try_from(lease_left).unwrap(), "pttl {pttl} ms");
        // Never two holders: the other client is granted on nodes 0 and 1 now.
        let next = other.try_lock(&key).await.unwrap();
        assert!(faulty.cluster().nodes_holding(&key, next.token()).len() >= 2, "round {round}");
        next.release().await.unwrap();
        common::run(faulty.cluster(), 2, &["DEL", &key]);
    }
}

/// The release is cancelled while nodes 1 and 2 wait between tries (it cannot reach the
/// quorum before they heal): the dropped lock is released again from the client's own
/// thread, queued behind the cancelled tries, and the key goes from every node.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_release_cancelled_between_tries_is_finished_by_the_drop() {
    let faulty = Arc::new(FaultyCluster::start(3).unwrap());
    let rl =
        common::builder_for(faulty.urls(), Duration::from_millis(250)).ttl(LEASE).build().unwrap();
    common::warm(&rl).await;
    for round in 0..3 {
        let key = format!("cancel:{round}");
        let lock = rl.try_lock(&key).await.unwrap();
        let everywhere = || faulty.cluster().nodes_holding(&key, lock.token()).len() == 3;
        assert!(common::eventually(Duration::from_secs(2), everywhere).await);
        for i in [1, 2] {
            faulty.proxy(i).set_fault(NetFault::Reset);
        }
        let healers = [heal_after(&faulty, 0, 1, 80), heal_after(&faulty, 0, 2, 80)];
        let cut = tokio::time::timeout(Duration::from_millis(30), lock.release()).await;
        assert!(cut.is_err(), "round {round}: the release reached a quorum through resets");
        for healer in healers {
            healer.join().unwrap();
        }
        let gone = || faulty.cluster().count_key(&key) == 0;
        assert!(
            common::eventually(Duration::from_secs(3), gone).await,
            "round {round}: the key stays on nodes {:?}",
            faulty.cluster().nodes_with_key(&key).unwrap()
        );
    }
}

// A read acquisition that lands twice.

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
    cluster.client_proxy(0, 2).heal();
    cluster.client_proxy(0, 2).reset_connections();

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

/// A release's first send runs on the node and its reply is lost; its send again goes out
/// at once, but the node runs it only 3 s later (held by the proxy), and the caller's
/// runtime is blocked meanwhile (a current-thread runtime busy in synchronous work), so
/// that the request's node timeout is not noticed before its reply is there. The late send
/// finds nothing, since the first send removed the hold: a release sent again counts as
/// done, and must not say `NotHeld`.
#[tokio::test]
async fn a_re_sent_release_whose_reply_comes_late_does_not_say_not_held() {
    let faulty = Arc::new(FaultyCluster::start(1).unwrap());
    let rl = common::builder_for(faulty.urls(), Duration::from_millis(500))
        .connect_timeout(Duration::from_millis(200))
        .ttl(LEASE)
        .build()
        .unwrap();
    common::warm(&rl).await;
    let lock = rl.try_lock("late-answer").await.unwrap();
    faulty.proxy(0).set_fault(drop_replies());
    let proxy = faulty.clone();
    let healer = std::thread::spawn(move || {
        std::thread::sleep(Duration::from_millis(30));
        proxy.proxy(0).hold_requests_containing(b"late-answer", Duration::from_secs(3));
        proxy.proxy(0).heal();
    });
    // Blocks this runtime from 300 ms on, past the held send's run.
    let blocker = tokio::spawn(async {
        tokio::time::sleep(Duration::from_millis(300)).await;
        std::thread::sleep(Duration::from_millis(3500));
    });
    let result = lock.release().await;
    healer.join().unwrap();
    blocker.await.unwrap();
    assert!(
        faulty.cluster().node(0).get("late-answer").unwrap().is_none(),
        "the premise: the release removed the hold"
    );
    if let Err(err) = result {
        assert_ne!(err.kind(), ErrorKind::NotHeld, "{err}");
    }
}
