//! Real `redis-server` processes on loopback, with faults, for testing redlock.
//!
//! # Nodes
//!
//! Each [`RedisNode`] is its own `redis-server` child process with its own
//! temporary data directory and log file. Tests can kill, restart (with or
//! without its data, see [`Persistence`]), pause (SIGSTOP, a hung node),
//! [pause for a while](RedisNode::pause_for) (resumed by a plain thread: a slow
//! node) and resume nodes. Everything is killed and removed on drop, also when a
//! test panics.
//!
//! The binary is `$REDLOCK_REDIS_SERVER` if set, else `redis-server` on `PATH`.
//!
//! # Inspecting nodes
//!
//! Tests read a node directly ([`get`](RedisNode::get), [`pttl`](RedisNode::pttl),
//! [`exists`](RedisNode::exists), [`keys`](RedisNode::keys),
//! [`hgetall`](RedisNode::hgetall)) or send it any [`command`](RedisNode::command).
//! A [`Cluster`] answers per node: where a key is ([`Cluster::nodes_with_key`],
//! [`Cluster::nodes_holding`]), its PTTLs ([`Cluster::pttls`]), a hash's fields
//! ([`Cluster::hash_fields`]), and whether anything is left
//! ([`Cluster::keys_everywhere`]). Killed and paused nodes are skipped, never contacted.
//!
//! ```no_run
//! use redlock_testkit::Cluster;
//!
//! let mut cluster = Cluster::start(3)?;
//! cluster.node(0).set("k", "v")?;
//! cluster.node_mut(1).pause()?;
//! assert_eq!(cluster.nodes_holding("k", "v"), vec![0]);
//! assert_eq!(cluster.pttls("k")?, [Some(-1), None, Some(-2)]);
//! # Ok::<(), redlock_testkit::Error>(())
//! ```
//!
//! # TLS, passwords and ACL users
//!
//! [`NodeConfig::tls`] starts a node that speaks TLS only, with certificates the
//! testkit generates once per process ([`tls::Certificates`]: a CA, server and client
//! certificates, and an unrelated CA); [`NodeConfig::requirepass`] sets the default
//! user's password, and [`RedisNode::acl_setuser`] creates users. A node's
//! [`url`](RedisNode::url) says what a client needs (`rediss://`, the password), and
//! the testkit's own connections use the same. See [`tls`] for the redis-rs side.
//!
//! # Network faults
//!
//! A [`Proxy`] is a TCP proxy in front of one node; clients connect to it
//! instead, and [`Proxy::set_fault`] applies a [`NetFault`] (latency, a
//! partition, connection resets, or a [`Fuzz`]: a seeded, replayable schedule of
//! random delays, dropped replies and reset requests) to existing and new
//! connections. It runs on its own threads, so it works whatever async runtime
//! the test uses.
//!
//! # Faults as data
//!
//! A [`Fault`] is any of the above, process or network, as a value, so that
//! suites can be tables of faults. A [`FaultyCluster`] has a proxy in front
//! of every node (one per node *for each client* with
//! [`start_for_clients`](FaultyCluster::start_for_clients), so that one client's
//! faults never touch another's connections): clients use its
//! [`urls_for`](FaultyCluster::urls_for), tests [`inject`](FaultyCluster::inject)
//! faults into some nodes, [`fuzz_client`](FaultyCluster::fuzz_client) one client's
//! connections, and [`heal`](FaultyCluster::heal) them.
//!
//! ```no_run
//! use std::time::Duration;
//! use redlock_testkit::{Fault, FaultyCluster, Fuzz, NodeConfig};
//!
//! let mut cluster = FaultyCluster::start_for_clients(5, 2, NodeConfig::new())?;
//! let (a, b) = (cluster.urls_for(0), cluster.urls_for(1)); // one client each
//! cluster.inject(Fault::Blackhole, &[0, 1])?;
//! let seed = Fuzz::seed_from_env_or_random(); // print it when the test fails
//! cluster.fuzz_client(1, Fuzz::new(seed).with_max_delay(Duration::from_millis(20)).with_drop_reply(0.1));
//! // ... client a gets a quorum of 3 of 5; client b's replies are late or lost ...
//! cluster.heal_all()?;
//! # Ok::<(), redlock_testkit::Error>(())
//! ```
//!
//! # Checking exclusion and fencing
//!
//! Clients record every [`Grant`] they get into a shared [`History`], exclusive
//! ([`Grant::new`]), shared ([`Grant::shared`], a read lock's share) or counted
//! ([`Grant::permit`], a counting lock's permit), with its fencing token if any
//! ([`Grant::with_fence`]). [`History::violations`] then lists the grants whose holding
//! windows overlapped where they must not, [`History::over_limit`] the stretches of
//! time with more holders at once than a counting lock's permits, and
//! [`History::fencing_violations`] the grants whose token is not larger than that of
//! a grant that ended before they started. Independently, a [`Counter`] on a node
//! outside the cluster, incremented non-atomically inside the critical section,
//! loses updates when critical sections overlap, whatever the clocks say.
//!
//! ```
//! use std::time::{Duration, Instant};
//! use redlock_testkit::{Grant, History};
//!
//! let history = History::new();
//! let now = Instant::now();
//! let id = history.record(Grant::new(0, "token-a", now, now + Duration::from_secs(1)).with_fence(1));
//! history.released(id, Instant::now());
//! assert!(history.violations().is_empty());
//! assert!(history.fencing_violations().is_empty());
//! ```
//!
//! # Nodes for examples and benchmarks
//!
//! [`Nodes::from_env_or_start`] gives the nodes of `$REDLOCK_NODES`, or starts a
//! local cluster kept alive by the value.
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
pub use history::{FencingViolation, Grant, GrantId, History, LimitViolation, Mode, Violation};
pub use node::RedisNode;
pub use nodes::{NODES_ENV, Nodes};
pub use proxy::{FUZZ_SEED_ENV, Fuzz, NetFault, Proxy};
pub use wakeup::Wakeup;
