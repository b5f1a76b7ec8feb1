//! Third review of `lanes` (703d21a): creating requests tracked per node (`creators`), undos
//! re-sent "whatever they answered" where two or more creators may still land
//! (*unordered*), and the first-poll rule of `Node::send_on` (`Sent::Unsent`).
//!
//! **Context.** Written against the `lanes` branch (a connection per multi-thread runtime,
//! not merged: see "Connections per runtime" in `benches/PROFILE.md`; the `FAILED`/`FAILS`
//! notes below are about that branch). On the design main runs (every request goes on the
//! client's own thread's one connection per node) every test here passes: they stay as
//! regression tests for releases, extensions and clean-ups across runtimes that end, block
//! or come and go.
//!
//! Attacks (see each test's comment for its staging):
//! 1. Unordered re-sends are registered with the client's undo registry for the whole
//!    lease, each one *before* its pause (up to 1 s). An acquisition's wait for them counts
//!    against its node timeout, so after two extensions timed out on a majority, this
//!    client cannot take the key again for the rest of the old lease, while any other
//!    client can.
//! 2. shutdown(within) while unordered re-sends run: keeps its deadline.
//! 3. The first-poll rule only sees a driver that is already gone. A driver that has not
//!    yet run since the node closed its connection (its runtime busy: here a one-worker
//!    runtime whose worker is the caller) accepts the command on the first poll and fails
//!    it on a later one: `Stale`, re-sent with `resent: true`, and its "absent" is read as
//!    Ok: release() says Ok for a lock force-released and taken meanwhile.
//! 4. `until` (expires_by + drift) counts from when the requests were *sent*, but a
//!    healing extension's PX counts from when it *lands*: with two lanes, the extension on
//!    the lane the undo does not follow can land after the last re-send and set the
//!    released key again.
//!
//! Fixed since (1 and 4): a claim no longer tracks creators on several lanes of a node.
//! On each node it keeps one lane while a request that may create its hold (an
//! acquisition, a healing extension) may still land there, and everything it sends there
//! follows on that lane; only once none may land does it take the caller's lane. No undo
//! is "unordered" any more, so nothing is re-sent whatever it answered (1), and no healing
//! extension travels on another connection than the release that follows it (4).
//!
//! Not fixed on the branch (3): a command the driver accepts before it has seen that the
//! node closed the connection fails later, and counts as maybe written; a release re-sent
//! after it then reads "absent" as "removed by the first try". On main the drivers run on
//! the client's own thread, which no application work blocks, and the test passes.

use crate::common;

use crate::common::runtimes::*;

use std::time::{Duration, Instant};

use redlock::Redlock;
use redlock_testkit::FaultyCluster;

const NODE_TIMEOUT: Duration = Duration::from_millis(200);

/// An extension's lease no acquisition carries (acquisitions carry 10000).
const EXTENSION_MS: u64 = 7777;
const EXTENSION: &[u8] = b"\r\n7777\r\n";

/// A lock on "k" whose two extensions both timed out on nodes 1 and 2 (their proxies hold
/// each for 600 ms), then released: nodes 1 and 2 are *unordered* (two creators each may
/// still land), and their releases are re-sent until the old lease is over (~10 s).
async fn released_after_two_extensions_timed_out_on_a_majority() -> (FaultyCluster, Redlock) {
    let faulty = FaultyCluster::start(3).unwrap();
    let rl = common::builder_for(faulty.urls(), NODE_TIMEOUT).build().unwrap();
    rl.try_lock("warm").await.unwrap().release().await.unwrap();
    let mut lock = rl.try_lock("k").await.unwrap();
    for i in [1, 2] {
        faulty.proxy(i).hold_requests_containing(EXTENSION, Duration::from_millis(600));
    }
    let ext = Duration::from_millis(EXTENSION_MS);
    assert!(lock.extend(ext).await.is_err(), "staging: the first extension reached a quorum");
    assert!(lock.is_valid(), "staging: the lease ran out");
    assert!(lock.extend(ext).await.is_err(), "staging: the second extension reached a quorum");
    let _ = lock.release().await;
    (faulty, rl)
}

// FAILED on 703d21a (every run; passes on main); fixed since (see the module doc).
//
// After release() returns, nodes 1 and 2 keep a registered re-send of the release for the
// rest of the old lease, re-registered before each pause (50 ms doubling to 1 s). Each
// acquisition of the same client waits behind it on nodes 1 and 2, inside its 200 ms node
// timeout: it times out there, and with node 0 alone try_lock fails, again and again, for
// up to ~10 s, although every key is gone (another client takes the lock at once).
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn after_two_extensions_timed_out_on_a_majority_the_same_client_can_lock_the_key_again() {
    let (faulty, rl) = released_after_two_extensions_timed_out_on_a_majority().await;
    let cluster = faulty.cluster();
    for i in [1, 2] {
        faulty.proxy(i).release_holds();
    }
    // The held extensions and the releases behind them have landed.
    tokio::time::sleep(Duration::from_millis(2000)).await;
    let gone = common::eventually(Duration::from_secs(2), || cluster.count_key("k") == 0);
    assert!(gone.await, "staging: the key stayed: {}", describe(cluster, 2, "k"));
    let mut failures = Vec::new();
    for _ in 0..6 {
        match rl.try_lock("k").await {
            Ok(lock) => lock.release().await.unwrap(),
            Err(err) => failures.push(err.to_string()),
        }
        tokio::time::sleep(Duration::from_millis(250)).await;
    }
    let other = common::builder_for(faulty.urls(), NODE_TIMEOUT).build().unwrap();
    other.try_lock("k").await.expect("another client takes the free key").release().await.unwrap();
    assert!(
        failures.is_empty(),
        "{} of 6 try_lock of a free key by the client that released it failed: {failures:#?}",
        failures.len()
    );
}

// Passes on 703d21a and on main.
//
// Regression: shutdown(500 ms) keeps its deadline while unordered re-sends run for the
// rest of the old lease.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn shutdown_keeps_its_deadline_while_unordered_releases_are_resent() {
    let (faulty, rl) = released_after_two_extensions_timed_out_on_a_majority().await;
    tokio::time::sleep(Duration::from_millis(300)).await;
    let started = Instant::now();
    let _ = rl.shutdown(Duration::from_millis(500)).await;
    let took = started.elapsed();
    assert!(took < Duration::from_millis(1200), "shutdown(500 ms) took {took:?}");
    for i in [1, 2] {
        faulty.proxy(i).release_holds();
    }
    tokio::time::sleep(Duration::from_millis(1500)).await;
    let cluster = faulty.cluster();
    let gone = common::eventually(Duration::from_secs(2), || cluster.count_key("k") == 0);
    assert!(gone.await, "the released key stayed: {}", describe(cluster, 2, "k"));
}

// FAILS on the lanes branch (its drivers run on the caller's busy runtime); passes on main
// with the first-poll rule, where the drivers run on the client's own thread.
//
// The lock is taken and released from a task of a ONE-worker multi-thread runtime (its
// lane's connections are driven there). Between the two, the task keeps the worker busy
// (synchronous work, as applications do): the nodes close every connection (CLIENT KILL),
// and another client force-releases the lock, takes it and releases it. The drivers have
// not run since the kill: each accepts the release on its first poll (queued: not
// `Unsent`), then fails it when it runs (`Stale`, nothing written); the release is re-sent
// with `resent: true`, its "absent" read as "the first try removed it", and release() says
// Ok for a lock another client held meanwhile.
#[test]
fn a_release_from_a_busy_runtime_after_the_nodes_closed_its_connections_reports_not_held() {
    release_after_a_kill_and_a_takeover_meanwhile(false);
}

// Passes on 703d21a (the first-poll rule at work); fails on main (review_lanes_fixes' test 4).
//
// Control: the same, but the task awaits 100 ms before the release: the drivers run, see
// the EOF and end, and the release is refused on its first poll (`Unsent`).
#[test]
fn control_a_release_after_the_drivers_saw_the_kill_reports_not_held() {
    release_after_a_kill_and_a_takeover_meanwhile(true);
}

/// [`a_release_from_a_busy_runtime_after_the_nodes_closed_its_connections_reports_not_held`]'s
/// staging; `yield_first`: the task awaits (lets the drivers run) before the release.
fn release_after_a_kill_and_a_takeover_meanwhile(yield_first: bool) {
    let cluster = common::cluster(3);
    let rl = common::client(&cluster);
    let runtime = multi_thread(1);
    let urls = cluster.urls();
    let kill = cluster.urls();
    let task = runtime.spawn(async move {
        let lock = rl.try_lock("k").await.unwrap();
        // From here to the release's first poll, this task keeps the only worker.
        for url in &kill {
            let client = redis::Client::open(url.as_str()).unwrap();
            let mut con = client.get_connection().unwrap();
            let _: redis::Value = redis::cmd("CLIENT")
                .arg(&["KILL", "SKIPME", "yes", "TYPE", "normal"])
                .query(&mut con)
                .unwrap();
        }
        std::thread::spawn(move || {
            let other = multi_thread(1);
            other.block_on(async {
                let rl = common::builder_for(urls, NODE_TIMEOUT).build().unwrap();
                assert_eq!(rl.force_release("k").await.unwrap(), 3);
                rl.try_lock("k").await.unwrap().release().await.unwrap();
            });
        })
        .join()
        .unwrap();
        if yield_first {
            tokio::time::sleep(Duration::from_millis(100)).await;
        } else {
            std::thread::sleep(Duration::from_millis(100));
        }
        assert!(lock.is_valid(), "staging: the lease ran out");
        lock.release().await.map_err(|err| err.kind())
    });
    let released = runtime.block_on(task).unwrap();
    assert_eq!(
        released,
        Err(redlock::ErrorKind::NotHeld),
        "release() of a lock another client held meanwhile"
    );
}

// FAILED on 703d21a (every run; passes on main); fixed since (see the module doc).
//
// Lease 2 s. Node 2's proxy holds E1 (an extension from runtime B, lane B) for 3 s, then
// E2 (from the test's runtime T, lane T) for 500 ms. Both time out (200 ms): two creators
// may land on node 2, the release from T goes on lane T behind E2 and is re-sent until
// `until` = max(t0 + 2 s, t(E2) + 1.5 s) + drift. E1 lands on lane B at t(E1) + 3 s, after
// the last re-send, on the released (absent) key, and extend.lua sets it again with the
// released token, for 1.5 s from then. On main everything goes on one connection: the
// release lands after E1.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_healing_extension_landing_after_the_resends_leaves_no_key() {
    let faulty = FaultyCluster::start(3).unwrap();
    let rl = common::builder_for(faulty.urls(), NODE_TIMEOUT)
        .ttl(Duration::from_millis(2000))
        .build()
        .unwrap();
    rl.try_lock("warm").await.unwrap().release().await.unwrap();
    let b = warm_runtime(&rl).await;
    let ext = Duration::from_millis(1500);
    let needle = b"\r\n1500\r\n";
    let lock = rl.try_lock("k").await.unwrap();
    let t0 = Instant::now();
    faulty.proxy(2).hold_requests_containing(needle, Duration::from_millis(3000));
    let (b, mut lock) = on_thread(move || {
        let mut lock = lock;
        b.block_on(async { lock.extend(ext).await.unwrap() });
        (b, lock)
    })
    .await;
    faulty.proxy(2).hold_requests_containing(needle, Duration::from_millis(500));
    lock.extend(ext).await.unwrap();
    let token = lock.token().to_owned();
    lock.release().await.unwrap();
    let cluster = faulty.cluster();
    // E1 lands at ~t0 + 3 s; the re-sends stop at ~t0 + 2.1 s.
    while t0.elapsed() < Duration::from_millis(3600) {
        tokio::time::sleep(Duration::from_millis(50)).await;
    }
    let left = cluster.node(2).get("k").unwrap();
    let pttl = cluster.node(2).pttl("k").unwrap();
    end(b).await;
    assert_ne!(
        left.as_deref(),
        Some(token.as_str()),
        "node 2 holds the released lock's token again, pttl {pttl} ms (an extension landed \
         after the release's last re-send)"
    );
}
