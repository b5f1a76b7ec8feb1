//! Not part of the API: hooks for the integration tests, which cannot reach the crate's
//! internals. Hidden from the docs; may change in any release.

use std::time::Duration;

/// Moves the clock that every lease of this process is counted on ahead by `by`, as a
/// suspend of the machine that long would: validities shrink by `by`, and timers guarding
/// a deadline notice within a quarter of a second. It can only shorten leases, never
/// lengthen one. Process-wide: a test binary that calls it must not run other tests whose
/// leases it would end.
pub fn simulate_suspend(by: Duration) {
    crate::clock::simulate_suspend(by);
}
