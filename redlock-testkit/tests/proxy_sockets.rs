//! A proxy closes the sockets of connections that ended: a long fuzz run opens thousands.

use std::io::Write;
use std::net::TcpStream;
use std::time::{Duration, Instant};

use redlock_testkit::{Proxy, RedisNode};

fn open_descriptors() -> usize {
    std::fs::read_dir("/proc/self/fd").map_or(0, Iterator::count)
}

#[test]
fn ended_connections_release_their_sockets() {
    let node = RedisNode::start().unwrap();
    let proxy = Proxy::start(node.port()).unwrap();
    let before = open_descriptors();
    for _ in 0..40 {
        let mut stream = TcpStream::connect(("127.0.0.1", proxy.port())).unwrap();
        stream.write_all(b"PING\r\n").unwrap();
        drop(stream);
    }
    let deadline = Instant::now() + Duration::from_secs(3);
    while open_descriptors() > before + 4 && Instant::now() < deadline {
        std::thread::sleep(Duration::from_millis(20));
    }
    assert!(
        open_descriptors() <= before + 4,
        "{} descriptors open after 40 connections ended ({before} before)",
        open_descriptors()
    );
}
