//! The read-write lock against real nodes: readers share, a writer excludes everyone, each
//! share has its own token and expiry, writers are not starved, waiters are woken, and a
//! contended read/write history shows no write overlapping any other grant.

use crate::common;

use std::sync::Arc;
use std::sync::atomic::{AtomicBool, Ordering};
use std::time::{Duration, Instant};

use redis::Commands;
use redlock::{ErrorKind, Redlock, Retry, WriterPriority};
use redlock_testkit::{Cluster, Grant, History, RedisNode};

/// On how many live, unpaused nodes the hash `key` has `field`.
fn nodes_with_field(cluster: &Cluster, key: &str, field: &str) -> usize {
    cluster
        .nodes()
        .iter()
        .filter(|node| node.is_running() && !node.is_paused())
        .filter(|node| {
            let Ok(mut con) = node.connection() else { return false };
            redis::cmd("HEXISTS").arg(key).arg(field).query::<bool>(&mut con).unwrap_or(false)
        })
        .count()
}

/// On how many live nodes the hash `key` has a field starting with `prefix`.
fn nodes_with_prefix(cluster: &Cluster, key: &str, prefix: &str) -> usize {
    cluster
        .nodes()
        .iter()
        .filter(|node| node.is_running() && !node.is_paused())
        .filter(|node| {
            let Ok(mut con) = node.connection() else { return false };
            let fields: Vec<String> = redis::cmd("HKEYS").arg(key).query(&mut con).unwrap();
            fields.iter().any(|f| f.starts_with(prefix))
        })
        .count()
}

fn hdel_everywhere(cluster: &Cluster, key: &str, field: &str) {
    for node in cluster.nodes() {
        let mut con = node.connection().unwrap();
        let _: i64 = redis::cmd("HDEL").arg(key).arg(field).query(&mut con).unwrap();
    }
}

/// Unbounded attempts for up to `max_wait`, pausing `delay` (+ up to 10 ms) between them.
fn polling(delay: Duration, max_wait: Duration) -> Retry {
    Retry::new()
        .with_unbounded_attempts()
        .with_delay(delay)
        .with_jitter(Duration::from_millis(10))
        .with_max_wait(max_wait)
}

/// A client that waits: see [`polling`].
fn waiting_client(cluster: &Cluster, delay: Duration, max_wait: Duration) -> Redlock {
    common::builder(cluster, Duration::from_millis(200))
        .retry(polling(delay, max_wait))
        .build()
        .unwrap()
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn readers_share_and_a_writer_excludes_readers_and_writers() {
    let cluster = common::cluster(5);
    let rl = common::client(&cluster);
    let r1 = rl.read("doc").once().await.unwrap();
    let r2 = rl.read("doc").once().await.unwrap();
    assert_ne!(r1.token(), r2.token());
    assert_eq!(
        (r1.resource(), r1.key(), r1.field()),
        ("doc", "doc", &*format!("r:{}", r1.token()))
    );
    assert!(r1.validity() > Duration::from_secs(9) && r1.validity() < Duration::from_secs(10));
    for field in [r1.field(), r2.field()] {
        let everywhere = || nodes_with_field(&cluster, "doc", field) == 5;
        assert!(common::eventually(Duration::from_secs(1), everywhere).await);
    }
    let pttl = cluster.node(0).pttl("doc").unwrap();
    assert!(pttl > 9_000 && pttl <= 10_000, "the key lives as long as its shares: {pttl}");

    let err = rl.write("doc").once().await.unwrap_err();
    assert_eq!(err.kind(), ErrorKind::NotAcquired, "{err}");
    assert!(err.held_by_others() >= 3, "{err}");
    assert_eq!(nodes_with_prefix(&cluster, "doc", "w:"), 0, "the refused writer left nothing");
    assert_eq!(nodes_with_prefix(&cluster, "doc", "i:"), 0, "try_write records no intent");

    r1.release().await.unwrap();
    assert_eq!(rl.write("doc").once().await.unwrap_err().kind(), ErrorKind::NotAcquired);
    r2.release().await.unwrap();
    assert!(common::eventually(Duration::from_secs(1), || cluster.count_key("doc") == 0).await);

    let w = rl.write("doc").once().await.unwrap();
    assert!(w.field().starts_with("w:"));
    assert_eq!(rl.read("doc").once().await.unwrap_err().kind(), ErrorKind::NotAcquired);
    assert_eq!(rl.write("doc").once().await.unwrap_err().kind(), ErrorKind::NotAcquired);
    w.release().await.unwrap();
    assert!(common::eventually(Duration::from_secs(1), || cluster.count_key("doc") == 0).await);
    rl.read("doc").once().await.unwrap().release().await.unwrap();
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_share_expires_on_its_own_without_freeing_the_writer_or_shortening_the_key() {
    let cluster = common::cluster(3);
    let rl = common::client(&cluster);
    let long = rl.read("doc").ttl(Duration::from_secs(10)).once().await.unwrap();
    let short = rl.read("doc").ttl(Duration::from_millis(300)).once().await.unwrap();
    let long_key = || cluster.nodes().iter().all(|n| n.pttl("doc").unwrap() > 9_000);
    assert!(common::eventually(Duration::from_secs(1), long_key).await, "never shortened");

    tokio::time::sleep(Duration::from_millis(400)).await;
    assert!(!short.is_valid());
    let err = rl.write("doc").once().await.unwrap_err();
    assert_eq!(err.kind(), ErrorKind::NotAcquired, "the long share still excludes: {err}");
    // Every script drops expired fields: the write attempt pruned the short share.
    let pruned = || nodes_with_field(&cluster, "doc", short.field()) == 0;
    assert!(common::eventually(Duration::from_secs(1), pruned).await);
    assert_eq!(nodes_with_field(&cluster, "doc", long.field()), 3);

    let err = short.release().await.unwrap_err();
    assert_eq!(err.kind(), ErrorKind::NotHeld, "{err}");
    assert_eq!(nodes_with_field(&cluster, "doc", long.field()), 3);
    long.release().await.unwrap();
    rl.write("doc").once().await.unwrap().release().await.unwrap();
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_reader_cannot_release_or_extend_another_readers_share() {
    let cluster = common::cluster(3);
    let rl = common::client(&cluster);
    let a = rl.read("doc").once().await.unwrap();
    let b = rl.read("doc").once().await.unwrap();
    let mut c = rl.read("doc").once().await.unwrap();
    let all_three = || {
        [a.field(), b.field(), c.field()].iter().all(|f| nodes_with_field(&cluster, "doc", f) == 3)
    };
    assert!(common::eventually(Duration::from_secs(1), all_three).await);

    a.release().await.unwrap();
    assert_eq!(nodes_with_field(&cluster, "doc", b.field()), 3, "a's release left b's share");
    assert_eq!(nodes_with_field(&cluster, "doc", c.field()), 3);

    // c's share vanishes (as after its expiry): its extend and release touch nobody else's.
    hdel_everywhere(&cluster, "doc", c.field());
    let err = c.extend(Duration::from_secs(10)).await.unwrap_err();
    assert_eq!(err.kind(), ErrorKind::NotHeld, "{err}");
    assert_eq!(nodes_with_field(&cluster, "doc", c.field()), 0, "extend sets nothing again");
    let err = c.release().await.unwrap_err();
    assert_eq!(err.kind(), ErrorKind::NotHeld, "{err}");
    assert_eq!(nodes_with_field(&cluster, "doc", b.field()), 3);
    assert_eq!(rl.write("doc").once().await.unwrap_err().kind(), ErrorKind::NotAcquired);
    b.release().await.unwrap();
    assert!(common::eventually(Duration::from_secs(1), || cluster.count_key("doc") == 0).await);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn failed_or_emptied_nodes_do_not_free_the_writer_early() {
    let mut cluster = common::cluster(5);
    let rl = common::client(&cluster);
    let reader = rl.read("doc").once().await.unwrap();
    let everywhere = || nodes_with_field(&cluster, "doc", reader.field()) == 5;
    assert!(common::eventually(Duration::from_secs(1), everywhere).await);

    cluster.node_mut(0).kill().unwrap();
    cluster.node_mut(1).kill().unwrap();
    let err = rl.write("doc").once().await.unwrap_err();
    // Decided as soon as no quorum is possible: held on one node, two unreachable, may
    // already say "unavailable".
    assert!(matches!(err.kind(), ErrorKind::NotAcquired | ErrorKind::Unavailable), "{err}");

    // Back without their data: they grant the writer, the other three still refuse it.
    cluster.node_mut(0).restart_empty().unwrap();
    cluster.node_mut(1).restart_empty().unwrap();
    let err = rl.write("doc").once().await.unwrap_err();
    assert_eq!(err.kind(), ErrorKind::NotAcquired, "{err}");
    assert_eq!(err.held_by_others(), 3, "{err}");
    let cleaned = || nodes_with_prefix(&cluster, "doc", "w:") == 0;
    assert!(common::eventually(Duration::from_secs(1), cleaned).await, "the failed write is gone");
    assert!(reader.is_valid());

    reader.release().await.unwrap();
    rl.write("doc").once().await.unwrap().release().await.unwrap();
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_waiting_writer_blocks_new_readers_and_is_woken_by_the_last_release() {
    let cluster = common::cluster(3);
    let rl = common::client(&cluster);
    // Pauses of 2 s between attempts: only a release notification can explain a quick grant.
    let waiting = waiting_client(&cluster, Duration::from_secs(2), Duration::from_secs(5));
    let reader = rl.read("doc").once().await.unwrap();
    let writer = tokio::spawn(async move {
        let lock = waiting.write("doc").await;
        (lock, Instant::now())
    });
    let intent = || nodes_with_prefix(&cluster, "doc", "i:") == 3;
    assert!(common::eventually(Duration::from_secs(1), intent).await, "the writer's intent");
    let err = rl.read("doc").once().await.unwrap_err();
    assert_eq!(err.kind(), ErrorKind::NotAcquired, "a new reader waits for the writer: {err}");
    // Nobody holds it against the reader: it says that a writer waits, not a holder.
    assert!(err.writers_waiting() >= 2, "{err}");
    assert!(err.to_string().contains("a writer waits"), "{err}");
    assert!(!err.to_string().contains("held by another owner"), "{err}");
    // A reader holds it on every node: the message must not say that no one does.
    assert!(err.to_string().contains("no writer holds it on a quorum; readers may"), "{err}");
    assert!(!err.to_string().contains("no one holds it"), "{err}");
    assert!(!err.is_split_vote());

    let released = Instant::now();
    reader.release().await.unwrap();
    let (lock, granted) = writer.await.unwrap();
    let lock = lock.unwrap();
    let waited = granted - released;
    assert!(waited < Duration::from_millis(1000), "woken by the release, after {waited:?}");
    // Granted at the quorum: the last node's grant (which removes the intent there) may
    // still be on its way.
    let no_intent = || nodes_with_prefix(&cluster, "doc", "i:") == 0;
    assert!(
        common::eventually(Duration::from_secs(1), no_intent).await,
        "the granted writer's intent is gone"
    );
    assert_eq!(rl.read("doc").once().await.unwrap_err().kind(), ErrorKind::NotAcquired);
    lock.release().await.unwrap();
    rl.read("doc").once().await.unwrap().release().await.unwrap();
}

/// A node that refuses the granting attempt (there, a reader's release has not arrived yet)
/// records the writer's intent; once granted, the writer takes it back there instead of
/// leaving it to refuse readers on that node for the intent's lifetime (seconds here).
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_granted_writer_withdraws_its_intent_where_the_grant_did_not_land() {
    let cluster = common::cluster(3);
    // Another client's share, on the last node only (its value: its expiry, a minute on).
    let last = &cluster.nodes()[2];
    let mut con = last.connection().unwrap();
    let (secs, _): (u64, u64) = redis::cmd("TIME").query(&mut con).unwrap();
    let expiry = (secs + 60) * 1000;
    let _: () = con.hset("doc", "r:another", expiry).unwrap();
    let _: bool = con.pexpire("doc", 60_000).unwrap();

    // Pauses of 2 s between attempts: its intent lives about 5 s.
    let waiting = waiting_client(&cluster, Duration::from_secs(2), Duration::from_secs(5));
    let lock = waiting.write("doc").await.unwrap();
    let no_intent = || nodes_with_prefix(&cluster, "doc", "i:") == 0;
    assert!(
        common::eventually(Duration::from_secs(1), no_intent).await,
        "the intent is gone from the node that refused the grant"
    );
    assert_eq!(nodes_with_field(&cluster, "doc", "r:another"), 1, "the other share stays");
    lock.release().await.unwrap();
}

/// A waiting writer's attempt granted on one node but refused on a quorum fails, and its
/// grant there is cleaned up: the wait's intent, recorded on that node by an earlier
/// refusal, stays there for the rest of the wait (before, the grant removed it and forbade
/// the wait to record it again, so readers slipped in there for the rest of the wait, and
/// partial grants on different nodes could open a quorum to a stream of readers). The wait
/// withdraws it from every node once granted.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_waiting_writers_intent_stays_where_a_failed_attempt_was_granted_and_cleaned_up() {
    let cluster = common::cluster(3);
    // Another client's share on every node (its value: its expiry, a minute on).
    let share = |i: usize, present: bool| {
        let mut con = cluster.node(i).connection().unwrap();
        if present {
            let (secs, _): (u64, u64) = redis::cmd("TIME").query(&mut con).unwrap();
            let _: () = con.hset("doc", "r:another", (secs + 60) * 1000).unwrap();
            let _: bool = con.pexpire("doc", 60_000).unwrap();
        } else {
            let _: i64 = con.hdel("doc", "r:another").unwrap();
        }
    };
    (0..3).for_each(|i| share(i, true));
    // Attempts about a second apart: its intent lives about 2.8 s, renewed by each.
    let waiting = waiting_client(&cluster, Duration::from_secs(1), Duration::from_secs(20));
    let writer = tokio::spawn({
        let waiting = waiting.clone();
        async move { waiting.write("doc").await }
    });
    let everywhere = || nodes_with_prefix(&cluster, "doc", "i:") == 3;
    assert!(common::eventually(Duration::from_secs(5), everywhere).await, "the writer waits");

    // Node 0 alone is free: the next attempts (about a second apart) are granted there,
    // refused on nodes 1-2, and their grant on node 0 is cleaned up at once.
    share(0, false);
    tokio::time::sleep(Duration::from_millis(2500)).await;
    let mut node_0 = cluster.node(0).connection().unwrap();
    let mut cleaned_up = || {
        let fields: Vec<String> = redis::cmd("HKEYS").arg("doc").query(&mut node_0).unwrap();
        !fields.iter().any(|field| field.starts_with("w:"))
    };
    assert!(
        common::eventually(Duration::from_secs(2), &mut cleaned_up).await,
        "an attempt granted on node 0 failed and was not cleaned up there"
    );
    assert!(!writer.is_finished(), "the writer still waits");
    let fields = |i: usize| cluster.hash_fields("doc").unwrap()[i].clone().unwrap_or_default();
    assert!(
        fields(0).keys().any(|field| field.starts_with("i:")),
        "the wait's intent is gone from node 0: {:?}",
        fields(0)
    );
    // A reader that needs node 0 alone is refused there (by the intent, or by the grant of
    // an attempt in progress).
    let node_0_only =
        common::builder_for(vec![cluster.urls()[0].clone()], Duration::from_millis(200))
            .build()
            .unwrap();
    let refused = node_0_only.read("doc").once().await;
    assert!(refused.is_err(), "a reader got node 0 while the writer waits");

    // Granted once the other share goes: the intent is withdrawn from every node.
    (1..3).for_each(|i| share(i, false));
    let lock =
        tokio::time::timeout(Duration::from_secs(10), writer).await.unwrap().unwrap().unwrap();
    let withdrawn = || nodes_with_prefix(&cluster, "doc", "i:") == 0;
    assert!(
        common::eventually(Duration::from_secs(2), withdrawn).await,
        "an intent stayed after the grant: {:?}",
        cluster.hash_fields("doc").unwrap()
    );
    lock.release().await.unwrap();
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_waiting_reader_is_woken_when_the_writer_releases_and_a_writer_giving_up_withdraws() {
    let cluster = common::cluster(3);
    let rl = common::client(&cluster);
    let waiting = waiting_client(&cluster, Duration::from_secs(2), Duration::from_secs(5));
    let writer = rl.write("doc").once().await.unwrap();
    let reader = tokio::spawn(async move {
        let lock = waiting.read("doc").await;
        (lock, Instant::now())
    });
    tokio::time::sleep(Duration::from_millis(100)).await;
    let released = Instant::now();
    writer.release().await.unwrap();
    let (lock, granted) = reader.await.unwrap();
    let lock = lock.unwrap();
    let waited = granted - released;
    assert!(waited < Duration::from_millis(1000), "woken by the release, after {waited:?}");

    // A writer that gives up while the share is held takes its intent back.
    let impatient = waiting_client(&cluster, Duration::from_millis(20), Duration::from_millis(150));
    let err = impatient.write("doc").await.unwrap_err();
    assert_eq!(err.kind(), ErrorKind::NotAcquired, "{err}");
    let withdrawn = || nodes_with_prefix(&cluster, "doc", "i:") == 0;
    assert!(common::eventually(Duration::from_secs(1), withdrawn).await);
    rl.read("doc").once().await.unwrap().release().await.unwrap();
    lock.release().await.unwrap();
}

/// Readers hold overlapping shares back to back, so the resource is never free of them;
/// a waiting writer still gets in, and the read/write history shows no overlap with it.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_writer_is_not_starved_by_a_steady_stream_of_readers() {
    let cluster = common::cluster(3);
    let history = History::new();
    let stop = Arc::new(AtomicBool::new(false));
    let readers: Vec<_> = (0..4)
        .map(|client| {
            let rl = waiting_client(&cluster, Duration::from_millis(5), Duration::from_secs(5));
            let (history, stop) = (history.clone(), stop.clone());
            tokio::spawn(async move {
                // Staggered starts, so that shares overlap rather than align.
                tokio::time::sleep(Duration::from_millis(10 * client as u64)).await;
                while !stop.load(Ordering::Relaxed) {
                    let lock = rl.read("doc").await.unwrap();
                    let now = Instant::now();
                    let grant = Grant::shared(client, lock.token(), now, now + lock.validity());
                    let id = history.record(grant);
                    tokio::time::sleep(Duration::from_millis(40)).await;
                    history.released(id, Instant::now());
                    lock.release().await.unwrap();
                }
            })
        })
        .collect();
    tokio::time::sleep(Duration::from_millis(200)).await;

    let writer = waiting_client(&cluster, Duration::from_millis(10), Duration::from_secs(4));
    let started = Instant::now();
    let lock = writer.write("doc").await.unwrap();
    let now = Instant::now();
    let waited = now - started;
    let id = history.record(Grant::new(99, lock.token(), now, now + lock.validity()));
    tokio::time::sleep(Duration::from_millis(20)).await;
    history.released(id, Instant::now());
    lock.release().await.unwrap();
    assert!(waited < Duration::from_secs(2), "the writer waited {waited:?}");

    tokio::time::sleep(Duration::from_millis(100)).await;
    stop.store(true, Ordering::Relaxed);
    for reader in readers {
        reader.await.unwrap();
    }
    let violations = history.violations();
    assert!(violations.is_empty(), "{}", violations[0]);
    assert!(history.shared_overlaps() > 0, "the readers did share");
}

/// A waiting writer with the default priority behind a waiting writer of its own client
/// that does not block readers: overlapping readers of another client do not starve it
/// (the other writer's attempts cannot stand in for its own, which hold new readers back).
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_preferred_writer_behind_its_clients_unprioritised_writer_is_not_starved() {
    let cluster = common::cluster(3);
    let stop = Arc::new(AtomicBool::new(false));
    let reading = waiting_client(&cluster, Duration::from_millis(5), Duration::from_secs(10));
    let readers: Vec<_> = (0..8)
        .map(|reader| {
            let (rl, stop) = (reading.clone(), stop.clone());
            tokio::spawn(async move {
                // Staggered starts, so that shares overlap rather than align.
                tokio::time::sleep(Duration::from_millis(12 * reader)).await;
                while !stop.load(Ordering::Relaxed) {
                    // Refused while a writer waits or holds: the next try comes soon.
                    let Ok(lock) = rl.read("doc").await else {
                        tokio::time::sleep(Duration::from_millis(5)).await;
                        continue;
                    };
                    tokio::time::sleep(Duration::from_millis(100)).await;
                    let _ = lock.release().await;
                }
            })
        })
        .collect();
    tokio::time::sleep(Duration::from_millis(200)).await;

    let writers = common::builder(&cluster, Duration::from_millis(200)).build().unwrap();
    let polling = |delay| {
        Retry::new()
            .with_unbounded_attempts()
            .with_delay(delay)
            .with_jitter(Duration::from_millis(2))
            .with_max_wait(Duration::from_secs(3))
    };
    let unprioritised = tokio::spawn({
        let writers = writers.clone();
        let retry = polling(Duration::from_millis(5));
        async move {
            let request = writers.write("doc").priority(WriterPriority::None).retry(retry);
            if let Ok(lock) = request.await {
                lock.release().await.unwrap();
            }
        }
    });
    tokio::time::sleep(Duration::from_millis(50)).await;
    let started = Instant::now();
    let preferred = writers.write("doc").retry(polling(Duration::from_millis(20))).await;
    let waited = started.elapsed();
    let lock = preferred.unwrap_or_else(|err| panic!("starved for {waited:?}: {err}"));
    lock.release().await.unwrap();
    assert!(waited < Duration::from_secs(2), "the preferred writer waited {waited:?}");

    stop.store(true, Ordering::Relaxed);
    unprioritised.await.unwrap();
    for reader in readers {
        reader.await.unwrap();
    }
}

/// Separate clients read and write one resource at random: no write overlaps any other
/// grant (the history), and no write is lost nor seen half-done by a reader (a counter
/// on a node outside the cluster).
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn contending_readers_and_writers_keep_exclusion() {
    let cluster = common::cluster(3);
    let counter = RedisNode::start().unwrap();
    let history = History::new();
    const CLIENTS: usize = 6;
    const SECTIONS: usize = 12;
    let tasks: Vec<_> = (0..CLIENTS)
        .map(|client| {
            let rl = waiting_client(&cluster, Duration::from_millis(1), Duration::from_secs(20));
            let mut counter = counter.connection().unwrap();
            let history = history.clone();
            tokio::spawn(async move {
                let mut writes = 0;
                for section in 0..SECTIONS {
                    if (client + section) % 3 == 0 {
                        let lock = rl.write("counter").await.unwrap();
                        let now = Instant::now();
                        let grant = Grant::new(client, lock.token(), now, now + lock.validity());
                        let id = history.record(grant);
                        // A non-atomic read-modify-write: only exclusion keeps it right.
                        let value: i64 = counter.get("count").unwrap_or(0);
                        tokio::time::sleep(Duration::from_millis(2)).await;
                        let () = counter.set("count", value + 1).unwrap();
                        assert!(lock.is_valid());
                        history.released(id, Instant::now());
                        lock.release().await.unwrap();
                        writes += 1;
                    } else {
                        let lock = rl.read("counter").await.unwrap();
                        let now = Instant::now();
                        let grant = Grant::shared(client, lock.token(), now, now + lock.validity());
                        let id = history.record(grant);
                        let before: Option<i64> = counter.get("count").unwrap();
                        tokio::time::sleep(Duration::from_millis(3)).await;
                        let after: Option<i64> = counter.get("count").unwrap();
                        assert_eq!(before, after, "a write during a read");
                        history.released(id, Instant::now());
                        lock.release().await.unwrap();
                    }
                }
                writes
            })
        })
        .collect();
    let mut writes = 0;
    for task in tasks {
        writes += task.await.unwrap();
    }
    let count: i64 = counter.connection().unwrap().get("count").unwrap();
    assert_eq!(count, writes);
    assert_eq!(history.len(), CLIENTS * SECTIONS);
    let violations = history.violations();
    assert!(violations.is_empty(), "{} violations, first: {}", violations.len(), violations[0]);
    assert!(common::eventually(Duration::from_secs(1), || cluster.count_key("counter") == 0).await);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn auto_extension_keeps_shares_and_writers_and_signals_a_lost_share() {
    const TTL: Duration = Duration::from_millis(300);
    let cluster = common::cluster(3);
    let rl = common::builder(&cluster, Duration::from_millis(100)).ttl(TTL).build().unwrap();

    let reader = rl.read("doc").once().await.unwrap();
    let field = reader.field().to_owned();
    let auto = reader.auto_extend();
    let end = Instant::now() + TTL * 3;
    while Instant::now() < end {
        assert_eq!(rl.write("doc").once().await.unwrap_err().kind(), ErrorKind::NotAcquired);
        tokio::time::sleep(TTL / 5).await;
    }
    assert!(!auto.lease().is_lost() && auto.validity() > Duration::ZERO);
    hdel_everywhere(&cluster, "doc", &field);
    let err = tokio::time::timeout(TTL, auto.lost()).await.expect("lost() within one TTL");
    assert_eq!(err.kind(), ErrorKind::NotHeld, "{err}");
    assert!(auto.release().await.is_err());

    let auto = rl.write("doc").once().await.unwrap().auto_extend();
    let end = Instant::now() + TTL * 3;
    while Instant::now() < end {
        assert_eq!(rl.read("doc").once().await.unwrap_err().kind(), ErrorKind::NotAcquired);
        tokio::time::sleep(TTL / 5).await;
    }
    auto.release().await.unwrap();
    assert!(common::eventually(Duration::from_secs(1), || cluster.count_key("doc") == 0).await);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn other_lock_kinds_on_the_key_are_wrong_type_and_drop_releases() {
    let cluster = common::cluster(3);
    let rl = common::client(&cluster);
    let plain = rl.try_lock("res").await.unwrap();
    let err = rl.read("res").once().await.unwrap_err();
    assert_eq!(err.kind(), ErrorKind::WrongType, "{err}");
    assert_eq!(rl.write("res").once().await.unwrap_err().kind(), ErrorKind::WrongType);
    plain.release().await.unwrap();

    let reentrant = rl.reentrant("re", "owner").once().await.unwrap();
    let err = rl.write("re").once().await.unwrap_err();
    assert_eq!(err.kind(), ErrorKind::WrongType, "a hash with foreign fields: {err}");
    reentrant.release().await.unwrap();

    let share = rl.read("rw").once().await.unwrap();
    assert_eq!(rl.try_lock("rw").await.unwrap_err().kind(), ErrorKind::WrongType);
    drop(share);
    assert!(common::eventually(Duration::from_secs(1), || cluster.count_key("rw") == 0).await);
    let writer = rl.write("rw").once().await.unwrap();
    drop(writer);
    assert!(common::eventually(Duration::from_secs(1), || cluster.count_key("rw") == 0).await);
    assert_eq!(rl.read("").once().await.unwrap_err().kind(), ErrorKind::Config);
}

/// The SHA1 of the writer's acquisition script: what a proxy can pick its attempts out by.
fn write_acquire_sha() -> String {
    let source = concat!(
        include_str!("../../src/lua/rw_fields.lua"),
        include_str!("../../src/lua/hash_common.lua"),
        include_str!("../../src/lua/rw_write_acquire.lua")
    );
    redis::Script::new(source).get_hash().to_owned()
}

/// A granted writer's withdrawal of its intent from a node whose granting attempt is still
/// on its way (held back by that node's proxy) goes behind that attempt, on its connection:
/// the late grant lands and stays, no intent is left, and no reader gets in while the
/// writer holds.
///
/// The hold is set while the writer waits; an attempt already past the proxy then can still
/// be the granting one (about one run in ten on a loaded machine): that run shows nothing,
/// and the scenario starts over on a new key.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_writers_grant_held_back_on_one_node_lands_before_its_withdrawal_and_keeps_readers_out() {
    let faulty = redlock_testkit::FaultyCluster::start(3).unwrap();
    let cluster = faulty.cluster();
    let retry = polling(Duration::from_millis(300), Duration::from_secs(10));
    let waiting = Arc::new(common::retrying(faulty.urls(), Duration::from_secs(2), retry));
    common::warm(&waiting).await;
    let reader = common::single_attempt(faulty.urls());
    common::warm(&reader).await;
    let on_node_2 = |key: &str, field: &str| {
        let mut con = cluster.node(2).connection().unwrap();
        redis::cmd("HEXISTS").arg(key).arg(field).query::<bool>(&mut con).unwrap()
    };
    // The writer's attempts are held back 700 ms on node 2 (their deadline is 2 s on).
    let hold = Duration::from_millis(700);
    let mut tries = 0;
    let (key, lock, field) = loop {
        tries += 1;
        assert!(tries <= 5, "the granting attempt slipped past the hold {} times", tries - 1);
        let key = format!("doc{tries}");
        let share = reader.read(&key).ttl(Duration::from_secs(30)).await.unwrap();
        let writer = tokio::spawn({
            let (waiting, key) = (waiting.clone(), key.clone());
            async move { waiting.write(&key).ttl(Duration::from_secs(30)).await }
        });
        let intents = || nodes_with_prefix(cluster, &key, "i:") == 3;
        assert!(
            common::eventually(Duration::from_secs(5), intents).await,
            "the writer waits (try {tries}): intents on {} nodes",
            nodes_with_prefix(cluster, &key, "i:")
        );
        faulty.proxy(2).hold_requests_containing(write_acquire_sha().as_bytes(), hold);
        share.release().await.unwrap();
        let lock =
            tokio::time::timeout(Duration::from_secs(5), writer).await.unwrap().unwrap().unwrap();
        let field = format!("w:{}", lock.token());
        if !on_node_2(&key, &field) {
            break (key, lock, field);
        }
        // Granted before the hold took effect on node 2: nothing to see in this run.
        faulty.proxy(2).release_holds();
        lock.release().await.unwrap();
        tokio::time::sleep(hold).await;
    };
    // The withdrawal goes behind the held grant on node 2's connection.
    let everywhere = || nodes_with_field(cluster, &key, &field) == 3;
    assert!(
        common::eventually(Duration::from_secs(3), everywhere).await,
        "the grant held back on node 2 lands there: on {} nodes",
        nodes_with_field(cluster, &key, &field)
    );
    faulty.proxy(2).release_holds();
    tokio::time::sleep(Duration::from_millis(500)).await;
    assert_eq!(nodes_with_field(cluster, &key, &field), 3, "the withdrawal took no grant");
    assert_eq!(nodes_with_prefix(cluster, &key, "i:"), 0, "no intent is left");
    let refused = reader.read(&key).await;
    assert!(refused.is_err(), "a reader got in while the writer holds every node");
    lock.release().await.unwrap();
    assert!(common::eventually(Duration::from_secs(2), || cluster.count_key(&key) == 0).await);
}

/// Four reader clients keep overlapping shares back to back over five nodes, each client
/// behind its own jittery links that also lose replies (re-sent requests): a waiting writer
/// still gets in within a few seconds, wait after wait, no write overlaps any share, and
/// once every wait has ended no writer's intent is left to refuse readers.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_writer_gets_in_wait_after_wait_past_readers_on_lossy_jittery_links_to_five_nodes() {
    use redlock_testkit::{FaultyCluster, Fuzz, NodeConfig};

    const READERS: usize = 4;
    let faulty = FaultyCluster::start_for_clients(5, READERS + 1, NodeConfig::new()).unwrap();
    let seed = Fuzz::seed_from_env_or_random();
    println!("seed {seed}");
    let retry = |delay, max_wait| polling(Duration::from_millis(delay), max_wait);
    let clients: Vec<Redlock> = (0..=READERS)
        .map(|c| {
            let max_wait = Duration::from_secs(if c == READERS { 8 } else { 30 });
            let delay = if c == READERS { 20 } else { 5 };
            common::retrying(faulty.urls_for(c), Duration::from_millis(100), retry(delay, max_wait))
        })
        .collect();
    for rl in &clients {
        common::warm(rl).await;
    }
    for c in 0..=READERS {
        let fuzz = Fuzz::new(seed.wrapping_add(c as u64))
            .with_max_delay(Duration::from_millis(8))
            .with_drop_reply(0.02);
        faulty.fuzz_client(c, fuzz);
    }
    let history = History::new();
    let stop = Arc::new(AtomicBool::new(false));
    let readers: Vec<_> = (0..READERS)
        .map(|c| {
            let (rl, history, stop) = (clients[c].clone(), history.clone(), stop.clone());
            tokio::spawn(async move {
                tokio::time::sleep(Duration::from_millis(15 * c as u64)).await;
                while !stop.load(Ordering::Relaxed) {
                    let Ok(lock) = rl.read("doc").await else { continue };
                    let now = Instant::now();
                    let id = history.record(Grant::shared(c, lock.token(), now, lock.deadline()));
                    tokio::time::sleep(Duration::from_millis(60)).await;
                    history.released(id, Instant::now());
                    let _ = lock.release().await;
                }
            })
        })
        .collect();
    tokio::time::sleep(Duration::from_millis(300)).await;

    let writer = &clients[READERS];
    let mut waits = Vec::new();
    for _ in 0..4 {
        let started = Instant::now();
        let lock = writer.write("doc").await;
        let waited = started.elapsed();
        let lock = lock.unwrap_or_else(|err| panic!("starved for {waited:?} (seed {seed}): {err}"));
        let now = Instant::now();
        let id = history.record(Grant::new(READERS, lock.token(), now, lock.deadline()));
        tokio::time::sleep(Duration::from_millis(20)).await;
        history.released(id, Instant::now());
        let _ = lock.release().await;
        waits.push(waited);
        tokio::time::sleep(Duration::from_millis(150)).await;
    }
    stop.store(true, Ordering::Relaxed);
    for reader in readers {
        reader.await.unwrap();
    }
    println!("writer waits: {waits:?}");
    assert!(waits.iter().all(|w| *w < Duration::from_secs(5)), "waits {waits:?} (seed {seed})");
    let violations = history.violations();
    assert!(violations.is_empty(), "seed {seed}: {}", violations[0]);
    let cluster = faulty.cluster();
    let no_intent = || nodes_with_prefix(cluster, "doc", "i:") == 0;
    assert!(
        common::eventually(Duration::from_secs(2), no_intent).await,
        "an intent outlived its wait: {:?}",
        cluster.hash_fields("doc").unwrap()
    );
}

/// A writer granted after failed attempts, while its attempts to one node are held back
/// there by the network (that node still has another client's share): the wait's
/// withdrawal goes to that node too, and the held attempts that land after it record the
/// intent no more, so no intent is left there for readers to run into.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn held_back_attempts_of_a_writer_granted_after_failed_attempts_leave_no_intent() {
    let faulty = redlock_testkit::FaultyCluster::start(3).unwrap();
    let cluster = faulty.cluster();
    let share = |i: usize, present: bool| {
        let mut con = cluster.node(i).connection().unwrap();
        if present {
            let (secs, _): (u64, u64) = redis::cmd("TIME").query(&mut con).unwrap();
            let _: () = con.hset("doc", "r:another", (secs + 60) * 1000).unwrap();
            let _: bool = con.pexpire("doc", 60_000).unwrap();
        } else {
            let _: i64 = con.hdel("doc", "r:another").unwrap();
        }
    };
    (0..3).for_each(|i| share(i, true));
    // Attempts 300 ms apart: its intent lives about 9 s (node timeout 2 s).
    let retry = polling(Duration::from_millis(300), Duration::from_secs(20));
    let waiting = Arc::new(common::retrying(faulty.urls(), Duration::from_secs(2), retry));
    common::warm(&waiting).await;
    let writer = tokio::spawn({
        let waiting = waiting.clone();
        async move { waiting.write("doc").ttl(Duration::from_secs(30)).await }
    });
    let everywhere = || nodes_with_prefix(cluster, "doc", "i:") == 3;
    assert!(common::eventually(Duration::from_secs(5), everywhere).await, "the writer waits");
    // Node 2's attempts are held back 1.2 s each (within their deadline), and nodes 0-1
    // free: an attempt is granted there, after failed ones.
    let hold = Duration::from_millis(1200);
    faulty.proxy(2).hold_requests_containing(write_acquire_sha().as_bytes(), hold);
    tokio::time::sleep(Duration::from_millis(100)).await;
    (0..2).for_each(|i| share(i, false));
    let lock =
        tokio::time::timeout(Duration::from_secs(10), writer).await.unwrap().unwrap().unwrap();
    // Every held attempt lands (the last one sent before the grant within 1.2 s; more may
    // have queued behind it on that connection), then the holds end.
    tokio::time::sleep(hold * 3).await;
    faulty.proxy(2).release_holds();
    tokio::time::sleep(Duration::from_millis(500)).await;
    let fields = cluster.hash_fields("doc").unwrap();
    assert_eq!(nodes_with_prefix(cluster, "doc", "i:"), 0, "an intent is left: {fields:?}");
    assert_eq!(nodes_with_field(cluster, "doc", "r:another"), 1, "the other share stays");
    lock.release().await.unwrap();
}

/// A waiting writer cancelled while its attempt to one node is held back by the network:
/// its withdrawal reaches every node, the held attempt that lands after it records no
/// intent, and a reader gets in at once (not after the intent's lifetime, here seconds).
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_writer_cancelled_while_an_attempt_is_held_back_leaves_no_intent_and_readers_get_in() {
    let faulty = redlock_testkit::FaultyCluster::start(3).unwrap();
    let cluster = faulty.cluster();
    // Attempts 2 s apart: its intent lives about 8 s.
    let retry = polling(Duration::from_secs(2), Duration::from_secs(30));
    let waiting = Arc::new(common::retrying(faulty.urls(), Duration::from_secs(2), retry));
    common::warm(&waiting).await;
    let reader = common::single_attempt(cluster.urls());
    common::warm(&reader).await;
    let share = reader.read("doc").ttl(Duration::from_secs(30)).await.unwrap();
    // Every attempt to node 2 is held back 1.2 s (within its deadline).
    let hold = Duration::from_millis(1200);
    faulty.proxy(2).hold_requests_containing(write_acquire_sha().as_bytes(), hold);
    let writer = tokio::spawn({
        let waiting = waiting.clone();
        async move { waiting.write("doc").ttl(Duration::from_secs(30)).await }
    });
    let on_two = || nodes_with_prefix(cluster, "doc", "i:") == 2;
    assert!(common::eventually(Duration::from_secs(5), on_two).await, "the writer waits");
    // Cancelled while its first attempt to node 2 is still held back.
    writer.abort();
    let _ = writer.await;
    tokio::time::sleep(hold * 2).await;
    faulty.proxy(2).release_holds();
    let fields = cluster.hash_fields("doc").unwrap();
    assert_eq!(nodes_with_prefix(cluster, "doc", "i:"), 0, "an intent is left: {fields:?}");
    let second = reader.read("doc").await.expect("a reader is refused after the writer left");
    second.release().await.unwrap();
    share.release().await.unwrap();
}
