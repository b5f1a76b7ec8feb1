//! `Redlock::shutdown`: a process that drops a lock and exits right after a shutdown leaves
//! nothing behind, nor does one whose acquisition was under way when it shut down; a paused
//! node cannot hold the shutdown past its deadline, and is named; auto-extended locks are
//! released, no new lock is taken, an acquisition under way is taken back and a waiting
//! call stops waiting.

use crate::common;

use std::time::{Duration, Instant};

use redlock::{ErrorKind, NodeOutcome, Redlock, Retry, WriterPriority};
use redlock_testkit::FaultyCluster;

/// The child's nodes, set only in the child process.
const CHILD_NODES: &str = "REDLOCK_TEST_SHUTDOWN_CHILD_NODES";
const CHILD_KEY: &str = "child:dropped";

/// The child process's `main`: takes a 30 s lock, drops it without `release()`, shuts
/// down and exits at once, as `main` returning would. Run by the test below.
#[test]
#[ignore = "the child process of a_process_that_drops_a_lock_and_shuts_down_leaves_no_key"]
fn child_drops_a_lock_shuts_down_and_exits() {
    let Ok(nodes) = std::env::var(CHILD_NODES) else { return };
    let runtime = tokio::runtime::Builder::new_multi_thread().enable_all().build().unwrap();
    let code = runtime.block_on(async {
        let rl = Redlock::builder().nodes(nodes.split(',')).build().unwrap();
        let lock = rl.lock(CHILD_KEY).ttl(Duration::from_secs(30)).await.unwrap();
        drop(lock);
        match rl.shutdown(Duration::from_secs(5)).await {
            Ok(_) => 0,
            Err(err) => {
                eprintln!("shutdown: {err}");
                1
            }
        }
    });
    std::process::exit(code);
}

#[test]
fn a_process_that_drops_a_lock_and_shuts_down_leaves_no_key() {
    let cluster = common::cluster(3);
    for _ in 0..3 {
        let output = std::process::Command::new(std::env::current_exe().unwrap())
            .args([
                "shutdown::child_drops_a_lock_shuts_down_and_exits",
                "--exact",
                "--ignored",
                "--nocapture",
            ])
            .env(CHILD_NODES, cluster.urls().join(","))
            .output()
            .unwrap();
        let stderr = String::from_utf8_lossy(&output.stderr);
        assert!(output.status.success(), "the child failed: {stderr}");
        // A child whose name no longer matches runs nothing and exits 0 (the child exits itself,
        // before the summary).
        let stdout = String::from_utf8_lossy(&output.stdout);
        assert!(stdout.contains("running 1 test"), "the child ran no test: {stdout}");
        // The child exited; nothing of it runs any more: the key is gone everywhere.
        assert_eq!(cluster.nodes_with_key(CHILD_KEY).unwrap(), Vec::<usize>::new(), "{stderr}");
    }
}

const RACED_KEY: &str = "child:raced";

/// The child process's `main`: starts a single attempt on nodes 60 ms away each way, shuts
/// down 30 ms later, and exits as soon as the shutdown returns. Run by the test below.
#[test]
#[ignore = "the child process of a_process_that_shuts_down_during_an_acquisition_leaves_no_key"]
fn child_shuts_down_during_an_acquisition_and_exits() {
    let Ok(nodes) = std::env::var(CHILD_NODES) else { return };
    let runtime = tokio::runtime::Builder::new_multi_thread().enable_all().build().unwrap();
    let code = runtime.block_on(async {
        let rl = common::builder_for(nodes.split(',').map(String::from).collect(), SLOW)
            .build()
            .unwrap();
        common::connect_all(&rl).await;
        let attempt = tokio::spawn({
            let rl = rl.clone();
            async move { rl.try_lock(RACED_KEY).await.map(drop) }
        });
        tokio::time::sleep(Duration::from_millis(30)).await;
        let code = match rl.shutdown(Duration::from_secs(5)).await {
            Ok(_) => 0,
            Err(err) => {
                eprintln!("shutdown: {err}");
                1
            }
        };
        // Whatever the attempt still had to do dies with the process.
        drop(attempt);
        code
    });
    std::process::exit(code);
}

/// A node timeout far above the 120 ms round trips of the slowed nodes.
const SLOW: Duration = Duration::from_secs(2);

/// A process shuts down while its single attempt is under way (3 nodes, 60 ms each way)
/// and exits right after: the shutdown waited for the attempt, so whether it would have
/// been granted or was refused (its clean-up still under way), nothing of it stays.
#[test]
fn a_process_that_shuts_down_during_an_acquisition_leaves_no_key() {
    // Refused: another owner holds the key on nodes 0 and 1.
    for mode in ["refused", "granted"] {
        let faulty = FaultyCluster::start(3).unwrap();
        let cluster = faulty.cluster();
        if mode == "refused" {
            for i in [0, 1] {
                common::run(cluster, i, &["SET", RACED_KEY, "other", "PX", "30000"]);
            }
        }
        for i in 0..3 {
            faulty.proxy(i).set_fault(common::latency(60));
        }
        let output = std::process::Command::new(std::env::current_exe().unwrap())
            .args([
                "shutdown::child_shuts_down_during_an_acquisition_and_exits",
                "--exact",
                "--ignored",
                "--nocapture",
            ])
            .env(CHILD_NODES, faulty.urls().join(","))
            .output()
            .unwrap();
        let stderr = String::from_utf8_lossy(&output.stderr);
        assert!(output.status.success(), "{mode}: the child failed: {stderr}");
        let stdout = String::from_utf8_lossy(&output.stdout);
        assert!(stdout.contains("running 1 test"), "{mode}: the child ran no test: {stdout}");
        // Anything the child sent has landed by now.
        std::thread::sleep(Duration::from_millis(500));
        let expected: Vec<usize> = if mode == "refused" { vec![0, 1] } else { vec![] };
        assert_eq!(cluster.nodes_with_key(RACED_KEY).unwrap(), expected, "{mode}: {stderr}");
        assert_eq!(cluster.nodes_holding(RACED_KEY, "other"), expected, "{mode}");
    }
}

/// Shutdown begins while an acquisition is under way (3 nodes, 60 ms each way), during its
/// round or during the fencing round after its grant: it returns once the attempt is over,
/// the attempt answers `Shutdown`, and nothing of it is left on any node.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn an_acquisition_under_way_at_shutdown_is_taken_back_before_shutdown_returns() {
    for (fenced, after) in [(false, 30), (true, 30), (true, 180)] {
        let case = format!("fenced {fenced}, shutdown after {after} ms");
        let faulty = FaultyCluster::start(3).unwrap();
        let rl = common::builder_for(faulty.urls(), SLOW).build().unwrap();
        common::connect_all(&rl).await;
        for i in 0..3 {
            faulty.proxy(i).set_fault(common::latency(60));
        }
        let attempt = tokio::spawn({
            let rl = rl.clone();
            async move {
                let request = rl.try_lock("k");
                if fenced { request.fenced().await } else { request.await }
            }
        });
        tokio::time::sleep(Duration::from_millis(after)).await;
        rl.shutdown(Duration::from_secs(5)).await.unwrap();
        let left = faulty.cluster().nodes_with_key("k").unwrap();
        assert_eq!(left, Vec::<usize>::new(), "{case}: left when the shutdown returned");
        let answer = tokio::time::timeout(Duration::from_secs(2), attempt).await.unwrap().unwrap();
        assert_eq!(answer.unwrap_err().kind(), ErrorKind::Shutdown, "{case}");
        // Nothing of it lands later either.
        tokio::time::sleep(Duration::from_millis(300)).await;
        assert_eq!(faulty.cluster().nodes_with_key("k").unwrap(), Vec::<usize>::new(), "{case}");
    }
}

/// A `lock()` waiting out a long pause when the client shuts down stops waiting: it answers
/// `Shutdown` while the shutdown runs, and a waiting writer's intent is withdrawn from every
/// node by the time the shutdown returns.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_waiting_lock_answers_shutdown_at_once_and_withdraws_its_intent() {
    let cluster = common::cluster(3);
    let holder = common::client(&cluster);
    let rl = common::builder(&cluster, Duration::from_millis(200))
        .retry(
            Retry::new()
                .with_unbounded_attempts()
                .with_delay(Duration::from_secs(20))
                .with_max_wait(Duration::from_secs(60)),
        )
        .build()
        .unwrap();
    let plain = holder.try_lock("plain").await.unwrap();
    let read = holder.read("doc").await.unwrap();
    let waiting_lock = tokio::spawn({
        let rl = rl.clone();
        async move { rl.lock("plain").await.map(drop) }
    });
    let waiting_writer = tokio::spawn({
        let rl = rl.clone();
        async move { rl.write("doc").priority(WriterPriority::Preferred).await.map(drop) }
    });
    let intent_everywhere = || {
        let fields = cluster.hash_fields("doc").unwrap();
        fields.iter().flatten().filter(|f| f.keys().any(|k| k.starts_with("i:"))).count() == 3
    };
    assert!(common::eventually(Duration::from_secs(5), intent_everywhere).await);
    assert!(
        common::eventually(Duration::from_secs(5), || common::create_calls(cluster.node(0)) > 1)
            .await
    );

    let started = Instant::now();
    rl.shutdown(Duration::from_secs(10)).await.unwrap();
    let took = started.elapsed();
    assert!(took < Duration::from_secs(5), "the shutdown took {took:?}");
    let fields = cluster.hash_fields("doc").unwrap();
    for node in fields.iter().flatten() {
        assert!(node.keys().all(|k| !k.starts_with("i:")), "an intent stays: {fields:?}");
    }
    for waiting in [waiting_lock, waiting_writer] {
        let answer = tokio::time::timeout(Duration::from_secs(1), waiting).await.unwrap().unwrap();
        assert_eq!(answer.unwrap_err().kind(), ErrorKind::Shutdown);
    }
    plain.release().await.unwrap();
    read.release().await.unwrap();
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn with_a_node_paused_shutdown_returns_by_its_deadline_and_names_the_node() {
    let mut cluster = common::cluster(3);
    // Requests may wait for a node much longer than the shutdown will.
    let rl = common::builder(&cluster, Duration::from_secs(5)).build().unwrap();
    let lock = rl.lock("k").await.unwrap();
    // Staging: every node answered the acquisition (a round is decided by the first two
    // nodes), so what waits on the paused node 2 is the release, on an open connection.
    common::held_on(&cluster, "k", lock.token(), &[0, 1, 2]).await;
    cluster.node_mut(2).pause().unwrap();
    drop(lock);

    let started = Instant::now();
    // Released on a quorum (0 and 1): `Ok`, with node 2 in the report.
    let report = rl.shutdown(Duration::from_millis(300)).await.unwrap();
    let took = started.elapsed();
    assert!(took < Duration::from_millis(800), "{took:?}");
    let outcomes: Vec<&NodeOutcome> = report.nodes().iter().map(|node| node.outcome()).collect();
    assert_eq!(outcomes, [&NodeOutcome::Ok, &NodeOutcome::Ok, &NodeOutcome::TimedOut], "{report}");
    let paused = format!("127.0.0.1:{}/0", cluster.node(2).port());
    assert_eq!(report.nodes()[2].node(), paused);
    assert!(!report.is_clean());
    assert!(report.to_string().contains(&format!("{paused} (timed out)")), "{report}");
    assert_eq!(
        cluster.nodes_with_key("k").unwrap_or_default(),
        Vec::<usize>::new(),
        "0 and 1 clean"
    );

    // Shut down: no new locks.
    let refused = rl.try_lock("other").await.unwrap_err();
    assert_eq!(refused.kind(), ErrorKind::Shutdown, "{refused}");
    cluster.node_mut(2).resume().unwrap();
}

/// The README's `rl.shutdown(d).await?` with one node of five down: every hold was
/// released on a quorum, so it is `Ok`; the dead node is in the report, as unreachable
/// (its connection was refused), not "timed out".
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn with_a_node_dead_shutdown_is_ok_and_reports_it_unreachable() {
    let mut cluster = common::cluster(5);
    let rl = common::client(&cluster);
    common::warm(&rl).await;
    let kept = rl.lock("kept").await.unwrap();
    let dropped = rl.lock("dropped").await.unwrap();
    common::held_on(&cluster, "dropped", dropped.token(), &[0, 1, 2, 3, 4]).await;
    cluster.node_mut(4).kill().unwrap();
    drop(dropped);
    let dead = format!("127.0.0.1:{}/0", cluster.node(4).port());
    let report = rl.shutdown(Duration::from_secs(1)).await.unwrap();
    drop(kept);
    let unconfirmed: Vec<_> = report.unconfirmed().collect();
    assert_eq!(unconfirmed.len(), 1, "{report}");
    assert_eq!(unconfirmed[0].node(), dead, "{report}");
    assert!(
        matches!(unconfirmed[0].outcome(), NodeOutcome::Unreachable(_)),
        "{:?}",
        unconfirmed[0]
    );
    let text = report.to_string();
    assert!(text.contains(&format!("{dead} (unreachable")), "{text}");
    assert!(!text.contains("timed out"), "{text}");
    assert!(cluster.count_key("dropped") == 0, "the live nodes let go of it");
}

/// More nodes unconfirmed than a quorum can spare: a hold may still be held on a quorum,
/// so the shutdown fails, naming the nodes.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn shutdown_fails_when_releases_are_unconfirmed_on_too_many_nodes() {
    let mut cluster = common::cluster(3);
    let rl = common::builder(&cluster, Duration::from_secs(5)).build().unwrap();
    let lock = rl.lock("k").await.unwrap();
    common::held_on(&cluster, "k", lock.token(), &[0, 1, 2]).await;
    cluster.node_mut(1).pause().unwrap();
    cluster.node_mut(2).pause().unwrap();
    drop(lock);
    let err = rl.shutdown(Duration::from_millis(300)).await.unwrap_err();
    assert_eq!(err.kind(), ErrorKind::Shutdown, "{err}");
    assert!(err.to_string().contains("not confirmed on 2 of 3 nodes"), "{err}");
    let outcomes: Vec<&NodeOutcome> = err.nodes().iter().map(|node| node.outcome()).collect();
    assert_eq!(outcomes, [&NodeOutcome::Ok, &NodeOutcome::TimedOut, &NodeOutcome::TimedOut]);
    cluster.node_mut(1).resume().unwrap();
    cluster.node_mut(2).resume().unwrap();
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn shutdown_releases_auto_extended_locks_and_takes_no_new_ones() {
    let cluster = common::cluster(3);
    let rl = common::builder(&cluster, Duration::from_millis(200))
        .ttl(Duration::from_secs(30))
        .retry(Retry::new().with_max_attempts(3))
        .build()
        .unwrap();
    let auto = rl.lock("auto").await.unwrap().auto_extend();
    let lease_holder = rl.clone();
    let in_with_lock = tokio::spawn(async move {
        lease_holder.with_lock("with", |lease| async move { lease.lost().await.kind() }).await
    });
    assert!(common::eventually(Duration::from_secs(5), || cluster.count_key("with") == 3).await);

    rl.clone().shutdown(Duration::from_secs(5)).await.unwrap();
    common::gone_everywhere(&cluster, &["auto", "with"], "released by the shutdown").await;
    // The holders learn that their locks are gone.
    assert!(tokio::time::timeout(Duration::from_secs(1), auto.lost()).await.is_ok());
    let work = tokio::time::timeout(Duration::from_secs(1), in_with_lock).await.unwrap().unwrap();
    assert!(work.is_err(), "the work's output is dropped once its lock is gone: {work:?}");
    for refused in [
        rl.lock("new").await.unwrap_err(),
        rl.read("new").await.unwrap_err(),
        rl.many(&["a", "b"]).await.unwrap_err(),
    ] {
        assert_eq!(refused.kind(), ErrorKind::Shutdown, "{refused}");
    }
}

/// Shutdown stops the release notifications: the waiting call ends with `Shutdown`, and the
/// client's subscriptions are gone from every node.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn shutdown_ends_the_subscriptions_to_release_notifications() {
    let cluster = common::cluster(3);
    let holder = common::client(&cluster);
    let rl = common::builder(&cluster, Duration::from_millis(200))
        .retry(Retry::new().with_unbounded_attempts().with_max_wait(Duration::from_secs(30)))
        .build()
        .unwrap();
    let held = holder.try_lock("busy").await.unwrap();
    let waiter = tokio::spawn({
        let rl = rl.clone();
        async move { rl.lock("busy").await.map(drop) }
    });
    let subscribed = || common::subscribers(&cluster, "busy").iter().all(|&n| n >= 1);
    assert!(common::eventually(Duration::from_secs(5), subscribed).await);
    rl.shutdown(Duration::from_secs(2)).await.unwrap();
    let err = tokio::time::timeout(Duration::from_secs(2), waiter).await.unwrap().unwrap();
    assert_eq!(err.unwrap_err().kind(), ErrorKind::Shutdown);
    let unsubscribed = || {
        let pubsub_clients = cluster.nodes().iter().map(|node| {
            let mut con = node.connection().unwrap();
            let list: String =
                redis::cmd("CLIENT").arg("LIST").arg("TYPE").arg("pubsub").query(&mut con).unwrap();
            list.lines().count()
        });
        pubsub_clients.sum::<usize>() == 0
    };
    assert!(common::eventually(Duration::from_secs(2), unsubscribed).await);
    held.release().await.unwrap();
}

/// Shutdown begins while a read, write, reentrant or multi-resource acquisition is under
/// way (3 nodes, 60 ms each way), or while one whose caller gave up on it (its future
/// dropped mid-round) is being taken back: once the shutdown returns `Ok`, nothing of it
/// is on any node, and none lands later.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn every_kind_of_acquisition_under_way_or_dropped_at_shutdown_leaves_no_key() {
    for kind in ["read", "write", "reentrant", "many", "dropped", "dropped-fenced"] {
        for after in [30u64, 100] {
            let case = format!("{kind}, shutdown after {after} ms");
            let faulty = FaultyCluster::start(3).unwrap();
            let rl = common::builder_for(faulty.urls(), SLOW).build().unwrap();
            common::connect_all(&rl).await;
            for i in 0..3 {
                faulty.proxy(i).set_fault(common::latency(60));
            }
            let attempt = tokio::spawn({
                let rl = rl.clone();
                async move {
                    let answer: Option<ErrorKind> = match kind {
                        "read" => rl.read("k").await.err().map(|e| e.kind()),
                        "write" => rl.write("k").await.err().map(|e| e.kind()),
                        "reentrant" => rl.reentrant("k", "owner a").await.err().map(|e| e.kind()),
                        "many" => rl.many(&["k", "k2"]).await.err().map(|e| e.kind()),
                        "dropped" => {
                            let cut = Duration::from_millis(after / 2);
                            let _ =
                                tokio::time::timeout(cut, async { rl.try_lock("k").await }).await;
                            Some(ErrorKind::Shutdown)
                        }
                        _ => {
                            let cut = Duration::from_millis(after / 2 + 120);
                            let _ = tokio::time::timeout(cut, async {
                                rl.try_lock("k").fenced().await
                            })
                            .await;
                            Some(ErrorKind::Shutdown)
                        }
                    };
                    answer
                }
            });
            tokio::time::sleep(Duration::from_millis(after)).await;
            rl.shutdown(Duration::from_secs(5)).await.unwrap();
            for key in ["k", "k2"] {
                let left = faulty.cluster().nodes_with_key(key).unwrap();
                assert_eq!(left, Vec::<usize>::new(), "{case}: {key} left when shutdown returned");
            }
            let answer =
                tokio::time::timeout(Duration::from_secs(2), attempt).await.unwrap().unwrap();
            assert_eq!(answer, Some(ErrorKind::Shutdown), "{case}");
            tokio::time::sleep(Duration::from_millis(300)).await;
            for key in ["k", "k2"] {
                let left = faulty.cluster().nodes_with_key(key).unwrap();
                assert_eq!(left, Vec::<usize>::new(), "{case}: {key} landed later");
            }
        }
    }
}

/// Shutdown while an auto-extended lock and a `with_lock` run: both leases end, the keys
/// are released before `shutdown` returns, `with_lock` does not return `Ok`, and new
/// acquisitions are refused as `Shutdown`.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn shutdown_ends_every_lease_and_releases_before_returning() {
    let cluster = common::cluster(3);
    let rl = common::retrying(cluster.urls(), Duration::from_millis(200), Retry::never());
    let auto = rl.try_lock("a").ttl(Duration::from_millis(600)).await.unwrap().auto_extend();
    let lease = auto.lease();
    let work = tokio::spawn({
        let rl = rl.clone();
        async move {
            rl.with_lock(rl.write("w").ttl(Duration::from_millis(600)), |lease| async move {
                let _ = lease.lost().await;
                tokio::time::sleep(Duration::from_millis(50)).await;
            })
            .await
        }
    });
    tokio::time::sleep(Duration::from_millis(900)).await;
    assert!(lease.is_valid());
    rl.shutdown(Duration::from_secs(2)).await.unwrap();
    assert!(lease.is_lost());
    common::gone_everywhere(&cluster, &["a", "w"], "released by the shutdown").await;
    let res = tokio::time::timeout(Duration::from_secs(2), work).await.unwrap().unwrap();
    assert!(res.is_err(), "with_lock must not report a hold across the shutdown");
    assert_eq!(rl.try_lock("b").await.unwrap_err().kind(), ErrorKind::Shutdown);
    drop(auto);
}

/// A dropped lock's release refused by two of three nodes (their ACL no longer allows the
/// scripts) answers before its round is decided, while the shutdown waits: those refusals
/// count, and the shutdown fails, naming them, instead of saying every release was clean.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_release_refused_on_too_many_nodes_during_the_shutdown_fails_it() {
    let faulty = FaultyCluster::start(3).unwrap();
    let rl = common::builder_for(faulty.urls(), Duration::from_secs(2)).build().unwrap();
    common::warm(&rl).await;
    let lock = rl.try_lock("refused").await.unwrap();
    common::held_on(faulty.cluster(), "refused", lock.token(), &[0, 1, 2]).await;
    for i in [1, 2] {
        // The release's script, and its native form where the server has one (Valkey 9).
        let node = faulty.cluster().node(i);
        let refuse = ["ACL", "SETUSER", "default", "-evalsha", "-eval"];
        if node.command(&[&refuse[..], &["-delifeq"]].concat()).is_err() {
            node.command(&refuse).unwrap();
        }
    }
    for i in 0..3 {
        faulty.proxy(i).set_fault(common::latency(200));
    }
    drop(lock);
    let err = rl.shutdown(Duration::from_secs(2)).await.unwrap_err();
    assert_eq!(err.kind(), ErrorKind::Shutdown, "{err}");
    assert!(err.to_string().contains("not confirmed on 2 of 3 nodes"), "{err}");
    for i in [1, 2] {
        assert!(matches!(err.nodes()[i].outcome(), NodeOutcome::Denied(_)), "{err}");
    }
}
