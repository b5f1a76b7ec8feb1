//! Real `redis-server` processes on loopback, with faults, for testing redlock.
//!
//! Each [`RedisNode`] is its own `redis-server` child process with its own
//! temporary data directory and log file. Tests can kill, restart, pause
//! (SIGSTOP, a hung node) and resume nodes, and inspect keys directly.
//! Everything is killed and removed on drop, also when a test panics.
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
//! The binary is `$REDLOCK_REDIS_SERVER` if set, else `redis-server` on `PATH`.
#![warn(missing_docs)]

mod binary;
mod cluster;
mod error;
mod node;
mod port;
mod ready;

pub use cluster::Cluster;
pub use error::{Error, Result};
pub use node::{NodeConfig, Persistence, RedisNode};
