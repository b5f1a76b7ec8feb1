//! Against real redis-server processes.

use std::time::{Duration, Instant};

use nix::{errno::Errno, sys::signal, unistd::Pid};
use redlock_testkit::{Cluster, NodeConfig, Persistence, RedisNode};

#[test]
fn start_url_get_set() {
    let node = RedisNode::start().unwrap();
    assert_eq!(node.url(), format!("redis://127.0.0.1:{}", node.port()));
    assert!(node.is_running());
    assert!(!node.is_paused());
    assert_eq!(node.get("k").unwrap(), None);
    node.set("k", "v").unwrap();
    assert_eq!(node.get("k").unwrap().as_deref(), Some("v"));
    assert_eq!(node.pttl("k").unwrap(), -1);
    node.flushall().unwrap();
    assert_eq!(node.pttl("k").unwrap(), -2);
    assert!(node.log().contains("Ready to accept connections"));
}

#[test]
fn kill_makes_connections_fail() {
    let mut node = RedisNode::start().unwrap();
    node.kill().unwrap();
    assert!(!node.is_running());
    assert_eq!(node.pid(), None);
    assert!(node.get("k").is_err());
    node.kill().unwrap(); // idempotent
}

#[test]
fn restart_without_persistence_comes_back_empty_on_same_port() {
    let mut node = RedisNode::start().unwrap();
    let (port, pid) = (node.port(), node.pid());
    node.set("k", "v").unwrap();
    node.restart().unwrap();
    assert_eq!(node.port(), port);
    assert_ne!(node.pid(), pid);
    assert_eq!(node.get("k").unwrap(), None);

    node.kill().unwrap();
    node.start_again().unwrap();
    assert!(node.is_running());
    node.set("k2", "v2").unwrap();
}

#[test]
fn restart_with_aof_keeps_keys() {
    let mut node =
        RedisNode::start_with(NodeConfig::new().persistence(Persistence::AppendFsyncAlways))
            .unwrap();
    node.set("k", "v").unwrap();
    node.restart().unwrap();
    assert_eq!(node.get("k").unwrap().as_deref(), Some("v"));
}

#[test]
fn pause_hangs_and_resume_answers() {
    let mut node = RedisNode::start().unwrap();
    let mut con = node.connection().unwrap();
    con.set_read_timeout(Some(Duration::from_millis(200))).unwrap();
    node.pause().unwrap();
    assert!(node.is_paused() && node.is_running());
    let started = Instant::now();
    let err = redis::cmd("PING").query::<String>(&mut con).unwrap_err();
    assert!(err.is_timeout(), "{err}");
    assert!(started.elapsed() < Duration::from_secs(1));

    node.resume().unwrap();
    assert!(!node.is_paused());
    // The timed-out connection may be out of sync; a new one must answer.
    assert_eq!(node.get("k").unwrap(), None);
}

#[test]
fn drop_kills_the_process() {
    let mut node = RedisNode::start().unwrap();
    let pid = Pid::from_raw(node.pid().unwrap() as i32);
    node.pause().unwrap(); // dropping a paused node works too
    drop(node);
    assert_eq!(signal::kill(pid, None), Err(Errno::ESRCH));
}

#[test]
fn extra_args_reach_the_command_line() {
    let node =
        RedisNode::start_with(NodeConfig::new().extra_arg("--maxmemory").extra_arg("1mb")).unwrap();
    let mut con = node.connection().unwrap();
    let got: Vec<String> =
        redis::cmd("CONFIG").arg("GET").arg("maxmemory").query(&mut con).unwrap();
    assert_eq!(got, ["maxmemory", "1048576"]);
}

#[test]
fn fixed_port_is_used() {
    let free = std::net::TcpListener::bind("127.0.0.1:0").unwrap().local_addr().unwrap().port();
    let node = RedisNode::start_with(NodeConfig::new().port(free)).unwrap();
    assert_eq!(node.port(), free);
    node.set("k", "v").unwrap();
}

#[test]
fn bad_args_give_not_ready_with_log() {
    let err = RedisNode::start_with(NodeConfig::new().extra_arg("--no-such-option")).unwrap_err();
    let msg = err.to_string();
    assert!(msg.contains("did not answer PING"), "{msg}");
    assert!(msg.contains("no-such-option"), "the log is in the message: {msg}");
}

#[test]
fn taken_fixed_port_reports_address_in_use() {
    let taken = RedisNode::start().unwrap();
    let err = RedisNode::start_with(NodeConfig::new().port(taken.port())).unwrap_err();
    let msg = err.to_string();
    assert!(msg.contains("Address already in use"), "{msg}");
    // The other server was not mistaken for ours, nor disturbed.
    taken.set("k", "v").unwrap();
}

#[test]
fn cluster_nodes_holding_skips_paused_and_killed() {
    let mut cluster = Cluster::start(3).unwrap();
    assert_eq!(cluster.len(), 3);
    let mut ports: Vec<u16> = cluster.nodes().iter().map(RedisNode::port).collect();
    ports.sort_unstable();
    ports.dedup();
    assert_eq!(ports.len(), 3);
    assert_eq!(cluster.urls().len(), 3);

    for node in cluster.nodes() {
        node.set("k", "v").unwrap();
    }
    cluster.node(2).set("k", "other").unwrap();
    assert_eq!(cluster.nodes_holding("k", "v"), vec![0, 1]);
    assert_eq!(cluster.count_key("k"), 3);

    cluster.node_mut(0).pause().unwrap();
    let started = Instant::now();
    assert_eq!(cluster.nodes_holding("k", "v"), vec![1]);
    assert_eq!(cluster.count_key("k"), 2);
    assert!(started.elapsed() < Duration::from_secs(1), "contacted the paused node");

    cluster.node_mut(1).kill().unwrap();
    assert_eq!(cluster.nodes_holding("k", "v"), Vec::<usize>::new());
    cluster.node_mut(0).resume().unwrap();
    assert_eq!(cluster.nodes_holding("k", "v"), vec![0]);
}
