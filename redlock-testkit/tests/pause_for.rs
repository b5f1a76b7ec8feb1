//! Nodes paused for a while and resumed by a thread: slow, not dead.

use std::time::{Duration, Instant};

use redlock_testkit::{Cluster, RedisNode};

const PAUSE: Duration = Duration::from_millis(300);

#[test]
fn a_request_sent_during_the_pause_is_answered_after_it() {
    let mut node = RedisNode::start().unwrap();
    let mut con = node.connection().unwrap();
    let started = Instant::now();
    let wakeup = node.pause_for(PAUSE).unwrap();
    assert!(node.is_paused());
    // Sent while paused, answered once the thread resumed the node.
    let () = redis::cmd("SET").arg("k").arg("v").query(&mut con).unwrap();
    assert!(started.elapsed() >= PAUSE, "{:?}", started.elapsed());
    wakeup.join().unwrap();
    assert!(!node.is_paused() && node.is_running());
    assert_eq!(node.get("k").unwrap().as_deref(), Some("v"));
}

#[test]
fn the_bookkeeping_follows_the_wake_up_without_join() {
    let mut node = RedisNode::start().unwrap();
    let wakeup = node.pause_for(Duration::from_millis(50)).unwrap();
    assert!(!wakeup.is_finished());
    let deadline = Instant::now() + Duration::from_secs(3);
    while node.is_paused() && Instant::now() < deadline {
        std::thread::sleep(Duration::from_millis(5));
    }
    assert!(!node.is_paused());
    assert!(
        wakeup.is_finished() || {
            wakeup.join().unwrap();
            true
        }
    );
    node.set("k", "v").unwrap();
}

#[test]
fn a_manual_resume_or_kill_takes_over_and_the_wake_up_does_nothing() {
    let mut node = RedisNode::start().unwrap();
    let long = Duration::from_secs(30);
    let wakeup = node.pause_for(long).unwrap();
    node.resume().unwrap();
    let started = Instant::now();
    wakeup.join().unwrap(); // returns at once, not after 30 s
    assert!(started.elapsed() < Duration::from_secs(1), "{:?}", started.elapsed());

    // A node paused again by hand stays paused: the old wake-up is gone.
    let wakeup = node.pause_for(Duration::from_millis(20)).unwrap();
    node.pause().unwrap();
    wakeup.join().unwrap();
    assert!(node.is_paused());
    node.resume().unwrap();

    let wakeup = node.pause_for(long).unwrap();
    node.kill().unwrap();
    wakeup.join().unwrap();
    node.start_again().unwrap();
    assert!(!node.is_paused());
    node.set("k", "v").unwrap();
}

#[test]
fn dropping_the_node_ends_a_pending_wake_up() {
    let mut node = RedisNode::start().unwrap();
    let wakeup = node.pause_for(Duration::from_secs(30)).unwrap();
    let started = Instant::now();
    drop(node);
    wakeup.join().unwrap();
    assert!(started.elapsed() < Duration::from_secs(2), "{:?}", started.elapsed());
}

#[test]
fn a_cluster_pauses_some_nodes_and_wakes_them_together() {
    let mut cluster = Cluster::start(3).unwrap();
    let wakeup = cluster.pause_for(&[0, 2], PAUSE).unwrap();
    assert_eq!(
        cluster.nodes().iter().map(RedisNode::is_paused).collect::<Vec<_>>(),
        [true, false, true]
    );
    cluster.node(1).set("k", "v").unwrap();
    wakeup.join().unwrap();
    assert!(cluster.nodes().iter().all(|node| !node.is_paused()));
    assert_eq!(cluster.nodes_with_key("k").unwrap(), [1]);
}

#[test]
fn pausing_a_killed_node_fails() {
    let mut node = RedisNode::start().unwrap();
    node.kill().unwrap();
    assert!(node.pause_for(PAUSE).is_err());
}
