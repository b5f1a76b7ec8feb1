//! Review of 1aae1b1 (a request dropped unsent hands on what it waited for: `behind`
//! chains of slots): attacks on real nodes. Attacks 1-6 hold (1, 2 and 4 fail on the
//! commit before it); attack 7 aborted the process (stack overflow) at 1aae1b1: a chain of
//! `behind` links was as long as the run of cancellations behind one in-flight request,
//! and was dropped recursively. Fixed by linking each dropped request to the first request
//! of its chain that is not over yet (`Slot::settle`).
//!
//! The staging used throughout (as in `review_dropped_undo`): node 4's acquisition of a2
//! waits, unsent, behind a1's release there, itself queued behind a1's acquisition, held by
//! the proxy. Every request of a2 on node 4 is then queued behind that unsent acquisition;
//! if any of them went out first, the acquisition would land last and leave a2's key on
//! node 4 for the whole lease.

use crate::common;

use std::time::{Duration, Instant};

use futures::FutureExt;
use redlock::ErrorKind;
use redlock_testkit::{Cluster, FaultyCluster};

/// Holds node 4's next request naming `key` (the acquisition) for `hold`.
fn hold_acquisition(faulty: &FaultyCluster, key: &str, hold: Duration) {
    faulty.proxy(4).hold_requests_containing(key.as_bytes(), hold);
}

async fn clean(cluster: &Cluster, keys: &[&str], within: Duration) -> bool {
    common::eventually(within, || keys.iter().all(|key| cluster.count_key(key) == 0)).await
}

fn holders(cluster: &Cluster, keys: &[&str], token: &str) -> Vec<(String, Vec<usize>)> {
    keys.iter().map(|key| (key.to_string(), cluster.nodes_holding(key, token))).collect()
}

/// Attack 1: a chain of several cancelled calls (extension, extension, release) before the
/// release sent by `Drop`. Each cancelled call's request on node 4 is dropped unsent while
/// what it follows is still unsent: the links must compose.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_chain_of_cancelled_calls_keeps_the_release_behind_the_unsent_acquisition() {
    let (faulty, rl) = common::five_slowed_nodes(Duration::from_secs(2)).await;
    let cluster = faulty.cluster();
    for round in 0..2 {
        let key = format!("chain{round}");
        let hold = Duration::from_millis(400);
        let mut a2 = common::lock_behind_an_unsent_acquisition(&faulty, &rl, &key, hold).await;
        let token = a2.token().to_string();
        for _ in 0..3 {
            let extend = a2.extend(Duration::from_secs(10));
            assert!(extend.now_or_never().is_none(), "round {round}: an extension ended at once");
        }
        assert!(a2.release().now_or_never().is_none(), "round {round}: the release ended at once");
        common::assert_gone_after_the_hold(cluster, &key, &token, round).await;
    }
}

/// Attack 2: the clean-up of a failed attempt is cancelled while its request on node 4
/// waits for that attempt's unsent acquisition (nodes 0-2 hold a foreign value: refused;
/// node 3 granted, its clean-up held by the proxy so the call is mid clean-up when
/// cancelled). `Drop` then releases behind the dropped clean-up, and a new attempt of the
/// same client on the key (`Undos::pending`, following the chain) comes right after: a2's
/// acquisition must not land after a2's undos, and a3 must be granted on node 4.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_cancelled_clean_up_and_a_new_attempt_stay_behind_the_unsent_acquisition() {
    let (faulty, rl) = common::five_slowed_nodes(Duration::from_secs(2)).await;
    let cluster = faulty.cluster();
    // Node 3's grant comes in before the three refusals decide the round: its clean-up is
    // awaited.
    faulty.proxy(3).heal();
    for round in 0..2 {
        let key = format!("cu{round}");
        hold_acquisition(&faulty, &key, Duration::from_millis(500));
        let a1 = rl.try_lock(&key).await.unwrap();
        faulty.proxy(4).release_holds();
        a1.release().await.unwrap();
        for i in 0..3 {
            cluster.node(i).set(&key, "foreign").unwrap();
        }
        faulty.proxy(3).hold_requests_containing(b"redlock:released:", Duration::from_millis(300));
        let a2 = tokio::time::timeout(Duration::from_millis(100), rl.try_lock(&key)).await;
        assert!(a2.is_err(), "round {round}: the failed attempt ended before its clean-up: {a2:?}");
        faulty.proxy(3).release_holds();
        for i in 0..3 {
            cluster.node(i).command(&["DEL", &key]).unwrap();
        }
        let started = Instant::now();
        let a3 = rl.try_lock(&key).await.unwrap_or_else(|err| panic!("round {round}: {err}"));
        assert!(started.elapsed() < Duration::from_millis(2500), "a3 took {:?}", started.elapsed());
        let token = a3.token().to_string();
        // Past every hold: whatever a2 sent has landed.
        tokio::time::sleep(Duration::from_millis(900)).await;
        let on4 = cluster.node(4).get(&key).unwrap();
        assert_eq!(on4.as_deref(), Some(token.as_str()), "round {round}: node 4, a3 is {token}");
        a3.release().await.unwrap();
        assert!(
            clean(cluster, &[&key], Duration::from_secs(3)).await,
            "round {round}: left {:?}",
            (0..5).map(|i| cluster.node(i).get(&key).unwrap()).collect::<Vec<_>>()
        );
    }
}

/// Attack 3: short node timeout. a2's acquisition on node 4 times out while it waits its
/// turn (a1's release there is stuck behind a1's held acquisition); a2's cancelled release,
/// the release from `Drop`, and a new attempt all follow it. Nothing may hang past the node
/// timeout, and node 4 must end clean.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn an_acquisition_timing_out_in_line_stalls_nothing() {
    let timeout = Duration::from_millis(300);
    let (faulty, rl) = common::five_slowed_nodes(timeout).await;
    let cluster = faulty.cluster();
    for round in 0..2 {
        let key = format!("to{round}");
        let hold = Duration::from_millis(1200);
        let mut a2 = common::lock_behind_an_unsent_acquisition(&faulty, &rl, &key, hold).await;
        let token = a2.token().to_string();
        assert!(a2.extend(Duration::from_secs(10)).now_or_never().is_none());
        assert!(a2.release().now_or_never().is_none());
        let started = Instant::now();
        let a3 = rl.try_lock(&key).await.unwrap_or_else(|err| panic!("round {round}: {err}"));
        assert!(
            started.elapsed() < timeout + Duration::from_millis(200),
            "{:?}",
            started.elapsed()
        );
        let started = Instant::now();
        let token3 = a3.token().to_string();
        a3.release().await.unwrap();
        assert!(
            started.elapsed() < timeout + Duration::from_millis(200),
            "{:?}",
            started.elapsed()
        );
        // Past the hold: node 4 ran a1's SET, then whatever was still queued behind it.
        assert!(
            clean(cluster, &[&key], Duration::from_secs(4)).await,
            "round {round}: a2 ({token}) on {:?}, a3 ({token3}) on {:?}",
            cluster.nodes_holding(&key, &token),
            cluster.nodes_holding(&key, &token3)
        );
    }
}

/// Attack 4: the other kinds (reentrant, read, write, multi-resource), each staged as in
/// attack 1 with a cancelled extension then a cancelled release.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn every_kind_keeps_the_release_behind_the_unsent_acquisition() {
    let (faulty, rl) = common::five_slowed_nodes(Duration::from_secs(2)).await;
    let cluster = faulty.cluster();
    macro_rules! stage {
        ($what:literal, $keys:expr, $acquire:expr) => {{
            let keys: Vec<&str> = $keys;
            hold_acquisition(&faulty, keys[0], Duration::from_millis(400));
            let a1 = $acquire.await.unwrap();
            faulty.proxy(4).release_holds();
            a1.release().await.unwrap();
            let mut a2 = $acquire.await.unwrap();
            let token = a2.token().to_string();
            assert!(a2.extend(Duration::from_secs(10)).now_or_never().is_none(), $what);
            assert!(a2.release().now_or_never().is_none(), $what);
            tokio::time::sleep(Duration::from_millis(800)).await;
            assert!(
                clean(cluster, &keys, Duration::from_secs(3)).await,
                "{}: a2 ({token}) left on {:?}",
                $what,
                holders(cluster, &keys, &token)
            );
        }};
    }
    stage!("reentrant", vec!["re"], rl.reentrant("re", "job-1").once());
    stage!("read", vec!["rd"], rl.read("rd").once());
    stage!("write", vec!["wr"], rl.write("wr").once());
    stage!("many", vec!["m1", "m2"], rl.many(&["m1", "m2"]).once());
}

/// Attack 5: a2 (with a cancelled release in its chain) dropped inside a current-thread
/// runtime that is then shut down: its unsent acquisition and its undos die with the
/// runtime; the undos handed over to the client's thread must still leave node 4 clean.
#[test]
fn a_chain_dropped_with_its_runtime_leaves_nothing() {
    let faulty = FaultyCluster::start(5).unwrap();
    let cluster = faulty.cluster();
    let rl = common::builder_for(faulty.urls(), Duration::from_secs(2)).build().unwrap();
    let main = tokio::runtime::Builder::new_current_thread().enable_all().build().unwrap();
    main.block_on(common::warm_and_slow(&faulty, &rl));
    for round in 0..2 {
        let key = format!("rt{round}");
        let short = tokio::runtime::Builder::new_current_thread().enable_all().build().unwrap();
        let token = short.block_on(async {
            let hold = Duration::from_millis(400);
            let mut a2 = common::lock_behind_an_unsent_acquisition(&faulty, &rl, &key, hold).await;
            let token = a2.token().to_string();
            assert!(a2.extend(Duration::from_secs(10)).now_or_never().is_none());
            drop(a2);
            token
        });
        drop(short);
        main.block_on(async {
            common::assert_gone_after_the_hold(cluster, &key, &token, round).await;
        });
    }
}

/// Attack 6: a writer waiting in line gives up (its wait is cancelled) while its last
/// attempt's acquisition on node 4 is unsent behind its own earlier clean-up; the
/// withdrawal waits for the undos. Nothing of the writer (key or intent) may stay.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_writer_giving_up_behind_an_unsent_attempt_leaves_nothing() {
    let (faulty, rl) = common::five_slowed_nodes(Duration::from_secs(2)).await;
    let cluster = faulty.cluster();
    let reader = rl.read("wkey-gives-up").once().await.unwrap();
    hold_acquisition(&faulty, "wkey-gives-up", Duration::from_millis(400));
    let waiting = rl.write("wkey-gives-up").retry(
        redlock::Retry::new()
            .with_delay(Duration::from_millis(30))
            .with_jitter(Duration::ZERO)
            .with_max_attempts(100),
    );
    let gave_up = tokio::time::timeout(Duration::from_millis(250), waiting).await;
    assert!(gave_up.is_err(), "{gave_up:?}");
    faulty.proxy(4).release_holds();
    reader.release().await.unwrap();
    tokio::time::sleep(Duration::from_millis(500)).await;
    assert!(
        clean(cluster, &["wkey-gives-up"], Duration::from_secs(4)).await,
        "left: {:?}",
        cluster.hash_fields("wkey-gives-up").unwrap()
    );
    let writer = rl.write("wkey-gives-up").once().await.unwrap_or_else(|err| {
        assert_ne!(err.kind(), ErrorKind::NotAcquired, "the writer's intent stayed: {err}");
        panic!("{err}")
    });
    writer.release().await.unwrap();
}

/// Attack 7 (aborted the process at 1aae1b1): many extensions cancelled while
/// node 4's acquisition is held. Each leaves a `behind` link to the previous one, so the
/// chain grows by one per cancellation for as long as the head is in flight (each
/// cancellation walks the whole chain: quadratic), and when the head settles the next
/// request drops the whole chain at once, recursively (`OnceLock<Slot>` -> `Arc<[State]>`
/// -> `OnceLock<Slot>` ...): stack overflow in the caller's thread. Run on a thread with a
/// 512 KiB stack to abort at a few thousand links within the test budget (the test thread's
/// 2 MiB overflow at ~8k links in a debug build). Passes on 6a95076 (no chains) and with
/// the settle-time link to the first request not over (`CHAIN=20000` too).
#[test]
fn a_long_chain_of_cancelled_extensions_is_dropped_without_overflow() {
    let links: usize = std::env::var("CHAIN").ok().and_then(|s| s.parse().ok()).unwrap_or(4000);
    let stack: usize = std::env::var("STACK_KIB").ok().and_then(|s| s.parse().ok()).unwrap_or(512);
    std::thread::Builder::new()
        .stack_size(stack * 1024)
        .spawn(move || {
            let rt = tokio::runtime::Builder::new_current_thread().enable_all().build().unwrap();
            rt.block_on(Box::pin(long_chain(links)));
        })
        .unwrap()
        .join()
        .unwrap();
}

async fn long_chain(links: usize) {
    let hold = Duration::from_millis(3000);
    let faulty = FaultyCluster::start(5).unwrap();
    let cluster = faulty.cluster();
    let rl = common::builder_for(faulty.urls(), hold + Duration::from_secs(2))
        .ttl(Duration::from_secs(60))
        .build()
        .unwrap();
    common::warm_and_slow(&faulty, &rl).await;
    hold_acquisition(&faulty, "long", hold);
    let acquired = Instant::now();
    let mut lock = rl.try_lock("long").await.unwrap();
    faulty.proxy(4).release_holds();
    let token = lock.token().to_string();
    for k in 0..links {
        let extend = lock.extend(Duration::from_secs(60)).now_or_never();
        assert!(extend.is_none(), "extension {k} ended in its first poll: {extend:?}");
    }
    let cancelled = acquired.elapsed();
    assert!(cancelled < hold, "the chain was cut: {links} cancellations took {cancelled:?}");
    tokio::time::sleep(hold + Duration::from_millis(300) - cancelled).await;
    // The head is over: this extension's request on node 4 goes out and lets the chain go.
    lock.extend(Duration::from_secs(60)).await.unwrap();
    lock.release().await.unwrap();
    assert!(
        clean(cluster, &["long"], Duration::from_secs(3)).await,
        "left on {:?}",
        cluster.nodes_holding("long", &token)
    );
}
