//! Real `redis-server` processes on loopback, with faults, for testing redlock.
//!
//! # Nodes
//!
//! Each [`RedisNode`] is its own `redis-server` child process with its own
//! temporary data directory and log file. Tests can kill, restart (with or
//! without its data, see [`Persistence`]), pause (SIGSTOP, a hung node) and
//! resume nodes, and inspect keys directly. Everything is killed and removed
//! on drop, also when a test panics.
//!
//! The binary is `$REDLOCK_REDIS_SERVER` if set, else `redis-server` on `PATH`.
//!
//! # Clusters
//!
//! A [`Cluster`] is `n` independent nodes, as a Redlock deployment has, with
//! helpers to see where a key is ([`Cluster::nodes_holding`]).
//!
//! ```no_run
//! use redlock_testkit::Cluster;
//!
//! let mut cluster = Cluster::start(3)?;
//! cluster.node(0).set("k", "v")?;
//! cluster.node_mut(1).pause()?;
//! assert_eq!(cluster.nodes_holding("k", "v"), vec![0]);
//! # Ok::<(), redlock_testkit::Error>(())
//! ```
//!
//! # Network faults
//!
//! A [`Proxy`] is a TCP proxy in front of one node; clients connect to it
//! instead, and [`Proxy::set_fault`] applies a [`NetFault`] (latency, a
//! partition, connection resets) to existing and new connections. It runs on
//! its own threads, so it works whatever async runtime the test uses.
//!
//! # Faults as data
//!
//! A [`Fault`] is any of the above, process or network, as a value, so that
//! suites can be tables of faults. A [`FaultyCluster`] has a proxy in front
//! of every node: clients use its [`urls`](FaultyCluster::urls), tests
//! [`inject`](FaultyCluster::inject) faults into some nodes and
//! [`heal`](FaultyCluster::heal) them.
//!
//! ```no_run
//! use std::time::Duration;
//! use redlock_testkit::{Fault, FaultyCluster};
//!
//! let mut cluster = FaultyCluster::start(5)?;
//! let urls = cluster.urls(); // give these to the client under test
//! cluster.inject(Fault::Blackhole, &[0, 1])?;
//! cluster.inject(Fault::Latency { fixed: Duration::from_millis(20), jitter: Duration::ZERO }, &[2])?;
//! // ... the client still gets a quorum of 3 of 5, slowly ...
//! cluster.heal_all()?;
//! # Ok::<(), redlock_testkit::Error>(())
//! ```
//!
//! # Checking exclusion
//!
//! Clients record every [`Grant`] they get into a shared [`History`];
//! [`History::violations`] then lists the grants whose holding windows
//! overlapped. Independently, a [`Counter`] on a node outside the cluster,
//! incremented non-atomically inside the critical section, loses updates when
//! critical sections overlap, whatever the clocks say.
//!
//! ```
//! use std::time::{Duration, Instant};
//! use redlock_testkit::{Grant, History};
//!
//! let history = History::new();
//! let now = Instant::now();
//! let id = history.record(Grant::new(0, "token-a", now, now + Duration::from_secs(1)));
//! history.released(id, Instant::now());
//! assert!(history.violations().is_empty());
//! ```
#![warn(missing_docs)]

mod access;
mod binary;
mod cluster;
mod commands;
mod config;
mod counter;
mod error;
mod fault;
mod history;
mod launch;
mod node;
mod nodes;
mod port;
mod process;
mod proxy;
mod ready;
pub mod tls;
mod wakeup;

pub use cluster::Cluster;
pub use config::{NodeConfig, Persistence};
pub use counter::Counter;
pub use error::{Error, Result};
pub use fault::{Fault, FaultyCluster};
pub use history::{FencingViolation, Grant, GrantId, History, Mode, Violation};
pub use node::RedisNode;
pub use nodes::{NODES_ENV, Nodes};
pub use proxy::{FUZZ_SEED_ENV, Fuzz, NetFault, Proxy};
pub use wakeup::Wakeup;
