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
mod hostile;
mod lease;
mod multi;
mod operators;
mod prefixed_kinds;
mod quarantine;
mod readme;
mod reentrant;
mod regressions;
mod release_extend;
mod review_dropped_undo;
mod review_engine;
mod review_extend;
mod review_force_once;
mod review_fuzz_mixed;
mod review_handoff;
mod review_handon;
mod review_handover;
mod review_held;
mod review_hung;
mod review_lanes;
mod review_lanes_fixes;
mod review_lanes_fourth;
mod review_lanes_third;
mod review_line;
mod review_linger;
mod review_lost_extension;
mod review_lost_undo;
mod review_no_poll;
mod review_resend;
mod review_reset_resend;
mod review_rest;
mod review_runtime;
mod review_runtime_driver;
mod review_slots;
mod review_stale_guards;
mod review_taken;
mod review_undo_after_reset;
mod review_undo_again;
mod review_undo_registered_early;
mod rwlock;
mod semaphore;
mod servers;
mod shutdown;
mod spans;
mod undo_after_reset;
mod waiting;
