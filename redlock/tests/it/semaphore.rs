//! The counting lock: at most L holders at once, as L slot locks over the quorum; waiters
//! woken by the release of any slot; one count per resource.

use crate::common;

use std::collections::BTreeSet;
use std::time::{Duration, Instant};

use redlock::{ErrorKind, Permit, Redlock, Retry};

const RESOURCE: &str = "exports";

/// A client with its connections open: on a loaded machine opening them can outlast the
/// node timeout of a first attempt.
async fn client(cluster: &redlock_testkit::Cluster) -> Redlock {
    let rl = common::client(cluster);
    common::warm(&rl).await;
    rl
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn l_holders_at_once_and_the_next_is_refused_as_not_acquired() {
    let cluster = common::cluster(3);
    let rl = client(&cluster).await;
    let mut permits = Vec::new();
    for _ in 0..3 {
        permits.push(rl.semaphore(RESOURCE, 3).once().await.unwrap());
    }
    let slots: BTreeSet<u32> = permits.iter().map(Permit::slot).collect();
    assert_eq!(slots, BTreeSet::from([0, 1, 2]), "each permit holds its own slot");
    for permit in &permits {
        assert!(permit.is_valid() && permit.validity() > Duration::from_secs(9));
        assert_eq!(permit.resource(), RESOURCE);
        assert_eq!(permit.permits(), 3);
        // Each slot is a plain lock key holding its token, on every node.
        let key = format!("{{{RESOURCE}}}:permit:{}", permit.slot());
        assert_eq!(permit.key(), key);
        assert!(
            common::eventually(Duration::from_secs(2), || {
                cluster.nodes_holding(&key, permit.token()).len() == 3
            })
            .await
        );
    }
    let err = rl.semaphore(RESOURCE, 3).once().await.unwrap_err();
    assert_eq!(err.kind(), ErrorKind::NotAcquired, "{err}");
    // Another client sees the same.
    let other = client(&cluster).await;
    let err = other.semaphore(RESOURCE, 3).once().await.unwrap_err();
    assert_eq!(err.kind(), ErrorKind::NotAcquired, "{err}");
    for permit in permits {
        permit.release().await.unwrap();
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_release_lets_exactly_one_more_in() {
    let cluster = common::cluster(3);
    let rl = client(&cluster).await;
    let first = rl.semaphore(RESOURCE, 2).once().await.unwrap();
    let second = rl.semaphore(RESOURCE, 2).once().await.unwrap();
    let freed = first.slot();
    first.release().await.unwrap();
    let third = rl.semaphore(RESOURCE, 2).once().await.unwrap();
    assert_eq!(third.slot(), freed, "the freed slot is the only one");
    let err = rl.semaphore(RESOURCE, 2).once().await.unwrap_err();
    assert_eq!(err.kind(), ErrorKind::NotAcquired, "{err}");
    second.release().await.unwrap();
    third.release().await.unwrap();
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_waiter_is_woken_by_the_release_of_any_slot() {
    let cluster = common::cluster(3);
    let rl = client(&cluster).await;
    // A pause far longer than the test: only a notification can wake the waiter in time.
    let slow = Retry::new()
        .with_delay(Duration::from_secs(30))
        .with_jitter(Duration::ZERO)
        .with_max_wait(Duration::from_secs(120));
    for round in 0..3 {
        let mut held = vec![
            rl.semaphore(RESOURCE, 3).once().await.unwrap(),
            rl.semaphore(RESOURCE, 3).once().await.unwrap(),
            rl.semaphore(RESOURCE, 3).once().await.unwrap(),
        ];
        held.sort_by_key(Permit::slot);
        let waiter = {
            let rl = rl.clone();
            tokio::spawn(async move { rl.semaphore(RESOURCE, 3).retry(slow).await })
        };
        // Let it fail its first attempt and subscribe.
        let key = format!("{{{RESOURCE}}}:permits");
        assert!(
            common::eventually(Duration::from_secs(10), || {
                common::subscribers(&cluster, &key).iter().all(|n| *n >= 1)
            })
            .await,
            "the waiter subscribed to the count key's channel"
        );
        // Each round frees another slot.
        let freed = held.remove(round);
        let slot = freed.slot();
        let released = Instant::now();
        freed.release().await.unwrap();
        let permit = tokio::time::timeout(Duration::from_secs(10), waiter)
            .await
            .expect("woken by the release, not by its 30 s pause")
            .unwrap()
            .unwrap();
        assert!(released.elapsed() < Duration::from_secs(10));
        assert_eq!(permit.slot(), slot);
        permit.release().await.unwrap();
        for permit in held {
            permit.release().await.unwrap();
        }
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn zero_permits_is_a_config_error() {
    let cluster = common::cluster(3);
    let rl = common::client(&cluster);
    let err = rl.semaphore(RESOURCE, 0).await.unwrap_err();
    assert_eq!(err.kind(), ErrorKind::Config, "{err}");
    assert_eq!(cluster.keys_everywhere("*").unwrap(), 0);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_cancelled_wait_or_attempt_leaves_nothing() {
    let mut cluster = common::cluster(5);
    let rl = common::builder(&cluster, Duration::from_secs(2)).build().unwrap();
    common::warm(&rl).await;
    let held = rl.semaphore(RESOURCE, 2).once().await.unwrap();
    let other_slot = 1 - held.slot();
    let other_key = format!("{{{RESOURCE}}}:permit:{other_slot}");

    // An attempt cancelled mid-round: with a majority hung its SETs are queued there.
    for i in [0, 1, 2] {
        cluster.node_mut(i).pause().unwrap();
    }
    let attempt = tokio::time::timeout(Duration::from_millis(100), rl.semaphore(RESOURCE, 2)).await;
    assert!(attempt.is_err(), "the attempt should still have been running");
    for i in [0, 1, 2] {
        cluster.node_mut(i).resume().unwrap();
    }
    assert!(
        common::eventually(Duration::from_secs(3), || cluster.count_key(&other_key) == 0).await,
        "a cancelled attempt left a slot key behind"
    );

    // A wait cancelled while every slot is held: its subscription goes with it.
    let second = rl.semaphore(RESOURCE, 2).once().await.unwrap();
    let count_key = format!("{{{RESOURCE}}}:permits");
    let long = Retry::new().with_delay(Duration::from_secs(30)).with_jitter(Duration::ZERO);
    let waiting = tokio::time::timeout(
        Duration::from_millis(500),
        rl.semaphore(RESOURCE, 2).retry(long.with_max_wait(Duration::from_secs(60))),
    )
    .await;
    assert!(waiting.is_err(), "the wait should still have been running");
    assert!(
        common::eventually(Duration::from_secs(3), || {
            common::subscribers(&cluster, &count_key).iter().all(|n| *n == 0)
        })
        .await,
        "the cancelled wait kept its subscription"
    );
    held.release().await.unwrap();
    second.release().await.unwrap();
    let slot_keys = || {
        (0..2)
            .map(|slot| cluster.count_key(&format!("{{{RESOURCE}}}:permit:{slot}")))
            .sum::<usize>()
    };
    assert!(common::eventually(Duration::from_secs(3), || slot_keys() == 0).await);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn clients_that_disagree_on_the_count_are_refused_as_config() {
    let cluster = common::cluster(3);
    let two = client(&cluster).await;
    let three = common::retrying(
        cluster.urls(),
        Duration::from_millis(200),
        Retry::new().with_max_wait(Duration::from_secs(30)),
    );
    common::warm(&three).await;
    let held = two.semaphore(RESOURCE, 2).once().await.unwrap();
    let started = Instant::now();
    let err = three.semaphore(RESOURCE, 3).await.unwrap_err();
    assert_eq!(err.kind(), ErrorKind::Config, "{err}");
    assert!(err.to_string().contains("2 permits"), "{err}");
    assert!(started.elapsed() < Duration::from_secs(5), "refused at once, not retried");
    // With every slot of the two-permit lock held, the three-permit client still gets none:
    // never more holders than the smaller count.
    let second = two.semaphore(RESOURCE, 2).once().await.unwrap();
    let err = three.semaphore(RESOURCE, 3).once().await.unwrap_err();
    assert_eq!(err.kind(), ErrorKind::Config, "{err}");
    let slot_2 = format!("{{{RESOURCE}}}:permit:2");
    assert_eq!(cluster.count_key(&slot_2), 0, "no third slot was taken");
    held.release().await.unwrap();
    second.release().await.unwrap();
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn another_count_left_on_a_minority_of_nodes_does_not_refuse_the_lock() {
    let cluster = common::cluster(3);
    let count_key = format!("{{{RESOURCE}}}:permits");
    cluster.node(0).set(&count_key, "7").unwrap();
    let rl = client(&cluster).await;
    let permit = rl.semaphore(RESOURCE, 2).once().await.unwrap();
    assert_eq!(cluster.nodes_holding(&count_key, "2"), vec![1, 2]);
    assert_eq!(cluster.nodes_holding(&count_key, "7"), vec![0], "the other count is untouched");
    permit.release().await.unwrap();
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_permit_works_with_with_lock_and_is_released_after_the_work() {
    let cluster = common::cluster(3);
    let rl = client(&cluster).await;
    let other = rl.semaphore(RESOURCE, 2).once().await.unwrap();
    let slot = rl
        .with_lock(rl.semaphore(RESOURCE, 2).once(), |lease| async move {
            assert!(lease.is_valid());
            lease.resource().to_owned()
        })
        .await
        .unwrap();
    assert_eq!(slot, RESOURCE);
    // Its slot is free again: one more permit fits.
    let again = rl.semaphore(RESOURCE, 2).once().await.unwrap();
    assert_ne!(again.slot(), other.slot());
    again.release().await.unwrap();
    other.release().await.unwrap();
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_dropped_permit_is_released_and_its_slot_taken_again() {
    let cluster = common::cluster(3);
    let rl = client(&cluster).await;
    let permit = rl.semaphore(RESOURCE, 1).once().await.unwrap();
    let key = permit.key().to_owned();
    drop(permit);
    assert!(common::eventually(Duration::from_secs(3), || cluster.count_key(&key) == 0).await);
    let again = rl.semaphore(RESOURCE, 1).once().await.unwrap();
    again.release().await.unwrap();
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn an_extension_renews_the_slot_and_keeps_the_count_as_long() {
    let cluster = common::cluster(3);
    let rl = client(&cluster).await;
    let mut permit = rl.semaphore(RESOURCE, 2).once().await.unwrap();
    permit.extend(Duration::from_secs(60)).await.unwrap();
    assert!(permit.validity() > Duration::from_secs(50));
    let count_key = format!("{{{RESOURCE}}}:permits");
    assert!(
        common::eventually(Duration::from_secs(2), || {
            let long = |key: &str| {
                cluster.pttls(key).unwrap().iter().all(|ttl| ttl.is_some_and(|ms| ms > 50_000))
            };
            long(permit.key()) && long(&count_key)
        })
        .await,
        "the slot and the count both live as long as the extended lease"
    );
    permit.release().await.unwrap();
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn eight_contending_clients_never_exceed_l_valid_holders_with_a_minority_down() {
    use std::sync::Arc;
    use std::sync::atomic::{AtomicUsize, Ordering};
    const L: u32 = 2;
    const ROUNDS: usize = 4;
    let mut cluster = common::cluster(5);
    let holders = Arc::new(AtomicUsize::new(0));
    let most = Arc::new(AtomicUsize::new(0));
    let retry = Retry::new()
        .with_delay(Duration::from_millis(50))
        .with_jitter(Duration::from_millis(50))
        .with_unbounded_attempts()
        .with_max_wait(Duration::from_secs(60));
    let clients: Vec<_> = (0..8)
        .map(|_| common::retrying(cluster.urls(), Duration::from_millis(200), retry))
        .collect();
    for rl in &clients {
        common::warm(rl).await;
    }
    let mut tasks = Vec::new();
    for rl in clients {
        let (holders, most) = (holders.clone(), most.clone());
        tasks.push(tokio::spawn(async move {
            for _ in 0..ROUNDS {
                let permit = rl.semaphore(RESOURCE, L).await.unwrap();
                let now = holders.fetch_add(1, Ordering::SeqCst) + 1;
                most.fetch_max(now, Ordering::SeqCst);
                tokio::time::sleep(Duration::from_millis(20)).await;
                // Work ends well within the lease: every holder counted here was valid.
                assert!(permit.is_valid());
                holders.fetch_sub(1, Ordering::SeqCst);
                permit.release().await.ok();
            }
        }));
    }
    // A minority down meanwhile: one node paused, one killed.
    tokio::time::sleep(Duration::from_millis(100)).await;
    let _wakeup = cluster.node_mut(3).pause_for(Duration::from_secs(2)).unwrap();
    cluster.node_mut(4).kill().unwrap();
    for task in tasks {
        tokio::time::timeout(Duration::from_secs(90), task)
            .await
            .expect("every client gets in")
            .unwrap();
    }
    let most = most.load(Ordering::SeqCst);
    assert!(most <= L as usize, "{most} valid holders at once");
    assert_eq!(most, L as usize, "the permits were used in parallel");
}

/// Waits until every node counts at least `n` subscribers on the count key's channel.
async fn subscribed(cluster: &redlock_testkit::Cluster, n: i64) -> bool {
    let key = format!("{{{RESOURCE}}}:permits");
    common::eventually(Duration::from_secs(10), || {
        common::subscribers(cluster, &key).iter().all(|count| *count >= n)
    })
    .await
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_waiter_is_woken_by_each_release_even_of_slots_granted_on_different_quorums() {
    let cluster = common::cluster(3);
    let rl = client(&cluster).await;
    let slot_key = |slot: u32| format!("{{{RESOURCE}}}:permit:{slot}");
    let del = |node: usize, key: &str| cluster.node(node).command(&["DEL", key]).unwrap();
    // A granted on nodes {0, 1}: node 2 holds both slots for someone else meanwhile.
    cluster.node(2).set(&slot_key(0), "blocker").unwrap();
    cluster.node(2).set(&slot_key(1), "blocker").unwrap();
    let a = rl.semaphore(RESOURCE, 2).once().await.unwrap();
    let b_slot = 1 - a.slot();
    del(2, &slot_key(b_slot));
    // B granted on nodes {1, 2}: node 0 holds B's slot for someone else meanwhile.
    cluster.node(0).set(&slot_key(b_slot), "blocker").unwrap();
    let b = rl.semaphore(RESOURCE, 2).once().await.unwrap();
    assert_eq!(b.slot(), b_slot);
    del(0, &slot_key(b_slot));
    del(2, &slot_key(a.slot()));
    assert_eq!(cluster.nodes_holding(&slot_key(a.slot()), a.token()), vec![0, 1]);
    assert_eq!(cluster.nodes_holding(&slot_key(b_slot), b.token()), vec![1, 2]);

    // Node 2 keeps A's slot for someone else again: a failed attempt on it sets nothing
    // and publishes nothing.
    cluster.node(2).set(&slot_key(a.slot()), "blocker").unwrap();

    // Two waits of one client, whose pause is far longer than the test: only
    // notifications wake them in time.
    let slow = Retry::new()
        .with_delay(Duration::from_secs(30))
        .with_jitter(Duration::ZERO)
        .with_max_wait(Duration::from_secs(120));
    let waiter = client(&cluster).await;
    let spawn_wait = || {
        let waiter = waiter.clone();
        tokio::spawn(async move { waiter.semaphore(RESOURCE, 2).retry(slow).await })
    };
    let first = spawn_wait();
    assert!(subscribed(&cluster, 1).await, "the waiter subscribed");
    let last = spawn_wait();
    // Let the second wait fail its first attempt and queue.
    tokio::time::sleep(Duration::from_secs(1)).await;

    // B's release (published on {1, 2}) lets the first wait in.
    b.release().await.unwrap();
    let first = tokio::time::timeout(Duration::from_secs(10), first)
        .await
        .expect("the first wait is woken by B's release")
        .unwrap()
        .unwrap();
    assert_eq!(first.slot(), b_slot);
    // The second wait, handed the wake-up, tries again meanwhile and finds both slots held.
    tokio::time::sleep(Duration::from_secs(1)).await;
    // A's release (published on {0, 1}) frees A's slot on a quorum: it must wake the other.
    a.release().await.unwrap();
    let last = tokio::time::timeout(Duration::from_secs(10), last)
        .await
        .expect("the second wait is woken by A's release, not by its 30 s pause")
        .unwrap()
        .unwrap();
    first.release().await.unwrap();
    last.release().await.unwrap();
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_plain_lock_on_a_slot_key_and_a_permit_of_that_slot_exclude_each_other() {
    let cluster = common::cluster(3);
    let rl = client(&cluster).await;
    let slot_0 = format!("{{{RESOURCE}}}:permit:0");
    let count_key = format!("{{{RESOURCE}}}:permits");
    let plain = rl.lock(&slot_0).once().await.unwrap();
    let err = rl.semaphore(RESOURCE, 1).once().await.unwrap_err();
    assert_eq!(err.kind(), ErrorKind::NotAcquired, "{err}");
    plain.release().await.unwrap();
    let permit = rl.semaphore(RESOURCE, 1).once().await.unwrap();
    let err = rl.lock(&slot_0).once().await.unwrap_err();
    assert_eq!(err.kind(), ErrorKind::NotAcquired, "{err}");
    let err = rl.lock(&count_key).once().await.unwrap_err();
    assert_eq!(err.kind(), ErrorKind::NotAcquired, "the count key is not free: {err}");
    assert_eq!(cluster.nodes_holding(&slot_0, permit.token()), vec![0, 1, 2]);
    assert_eq!(cluster.nodes_holding(&count_key, "1"), vec![0, 1, 2]);
    permit.release().await.unwrap();

    // A plain lock holding the count key's name: the counting lock is refused, and its
    // attempts leave the plain lock's key alone.
    let other = "other";
    let other_count = format!("{{{other}}}:permits");
    let plain = rl.lock(&other_count).once().await.unwrap();
    let err = rl.semaphore(other, 2).once().await.unwrap_err();
    assert!(matches!(err.kind(), ErrorKind::Config | ErrorKind::NotAcquired), "{err}");
    assert_eq!(cluster.nodes_holding(&other_count, plain.token()), vec![0, 1, 2]);
    assert_eq!(cluster.count_key(&format!("{{{other}}}:permit:0")), 0);
    assert_eq!(cluster.count_key(&format!("{{{other}}}:permit:1")), 0);
    plain.release().await.unwrap();
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_stale_permit_neither_releases_nor_extends_the_next_holder_of_its_slot() {
    let cluster = common::cluster(3);
    let rl = client(&cluster).await;
    let mut stale = rl.semaphore(RESOURCE, 1).ttl(Duration::from_millis(300)).once().await.unwrap();
    let key = stale.key().to_owned();
    assert!(common::eventually(Duration::from_secs(5), || cluster.count_key(&key) == 0).await);
    let next = rl.semaphore(RESOURCE, 1).once().await.unwrap();
    assert!(stale.extend(Duration::from_secs(60)).await.is_err(), "a stale permit cannot extend");
    let _ = stale.release().await;
    // The next permit was granted at two of three nodes: the third may still be setting it.
    let everywhere = || cluster.nodes_holding(&key, next.token()) == [0, 1, 2];
    assert!(
        common::eventually(Duration::from_secs(2), everywhere).await,
        "{:?}",
        cluster.nodes_holding(&key, next.token())
    );
    let long = cluster.pttls(&key).unwrap();
    assert!(long.iter().all(|ttl| ttl.is_some_and(|ms| ms <= 10_000)), "{long:?}");
    next.release().await.unwrap();
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn clients_with_different_counts_are_never_valid_at_once_under_contention() {
    use std::sync::{Arc, Mutex};
    let cluster = common::cluster(3);
    // (count, granted, end of validity or release)
    let grants: Arc<Mutex<Vec<(u32, Instant, Instant)>>> = Arc::default();
    let deadline = Instant::now() + Duration::from_secs(8);
    let mut tasks = Vec::new();
    for i in 0..6u32 {
        let rl = client(&cluster).await;
        let grants = grants.clone();
        let count = if i.is_multiple_of(2) { 2 } else { 3 };
        tasks.push(tokio::spawn(async move {
            let mut n = 0u32;
            // The two-permit clients stop half-way: the three-permit ones can get in only
            // once the count key has expired, so the hand-over (with permits left to
            // expire) is exercised.
            let deadline = if count == 2 { deadline - Duration::from_secs(4) } else { deadline };
            while Instant::now() < deadline {
                n += 1;
                let ttl = Duration::from_millis(200 + u64::from(n % 4) * 100);
                let Ok(permit) = rl.semaphore(RESOURCE, count).ttl(ttl).once().await else {
                    tokio::time::sleep(Duration::from_millis(rand_ms(i, n))).await;
                    continue;
                };
                let granted = Instant::now();
                let valid_until = granted + permit.validity();
                tokio::time::sleep(Duration::from_millis(rand_ms(i, n))).await;
                if n.is_multiple_of(3) {
                    // Left to expire: valid until its validity ends.
                    std::mem::forget(permit);
                    grants.lock().unwrap().push((count, granted, valid_until));
                } else {
                    let end = Instant::now().min(valid_until);
                    permit.release().await.ok();
                    grants.lock().unwrap().push((count, granted, end));
                }
            }
        }));
    }
    for task in tasks {
        tokio::time::timeout(Duration::from_secs(60), task).await.unwrap().unwrap();
    }
    let grants = grants.lock().unwrap();
    let counts: BTreeSet<u32> = grants.iter().map(|g| g.0).collect();
    for (i, a) in grants.iter().enumerate() {
        for b in &grants[i + 1..] {
            if a.0 != b.0 {
                assert!(
                    a.2 <= b.1 || b.2 <= a.1,
                    "a {}-permit and a {}-permit valid at once",
                    a.0,
                    b.0
                );
            }
        }
        // At most `count` valid at the start of each grant.
        let at_once = grants.iter().filter(|g| g.1 <= a.1 && a.1 < g.2).count();
        assert!(at_once <= a.0 as usize, "{at_once} valid holders of a {}-permit lock", a.0);
    }
    assert_eq!(counts, BTreeSet::from([2, 3]), "both counts were granted");
}

/// A pseudo-random pause of 10-60 ms, different per client and round.
fn rand_ms(i: u32, n: u32) -> u64 {
    u64::from((i.wrapping_mul(7919) ^ n.wrapping_mul(104_729)) % 50 + 10)
}
