//! The chaos suite: several clients contend for one resource over five real Redis masters
//! while faults are injected, and two independent checks look for broken exclusion.
//!
//! - The history check: every grant is recorded with its validity window (from the moment
//!   the lock was returned to the client until its validity deadline or its release,
//!   whichever came first); any two windows of different grants that overlap are a
//!   violation.
//! - The counter check: every critical section does a deliberately non-atomic
//!   read-modify-write of a counter on a separate Redis; overlapping sections lose updates,
//!   so the final counter must equal the number of sections.
//!
//! Every lock kind runs under the faults that matter ([`Kind`]): read shares are checked
//! as shared windows (they may overlap each other, never a write), and only exclusive
//! holders update the counter. A counting lock's permits are checked as counted windows
//! (at most L at any instant, one holder per slot at a time), and each slot has a counter
//! of its own.
//!
//! [`fuzz()`] is the interleaving fuzzer: short randomized schedules of a few clients over
//! every kind, through proxies that delay, drop and reset each message (see its module).
//!
//! [`matrix()`] lists the scenarios; [`run`] runs one; [`markdown`] prints a table of
//! reports. `cargo test -p redlock-chaos` runs a bounded version; the `chaos` binary runs the
//! full matrix for longer and prints the table.

#![warn(missing_docs)]

mod fuzz;
mod report;
mod run;
mod scenario;

/// The fencing token of any kind of guard: only the kinds that can be fenced have one.
trait Fence {
    fn fencing(&self) -> Option<u64>;
}

macro_rules! fence {
    ($($kind:ident: $how:expr),* $(,)?) => {$(
        impl Fence for redlock::$kind {
            fn fencing(&self) -> Option<u64> {
                let how: fn(&Self) -> Option<u64> = $how;
                how(self)
            }
        }
    )*};
}

fence!(
    Lock: redlock::Lock::fencing_token,
    WriteLock: redlock::WriteLock::fencing_token,
    Permit: redlock::Permit::fencing_token,
    ReentrantLock: |_| None,
    MultiLock: |_| None,
    ReadLock: |_| None,
);

pub use fuzz::{FuzzConfig, FuzzKind, FuzzReport, fuzz};
pub use report::{Report, markdown};
pub use run::run;
pub use scenario::{Expect, Kind, PERMITS, Scenario, matrix};
