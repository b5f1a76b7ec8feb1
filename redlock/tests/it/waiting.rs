//! Waiting: woken on release, polling as a fallback, bounded, and leaving nothing behind.

use crate::common;

use std::future::IntoFuture;
use std::time::{Duration, Instant};

use redlock::{ErrorKind, Redlock, Retry};
use redlock_testkit::{Cluster, FaultyCluster};

/// A client whose polling is far too slow to explain a fast handoff.
fn patient(cluster: &Cluster, poll: Duration, max_wait: Duration) -> Redlock {
    Redlock::builder()
        .nodes(cluster.urls())
        .node_timeout(Duration::from_millis(200))
        .retry(
            Retry::new()
                .with_unbounded_attempts()
                .with_delay(poll)
                .with_jitter(Duration::ZERO)
                .with_max_wait(max_wait),
        )
        .build()
        .unwrap()
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_waiter_is_woken_by_the_release_not_by_its_poll() {
    let cluster = common::cluster(5);
    let holder = common::client(&cluster);
    let waiter = patient(&cluster, Duration::from_secs(5), Duration::from_secs(20));
    let lock = holder.try_lock("hot").await.unwrap();
    let waiting = tokio::spawn(async move {
        let lock = waiter.lock("hot").await.unwrap();
        let granted_at = Instant::now();
        lock.release().await.unwrap();
        granted_at
    });
    // Let the waiter fail once and subscribe.
    assert!(
        common::eventually(Duration::from_secs(2), || common::subscribers(&cluster, "hot")
            .iter()
            .all(|&n| n == 1))
        .await
    );
    let released_at = Instant::now();
    lock.release().await.unwrap();
    let granted_at = waiting.await.unwrap();
    let gap = granted_at - released_at;
    assert!(
        gap < Duration::from_secs(1),
        "handoff took {gap:?}: the 5 s poll, not the release, woke the waiter"
    );
    // The waiter is done: no subscription is left.
    assert!(
        common::eventually(Duration::from_secs(2), || common::subscribers(&cluster, "hot")
            .iter()
            .all(|&n| n == 0))
        .await
    );
}

/// How many plain-lock acquisition attempts `node` ran so far (each calls `SET` once,
/// native or scripted).
fn attempts_run(node: &redlock_testkit::RedisNode) -> u64 {
    common::create_calls(node)
}

/// A waiter subscribes after its first refusal; a release that comes before its
/// subscription (here: while its refusal is still on its way over slow links) is not
/// missed: once subscribed, it attempts again instead of sleeping its 5 s poll.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_release_before_the_waiters_subscription_still_wakes_it() {
    let faulty = FaultyCluster::start(3).unwrap();
    let cluster = faulty.cluster();
    let holder = common::client(cluster);
    let waiter = Redlock::builder()
        .nodes(faulty.urls())
        .node_timeout(Duration::from_secs(1))
        .retry(
            Retry::new()
                .with_unbounded_attempts()
                .with_delay(Duration::from_secs(5))
                .with_jitter(Duration::ZERO)
                .with_max_wait(Duration::from_secs(20)),
        )
        .build()
        .unwrap();
    waiter.connect().await.unwrap();
    let lock = holder.try_lock("k").await.unwrap();
    let before: Vec<u64> = cluster.nodes().iter().map(attempts_run).collect();
    // 200 ms each way between the waiter and the nodes; the holder is not slowed.
    for i in 0..faulty.len() {
        faulty.proxy(i).set_fault(common::latency(200));
    }
    let waiting = tokio::spawn(async move {
        let lock = waiter.lock("k").await.unwrap();
        let granted_at = Instant::now();
        lock.release().await.unwrap();
        granted_at
    });
    // The waiter's first attempt ran on every node (refused): its answer needs 200 ms more
    // to reach it, and its subscription several round trips after that.
    let attempted = || {
        let now = cluster.nodes().iter().map(attempts_run);
        now.zip(&before).all(|(now, before)| now > *before)
    };
    assert!(common::eventually(Duration::from_secs(3), attempted).await);
    let released_at = Instant::now();
    lock.release().await.unwrap();
    let granted_at = waiting.await.unwrap();
    let gap = granted_at - released_at;
    assert!(gap < Duration::from_secs(4), "granted {gap:?} after the release: by the 5 s poll");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_lock_left_to_expire_is_found_by_polling() {
    let cluster = common::cluster(3);
    let holder = common::client(&cluster);
    let waiter = patient(&cluster, Duration::from_millis(50), Duration::from_secs(5));
    let lock = holder.try_lock("expiring").ttl(Duration::from_millis(300)).await.unwrap();
    let started = Instant::now();
    let token = lock.token().to_owned();
    std::mem::forget(lock); // a crashed holder: no release, no notification
    let lock = waiter.lock("expiring").await.unwrap();
    assert!(started.elapsed() >= Duration::from_millis(250));
    assert_ne!(lock.token(), token);
    lock.release().await.unwrap();
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn waiting_is_bounded_by_the_max_wait() {
    let cluster = common::cluster(3);
    let holder = common::client(&cluster);
    let waiter = patient(&cluster, Duration::from_millis(50), Duration::from_millis(400));
    let lock = holder.try_lock("busy").await.unwrap();
    let started = Instant::now();
    let err = waiter.lock("busy").await.unwrap_err();
    let waited = started.elapsed();
    assert_eq!(err.kind(), ErrorKind::NotAcquired);
    assert!(waited >= Duration::from_millis(300) && waited < Duration::from_secs(2), "{waited:?}");
    lock.release().await.unwrap();
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_dropped_waiter_leaves_no_lock_and_no_subscription() {
    let cluster = common::cluster(3);
    let holder = common::client(&cluster);
    let waiter = patient(&cluster, Duration::from_secs(5), Duration::from_secs(20));
    let lock = holder.try_lock("k").await.unwrap();
    let waiting = tokio::spawn(async move { waiter.lock("k").await });
    assert!(
        common::eventually(Duration::from_secs(2), || common::subscribers(&cluster, "k")
            .iter()
            .all(|&n| n == 1))
        .await
    );
    waiting.abort();
    assert!(waiting.await.unwrap_err().is_cancelled());
    assert!(
        common::eventually(Duration::from_secs(2), || common::subscribers(&cluster, "k")
            .iter()
            .all(|&n| n == 0))
        .await
    );
    assert_eq!(cluster.nodes_holding("k", lock.token()).len(), 3);
    lock.release().await.unwrap();
    // Decided at the quorum: the last node's release may still be on its way.
    assert!(common::eventually(Duration::from_secs(1), || cluster.count_key("k") == 0).await);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn waiters_share_one_subscription_per_node() {
    let cluster = common::cluster(3);
    let holder = common::client(&cluster);
    let shared = patient(&cluster, Duration::from_secs(5), Duration::from_secs(20));
    let lock = holder.try_lock("shared").await.unwrap();
    let waiters: Vec<_> = (0..4)
        .map(|_| {
            let rl = shared.clone();
            tokio::spawn(async move { rl.lock("shared").await.unwrap().release().await.unwrap() })
        })
        .collect();
    tokio::time::sleep(Duration::from_millis(300)).await;
    // Four waiters of one client: one subscriber connection per node.
    assert_eq!(common::subscribers(&cluster, "shared"), vec![1, 1, 1]);
    let clients: Vec<usize> = cluster
        .nodes()
        .iter()
        .map(|node| {
            let mut con = node.connection().unwrap();
            let list: String = redis::cmd("CLIENT").arg("LIST").query(&mut con).unwrap();
            list.lines().filter(|l| l.contains("cmd=subscribe") || l.contains("sub=1")).count()
        })
        .collect();
    assert_eq!(clients, vec![1, 1, 1]);
    lock.release().await.unwrap();
    for waiter in waiters {
        tokio::time::timeout(Duration::from_secs(3), waiter).await.unwrap().unwrap();
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_task_asking_again_right_after_its_release_queues_behind_the_clients_waiter() {
    let cluster = common::cluster(5);
    // Polling far too slow to explain either grant: both come from release notifications.
    let rl = patient(&cluster, Duration::from_secs(5), Duration::from_secs(20));
    let first = rl.lock("turns").await.unwrap();
    let waiting = tokio::spawn({
        let rl = rl.clone();
        async move {
            let lock = rl.lock("turns").await.unwrap();
            let granted_at = Instant::now();
            tokio::time::sleep(Duration::from_millis(100)).await;
            let released_at = Instant::now();
            lock.release().await.unwrap();
            (granted_at, released_at)
        }
    });
    // The waiter failed once and is in line (subscribed).
    assert!(
        common::eventually(Duration::from_secs(2), || common::subscribers(&cluster, "turns")
            .iter()
            .all(|&n| n == 1))
        .await
    );
    first.release().await.unwrap();
    // At once, as a loop taking turns would: without the line, this attempt races the
    // waiter woken by the release above, and usually wins or splits the votes.
    let again = rl.lock("turns").await.unwrap();
    let again_at = Instant::now();
    let (waiter_granted_at, waiter_released_at) = waiting.await.unwrap();
    assert!(
        waiter_granted_at < again_at && waiter_released_at <= again_at,
        "the task that asked again was served before the waiter already in line"
    );
    assert!(
        again_at - waiter_released_at < Duration::from_secs(1),
        "woken by the waiter's release, not by the 5 s poll"
    );
    again.release().await.unwrap();
}

/// A client whose waiters poll every 10 ms: a busy line.
fn eager(cluster: &Cluster, retry: Retry) -> Redlock {
    common::builder(cluster, Duration::from_millis(50)).retry(retry).build().unwrap()
}

fn every_10_ms() -> Retry {
    Retry::new()
        .with_unbounded_attempts()
        .with_delay(Duration::from_millis(10))
        .with_jitter(Duration::ZERO)
        .with_max_wait(Duration::from_secs(20))
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn waiters_behind_the_first_in_line_leave_the_attempts_to_it() {
    let cluster = common::cluster(5);
    let holder = common::client(&cluster);
    let rl = eager(&cluster, every_10_ms());
    let held = holder.try_lock("line").await.unwrap();
    let order = std::sync::Arc::new(std::sync::Mutex::new(Vec::new()));
    let mut waiters = Vec::new();
    for n in 0..4 {
        let (rl, order) = (rl.clone(), order.clone());
        waiters.push(tokio::spawn(async move {
            let lock = rl.lock("line").await.unwrap();
            order.lock().unwrap().push(n);
            tokio::time::sleep(Duration::from_millis(10)).await;
            lock.release().await.unwrap();
        }));
        // In line (subscribed) before the next one asks.
        tokio::time::sleep(Duration::from_millis(50)).await;
    }
    let before = common::create_calls(cluster.node(0));
    let hold = Duration::from_millis(500);
    tokio::time::sleep(hold).await;
    let calls = common::create_calls(cluster.node(0)) - before;
    held.release().await.unwrap();
    for waiter in waiters {
        waiter.await.unwrap();
    }
    // One waiter polling every 10 ms makes about 50 attempts in 500 ms; four, about 200.
    assert!(calls < 100, "{calls} attempts in {hold:?}: the waiters behind the first polled too");
    let mut order = order.lock().unwrap().clone();
    order.sort_unstable();
    assert_eq!(order, [0, 1, 2, 3], "every waiter got the lock once");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_waiter_behind_a_first_one_no_longer_polled_still_gets_the_lock() {
    let cluster = common::cluster(5);
    let holder = common::client(&cluster);
    let rl = eager(&cluster, every_10_ms());
    let held = holder.try_lock("stuck").await.unwrap();
    // The first waiter is polled until it is in line, then kept without being polled.
    let mut stuck = Box::pin(rl.lock("stuck").into_future());
    assert!(tokio::time::timeout(Duration::from_millis(200), &mut stuck).await.is_err());
    let second = tokio::spawn({
        let rl = rl.clone();
        async move {
            let lock = rl.lock("stuck").await.unwrap();
            let granted_at = Instant::now();
            lock.release().await.unwrap();
            granted_at
        }
    });
    tokio::time::sleep(Duration::from_millis(100)).await;
    let released_at = Instant::now();
    held.release().await.unwrap();
    let gap = second.await.unwrap() - released_at;
    // The stuck first waiter starts no attempt: it stands in for no one.
    assert!(gap < Duration::from_secs(3), "the second waiter waited {gap:?} behind a stalled one");
    drop(stuck);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_waiter_behind_the_first_in_line_still_gives_up_after_its_attempts() {
    let cluster = common::cluster(5);
    let holder = common::client(&cluster);
    let rl = eager(&cluster, every_10_ms());
    let held = holder.try_lock("bounded").await.unwrap();
    // First in line, and alive for longer than the second one's whole policy.
    let first = tokio::spawn({
        let rl = rl.clone();
        async move {
            rl.lock("bounded")
                .retry(every_10_ms().with_max_wait(Duration::from_secs(2)))
                .await
                .map(drop)
        }
    });
    tokio::time::sleep(Duration::from_millis(50)).await;
    let three = Retry::new()
        .with_max_attempts(3)
        .with_delay(Duration::from_millis(50))
        .with_jitter(Duration::ZERO);
    let started = Instant::now();
    let err = rl.lock("bounded").retry(three).await.unwrap_err();
    let waited = started.elapsed();
    assert_eq!(err.kind(), ErrorKind::NotAcquired, "{err}");
    // A real attempt's error (a round may decide at the quorum without its stragglers).
    assert!(err.held_by_others() >= 3, "the error of a real attempt: {err}");
    assert!(waited < Duration::from_secs(1), "gave up after {waited:?}, not after three ticks");
    assert_eq!(first.await.unwrap().unwrap_err().kind(), ErrorKind::NotAcquired);
    held.release().await.unwrap();
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_waiter_is_not_held_back_by_a_first_one_that_needs_another_key_too() {
    let cluster = common::cluster(5);
    let holder = common::client(&cluster);
    let rl = eager(&cluster, every_10_ms());
    let a = holder.try_lock("a").await.unwrap();
    let b = holder.try_lock("b").await.unwrap();
    // First in line for "a": a lock of "a" and "b", which waits for "b" as well.
    let both = tokio::spawn({
        let rl = rl.clone();
        async move { rl.many(&["a", "b"]).await.map(drop) }
    });
    tokio::time::sleep(Duration::from_millis(100)).await;
    let alone = tokio::spawn({
        let rl = rl.clone();
        async move { rl.lock("a").await.unwrap() }
    });
    tokio::time::sleep(Duration::from_millis(50)).await;
    let released_at = Instant::now();
    a.release().await.unwrap();
    // "b" stays held: the first waiter keeps failing, and must not hold this one back.
    let lock = tokio::time::timeout(Duration::from_secs(2), alone)
        .await
        .expect("the lock of \"a\" waited behind the lock of \"a\" and \"b\"")
        .unwrap();
    assert!(released_at.elapsed() < Duration::from_secs(2));
    lock.release().await.unwrap();
    b.release().await.unwrap();
    both.await.unwrap().unwrap();
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_wait_that_gives_up_after_its_first_attempt_opens_no_subscription() {
    let cluster = common::cluster(3);
    let holder = common::client(&cluster);
    // Its next pause would end past its max_wait: it gives up after one attempt.
    let brief = Retry::new()
        .with_unbounded_attempts()
        .with_delay(Duration::from_millis(100))
        .with_max_wait(Duration::from_millis(10));
    let rl = eager(&cluster, brief);
    let held = holder.try_lock("once").await.unwrap();
    let err = rl.lock("once").await.unwrap_err();
    assert_eq!(err.kind(), ErrorKind::NotAcquired);
    tokio::time::sleep(Duration::from_millis(200)).await;
    let mut con = cluster.nodes()[0].connection().unwrap();
    let clients: String = redis::cmd("CLIENT").arg("LIST").query(&mut con).unwrap();
    let subscribers: Vec<&str> = clients.lines().filter(|c| c.contains("subscribe")).collect();
    assert!(subscribers.is_empty(), "pub/sub for a wait that never waited: {subscribers:?}");
    held.release().await.unwrap();
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_waiter_does_not_poll_while_a_task_of_its_client_holds_the_lock() {
    let cluster = common::cluster(5);
    let rl = eager(&cluster, every_10_ms());
    let first = rl.try_lock("held-here").await.unwrap();
    // Two waiters; the one granted at the release holds the lock while the other waits:
    // this client then knows that its own hold excludes the other.
    let hold = Duration::from_millis(500);
    let (granted, holding) = tokio::sync::mpsc::unbounded_channel();
    let waiters: Vec<_> = (0..2)
        .map(|_| {
            let (rl, granted) = (rl.clone(), granted.clone());
            tokio::spawn(async move {
                let lock = rl.lock("held-here").await.unwrap();
                // The first one granted holds; the other one is done at once.
                if granted.send(()).is_ok() {
                    tokio::time::sleep(hold).await;
                }
                lock.release().await.unwrap();
                Instant::now()
            })
        })
        .collect();
    tokio::time::sleep(Duration::from_millis(100)).await;
    first.release().await.unwrap();
    let mut holding = holding;
    holding.recv().await.unwrap();
    drop(holding);
    let set_calls_everywhere =
        || (0..5).map(|i| common::create_calls(cluster.node(i))).sum::<u64>();
    let before = set_calls_everywhere();
    tokio::time::sleep(hold - Duration::from_millis(100)).await;
    let calls = set_calls_everywhere() - before;
    let mut done = Vec::new();
    for waiter in waiters {
        done.push(waiter.await.unwrap());
    }
    done.sort_unstable();
    // Polling every 10 ms, the other waiter would try about 40 times (200 SETs) meanwhile.
    assert_eq!(calls, 0, "{calls} SETs while a task of the same client held the lock");
    assert!(done[1] - done[0] < Duration::from_secs(1), "the release woke the other waiter");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_waiter_polls_again_once_its_clients_hold_is_past_its_validity() {
    let cluster = common::cluster(5);
    let rl = eager(&cluster, every_10_ms());
    let first = rl.try_lock("left-here").await.unwrap();
    let ttl = Duration::from_millis(300);
    // Two waiters; the one granted first (at the release, while the other waits) forgets
    // its lock: no release, no notification. The other must find it gone by polling.
    let forgotten = std::sync::Arc::new(std::sync::atomic::AtomicBool::new(false));
    let waiters: Vec<_> = (0..2)
        .map(|_| {
            let (rl, forgotten) = (rl.clone(), forgotten.clone());
            tokio::spawn(async move {
                let lock = rl.lock("left-here").ttl(ttl).await.unwrap();
                let granted_at = Instant::now();
                if forgotten.swap(true, std::sync::atomic::Ordering::SeqCst) {
                    lock.release().await.unwrap();
                } else {
                    std::mem::forget(lock);
                }
                granted_at
            })
        })
        .collect();
    tokio::time::sleep(Duration::from_millis(100)).await;
    first.release().await.unwrap();
    let mut grants = Vec::new();
    for waiter in waiters {
        grants.push(tokio::time::timeout(Duration::from_secs(5), waiter).await.unwrap().unwrap());
    }
    grants.sort_unstable();
    let gap = grants[1] - grants[0];
    assert!(gap >= ttl - Duration::from_millis(50), "granted {gap:?} into a valid hold");
    assert!(gap < ttl * 2, "found {gap:?} after the grant");
}

/// This client's waiters cannot be notified (its ACL user has no release channels) and
/// poll every 5 s: a task's release still hands the lock to the client's next waiter at
/// once, which then makes a normal attempt on the key the release freed.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_release_hands_the_lock_to_the_clients_next_waiter_at_once_without_a_notification() {
    let cluster = common::cluster(3);
    let rules: Vec<&str> = common::MINIMAL_ACL
        .iter()
        .copied()
        .filter(|rule| *rule != "&redlock:released:app:*")
        .chain(["resetchannels"])
        .collect();
    for node in cluster.nodes() {
        node.acl_setuser("quiet", "quiet-pass", &rules).unwrap();
    }
    let urls = cluster.nodes().iter().map(|node| node.url_as("quiet", "quiet-pass")).collect();
    let slow = Retry::new()
        .with_unbounded_attempts()
        .with_delay(Duration::from_secs(5))
        .with_jitter(Duration::ZERO)
        .with_max_wait(Duration::from_secs(20));
    let rl = common::builder_for(urls, Duration::from_millis(200))
        .key_prefix("app:")
        .retry(slow)
        .build()
        .unwrap();
    let other = common::client(&cluster);
    let held = other.try_lock("app:turns").await.unwrap();
    // The first task polls fast; the second waits behind it.
    let fast = Retry::new()
        .with_unbounded_attempts()
        .with_delay(Duration::from_millis(20))
        .with_max_wait(Duration::from_secs(10));
    let first = tokio::spawn({
        let rl = rl.clone();
        async move {
            let lock = rl.lock("turns").retry(fast).await.unwrap();
            tokio::time::sleep(Duration::from_millis(200)).await;
            let released_at = Instant::now();
            lock.release().await.unwrap();
            released_at
        }
    });
    tokio::time::sleep(Duration::from_millis(100)).await;
    let second = tokio::spawn({
        let rl = rl.clone();
        async move {
            let lock = rl.lock("turns").await.unwrap();
            let granted_at = Instant::now();
            lock.release().await.unwrap();
            granted_at
        }
    });
    tokio::time::sleep(Duration::from_millis(100)).await;
    held.release().await.unwrap();
    let released_at = first.await.unwrap();
    let granted_at = tokio::time::timeout(Duration::from_secs(15), second).await.unwrap().unwrap();
    let gap = granted_at.saturating_duration_since(released_at);
    assert!(gap < Duration::from_secs(2), "the next waiter got the lock {gap:?} after the release");
}

/// A client with every default but its nodes (and the test's TTL).
fn defaults(cluster: &Cluster, ttl: Duration) -> Redlock {
    Redlock::builder().nodes(cluster.urls()).ttl(ttl).build().unwrap()
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn by_default_lock_and_write_wait_for_a_holder_that_releases_after_a_second() {
    let cluster = common::cluster(3);
    let holder = common::client(&cluster);
    let rl = defaults(&cluster, Duration::from_secs(10));
    let held = holder.try_lock("slow-holder").await.unwrap();
    let read = holder.read("slow-readers").once().await.unwrap();
    let started = Instant::now();
    let lock = tokio::spawn({
        let rl = rl.clone();
        async move { rl.lock("slow-holder").await }
    });
    let write = tokio::spawn({
        let rl = rl.clone();
        async move { rl.write("slow-readers").await }
    });
    // Well past the 3 attempts (about 0.33 s) the default used to give up after.
    tokio::time::sleep(Duration::from_secs(1)).await;
    assert!(!lock.is_finished() && !write.is_finished(), "both still wait");
    held.release().await.unwrap();
    read.release().await.unwrap();
    let lock = tokio::time::timeout(Duration::from_secs(8), lock).await.unwrap().unwrap();
    let write = tokio::time::timeout(Duration::from_secs(8), write).await.unwrap().unwrap();
    assert!(started.elapsed() >= Duration::from_secs(1));
    lock.unwrap().release().await.unwrap();
    write.unwrap().release().await.unwrap();
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn by_default_lock_gives_up_once_one_ttl_of_its_lock_has_passed() {
    let cluster = common::cluster(3);
    let holder = common::client(&cluster);
    let ttl = Duration::from_secs(2);
    let rl = defaults(&cluster, ttl);
    let held = holder.try_lock("kept").await.unwrap();
    let started = Instant::now();
    let err = tokio::time::timeout(Duration::from_secs(20), rl.lock("kept").into_future())
        .await
        .expect("the default wait is bounded")
        .unwrap_err();
    let waited = started.elapsed();
    assert_eq!(err.kind(), ErrorKind::NotAcquired);
    // Not before the TTL; well before the holder's 10 s lease ends (generous for a loaded
    // machine).
    assert!(waited >= ttl, "gave up after {waited:?}");
    assert!(waited < Duration::from_secs(8), "gave up after {waited:?}");
    // A request's own TTL bounds its default wait.
    let started = Instant::now();
    let err = rl.lock("kept").ttl(Duration::from_secs(1)).await.unwrap_err();
    assert_eq!(err.kind(), ErrorKind::NotAcquired);
    let waited = started.elapsed();
    assert!(waited >= Duration::from_secs(1) && waited < Duration::from_secs(7), "{waited:?}");
    held.release().await.unwrap();
}

/// A waiter's subscription confirmed on a quorum of nodes does not yet hear every release:
/// a hold on another quorum (here nodes 2-4, while its subscriptions to nodes 3 and 4 are
/// still on their way) publishes its release where the waiter hears one node only. Once
/// subscribed everywhere it attempts again, instead of sleeping its 8 s poll.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_release_on_nodes_not_yet_subscribed_still_wakes_the_waiter() {
    let faulty = FaultyCluster::start(5).unwrap();
    let cluster = faulty.cluster();
    // Nodes 0 and 1 hold another client's value for good: the holder's lock lands on nodes
    // 2-4 only, and the waiter's attempts are refused everywhere (no clean-up of its own
    // publishes a release).
    for i in [0, 1] {
        common::run(cluster, i, &["SET", "k", "another", "PX", "60000"]);
    }
    let holder = common::client(cluster);
    let lock = holder.try_lock("k").ttl(Duration::from_secs(30)).await.unwrap();
    let waiter = Redlock::builder()
        .nodes(faulty.urls())
        .node_timeout(Duration::from_secs(1))
        .connect_timeout(Duration::from_secs(3))
        .retry(
            Retry::new()
                .with_unbounded_attempts()
                .with_delay(Duration::from_secs(8))
                .with_jitter(Duration::ZERO)
                .with_max_wait(Duration::from_secs(20)),
        )
        .build()
        .unwrap();
    waiter.connect().await.unwrap();
    // The waiter's subscriptions to nodes 3 and 4 arrive 1 s late (within the 3 s it gives
    // a subscription).
    for i in [3, 4] {
        faulty.proxy(i).hold_requests_containing(b"SUBSCRIBE", Duration::from_secs(1));
    }
    let waiting = tokio::spawn(async move {
        let lock = waiter.lock("k").await.unwrap();
        let granted_at = Instant::now();
        lock.release().await.unwrap();
        granted_at
    });
    // Subscribed on nodes 0-2 (a quorum): its attempt that follows is refused too.
    let subscribed = || common::subscribers(cluster, "k")[..3].iter().all(|&n| n == 1);
    assert!(common::eventually(Duration::from_secs(3), subscribed).await);
    tokio::time::sleep(Duration::from_millis(300)).await;
    assert_eq!(common::subscribers(cluster, "k")[3..], [0, 0], "still on their way");
    let released_at = Instant::now();
    lock.release().await.unwrap();
    let granted_at = waiting.await.unwrap();
    let gap = granted_at - released_at;
    assert!(gap < Duration::from_secs(5), "granted {gap:?} after the release: by the 8 s poll");
}

/// The clean-up of a failed attempt frees the key only where its holder is not: it wakes
/// no waiter. Here another client's lock holds nodes 0 and 1 of 3 and then moves to nodes
/// 1 and 2, while attempts that fail clean up their grant on the free node. Were those
/// clean-ups published, their publications on one node and then another would count as a
/// release on a quorum: the waiter would attempt again and again, each attempt's own
/// clean-up waking it for the next, instead of at its 5 s poll.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_failed_attempts_clean_up_wakes_no_waiter() {
    let cluster = common::cluster(3);
    for i in [0, 1] {
        common::run(&cluster, i, &["SET", "doc", "another", "PX", "60000"]);
    }
    let waiter = patient(&cluster, Duration::from_secs(5), Duration::from_secs(30));
    let waiting = tokio::spawn({
        let waiter = waiter.clone();
        async move { waiter.lock("doc").await.map(drop) }
    });
    let subscribed = || common::subscribers(&cluster, "doc").iter().all(|&n| n == 1);
    assert!(common::eventually(Duration::from_secs(3), subscribed).await);
    // Attempts that follow a subscription are over.
    tokio::time::sleep(Duration::from_millis(300)).await;
    // Twenty failed attempts of another client, each cleaning up its grant on node 2 (or
    // its request there, when the round was decided before node 2 answered).
    let other = common::client(&cluster);
    for _ in 0..20 {
        assert_eq!(other.try_lock("doc").await.unwrap_err().kind(), ErrorKind::NotAcquired);
    }
    // The holder moves to nodes 1 and 2 (without a release), and one more attempt cleans
    // up its grant on node 0.
    common::run(&cluster, 2, &["SET", "doc", "another", "PX", "60000"]);
    common::run(&cluster, 0, &["DEL", "doc"]);
    let before = attempts_run(cluster.node(1));
    other.try_lock("doc").await.unwrap_err();
    tokio::time::sleep(Duration::from_secs(1)).await;
    // Each attempt runs one SET on node 1: the other client's, and the waiter's.
    let attempts = attempts_run(cluster.node(1)) - before - 1;
    assert!(attempts <= 1, "the waiter attempted {attempts} times in a second of its 5 s poll");
    waiting.abort();
}

/// A node that answers `SUBSCRIBE` slower than the connect timeout for a while does not
/// leave the waiter polling: its subscriber keeps trying, with a backoff, and the waiter
/// hears the release once the node answers in time again.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_subscription_slower_than_the_connect_timeout_is_tried_again_until_it_works() {
    let faulty = FaultyCluster::start(3).unwrap();
    let cluster = faulty.cluster();
    let holder = common::client(cluster);
    let lock = holder.try_lock("k").ttl(Duration::from_secs(30)).await.unwrap();
    let waiter = Redlock::builder()
        .nodes(faulty.urls())
        .node_timeout(Duration::from_millis(200))
        .connect_timeout(Duration::from_millis(300))
        .retry(
            Retry::new()
                .with_unbounded_attempts()
                .with_delay(Duration::from_secs(8))
                .with_jitter(Duration::ZERO)
                .with_max_wait(Duration::from_secs(20)),
        )
        .build()
        .unwrap();
    waiter.connect().await.unwrap();
    // Nodes 1 and 2 answer every SUBSCRIBE after 1 s, for 2 s.
    for i in [1, 2] {
        faulty.proxy(i).hold_requests_containing(b"SUBSCRIBE", Duration::from_secs(1));
    }
    let waiting = tokio::spawn(async move {
        let lock = waiter.lock("k").await.unwrap();
        let granted_at = Instant::now();
        lock.release().await.unwrap();
        granted_at
    });
    tokio::time::sleep(Duration::from_secs(2)).await;
    assert_eq!(common::subscribers(cluster, "k")[1..], [0, 0], "each SUBSCRIBE timed out");
    for i in [1, 2] {
        faulty.proxy(i).release_holds();
    }
    let subscribed = || common::subscribers(cluster, "k").iter().all(|&n| n == 1);
    assert!(common::eventually(Duration::from_secs(5), subscribed).await, "never subscribed");
    let released_at = Instant::now();
    lock.release().await.unwrap();
    let granted_at = waiting.await.unwrap();
    let gap = granted_at - released_at;
    assert!(gap < Duration::from_secs(4), "granted {gap:?} after the release: by the 8 s poll");
}

/// A release's notification names the hold it ended by a prefix of its token (of its field,
/// for a read share), which tells holds apart, and never the whole token: whoever may
/// subscribe to the release channels learns nothing to act for a holder with.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_release_notification_names_the_hold_without_giving_its_token_away() {
    let cluster = common::cluster(3);
    let rl = common::client(&cluster);
    common::warm(&rl).await;
    let mut subscriber = cluster.node(0).connection().unwrap();
    subscriber.set_read_timeout(Some(Duration::from_secs(5))).unwrap();
    let mut pubsub = subscriber.as_pubsub();
    pubsub.subscribe("redlock:released:job").unwrap();
    pubsub.subscribe("redlock:released:doc").unwrap();

    let lock = rl.try_lock("job").await.unwrap();
    let token = lock.token().to_owned();
    lock.release().await.unwrap();
    let grant = rl.write("doc").await.unwrap();
    let field = format!("w:{}", grant.token());
    grant.release().await.unwrap();

    for (channel, whole) in [("redlock:released:job", &token), ("redlock:released:doc", &field)] {
        let message = pubsub.get_message().unwrap();
        assert_eq!(message.get_channel_name(), channel);
        let named: String = message.get_payload().unwrap();
        assert!(named.len() >= 16, "{named:?} tells holds apart");
        assert!(whole.starts_with(&named), "{named:?} names the hold {whole:?}");
        assert!(named.len() < whole.len(), "the whole token {whole:?} was published");
    }
}

/// Releases `holds` (each a hold's token and its release) at once, hold `i`'s reaching node
/// `i` last, once `waiting` (granted at the instant it returns) is subscribed on every node;
/// how long after the releases it was granted.
async fn granted_after_releases_last_in_another_order_on_each_node<R, E>(
    faulty: &FaultyCluster,
    holds: Vec<(String, R)>,
    waiting: tokio::task::JoinHandle<Instant>,
) -> Duration
where
    R: std::future::Future<Output = Result<(), E>>,
    E: std::fmt::Debug,
{
    let subscribed = || common::subscribers(faulty.cluster(), "doc").iter().all(|&n| n == 1);
    assert!(common::eventually(Duration::from_secs(3), subscribed).await);
    tokio::time::sleep(Duration::from_millis(300)).await;
    for (i, (token, _)) in holds.iter().enumerate() {
        faulty.proxy(i).hold_requests_containing(token.as_bytes(), Duration::from_millis(300));
    }
    let released_at = Instant::now();
    for released in futures::future::join_all(holds.into_iter().map(|(_, release)| release)).await {
        released.unwrap();
    }
    waiting.await.unwrap() - released_at
}

/// Readers that release at once may release last in a different order on each node: each
/// node then publishes another reader's release, no one reader's on a quorum. The writer
/// waiting for them is still woken by their releases, not left to its poll.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn readers_releasing_in_a_different_order_on_each_node_still_wake_the_writer() {
    let faulty = FaultyCluster::start(3).unwrap();
    // Three clients: the release held back on a node holds back nothing of the others.
    let mut shares = Vec::new();
    for _ in 0..3 {
        let reader = common::builder_for(faulty.urls(), Duration::from_secs(1)).build().unwrap();
        let share = reader.read("doc").await.unwrap();
        shares.push((share.token().to_owned(), share.release()));
    }
    let writer = patient(faulty.cluster(), Duration::from_secs(8), Duration::from_secs(30));
    let waiting = tokio::spawn(async move {
        let lock = writer.write("doc").await.unwrap();
        let granted_at = Instant::now();
        lock.release().await.unwrap();
        granted_at
    });
    let gap = granted_after_releases_last_in_another_order_on_each_node(&faulty, shares, waiting);
    let gap = gap.await;
    assert!(gap < Duration::from_secs(4), "granted {gap:?} after the releases: by the 8 s poll");
}

/// An owner's re-entries released at once from several clients may leave last in a
/// different order on each node, as readers do: another owner waiting is still woken.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn reentries_releasing_in_a_different_order_on_each_node_still_wake_another_owner() {
    let faulty = FaultyCluster::start(3).unwrap();
    let mut holds = Vec::new();
    for _ in 0..3 {
        let client = common::builder_for(faulty.urls(), Duration::from_secs(1)).build().unwrap();
        let hold = client.reentrant("doc", "job-1").await.unwrap();
        holds.push((hold.token().to_owned(), hold.release()));
    }
    let waiter = patient(faulty.cluster(), Duration::from_secs(8), Duration::from_secs(30));
    let waiting = tokio::spawn(async move {
        let lock = waiter.reentrant("doc", "job-2").await.unwrap();
        let granted_at = Instant::now();
        lock.release().await.unwrap();
        granted_at
    });
    let gap = granted_after_releases_last_in_another_order_on_each_node(&faulty, holds, waiting);
    let gap = gap.await;
    assert!(gap < Duration::from_secs(4), "granted {gap:?} after the releases: by the 8 s poll");
}

/// A release that reaches its second node late, after many failed attempts of other
/// clients cleaned up on its first node, still wakes the waiter: a channel remembers the
/// `RELEASES_HEARD` (32) newest holds, and the clean-ups (hundreds in 0.6 s here) of
/// attempts that never held a quorum publish nothing that could push the release's first
/// publication out.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_release_reaching_its_second_node_after_many_clean_ups_still_wakes_the_waiter() {
    let faulty = FaultyCluster::start(3).unwrap();
    let cluster = faulty.cluster();
    common::run(cluster, 2, &["SET", "k", "another", "PX", "60000"]);
    let holder = common::builder_for(faulty.urls(), Duration::from_secs(2)).build().unwrap();
    let lock = holder.try_lock("k").await.unwrap();
    let waiter = patient(cluster, Duration::from_secs(8), Duration::from_secs(30));
    let waiting = tokio::spawn(async move {
        let lock = waiter.lock("k").await.unwrap();
        let granted_at = Instant::now();
        lock.release().await.unwrap();
        granted_at
    });
    let subscribed = || common::subscribers(cluster, "k").iter().all(|&n| n == 1);
    assert!(common::eventually(Duration::from_secs(3), subscribed).await);
    tokio::time::sleep(Duration::from_millis(300)).await;
    faulty.proxy(1).hold_requests_containing(lock.token().as_bytes(), Duration::from_millis(800));
    let released_at = Instant::now();
    let releasing = tokio::spawn(lock.release());
    // Meanwhile another client's attempts take node 0, are refused by nodes 1 and 2, and
    // clean up on node 0.
    let other = common::client(cluster);
    let mut failed = 0;
    while released_at.elapsed() < Duration::from_millis(600) {
        if other.try_lock("k").await.is_err() {
            failed += 1;
        }
    }
    releasing.await.unwrap().unwrap();
    let granted_at = waiting.await.unwrap();
    let gap = granted_at - released_at;
    assert!(gap < Duration::from_secs(4), "granted {gap:?} after the release ({failed} clean-ups)");
}

/// An attempt granted on a quorum too late to use (its validity gone when the answers came
/// back) holds the key on a quorum until its clean-up: that clean-up tells the waiters,
/// and another client's waiter takes the key at once, not at its next poll.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_clean_up_of_an_attempt_granted_too_late_wakes_another_clients_waiter() {
    let faulty = FaultyCluster::start(3).unwrap();
    let cluster = faulty.cluster();
    // A long node timeout: the acquisitions are run (before their deadline) but answered
    // after the lease's validity is gone.
    let late = common::builder_for(faulty.urls(), Duration::from_secs(5))
        .ttl(Duration::from_millis(1800))
        .build()
        .unwrap();
    common::connect_all(&late).await;
    for i in 0..3 {
        faulty.proxy(i).set_fault(common::latency(500));
        faulty.proxy(i).hold_requests_containing_any(
            &common::plain_acquisitions(),
            Duration::from_millis(1000),
        );
    }
    // Run at ~1.5 s, answered at ~2 s (validity 1.8 s gone), cleaned up at ~2.5 s: the key
    // is held on every node for a second meanwhile and would expire only at ~3.3 s.
    let attempt = tokio::spawn(async move { late.try_lock("k").await });
    let held = || cluster.count_key("k") == 3;
    assert!(common::eventually(Duration::from_secs(5), held).await, "the late attempt never ran");
    let waiter = patient(cluster, Duration::from_secs(8), Duration::from_secs(30));
    let waiting = tokio::spawn(async move {
        let lock = waiter.lock("k").await.unwrap();
        let granted_at = Instant::now();
        lock.release().await.unwrap();
        granted_at
    });
    let err = attempt.await.unwrap().unwrap_err();
    let failed_at = Instant::now();
    let granted_at = waiting.await.unwrap();
    let gap = granted_at.saturating_duration_since(failed_at);
    assert!(gap < Duration::from_secs(4), "woken {gap:?} after the clean-up ({err})");
}

/// As `a_release_reaching_its_second_node_after_many_clean_ups_still_wakes_the_waiter`,
/// with one node down instead of held by someone else: the other client's attempts are
/// granted on one node, refused on one and never sent to the third (its connection is
/// refused), so they could not have held a quorum and their clean-ups tell no one.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_release_reaching_its_second_node_after_many_clean_ups_wakes_the_waiter_with_a_node_down()
{
    let mut faulty = FaultyCluster::start(3).unwrap();
    let holder = common::builder_for(faulty.urls(), Duration::from_secs(2)).build().unwrap();
    let lock = holder.try_lock("k").await.unwrap();
    // Staging: every node answered (a round is decided by the first two): the release
    // needs nodes 0 and 1 once node 2 is killed, and a waiter's attempt must not take a
    // node ahead of the holder's acquisition there.
    common::held_on(faulty.cluster(), "k", lock.token(), &[0, 1, 2]).await;
    let waiter = Redlock::builder()
        .nodes(faulty.urls())
        .node_timeout(Duration::from_millis(200))
        .retry(
            Retry::new()
                .with_unbounded_attempts()
                .with_delay(Duration::from_secs(8))
                .with_jitter(Duration::ZERO)
                .with_max_wait(Duration::from_secs(30)),
        )
        .build()
        .unwrap();
    let waiting = tokio::spawn(async move {
        let lock = waiter.lock("k").await.unwrap();
        let granted_at = Instant::now();
        lock.release().await.unwrap();
        granted_at
    });
    let subscribed = || common::subscribers(faulty.cluster(), "k").iter().all(|&n| n == 1);
    assert!(common::eventually(Duration::from_secs(3), subscribed).await);
    faulty.cluster_mut().node_mut(2).kill().unwrap();
    tokio::time::sleep(Duration::from_millis(300)).await;
    faulty.proxy(1).hold_requests_containing(lock.token().as_bytes(), Duration::from_millis(800));
    let released_at = Instant::now();
    let releasing = tokio::spawn(lock.release());
    // Meanwhile another client's attempts take node 0, are refused by node 1, cannot reach
    // node 2, and clean up on node 0.
    let other = common::single_attempt(faulty.urls());
    let mut failed = 0;
    while released_at.elapsed() < Duration::from_millis(600) {
        if other.try_lock("k").await.is_err() {
            failed += 1;
        }
    }
    releasing.await.unwrap().unwrap();
    let granted_at = waiting.await.unwrap();
    let gap = granted_at - released_at;
    assert!(gap < Duration::from_secs(4), "granted {gap:?} after the release ({failed} clean-ups)");
}

/// Starts a waiter for "a" and "b" together that polls every 8 s, while another client
/// holds one of them: returned once it waits, subscribed; the task gives the instant it
/// was granted.
async fn a_waiter_for_a_and_b(cluster: &Cluster) -> tokio::task::JoinHandle<Instant> {
    let waiter = patient(cluster, Duration::from_secs(8), Duration::from_secs(30));
    let waiting = tokio::spawn(async move {
        let lock = waiter.many(&["a", "b"]).await.unwrap();
        let granted_at = Instant::now();
        lock.release().await.unwrap();
        granted_at
    });
    // Subscribed on "a", then on "b" (not asserted: a waiter deaf to "b" fails by its
    // gap, as a lost notification would leave it).
    let subscribed = |key| move || common::subscribers(cluster, key).iter().all(|&n| n == 1);
    assert!(common::eventually(Duration::from_secs(3), subscribed("a")).await);
    common::eventually(Duration::from_secs(3), subscribed("b")).await;
    // Attempts that follow a subscription are over.
    tokio::time::sleep(Duration::from_millis(300)).await;
    waiting
}

/// A waiter for "a" and "b" (see [`a_waiter_for_a_and_b`]) held back by what `release`
/// releases is granted well before its poll once it runs.
async fn woken_once_released(
    cluster: &Cluster,
    release: impl std::future::Future<Output = Result<(), redlock::Error>>,
) {
    let waiting = a_waiter_for_a_and_b(cluster).await;
    let released_at = Instant::now();
    release.await.unwrap();
    woken_by_the_release(released_at, waiting).await;
}

/// How long after `released_at` the waiter was granted, checked to be well before its 8 s
/// poll.
async fn woken_by_the_release(released_at: Instant, waiting: tokio::task::JoinHandle<Instant>) {
    let gap = waiting.await.unwrap() - released_at;
    assert!(gap < Duration::from_secs(3), "granted {gap:?} after the release: by the 8 s poll");
}

/// A multi-resource waiter is woken by the release of whichever of its keys holds it back,
/// not only of its first: here another client's plain lock of its second key.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_multi_resource_waiter_is_woken_by_the_release_of_its_second_key() {
    let cluster = common::cluster(3);
    let holder = common::client(&cluster);
    let lock = holder.try_lock("b").await.unwrap();
    woken_once_released(&cluster, lock.release()).await;
}

/// The same when another client's multi-resource lock of "b" and "c" holds it back: that
/// release publishes on each of its keys' channels, naming the same hold on each node.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_multi_resource_waiter_is_woken_by_the_release_of_a_multi_resource_lock_over_another_key()
{
    let cluster = common::cluster(3);
    let holder = common::client(&cluster);
    let lock = holder.many(&["b", "c"]).once().await.unwrap();
    woken_once_released(&cluster, lock.release()).await;
}

/// And, as before, by the release of its first key.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_multi_resource_waiter_is_woken_by_the_release_of_its_first_key() {
    let cluster = common::cluster(3);
    let holder = common::client(&cluster);
    let lock = holder.try_lock("a").await.unwrap();
    woken_once_released(&cluster, lock.release()).await;
}

/// A multi-resource waiter woken by the release of one key may find another held: it does
/// not take the wake-up from the client's waiters behind it. Here it waits for "a" and "b",
/// another client holds both, and releases "b" alone: the client's waiter for "b" behind
/// it is woken too, not left to its 8 s poll.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_multi_resource_waiter_woken_ahead_of_a_waiter_for_one_of_its_keys_does_not_hold_it_back()
{
    let cluster = &common::cluster(3);
    let holder = common::client(cluster);
    let a = holder.try_lock("a").await.unwrap();
    let b = holder.try_lock("b").await.unwrap();
    let rl = patient(cluster, Duration::from_secs(8), Duration::from_secs(30));
    let both = tokio::spawn({
        let rl = rl.clone();
        async move { rl.many(&["a", "b"]).await.map(drop) }
    });
    // Ahead in line on "b" once subscribed to it (not asserted: one deaf to "b" holds no
    // one back there).
    let subscribed = |key| move || common::subscribers(cluster, key).iter().all(|&n| n == 1);
    assert!(common::eventually(Duration::from_secs(3), subscribed("a")).await);
    common::eventually(Duration::from_secs(3), subscribed("b")).await;
    let alone = tokio::spawn(async move {
        let lock = rl.lock("b").await.unwrap();
        let granted_at = Instant::now();
        lock.release().await.unwrap();
        granted_at
    });
    // Its first attempt, refused, is over.
    tokio::time::sleep(Duration::from_millis(300)).await;
    let released_at = Instant::now();
    b.release().await.unwrap();
    woken_by_the_release(released_at, alone).await;
    a.release().await.unwrap();
    tokio::time::timeout(Duration::from_secs(3), both).await.unwrap().unwrap().unwrap();
}

/// Script calls (`EVALSHA` and `EVAL`) node `i` has served so far: every attempt, clean-up
/// and release is one per node.
fn script_calls(cluster: &Cluster, i: usize) -> u64 {
    let mut con = cluster.node(i).connection().unwrap();
    let info: String = redis::cmd("INFO").arg("commandstats").query(&mut con).unwrap();
    info.lines()
        .filter_map(|line| {
            let rest = line
                .strip_prefix("cmdstat_evalsha:calls=")
                .or_else(|| line.strip_prefix("cmdstat_eval:calls="))?;
            rest.split(',').next()?.parse::<u64>().ok()
        })
        .sum()
}

/// One client's waiters for a shared key together with keys of their own (multi-resource
/// locks over "hot" and "cold:i"): a release of "hot" lets one of them in, and costs the
/// others no more than a few attempts each time. Waking every waiter for several keys at
/// each release would cost `WAITERS` attempts (and their clean-ups) per hand-on, about
/// `WAITERS`² / 2 in all where one attempt per hand-on does.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn multi_resource_waiters_sharing_a_key_are_not_all_woken_by_each_of_its_releases() {
    const WAITERS: usize = 8;
    let cluster = &common::cluster(3);
    let holder = common::client(cluster);
    let hot = holder.try_lock("hot").await.unwrap();
    let rl = patient(cluster, Duration::from_secs(8), Duration::from_secs(60));
    let mut waiting = tokio::task::JoinSet::new();
    for i in 0..WAITERS {
        let rl = rl.clone();
        waiting.spawn(async move {
            let lock = rl.many(&["hot", &format!("cold:{i}")]).await.unwrap();
            tokio::time::sleep(Duration::from_millis(20)).await;
            lock.release().await.unwrap();
        });
    }
    let subscribed = || common::subscribers(cluster, "hot").iter().all(|&n| n == 1);
    assert!(common::eventually(Duration::from_secs(3), subscribed).await);
    // Every waiter's first attempt, refused, is over.
    tokio::time::sleep(Duration::from_millis(500)).await;
    let before: u64 = (0..3).map(|i| script_calls(cluster, i)).sum();
    let released_at = Instant::now();
    hot.release().await.unwrap();
    let all = tokio::time::timeout(Duration::from_secs(30), async {
        while let Some(done) = waiting.join_next().await {
            done.unwrap();
        }
    });
    all.await.expect("every waiter had its turn before its 8 s poll");
    let took = released_at.elapsed();
    let calls: u64 = (0..3).map(|i| script_calls(cluster, i)).sum::<u64>() - before;
    // One release of "hot", then per waiter one granted attempt and one release, all on
    // three nodes; room for a few lost races on top.
    let needed = 3 * (1 + 2 * WAITERS as u64);
    eprintln!(
        "{WAITERS} multi-resource waiters: {calls} script calls ({needed} needed) in {took:?}"
    );
    assert!(calls <= needed * 2, "{calls} script calls for {needed} needed, in {took:?}");
}

/// Two of one client's multi-resource waiters share a key "x": the first also waits for
/// "a", which stays held; the second for "b", which is free. A release of "x" wakes one of
/// them; the first, refused (for "a"), steps back, so the next release of "x" wakes the
/// second, which gets both keys: the first does not take every release of "x" from it.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_multi_resource_waiter_refused_after_a_wake_up_lets_the_next_release_wake_another() {
    let cluster = common::cluster(3);
    let holder = common::client(&cluster);
    let _a = holder.try_lock("a").await.unwrap();
    let x = holder.try_lock("x").await.unwrap();
    let rl = patient(&cluster, Duration::from_secs(8), Duration::from_secs(30));
    let first = tokio::spawn({
        let rl = rl.clone();
        async move { rl.many(&["x", "a"]).await.map(drop) }
    });
    let cluster = &cluster;
    let subscribed = |key| move || common::subscribers(cluster, key).iter().all(|&n| n == 1);
    assert!(common::eventually(Duration::from_secs(3), subscribed("a")).await);
    tokio::time::sleep(Duration::from_millis(300)).await;
    let second = tokio::spawn({
        let rl = rl.clone();
        async move {
            let lock = rl.many(&["x", "b"]).await.unwrap();
            let granted_at = Instant::now();
            lock.release().await.unwrap();
            granted_at
        }
    });
    assert!(common::eventually(Duration::from_secs(3), subscribed("b")).await);
    tokio::time::sleep(Duration::from_millis(300)).await;
    // The first release of "x" wakes the first waiter, refused for "a"; "x" is taken again
    // before the second waiter's poll.
    x.release().await.unwrap();
    tokio::time::sleep(Duration::from_millis(300)).await;
    let x = holder.try_lock("x").await.unwrap();
    tokio::time::sleep(Duration::from_millis(300)).await;
    let released_at = Instant::now();
    x.release().await.unwrap();
    woken_by_the_release(released_at, second).await;
    first.abort();
}
