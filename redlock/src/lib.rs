//! Distributed locks over N independent Redis masters: the
//! [Redlock algorithm](https://redis.io/docs/latest/develop/use/patterns/distributed-locks/).
//!
//! ```no_run
//! use std::time::Duration;
//! use redlock::{ErrorKind, Redlock};
//!
//! # async fn run() -> Result<(), redlock::Error> {
//! let rl = Redlock::builder()
//!     .nodes([
//!         "redis://127.0.0.1:7001",
//!         "redis://127.0.0.1:7002",
//!         "redis://127.0.0.1:7003",
//!         "redis://127.0.0.1:7004",
//!         "redis://127.0.0.1:7005",
//!     ])
//!     .ttl(Duration::from_secs(10))
//!     .build()?;
//!
//! match rl.try_lock("orders:42").await {
//!     Ok(lock) => {
//!         // ... work that must finish within lock.validity() ...
//!         lock.release().await?;
//!     }
//!     Err(err) if err.kind() == ErrorKind::NotAcquired => println!("busy: {err}"),
//!     Err(err) => return Err(err),
//! }
//! # Ok(())
//! # }
//! ```
//!
//! # How a lock is taken
//! An attempt sends `SET key token NX GET PX ttl` to every node at once, each under its own
//! [node timeout](RedlockBuilder::node_timeout), with a fresh 160-bit random token. It is
//! decided as soon as the outcome is certain: granted when a quorum (`N/2 + 1`) said yes,
//! refused when too many said no or failed for a quorum to remain possible; slow nodes are
//! not waited for. A granted lock is valid for `ttl - elapsed - (ttl x drift_factor + 2 ms)`,
//! timed from the attempt's own start with a monotonic clock; a quorum that took the whole
//! lease is refused ([`ErrorKind::Expired`]). A refused attempt releases its token on every
//! node that may hold it, including nodes that never answered: the release is queued on the
//! same connection behind the `SET`, so it also reaches a `SET` that lands late.
//!
//! Release and extend are compare-the-token Lua scripts (`EVALSHA`, reloaded after a node
//! restart) sent to all nodes at once. They never delete or extend another owner's key.
//!
//! # What is guaranteed, and what is not
//! Within its model (no clock on any node jumps or runs faster than the drift factor
//! allows, nodes keep their keys across restarts, and the holder stops using the lock
//! before its validity ends) no two clients hold the same lock at once, and any minority
//! of nodes may be down, slow or partitioned without blocking anyone.
//!
//! Outside that model it can fail, as every lease-based lock does:
//! - **Pauses.** A process paused longer than the remaining validity (GC, swapping, a
//!   stopped VM, a reply stuck in a socket buffer) can act after its lease expired and
//!   another client took the lock. [`Lock::validity`] is checked before acting, but a check
//!   cannot prevent a pause after it. Only a fencing token checked by the protected
//!   resource closes that gap.
//! - **Persistence.** A node that restarts without its keys (no persistence, or
//!   `appendfsync everysec` losing the last second) can let a second client in. Run nodes
//!   with `appendonly yes` and `appendfsync always`, or keep a restarted node out of
//!   service for longer than the longest lease.
//! - **Clocks.** Redis expires keys by its wall clock; a clock jump on a node shortens the
//!   leases stored there.
//!
//! Use Redlock for efficiency (avoiding duplicate work) without fencing, and for
//! correctness only together with a resource that rejects stale fencing tokens.
//!
//! # Errors
//! Every error has an [`ErrorKind`] to branch on and carries the per-node outcomes of the
//! round that failed ([`Error::nodes`]), so "held by another owner" and "nodes unreachable"
//! are never confused.
//!
//! # Logging
//! Every attempt is a `tracing` span `lock_attempt` (target `redlock`, level debug) with the
//! resource, outcome, elapsed time and each node's outcome.
//!
//! # Requirements
//! Redis 7.0 or later on every node (for `SET ... NX GET`), and a Tokio runtime with its
//! timer enabled (`enable_time()` or `enable_all()`, as `#[tokio::main]` does).
//!
//! # Limits worth knowing
//! - A hung node's connection is kept, not replaced: commands on one connection run in
//!   order, which is what lets a release follow a late `SET`. Until the node answers again
//!   or TCP gives up on it, that node counts as timed out; up to 4096 requests can be
//!   queued behind it per client, beyond which later releases to it are dropped and their
//!   keys left to expire.
//! - Nodes are told apart by `host:port`: two names for one server (`localhost` and
//!   `127.0.0.1`) are not detected and would give that server two votes.

#![forbid(unsafe_code)]
#![warn(missing_docs, missing_debug_implementations)]
#![cfg_attr(not(test), warn(clippy::unwrap_used, clippy::expect_used))]

#[doc(hidden)]
pub mod bench_internals;
mod builder;
mod error;
mod fanout;
pub mod fence;
mod kinds;
mod lease;
mod lock;
mod node;
mod notify;
mod protocol;
mod quarantine;
mod quorum;
mod redlock;
mod retry;
mod script;
mod token;

pub use crate::builder::RedlockBuilder;
pub use crate::error::{Error, ErrorKind, NodeOutcome, NodeReport, Result};
pub use crate::kinds::multi::MultiLock;
pub use crate::kinds::reentrant::ReentrantLock;
pub use crate::kinds::rwlock::{AutoReadLock, AutoWriteLock, ReadLock, WriteLock, WriterPriority};
pub use crate::lease::{AutoLock, Lease};
pub use crate::lock::Lock;
pub use crate::redlock::Redlock;
pub use crate::retry::Retry;

/// The README's examples, compiled as doctests so that they cannot rot.
#[cfg(doctest)]
#[doc = include_str!("../../README.md")]
pub struct ReadmeDoctests;
