//! The waiting line of one client: a waiter behind a first waiter of the same client lets
//! that one stand in for its ticks, but not one failing for its own reason, polling slowly
//! or blocked; skipped ticks are paced like attempts, so `max_attempts` and `max_wait` bound
//! the same wait; a granted waiter hands on no wake-up. While the client itself holds the
//! lock its waiters do not poll, yet they get in as soon as that hold ends by any means (a
//! forced release, a loss, a shutdown).

use crate::common;

use std::future::IntoFuture;
use std::sync::Arc;
use std::sync::atomic::{AtomicUsize, Ordering};
use std::time::{Duration, Instant};

use redlock::{ErrorKind, Redlock, Retry};
use redlock_testkit::{Cluster, FaultyCluster, Fuzz, NetFault};

/// Polls every `delay` (no jitter), bounded by `max_wait`.
fn every(delay: Duration, max_wait: Duration) -> Retry {
    Retry::new()
        .with_unbounded_attempts()
        .with_delay(delay)
        .with_jitter(Duration::ZERO)
        .with_max_wait(max_wait)
}

/// A task waiting for `key` with the client's policy, or with `retry`.
fn waits(
    rl: &Redlock,
    key: &'static str,
    retry: Option<Retry>,
) -> tokio::task::JoinHandle<redlock::Result<()>> {
    let rl = rl.clone();
    tokio::spawn(async move {
        match retry {
            Some(retry) => rl.lock(key).retry(retry).await.map(drop),
            None => rl.lock(key).await.map(drop),
        }
    })
}

fn ms(n: u64) -> Duration {
    Duration::from_millis(n)
}

fn client(cluster: &Cluster, node_timeout: Duration, retry: Retry) -> Redlock {
    common::builder(cluster, node_timeout).retry(retry).build().unwrap()
}

/// Five nodes behind proxies and a client of them with `node_timeout` and `retry`, its
/// connections open.
async fn behind_proxies(node_timeout: Duration, retry: Retry) -> (FaultyCluster, Redlock) {
    let faulty = FaultyCluster::start(5).unwrap();
    let rl = common::builder_for(faulty.urls(), node_timeout).retry(retry).build().unwrap();
    common::warm(&rl).await;
    (faulty, rl)
}

/// Waits until a waiter is subscribed to `key`'s releases on nodes `0..nodes` (a first
/// waiter in line).
async fn subscribed(cluster: &Cluster, key: &str, nodes: usize) {
    let channel = format!("redlock:released:{key}");
    let ok = common::eventually(Duration::from_secs(3), || {
        (0..nodes).all(|i| {
            let mut con = cluster.node(i).connection().unwrap();
            let (_, n): (String, i64) =
                redis::cmd("PUBSUB").arg("NUMSUB").arg(&channel).query(&mut con).unwrap();
            n >= 1
        })
    })
    .await;
    assert!(ok, "the first waiter never got in line");
}

// ---------------------------------------------------------------------------------------
// A first waiter whose attempts fail for a reason of its own holds the next one back.
// ---------------------------------------------------------------------------------------

/// The first waiter is fenced, and its fencing rounds fail (`Unavailable`, retryable): two
/// counters are not numbers and one node is down. Its acquisitions succeed, so the key is
/// free for anyone who does not fence. The second waiter (not fenced) could take the lock
/// at once; behind a first waiter that is alive it lets every tick pass until the last
/// one its policy allows, at `max_wait`.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_first_waiter_failing_for_its_own_reason_stands_in_for_no_one() {
    let mut cluster = common::cluster(5);
    cluster.node_mut(4).kill().unwrap();
    for i in 0..2 {
        common::run(&cluster, i, &["SET", "redlock:fence:fk", "not-a-number"]);
    }
    let rl = client(&cluster, ms(100), every(ms(10), Duration::from_secs(3)));
    // First in line: a fenced lock that can never fix its token (retryable failure).
    let fenced = tokio::spawn({
        let rl = rl.clone();
        async move {
            rl.lock("fk").fenced().retry(every(ms(10), Duration::from_secs(6))).await.map(drop)
        }
    });
    subscribed(&cluster, "fk", 4).await;
    let asked = Instant::now();
    let plain = rl.lock("fk").await;
    let waited = asked.elapsed();
    fenced.abort();
    assert!(
        plain.is_ok() && waited < Duration::from_secs(1),
        "a plain lock of a free key waited {waited:?} behind a fenced waiter that keeps \
         failing to fix its token (the policy's max_wait is 3 s), then: {:?}",
        plain.as_ref().map(drop).map_err(|err| err.to_string())
    );
    plain.unwrap().release().await.unwrap();
}

/// Same with the most ordinary reason of one's own: the first waiter asked for a lease
/// too short for the nodes' latency, so every grant expires during its round (`Expired`,
/// retryable). A lock with the default lease could be taken at any time.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_first_waiter_whose_lease_is_too_short_stands_in_for_no_one() {
    let (faulty, rl) = behind_proxies(ms(200), every(ms(10), Duration::from_secs(3))).await;
    for i in 0..5 {
        faulty.proxy(i).set_fault(common::latency(6));
    }
    // First in line: every round takes >= 12 ms, a 10 ms lease keeps nothing of it.
    let short = tokio::spawn({
        let rl = rl.clone();
        async move {
            rl.lock("short")
                .ttl(ms(10))
                .retry(every(ms(10), Duration::from_secs(6)))
                .await
                .map(drop)
        }
    });
    subscribed(faulty.cluster(), "short", 5).await;
    let asked = Instant::now();
    let normal = rl.lock("short").await;
    let waited = asked.elapsed();
    short.abort();
    let lock = normal.expect("the key was free for a 10 s lease the whole time");
    lock.release().await.unwrap();
    assert!(
        waited < Duration::from_secs(1),
        "a lock of a free key waited {waited:?} behind a waiter whose 10 ms lease always \
         expires during its round (the policy's max_wait is 3 s)"
    );
}

// ---------------------------------------------------------------------------------------
// "Alive" is judged with the second waiter's policy, not the first one's.
// ---------------------------------------------------------------------------------------

/// The first waiter polls every 1.5 s (its own policy), the second every 10 ms. The
/// holder vanishes (its lease runs out: no release is published). The stall threshold is
/// the second waiter's, 2 x (10 ms + 8 x 200 ms) = 3.2 s, so the first one always counts
/// as alive: the free lock idles until the first one's next tick, and the second one gets
/// it only after that, instead of within its own 10 ms poll.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_lock_left_to_expire_is_taken_at_the_fast_waiters_tick_not_the_slow_first_ones() {
    let cluster = common::cluster(5);
    let holder = common::client(&cluster);
    let rl = client(&cluster, ms(200), every(ms(10), Duration::from_secs(5)));
    // The holder dies: its lock is never released, it expires after 400 ms.
    std::mem::forget(holder.try_lock("idle").ttl(ms(400)).await.unwrap());
    let expires = Instant::now() + ms(400);
    let slow = tokio::spawn({
        let rl = rl.clone();
        async move {
            let lock =
                rl.lock("idle").retry(every(ms(1500), Duration::from_secs(8))).await.unwrap();
            lock.release().await.unwrap();
        }
    });
    subscribed(&cluster, "idle", 5).await;
    let fast = rl.lock("idle").await.unwrap();
    let late = Instant::now().saturating_duration_since(expires);
    fast.release().await.unwrap();
    slow.await.unwrap();
    assert!(
        late < ms(500),
        "the lock expired {late:?} before the 10 ms poller got it: it idled until the \
         1.5 s poller in front of it tried"
    );
}

// ---------------------------------------------------------------------------------------
// A first waiter on a blocked runtime: the stall threshold scales with 8 node timeouts.
// ---------------------------------------------------------------------------------------

/// The first waiter's runtime is blocked by application code (a synchronous sleep). It is
/// not woken by the release (it cannot run), and the second waiter lets its ticks pass
/// until the first one counts as stalled: 2 x (10 ms + 8 x 500 ms) = 8 s, past its own
/// 3 s `max_wait`, so it attempts only at its last tick.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_first_waiter_on_a_blocked_runtime_holds_no_one_back() {
    let cluster = common::cluster(5);
    let holder = common::client(&cluster);
    let rl = client(&cluster, ms(500), every(ms(10), Duration::from_secs(3)));
    common::warm(&rl).await;
    let held = holder.try_lock("blocked").await.unwrap();
    let (in_line_tx, in_line_rx) = std::sync::mpsc::channel::<()>();
    let blocked = std::thread::spawn({
        let rl = rl.clone();
        move || {
            let runtime =
                tokio::runtime::Builder::new_current_thread().enable_all().build().unwrap();
            runtime.block_on(async move {
                let first = tokio::spawn(async move {
                    rl.lock("blocked").retry(every(ms(10), Duration::from_secs(8))).await.map(drop)
                });
                tokio::time::sleep(ms(300)).await;
                in_line_tx.send(()).unwrap();
                // Application code blocks this runtime's only worker.
                std::thread::sleep(Duration::from_secs(4));
                first.abort();
            });
        }
    });
    tokio::task::spawn_blocking(move || in_line_rx.recv().unwrap()).await.unwrap();
    let second = tokio::spawn({
        let rl = rl.clone();
        async move {
            let lock = rl.lock("blocked").await;
            (lock.map(drop), Instant::now())
        }
    });
    tokio::time::sleep(ms(100)).await;
    let released_at = Instant::now();
    held.release().await.unwrap();
    let (lock, granted_at) = second.await.unwrap();
    tokio::task::spawn_blocking(move || blocked.join().unwrap()).await.unwrap();
    lock.expect("the lock was free from the release on");
    let gap = granted_at - released_at;
    assert!(
        gap < Duration::from_secs(1),
        "the second waiter got the free lock {gap:?} after its release, held back by a \
         first waiter that could not run"
    );
}

// ---------------------------------------------------------------------------------------
// Skipped ticks cost a pause, real attempts a pause and a round: max_attempts shrinks.
// ---------------------------------------------------------------------------------------

/// Nodes 20 ms away each way: an attempt takes >= 40 ms, so a waiter allowed 30 attempts
/// with no pause waits >= 30 rounds (>= 1.2 s) on its own. Behind a live first waiter its
/// skipped ticks must be paced like attempts, not take no time (it would give up after one
/// real attempt): the lock is handed over after 400 ms, and the second waiter, still
/// waiting, gets it.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn skipped_ticks_are_paced_like_attempts_so_max_attempts_bounds_the_same_wait() {
    let (faulty, rl) = behind_proxies(ms(300), every(ms(10), Duration::from_secs(5))).await;
    let holder = common::client(faulty.cluster());
    let held = holder.try_lock("rounds").await.unwrap();
    for i in 0..5 {
        faulty.proxy(i).set_fault(common::latency(20));
    }
    let first = tokio::spawn({
        let rl = rl.clone();
        async move {
            let lock = rl.lock("rounds").await.unwrap();
            lock.release().await.unwrap();
        }
    });
    subscribed(faulty.cluster(), "rounds", 5).await;
    let thirty =
        Retry::new().with_max_attempts(30).with_delay(Duration::ZERO).with_jitter(Duration::ZERO);
    let second = tokio::spawn({
        let rl = rl.clone();
        async move {
            let started = Instant::now();
            let lock = rl.lock("rounds").retry(thirty).await;
            (lock.map(drop), started.elapsed())
        }
    });
    tokio::time::sleep(ms(400)).await;
    held.release().await.unwrap();
    first.await.unwrap();
    let (lock, waited) = second.await.unwrap();
    assert!(
        lock.is_ok(),
        "30 attempts with 40 ms rounds ended after {waited:?}, before the lock was handed \
         on at 400 ms: {}",
        lock.unwrap_err()
    );
}

// ---------------------------------------------------------------------------------------
// Read-write: a reader in front of this client's writer is refused by the writer's
// own intent, which the writer, letting its ticks pass, stops renewing.
// ---------------------------------------------------------------------------------------

/// Client X holds a read share on nodes 0-2. Our writer's first attempt is refused there
/// (its intent is recorded) and granted on 3-4, whose clean-up is held up 300 ms; our
/// reader asks meanwhile, is refused by the writer's intent, and gets in line first. X
/// releases: the key is free for the writer (an intent refuses readers, not writers). The
/// writer must not let its ticks pass behind the reader (which stays refused until the
/// writer's intent runs out, then takes a share for a second): it keeps attempting, and
/// renewing its intent, and gets the free lock within 500 ms. (It polls every 40 ms: each
/// attempt leaves a grant on nodes 3-4 whose clean-up is held, and a client names at most
/// 16 of its abandoned holds to the nodes; with more held back, its attempts would be
/// refused there by its own old grants until the clean-ups drain.)
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_writer_behind_its_clients_reader_keeps_attempting_and_its_intent() {
    let (faulty, rl) = behind_proxies(ms(500), every(ms(40), Duration::from_secs(6))).await;
    let x = common::client(faulty.cluster());
    let share = x.read("doc").await.unwrap();
    for i in 3..5 {
        common::run(faulty.cluster(), i, &["DEL", "doc"]);
        // The writer's clean-ups there (by their script; no waiter is told of them).
        faulty.proxy(i).hold_requests_containing(common::rw_release_sha().as_bytes(), ms(300));
    }
    let writer = tokio::spawn({
        let rl = rl.clone();
        async move {
            let lock = rl.write("doc").await;
            (lock, Instant::now())
        }
    });
    tokio::time::sleep(ms(100)).await;
    let reader = tokio::spawn({
        let rl = rl.clone();
        async move {
            let share = rl.read("doc").await.unwrap();
            tokio::time::sleep(Duration::from_secs(1)).await;
            share.release().await.unwrap();
        }
    });
    tokio::time::sleep(ms(400)).await;
    for i in 3..5 {
        faulty.proxy(i).release_holds();
    }
    let released_at = Instant::now();
    share.release().await.unwrap();
    let (lock, granted_at) = writer.await.unwrap();
    let lock = lock.expect("the writer got the lock in the end");
    lock.release().await.unwrap();
    reader.await.unwrap();
    let gap = granted_at - released_at;
    assert!(
        gap < ms(500),
        "the writer got the free lock {gap:?} after the last share went: behind its own \
         client's reader, refused by the writer's intent"
    );
}

// ---------------------------------------------------------------------------------------
// A huge pause in the wait behind this client's own waiter.
// ---------------------------------------------------------------------------------------

/// The first wait behind this client's waiter computes its deadline from the pause, which
/// must not overflow (and panic) for a huge pause: a single attempt with a `delay` meant
/// as "never poll", `Retry::never().with_delay(Duration::MAX)`.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn an_in_line_wait_with_a_huge_delay_does_not_panic() {
    let cluster = common::cluster(3);
    let holder = common::client(&cluster);
    let rl = client(&cluster, ms(200), every(ms(10), Duration::from_secs(5)));
    let held = holder.try_lock("huge").await.unwrap();
    let first = waits(&rl, "huge", None);
    subscribed(&cluster, "huge", 3).await;
    let second = waits(&rl, "huge", Some(Retry::never().with_delay(Duration::MAX)));
    tokio::time::sleep(ms(200)).await;
    held.release().await.unwrap();
    first.await.unwrap().unwrap();
    let second = tokio::time::timeout(Duration::from_secs(3), second).await;
    if let Ok(joined) = second {
        assert!(!joined.as_ref().is_err_and(|e| e.is_panic()), "the waiter panicked: {joined:?}");
    }
}

// ---------------------------------------------------------------------------------------
// What holds.
// ---------------------------------------------------------------------------------------

/// Mutual exclusion: two clients, plain locks and multi-resource locks sharing the
/// first key, waiters cancelled mid-wait at random: never two holders at once, and the
/// registry and waiter mutexes never deadlock (everything finishes).
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn mixed_waiters_of_two_clients_never_hold_at_once_and_never_deadlock() {
    let cluster = common::cluster(5);
    let clients = [
        client(&cluster, ms(200), every(ms(5), Duration::from_secs(8))),
        client(&cluster, ms(200), every(ms(5), Duration::from_secs(8))),
    ];
    let inside = Arc::new(AtomicUsize::new(0));
    let most = Arc::new(AtomicUsize::new(0));
    let granted = Arc::new(AtomicUsize::new(0));
    let mut tasks = Vec::new();
    for n in 0..12usize {
        let rl = clients[n % 2].clone();
        let (inside, most, granted) = (inside.clone(), most.clone(), granted.clone());
        tasks.push(tokio::spawn(async move {
            let deadline = Instant::now() + Duration::from_secs(3);
            let mut round = 0u64;
            while Instant::now() < deadline {
                round += 1;
                // Every third wait is cancelled after a while.
                let patience = if (n as u64 + round).is_multiple_of(3) { ms(15) } else { ms(5000) };
                let enter = |inside: &AtomicUsize, most: &AtomicUsize| {
                    let now = inside.fetch_add(1, Ordering::SeqCst) + 1;
                    most.fetch_max(now, Ordering::SeqCst);
                };
                if n % 3 == 0 {
                    let keys = ["m", "other"];
                    let Ok(Ok(lock)) =
                        tokio::time::timeout(patience, rl.many(&keys).into_future()).await
                    else {
                        continue;
                    };
                    enter(&inside, &most);
                    tokio::time::sleep(ms(2)).await;
                    inside.fetch_sub(1, Ordering::SeqCst);
                    lock.release().await.unwrap();
                } else {
                    let Ok(Ok(lock)) =
                        tokio::time::timeout(patience, rl.lock("m").into_future()).await
                    else {
                        continue;
                    };
                    enter(&inside, &most);
                    tokio::time::sleep(ms(2)).await;
                    inside.fetch_sub(1, Ordering::SeqCst);
                    lock.release().await.unwrap();
                }
                granted.fetch_add(1, Ordering::SeqCst);
            }
        }));
    }
    for task in tasks {
        tokio::time::timeout(Duration::from_secs(8), task).await.expect("a waiter hung").unwrap();
    }
    assert_eq!(most.load(Ordering::SeqCst), 1, "two holders at once");
    assert!(granted.load(Ordering::SeqCst) > 20, "too few grants: {granted:?}");
}

/// Behind a live first waiter, `max_wait` still bounds the wait, and the error comes
/// from a real attempt.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn behind_a_live_first_waiter_max_wait_bounds_the_wait_with_a_real_attempt() {
    let cluster = common::cluster(5);
    let holder = common::client(&cluster);
    let rl = client(&cluster, ms(50), every(ms(10), Duration::from_secs(4)));
    let held = holder.try_lock("mw").await.unwrap();
    let first = waits(&rl, "mw", None);
    subscribed(&cluster, "mw", 5).await;
    let started = Instant::now();
    let err = rl.lock("mw").retry(every(ms(50), ms(700))).await.unwrap_err();
    let waited = started.elapsed();
    assert_eq!(err.kind(), ErrorKind::NotAcquired, "{err}");
    // A real attempt's: decided on a quorum of "held" (an answer that comes after the
    // round's short wait for stragglers, on a loaded machine, is "not waited for").
    assert!(err.held_by_others() >= 3, "the error of a real attempt: {err}");
    assert_eq!(err.held_by_others() + err.pending(), 5, "the error of a real attempt: {err}");
    assert!(waited >= ms(600) && waited < ms(1000), "gave up after {waited:?} (max_wait 700 ms)");
    held.release().await.unwrap();
    first.await.unwrap().unwrap();
}

/// A granted writer does not hand on a stale wake-up, and a new one still reaches
/// the next writer: three writers of one client are each woken by the previous release.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn writers_in_line_are_each_woken_by_the_previous_release() {
    let cluster = common::cluster(5);
    let holder = common::client(&cluster);
    // Polling far too slow to explain the handoffs.
    let rl = client(&cluster, ms(200), every(Duration::from_secs(3), Duration::from_secs(20)));
    let held = holder.write("w").await.unwrap();
    let mut writers = Vec::new();
    for _ in 0..3 {
        let rl = rl.clone();
        writers.push(tokio::spawn(async move {
            let lock = rl.write("w").await.unwrap();
            tokio::time::sleep(ms(20)).await;
            lock.release().await.unwrap();
            Instant::now()
        }));
        tokio::time::sleep(ms(100)).await;
    }
    let started = Instant::now();
    held.release().await.unwrap();
    for writer in writers {
        writer.await.unwrap();
    }
    let took = started.elapsed();
    assert!(took < Duration::from_secs(2), "three handoffs took {took:?}: someone was polled");
}

// ---------------------------------------------------------------------------------------
// `max_wait` with ticks skipped behind a waiter of the same client.
// ---------------------------------------------------------------------------------------

/// A tick skipped behind the first waiter is paced by `pause` plus that waiter's attempt,
/// and no attempt may start after `max_wait`. Attempts take ~500 ms (250 ms each way); the
/// second waiter polls every 600 ms with max_wait 1.3 s: it gives up by ~1.8 s. Were the
/// tick at 0.6 s skipped and the next one due at 0.6 + 0.6 + 0.5 = 1.7 s, its real
/// attempt would start 0.4 s past max_wait and fail at ~2.2 s.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_skipped_tick_does_not_push_the_last_attempt_past_max_wait() {
    let (faulty, rl) = behind_proxies(Duration::from_secs(1), Retry::never()).await;
    let holder = common::client(faulty.cluster());
    let held = holder.try_lock("mw2").await.unwrap();
    for i in 0..5 {
        faulty.proxy(i).set_fault(common::latency(250));
    }
    // First in line: attempts back to back (10 ms pause, ~500 ms attempts).
    let first = tokio::spawn({
        let rl = rl.clone();
        async move { rl.lock("mw2").retry(every(ms(10), Duration::from_secs(8))).await.map(drop) }
    });
    subscribed(faulty.cluster(), "mw2", 5).await;
    // Let it finish a couple of attempts (held = true).
    tokio::time::sleep(ms(1200)).await;
    let asked = Instant::now();
    let err = rl.lock("mw2").retry(every(ms(600), ms(1300))).await.unwrap_err();
    let waited = asked.elapsed();
    first.abort();
    held.release().await.unwrap();
    assert_eq!(err.kind(), ErrorKind::NotAcquired, "{err}");
    assert!(
        waited < ms(1950),
        "gave up after {waited:?}: max_wait 1.3 s plus one ~500 ms attempt is ~1.8 s; a \
         skipped tick pushed the last real attempt past max_wait"
    );
}

// Waiters while the client itself holds the lock.

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
    common::warm(&a).await;
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
/// needs nothing but the now free `K`, must not sit out its ticks behind C's gone hold:
/// it gets `K` within a second of the force release.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_plain_waiter_behind_a_refused_multi_waiter_gets_the_lock_soon_after_a_force_release() {
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
/// the lock gone and the lease reports it lost. From then on C's waiter must try again at
/// its ticks (its `SET`s reach the nodes) instead of sitting them out until the hold's old
/// validity ends. (It may get `K` at once: the loss releases the keys, the ones the failed
/// extension set again on the nodes that had lost them included, sometimes before the
/// test's first count of `SET`s.)
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
/// `NotAcquired` (its last tick a real attempt).
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
/// again and the re-send finds B's key there. Nothing on the node tells a key its first
/// send removed from one gone before (an operator's forced release, outside the model):
/// a release sent again counts as done (`guide::order`), and B's hold is untouched.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_resent_release_that_finds_another_owner_leaves_its_hold_alone() {
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
    assert!(result.is_ok(), "a release sent again counts as done: {result:?}");
}

/// The same through `with_lock`: A's work is short (no extension runs during it); while
/// it runs nodes 1 and 2 lose A's key and B takes the lock on them. A's release at the end
/// is reset on 1 and 2 and re-sent: it counts as done, and B's hold is untouched.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn with_lock_whose_release_is_resent_leaves_another_owners_hold_alone() {
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
    assert_eq!(result.unwrap(), "work done");
}

/// Nodes 1 and 2 lose A's key (nobody takes it); A's release is written on them, dropped by
/// the proxy, re-sent, and finds the key absent: nothing tells that from its own earlier
/// send's removal, so it counts as done (`guide::order`), and no key is left.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_resent_release_that_finds_the_key_absent_counts_as_done() {
    let faulty = Arc::new(FaultyCluster::start(3).unwrap());
    let a = common::builder_for(faulty.urls(), Duration::from_millis(250)).build().unwrap();
    common::warm(&a).await;
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
    assert!(result.is_ok(), "a release sent again counts as done: {result:?}");
    assert_eq!(faulty.cluster().count_key("k"), 0);
}

/// A first waiter whose future was polled once (it joined the line) and is then kept
/// without being polled (stored, or a `select!` branch that stays alive) costs the waiters
/// behind it one stall, not one per release: once a waiter took its place, the turn is
/// handed on past it until it is polled again.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_first_waiter_no_longer_polled_costs_the_line_one_stall_not_one_per_release() {
    let cluster = common::cluster(3);
    let holder = common::client(&cluster);
    let rl = client(&cluster, ms(200), every(ms(50), Duration::from_secs(20)));
    let held = holder.try_lock("kept").await.unwrap();
    let mut kept = Box::pin(rl.lock("kept").into_future());
    assert!(tokio::time::timeout(ms(200), &mut kept).await.is_err());
    // Four waiters behind it, in order, each holding the lock for a moment.
    let (turns, mut taken) = tokio::sync::mpsc::unbounded_channel();
    for _ in 0..4 {
        let (rl, turns) = (rl.clone(), turns.clone());
        tokio::spawn(async move {
            let lock = rl.lock("kept").await.unwrap();
            let granted_at = Instant::now();
            tokio::time::sleep(ms(20)).await;
            let released_at = Instant::now();
            lock.release().await.unwrap();
            turns.send((granted_at, released_at)).unwrap();
        });
        tokio::time::sleep(ms(20)).await;
    }
    tokio::time::sleep(ms(300)).await;
    held.release().await.unwrap();
    let mut order = Vec::new();
    for _ in 0..4 {
        order.push(tokio::time::timeout(Duration::from_secs(10), taken.recv()).await.unwrap());
    }
    let order: Vec<(Instant, Instant)> = order.into_iter().map(Option::unwrap).collect();
    // From one waiter's release to the next one's grant, three times.
    let gaps: Vec<Duration> =
        order.windows(2).map(|pair| pair[1].0.saturating_duration_since(pair[0].1)).collect();
    let total: Duration = gaps.iter().sum();
    // A stall is 100 ms: three of them, at least 300 ms.
    assert!(total < ms(200), "the hand-ons took {gaps:?}: each waited for the kept waiter");
    drop(kept);
}
