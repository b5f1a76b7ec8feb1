//! Review of 4d7a8c4: `Taken` (the answers a round took itself, handed to
//! `background::finish`: undo timeouts after a reconnect, whenever they came, and the
//! answers taken during the linger), `Undos::sends_again`, and the `late` flag of
//! `round::await_stragglers`.
//!
//! Each test stages one interleaving on real nodes; see the comment above each.

use crate::common;

use std::time::{Duration, Instant};

use redlock::{ErrorKind, Lock, Redlock};
use redlock_testkit::{FaultyCluster, NetFault};

/// The SHA the release script is sent under (`EVALSHA`).
fn release_sha() -> String {
    common::release_sha()
}

/// Breaks the client's connection to node `i` (dropping whatever the proxy still held on
/// it), then lets new connections through again at once.
fn break_connection(faulty: &FaultyCluster, i: usize) {
    faulty.proxy(i).set_fault(NetFault::Reset);
    faulty.proxy(i).heal();
}

/// A lock on `key` whose nodes `broken` had their connection replaced since it was
/// granted (a new generation), then hold every release sent to them for 10 s: a release
/// there times out after a reconnect.
async fn reconnected_and_held(
    faulty: &FaultyCluster,
    rl: &Redlock,
    key: &str,
    broken: &[usize],
) -> Lock {
    let lock = rl.try_lock(key).await.unwrap();
    for &i in broken {
        break_connection(faulty, i);
    }
    // Re-opens the connections (a check is re-sent on a new one); the nodes that did not
    // count finish in the background.
    let _ = lock.is_held().await;
    tokio::time::sleep(Duration::from_millis(100)).await;
    let _ = lock.is_held().await;
    tokio::time::sleep(Duration::from_millis(50)).await;
    let sha = release_sha();
    for &i in broken {
        faulty.proxy(i).hold_requests_containing(sha.as_bytes(), Duration::from_secs(10));
    }
    lock
}

/// Lets the held releases go: drops them with their connections, and holds nothing more.
fn unhold(faulty: &FaultyCluster, nodes: &[usize]) {
    for &i in nodes {
        faulty.proxy(i).release_holds();
        break_connection(faulty, i);
    }
}

// ATTACK 1 (broke; fixed: a re-send is made, so registered, when scheduled): shutdown said "clean" while a taken undo waits for its re-send.
//
// `Retries::again` only pushes a future that sleeps (50 ms, doubling) and calls `remake`
// after the pause; `remake` is what registers the undo with `core.undos` (`track_one`).
// During the pause nothing unsettled is registered for the node: the round's own
// registration (`Sent::Everywhere`) has the timed-out slot, already settled.
// `Core::shutdown` ignores whether `idle_by` reached idle and names a node only from
// `undos.in_flight()` or a new failure count. Interleaving (3 nodes, T = 100 ms):
// 1. lock "k"; nodes 0 and 1 reconnect (generation changes); their proxies hold releases.
// 2. release: nodes 0 and 1 time out at T, before the decision (the second one decides
//    `Unavailable`): both taken (`TimedOut` after a reconnect), re-sent in 50 ms.
// 3. `shutdown(20 ms)` at once: the background task is still running (in the pause),
//    `in_flight` is false everywhere, no failure counted -> `Ok(())`, although the
//    release was confirmed on neither node 0 nor 1 (their keys stay if the re-sends fail).
// The same gap exists before this commit for a rest's timeout re-sent by the background
// (ATTACK 2); the commit routes every pre-decision timeout after a reconnect into it.
// Fix: register the re-send when it is scheduled (`again`: make the `Slot` and
// `track_one` it there, pass both into the future), so the pause counts as in flight for
// `shutdown` and for the client's next acquisition; or have `shutdown` treat a background
// undo task still running at the deadline as unconfirmed on its nodes.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn shutdown_names_nodes_whose_taken_undo_waits_for_its_resend() {
    let faulty = FaultyCluster::start(3).unwrap();
    let rl = common::builder_for(faulty.urls(), Duration::from_millis(100)).build().unwrap();
    rl.try_lock("warm").await.unwrap().release().await.unwrap();
    let lock = reconnected_and_held(&faulty, &rl, "k", &[0, 1]).await;
    let started = Instant::now();
    let released = lock.release().await;
    let took = started.elapsed();
    let shutdown = rl.shutdown(Duration::from_millis(20)).await;
    eprintln!(
        "release {:?} after {took:?}; shutdown: {:?}",
        released.as_ref().map_err(|err| err.kind()),
        shutdown.as_ref().map_err(|err| err.to_string())
    );
    assert_eq!(released.unwrap_err().kind(), ErrorKind::Unavailable);
    // Whatever shutdown said, the re-sends finish the job once the nodes answer.
    unhold(&faulty, &[0, 1]);
    let gone =
        common::eventually(Duration::from_secs(3), || faulty.cluster().count_key("k") == 0).await;
    assert!(gone, "k left on {:?}", faulty.cluster().nodes_with_key("k").unwrap());
    let err = shutdown.expect_err(
        "shutdown returned Ok while the releases on nodes 0 and 1 timed out and were only \
         scheduled to be sent again (the pause of `Retries::again` is not registered)",
    );
    assert_eq!(err.kind(), ErrorKind::Shutdown);
}

// ATTACK 2 (broke, pre-existing shape of ATTACK 1; fixed with it): the same pause for a rest's undo.
// Release Ok (nodes 1, 2); node 0 (reconnected, holding releases) is left to the
// background, times out at T = 100 ms, and is re-sent 50 ms later. `shutdown(125 ms)`
// called right after the release ends inside that pause: `Ok(())`.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn shutdown_names_a_node_whose_background_undo_waits_for_its_resend() {
    let faulty = FaultyCluster::start(3).unwrap();
    let rl = common::builder_for(faulty.urls(), Duration::from_millis(100)).build().unwrap();
    rl.try_lock("warm").await.unwrap().release().await.unwrap();
    let lock = reconnected_and_held(&faulty, &rl, "k", &[0]).await;
    lock.release().await.unwrap();
    let shutdown = rl.shutdown(Duration::from_millis(125)).await;
    eprintln!("shutdown: {:?}", shutdown.as_ref().map_err(|err| err.to_string()));
    unhold(&faulty, &[0]);
    let gone =
        common::eventually(Duration::from_secs(3), || faulty.cluster().count_key("k") == 0).await;
    assert!(gone, "k left on {:?}", faulty.cluster().nodes_with_key("k").unwrap());
    shutdown.expect_err(
        "shutdown returned Ok while node 0's release had timed out and waited for its re-send",
    );
}

// ATTACK 3 (held): hand-over right after `finish` started retries from `taken`. The
// release runs on a short-lived runtime: nodes 0 and 1 (reconnected, holding releases)
// time out before the decision, `finish` schedules their re-sends (pushed to `pending`)
// and spawns the task there; the runtime ends at once, dropping the task in its pause:
// `Unfinished::drop` sends both again on the client's own thread (queued behind settled
// slots). Then the held releases are dropped with their connections. Pinned: the key is
// gone from every node, and a later lock of the same key by the same client is granted
// and survives every possible re-send (a re-sent undo removes only its own token).
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_hand_over_of_taken_undos_leaves_nothing_and_spares_the_next_hold() {
    let faulty = FaultyCluster::start(3).unwrap();
    let rl = common::builder_for(faulty.urls(), Duration::from_millis(100)).build().unwrap();
    rl.try_lock("warm").await.unwrap().release().await.unwrap();
    for trial in 0..3 {
        let key = format!("h{trial}");
        let lock = reconnected_and_held(&faulty, &rl, &key, &[0, 1]).await;
        let released =
            common::on_short_runtime(async move { lock.release().await.map_err(|e| e.kind()) });
        assert_eq!(released, Err(ErrorKind::Unavailable), "trial {trial}");
        tokio::time::sleep(Duration::from_millis(20 * trial)).await;
        unhold(&faulty, &[0, 1]);
        let gone =
            common::eventually(Duration::from_secs(3), || faulty.cluster().count_key(&key) == 0)
                .await;
        assert!(
            gone,
            "trial {trial}: {key} left on {:?}",
            faulty.cluster().nodes_with_key(&key).unwrap()
        );
        // The same client's next hold of the key: granted, and untouched by any re-send.
        let next = rl.try_lock(&key).await.unwrap();
        let token = next.token().to_owned();
        tokio::time::sleep(Duration::from_millis(1500)).await;
        assert_eq!(
            faulty.cluster().nodes_holding(&key, &token),
            vec![0, 1, 2],
            "trial {trial}: a re-sent undo removed the next hold"
        );
        next.release().await.unwrap();
    }
}

// ATTACK 4 (held): a taken re-send never overtakes into the next owner. Another client
// takes the key as soon as the re-sent releases free it; the re-sends (more may still be
// scheduled on node 0, whose first re-send is held again) remove only the old token.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn taken_resends_never_remove_another_owners_hold() {
    let faulty = FaultyCluster::start_for_clients(3, 2, Default::default()).unwrap();
    let rl = common::builder_for(faulty.urls_for(0), Duration::from_millis(100)).build().unwrap();
    let other =
        common::builder_for(faulty.urls_for(1), Duration::from_millis(100)).build().unwrap();
    rl.try_lock("warm").await.unwrap().release().await.unwrap();
    other.try_lock("warm").await.unwrap().release().await.unwrap();
    let lock = reconnected_and_held(&faulty, &rl, "k", &[0, 1]).await;
    assert_eq!(lock.release().await.unwrap_err().kind(), ErrorKind::Unavailable);
    // Node 1 answers the first re-send; node 0 holds it too (it times out and is re-sent
    // 100 ms after), then is let go.
    unhold(&faulty, &[1]);
    let deadline = Instant::now() + Duration::from_secs(5);
    let theirs = loop {
        if let Ok(lock) = other.try_lock("k").await {
            break lock;
        }
        assert!(Instant::now() < deadline, "the other client never got k");
        tokio::time::sleep(Duration::from_millis(5)).await;
    };
    let token = theirs.token().to_owned();
    tokio::time::sleep(Duration::from_millis(200)).await;
    unhold(&faulty, &[0]);
    tokio::time::sleep(Duration::from_millis(1500)).await;
    let holding = faulty.cluster().nodes_holding("k", &token);
    assert!(holding.len() >= 2 && holding.contains(&1), "their hold is on {holding:?} only");
    theirs.release().await.unwrap();
}

// ATTACK 5 (not staged; code reading; fixed: a node is late for `LATE_FOR` at most,
// `node::tests::a_late_node_is_late_for_a_second_or_until_it_answers_in_time`): `late` is cleared only by an answer taken in a
// round (before the decision or during a wait). A healthy node that is always the
// straggler (a farther node, answering ~1 ms after the quorum, inside the 2 ms wait) is
// never waited for again once it missed one wait or timed out once: no round waits while
// it is late, and its answer reaches only the rest's task, which never clears the flag.
// Every later round then spawns a task for it (the cost this commit removes), for good.
// Could not be staged here: the proxies' latency on this machine comes in steps of ~4 ms
// (answers of the three nodes land together or 4 ms apart), so no node is reliably
// "last but within 2 ms". Suggested fix: clear `late` from the rest's task when the
// answer came within the grace of its round's decision, or wait for a late node again
// every so often.
