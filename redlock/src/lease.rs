//! Keeping a lock alive while work runs, and saying when it ends.

use crate::timing;
use std::fmt;
use std::future::Future;
use std::sync::Arc;
use std::time::{Duration, Instant};

use tokio::sync::{oneshot, watch};
use tokio::task::JoinHandle;

use crate::clock;
use crate::error::{Error, ErrorKind, Result};
use crate::guard::Guard;
use crate::tasks::Tasks;

/// A handle on the lease of a lock kept alive in the background (the time-limited hold
/// that extensions renew): its validity, and whether it is still held.
///
/// `Clone + Send + Sync + 'static`: hand it to every task that does the protected work, and
/// have them stop when [`lost()`](Lease::lost) completes (`tokio::select!` on it).
#[derive(Clone)]
pub struct Lease {
    resource: Arc<str>,
    token: Arc<str>,
    fence: Option<u64>,
    status: watch::Receiver<Status>,
}

#[derive(Clone, Debug)]
struct Status {
    deadline: Instant,
    end: Option<End>,
    /// Why the lease ends at its deadline, once the extender stopped extending it.
    ends_because: Option<&'static str>,
    /// The last extension that failed without ending the hold (too few nodes answered):
    /// if the validity runs out next, its nodes' outcomes say why.
    failed: Option<Error>,
}

/// Why a lease is no longer held.
#[derive(Clone, Debug)]
enum End {
    /// Lost: an extension found it gone, or the maximum hold time was reached.
    Lost(Error),
    /// Given up: released, or its [`AutoLock`] dropped.
    GivenUp(&'static str),
}

impl fmt::Debug for Lease {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("Lease")
            .field("resource", &self.resource)
            .field("validity", &self.validity())
            .field("valid", &self.is_valid())
            .finish()
    }
}

impl Lease {
    /// The resource name.
    pub fn resource(&self) -> &str {
        &self.resource
    }

    /// The lock's token: the random value that identifies its hold on the nodes (not the
    /// fencing token).
    pub fn token(&self) -> &str {
        &self.token
    }

    /// The lock's fencing token, if it was taken `.fenced()` (a [`Lock`](crate::Lock),
    /// [`WriteLock`](crate::WriteLock) or [`Permit`](crate::Permit)): the same for the whole
    /// hold (extensions keep it), larger than that of any earlier grant it is ordered with;
    /// `None` otherwise (and always for the kinds that cannot be fenced). Pass it with every
    /// write the lock protects; see [`Lock::fencing_token`](crate::Lock::fencing_token).
    pub fn fencing_token(&self) -> Option<u64> {
        self.fence
    }

    /// What remains of the current lease: extensions push it back; zero once the lock is
    /// no longer held.
    pub fn validity(&self) -> Duration {
        let status = self.status.borrow();
        match status.end {
            Some(_) => Duration::ZERO,
            None => status.deadline.saturating_duration_since(clock::now()),
        }
    }

    /// The instant at which the current validity ends (extensions push it back); once the
    /// lock is lost, no later than the moment that was found. On [`Instant`]'s clock as of
    /// this call: compare it with `Instant::now()` soon after. Where the validity counts
    /// the time the machine spends suspended (Linux, Android: see the crate's "What is
    /// guaranteed"), a suspend moves it earlier.
    pub fn deadline(&self) -> Instant {
        clock::on_std(self.status.borrow().deadline)
    }

    /// Whether the lock is still held by this client's account, without asking the nodes:
    /// not lost, not given up, and its validity not over. The same check as the guards'
    /// `is_valid()`; the guards' `check_held()` asks the nodes.
    pub fn is_valid(&self) -> bool {
        self.end().is_none()
    }

    /// Whether the lock is no longer held (lost, or given up): the opposite of
    /// [`is_valid`](Lease::is_valid).
    pub fn is_lost(&self) -> bool {
        !self.is_valid()
    }

    /// Completes when the lock stops being held, at its validity deadline at the latest,
    /// whatever an extension in flight is doing: an extension found it gone from too many
    /// nodes, the validity ran out before an extension landed (nodes unreachable, a paused
    /// process), the maximum hold time was reached, or the lock was given up (released,
    /// or its [`AutoLock`] dropped, or the work of
    /// [`with_lock`](crate::Redlock::with_lock) ended). The error says which; its kind is
    /// [`ErrorKind::NotHeld`] unless an extension failed for another reason.
    pub async fn lost(&self) -> Error {
        let mut status = self.status.clone();
        loop {
            let deadline = {
                let current = status.borrow_and_update();
                if let Some(end) = &current.end {
                    return end.error(&self.resource);
                }
                current.deadline
            };
            tokio::select! {
                changed = status.changed() => if changed.is_err() {
                    return End::GivenUp("the lock was given up").error(&self.resource);
                },
                // Wakes now and then to notice a suspend that ate the lease.
                () = clock::sleep_until(deadline) => {
                    // Over by the clock, unless an extension landed meanwhile.
                    if let Some(end) = self.end() {
                        return end.error(&self.resource);
                    }
                }
            }
        }
    }

    /// Why the last extension failed, while extensions are being retried (too few nodes
    /// answered: each node's outcome is in the error); `None` before any failed and once one
    /// succeeded again. Says why a validity is running out before [`lost()`](Lease::lost)
    /// completes (whose error then carries the same outcomes).
    pub fn extension_failure(&self) -> Option<Error> {
        self.status.borrow().failed.clone()
    }

    /// Why the lock is no longer held, if it is not.
    fn end(&self) -> Option<End> {
        let status = self.status.borrow();
        match &status.end {
            Some(end) => Some(end.clone()),
            None if clock::now() >= status.deadline => Some(End::Lost(ran_out(
                status.ends_because.unwrap_or(RAN_OUT),
                &self.resource,
                status.failed.as_ref(),
            ))),
            None => None,
        }
    }
}

/// Why a lease whose extensions kept failing ended.
const RAN_OUT: &str = "the validity ran out before an extension landed";

/// The error of a lease whose validity ran out (`why`), with the nodes' outcomes of the last
/// extension that `failed`, if one did: what an operator acts on (a node down, timed out,
/// refusing the login).
fn ran_out(why: &str, resource: &str, failed: Option<&Error>) -> Error {
    match failed {
        Some(failed) => failed.retold(ErrorKind::NotHeld, why, "the last extension"),
        None => Error::local(ErrorKind::NotHeld, why, resource),
    }
}

impl End {
    fn error(&self, resource: &str) -> Error {
        match self {
            Self::Lost(err) => err.clone(),
            Self::GivenUp(why) => Error::local(ErrorKind::NotHeld, *why, resource),
        }
    }
}

/// A lock that keeps itself alive: extended in the background about every third of its
/// TTL while it is held, with a lost-lock signal ([`lost()`](AutoLock::lost)).
///
/// Works for every kind: `Lock::auto_extend()` gives an `AutoLock<Lock>`,
/// `ReadLock::auto_extend()` an `AutoLock<ReadLock>`, and so on. Call
/// [`release()`](AutoLock::release) when done. Dropping it stops the extension, ends its
/// [`Lease`]s at once, and releases the lock in the background.
#[must_use = "dropping an AutoLock stops its extension and releases the lock in the background"]
pub struct AutoLock<G: Guard> {
    lease: Lease,
    status: Arc<watch::Sender<Status>>,
    stop: Option<oneshot::Sender<()>>,
    extender: Option<JoinHandle<Option<G>>>,
}

impl<G: Guard> fmt::Debug for AutoLock<G> {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("AutoLock").field("lease", &self.lease).finish_non_exhaustive()
    }
}

impl<G: Guard> AutoLock<G> {
    pub(crate) fn start(guard: G, tasks: &Arc<Tasks>, max_hold: Option<Duration>) -> Self {
        let initial = Status {
            deadline: guard.lease_deadline(),
            end: None,
            ends_because: None,
            failed: None,
        };
        let (status, receiver) = watch::channel(initial);
        let status = Arc::new(status);
        let lease = Lease {
            resource: guard.resource().into(),
            token: guard.token().into(),
            fence: guard.fence(),
            status: receiver,
        };
        let (stop, stopped) = oneshot::channel();
        let max_until = max_hold.and_then(|max| clock::now().checked_add(max));
        let closed = tasks.closed();
        let extend = extend_while_held(guard, max_until, status.clone(), stopped, closed);
        // On the client's own thread: an extender on the caller's runtime would die with it, its
        // guard released while the lease still says held.
        let extender = tasks.spawn_own(extend);
        if extender.is_none() {
            let err =
                Error::local(ErrorKind::Config, "no runtime for the extender", lease.resource());
            status.send_modify(|s| s.end = Some(End::Lost(err)));
        }
        Self { lease, status, stop: Some(stop), extender }
    }

    /// A handle on the lease for the tasks doing the work.
    pub fn lease(&self) -> Lease {
        self.lease.clone()
    }

    /// What remains of the current lease.
    pub fn validity(&self) -> Duration {
        self.lease.validity()
    }

    /// Completes when the lock stops being held; see [`Lease::lost`].
    pub async fn lost(&self) -> Error {
        self.lease.lost().await
    }

    /// Stops the extension (waiting for one in flight, never racing it) and releases the
    /// lock.
    ///
    /// # Errors
    /// The loss if the lock was lost at any point (its validity ran out, or an extension
    /// found it gone), else the release's own error (see [`Lock::release`](crate::Lock::release)).
    pub async fn release(mut self) -> Result<()> {
        let lost = self.lease.end();
        let guard = self.stop_extending().await;
        self.status.send_modify(|s| s.end = s.end.take().or(Some(End::GivenUp("released"))));
        let released = match guard {
            Some(guard) => guard.release().await,
            None => {
                Err(Error::local(ErrorKind::NotHeld, "the extender stopped", self.lease.resource()))
            }
        };
        match lost {
            Some(end) => Err(end.error(self.lease.resource())),
            None => released,
        }
    }

    /// Stops the extension (waiting for one in flight, never racing it) and keeps the lock
    /// for `hold` from now without releasing it; see [`Lock::keep_for`](crate::Lock::keep_for).
    ///
    /// # Errors
    /// The loss if the lock was lost at any point (then nothing is kept), else the
    /// extension's own error.
    pub async fn keep_for(mut self, hold: Duration) -> Result<()> {
        let lost = self.lease.end();
        let guard = self.stop_extending().await;
        self.status.send_modify(|s| s.end = s.end.take().or(Some(End::GivenUp("kept"))));
        match (lost, guard) {
            (Some(end), _) => Err(end.error(self.lease.resource())),
            (None, Some(guard)) => guard.keep_for(hold).await,
            (None, None) => {
                Err(Error::local(ErrorKind::NotHeld, "the extender stopped", self.lease.resource()))
            }
        }
    }

    async fn stop_extending(&mut self) -> Option<G> {
        if let Some(stop) = self.stop.take() {
            // An extender that already ended (lock lost) has dropped its receiver.
            let _ = stop.send(());
        }
        self.extender.take()?.await.ok().flatten()
    }
}

/// `fencing_token()` on the auto-extended kinds that can be fenced.
macro_rules! fenced_auto_lock {
    ($($kind:ident),*) => {$(
        impl AutoLock<crate::$kind> {
            #[doc = concat!("The fencing token, if the ", stringify!($kind), " was taken `.fenced()`; see")]
            #[doc = concat!("[`", stringify!($kind), "::fencing_token`](crate::", stringify!($kind), "::fencing_token).")]
            pub fn fencing_token(&self) -> Option<u64> {
                self.lease.fencing_token()
            }
        }
    )*};
}

fenced_auto_lock!(Lock, WriteLock, Permit);

impl<G: Guard> Drop for AutoLock<G> {
    fn drop(&mut self) {
        // Whoever holds a lease learns at once that the lock is given up.
        self.status.send_modify(|s| {
            s.end.get_or_insert(End::GivenUp("the lock was given up: its AutoLock was dropped"));
        });
        // Aborting drops the guard inside the task, which releases it in the background.
        if let Some(extender) = self.extender.take() {
            extender.abort();
        }
    }
}

/// Runs `work` while `guard` is kept alive, then releases it; `Ok` only when the lock was
/// held from the grant until `work` returned.
pub(crate) async fn run_with<G, F, Fut, T>(guard: G, tasks: &Arc<Tasks>, work: F) -> Result<T>
where
    G: Guard,
    F: FnOnce(Lease) -> Fut,
    Fut: Future<Output = T>,
{
    let auto = AutoLock::start(guard, tasks, None);
    let lease = auto.lease();
    let output = work(lease.clone()).await;
    // By the clock, before anything else: a process paused past its lease (a blocking call
    // on a current-thread runtime) sees it here, whatever the extender managed to do.
    if let Some(end) = lease.end() {
        drop(auto);
        return Err(end.error(lease.resource()));
    }
    let released = auto.release().await;
    // The lease's last deadline, extensions included (read after the release: one still
    // in flight when the work ended may have pushed it back).
    let ran_out = std::time::Instant::now() >= lease.deadline();
    match released {
        Ok(()) => Ok(output),
        // The lock was valid until the work ended; the keys expire with their lease. Too few
        // nodes answered, or too many refused the client (a password rotated meanwhile).
        Err(err) if matches!(err.kind(), ErrorKind::Unavailable | ErrorKind::Denied) => {
            tracing::warn!(target: "redlock", %err, "release after a held run failed; the keys expire");
            Ok(output)
        }
        // The lease ran out while the release was on its way: it found keys that expired
        // after the work ended, or a next holder's, which says nothing of the work.
        Err(err) if err.kind() == ErrorKind::NotHeld && ran_out => {
            tracing::warn!(target: "redlock", %err, "the lease ran out during the release after a held run");
            Ok(output)
        }
        Err(err) => Err(err),
    }
}

/// The extender: renews the lock about every third of its TTL while it is held,
/// retrying faster as the deadline nears when an extension fails, and reports the loss.
/// Gives the guard back when stopped; releases it itself when the client shuts down.
async fn extend_while_held<G: Guard>(
    guard: G,
    max_until: Option<Instant>,
    status: Arc<watch::Sender<Status>>,
    stop: oneshot::Receiver<()>,
    closed: impl Future<Output = ()>,
) -> Option<G> {
    let extending = extend(guard, max_until, status.clone(), stop);
    tokio::pin!(extending);
    tokio::select! {
        biased;
        guard = &mut extending => Some(guard),
        () = closed => {
            status.send_modify(|s| s.end = s.end.take().or(Some(End::GivenUp("the client shut down"))));
            None
        }
    }
}

async fn extend<G: Guard>(
    mut guard: G,
    max_until: Option<Instant>,
    status: Arc<watch::Sender<Status>>,
    mut stop: oneshot::Receiver<()>,
) -> G {
    let ttl = guard.ttl();
    let lose = |err: Error| {
        let reason = err.kind().as_str();
        status.send_modify(|s| {
            if s.end.is_none() {
                crate::telemetry::lost(reason);
            }
            s.end = s.end.take().or(Some(End::Lost(err)));
            s.deadline = s.deadline.min(clock::now());
        });
    };
    loop {
        let due = next_extension(clock::now(), guard.lease_deadline(), ttl);
        tokio::select! {
            biased;
            _ = &mut stop => return guard,
            () = clock::sleep_until(due) => {}
        }
        let now = clock::now();
        if now >= guard.lease_deadline() {
            let failed = status.borrow().failed.clone();
            lose(ran_out(RAN_OUT, guard.resource(), failed.as_ref()));
            return guard;
        }
        let lease = match max_until {
            Some(until) => until.saturating_duration_since(now).min(ttl),
            None => ttl,
        };
        if lease < ttl / 3 {
            // Too little of the allowed hold left to extend into: let the lease run out.
            let why = "the maximum hold time was reached";
            status.send_modify(|s| s.ends_because = Some(why));
            tokio::select! {
                biased;
                _ = &mut stop => return guard,
                () = clock::sleep_until(guard.lease_deadline()) => {}
            }
            lose(Error::local(ErrorKind::NotHeld, why, guard.resource()));
            return guard;
        }
        match guard.extend(lease).await {
            Ok(()) => status.send_modify(|s| {
                s.deadline = guard.lease_deadline();
                s.failed = None;
            }),
            Err(err) if err.kind() == ErrorKind::NotHeld => {
                lose(err);
                return guard;
            }
            Err(err) => {
                tracing::warn!(target: "redlock", %err, "extension failed; retrying while valid");
                // Not a change a waiter of the lease needs to see.
                status.send_if_modified(|s| {
                    s.failed = Some(err);
                    false
                });
            }
        }
    }
}

/// When to extend next: a third of the lease after a success; after a failure, half of
/// what remains, so retries come faster as the deadline nears (never more often than
/// every [`timing::EXTEND_MIN_RETRY`], never after the deadline).
fn next_extension(now: Instant, deadline: Instant, ttl: Duration) -> Instant {
    let remaining = deadline.saturating_duration_since(now);
    let wait = (ttl / 3).min(remaining / 2).max(timing::EXTEND_MIN_RETRY).min(remaining);
    now + wait
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn extends_every_third_of_the_lease_when_healthy() {
        let now = Instant::now();
        let ttl = Duration::from_secs(9);
        let due = next_extension(now, now + Duration::from_millis(8900), ttl);
        assert_eq!(due - now, Duration::from_secs(3));
    }

    #[test]
    fn retries_faster_as_the_deadline_nears_but_never_after_it() {
        let now = Instant::now();
        let ttl = Duration::from_secs(9);
        assert_eq!(
            next_extension(now, now + Duration::from_secs(2), ttl) - now,
            Duration::from_secs(1)
        );
        assert_eq!(
            next_extension(now, now + Duration::from_millis(15), ttl) - now,
            timing::EXTEND_MIN_RETRY
        );
        assert_eq!(
            next_extension(now, now + Duration::from_millis(4), ttl) - now,
            Duration::from_millis(4)
        );
        assert_eq!(next_extension(now, now, ttl), now);
    }

    fn lease(deadline: Instant) -> (Lease, watch::Sender<Status>) {
        let (sender, status) =
            watch::channel(Status { deadline, end: None, ends_because: None, failed: None });
        (Lease { resource: "r".into(), token: "t".into(), fence: None, status }, sender)
    }

    #[tokio::test(start_paused = true)]
    async fn lost_fires_at_the_deadline_whatever_the_extender_does() {
        let deadline = clock::now() + Duration::from_secs(1);
        let (lease, _sender) = lease(deadline);
        let err = lease.lost().await;
        assert_eq!(err.kind(), ErrorKind::NotHeld);
        assert!(clock::now() >= deadline);
        assert!(lease.is_lost());
    }

    #[tokio::test(start_paused = true)]
    async fn an_extension_pushes_the_signal_back_and_a_give_up_fires_it() {
        let (lease, sender) = lease(clock::now() + Duration::from_secs(1));
        let later = clock::now() + Duration::from_secs(5);
        sender.send_modify(|s| s.deadline = later);
        let watcher = tokio::spawn({
            let lease = lease.clone();
            async move { lease.lost().await }
        });
        tokio::time::sleep(Duration::from_secs(2)).await;
        assert!(!watcher.is_finished() && lease.is_valid());
        sender.send_modify(|s| s.end = Some(End::GivenUp("released")));
        let err = watcher.await.unwrap();
        assert!(err.to_string().contains("released"), "{err}");
        assert_eq!(lease.validity(), Duration::ZERO);
    }

    #[test]
    fn a_suspend_shortens_the_validity_by_its_length() {
        let (lease, _sender) = lease(clock::now() + Duration::from_secs(60));
        clock::suspend_here(Duration::from_secs(20));
        let validity = lease.validity();
        assert!(validity <= Duration::from_secs(40), "{validity:?}");
        assert!(validity > Duration::from_secs(30), "{validity:?}");
        assert!(lease.is_valid());
    }

    #[tokio::test]
    async fn a_suspend_past_the_deadline_ends_the_lease_soon_after_the_machine_wakes() {
        let (lease, _sender) = lease(clock::now() + Duration::from_secs(60));
        let watcher = tokio::spawn({
            let lease = lease.clone();
            async move { lease.lost().await }
        });
        tokio::time::sleep(Duration::from_millis(20)).await;
        assert!(!watcher.is_finished() && lease.is_valid());
        let woke = Instant::now();
        clock::suspend_here(Duration::from_secs(61));
        assert!(lease.is_lost(), "lost by the clock at once");
        assert_eq!(lease.validity(), Duration::ZERO);
        let err = tokio::time::timeout(Duration::from_secs(10), watcher).await.unwrap().unwrap();
        assert_eq!(err.kind(), ErrorKind::NotHeld);
        // Generous for a loaded machine; without the wake-ups it would wait a minute.
        let noticed = woke.elapsed();
        assert!(noticed < crate::timing::WAKE_CHECK + Duration::from_secs(3), "{noticed:?}");
    }

    /// Measures what watching leases costs while nothing happens: 1000 `lost()` futures on
    /// one thread for five seconds, each waking every `timing::WAKE_CHECK` to notice a
    /// suspend (run with `--ignored --nocapture`, Linux).
    #[tokio::test]
    #[ignore = "a measurement, not a check"]
    async fn cost_of_watching_leases_for_a_suspend() {
        fn cpu() -> Duration {
            let stat = std::fs::read_to_string("/proc/thread-self/schedstat").unwrap();
            Duration::from_nanos(stat.split_whitespace().next().unwrap().parse().unwrap())
        }
        const LEASES: u32 = 1000;
        const FOR: Duration = Duration::from_secs(5);
        let (lease, _sender) = lease(clock::now() + Duration::from_secs(3600));
        let watchers: Vec<_> = (0..LEASES)
            .map(|_| {
                let lease = lease.clone();
                tokio::spawn(async move { lease.lost().await })
            })
            .collect();
        tokio::task::yield_now().await;
        let before = cpu();
        tokio::time::sleep(FOR).await;
        let used = cpu() - before;
        let wakes = LEASES
            * u32::try_from((FOR.as_millis() / crate::timing::WAKE_CHECK.as_millis()).max(1))
                .unwrap();
        println!(
            "{LEASES} watched leases for {FOR:?}: {used:?} of CPU ({:.2}% of a core), {:?} per wake",
            used.as_secs_f64() / FOR.as_secs_f64() * 100.0,
            used / wakes
        );
        watchers.iter().for_each(|w| w.abort());
    }
}
