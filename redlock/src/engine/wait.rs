//! Waiting for a lock: attempts until one succeeds or the retry policy gives up, woken
//! between attempts by release notifications, and, for an exclusive hold, in this client's
//! line for the request (see `queue`).
//!
//! The policy's attempts are paced by its timer (`delay` + random `jitter`), and bounded by
//! `max_attempts` and `max_wait`. A wake-up in between (a release notification, the turn
//! handed on by this client's release, a waiter behind asking for an attempt) triggers an
//! extra attempt that does not count against `max_attempts`, so that losing the race for a
//! handoff never uses up the policy. A woken attempt that got some votes but lost (several
//! clients woken by one release split the nodes) tries again after a short random pause,
//! a few times, before waiting again.
//!
//! In a line, each tick of a waiter behind the first counts an attempt of the line as its
//! own (the one started since its previous tick, or one it asks the first for), and a tick
//! while a hold of this client has the turn counts as an attempt that could only fail: the
//! policy bounds the wait as it would have with attempts of its own, and an error it gives
//! up with is a real attempt's (or says that this client holds the lock). Such a tick is
//! followed by a pause of at least [`timing::PASSED_TICK_MIN_PAUSE`]: it stands in only
//! for a lost notification or an expiry, and with a policy of no pause it would keep the
//! first waiter making rounds back to back.

use crate::timing;
use std::future::Future;
use std::sync::Arc;
use std::time::{Duration, Instant};

use crate::error::{Error, ErrorKind, Result};
use crate::retry::{self, Retry};

use super::Core;
use super::notify::ReleaseWatch;
use super::queue::{Outcome, Request, Ticket, Turn};

/// Runs `attempt` until it succeeds, fails for good, or `retry` gives up; between attempts,
/// waits for a release of any key of `request` (what the attempts ask for), a call of
/// its line (`ticket`, for a hold that excludes every other), or the policy's pause.
/// `resource` names the lock in errors.
pub(crate) async fn until_acquired<T, F, Fut>(
    core: &Arc<Core>,
    retry: &Retry,
    request: &Request,
    mut ticket: Option<&mut Ticket>,
    resource: &str,
    mut attempt: F,
) -> Result<T>
where
    F: FnMut() -> Fut,
    Fut: Future<Output = Result<T>>,
{
    let first = crate::clock::monotonic();
    let mut counted = 0u32;
    // Whether this tick counts against the policy: not one a wake-up brought.
    let mut counts = true;
    let mut woken = false;
    // The first waiter did not start the attempt asked of it: take its place.
    let mut stalled = false;
    // The line's attempt failed for a reason of the waiter that made it: attempt anyway.
    let mut own = false;
    let mut splits = 0;
    let mut next_counted: Option<Instant> = None;
    // The most telling error so far: what the policy's give-up reports.
    let mut telling: Option<Error> = None;
    // Subscribed after the first failure only: an uncontended lock costs no subscription.
    let mut releases: Option<ReleaseWatch> = None;
    // A round's bound, for an attempt of the line another waiter is making: past it, that
    // waiter stalled (its runtime blocked), and this one attempts itself.
    let patience = core.config.node_timeout.saturating_add(timing::STALL);
    loop {
        let turn = match ticket.as_deref_mut() {
            // Every tick after a shutdown began is an attempt, which answers `Shutdown`.
            Some(ticket) if !own && !core.tasks.is_closing() => {
                ticket.turn(std::mem::take(&mut stalled))
            }
            _ => Turn::Attempt,
        };
        own = false;
        let mut held_until = None;
        let mut paced = Duration::ZERO;
        // A tick let pass without an attempt of its own: its next one is no sooner than
        // `PASSED_TICK_MIN_PAUSE`, whatever the policy's pause.
        let mut passed = false;
        let (err, attempted) = match turn {
            Turn::Attempt => {
                let started = crate::clock::monotonic();
                let mark = ticket.as_deref_mut().map(Ticket::attempting);
                let err = match attempt().await {
                    Ok(lock) => {
                        if let Some(watch) = &releases {
                            watch.granted();
                        }
                        return Ok(lock);
                    }
                    Err(err) if !err.is_retryable() => return Err(err),
                    Err(err) => err,
                };
                let held = err.kind() == ErrorKind::NotAcquired && err.granted() == 0;
                if woken
                    && err.kind() == ErrorKind::NotAcquired
                    && let Some(watch) = &releases
                {
                    watch.refused_after_wake();
                }
                if let Some(mark) = mark {
                    mark.found(if held { Outcome::Held(err.clone()) } else { Outcome::Other });
                }
                (err, Some(crate::clock::monotonic().saturating_duration_since(started)))
            }
            Turn::Follow(number) => {
                let Some(ticket) = ticket.as_deref_mut() else { continue };
                match ticket.follow(number, patience).await {
                    Some(Outcome::Held(err)) => {
                        passed = true;
                        (err, None)
                    }
                    // The turn is another waiter's hold now: see what it says.
                    Some(Outcome::Granted) => continue,
                    Some(Outcome::Other) => {
                        own = true;
                        continue;
                    }
                    None => {
                        stalled = true;
                        continue;
                    }
                }
            }
            Turn::Held(until, took) => {
                held_until = Some(until);
                passed = true;
                // Paced like the attempt it stands for, whose time a stall does not stretch
                // beyond a round's bound: `max_attempts` bounds the same wait.
                paced = took.min(core.config.node_timeout);
                let Some(ticket) = ticket.as_deref() else { continue };
                (ticket.held_here(resource), None)
            }
        };
        if counts {
            counted += 1;
        }
        if err.kind() == ErrorKind::Unavailable {
            telling = Some(Error::most_telling(telling.take(), err.clone()));
        }
        if let Some(took) = attempted
            && split_again(woken, err.granted(), splits)
        {
            // Some nodes said yes: another waiter woken by the same release split the
            // votes. Try again at once, but not in lockstep with it.
            splits += 1;
            tokio::time::sleep(retry::random_up_to(took * 2)).await;
            counts = false;
            continue;
        }
        splits = 0;
        let due = match next_counted {
            Some(due) if woken => due,
            _ => {
                let min = if passed { timing::PASSED_TICK_MIN_PAUSE } else { Duration::ZERO };
                let Some(pause) =
                    retry.next_pause(counted, waited(first).saturating_add(paced), min)
                else {
                    return Err(Error::most_telling(telling, err));
                };
                after(pause.saturating_add(paced))
            }
        };
        // Subscribed once it waits: a policy that gives up at once costs no subscription.
        let watch = releases.get_or_insert_with(|| {
            core.releases.watch(request.keys().iter().map(|key| &**key), &core.tasks)
        });
        woken = next_turn(watch, ticket.as_deref(), core, due, held_until).await;
        counts = !woken;
        next_counted = woken.then_some(due);
    }
}

/// Waits for this waiter's next tick: a release on a quorum it is woken for, a call of its
/// line, or the end of the validity of the hold of this client that has its line's turn
/// (`true`); or its timer, due at `due` (`false`: notifications can be lost). The client's
/// shutdown ends the wait at once: a shutdown waits for waits, so none may sleep through it.
async fn next_turn(
    watch: &ReleaseWatch,
    ticket: Option<&Ticket>,
    core: &Core,
    due: Instant,
    held_until: Option<Instant>,
) -> bool {
    let called = async {
        match ticket {
            Some(ticket) => {
                ticket.calls().await;
                ticket.called();
            }
            None => std::future::pending().await,
        }
    };
    let held_over = async {
        match held_until {
            Some(until) => tokio::time::sleep_until(crate::clock::on_std(until).into()).await,
            None => std::future::pending().await,
        }
    };
    tokio::select! {
        () = watch.released() => true,
        () = called => true,
        () = held_over => true,
        () = tokio::time::sleep_until(due.into()) => false,
        () = core.tasks.closed() => false,
    }
}

/// Whether a refused attempt is tried again at once rather than after the policy's pause:
/// a release woke it and some nodes said yes (another waiter woken by the same release
/// split the votes), `splits` times so far of at most [`timing::SPLIT_RETRIES`].
fn split_again(woken: bool, granted: usize, splits: u32) -> bool {
    woken && granted > 0 && splits < timing::SPLIT_RETRIES
}

/// How long since `first`.
fn waited(first: Instant) -> Duration {
    crate::clock::monotonic().saturating_duration_since(first)
}

/// The instant `pause` from now; far in the future for a pause too long to add.
fn after(pause: Duration) -> Instant {
    let now = crate::clock::monotonic();
    now.checked_add(pause).unwrap_or_else(|| now + Duration::from_secs(100 * 365 * 24 * 3600))
}

#[cfg(test)]
mod tests {
    use std::sync::Mutex;

    use super::*;
    use crate::node::Node;

    /// A client over three nodes it never reaches, its notifications off (waits poll).
    fn core() -> Arc<Core> {
        let nodes = (0..3)
            .map(|i| {
                let client = redis::Client::open(format!("redis://127.0.0.1:{}", 1 + i)).unwrap();
                let timeout = Duration::from_millis(50);
                Arc::new(Node::new(client, timeout, Duration::ZERO, Arc::default(), Arc::default()))
            })
            .collect();
        let core = Arc::new(Core::new(nodes, crate::config::config(""), Arc::default()));
        core.releases.stop();
        core
    }

    /// When each attempt of a wait under `retry` started (ms from the wait's start), each
    /// taking 10 ms and refused; with when the wait gave up.
    async fn attempts(retry: &Retry) -> (Vec<u64>, u64) {
        let core = core();
        let request = Request::shared("lock", "doc".into());
        let start = tokio::time::Instant::now();
        let ms = |at: tokio::time::Instant| u64::try_from(at.duration_since(start).as_millis());
        let started = Mutex::new(Vec::new());
        let attempt = || {
            started.lock().unwrap().push(ms(tokio::time::Instant::now()).unwrap());
            async {
                tokio::time::sleep(Duration::from_millis(10)).await;
                Err::<(), _>(Error::local(ErrorKind::NotAcquired, "held", "doc"))
            }
        };
        let err = until_acquired(&core, retry, &request, None, "doc", attempt).await.unwrap_err();
        assert_eq!(err.kind(), ErrorKind::NotAcquired, "the last attempt's error");
        let gave_up = ms(tokio::time::Instant::now()).unwrap();
        (started.into_inner().unwrap(), gave_up)
    }

    #[tokio::test(start_paused = true)]
    async fn a_waiter_gives_up_at_its_deadline() {
        let every_100_ms =
            Retry::new().with_delay(Duration::from_millis(100)).with_jitter(Duration::ZERO);
        // No attempt starts that could not within the second: the last at 990 ms.
        let patient = every_100_ms.with_unbounded_attempts().with_max_wait(Duration::from_secs(1));
        let (started, gave_up) = attempts(&patient).await;
        assert_eq!(started, (0..10).map(|k| k * 110).collect::<Vec<_>>(), "paced by the policy");
        assert_eq!(gave_up, 1000, "over with the last attempt, within max_wait");
        // Or after its attempts.
        let (started, gave_up) = attempts(&every_100_ms.with_max_attempts(3)).await;
        assert_eq!((started, gave_up), (vec![0, 110, 220], 230));
    }

    #[tokio::test(start_paused = true)]
    async fn a_waiter_with_no_pause_behind_the_first_asks_it_for_an_attempt_every_minimum_pause() {
        let core = core();
        let request = Request::exclusive("doc");
        let patient = |delay, max_wait| {
            Retry::new()
                .with_unbounded_attempts()
                .with_delay(delay)
                .with_jitter(Duration::ZERO)
                .with_max_wait(max_wait)
        };
        let made = [Mutex::new(0u32), Mutex::new(0u32)];
        let wait = |who: usize, retry: Retry| {
            let (core, request, made) = (&core, &request, &made);
            async move {
                let mut ticket = core.lines.join(request);
                let attempt = || {
                    *made[who].lock().unwrap() += 1;
                    async {
                        tokio::time::sleep(Duration::from_millis(1)).await;
                        Err::<(), _>(Error::local(ErrorKind::NotAcquired, "held", "doc"))
                    }
                };
                until_acquired(core, &retry, request, Some(&mut ticket), "doc", attempt).await
            }
        };
        let second = Duration::from_secs(1);
        // The first outlives the eager one, which is behind it for the whole second.
        let first = wait(0, patient(Duration::from_millis(100), second * 2));
        let eager = async {
            let waited = wait(1, patient(Duration::ZERO, second)).await;
            (waited, *made[0].lock().unwrap())
        };
        let (first, (eager, made_meanwhile)) = tokio::join!(first, eager);
        assert_eq!(first.unwrap_err().kind(), ErrorKind::NotAcquired);
        assert_eq!(eager.unwrap_err().kind(), ErrorKind::NotAcquired);
        // Its own polls (ten in the second) and one asked of it per minimum pause at most;
        // with no minimum, it made an attempt every millisecond.
        let asked =
            u32::try_from(second.as_millis() / timing::PASSED_TICK_MIN_PAUSE.as_millis()).unwrap();
        assert!(made_meanwhile <= 10 + asked + 1, "{made_meanwhile} attempts in the second");
        assert!(made_meanwhile > asked, "{made_meanwhile} attempts in the second: none asked");
        assert_eq!(*made[1].lock().unwrap(), 0, "behind a live first waiter, none of its own");
    }

    #[test]
    fn a_split_vote_after_a_release_is_tried_again_at_once_three_times_at_most() {
        assert!(split_again(true, 2, 0));
        assert!(split_again(true, 1, timing::SPLIT_RETRIES - 1));
        assert!(!split_again(true, 1, timing::SPLIT_RETRIES), "then the policy's pause");
        assert!(!split_again(true, 0, 0), "nobody said yes: held, not split");
        assert!(!split_again(false, 2, 0), "not woken: a timer's tick");
    }
}
