//! The library's behaviour on real nodes (redlock-testkit's `redis-server` processes and
//! proxies), one module per behaviour. Nothing here installs or measures anything
//! process-wide, so the tests run in parallel threads; those that do are in `process`.

#[path = "../common/mod.rs"]
mod common;

mod acl;
mod acquire;
mod connection;
mod contention;
mod drop;
mod faults;
mod fencing;
mod handoff;
mod hostile;
mod interleavings;
mod lease;
mod lost_hold;
mod multi;
mod native;
mod operators;
mod prefixed_kinds;
mod quarantine;
mod readme;
mod reentrant;
mod release_extend;
mod resend;
mod runtimes;
mod rwlock;
mod semaphore;
mod servers;
mod shutdown;
mod undo;
mod waiting;
mod waiting_line;
