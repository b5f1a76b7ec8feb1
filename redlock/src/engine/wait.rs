//! Waiting for a lock: attempts until one succeeds or the retry policy gives up, woken
//! between attempts by release notifications.
//!
//! The policy's attempts are paced by its timer (`delay` + random `jitter`), and bounded by
//! `max_attempts` and `max_wait`. A release notification in between triggers an extra
//! attempt that does not count against `max_attempts`, so that losing the race for a
//! handoff never uses up the policy. A woken attempt that got some votes but lost (several
//! clients woken by one release split the nodes) tries again after a short random pause,
//! a few times, before waiting again.
//!
//! A wait for an exclusive hold that finds this client's waiters already in line for the
//! key joins the line instead of trying at once: a task that releases and at once asks
//! again would otherwise race the waiter woken by its own release, and the split vote
//! costs both of them a round.
//!
//! A waiter for an exclusive hold behind another of this client's waiters lets its timer's
//! ticks pass while the first one in line is alive and waits for no key it does not also
//! need: its attempt could only fail where the first one's does, or split the votes with
//! it at a handoff. A tick let pass still counts against `max_attempts`, so that the policy
//! bounds the wait as it would have, and the last one it allows is always an attempt. A
//! first waiter that started no attempt for a while (its future is no longer polled)
//! holds no one back. Release notifications wake the first waiter only, and one that got
//! the lock does not hand on a wake-up from a release before its grant.

use std::future::Future;
use std::sync::Arc;
use std::time::{Duration, Instant};

use crate::error::Result;
use crate::retry::{self, Retry};

use super::Core;
use super::notify::ReleaseWatch;
use super::protocol::Keys;

/// How many quick retries a lost split gets per release.
const SPLIT_RETRIES: u32 = 3;

/// Runs `attempt` until it succeeds, fails for good, or `retry` gives up; between attempts,
/// waits for a release of the first of `keys` (the hold's keys) or the policy's pause.
/// With `in_line` (a hold that excludes every other), it first waits behind this client's
/// waiters already in line for that key, if any.
pub(crate) async fn until_acquired<T, F, Fut>(
    core: &Arc<Core>,
    retry: &Retry,
    keys: &Keys,
    in_line: bool,
    mut attempt: F,
) -> Result<T>
where
    F: FnMut() -> Fut,
    Fut: Future<Output = Result<T>>,
{
    let first = Instant::now();
    let mut counted = 0u32;
    let mut woken = false;
    let mut splits = 0;
    let mut next_counted: Option<Instant> = None;
    // Subscribed after the first failure only: an uncontended lock costs no subscription.
    let mut releases: Option<ReleaseWatch> = None;
    // Only an exclusive hold lets its timer pass behind another waiter (see `next_turn`).
    let stall = if in_line { stall_after(retry, core.config.node_timeout) } else { Duration::ZERO };
    if in_line && keys.first().is_some_and(|key| core.releases.has_waiters(key)) {
        let watch = releases.insert(core.releases.watch(keys, &core.tasks));
        // Bounded like any wait: a lost notification costs one pause, not the lock.
        let pause = retry.next_pause(0, Duration::ZERO).unwrap_or_default();
        let mut due = Instant::now() + pause;
        woken = next_turn(watch, retry, stall, first, &mut counted, &mut due).await;
    }
    loop {
        if !woken {
            counted += 1;
        }
        if let Some(watch) = &releases {
            watch.attempting();
        }
        let started = Instant::now();
        let err = match attempt().await {
            Ok(lock) => {
                if let Some(watch) = releases.as_ref().filter(|_| in_line) {
                    watch.granted();
                }
                return Ok(lock);
            }
            Err(err) if !err.is_retryable() => return Err(err),
            Err(err) => err,
        };
        let took = started.elapsed();
        if woken && err.granted() > 0 && splits < SPLIT_RETRIES {
            // Some nodes said yes: another waiter woken by the same release split the
            // votes. Try again at once, but not in lockstep with it.
            splits += 1;
            tokio::time::sleep(retry::random_up_to(took * 2)).await;
            continue;
        }
        splits = 0;
        let mut due = match next_counted {
            Some(due) if woken => due,
            _ => {
                let Some(pause) = retry.next_pause(counted, first.elapsed()) else {
                    return Err(err);
                };
                Instant::now() + pause
            }
        };
        let releases = releases.get_or_insert_with(|| core.releases.watch(keys, &core.tasks));
        woken = next_turn(releases, retry, stall, first, &mut counted, &mut due).await;
        next_counted = woken.then_some(due);
    }
}

/// Waits for this waiter's next attempt: a release on a quorum it is woken for (`true`),
/// or its timer (`false`: notifications can be lost), due at `due`. A tick behind a live
/// first waiter (see [`ReleaseWatch::behind_a_live_waiter`]; `stall` is zero for holds
/// that do not exclude every other) passes without an attempt: it counts in `counted`,
/// and `due` becomes the next tick's time, unless it is the last the policy allows.
async fn next_turn(
    watch: &ReleaseWatch,
    retry: &Retry,
    stall: Duration,
    first: Instant,
    counted: &mut u32,
    due: &mut Instant,
) -> bool {
    loop {
        tokio::select! {
            () = watch.released() => return true,
            () = tokio::time::sleep_until((*due).into()) => {}
        }
        if !watch.behind_a_live_waiter(stall) {
            return false;
        }
        match retry.next_pause(*counted + 1, first.elapsed()) {
            Some(pause) => {
                *counted += 1;
                *due = Instant::now() + pause;
            }
            None => return false,
        }
    }
}

/// How long a line with no attempt started counts as stalled: a waiter that is alive
/// starts one at least every longest pause of the policy plus the longest attempt (an
/// acquisition round, a fencing token's two, a clean-up, each bounded by the node
/// timeout), or a split's pause after one; twice that, to spare a slow machine.
fn stall_after(retry: &Retry, node_timeout: Duration) -> Duration {
    retry.longest_pause().saturating_add(node_timeout.saturating_mul(8)).saturating_mul(2)
}
