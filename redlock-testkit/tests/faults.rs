//! Each [`Fault`] on one node of a [`FaultyCluster`], as a client through the proxy sees it.

mod common;

use std::time::{Duration, Instant};

use common::{connect, connect_and_ping, is_timeout, ping};
use redlock_testkit::{Fault, FaultyCluster, NodeConfig, Persistence};

const LATENCY: Duration = Duration::from_millis(60);

/// Injects `fault` into node 0, checks what a client sees through its proxy
/// and that the other nodes are untouched, then heals and checks PING again.
fn inject_observe_heal(fault: Fault) {
    let mut cluster = FaultyCluster::start(3).unwrap();
    assert_eq!(cluster.urls().len(), 3);
    let port = cluster.proxy(0).port();
    let mut existing = connect(port).unwrap();
    ping(&mut existing).unwrap();

    cluster.inject(fault, &[0]).unwrap();
    match fault {
        Fault::Kill | Fault::Reset => {
            // Closed at once, not hung.
            assert!(!is_timeout(&ping(&mut existing).unwrap_err()), "{}", fault.name());
            assert!(!is_timeout(&connect_and_ping(port).unwrap_err()), "{}", fault.name());
        }
        Fault::RestartEmpty | Fault::RestartPersisted => {
            // The old process's connections are gone; the new process answers.
            assert!(ping(&mut existing).is_err(), "{}", fault.name());
            connect_and_ping(port).unwrap();
        }
        Fault::Pause | Fault::Blackhole => {
            assert!(is_timeout(&ping(&mut existing).unwrap_err()), "{}", fault.name());
            assert!(is_timeout(&connect_and_ping(port).unwrap_err()), "{}", fault.name());
        }
        Fault::Latency { fixed, .. } => {
            let started = Instant::now();
            ping(&mut existing).unwrap();
            assert!(started.elapsed() >= 2 * fixed, "{:?}", started.elapsed());
        }
    }
    assert_eq!(cluster.cluster().node(0).is_running(), fault != Fault::Kill);
    assert_eq!(cluster.cluster().node(0).is_paused(), fault == Fault::Pause);
    assert_eq!(cluster.proxy(0).fault() != redlock_testkit::NetFault::None, fault.is_network());
    for other in 1..3 {
        connect_and_ping(cluster.proxy(other).port()).unwrap();
    }

    cluster.heal(&[0]).unwrap();
    let started = Instant::now();
    connect_and_ping(port).unwrap();
    assert!(started.elapsed() < LATENCY, "{:?}", started.elapsed());
    assert!(cluster.cluster().node(0).is_running() && !cluster.cluster().node(0).is_paused());
}

#[test]
fn kill() {
    inject_observe_heal(Fault::Kill);
}

#[test]
fn restart_empty() {
    inject_observe_heal(Fault::RestartEmpty);
}

#[test]
fn restart_persisted() {
    inject_observe_heal(Fault::RestartPersisted);
}

#[test]
fn pause() {
    inject_observe_heal(Fault::Pause);
}

#[test]
fn latency() {
    inject_observe_heal(Fault::Latency { fixed: LATENCY, jitter: Duration::from_millis(10) });
}

#[test]
fn blackhole() {
    inject_observe_heal(Fault::Blackhole);
}

#[test]
fn reset() {
    inject_observe_heal(Fault::Reset);
}

/// Sets `k` through node 0's proxy, applies `fault`, reads `k` back through it.
fn key_after(fault: Fault, persistence: Persistence) -> Option<String> {
    let mut cluster =
        FaultyCluster::start_with(3, NodeConfig::new().persistence(persistence)).unwrap();
    let client = redis::Client::open(cluster.urls()[0].as_str()).unwrap();
    redis::cmd("SET").arg("k").arg("v").query::<()>(&mut client.get_connection().unwrap()).unwrap();
    assert_eq!(cluster.cluster().nodes_holding("k", "v"), vec![0]);
    cluster.inject(fault, &[0]).unwrap();
    cluster.heal(&[0]).unwrap(); // nothing to undo for a restart
    redis::cmd("GET").arg("k").query(&mut client.get_connection().unwrap()).unwrap()
}

#[test]
fn restart_empty_loses_keys_even_when_persisted() {
    assert_eq!(key_after(Fault::RestartEmpty, Persistence::None), None);
    assert_eq!(key_after(Fault::RestartEmpty, Persistence::AppendFsyncAlways), None);
}

#[test]
fn restart_persisted_keeps_keys_with_aof_only() {
    assert_eq!(
        key_after(Fault::RestartPersisted, Persistence::AppendFsyncAlways).as_deref(),
        Some("v")
    );
    assert_eq!(key_after(Fault::RestartPersisted, Persistence::None), None);
}

#[test]
fn heal_all_undoes_mixed_faults() {
    let mut cluster = FaultyCluster::start(5).unwrap();
    cluster.inject(Fault::Kill, &[0]).unwrap();
    cluster.inject(Fault::Pause, &[1]).unwrap();
    cluster.inject(Fault::Blackhole, &[2, 3]).unwrap();
    cluster.inject(Fault::Reset, &[4]).unwrap();
    cluster.heal_all().unwrap();
    for i in 0..cluster.len() {
        connect_and_ping(cluster.proxy(i).port()).unwrap();
    }
}
