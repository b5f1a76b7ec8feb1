//! Looking into nodes and clusters directly: keys, hashes, PTTLs, raw commands.

use std::time::{Duration, Instant};

use redlock_testkit::{Cluster, RedisNode};

#[test]
fn a_node_answers_raw_commands_and_inspection_reads() {
    let node = RedisNode::start().unwrap();
    assert_eq!(node.command(&["PING"]).unwrap(), redis::Value::SimpleString("PONG".into()));
    node.command(&["HSET", "h", "b", "2", "a", "1"]).unwrap();
    node.command(&["SET", "s", "v", "PX", "60000"]).unwrap();
    let err = node.command(&["NOSUCHCOMMAND"]).unwrap_err();
    assert!(err.to_string().contains("unknown command"), "{err}");

    let fields = node.hgetall("h").unwrap();
    assert_eq!(
        fields.into_iter().collect::<Vec<_>>(),
        [("a".into(), "1".into()), ("b".into(), "2".into())]
    );
    assert!(node.hgetall("missing").unwrap().is_empty());
    assert!(node.hgetall("s").is_err(), "WRONGTYPE is an error, not an empty hash");

    assert!(node.exists("h").unwrap() && node.exists("s").unwrap());
    assert!(!node.exists("missing").unwrap());
    assert_eq!(node.keys("*").unwrap(), ["h", "s"]);
    assert_eq!(node.keys("h*").unwrap(), ["h"]);
    let pttl = node.pttl("s").unwrap();
    assert!(pttl > 50_000 && pttl <= 60_000, "{pttl}");
}

#[test]
fn a_cluster_reports_each_node_and_skips_killed_and_paused_ones() {
    let mut cluster = Cluster::start(4).unwrap();
    for i in [0, 1, 2] {
        cluster.node(i).command(&["HSET", "lock", "owner", &i.to_string()]).unwrap();
    }
    cluster.node(1).command(&["PEXPIRE", "lock", "60000"]).unwrap();
    cluster.node(3).set("other", "x").unwrap();

    assert_eq!(cluster.nodes_with_key("lock").unwrap(), [0, 1, 2]);
    let pttls = cluster.pttls("lock").unwrap();
    assert_eq!((pttls[0], pttls[2], pttls[3]), (Some(-1), Some(-1), Some(-2)));
    assert!(pttls[1].is_some_and(|ms| ms > 50_000), "{pttls:?}");
    let fields = cluster.hash_fields("lock").unwrap();
    assert_eq!(fields[2].as_ref().unwrap()["owner"], "2");
    assert_eq!(fields[3].as_ref().map(|f| f.len()), Some(0));
    assert_eq!(cluster.keys_everywhere("*").unwrap(), 4);
    assert_eq!(cluster.keys_everywhere("lo*").unwrap(), 3);
    assert!(cluster.hash_fields("other").is_err(), "node 3's WRONGTYPE is reported");

    cluster.node_mut(0).pause().unwrap();
    cluster.node_mut(2).kill().unwrap();
    let started = Instant::now();
    assert_eq!(cluster.nodes_with_key("lock").unwrap(), [1]);
    assert_eq!(cluster.pttls("lock").unwrap()[..1], [None]);
    assert_eq!(cluster.pttls("lock").unwrap()[2], None);
    let fields = cluster.hash_fields("lock").unwrap();
    assert!(fields[0].is_none() && fields[1].is_some() && fields[2].is_none());
    assert_eq!(cluster.keys_everywhere("*").unwrap(), 2);
    assert!(started.elapsed() < Duration::from_secs(1), "contacted the paused node");

    for node in cluster.nodes() {
        if node.is_running() && !node.is_paused() {
            node.flushall().unwrap();
        }
    }
    assert_eq!(cluster.keys_everywhere("*").unwrap(), 0);
}
