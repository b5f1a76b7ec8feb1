//! Review of the round's requests polled in place (one `JoinAll` per round instead of a
//! `FuturesUnordered`), of the one registration per round of undos, and of the `EVAL`
//! fallback rebuilt from the `EVALSHA`'s arguments: none of these broke; kept as
//! regression tests.

use crate::common;

use std::future::{Future, IntoFuture};
use std::task::Poll;
use std::time::{Duration, Instant};

use redlock::Redlock;

/// How long the node answering after the quorum may take.
const SETTLE: Duration = Duration::from_secs(2);

/// One poll of a `try_lock` on a task whose coop budget is (almost) used up, then the
/// future is dropped (a `select!` whose other branch is ready): some request futures may
/// never have been polled. Each must still settle its slot when dropped, or the armed
/// claim's detached release on that node (which waits for it) would wait forever, its
/// registration would stay, and this client's next attempt on the key would wait for it.
async fn cancelled_first_poll(n: usize) {
    let cluster = common::cluster(n);
    let rl: Redlock = common::builder(&cluster, Duration::from_millis(200)).build().unwrap();
    // Connections up on every node.
    rl.try_lock("warm").await.unwrap().release().await.unwrap();
    // Same task poll: use up the budget, then poll the attempt once and drop it.
    let polled_once = tokio::spawn({
        let rl = rl.clone();
        async move {
            for _ in 0..128 {
                tokio::task::consume_budget().await;
            }
            let mut attempt = std::pin::pin!(rl.try_lock("k").into_future());
            std::future::poll_fn(|cx| Poll::Ready(attempt.as_mut().poll(cx).is_pending())).await
        }
    })
    .await
    .unwrap();
    assert!(polled_once, "the attempt finished in one poll");
    tokio::time::sleep(Duration::from_millis(500)).await;
    let started = Instant::now();
    let again = rl.try_lock("k").await;
    let took = started.elapsed();
    let shutdown = rl.shutdown(Duration::from_secs(2)).await;
    assert!(
        again.is_ok(),
        "{n} nodes: the next attempt (after {took:?}) was refused: {:?}",
        again.err()
    );
    if let Ok(lock) = again {
        let _ = lock.release().await;
    }
    assert!(shutdown.is_ok(), "{n} nodes: shutdown: {:?}", shutdown.err());
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_cancelled_attempt_over_5_nodes_leaves_nothing_waiting() {
    cancelled_first_poll(5).await;
}

/// Every node forgets its scripts before each step, so each script call goes EVALSHA ->
/// NOSCRIPT -> EVAL (the fallback rebuilt from the EVALSHA's arguments).
fn flush_scripts(cluster: &redlock_testkit::Cluster) {
    for i in 0..cluster.len() {
        common::run(cluster, i, &["SCRIPT", "FLUSH"]);
    }
}

fn evals(cluster: &redlock_testkit::Cluster) -> u64 {
    (0..cluster.len())
        .map(|i| {
            let mut con = cluster.node(i).connection().unwrap();
            let info: String = redis::cmd("INFO").arg("commandstats").query(&mut con).unwrap();
            info.lines()
                .find(|l| l.starts_with("cmdstat_eval:"))
                .and_then(|l| l.split("calls=").nth(1))
                .and_then(|l| l.split(',').next())
                .map(|n| n.parse::<u64>().unwrap())
                .unwrap_or(0)
        })
        .sum()
}

/// Scripts are loaded when a connection opens, before its first request: a fresh client on
/// fresh nodes runs every kind's scripts by hash, with no `NOSCRIPT` and no `EVAL`. (Were they
/// loaded only on demand, a release queued behind a `SET` on a hung node would meet `NOSCRIPT`
/// after its caller gave up, and the late `SET` would stay; see the command module.)
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_new_connection_runs_every_script_by_hash_from_its_first_request() {
    let cluster = common::cluster(3);
    let rl = common::client(&cluster);
    let mut lock = rl.try_lock("p").fenced().await.unwrap();
    lock.extend(Duration::from_secs(20)).await.unwrap();
    lock.release().await.unwrap();
    rl.many(&["m1", "m2"]).once().await.unwrap().release().await.unwrap();
    rl.read("rw").once().await.unwrap().release().await.unwrap();
    rl.write("rw").once().await.unwrap().release().await.unwrap();
    rl.reentrant("re", "job-1").once().await.unwrap().release().await.unwrap();
    tokio::time::sleep(Duration::from_millis(200)).await;
    assert_eq!(evals(&cluster), 0, "a script ran through the EVAL fallback");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn every_kind_works_through_the_eval_fallback() {
    let cluster = common::cluster(3);
    let rl = common::client(&cluster);
    let before = evals(&cluster);

    // Plain: extend + is_held + release, fenced too.
    flush_scripts(&cluster);
    let mut lock = rl.try_lock("p").fenced().await.unwrap();
    flush_scripts(&cluster);
    lock.extend(Duration::from_secs(20)).await.unwrap();
    // Decided at two nodes: the third may answer a moment later.
    let extended = || cluster.pttls("p").unwrap().iter().all(|t| t.is_some_and(|t| t > 10_000));
    assert!(common::eventually(SETTLE, extended).await, "extend via EVAL");
    flush_scripts(&cluster);
    assert!(lock.is_held().await.unwrap());
    flush_scripts(&cluster);
    lock.release().await.unwrap();
    assert!(common::eventually(SETTLE, || cluster.count_key("p") == 0).await, "release via EVAL");

    // Multi: three keys.
    flush_scripts(&cluster);
    let mut many = rl.many(&["m1", "m2", "m3"]).once().await.unwrap();
    for k in ["m1", "m2", "m3"] {
        let set = common::eventually(SETTLE, || cluster.count_key(k) == 3).await;
        assert!(set, "{k} not set by multi_acquire via EVAL");
    }
    flush_scripts(&cluster);
    many.extend(Duration::from_secs(20)).await.unwrap();
    flush_scripts(&cluster);
    assert!(many.is_held().await.unwrap());
    flush_scripts(&cluster);
    many.release().await.unwrap();
    for k in ["m1", "m2", "m3"] {
        let gone = common::eventually(SETTLE, || cluster.count_key(k) == 0).await;
        assert!(gone, "{k} left by multi_release via EVAL");
    }
    // A foreign holder of one of them refuses the set (the keys and args line up).
    cluster.node(0).set("m2", "x").unwrap();
    cluster.node(1).set("m2", "x").unwrap();
    flush_scripts(&cluster);
    assert!(rl.many(&["m1", "m2", "m3"]).once().await.is_err());
    let clean = common::eventually(SETTLE, || cluster.count_key("m1") == 0).await;
    assert!(clean, "a refused multi set left m1 behind");

    // Read/write.
    flush_scripts(&cluster);
    let r1 = rl.read("rw").once().await.unwrap();
    flush_scripts(&cluster);
    let r2 = rl.read("rw").once().await.unwrap();
    flush_scripts(&cluster);
    assert!(rl.write("rw").once().await.is_err(), "a writer got in past two readers");
    flush_scripts(&cluster);
    r1.release().await.unwrap();
    flush_scripts(&cluster);
    r2.release().await.unwrap();
    flush_scripts(&cluster);
    let w = rl.write("rw").once().await.unwrap();
    flush_scripts(&cluster);
    assert!(rl.read("rw").once().await.is_err(), "a reader got in past a writer");
    flush_scripts(&cluster);
    w.release().await.unwrap();

    // Reentrant.
    flush_scripts(&cluster);
    let a = rl.reentrant("re", "job-1").once().await.unwrap();
    flush_scripts(&cluster);
    let b = rl.reentrant("re", "job-1").once().await.unwrap();
    flush_scripts(&cluster);
    assert!(rl.reentrant("re", "job-2").once().await.is_err());
    flush_scripts(&cluster);
    a.release().await.unwrap();
    flush_scripts(&cluster);
    assert!(rl.reentrant("re", "job-2").once().await.is_err(), "still held by b");
    flush_scripts(&cluster);
    b.release().await.unwrap();
    flush_scripts(&cluster);
    rl.reentrant("re", "job-2").once().await.unwrap().release().await.unwrap();

    // Inspect / force release (no arguments / one).
    flush_scripts(&cluster);
    let _held = rl.try_lock("ins").await.unwrap();
    flush_scripts(&cluster);
    let _ = rl.inspect("ins").await.unwrap();
    flush_scripts(&cluster);
    assert!(rl.force_release("ins").await.unwrap() > 0);
    assert!(common::eventually(SETTLE, || cluster.count_key("ins") == 0).await);

    assert!(evals(&cluster) > before + 20, "the fallback was not exercised");
}
