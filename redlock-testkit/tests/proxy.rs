//! The network-fault proxy, in front of a real redis-server.

mod common;

use std::{
    net::TcpStream,
    thread,
    time::{Duration, Instant},
};

use common::{connect, connect_and_ping, is_timeout, ping};
use redlock_testkit::{NetFault, Proxy, RedisNode};

#[test]
fn forwards_ping_and_commands() {
    let node = RedisNode::start().unwrap();
    let proxy = Proxy::start(node.port()).unwrap();
    assert_eq!(proxy.url(), format!("redis://127.0.0.1:{}", proxy.port()));
    assert_eq!(proxy.upstream_port(), node.port());
    assert_eq!(proxy.fault(), NetFault::None);
    connect_and_ping(proxy.port()).unwrap();

    // A real client, and a reply bigger than one chunk.
    let mut con = redis::Client::open(proxy.url()).unwrap().get_connection().unwrap();
    let big = "x".repeat(100_000);
    redis::cmd("SET").arg("k").arg(&big).query::<()>(&mut con).unwrap();
    assert_eq!(node.get("k").unwrap().as_deref(), Some(big.as_str()));
    let got: String = redis::cmd("GET").arg("k").query(&mut con).unwrap();
    assert_eq!(got, big);
}

#[test]
fn latency_delays_a_round_trip() {
    let node = RedisNode::start().unwrap();
    let proxy = Proxy::start(node.port()).unwrap();
    let mut stream = connect(proxy.port()).unwrap();
    stream.set_read_timeout(Some(Duration::from_secs(2))).unwrap();
    let fixed = Duration::from_millis(50);
    proxy.set_fault(NetFault::Latency { fixed, jitter: Duration::from_millis(20) });
    assert_eq!(proxy.fault(), NetFault::Latency { fixed, jitter: Duration::from_millis(20) });

    let started = Instant::now();
    ping(&mut stream).unwrap();
    let took = started.elapsed();
    // Delayed each way.
    assert!(took >= 2 * fixed, "{took:?}");
    assert!(took < fixed + Duration::from_millis(500), "{took:?}");

    proxy.heal();
    let started = Instant::now();
    ping(&mut stream).unwrap();
    assert!(started.elapsed() < fixed, "{:?}", started.elapsed());
}

#[test]
fn latency_keeps_order_and_throughput() {
    let node = RedisNode::start().unwrap();
    let proxy = Proxy::start(node.port()).unwrap();
    let mut con = redis::Client::open(proxy.url()).unwrap().get_connection().unwrap();
    let fixed = Duration::from_millis(40);
    proxy.set_fault(NetFault::Latency { fixed, jitter: Duration::from_millis(40) });
    // 50 pipelined INCRs, whose bytes go in many chunks with random delays:
    // replies come in order, and it takes a few delays, not 50.
    let mut pipe = redis::pipe();
    for _ in 0..50 {
        pipe.cmd("INCR").arg("n");
    }
    let started = Instant::now();
    let got: Vec<i64> = pipe.query(&mut con).unwrap();
    assert_eq!(got, (1..=50).collect::<Vec<_>>());
    assert!(started.elapsed() < Duration::from_millis(500), "{:?}", started.elapsed());
}

#[test]
fn a_hold_delays_matching_requests_and_what_follows_them_only() {
    let node = RedisNode::start().unwrap();
    let proxy = Proxy::start(node.port()).unwrap();
    let mut con = redis::Client::open(proxy.url()).unwrap().get_connection().unwrap();
    let hold = Duration::from_millis(300);
    proxy.hold_requests_containing(b"held-key", hold);
    let timed = |con: &mut redis::Connection, key: &str| {
        let started = Instant::now();
        redis::cmd("SET").arg(key).arg("v").query::<()>(con).unwrap();
        started.elapsed()
    };
    assert!(timed(&mut con, "other-key") < hold / 2, "a request that does not match");
    assert!(timed(&mut con, "held-key") >= hold, "a matching request");
    // A pipeline: what follows the held request on the connection waits behind it.
    let mut pipe = redis::pipe();
    pipe.cmd("SET").arg("held-key").arg("w").cmd("GET").arg("held-key");
    let started = Instant::now();
    let (_, got): ((), String) = pipe.query(&mut con).unwrap();
    assert_eq!(got, "w");
    assert!(started.elapsed() >= hold);
    proxy.release_holds();
    assert!(timed(&mut con, "held-key") < hold / 2, "released");
}

#[test]
fn blackhole_hangs_then_heal_and_reconnect_works() {
    let node = RedisNode::start().unwrap();
    let proxy = Proxy::start(node.port()).unwrap();
    let mut lost = connect(proxy.port()).unwrap();
    let mut idle = connect(proxy.port()).unwrap();
    ping(&mut lost).unwrap();
    ping(&mut idle).unwrap();

    proxy.set_fault(NetFault::Blackhole);
    let err = ping(&mut lost).unwrap_err();
    assert!(is_timeout(&err), "{err}");
    // New connections are accepted, and hang too.
    let mut opened_during = connect(proxy.port()).unwrap();
    let err = ping(&mut opened_during).unwrap_err();
    assert!(is_timeout(&err), "{err}");

    proxy.heal();
    // The PING sent during the blackhole was lost, not delivered late: the
    // connections that lost bytes are closed, so clients reconnect.
    assert!(ping(&mut lost).is_err());
    assert!(ping(&mut opened_during).is_err());
    // A connection that sent nothing meanwhile goes on working.
    ping(&mut idle).unwrap();
    connect_and_ping(proxy.port()).unwrap();
}

#[test]
fn reset_closes_existing_and_new_connections_until_healed() {
    let node = RedisNode::start().unwrap();
    let proxy = Proxy::start(node.port()).unwrap();
    let mut existing = connect(proxy.port()).unwrap();
    ping(&mut existing).unwrap();

    proxy.set_fault(NetFault::Reset);
    let err = ping(&mut existing).unwrap_err();
    assert!(!is_timeout(&err), "closed, not hung: {err}");
    let started = Instant::now();
    let err = connect_and_ping(proxy.port()).unwrap_err();
    assert!(!is_timeout(&err), "closed, not hung: {err}");
    assert!(started.elapsed() < Duration::from_millis(100));
    assert_eq!(proxy.connections(), 0);

    proxy.heal();
    connect_and_ping(proxy.port()).unwrap();
    assert!(ping(&mut existing).is_err(), "a reset connection stays closed");
}

#[test]
fn node_down_closes_connections() {
    let mut node = RedisNode::start().unwrap();
    let proxy = Proxy::start(node.port()).unwrap();
    let mut stream = connect(proxy.port()).unwrap();
    ping(&mut stream).unwrap();
    node.kill().unwrap();
    assert!(!is_timeout(&ping(&mut stream).unwrap_err()));
    assert!(!is_timeout(&connect_and_ping(proxy.port()).unwrap_err()));
    node.start_again().unwrap();
    connect_and_ping(proxy.port()).unwrap();
}

#[test]
fn drop_closes_connections_and_the_port() {
    let node = RedisNode::start().unwrap();
    let proxy = Proxy::start(node.port()).unwrap();
    let port = proxy.port();
    let mut stream = connect(port).unwrap();
    ping(&mut stream).unwrap();
    // Also with delayed bytes in flight and a connection parked by a blackhole.
    proxy.set_fault(NetFault::Latency { fixed: Duration::from_secs(5), jitter: Duration::ZERO });
    let mut delayed = connect(port).unwrap();
    std::io::Write::write_all(&mut delayed, b"PING\r\n").unwrap();
    thread::sleep(Duration::from_millis(20));
    proxy.set_fault(NetFault::Blackhole);
    let _parked = connect(port).unwrap();

    let started = Instant::now();
    drop(proxy);
    assert!(started.elapsed() < Duration::from_millis(500), "{:?}", started.elapsed());
    assert!(!is_timeout(&ping(&mut stream).unwrap_err()));
    assert!(TcpStream::connect(("127.0.0.1", port)).is_err());
    // The node itself is fine.
    node.set("k", "v").unwrap();
}

#[test]
fn works_while_a_current_thread_runtime_is_blocked() {
    let node = RedisNode::start().unwrap();
    let proxy = Proxy::start(node.port()).unwrap();
    let rt = tokio::runtime::Builder::new_current_thread().build().unwrap();
    // The runtime's only thread is blocked in a sync call through the proxy.
    rt.block_on(async { connect_and_ping(proxy.port()) }).unwrap();
}
