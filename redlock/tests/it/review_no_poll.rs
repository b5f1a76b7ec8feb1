//! Review of 044036d: "no polling while the client itself holds the lock" (a waiter's tick
//! passes without an attempt while `held`, the validity of this client's exclusive hold of
//! the key, is in the future) and "a re-sent undo reading held-by-another-owner counts as
//! done".
//!
//! Each test names the interleaving it drives on real nodes. `held` is set when the hold is
//! granted or extended while a waiter of this client watches the key, so the tests extend
//! the hold once the waiters watch (what an `AutoLock` does every third of its lease, and
//! what a hold granted to a waiter of the line does at its grant).
//!
//! Found at 044036d, fixed since: a forced release (published on a quorum) left the
//! client's other waiters behind its gone hold (a reader woken alone, a multi waiter woken
//! and refused on its other key); a lease the client knew lost, and a shutdown, kept them
//! out too; and a re-sent release said `Ok` for a hold another owner had taken from a
//! majority before it was sent (the held-by-another-owner rule, taken back). A hold lost
//! without notice (a restart) keeps the client's own waiters out until its validity ends:
//! kept as the rule, bounded. The same re-send finding the key absent is the older known
//! limit (ignored test).

use crate::common;

use std::sync::Arc;
use std::time::{Duration, Instant};

use redlock::{ErrorKind, Redlock, Retry};
use redlock_testkit::{FaultyCluster, Fuzz, NetFault};

const LEASE: Duration = Duration::from_secs(10);

/// A waiting client over `urls`: polls every 50 ms (plus up to 10 ms), gives up after
/// `max_wait`.
fn waiting(urls: Vec<String>, max_wait: Duration) -> Redlock {
    Redlock::builder()
        .nodes(urls)
        .ttl(LEASE)
        .node_timeout(Duration::from_millis(200))
        .retry(
            Retry::new()
                .with_unbounded_attempts()
                .with_delay(Duration::from_millis(50))
                .with_jitter(Duration::from_millis(10))
                .with_max_wait(max_wait),
        )
        .build()
        .unwrap()
}

/// A task waiting for `key`: when it got it (or gave up), and how.
fn timed_lock(
    rl: &Redlock,
    key: &'static str,
) -> tokio::task::JoinHandle<(Instant, redlock::Result<redlock::Lock>)> {
    let rl = rl.clone();
    tokio::spawn(async move {
        let lock = rl.lock(key).await;
        (Instant::now(), lock)
    })
}

/// Waits until every node has `n` subscribers on `key`'s release channel: the waiters of
/// the test watch it.
async fn watched_by(cluster: &redlock_testkit::Cluster, key: &str, n: i64) {
    assert!(
        common::eventually(Duration::from_secs(3), || common::subscribers(cluster, key)
            .iter()
            .all(|&c| c >= n))
        .await,
        "the waiters never subscribed to {key}"
    );
}

/// Client `d` holds `L`, client `c` holds `K`, and a waiter of `c` for a multi-resource
/// lock of `K` and `L` (which cannot succeed while `d` holds `L`) watches `K`.
async fn held_before_a_doomed_multi_waiter(
    cluster: &redlock_testkit::Cluster,
    c: &Redlock,
    d: &Redlock,
) -> (redlock::Lock, redlock::Lock, tokio::task::JoinHandle<redlock::Result<()>>) {
    let blocker = d.try_lock("L").await.unwrap();
    let stuck = c.try_lock("K").await.unwrap();
    let multi = {
        let c = c.clone();
        tokio::spawn(async move { c.many(&["K", "L"]).await.map(|_| ()) })
    };
    watched_by(cluster, "K", 1).await;
    (blocker, stuck, multi)
}

/// Three nodes behind proxies; client A through them (250 ms node timeout, connections
/// open), client B straight to the nodes.
async fn two_clients_on_three_proxied_nodes() -> (Arc<FaultyCluster>, Redlock, Redlock) {
    let faulty = Arc::new(FaultyCluster::start(3).unwrap());
    let a = common::builder_for(faulty.urls(), Duration::from_millis(250)).build().unwrap();
    let b = common::client(faulty.cluster());
    a.try_lock("warm").await.unwrap().release().await.unwrap();
    (faulty, a, b)
}

// ---------------------------------------------------------------------------------------
// Stale `held`: the hold is gone from the nodes, its guard still exists (a task stuck with
// it, or one that ignores its lost lease), and this client's waiters sit out their ticks
// until the gone hold's validity ends.
// ---------------------------------------------------------------------------------------

/// A task of client C holds the write side of `doc` and hangs. Three readers of C wait
/// for a share; so does a reader of client D. C's write is extended while they wait (its
/// `held` is set). The operator force-releases `doc` (`force_release` deletes the key on
/// every node and publishes one release). The notification wakes C's first reader only,
/// which gets its share; C's other readers' ticks pass without an attempt (C's write is
/// still "valid"), so they wait until the stuck write's validity ends (10 s) or their
/// `max_wait` although a share is free for anyone: D's reader got one at its next tick.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn readers_of_the_client_stay_out_after_its_stuck_write_is_force_released() {
    let cluster = common::cluster(3);
    let c = waiting(cluster.urls(), Duration::from_secs(8));
    let d = waiting(cluster.urls(), Duration::from_secs(8));
    let admin = common::client(&cluster);
    let mut write = c.write("doc").once().await.unwrap();
    let reader = |rl: &Redlock| {
        let rl = rl.clone();
        tokio::spawn(async move {
            let share = rl.read("doc").await;
            (Instant::now(), share)
        })
    };
    let ours: Vec<_> = (0..3).map(|_| reader(&c)).collect();
    let theirs = reader(&d);
    watched_by(&cluster, "doc", 2).await;
    tokio::time::sleep(Duration::from_millis(200)).await;
    write.extend(LEASE).await.unwrap();
    let released_at = Instant::now();
    admin.force_release("doc").await.unwrap();

    let (at, share) = tokio::time::timeout(Duration::from_secs(3), theirs).await.unwrap().unwrap();
    let share = share.unwrap();
    let theirs_after = at - released_at;
    let mut late = Vec::new();
    let mut shares = vec![share];
    for (i, task) in ours.into_iter().enumerate() {
        let abort = task.abort_handle();
        match tokio::time::timeout(Duration::from_millis(1500), task).await {
            Ok(Ok((at, Ok(share)))) => {
                if at - released_at > Duration::from_secs(1) {
                    late.push(format!("reader {i} after {:?}", at - released_at));
                }
                shares.push(share);
            }
            Ok(Ok((_, Err(err)))) => late.push(format!("reader {i} failed: {err}")),
            Ok(Err(err)) => panic!("{err}"),
            Err(_) => {
                abort.abort();
                late.push(format!("reader {i} still waiting 1.5 s after the force release"));
            }
        }
    }
    for share in shares {
        let _ = share.release().await;
    }
    drop(write);
    assert!(
        late.is_empty(),
        "a share was free (client D's reader got one {theirs_after:?} after the force \
         release) but C's readers sat out their ticks behind C's gone write: {late:?}"
    );
}

/// Client C: a task holds `K` and hangs. Two waiters of C are in line for `K`: first a
/// multi-resource lock of `K` and `L` (`L` is held by client D), then a plain lock of `K`.
/// C's hold of `K` is extended while they wait. The operator force-releases `K`. Its one
/// notification wakes the first waiter, whose attempt fails (`L`); the plain waiter, which
/// needs nothing but the now free `K`, sits out its ticks behind C's gone hold. At
/// 7872702 the multi waiter could not stand in for it (it needs `L`), so it polled and got
/// `K` at its next tick.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_plain_waiter_behind_a_refused_multi_waiter_stays_out_after_a_force_release() {
    let cluster = common::cluster(3);
    let c = waiting(cluster.urls(), Duration::from_secs(6));
    let d = common::client(&cluster);
    let (blocker, mut stuck, multi) = held_before_a_doomed_multi_waiter(&cluster, &c, &d).await;
    let plain = timed_lock(&c, "K");
    tokio::time::sleep(Duration::from_millis(300)).await;
    stuck.extend(LEASE).await.unwrap();
    let released_at = Instant::now();
    d.force_release("K").await.unwrap();
    let abort = plain.abort_handle();
    let outcome = tokio::time::timeout(Duration::from_millis(1500), plain).await;
    abort.abort();
    multi.abort();
    blocker.release().await.unwrap();
    drop(stuck);
    match outcome {
        Ok(Ok((at, Ok(lock)))) => {
            let _ = lock.release().await;
            assert!(
                at - released_at < Duration::from_secs(1),
                "the plain waiter got the free K only {:?} after the force release",
                at - released_at
            );
        }
        Ok(Ok((_, Err(err)))) => panic!("the plain waiter failed: {err}"),
        Ok(Err(err)) => panic!("{err}"),
        Err(_) => panic!(
            "K was free (force-released) but the plain waiter was still waiting 1.5 s later: \
             its ticks pass while C's gone hold of K is 'valid', and the one notification \
             went to the multi waiter, refused on L"
        ),
    }
}

/// Client C: a task holds `K` (taken with `try_lock`, extended to 1.5 s while a waiter of
/// C watches). Nodes 1 and 2 of 3 restart empty (no persistence, restart quarantine off):
/// the hold is gone from a majority, with no notification, and the holder still believes
/// it holds the lock. C's waiter finds `K` free at its next tick, as another client's
/// waiter does (`a_waiter_of_another_client_finds_the_lost_hold_at_its_next_tick`): only a
/// hold granted to a waiter of C's line keeps C's next waiters out (see `queue`), and the
/// nodes, not the client, decide who holds a lock.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_waiter_of_the_client_finds_a_hold_lost_without_notice_at_its_next_tick() {
    let mut cluster = common::cluster(3);
    let c = waiting(cluster.urls(), Duration::from_secs(5));
    let mut stuck = c.try_lock("K").await.unwrap();
    let waiter = timed_lock(&c, "K");
    watched_by(&cluster, "K", 1).await;
    tokio::time::sleep(Duration::from_millis(200)).await;
    stuck.extend(Duration::from_millis(1500)).await.unwrap();
    let valid_until = stuck.deadline();
    tokio::task::block_in_place(|| {
        cluster.node_mut(1).restart_empty().unwrap();
        cluster.node_mut(2).restart_empty().unwrap();
    });
    let restarted_at = Instant::now();
    let (at, lock) = tokio::time::timeout(Duration::from_secs(4), waiter).await.unwrap().unwrap();
    lock.unwrap().release().await.unwrap();
    drop(stuck);
    assert!(
        at < valid_until && at - restarted_at < Duration::from_millis(1000),
        "granted {:?} after the restart, with the lost hold valid for {:?} more",
        at - restarted_at,
        valid_until.saturating_duration_since(restarted_at)
    );
}

/// `with_lock`: C's work runs with an auto-extended lock of `K` (3 s lease, extended every
/// second: each extension sets `held` while a waiter of C watches) and does not watch its
/// lease. Nodes 1 and 2 restart empty just after an extension; the next extension finds
/// the lock gone and the lease reports it lost. From then on C's waiter tries again at its
/// ticks (its `SET`s reach the nodes), where at 044036d it sat out its ticks until the
/// hold's old validity ended. (It may get `K` at once: the loss releases the keys, the
/// ones the failed extension set again on the nodes that had lost them included; a CI run
/// of 305cc19 saw it do so before the test's first count of `SET`s.)
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_lease_known_lost_no_longer_keeps_the_clients_waiter_out() {
    let mut cluster = common::cluster(3);
    let c = waiting(cluster.urls(), Duration::from_secs(8));
    let (lease_tx, lease_rx) = tokio::sync::oneshot::channel();
    let worker = {
        let c = c.clone();
        tokio::spawn(async move {
            c.with_lock(c.lock("K").ttl(Duration::from_secs(3)), |lease| async move {
                let _ = lease_tx.send(lease);
                // Work that does not watch its lease.
                tokio::time::sleep(Duration::from_secs(6)).await;
            })
            .await
        })
    };
    let lease = lease_rx.await.unwrap();
    let waiter = {
        let c = c.clone();
        tokio::spawn(async move { c.lock("K").await })
    };
    watched_by(&cluster, "K", 1).await;
    // Just after an extension (one second into the lease, while the waiter watches).
    let extended = lease.deadline();
    assert!(
        common::eventually(Duration::from_secs(3), || lease.deadline() > extended).await,
        "no extension"
    );
    tokio::task::block_in_place(|| {
        cluster.node_mut(1).restart_empty().unwrap();
        cluster.node_mut(2).restart_empty().unwrap();
    });
    let err = tokio::time::timeout(Duration::from_secs(3), lease.lost()).await.unwrap();
    // The loss releases the keys (and the ones the failed extension set again) on every
    // node: the waiter may get `K` before a first count of `SET`s; counted from here, it
    // either tries again at its ticks or has `K` already.
    let sets = || common::create_calls(cluster.node(0));
    let before = sets();
    let tried_or_got =
        common::eventually(Duration::from_millis(500), || waiter.is_finished() || sets() > before)
            .await;
    let waiter_ended = if waiter.is_finished() {
        format!("{:?}", waiter.await.map(|lock| lock.map(|_| ())))
    } else {
        waiter.abort();
        "still waiting".to_owned()
    };
    worker.abort();
    assert!(
        tried_or_got && !waiter_ended.contains("Err"),
        "C's waiter made no attempt in the 500 ms after the lease reported: {err}; the waiter: \
         {waiter_ended}"
    );
}

/// Shutdown: a task of C holds `K` (extended while a waiter of C watches); C shuts down.
/// The waiter's next attempt would fail at once with `Shutdown`, but its ticks pass without
/// an attempt while C's hold is valid: it waits out that hold's validity or its own
/// `max_wait` (a guard not auto-extended is not released by the shutdown).
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_waiter_learns_of_the_shutdown_only_when_the_clients_hold_ends() {
    let cluster = common::cluster(3);
    let c = waiting(cluster.urls(), Duration::from_secs(6));
    let mut holder = c.try_lock("K").await.unwrap();
    let waiter = {
        let c = c.clone();
        tokio::spawn(async move {
            let lock = c.lock("K").await;
            (Instant::now(), lock.map(|_| ()))
        })
    };
    watched_by(&cluster, "K", 1).await;
    tokio::time::sleep(Duration::from_millis(200)).await;
    holder.extend(LEASE).await.unwrap();
    let _ = c.shutdown(Duration::from_secs(1)).await;
    let shut_at = Instant::now();
    let abort = waiter.abort_handle();
    let outcome = tokio::time::timeout(Duration::from_millis(1500), waiter).await;
    abort.abort();
    let _ = holder.release().await;
    match outcome {
        Ok(Ok((at, Err(err)))) => {
            assert_eq!(err.kind(), ErrorKind::Shutdown, "{err}");
            assert!(
                at - shut_at < Duration::from_millis(500),
                "the waiter learnt of the shutdown {:?} after it",
                at - shut_at
            );
        }
        Ok(Ok((_, Ok(())))) => panic!("granted after the shutdown"),
        Ok(Err(err)) => panic!("{err}"),
        Err(_) => panic!(
            "1.5 s after the shutdown the waiter is still waiting (its ticks pass while the \
             client's own hold is valid): an attempt would have failed with Shutdown at once"
        ),
    }
}

// ---------------------------------------------------------------------------------------
// Rules that held.
// ---------------------------------------------------------------------------------------

/// A waiter of client D is not held back by client C's `held`: C's hold of `K` is extended
/// while a waiter of C (a multi-resource lock of `K` and `L`, which cannot succeed: `L` is
/// held by D) and one of D watch `K`; the hold is lost in a restart of nodes 1 and 2; D's
/// waiter takes `K` at its next tick.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_waiter_of_another_client_finds_the_lost_hold_at_its_next_tick() {
    let mut cluster = common::cluster(3);
    let c = waiting(cluster.urls(), Duration::from_secs(5));
    let d = waiting(cluster.urls(), Duration::from_secs(5));
    let (blocker, mut stuck, ours) = held_before_a_doomed_multi_waiter(&cluster, &c, &d).await;
    let theirs = timed_lock(&d, "K");
    watched_by(&cluster, "K", 2).await;
    tokio::time::sleep(Duration::from_millis(200)).await;
    stuck.extend(LEASE).await.unwrap();
    tokio::task::block_in_place(|| {
        cluster.node_mut(1).restart_empty().unwrap();
        cluster.node_mut(2).restart_empty().unwrap();
    });
    let lost_at = Instant::now();
    let (at, lock) = tokio::time::timeout(Duration::from_secs(2), theirs).await.unwrap().unwrap();
    let lock = lock.unwrap();
    assert!(at - lost_at < Duration::from_millis(1500), "{:?}", at - lost_at);
    ours.abort();
    let _ = lock.release().await;
    let _ = blocker.release().await;
    drop(stuck);
}

/// The policy still bounds a waiter that sits out its ticks behind this client's hold:
/// with `max_attempts` 4 and 100 ms pauses, the wait ends after three pauses with
/// `NotAcquired` (its last tick a real attempt), as at 7872702.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn max_attempts_still_bounds_a_wait_behind_the_clients_own_hold() {
    let cluster = common::cluster(3);
    let c = Redlock::builder()
        .nodes(cluster.urls())
        .ttl(LEASE)
        .node_timeout(Duration::from_millis(200))
        .retry(
            Retry::new()
                .with_max_attempts(4)
                .with_delay(Duration::from_millis(100))
                .with_jitter(Duration::ZERO),
        )
        .build()
        .unwrap();
    let mut holder = c.try_lock("K").await.unwrap();
    // A first waiter keeps the channel watched, so that the extension sets `held`.
    let first = {
        let c = c.clone();
        tokio::spawn(async move {
            let retry =
                Retry::new().with_unbounded_attempts().with_max_wait(Duration::from_secs(5));
            c.lock("K").retry(retry).await
        })
    };
    watched_by(&cluster, "K", 1).await;
    holder.extend(LEASE).await.unwrap();
    let started = Instant::now();
    let err = c.lock("K").await.unwrap_err();
    let took = started.elapsed();
    first.abort();
    holder.release().await.unwrap();
    assert_eq!(err.kind(), ErrorKind::NotAcquired, "{err}");
    assert!(
        took >= Duration::from_millis(280) && took < Duration::from_millis(1500),
        "gave up after {took:?}"
    );
}

// ---------------------------------------------------------------------------------------
// A re-sent release that finds another owner's key counts it removed.
// ---------------------------------------------------------------------------------------

/// Drops every request chunk the proxy reads, and closes the connection: the client wrote
/// the request, the node never ran it.
fn reset_requests() -> NetFault {
    NetFault::Fuzz(Fuzz::new(11).with_reset_request(1.0))
}

fn heal_after(faulty: &Arc<FaultyCluster>, node: usize, ms: u64) -> std::thread::JoinHandle<()> {
    let faulty = faulty.clone();
    std::thread::spawn(move || {
        std::thread::sleep(Duration::from_millis(ms));
        faulty.proxy(node).heal();
    })
}

/// Client A (through proxies) holds `k` on all three nodes. Nodes 1 and 2 lose it (an
/// eviction, an operator's DEL, a restart without persistence) and client B takes `k`
/// there: B holds the lock on a majority. A releases; on nodes 1 and 2 its release is
/// written but the proxy drops it and closes the connection (it never ran); A sends it
/// again and the re-send finds B's key there. The re-send is read as "removed by the first
/// send, taken by someone since": the release says `Ok` ("held until this call") although
/// another owner held the lock on a majority before the release was even sent. At 7872702
/// the same release said `NotHeld`.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_resent_release_that_finds_another_owner_says_ok_for_a_hold_lost_before_it() {
    let (faulty, a, b) = two_clients_on_three_proxied_nodes().await;
    let lock = a.try_lock("k").await.unwrap();
    let everywhere = || faulty.cluster().nodes_holding("k", lock.token()).len() == 3;
    assert!(common::eventually(Duration::from_secs(2), everywhere).await);
    for i in [1, 2] {
        common::run(faulty.cluster(), i, &["DEL", "k"]);
    }
    let other = b.try_lock("k").await.unwrap();
    assert_eq!(faulty.cluster().nodes_holding("k", other.token()), vec![1, 2]);
    for i in [1, 2] {
        faulty.proxy(i).set_fault(reset_requests());
    }
    let healers = [heal_after(&faulty, 1, 30), heal_after(&faulty, 2, 30)];
    let result = lock.release().await;
    for healer in healers {
        healer.join().unwrap();
    }
    let b_holds = faulty.cluster().nodes_holding("k", other.token());
    other.release().await.unwrap();
    assert_eq!(b_holds, vec![1, 2], "B's hold was touched");
    let err = result.expect_err(
        "release() said Ok (held until this call) although client B held the lock on nodes \
         1 and 2 before A's release was sent, and none of A's sends ran there",
    );
    assert_eq!(err.kind(), ErrorKind::NotHeld, "{err}");
}

/// The same through `with_lock`: A's work is short (no extension runs during it); while
/// it runs nodes 1 and 2 lose A's key and B takes the lock on them. A's release at the end
/// is reset on 1 and 2 and re-sent: `with_lock` returns `Ok(output)`, which promises the
/// lock was held from the grant until the work returned, while B held it meanwhile.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn with_lock_says_ok_for_work_done_while_another_owner_held_the_lock() {
    let (faulty, a, b) = two_clients_on_three_proxied_nodes().await;
    let (b_hold_tx, b_hold_rx) = std::sync::mpsc::channel();
    let result = a
        .with_lock(a.try_lock("k"), |_lease| {
            let (faulty, b) = (faulty.clone(), b.clone());
            async move {
                let everywhere = || faulty.cluster().count_key("k") == 3;
                assert!(common::eventually(Duration::from_secs(2), everywhere).await);
                for i in [1, 2] {
                    common::run(faulty.cluster(), i, &["DEL", "k"]);
                }
                let other = b.try_lock("k").await.unwrap();
                for i in [1, 2] {
                    faulty.proxy(i).set_fault(reset_requests());
                }
                // Heals while the release is being re-sent.
                let healers = [heal_after(&faulty, 1, 80), heal_after(&faulty, 2, 80)];
                b_hold_tx.send((other, healers)).unwrap();
                "work done"
            }
        })
        .await;
    let (other, healers) = b_hold_rx.recv().unwrap();
    for healer in healers {
        healer.join().unwrap();
    }
    let b_holds = faulty.cluster().nodes_holding("k", other.token());
    other.release().await.unwrap();
    assert_eq!(b_holds, vec![1, 2]);
    let err = result.expect_err(
        "with_lock returned Ok(output) although client B held the lock on a majority \
         while the work ran",
    );
    assert_eq!(err.kind(), ErrorKind::NotHeld, "{err}");
}

/// Nodes 1 and 2 lose A's key (nobody takes it); A's release is written on them, dropped by
/// the proxy, re-sent, and finds the key absent with no tombstone of its own: the hold was
/// gone before, and the release says `NotHeld`.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_resent_release_that_finds_the_key_absent_says_not_held_for_a_hold_lost_before_it() {
    let faulty = Arc::new(FaultyCluster::start(3).unwrap());
    let a = common::builder_for(faulty.urls(), Duration::from_millis(250)).build().unwrap();
    a.try_lock("warm").await.unwrap().release().await.unwrap();
    let lock = a.try_lock("k").await.unwrap();
    let everywhere = || faulty.cluster().nodes_holding("k", lock.token()).len() == 3;
    assert!(common::eventually(Duration::from_secs(2), everywhere).await);
    for i in [1, 2] {
        common::run(faulty.cluster(), i, &["DEL", "k"]);
        faulty.proxy(i).set_fault(reset_requests());
    }
    let healers = [heal_after(&faulty, 1, 30), heal_after(&faulty, 2, 30)];
    let result = lock.release().await;
    for healer in healers {
        healer.join().unwrap();
    }
    let err = result.expect_err(
        "release() said Ok although the hold was gone from nodes 1 and 2 before it was sent \
         (its first sends there never ran)",
    );
    assert_eq!(err.kind(), ErrorKind::NotHeld, "{err}");
}
