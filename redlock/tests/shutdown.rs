//! `Redlock::shutdown`: a process that drops a lock and exits right after a shutdown leaves
//! nothing behind; a paused node cannot hold the shutdown past its deadline, and is named;
//! auto-extended locks are released and no new lock is taken.

mod common;

use std::time::{Duration, Instant};

use redlock::{ErrorKind, NodeOutcome, Redlock, Retry};

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
            Ok(()) => 0,
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
                "child_drops_a_lock_shuts_down_and_exits",
                "--exact",
                "--ignored",
                "--nocapture",
            ])
            .env(CHILD_NODES, cluster.urls().join(","))
            .output()
            .unwrap();
        let stderr = String::from_utf8_lossy(&output.stderr);
        assert!(output.status.success(), "the child failed: {stderr}");
        // The child exited; nothing of it runs any more: the key is gone everywhere.
        assert_eq!(cluster.nodes_with_key(CHILD_KEY).unwrap(), Vec::<usize>::new(), "{stderr}");
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn with_a_node_paused_shutdown_returns_by_its_deadline_and_names_the_node() {
    let mut cluster = common::cluster(3);
    // Requests may wait for a node much longer than the shutdown will.
    let rl = common::builder(&cluster, Duration::from_secs(5)).build().unwrap();
    let lock = rl.lock("k").await.unwrap();
    cluster.node_mut(2).pause().unwrap();
    drop(lock);

    let started = Instant::now();
    let err = rl.shutdown(Duration::from_millis(300)).await.unwrap_err();
    let took = started.elapsed();
    assert!(took < Duration::from_millis(800), "{took:?}");
    assert_eq!(err.kind(), ErrorKind::Shutdown, "{err}");
    let outcomes: Vec<&NodeOutcome> = err.nodes().iter().map(|node| node.outcome()).collect();
    assert_eq!(outcomes, [&NodeOutcome::Ok, &NodeOutcome::Ok, &NodeOutcome::TimedOut], "{err}");
    let paused = format!("127.0.0.1:{}/0", cluster.node(2).port());
    assert_eq!(err.nodes()[2].node(), paused);
    assert!(err.to_string().contains(&paused), "{err}");
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
    assert_eq!(cluster.count_key("auto"), 0);
    assert_eq!(cluster.count_key("with"), 0);
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
