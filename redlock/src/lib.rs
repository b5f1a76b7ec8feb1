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
//! // Before exiting: releases what is still held, waits for background releases.
//! rl.shutdown(Duration::from_secs(2)).await?;
//! # Ok(())
//! # }
//! ```
//!
//! A waiting request ([`Redlock::lock`], `read`, `write`, ...) waits for up to one TTL of
//! its lock by default (see [`Retry`]); [`Redlock::try_lock`] (or `.once()`) makes one
//! attempt.
//!
//! # Words
//! The docs use each of these in one sense:
//! - **token**: the random value that identifies one hold on the nodes
//!   ([`Lock::token`]); release and extend compare it, so they never touch another owner's
//!   key.
//! - **fencing token**: the number, larger with every grant, that a lock taken
//!   `.fenced()` carries for the protected resource to check ([`Lock::fencing_token`],
//!   [`guide::fencing`]); always written out in full.
//! - **TTL**: how long a grant or an extension lasts on the nodes
//!   ([`RedlockBuilder::ttl`], a request's `.ttl(d)`).
//! - **lease**: the time-limited hold a grant gives: it lasts one TTL on the nodes, and for
//!   this client until its **validity** (what remains of it, drift deducted:
//!   [`Lock::validity`]) reaches zero, unless extended. A [`Lease`] is a handle on the
//!   lease of a lock kept alive in the background.
//!
//! # How a lock is taken
//! An attempt sends `SET key token NX PX ttl GET` (set `key` to a fresh token if nobody
//! holds it, and name the holder otherwise; a script that does the same on Redis 6.2) to
//! every node at once, each under its own
//! [node timeout](RedlockBuilder::node_timeout), with a fresh 160-bit random token. It is
//! decided as soon as the outcome is certain: granted when a quorum (`N/2 + 1`) said yes,
//! refused when too many said no or failed for a quorum to remain possible; slow nodes are
//! not waited for: the answers still due are awaited for at most as long again as the
//! decision took (2 ms at most, rounded up to the timer's millisecond tick), and not from a
//! node that answered only after such a wait, or not at all, for a second or until it
//! answers in time. A granted lock is valid for `ttl - elapsed - (ttl x drift_factor + 2 ms)`,
//! timed from the attempt's own start with a monotonic clock that counts the time the
//! machine is suspended where the platform allows (see below); a quorum that took the whole
//! TTL is refused ([`ErrorKind::Expired`]). A refused attempt releases its token on every
//! node that may hold it, including nodes that never answered, behind the attempt's own
//! requests there, and nothing of the attempt goes out once that clean-up is issued
//! ([`guide::order`]).
//!
//! A node with no connection yet (the first request of a process, or the first after its
//! connection broke) is first given the [connect timeout](RedlockBuilder::connect_timeout)
//! to open one (TCP, TLS, AUTH, the script preload and the server check: several round
//! trips), and its request's node timeout starts only then; after a connect that failed,
//! the node gets only its node timeout until a connect succeeds. The round is still decided
//! at the quorum without waiting for a node that is connecting, and validity still counts
//! from the attempt's start, so a slow connect only shortens the validity (or, past it, makes
//! the attempt `Expired`). A node that accepts connections and never answers holds an
//! attempt that needs its vote at most `connect_timeout + node_timeout`, once per outage.
//! [`Redlock::connect`] opens every node's connection at once, up front.
//!
//! Release and extend compare the token (release as the server's `DELIFEQ` where it has it,
//! extend as `SET ... IFEQ` where the node refuses scripts, Lua scripts otherwise:
//! [`guide::kinds`]), sent to all nodes at once. They
//! never delete or extend another owner's key.
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
//!   service for longer than the longest TTL.
//! - **Clocks.** Redis expires keys by its wall clock; a clock jump on a node shortens the
//!   leases of the keys stored there.
//! - **Suspend.** The nodes' clocks run on while the client's machine is suspended, so
//!   their keys expire meanwhile. Every validity, deadline and lost-lock signal is counted
//!   on a clock that counts that time where the platform has one:
//!   - Linux and Android: `CLOCK_BOOTTIME` (read through `nix`, no `unsafe`). A suspend
//!     (to RAM or disk, or a VM suspended through its guest's kernel) shortens the validity
//!     by its length; one past the lease ends it: `validity()` reads zero at once,
//!     [`Lease::lost`] completes within a quarter of a second of the wake (its timer,
//!     which does not count the suspend, re-reads the clock that often), `extend()` and
//!     `release()` answer `NotHeld`, and [`with_lock`](Redlock::with_lock) does not answer
//!     `Ok`. A lease is up to a millisecond shorter than the plain monotonic clock would
//!     make it (the suspended time is rounded up). A VM paused by its hypervisor without
//!     the guest's kernel knowing moves no guest clock: that is a pause, as above.
//!   - Everywhere else: [`std::time::Instant`]. On macOS and iOS it is
//!     `CLOCK_UPTIME_RAW`, which stops while the machine sleeps: a holder that sleeps past
//!     its lease wakes with its validity still running, as after any pause. On Windows it
//!     is `QueryPerformanceCounter`, reported to keep counting through sleep (not checked
//!     by our tests). Other platforms: whatever their monotonic clock does.
//!
//!   [`Lock::deadline`] and [`Lease::deadline`] give the instant on `Instant`'s clock as of
//!   the call: a suspend moves it earlier.
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
//! Redis 6.2 or later (or Valkey) on every node (every new connection reads `INFO server`
//! and refuses an older server), and a Tokio runtime with its timer enabled
//! (`enable_time()` or `enable_all()`, as `#[tokio::main]` does).
//!
//! # Features
//! - `tls-rustls`: `rediss://` nodes over rustls; a default crypto provider (ring) is
//!   installed when the application has none. Adds `RedlockBuilder::tls_root_ca` and
//!   `RedlockBuilder::tls_client_cert` (mutual TLS) for every `rediss://` node.
//! - `tls-rustls-webpki-roots`: the same, trusting the Mozilla roots compiled in.
//! - `tls-native-tls`: `rediss://` over the platform's TLS library.
//!
//! Without one, [`build()`](RedlockBuilder::build) refuses `rediss://` nodes with an
//! [`ErrorKind::Config`] error naming the feature.
//!
//! # ACL users and secrets
//! The permissions an ACL user needs are listed in the README's "ACL users" section (what
//! each rule is for, and what happens without it: [`guide::security`]): keys under the
//! prefix (and `redlock:fence:` + prefix for fencing), the `redlock:released:` + prefix
//! channels, the commands the scripts run, and `info` for the server check and
//! [restart quarantine](RedlockBuilder::restart_quarantine). A user
//! without the channels still releases; its waiters poll. Passwords are never printed:
//! URLs show as `redis://user:***@host:6379`, and errors and logs name nodes by
//! `host:port/db`.
//!
//! # Shutdown
//! [`Redlock::shutdown`] before the process exits: a lock dropped without `release()` is
//! released in the background, and a process that exits first leaves its key for its
//! whole TTL. The shutdown waits (up to its deadline) for that work and for the
//! acquisitions under way: one decided after the shutdown began is taken back and answers
//! [`ErrorKind::Shutdown`], and a waiting `lock()` stops waiting and answers the same.
//!
//! # Limits worth knowing
//! - An undo goes out behind its hold's unanswered creates on their connection
//!   ([`guide::order`]). A create written on a connection that then broke, and read by
//!   the node only later, can still run after its undo: its key then stays until its
//!   lease ends, holding a token no other client counts as its own (never two holders).
//! - A hung node's connection is kept until the node answers again or TCP gives up on it;
//!   meanwhile that node counts as timed out. The requests queued behind it are bounded
//!   (the socket's buffers, then 4096 more in the client): past that, later requests to it
//!   fail at once. (Reaching the bound takes about a hundred thousand requests to one hung
//!   node; no test does.)
//! - An undo that cannot reach its node (a reset, a node down that may come back with its
//!   data), or that the node puts off (`LOADING` while it restarts, `BUSY` while a script
//!   runs), is sent again, with pauses up to a second, until whatever the hold's last
//!   create or extension could set has expired (its round's start, the connect timeout and
//!   two node timeouts, its TTL and the drift allowance); a node that
//!   comes back later than that has let the key expire by itself. A shutdown does not wait
//!   for these re-sends: it names their nodes.
//! - A forced release reads the holds first and then removes, on every node at once, only
//!   those found on enough nodes to keep a quorum out (a holder granted meanwhile keeps its
//!   lock; a remnant on fewer nodes is left to its lease); the removal is never sent twice:
//!   it goes out once per node, on a connection that has just answered a `PING` (a
//!   `NOPERM` answer counts: an ACL user without `+ping` logs one `ACL LOG` entry per call)
//!   or on a new one, and a refusal, however early, is reported, not retried.
//! - A node whose request timed out counts as hung until it answers one again (a second at
//!   most), and an attempt split by contention does not wait for it. A node that is slow
//!   but in time, marked by one late request, can so cost an attempt that waiting would
//!   have won. Node timeouts well above the round trip avoid it.
//! - One server reached under two names (`localhost` and `127.0.0.1`) is detected by its
//!   `run_id` and the second name is refused its vote.
//! - A lock's key (the key prefix and the resource name) is at most 4096 bytes: a longer
//!   name is [`ErrorKind::Config`], not sent.

#![cfg_attr(docsrs, feature(doc_cfg))]
#![forbid(unsafe_code)]
#![warn(missing_docs, missing_debug_implementations)]
#![warn(clippy::future_not_send)]
#![cfg_attr(not(test), warn(clippy::unwrap_used, clippy::expect_used))]

// Only for this workspace's benchmarks: not in the API of any build without the feature.
#[cfg(feature = "bench-internals")]
#[doc(hidden)]
pub mod bench_internals;
mod builder;
mod channel;
mod client;
mod clock;
mod command;
mod config;
mod denied;
mod engine;
mod env;
mod error;
mod failure;
pub mod fence;
#[cfg(feature = "serde")]
mod file_config;
mod guard;
pub mod guide;
mod inspect;
mod kinds;
mod lease;
mod native;
mod node;
mod quarantine;
mod quorum;
mod request;
mod retry;
mod route;
mod secret;
mod server;
mod tasks;
mod telemetry;
#[doc(hidden)]
pub mod test_hooks;
mod timing;
mod token;

/// The [`redis`](https://docs.rs/redis) crate this library is built on, re-exported so that
/// a connection made with it (the store of [`fence::fenced_set`]) is of the version the
/// library expects: `redlock::redis::Client::open(url)?.get_multiplexed_async_connection()`.
pub use redis;

pub use crate::builder::RedlockBuilder;
pub use crate::client::{IntoRequest, Redlock};
pub use crate::error::{Error, ErrorKind, NodeOutcome, NodeReport, Result, ShutdownReport};
#[cfg(feature = "serde")]
pub use crate::file_config::RedlockConfig;
pub use crate::guard::Guard;
pub use crate::inspect::{Inspection, NodeView};
pub use crate::kinds::multi::MultiLock;
pub use crate::kinds::plain::Lock;
pub use crate::kinds::reentrant::ReentrantLock;
pub use crate::kinds::rwlock::{ReadLock, WriteLock, WriterPriority};
pub use crate::kinds::semaphore::Permit;
pub use crate::lease::{AutoLock, Lease};
pub use crate::request::{
    Acquiring, LockRequest, MultiRequest, ReadRequest, ReentrantRequest, SemaphoreRequest,
    WriteRequest,
};
pub use crate::retry::Retry;

/// The README's examples, compiled as doctests so that they cannot rot.
#[cfg(doctest)]
#[doc = include_str!("../README.md")]
pub struct ReadmeDoctests;

/// Compile-time proof that every public future and guard is `Send` (and the guards
/// `'static`): a spawned task can hold and await any of them.
#[cfg(test)]
mod send_checks {
    use super::*;

    fn send<T: Send>(_: &T) {}
    fn send_static<T: Send + Sync + 'static>() {}

    #[allow(dead_code)]
    fn futures_are_send(rl: &Redlock, lease: &Lease, mut lock: Lock, auto: AutoLock<Lock>) {
        send_static::<Redlock>();
        send_static::<Lock>();
        send_static::<ReentrantLock>();
        send_static::<MultiLock>();
        send_static::<ReadLock>();
        send_static::<WriteLock>();
        send_static::<Permit>();
        send_static::<AutoLock<Lock>>();
        send_static::<AutoLock<ReentrantLock>>();
        send_static::<AutoLock<MultiLock>>();
        send_static::<AutoLock<ReadLock>>();
        send_static::<AutoLock<WriteLock>>();
        send_static::<AutoLock<Permit>>();
        send_static::<Lease>();
        send_static::<Error>();
        send(&std::future::IntoFuture::into_future(rl.lock("r")));
        send(&std::future::IntoFuture::into_future(rl.reentrant("r", "o")));
        send(&std::future::IntoFuture::into_future(rl.many(&["a"])));
        send(&std::future::IntoFuture::into_future(rl.read("r")));
        send(&std::future::IntoFuture::into_future(rl.write("r")));
        send(&std::future::IntoFuture::into_future(rl.semaphore("r", 2)));
        send(&rl.with_lock(rl.semaphore("r", 2), |lease| async move { lease.lost().await }));
        send(&rl.with_lock("r", |lease| async move { lease.lost().await }));
        send(&rl.with_lock(rl.write("r").once(), |lease| async move { lease.lost().await }));
        send(&lease.lost());
        send(&lock.check_held());
        send(&lock.extend(std::time::Duration::ZERO));
        send(&auto.lost());
        send(&auto.release());
        send(&lock.release());
    }

    #[allow(dead_code)]
    fn keeping_is_send(lock: Lock, auto: AutoLock<Lock>) {
        send(&lock.keep_for(std::time::Duration::ZERO));
        send(&auto.keep_for(std::time::Duration::ZERO));
    }
}
