//! The fuzzing fault: random delays that keep each direction's order, dropped replies
//! after the node ran the command, reset requests that never ran, replayed by seed.

mod common;

use std::{
    io::{Read, Write},
    thread,
    time::Duration,
};

use common::{connect, connect_and_ping, is_timeout, ping};
use redlock_testkit::{Fault, FaultyCluster, Fuzz, NetFault, NodeConfig, Proxy, RedisNode};

fn node_and_proxy(fuzz: Fuzz) -> (RedisNode, Proxy) {
    let node = RedisNode::start().unwrap();
    let proxy = Proxy::start(node.port()).unwrap();
    proxy.set_fault(NetFault::Fuzz(fuzz));
    assert_eq!(proxy.fault(), NetFault::Fuzz(fuzz));
    (node, proxy)
}

/// Sends `command` on a fresh raw connection through `proxy` and reads one reply line.
/// Raw RESP rather than a client: a client sends commands of its own when it connects
/// (e.g. `CLIENT SETINFO`), whose replies the fuzz would drop instead.
fn send(proxy: &Proxy, command: &str) -> std::io::Result<String> {
    let mut stream = connect(proxy.port())?;
    stream.set_read_timeout(Some(Duration::from_secs(2)))?;
    stream.write_all(command.as_bytes())?;
    let mut reply = Vec::new();
    let mut buf = [0; 64];
    while !reply.ends_with(b"\r\n") {
        match stream.read(&mut buf)? {
            0 => return Err(std::io::ErrorKind::UnexpectedEof.into()),
            n => reply.extend_from_slice(&buf[..n]),
        }
    }
    Ok(String::from_utf8_lossy(&reply).into_owned())
}

#[test]
fn a_dropped_reply_leaves_the_command_run_on_the_node_and_a_blind_retry_runs_it_again() {
    let fuzz = Fuzz::new(1).with_max_delay(Duration::from_millis(10)).with_drop_reply(1.0);
    let (node, proxy) = node_and_proxy(fuzz);

    let err = send(&proxy, "SET k v\r\n").unwrap_err();
    assert!(!is_timeout(&err), "the connection dropped, it did not hang: {err}");
    assert_eq!(node.get("k").unwrap().as_deref(), Some("v"), "the SET ran on the node");

    // A client that re-sends on a new connection after each such failure: the
    // non-idempotent INCR is applied once per attempt, though none got a reply.
    for _ in 0..3 {
        assert!(send(&proxy, "INCR n\r\n").is_err());
    }
    assert_eq!(node.get("n").unwrap().as_deref(), Some("3"));

    proxy.heal();
    assert_eq!(send(&proxy, "INCR n\r\n").unwrap(), ":4\r\n");
}

#[test]
fn a_reset_request_never_reaches_the_node() {
    let fuzz = Fuzz::new(2).with_reset_request(1.0);
    let (node, proxy) = node_and_proxy(fuzz);
    let err = send(&proxy, "SET k v\r\n").unwrap_err();
    assert!(!is_timeout(&err), "{err}");
    assert!(!node.exists("k").unwrap(), "the SET never ran");
}

#[test]
fn random_delays_keep_the_order_of_pipelined_commands() {
    let base = Fuzz::seed_from_env_or_random();
    let (node, proxy) = node_and_proxy(Fuzz::new(base));
    for round in 0..8 {
        let fuzz = Fuzz::new(base).derive(round).with_max_delay(Duration::from_millis(40));
        proxy.set_fault(NetFault::Fuzz(fuzz));
        let mut stream = connect(proxy.port()).unwrap();
        stream.set_read_timeout(Some(Duration::from_secs(2))).unwrap();
        // Separate writes, so separate chunks, each with its own random delay: the
        // second often draws a shorter one, and must still not overtake the first.
        for command in ["SET k first\r\n", "SET k second\r\n", "GET k\r\n"] {
            stream.write_all(command.as_bytes()).unwrap();
            thread::sleep(Duration::from_millis(3));
        }
        let expected = b"+OK\r\n+OK\r\n$6\r\nsecond\r\n";
        let mut replies = vec![0; expected.len()];
        stream.read_exact(&mut replies).unwrap_or_else(|e| panic!("seed {base}: {e}"));
        assert_eq!(
            String::from_utf8_lossy(&replies),
            String::from_utf8_lossy(expected),
            "seed {base}, round {round} (replay with REDLOCK_FUZZ_SEED={base})"
        );
        assert_eq!(node.get("k").unwrap().as_deref(), Some("second"), "seed {base}");
    }
}

/// For each of 8 connections opened one after the other: how many PINGs it answered
/// (of at most 6) before the fuzz closed it.
fn answered_pings(seed: u64) -> Vec<usize> {
    let fuzz = Fuzz::new(seed).with_drop_reply(0.2).with_reset_request(0.2);
    let (_node, proxy) = node_and_proxy(fuzz);
    (0..8)
        .map(|_| {
            let mut stream = connect(proxy.port()).unwrap();
            stream.set_read_timeout(Some(Duration::from_secs(2))).unwrap();
            (0..6)
                .take_while(|_| match ping(&mut stream) {
                    Ok(()) => true,
                    Err(e) => {
                        assert!(!is_timeout(&e), "seed {seed}: closed, not hung");
                        false
                    }
                })
                .count()
        })
        .collect()
}

#[test]
fn a_seed_replays_the_same_schedule() {
    let base = Fuzz::seed_from_env_or_random();
    let first = answered_pings(base);
    assert_eq!(answered_pings(base), first, "seed {base}");
    // The schedule does depend on the seed: some of a few other seeds differ.
    let others: Vec<_> = (1..4).map(|k| answered_pings(base.wrapping_add(k))).collect();
    assert!(others.iter().any(|o| *o != first), "seed {base}: {first:?} {others:?}");
}

#[test]
fn each_client_has_its_own_proxies_and_faults() {
    let mut cluster = FaultyCluster::start_for_clients(3, 2, NodeConfig::new()).unwrap();
    assert_eq!(cluster.clients(), 2);
    assert_eq!(cluster.urls(), cluster.urls_for(0));
    assert!(cluster.urls_for(0).iter().all(|url| !cluster.urls_for(1).contains(url)));

    cluster.fuzz_client(0, Fuzz::new(3).with_drop_reply(1.0));
    for node in 0..3 {
        assert!(connect_and_ping(cluster.client_proxy(0, node).port()).is_err());
        connect_and_ping(cluster.client_proxy(1, node).port()).unwrap();
    }
    // Each node's proxy got its own seed, derived from the one given.
    let seeds: Vec<_> = (0..3)
        .map(|node| match cluster.client_proxy(0, node).fault() {
            NetFault::Fuzz(fuzz) => fuzz.seed(),
            other => panic!("{other:?}"),
        })
        .collect();
    assert!(seeds[0] != seeds[1] && seeds[1] != seeds[2], "{seeds:?}");
    cluster.heal_client(0);
    connect_and_ping(cluster.client_proxy(0, 2).port()).unwrap();

    // A node's fault reaches every client.
    cluster.inject(Fault::Reset, &[1]).unwrap();
    for client in 0..2 {
        assert!(connect_and_ping(cluster.client_proxy(client, 1).port()).is_err());
    }
    cluster.heal_all().unwrap();
    for client in 0..2 {
        connect_and_ping(cluster.client_proxy(client, 1).port()).unwrap();
    }
}
