//! Nodes that answer with errors or nonsense count as failed nodes: no panic, a typed
//! error when the quorum fails, and the lock still works over a healthy majority.

use crate::common;

use std::io::{BufRead, BufReader, Write};
use std::net::TcpListener;
use std::time::Duration;

use redlock::{ErrorKind, NodeOutcome, Redlock, Retry};
use redlock_testkit::{Cluster, NodeConfig};

fn failed_on(err: &redlock::Error, i: usize, needle: &str) -> bool {
    matches!(err.nodes()[i].outcome(), NodeOutcome::Failed(why) if why.contains(needle))
}

/// Server errors from a majority: SET refused with OOM, READONLY or NOPERM.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn error_replies_count_as_failed_nodes() {
    let cluster = Cluster::start_with(3, NodeConfig::new()).unwrap();
    let primary = Cluster::start(1).unwrap();
    common::run(&cluster, 0, &["CONFIG", "SET", "maxmemory", "1"]);
    common::run(&cluster, 1, &["REPLICAOF", "127.0.0.1", &primary.node(0).port().to_string()]);
    common::run(&cluster, 2, &["ACL", "SETUSER", "default", "-set"]);
    let rl = common::client(&cluster);
    let err = rl.try_lock("k").await.unwrap_err();
    assert_eq!(err.kind(), ErrorKind::Unavailable, "{err}");
    assert!(failed_on(&err, 0, "OOM") || failed_on(&err, 1, "READONLY"), "{err:?}");
    let described = format!("{err:?}");
    assert!(
        described.contains("OOM") || described.contains("READONLY") || described.contains("NOPERM")
    );
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_node_refusing_the_locks_commands_grants_nothing_and_the_others_still_lock() {
    let cluster = common::cluster(3);
    common::run(&cluster, 0, &["ACL", "SETUSER", "default", "-evalsha", "-eval", "-set"]);
    let rl = common::client(&cluster);
    let mut lock = rl.try_lock("k").await.unwrap();
    // The native acquisition is refused there, and so is the script it falls back to: the
    // refusing node never had the key.
    assert_eq!(cluster.count_key("k"), 2);
    assert!(cluster.node(0).get("k").unwrap().is_none());
    lock.extend(Duration::from_secs(5)).await.unwrap();
    lock.release().await.unwrap();
    assert!(common::eventually(Duration::from_secs(1), || cluster.count_key("k") == 0).await);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn an_oom_minority_still_grants() {
    let cluster = common::cluster(5);
    common::run(&cluster, 2, &["CONFIG", "SET", "maxmemory", "1"]);
    let rl = common::client(&cluster);
    let lock = rl.try_lock("k").await.unwrap();
    lock.release().await.unwrap();
}

/// A fake node that speaks just enough RESP to be connected to, and answers every command
/// with `reply`.
fn fake_node(reply: &'static [u8]) -> String {
    let listener = TcpListener::bind("127.0.0.1:0").unwrap();
    let port = listener.local_addr().unwrap().port();
    std::thread::spawn(move || {
        for stream in listener.incoming() {
            let Ok(stream) = stream else { return };
            std::thread::spawn(move || {
                let mut writer = stream.try_clone().unwrap();
                let mut lines = BufReader::new(stream);
                let mut line = String::new();
                // Each command is an array header, then a length line and a data line per arg.
                loop {
                    line.clear();
                    if lines.read_line(&mut line).unwrap_or(0) == 0 {
                        return;
                    }
                    let Some(count) = line.trim().strip_prefix('*') else { continue };
                    let count: usize = count.parse().unwrap_or(0);
                    for _ in 0..count * 2 {
                        line.clear();
                        if lines.read_line(&mut line).unwrap_or(0) == 0 {
                            return;
                        }
                    }
                    if writer.write_all(reply).is_err() {
                        return;
                    }
                }
            });
        }
    });
    format!("redis://127.0.0.1:{port}")
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn unexpected_reply_types_count_as_failed_nodes() {
    let cluster = common::cluster(2);
    let weird = fake_node(b":42\r\n");
    let rl = Redlock::builder()
        .nodes(cluster.urls())
        .nodes([weird.clone()])
        .node_timeout(Duration::from_millis(300))
        .retry(Retry::never())
        .build()
        .unwrap();
    // Two healthy nodes of three are a quorum; the weird one is reported, not fatal.
    let lock = rl.try_lock("k").await.unwrap();
    lock.release().await.unwrap();

    let rl = Redlock::builder()
        .nodes(cluster.urls()[..1].iter().cloned())
        .nodes([weird, fake_node(b"+WHATEVER\r\n")])
        .node_timeout(Duration::from_millis(300))
        .retry(Retry::never())
        .build()
        .unwrap();
    let err = rl.try_lock("k").await.unwrap_err();
    assert_eq!(err.kind(), ErrorKind::Unavailable, "{err}");
    assert!(
        failed_on(&err, 1, "unexpected reply") || failed_on(&err, 2, "unexpected reply"),
        "{err}"
    );
    assert!(common::eventually(Duration::from_secs(1), || cluster.count_key("k") == 0).await);
}

/// A port where an HTTP server answers: one line saying it is not a Redis server, not a
/// multi-line parse error.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_port_that_answers_http_is_named_not_a_redis_server() {
    let http = fake_node(b"HTTP/1.1 400 Bad Request\r\nContent-Length: 0\r\n\r\n");
    let rl = Redlock::builder()
        .nodes([http.clone(), http.replace("127.0.0.1", "localhost")])
        .node_timeout(Duration::from_millis(300))
        .retry(Retry::never())
        .build()
        .unwrap();
    let err = rl.try_lock("k").await.unwrap_err();
    let text = err.to_string();
    eprintln!("{text}");
    assert!(text.contains("not a Redis server"), "{text}");
    assert!(!text.contains('\n'), "{text}");
}
