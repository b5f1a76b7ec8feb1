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

use std::future::Future;
use std::sync::Arc;
use std::time::Instant;

use crate::error::Result;
use crate::retry::{self, Retry};

use super::Core;
use super::notify::ReleaseWatch;

/// How many quick retries a lost split gets per release.
const SPLIT_RETRIES: u32 = 3;

/// Runs `attempt` until it succeeds, fails for good, or `retry` gives up; between attempts,
/// waits for a release of `key` or the policy's pause. With `in_line`, it first waits
/// behind this client's waiters already in line for `key`, if any.
pub(crate) async fn until_acquired<T, F, Fut>(
    core: &Arc<Core>,
    retry: &Retry,
    key: &str,
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
    if in_line && core.releases.has_waiters(key) {
        let watch = releases.insert(core.releases.watch(key, &core.tasks));
        // Bounded like any wait: a lost notification costs one pause, not the lock.
        let pause = retry.next_pause(0, std::time::Duration::ZERO).unwrap_or_default();
        tokio::select! {
            () = watch.released() => woken = true,
            () = tokio::time::sleep(pause) => {}
        }
    }
    loop {
        if !woken {
            counted += 1;
        }
        let started = Instant::now();
        let err = match attempt().await {
            Ok(lock) => return Ok(lock),
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
        let due = match next_counted {
            Some(due) if woken => due,
            _ => {
                let Some(pause) = retry.next_pause(counted, first.elapsed()) else {
                    return Err(err);
                };
                Instant::now() + pause
            }
        };
        next_counted = Some(due);
        let releases = releases.get_or_insert_with(|| core.releases.watch(key, &core.tasks));
        // Woken by a release on a quorum, or by the timer: notifications can be lost.
        tokio::select! {
            () = releases.released() => woken = true,
            () = tokio::time::sleep_until(due.into()) => {
                woken = false;
                next_counted = None;
            }
        }
    }
}
