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
//! A waiter for an exclusive hold behind another of this client's waiters lets a tick of
//! its timer pass without an attempt when the first waiter in line stands in for it: its
//! attempts are the same request (the same kind, the same keys, and an intent recorded by
//! both or neither), its last attempt found the keys held (no node said yes), and it
//! started an attempt since this one's last tick. Its attempt could only fail where the
//! first one's did, or split the votes with it at a handoff, and would do nothing the first
//! one's did not: a writer that records no intent standing in for one that does would let a
//! stream of readers starve both. A tick let pass counts against `max_attempts` and is
//! paced like an attempt (the pause plus the first waiter's last attempt), so that the
//! policy bounds the wait as it would have, and the last tick it allows is always a real
//! attempt. A first waiter that fails for another reason, polls more slowly, or stopped
//! (its runtime blocked, its future no longer polled) stands in for no one. Release
//! notifications wake the first waiter only, and one that got the lock does not hand on a
//! wake-up from a release before its grant.
//!
//! Every waiter's tick also passes without an attempt while a hold of this client that
//! excludes every other is valid on the key (granted or extended while the waiter watched,
//! not released since): the attempt could only fail, and that hold's release wakes the
//! first waiter like any release. A writer whose attempts record an intent keeps
//! attempting: its refused attempts keep the intent that holds readers back once that hold
//! is released. Once the hold's validity is over (a guard forgotten, a holder gone quiet),
//! the ticks try again.

use std::future::Future;
use std::sync::Arc;
use std::time::{Duration, Instant};

use crate::error::{Error, ErrorKind, Result};
use crate::retry::{self, Retry};

use super::Core;
use super::notify::{ReleaseWatch, Request};

/// How many quick retries a lost split gets per release.
const SPLIT_RETRIES: u32 = 3;

/// Runs `attempt` until it succeeds, fails for good, or `retry` gives up; between attempts,
/// waits for a release of the first key of `request` (what the attempts ask for) or the
/// policy's pause. For a hold that excludes every other, it first waits behind this
/// client's waiters already in line for that key, if any, and lets the first one stand in
/// for its ticks while that one's attempts are the same request.
pub(crate) async fn until_acquired<T, F, Fut>(
    core: &Arc<Core>,
    retry: &Retry,
    request: &Request,
    mut attempt: F,
) -> Result<T>
where
    F: FnMut() -> Fut,
    Fut: Future<Output = Result<T>>,
{
    let (keys, in_line) = (request.keys(), request.is_exclusive());
    let first = Instant::now();
    let mut counted = 0u32;
    let mut woken = false;
    let mut splits = 0;
    let mut next_counted: Option<Instant> = None;
    // The most telling error so far: what the policy's give-up reports.
    let mut telling: Option<Error> = None;
    // Subscribed after the first failure only: an uncontended lock costs no subscription.
    let mut releases: Option<ReleaseWatch> = None;
    if in_line && keys.first().is_some_and(|key| core.releases.has_waiters(key)) {
        let watch = releases.insert(core.releases.watch(request, &core.tasks));
        // Bounded like any wait: a lost notification costs one pause, not the lock.
        let pause = retry.next_pause(0, Duration::ZERO).unwrap_or_default();
        let mut due = after(pause);
        woken = next_turn(watch, core, retry, first, &mut counted, &mut due).await;
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
        if err.kind() == ErrorKind::Unavailable {
            telling = Some(Error::most_telling(telling.take(), err.clone()));
        }
        let took = started.elapsed();
        let held = err.kind() == ErrorKind::NotAcquired && err.granted() == 0;
        if let Some(watch) = &releases {
            watch.attempted(took, held);
        }
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
                    return Err(Error::most_telling(telling, err));
                };
                after(pause)
            }
        };
        let watch = match &mut releases {
            Some(watch) => watch,
            // Subscribed once it waits: a policy that gives up at once costs no subscription.
            None => {
                let watch = releases.insert(core.releases.watch(request, &core.tasks));
                watch.attempted(took, held);
                watch
            }
        };
        woken = next_turn(watch, core, retry, first, &mut counted, &mut due).await;
        next_counted = woken.then_some(due);
    }
}

/// Waits for this waiter's next attempt: a release on a quorum it is woken for (`true`),
/// or its timer (`false`: notifications can be lost), due at `due`. A tick for which the
/// first waiter in line stands in (see [`ReleaseWatch::stand_in`]) passes without an
/// attempt: it counts in `counted`, and `due` becomes the next tick's time, paced like an
/// attempt (of at most a node timeout), unless the policy allows no tick after that one
/// within its bounds. The client's shutdown ends the wait for the tick at once, and every
/// tick after it is an attempt (which fails at once with `Shutdown`): a shutdown waits for
/// waits, so none may sleep through it.
async fn next_turn(
    watch: &ReleaseWatch,
    core: &Core,
    retry: &Retry,
    first: Instant,
    counted: &mut u32,
    due: &mut Instant,
) -> bool {
    let mut since = Instant::now();
    loop {
        tokio::select! {
            () = watch.released() => return true,
            () = tokio::time::sleep_until((*due).into()) => {}
            () = core.tasks.closed() => return false,
        }
        if core.tasks.is_closing() {
            return false;
        }
        let Some(its_attempt) = watch.stand_in(since) else { return false };
        // Paced like the attempt it stands for, whose time a runtime's stall does not
        // stretch beyond a round's bound; and never past the policy's last tick.
        let its_attempt = its_attempt.min(core.config.node_timeout);
        match retry.next_pause(*counted + 1, first.elapsed().saturating_add(its_attempt)) {
            Some(pause) => {
                *counted += 1;
                since = Instant::now();
                *due = after(pause.saturating_add(its_attempt));
            }
            None => return false,
        }
    }
}

/// The instant `pause` from now; far in the future for a pause too long to add.
fn after(pause: Duration) -> Instant {
    let now = Instant::now();
    now.checked_add(pause).unwrap_or_else(|| now + Duration::from_secs(100 * 365 * 24 * 3600))
}
