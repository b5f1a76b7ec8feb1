//! Review of the waiting line: a waiter for an exclusive hold behind a first waiter of the
//! same client lets that one stand in for its ticks; a granted waiter hands on no wake-up.
//!
//! The first version (9b989f1: skip every tick behind a first waiter that attempted in the
//! last seconds) failed the first six tests here: waits until `max_wait` behind a first
//! waiter failing for its own reason, polling slowly or blocked, `max_attempts` ending the
//! wait early, a writer behind a reader, a panic on a huge delay. They pass on the rule as
//! it is; the others confirm what held in both. The second review broke the rule once
//! more (the last test here: a skipped tick paced past `max_wait` pushed the last real
//! attempt beyond it), fixed by checking the paced tick against the policy.

use crate::common;

use std::future::IntoFuture;
use std::sync::Arc;
use std::sync::atomic::{AtomicUsize, Ordering};
use std::time::{Duration, Instant};

use redlock::{ErrorKind, Redlock, Retry};
use redlock_testkit::{Cluster, FaultyCluster};

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
// (a) A first waiter whose attempts fail for a reason of its own holds the next one back.
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
// (a) "Alive" is judged with the second waiter's policy, not the first one's.
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
// (a) A first waiter on a blocked runtime: the stall threshold scales with 8 node timeouts.
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
// (b) Skipped ticks cost a pause, real attempts a pause and a round: max_attempts shrinks.
// ---------------------------------------------------------------------------------------

/// Nodes 20 ms away each way: an attempt takes >= 40 ms. A waiter allowed 30 attempts
/// with no pause used to wait >= 30 rounds (>= 1.2 s); behind a live first waiter its 29
/// skipped ticks take no time, and it gives up after one real attempt. The lock is handed
/// over after 400 ms: before the change the second waiter was still waiting and got it.
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
// (a) Read-write: a reader in front of this client's writer is refused by the writer's
// own intent, which the writer, letting its ticks pass, stops renewing.
// ---------------------------------------------------------------------------------------

/// Client X holds a read share on nodes 0-2. Our writer's first attempt is refused there
/// (its intent is recorded) and granted on 3-4, whose clean-up is held up 300 ms; our
/// reader asks meanwhile, is refused by the writer's intent, and gets in line first. X
/// releases: the key is free for the writer (an intent refuses readers, not writers),
/// but the writer lets its ticks pass behind the reader, which stays refused until the
/// writer's intent runs out, then takes a share for a second: the writer gets the lock
/// only after it. Before the change the writer took it at its next tick.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_writer_behind_its_clients_reader_keeps_attempting_and_its_intent() {
    let (faulty, rl) = behind_proxies(ms(500), every(ms(10), Duration::from_secs(6))).await;
    let x = common::client(faulty.cluster());
    let share = x.read("doc").await.unwrap();
    for i in 3..5 {
        common::run(faulty.cluster(), i, &["DEL", "doc"]);
        // The writer's clean-up there (it names the release channel; acquisitions do not).
        faulty.proxy(i).hold_requests_containing(b"redlock:released:doc", ms(300));
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
// (d) A panic the change introduced in the in_line initial wait.
// ---------------------------------------------------------------------------------------

/// The initial wait behind this client's waiter used `tokio::time::sleep(pause)`; it now
/// computes `Instant::now() + pause`, which panics for a huge pause (a single attempt
/// with a `delay` meant as "never poll": `Retry::never().with_delay(Duration::MAX)`).
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

/// (e) Mutual exclusion: two clients, plain locks and multi-resource locks sharing the
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

/// (b) Behind a live first waiter, `max_wait` still bounds the wait, and the error comes
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

/// (c) A granted writer does not hand on a stale wake-up, and a new one still reaches
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
// Second review (61148fb).
// ---------------------------------------------------------------------------------------

/// (b) A skipped tick is paced `pause + the first waiter's last attempt`, but only
/// `waited + pause <= max_wait` is checked before it: the next tick, the "last real
/// attempt", can start after max_wait. Attempts take ~500 ms (250 ms each way); the
/// second waiter polls every 600 ms with max_wait 1.3 s. Baseline (198491b): it gives up
/// by ~1.6 s (no attempt starts after 1.3 s). Now: tick at 0.6 s skipped (0.6 + 0.6 <=
/// 1.3), next due 0.6 + 0.6 + 0.5 = 1.7 s, a real attempt starting 0.4 s past max_wait,
/// error at ~2.2 s.
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
