//! This client's own waiters for an exclusive hold take turns in one local line per
//! request, in front of the distributed attempt.
//!
//! Waits for the same exclusive request (the same kind, the same keys, and an intent
//! recorded by all or none) join one line, first come first served. Only the first in
//! line attempts on its own; a waiter behind it counts each attempt of the line that
//! started since its own previous tick as one of its own (the same request: its attempt
//! could only fail where that one did, and would do nothing that one did not). Once one of
//! them holds the lock, the line's turn is that hold's until it is released, found gone or
//! past its validity; then the first in line is woken at once, without a notification or a
//! timer, and makes a normal attempt: the release still frees the key on the nodes, so
//! other clients' waiters, woken by its notification, race for it as before.
//!
//! Shares (read locks, reentrant holds) and permits do not queue: they do not exclude one
//! another, so one waiter's refusal says nothing about the next one's chances, and a line
//! would only make them wait for each other. Different exclusive requests on one key (a
//! writer that records an intent and one that does not, a lock of the key alone and one of
//! it with others) get lines of their own: one's attempts cannot stand for the other's.
//!
//! Nothing here is needed for safety (the nodes decide every grant): a line only spares
//! the nodes attempts that could only fail, and the split votes of several waiters of one
//! client woken by one release. So a line never holds a waiter back for longer than the
//! waiter itself would have waited (but for [`timing::PASSED_TICK_MIN_PAUSE`] between its
//! ticks where its policy pauses less, see `wait`): a waiter's tick for which no attempt
//! of the line has started since its previous one asks the first for one, and takes its
//! place if none starts within [`timing::STALL`] (its runtime blocked, its future no
//! longer polled), or at once if the first left the line; a stalled first is then passed
//! over (hand-ons skip it) until its next tick, so that a future kept without being polled
//! costs the line one stall, not one per release; an attempt of the line that failed for
//! another reason than the key being held (a lease too short for the round, a fencing
//! round that failed) counts for no one else.

use crate::timing;
use std::collections::{HashMap, VecDeque};
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::{Arc, Mutex, MutexGuard, PoisonError};
use std::time::{Duration, Instant};

use tokio::sync::Notify;

use crate::error::{Error, ErrorKind};

use super::protocol::{Keys, Protocol};

/// What a waiter's attempts ask the nodes for, as far as another waiter's attempts could
/// do it in their place: waits of the same request share a line.
#[derive(Clone, Debug, PartialEq, Eq, Hash)]
pub(crate) struct Request {
    /// The kind, as errors name it: kinds answer differently on one key.
    kind: &'static str,
    /// Every key of the hold.
    keys: Keys,
    /// Whether the hold excludes every other.
    exclusive: bool,
    /// Whether each attempt also records an intent that holds others back while the
    /// waiter waits (a writer with the default priority).
    intent: bool,
}

impl Request {
    /// The request of `proto`'s attempts.
    pub(crate) fn of<P: Protocol>(proto: &P) -> Self {
        Self {
            kind: proto.kind(),
            keys: proto.keys().clone(),
            exclusive: proto.is_exclusive(),
            intent: proto.records_intent(),
        }
    }

    /// The request of attempts that may take any of several holds whose releases are all
    /// published on `key`'s channel (a counting lock's slots), none excluding the others.
    pub(crate) fn shared(kind: &'static str, key: Arc<str>) -> Self {
        Self { kind, keys: smallvec::smallvec![key], exclusive: false, intent: false }
    }

    /// The request of a plain lock of `key`, for the engine's unit tests.
    #[cfg(test)]
    pub(crate) fn exclusive(key: &str) -> Self {
        Self { kind: "lock", keys: smallvec::smallvec![key.into()], exclusive: true, intent: false }
    }

    /// Every key of the hold.
    pub(crate) fn keys(&self) -> &Keys {
        &self.keys
    }

    /// Whether waits for it queue: only holds that exclude every other do.
    pub(crate) fn queues(&self) -> bool {
        self.exclusive
    }
}

/// The lines of one client.
#[derive(Default)]
pub(crate) struct Lines {
    lines: Mutex<HashMap<Request, Arc<Line>>>,
}

#[derive(Default)]
struct Line {
    state: Mutex<State>,
    /// Told whenever an attempt of the line starts or ends, or the turn changes hands.
    progress: Notify,
}

#[derive(Default)]
struct State {
    waiters: VecDeque<Arc<Waiter>>,
    /// The hold of this client that has the turn, if one was granted to a waiter of the
    /// line while others waited.
    holder: Option<Holder>,
    /// How many attempts of the line started.
    started: u64,
    /// How many are in flight, and when the last one started.
    in_flight: usize,
    started_at: Option<Instant>,
    /// The last attempt that ended (its number) and what it found.
    ended: (u64, Outcome),
    /// When the last one ended, and how long it took.
    ended_at: Option<Instant>,
    took: Duration,
}

struct Holder {
    token: Arc<str>,
    /// Its validity: the turn is free after it, whatever became of the hold.
    until: Instant,
}

/// What an attempt of the line found, as the waiters behind it see it.
#[derive(Clone, Debug, Default)]
pub(crate) enum Outcome {
    /// The keys held by others on every node that answered: the same for every waiter.
    Held(Error),
    /// Granted to the waiter that made it: the turn is that hold's.
    Granted,
    /// Anything else (cancelled, refused for a reason of its own): counts for no one else.
    #[default]
    Other,
}

#[derive(Default)]
struct Waiter {
    /// Set when the waiter should attempt at once: the turn came to it (a release handed
    /// on), or a waiter behind it asked for an attempt.
    called: AtomicBool,
    notify: Notify,
    /// Set when a waiter behind took its place because it did not react (its future no
    /// longer polled, its runtime blocked); cleared at its next tick. Until then it keeps
    /// its place but is passed over: the turn goes to the first waiter that is not.
    stalled: AtomicBool,
}

impl Waiter {
    fn call(&self) {
        self.called.store(true, Ordering::Release);
        self.notify.notify_one();
    }
}

/// What a waiter in line does at its tick.
#[derive(Debug)]
pub(crate) enum Turn {
    /// Attempt: it is first in line (or alone), or the first one stalled.
    Attempt,
    /// A hold of this client has the turn until the given instant: an attempt could only
    /// fail. The tick is paced like one (the line's last attempt took the given time).
    Held(Instant, Duration),
    /// Count the line's attempt numbered `.0` (started since its last tick, or asked for
    /// now) as its own.
    Follow(u64),
}

impl Lines {
    /// Joins the line of `request`, behind this client's waiters already in it.
    pub(crate) fn join(self: &Arc<Self>, request: &Request) -> Ticket {
        let line = lock(&self.lines).entry(request.clone()).or_default().clone();
        let waiter = Arc::new(Waiter::default());
        let seen = {
            let mut state = lock(&line.state);
            state.waiters.push_back(waiter.clone());
            state.started
        };
        Ticket { lines: self.clone(), request: request.clone(), line, waiter, seen }
    }

    /// Records that the hold `proto` is valid until `until` (extended), if it has its
    /// line's turn.
    pub(crate) fn extended<P: Protocol>(&self, proto: &P, until: Instant) {
        if let Some(request) = self.watched(proto) {
            self.with_holder(&request, proto.token(), |state| {
                if let Some(holder) = &mut state.holder {
                    holder.until = until;
                }
            });
        }
    }

    /// Records that the hold `proto` is over (released, dropped, found gone): if it had its
    /// line's turn, the first waiter in line is called at once.
    pub(crate) fn released<P: Protocol>(&self, proto: &P) {
        if let Some(request) = self.watched(proto) {
            self.hand_on(&request, proto.token());
        }
    }

    /// The request of `proto` if some line may be waiting for it; the common case, where no
    /// one waits, builds no request.
    fn watched<P: Protocol>(&self, proto: &P) -> Option<Request> {
        let waiting = proto.is_exclusive() && !lock(&self.lines).is_empty();
        waiting.then(|| Request::of(proto))
    }

    fn hand_on(&self, request: &Request, token: &str) {
        self.with_holder(request, token, |state| {
            state.holder = None;
            if let Some(first) = first_ready(&state.waiters) {
                first.call();
            }
        });
    }

    fn with_holder(&self, request: &Request, token: &str, change: impl FnOnce(&mut State)) {
        let mut lines = lock(&self.lines);
        let Some(line) = lines.get(request).cloned() else { return };
        let mut state = lock(&line.state);
        if state.holder.as_ref().is_some_and(|holder| &*holder.token == token) {
            change(&mut state);
            if state.holder.is_none() && state.waiters.is_empty() {
                lines.remove(request);
            }
        }
        drop(state);
        line.progress.notify_waiters();
    }
}

/// A waiter's place in its line; dropping it leaves the line at once, calling the next
/// waiter if it was first.
pub(crate) struct Ticket {
    lines: Arc<Lines>,
    request: Request,
    line: Arc<Line>,
    waiter: Arc<Waiter>,
    /// The line's attempts up to this number are counted already (or began before it
    /// joined).
    seen: u64,
}

impl Ticket {
    /// What to do at this tick; `stalled` when the first waiter did not start the attempt
    /// asked of it, so that this one takes its place.
    pub(crate) fn turn(&mut self, stalled: bool) -> Turn {
        let mut state = lock(&self.line.state);
        // Ticking: whatever stall it was passed over for is over.
        self.waiter.stalled.store(false, Ordering::Release);
        if let Some(holder) = &state.holder {
            if crate::clock::now() < holder.until {
                return Turn::Held(holder.until, state.took);
            }
            // Past its validity (a guard forgotten, a holder gone quiet): free.
            state.holder = None;
        }
        if stalled {
            // The first did not react: it is passed over until its next tick, so that
            // the next release hands the turn on to a waiter that reacts (a future kept
            // and never polled again would otherwise cost every hand-on a stall).
            if let Some(first) = first_ready(&state.waiters)
                && !Arc::ptr_eq(first, &self.waiter)
            {
                first.stalled.store(true, Ordering::Release);
            }
            state.waiters.retain(|waiter| !Arc::ptr_eq(waiter, &self.waiter));
            state.waiters.push_front(self.waiter.clone());
        }
        let first =
            first_ready(&state.waiters).is_none_or(|first| Arc::ptr_eq(first, &self.waiter));
        if first {
            return Turn::Attempt;
        }
        if state.started > self.seen {
            // One started since this waiter's last tick: it counts for this one too.
            return Turn::Follow(state.started);
        }
        if let Some(first) = first_ready(&state.waiters) {
            first.call();
        }
        Turn::Follow(state.started + 1)
    }

    /// Waits for the outcome of the line's attempt `number`, or `None` if it has not
    /// started within [`timing::STALL`] or the attempt in flight has not ended within `patience`
    /// of its start (the waiter making it stalled), or if this waiter is first now (the one
    /// in front left without a grant, its call handed to this one).
    /// An outcome other than [`Outcome::Held`] or [`Outcome::Granted`] counts for no one
    /// else.
    pub(crate) async fn follow(&mut self, number: u64, patience: Duration) -> Option<Outcome> {
        let asked = crate::clock::monotonic();
        loop {
            let progress = self.line.progress.notified();
            tokio::pin!(progress);
            progress.as_mut().enable();
            {
                let state = lock(&self.line.state);
                if state.ended.0 >= number {
                    self.seen = self.seen.max(number);
                    return Some(state.ended.1.clone());
                }
                if state.holder.is_some() {
                    // Granted to another waiter (whose outcome a later attempt replaced).
                    self.seen = self.seen.max(number);
                    return Some(Outcome::Granted);
                }
                if state.in_flight == 0
                    && first_ready(&state.waiters).is_some_and(|w| Arc::ptr_eq(w, &self.waiter))
                {
                    // No one in front makes the attempt: this waiter makes it now, which
                    // uses the call handed to it.
                    self.waiter.called.store(false, Ordering::Release);
                    return None;
                }
                // Idle since it was asked (or since its last attempt ended, if later).
                let now = crate::clock::monotonic();
                let since = |at: Instant| now.saturating_duration_since(at);
                let idle = since(state.ended_at.map_or(asked, |ended| ended.max(asked)));
                let stalled = match state.in_flight {
                    0 => state.started < number && idle >= timing::STALL,
                    _ => state.started_at.is_some_and(|started| since(started) >= patience),
                };
                if stalled {
                    return None;
                }
            }
            let _ = tokio::time::timeout(timing::STALL, progress).await;
        }
    }

    /// Records that this waiter starts an attempt; the returned value records its end
    /// (as [`Outcome::Other`] unless told otherwise, as when the attempt is cancelled).
    pub(crate) fn attempting(&mut self) -> Attempt<'_> {
        let number = {
            let mut state = lock(&self.line.state);
            state.started += 1;
            state.in_flight += 1;
            state.started_at = Some(crate::clock::monotonic());
            state.started
        };
        self.seen = number;
        self.line.progress.notify_waiters();
        let started = crate::clock::monotonic();
        Attempt { line: &self.line, number, outcome: Outcome::Other, started }
    }

    /// Whether a release or a waiter behind called this one since it last looked.
    pub(crate) fn called(&self) -> bool {
        self.waiter.called.swap(false, Ordering::AcqRel)
    }

    /// Completes when this waiter is called (see [`Ticket::called`]).
    pub(crate) async fn calls(&self) {
        loop {
            let notified = self.waiter.notify.notified();
            tokio::pin!(notified);
            notified.as_mut().enable();
            if self.waiter.called.load(Ordering::Acquire) {
                return;
            }
            notified.await;
        }
    }

    /// Gives the line's turn to the hold `token` this waiter was granted, valid until
    /// `until`, if other waiters wait for it (with none, there is no one to hold back).
    pub(crate) fn granted(self, token: &str, until: Instant) {
        let mut state = lock(&self.line.state);
        let number = state.started;
        state.ended = (number, Outcome::Granted);
        if state.waiters.iter().any(|waiter| !Arc::ptr_eq(waiter, &self.waiter)) {
            state.holder = Some(Holder { token: token.into(), until });
        }
        drop(state);
        self.line.progress.notify_waiters();
    }

    /// The error of a tick let pass while a hold of this client had the turn.
    pub(crate) fn held_here(&self, resource: &str) -> Error {
        let message = "held by another lock of this client, which the waiter lets go first";
        Error::local(ErrorKind::NotAcquired, message, resource)
    }
}

impl Drop for Ticket {
    fn drop(&mut self) {
        let mut lines = lock(&self.lines.lines);
        let mut state = lock(&self.line.state);
        let was_first =
            first_ready(&state.waiters).is_some_and(|first| Arc::ptr_eq(first, &self.waiter));
        state.waiters.retain(|waiter| !Arc::ptr_eq(waiter, &self.waiter));
        if was_first
            && state.holder.is_none()
            && let Some(next) = first_ready(&state.waiters)
        {
            // A call it did not use, or the turn itself: the next one attempts now.
            next.call();
        }
        if state.waiters.is_empty() && state.holder.is_none() {
            lines.remove(&self.request);
        }
        drop(state);
        self.line.progress.notify_waiters();
    }
}

/// An attempt of a line in progress; records its outcome when dropped.
pub(crate) struct Attempt<'a> {
    line: &'a Line,
    number: u64,
    outcome: Outcome,
    started: Instant,
}

impl Attempt<'_> {
    /// Records what the attempt found.
    pub(crate) fn found(mut self, outcome: Outcome) {
        self.outcome = outcome;
    }
}

impl Drop for Attempt<'_> {
    fn drop(&mut self) {
        let mut state = lock(&self.line.state);
        state.in_flight = state.in_flight.saturating_sub(1);
        let now = crate::clock::monotonic();
        state.ended_at = Some(now);
        state.took = now.saturating_duration_since(self.started);
        if state.ended.0 < self.number {
            state.ended = (self.number, std::mem::take(&mut self.outcome));
        }
        drop(state);
        self.line.progress.notify_waiters();
    }
}

/// The first waiter in line that is not passed over for a stall: the one the turn is
/// handed on to, and the one that attempts.
fn first_ready(waiters: &VecDeque<Arc<Waiter>>) -> Option<&Arc<Waiter>> {
    waiters.iter().find(|waiter| !waiter.stalled.load(Ordering::Acquire))
}

fn lock<T>(mutex: &Mutex<T>) -> MutexGuard<'_, T> {
    mutex.lock().unwrap_or_else(PoisonError::into_inner)
}

#[cfg(test)]
mod tests {
    use super::*;

    fn request(keys: &[&str], exclusive: bool, intent: bool) -> Request {
        Request {
            kind: "lock",
            keys: keys.iter().map(|&key| Arc::from(key)).collect(),
            exclusive,
            intent,
        }
    }

    #[test]
    fn the_first_waiter_attempts_and_the_next_follows_its_attempts() {
        let lines = Arc::new(Lines::default());
        let doc = request(&["doc"], true, false);
        let mut first = lines.join(&doc);
        let mut second = lines.join(&doc);
        assert!(matches!(first.turn(false), Turn::Attempt));
        // Nothing started since it joined: it asks the first for an attempt.
        assert!(matches!(second.turn(false), Turn::Follow(1)));
        assert!(first.called());
        drop(first.attempting());
        assert!(matches!(second.turn(false), Turn::Follow(1)), "the attempt asked for");
        // A stalled first waiter: the second takes its place.
        assert!(matches!(second.turn(true), Turn::Attempt));
        assert!(matches!(first.turn(false), Turn::Follow(2)));
    }

    #[test]
    fn a_granted_waiter_keeps_the_turn_until_its_release_which_calls_the_next() {
        let lines = Arc::new(Lines::default());
        let doc = request(&["doc"], true, false);
        let first = lines.join(&doc);
        let mut second = lines.join(&doc);
        let until = crate::clock::now() + Duration::from_secs(60);
        first.granted("token", until);
        assert!(matches!(second.turn(false), Turn::Held(..)));
        lines.hand_on(&doc, "another token");
        assert!(matches!(second.turn(false), Turn::Held(..)), "not the turn's holder");
        assert!(!second.called());
        lines.hand_on(&doc, "token");
        assert!(second.called(), "called at once by the release");
        assert!(matches!(second.turn(false), Turn::Attempt));
        drop(second);
        assert!(lock(&lines.lines).is_empty(), "nothing left once everyone left");
    }

    #[test]
    fn a_first_waiter_that_stalled_is_passed_over_by_hand_ons_until_its_next_tick() {
        let lines = Arc::new(Lines::default());
        let doc = request(&["doc"], true, false);
        let mut kept = lines.join(&doc);
        let mut second = lines.join(&doc);
        let mut third = lines.join(&doc);
        assert!(matches!(kept.turn(false), Turn::Attempt));
        // The kept one never starts the attempt asked of it: the second takes its place.
        assert!(matches!(second.turn(true), Turn::Attempt));
        second.granted("token", crate::clock::now() + Duration::from_secs(60));
        lines.hand_on(&doc, "token");
        assert!(!kept.called(), "passed over: it did not react");
        assert!(third.called(), "the next waiter that does");
        assert!(matches!(third.turn(false), Turn::Attempt));
        // Polled again, the kept one is back in its place, first.
        assert!(matches!(kept.turn(false), Turn::Attempt));
        assert!(matches!(third.turn(false), Turn::Follow(_)));
    }

    #[test]
    fn a_hold_past_its_validity_gives_the_turn_back() {
        let lines = Arc::new(Lines::default());
        let doc = request(&["doc"], true, false);
        let first = lines.join(&doc);
        let mut second = lines.join(&doc);
        first.granted("token", crate::clock::now());
        assert!(matches!(second.turn(false), Turn::Attempt));
    }

    #[test]
    fn a_granted_waiter_alone_keeps_no_turn() {
        let lines = Arc::new(Lines::default());
        let doc = request(&["doc"], true, false);
        lines.join(&doc).granted("token", crate::clock::now() + Duration::from_secs(60));
        assert!(lock(&lines.lines).is_empty());
    }

    #[test]
    fn only_the_same_exclusive_request_shares_a_line() {
        assert!(request(&["doc"], true, false).queues());
        assert!(!request(&["doc"], false, false).queues(), "a share does not queue");
        assert_ne!(request(&["doc"], true, true), request(&["doc"], true, false));
        assert_ne!(request(&["doc"], true, false), request(&["doc", "b"], true, false));
    }

    /// Two waiters in line for one plain lock, and the attempt the second follows.
    fn two_in_line() -> (Ticket, Ticket, u64) {
        let lines = Arc::new(Lines::default());
        let doc = request(&["doc"], true, false);
        let first = lines.join(&doc);
        let mut second = lines.join(&doc);
        let Turn::Follow(number) = second.turn(false) else { panic!("not first") };
        (first, second, number)
    }

    #[tokio::test(start_paused = true)]
    async fn a_waiter_behind_takes_the_first_ones_place_when_no_attempt_starts_within_the_stall() {
        let (first, mut second, number) = two_in_line();
        let asked = tokio::time::Instant::now();
        // The first waiter is never polled again (its runtime blocked, say).
        assert!(second.follow(number, Duration::from_secs(60)).await.is_none());
        assert_eq!(asked.elapsed(), timing::STALL);
        assert!(matches!(second.turn(true), Turn::Attempt), "its place");
        drop(first);
    }

    #[tokio::test(start_paused = true)]
    async fn a_waiter_behind_attempts_at_once_when_the_first_leaves_without_attempting() {
        let (first, mut second, number) = two_in_line();
        let asked = tokio::time::Instant::now();
        let leaves = async {
            tokio::time::sleep(Duration::from_millis(10)).await;
            drop(first);
        };
        let (followed, ()) = tokio::join!(second.follow(number, Duration::from_secs(60)), leaves);
        assert!(followed.is_none(), "no attempt to follow");
        assert_eq!(asked.elapsed(), Duration::from_millis(10), "not after a stall");
        assert!(!second.called(), "the call it was handed is the attempt it makes now");
        assert!(matches!(second.turn(true), Turn::Attempt));
    }

    #[tokio::test(start_paused = true)]
    async fn a_waiter_behind_follows_an_attempt_for_its_patience_then_attempts_itself() {
        let lines = Arc::new(Lines::default());
        let doc = request(&["doc"], true, false);
        let patience = Duration::from_millis(150);
        let attempt = |mut first: Ticket, took: u64| async move {
            let attempt = first.attempting();
            tokio::time::sleep(Duration::from_millis(took)).await;
            let held = Error::local(ErrorKind::NotAcquired, "held", "doc");
            attempt.found(Outcome::Held(held));
            first
        };
        // An attempt that ends within the patience is the follower's too.
        let first = lines.join(&doc);
        let mut second = lines.join(&doc);
        let first = tokio::spawn(attempt(first, 120));
        tokio::task::yield_now().await;
        let Turn::Follow(number) = second.turn(false) else { panic!("not behind") };
        assert!(matches!(second.follow(number, patience).await, Some(Outcome::Held(_))));
        drop(first.await.unwrap());
        drop(second);
        // One still in flight past it: its waiter stalled. Checked every STALL.
        let first = lines.join(&doc);
        let mut second = lines.join(&doc);
        let first = tokio::spawn(attempt(first, 10_000));
        tokio::task::yield_now().await;
        let asked = tokio::time::Instant::now();
        let Turn::Follow(number) = second.turn(false) else { panic!("not behind") };
        assert!(second.follow(number, patience).await.is_none());
        assert!(asked.elapsed() >= patience && asked.elapsed() <= patience + timing::STALL);
        first.abort();
    }
}
