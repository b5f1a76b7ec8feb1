//! Requests sent again on a new connection, where the test needs the process's log or a
//! stalled client thread (`common::stall`): a release after the nodes closed the client's
//! connections, its own thread stalled meanwhile, still tells a hold it released from one
//! taken meanwhile and spares the new holder; a release whose connects time out is
//! retried only until the lease ends; one to a dead node does not hold up the shutdown.

use crate::common;

use std::sync::Arc;
use std::sync::atomic::{AtomicBool, Ordering};
use std::time::{Duration, Instant};

use redlock::ErrorKind;
use redlock_testkit::{Cluster, FaultyCluster, NetFault, NodeConfig, Persistence};

fn kind<T: std::fmt::Debug>(r: &redlock::Result<T>) -> Result<(), ErrorKind> {
    r.as_ref().map(|_| ()).map_err(|err| err.kind())
}

/// Blocks `rl`'s own thread for `ms` (`common::stall`): arms the layer and drops `lock` outside any runtime,
/// whose release then runs (and logs) on that thread. Returns once the block has begun.
async fn block_background_thread(lock: redlock::Lock, ms: u64) {
    common::stall::arm(ms);
    std::thread::spawn(move || drop(lock)).join().unwrap();
    let began = common::eventually(Duration::from_secs(3), common::stall::stalling);
    assert!(began.await, "staging: the background thread was not blocked");
}

// The client's own thread is busy (here: 800 ms in a log call) when every node closes the
// client's connections (CLIENT KILL; in production an idle `timeout`, a restart); another
// client force-releases "k", takes and releases it. The holder's connections are its
// runtime's, whose drivers saw the close: its release is refused before anything is
// written, and the send on a new connection is a first send, which finds the key gone:
// `NotHeld`. The busy own thread (background work, current-thread callers) changes none
// of it.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_release_while_the_clients_own_thread_is_busy_reports_a_lock_taken_meanwhile() {
    let _serial = crate::serial();
    common::logs();
    let cluster = common::cluster(3);
    let rl = common::builder(&cluster, Duration::from_secs(3)).build().unwrap();
    let lock = rl.try_lock("k").await.unwrap();
    let decoy = rl.try_lock("decoy").await.unwrap();
    block_background_thread(decoy, 800).await;
    common::kill_clients(&cluster);
    common::take_over(&cluster, "k").await;
    assert!(common::stall::stalling(), "staging: the block ended too soon");
    assert!(lock.is_valid(), "staging: the lease ran out");
    let released = lock.release().await;
    assert_eq!(
        kind(&released),
        Err(ErrorKind::NotHeld),
        "release() of a lock another client held meanwhile, never sent before: {released:?}"
    );
}

// Every kind's release after the nodes closed its connections (CLIENT KILL), its lock
// force-released and taken by another client meanwhile, says NotHeld.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn every_kinds_release_after_the_nodes_closed_its_connections_reports_a_lock_taken_meanwhile()
{
    let _serial = crate::serial();
    let cluster = common::cluster(3);
    let rl = common::client(&cluster);
    let other = common::client(&cluster);
    // Three tries: a debug build's slow first poll on a loaded host counts a send maybe
    // written, and its re-send as done (`timing::UNWRITTEN_WITHIN`).
    let staging = || async {
        let reentrant = rl.reentrant("re", "owner").await.unwrap();
        let write = rl.write("wr").await.unwrap();
        let read = rl.read("rd").await.unwrap();
        let many = rl.many(&["m1", "m2"]).await.unwrap();
        common::kill_clients(&cluster);
        tokio::time::sleep(Duration::from_millis(100)).await;
        for key in ["re", "wr", "rd", "m1", "m2"] {
            assert_eq!(other.force_release(key).await.unwrap(), 3, "{key}");
            other.try_lock(key).await.unwrap().release().await.unwrap();
        }
        [
            ("reentrant", kind(&reentrant.release().await)),
            ("write", kind(&write.release().await)),
            ("read", kind(&read.release().await)),
            ("many", kind(&many.release().await)),
        ]
    };
    let want = ["reentrant", "write", "read", "many"].map(|what| (what, Err(ErrorKind::NotHeld)));
    common::in_three_tries("every kind's release", want, staging).await;
}

// Nodes restarted with their AOF between the acquisition and the release (the
// cached connections are dead, their drivers saw it): the release goes to every node at
// once and says Ok; with the lock force-released and taken meanwhile, NotHeld.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_release_after_restarts_with_aof_removes_the_key_or_reports_a_lock_taken_meanwhile() {
    let _serial = crate::serial();
    let mut cluster =
        Cluster::start_with(3, NodeConfig::new().persistence(Persistence::AppendFsyncAlways))
            .unwrap();
    let rl = common::builder(&cluster, Duration::from_secs(1)).build().unwrap();
    let kept = rl.try_lock("kept").await.unwrap();
    let taken = rl.try_lock("taken").await.unwrap();
    // Staging: every node answered both acquisitions (a round is decided by the first two
    // nodes) before the restarts, or the AOF has nothing to keep there.
    common::held_on(&cluster, "kept", kept.token(), &[0, 1, 2]).await;
    common::held_on(&cluster, "taken", taken.token(), &[0, 1, 2]).await;
    for i in 0..3 {
        cluster.node_mut(i).restart().unwrap();
    }
    assert_eq!(cluster.count_key("kept"), 3, "staging: the AOF kept the key");
    tokio::time::sleep(Duration::from_millis(100)).await;
    let other = common::client(&cluster);
    assert_eq!(other.force_release("taken").await.unwrap(), 3);
    other.try_lock("taken").await.unwrap().release().await.unwrap();
    kept.release().await.unwrap();
    // The release went to every node at once; it said Ok at two of three, so the third
    // may still be running it.
    let gone = || cluster.count_key("kept") == 0;
    assert!(common::eventually(Duration::from_millis(500), gone).await, "kept stays");
    assert_eq!(kind(&taken.release().await), Err(ErrorKind::NotHeld));
}

// CLIENT KILL, then a burst of concurrent releases from many tasks, half of
// their locks force-released and taken by another client meanwhile: every lock still held
// says Ok, the taken ones say NotHeld, and the other client's holds are untouched. A taken
// one may say Ok where the first poll of its sends took longer than a send refused at once
// can (`timing::UNWRITTEN_WITHIN`: 40 tasks on two workers, in a debug build, on a loaded
// host): such a send counts as maybe written, and its re-send as done (the documented limit
// of a re-send). At least one must tell, or the unwritten sends are not told apart at all.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_burst_of_releases_after_client_kill_tells_held_from_taken_and_spares_the_new_holder() {
    let _serial = crate::serial();
    let cluster = common::cluster(3);
    let rl = common::builder(&cluster, Duration::from_secs(1)).build().unwrap();
    let other = common::builder(&cluster, Duration::from_secs(1)).build().unwrap();
    let mut locks = Vec::new();
    for i in 0..40 {
        locks.push((i, rl.try_lock(&format!("b{i}")).await.unwrap()));
    }
    // Staging: every node answered every acquisition (a round is decided by the first two
    // nodes): one landing after the forced release below would take a node from the other
    // client's lock.
    let everywhere = || cluster.keys_everywhere("b*").unwrap() == 3 * locks.len();
    assert!(common::eventually(Duration::from_secs(2), everywhere).await, "staging");
    common::kill_clients(&cluster);
    tokio::time::sleep(Duration::from_millis(100)).await;
    let mut theirs = Vec::new();
    for i in (0..40).filter(|i| i % 2 == 0) {
        let key = format!("b{i}");
        assert_eq!(other.force_release(&key).await.unwrap(), 3);
        theirs.push((key.clone(), other.try_lock(&key).await.unwrap()));
    }
    let tasks: Vec<_> = locks
        .into_iter()
        .map(|(i, lock)| tokio::spawn(async move { (i, kind(&lock.release().await)) }))
        .collect();
    let mut told = 0;
    for task in tasks {
        let (i, result) = task.await.unwrap();
        if i % 2 == 1 {
            assert_eq!(result, Ok(()), "b{i}: held to its release");
        } else if result == Err(ErrorKind::NotHeld) {
            told += 1;
        } else {
            assert_eq!(result, Ok(()), "b{i}: taken meanwhile");
        }
    }
    assert!(told > 0, "no release of a taken lock said NotHeld");
    tokio::time::sleep(Duration::from_millis(200)).await;
    for (key, lock) in theirs {
        assert_eq!(cluster.nodes_holding(&key, lock.token()).len(), 3, "{key}");
        lock.release().await.unwrap();
    }
    common::none_match_everywhere(&cluster, "b*", "every lock released").await;
}

// A forced release refused by dead connections (Resend::Never, Unsent) goes out
// once on new connections: it frees every node and a holder who takes the lock right after
// keeps it on every node.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_forced_release_over_closed_connections_runs_once_and_spares_the_next_holder() {
    let _serial = crate::serial();
    let cluster = common::cluster(3);
    let admin = common::builder(&cluster, Duration::from_secs(1)).build().unwrap();
    let holder = common::client(&cluster);
    common::warm(&admin).await;
    let staging = || async {
        let old = holder.try_lock("f").await.unwrap();
        // Staging: every node answered the acquisition (a round is decided by the first
        // two nodes; the third may be behind the holder's first connect, which the kill
        // below does not close): one landing after the forced release would take a node
        // from the next holder.
        common::held_on(&cluster, "f", old.token(), &[0, 1, 2]).await;
        common::kill_clients(&cluster);
        tokio::time::sleep(Duration::from_millis(100)).await;
        assert_eq!(admin.force_release("f").await.unwrap(), 3);
        let next = common::client(&cluster).try_lock("f").await.unwrap();
        tokio::time::sleep(Duration::from_millis(300)).await;
        assert_eq!(cluster.nodes_holding("f", next.token()).len(), 3);
        let answer = kind(&old.release().await);
        next.release().await.unwrap();
        answer
    };
    common::in_three_tries("the stale release", Err(ErrorKind::NotHeld), staging).await;
}

// An extension after the nodes closed the client's connections succeeds (a
// first send on new connections), and a release right after removes every key.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn an_extension_after_client_kill_succeeds_and_the_release_removes_every_key() {
    let _serial = crate::serial();
    let cluster = common::cluster(3);
    let rl = common::client(&cluster);
    let mut lock = rl.try_lock("e").await.unwrap();
    // Staging: every node answered the acquisition (a round is decided by the first two
    // nodes) before its connection is killed.
    common::held_on(&cluster, "e", lock.token(), &[0, 1, 2]).await;
    common::kill_clients(&cluster);
    tokio::time::sleep(Duration::from_millis(100)).await;
    lock.extend(Duration::from_secs(20)).await.unwrap();
    // Decided at the quorum too: the third node's answer may still be on its way.
    let extended = || cluster.pttls("e").unwrap().iter().all(|t| t.is_some_and(|t| t > 10_000));
    assert!(common::eventually(Duration::from_secs(2), extended).await, "{:?}", cluster.pttls("e"));
    lock.release().await.unwrap();
    let gone = || cluster.count_key("e") == 0;
    assert!(common::eventually(Duration::from_secs(2), gone).await, "{:?}", cluster.pttls("e"));
}

// Exclusion and leftovers under resets: client A works through proxies that
// reset every connection at random moments; client B, direct, checks that it never gets a
// key A holds (valid, not yet released), and at the end nothing of A's is left.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn random_resets_keep_exclusion_and_leave_nothing_behind() {
    let _serial = crate::serial();
    let faulty = Arc::new(FaultyCluster::start(3).unwrap());
    let a = common::builder_for(faulty.urls(), Duration::from_millis(300)).build().unwrap();
    let b = common::client(faulty.cluster());
    let stop = Arc::new(AtomicBool::new(false));
    let resetter = {
        let (faulty, stop) = (faulty.clone(), stop.clone());
        std::thread::spawn(move || {
            let mut n = 0u64;
            while !stop.load(Ordering::SeqCst) {
                n += 1;
                std::thread::sleep(Duration::from_millis(3 + (n * 7919) % 23));
                let i = (n % 3) as usize;
                faulty.proxy(i).set_fault(NetFault::Reset);
                faulty.proxy(i).set_fault(NetFault::None);
            }
        })
    };
    let deadline = Instant::now() + Duration::from_secs(6);
    let (mut held, mut ok_releases) = (0, 0);
    let mut tokens = Vec::new();
    let mut round = 0;
    while Instant::now() < deadline {
        round += 1;
        let key = format!("x{}", round % 5);
        let Ok(lock) = a.try_lock(&key).await else { continue };
        held += 1;
        tokens.push((key.clone(), lock.token().to_owned()));
        let theirs = b.try_lock(&key).await;
        assert!(theirs.is_err() || !lock.is_valid(), "round {round}: B took {key} while A held it");
        if let Ok(theirs) = theirs {
            let _ = theirs.release().await;
        }
        if lock.release().await.is_ok() {
            ok_releases += 1;
        }
    }
    stop.store(true, Ordering::SeqCst);
    resetter.join().unwrap();
    let cluster = faulty.cluster();
    let gone = common::eventually(Duration::from_secs(3), || {
        tokens.iter().all(|(key, token)| cluster.nodes_holding(key, token).is_empty())
    });
    let left: Vec<_> = tokens
        .iter()
        .filter(|(key, token)| !cluster.nodes_holding(key, token).is_empty())
        .collect();
    assert!(gone.await, "{held} held, {ok_releases} released Ok; left: {left:?}");
    assert!(held > 10, "staging: only {held} locks taken");
}

// Releases to nodes that cannot be reached, counted in the log.

/// A release to a node whose connection was
/// reset and whose new connects hang (a blackhole: accepted, nothing answered) times out
/// connecting, and is sent again with doubling pauses. It must stop once nothing it removes
/// can exist (1 s lease): no retry loop beyond the hold's horizon, no spin.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_release_whose_connects_time_out_is_retried_only_until_the_lease_ends() {
    let _serial = crate::serial();
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
    let _serial = crate::serial();
    common::logs();
    let mut faulty = FaultyCluster::start(3).unwrap();
    let rl = common::builder_for(faulty.urls(), Duration::from_millis(200))
        .connect_timeout(Duration::from_millis(100))
        .build()
        .unwrap();
    let url = faulty.urls()[2].clone();
    // Staging: the lock must hold node 2. A round is decided by the first two nodes, and on
    // a loaded machine node 2's acquisition may fail (a first connect): a lock that never
    // reached node 2 leaves nothing there to undo, nor to send again.
    let mut attempts = 0;
    let lock = loop {
        let lock = rl.try_lock("dead").await.unwrap();
        let on_node_2 = || faulty.cluster().nodes_holding("dead", lock.token()).contains(&2);
        if common::eventually(Duration::from_secs(1), on_node_2).await {
            break lock;
        }
        attempts += 1;
        assert!(attempts < 10, "staging: node 2 never took the lock");
        lock.release().await.unwrap();
    };
    let before = common::requests_ended(&url, "release");
    faulty.cluster_mut().node_mut(2).kill().unwrap();
    lock.release().await.unwrap();
    // Each send tries a lost undo again for up to 260 ms (`UNDO_AGAIN`), and the background
    // pauses 50 ms, then 100 ms, then 200 ms: about four sends end by 1.5 s.
    tokio::time::sleep(Duration::from_millis(1500)).await;
    let sent = common::requests_ended(&url, "release") - before;
    assert!(
        (2..=12).contains(&sent),
        "{sent} releases sent to the dead node in 1.5 s; its log:\n{}",
        common::log_lines_of(&url)
    );
    // The re-sends stop: shutdown does not wait for its deadline.
    let started = Instant::now();
    let _ = rl.shutdown(Duration::from_secs(3)).await;
    let waited = started.elapsed();
    assert!(waited < Duration::from_millis(500), "shutdown waited {waited:?}");
}
