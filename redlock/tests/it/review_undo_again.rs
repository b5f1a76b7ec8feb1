//! Review of e1f40a7 (an undo lost with its connection is sent again by its call, up to
//! three more times, 10, 50 and 200 ms apart; an "absent" after a re-send counts as done).
//!
//! - `a_release_whose_sends_never_left_the_client_does_not_hide_a_lost_hold`: failed at
//!   e1f40a7, fixed since. Every send of the release on two nodes of three failed while the connection
//!   was being opened (so none of them can have run), then a later try found the key
//!   absent (gone before the release: a node restarted empty, evicted, force-released). The
//!   reply was still marked re-sent, the absent counted as done, and `release()` reported
//!   `Ok` ("held until this call") for a hold that was gone from a majority.
//! - The others pin rules that hold: a re-sent release never removes another owner's hold
//!   (plain, reentrant of the same owner id), nor the same client's next hold of the key;
//!   a re-send does not overtake the SET a paused node had buffered on the reset
//!   connection; a release cancelled between tries is finished by the drop; a node that
//!   resets every connection for good does not hold a release up beyond the quorum.

use crate::common;

use std::sync::Arc;
use std::time::{Duration, Instant};

use redlock::ErrorKind;
use redlock_testkit::{FaultyCluster, Fuzz, NetFault, NodeConfig};

const LEASE: Duration = Duration::from_secs(10);

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
/// nodes no longer had the hold before the release: the release must not say `Ok`.
///
/// Found at e1f40a7: `release()` returned `Ok(())`, with nodes 1 and 2 reported `ok`, the
/// absent taken for "removed by an earlier send of this request" although every earlier
/// send failed before a connection existed. Now a reply counts as re-sent only when an
/// earlier send was written on a connection that then broke (`Reply::written`).
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_release_whose_sends_never_left_the_client_does_not_hide_a_lost_hold() {
    let faulty = Arc::new(FaultyCluster::start(3).unwrap());
    let rl =
        common::builder_for(faulty.urls(), Duration::from_millis(250)).ttl(LEASE).build().unwrap();
    rl.try_lock("warm").await.unwrap().release().await.unwrap();
    let lock = rl.try_lock("lost").await.unwrap();
    let everywhere = || faulty.cluster().nodes_holding("lost", lock.token()).len() == 3;
    assert!(common::eventually(Duration::from_secs(2), everywhere).await);
    for i in [1, 2] {
        common::run(faulty.cluster(), i, &["DEL", "lost"]);
        faulty.proxy(i).set_fault(NetFault::Reset);
    }
    // Finds the connections to nodes 1 and 2 broken: they are dropped, none is open now.
    let _ = lock.is_held().await;
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
        rl.try_lock("warm").await.unwrap().release().await.unwrap();
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
    rl.try_lock("warm").await.unwrap().release().await.unwrap();
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
    rl.try_lock("warm").await.unwrap().release().await.unwrap();
    let lock = rl.try_lock("stuck").await.unwrap();
    faulty.proxy(2).set_fault(NetFault::Reset);
    let started = Instant::now();
    lock.release().await.unwrap();
    let took = started.elapsed();
    assert!(took < Duration::from_millis(200), "the release took {took:?}");
    // The background tries go on (until the lease's end): shutdown names the node rather
    // than wait for them.
    let started = Instant::now();
    let err = rl.shutdown(Duration::from_secs(3)).await.unwrap_err();
    assert_eq!(err.kind(), ErrorKind::Shutdown, "{err}");
    assert!(started.elapsed() < Duration::from_secs(1), "shutdown waited for the re-sends");
    let left = faulty.cluster().nodes_with_key("stuck").unwrap();
    assert!(left.is_empty() || left == vec![2], "the key is left on {left:?}");
}

/// Node 2 is paused (SIGSTOP) with the acquisition in its socket buffer; its proxy resets
/// the connection, so the acquisition's reply is lost, and the release cannot even open a
/// new connection. The proxy heals 5 ms into the release: its next try opens a connection
/// to the still-paused node, and the node resumes 100 ms later and runs both, in whatever
/// order: the key is gone either way (the acquisition is past its deadline, or finds the
/// release's tombstone).
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn an_acquisition_a_paused_node_had_buffered_leaves_nothing_with_its_release() {
    let mut faulty = FaultyCluster::start(3).unwrap();
    let rl =
        common::builder_for(faulty.urls(), Duration::from_millis(600)).ttl(LEASE).build().unwrap();
    rl.try_lock("warm").await.unwrap().release().await.unwrap();
    // The client's own thread opens its connections in the background once the runtime's
    // have opened: their clock readings are counted before the rounds.
    tokio::time::sleep(Duration::from_millis(200)).await;
    for round in 0..3 {
        let key = format!("paused:{round}");
        let sets_before = common::create_calls(faulty.cluster().node(2));
        faulty.cluster_mut().node_mut(2).pause().unwrap();
        let lock = rl.try_lock(&key).await.unwrap();
        // The SET on node 2 is written to the paused node's socket.
        tokio::time::sleep(Duration::from_millis(30)).await;
        faulty.proxy(2).set_fault(NetFault::Reset);
        tokio::time::sleep(Duration::from_millis(20)).await;
        lock.release().await.unwrap();
        tokio::time::sleep(Duration::from_millis(5)).await;
        faulty.proxy(2).heal();
        tokio::time::sleep(Duration::from_millis(100)).await;
        faulty.cluster_mut().node_mut(2).resume().unwrap();
        let gone = || faulty.cluster().count_key(&key) == 0;
        assert!(
            common::eventually(Duration::from_secs(3), gone).await,
            "round {round}: the key stays on nodes {:?} (pttl on node 2: {} ms)",
            faulty.cluster().nodes_with_key(&key).unwrap(),
            faulty.cluster().node(2).pttl(&key).unwrap()
        );
        // The premise: the buffered acquisition did run on node 2 after the reset (late),
        // besides the new connection's clock reading.
        assert_eq!(
            common::create_calls(faulty.cluster().node(2)),
            sets_before + 2,
            "round {round}"
        );
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
    rl.try_lock("warm").await.unwrap().release().await.unwrap();
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
