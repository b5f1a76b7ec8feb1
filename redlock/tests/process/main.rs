//! Tests that install or measure something process-wide: a metrics recorder, a global
//! tracing subscriber (the log every test here reads, and a layer that stalls the client's
//! own thread), scoped subscribers (tracing's callsite interest is process-wide), the suspend hook that moves every lease of the process ahead, rustls's
//! crypto provider, a panic hook counting panics, and the CPU time of the whole process.
//! Any of these would disturb, or be disturbed by, tests running beside it, so each test
//! here first takes [`serial`]: they run one at a time, and apart from the parallel tests
//! of the `it` binary.

#[path = "../common/mod.rs"]
mod common;

mod acl;
mod crypto_provider;
mod lost_hold;
mod metrics;
mod resend;
mod runtimes;
mod secrets;
mod spans;
mod suspend;
mod waiting_cpu;

use std::sync::{Condvar, Mutex};

/// This binary's turn, held until dropped: one test at a time. Not a `MutexGuard`, so that
/// an async test can hold it across its awaits; a test that panics still gives the turn back.
#[derive(Debug)]
#[must_use = "the turn ends when dropped"]
pub struct Serial(());

static TAKEN: Mutex<bool> = Mutex::new(false);
static FREED: Condvar = Condvar::new();

/// Waits for this binary's turn (blocking the thread: take it before the test's runtime
/// has anything to run).
pub fn serial() -> Serial {
    let mut taken = TAKEN.lock().unwrap_or_else(|poisoned| poisoned.into_inner());
    while *taken {
        taken = FREED.wait(taken).unwrap_or_else(|poisoned| poisoned.into_inner());
    }
    *taken = true;
    Serial(())
}

impl Drop for Serial {
    fn drop(&mut self) {
        *TAKEN.lock().unwrap_or_else(|poisoned| poisoned.into_inner()) = false;
        FREED.notify_one();
    }
}
