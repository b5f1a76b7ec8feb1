//! Keeping a lock alive while work runs, and saying when it is lost.

use std::fmt;
use std::future::Future;
use std::sync::Arc;
use std::time::{Duration, Instant};

use tokio::sync::{oneshot, watch};
use tokio::task::JoinHandle;

use crate::error::{Error, ErrorKind, Result};
use crate::lock::Lock;
use crate::redlock::Redlock;

/// The shortest pause between two extension attempts, so that a failing node set is not
/// hammered in a loop.
const MIN_RETRY: Duration = Duration::from_millis(10);

/// A view of a lock kept alive in the background: its validity, and whether it was lost.
///
/// `Clone + Send + 'static`: hand it to every task that does the protected work, and have
/// them stop when [`lost()`](Lease::lost) completes (`tokio::select!` on it).
#[derive(Clone)]
pub struct Lease {
    resource: Arc<str>,
    token: Arc<str>,
    status: watch::Receiver<Status>,
}

#[derive(Clone, Debug)]
struct Status {
    deadline: Instant,
    lost: Option<Error>,
}

impl fmt::Debug for Lease {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("Lease")
            .field("resource", &self.resource)
            .field("validity", &self.validity())
            .field("lost", &self.is_lost())
            .finish()
    }
}

impl Lease {
    /// The resource name.
    pub fn resource(&self) -> &str {
        &self.resource
    }

    /// The token stored on the nodes.
    pub fn token(&self) -> &str {
        &self.token
    }

    /// What remains of the current lease; extensions push it back, and it runs down to
    /// zero once extensions stop.
    pub fn validity(&self) -> Duration {
        self.status.borrow().deadline.saturating_duration_since(Instant::now())
    }

    /// Whether the lock was lost.
    pub fn is_lost(&self) -> bool {
        self.status.borrow().lost.is_some()
    }

    /// Completes when the lock is lost: an extension found the token gone from too many
    /// nodes, the validity ran out before an extension could land (nodes unreachable), or
    /// the maximum hold time was reached. The error says which. Never completes for a
    /// lock released on purpose.
    pub async fn lost(&self) -> Error {
        let mut status = self.status.clone();
        match status.wait_for(|s| s.lost.is_some()).await {
            Ok(status) => match &status.lost {
                Some(err) => err.clone(),
                None => unreachable_lost(&self.resource),
            },
            // The extender ended without losing the lock: it was released on purpose.
            Err(_) => std::future::pending().await,
        }
    }

    fn lost_now(&self) -> Option<Error> {
        self.status.borrow().lost.clone()
    }
}

/// `wait_for` only returns values that pass its predicate; this keeps that path total
/// without a panic.
fn unreachable_lost(resource: &str) -> Error {
    Error::local(ErrorKind::NotHeld, "the lock was lost", resource)
}

/// What the extender drives: a lock of any kind that can be renewed and released.
pub(crate) trait Renewable: Send + 'static {
    /// The resource name, for errors and the [`Lease`].
    fn resource(&self) -> &str;
    /// The token stored on the nodes, for the [`Lease`].
    fn token(&self) -> &str;
    /// The current validity deadline.
    fn deadline(&self) -> Instant;
    /// The lease of the last grant or extension: what each extension asks for.
    fn ttl(&self) -> Duration;
    /// One extension round.
    fn extend(&mut self, ttl: Duration) -> impl Future<Output = Result<()>> + Send;
    /// The release.
    fn release(self) -> impl Future<Output = Result<()>> + Send;
}

impl Renewable for Lock {
    fn resource(&self) -> &str {
        Lock::resource(self)
    }

    fn token(&self) -> &str {
        Lock::token(self)
    }

    fn deadline(&self) -> Instant {
        Lock::deadline(self)
    }

    fn ttl(&self) -> Duration {
        Lock::ttl(self)
    }

    async fn extend(&mut self, ttl: Duration) -> Result<()> {
        Lock::extend(self, ttl).await
    }

    async fn release(self) -> Result<()> {
        Lock::release(self).await
    }
}

/// A lock of any kind kept alive by a background extender: what [`AutoLock`] and the
/// read-write lock's auto guards are made of.
pub(crate) struct Keeper<L: Renewable> {
    lease: Lease,
    stop: Option<oneshot::Sender<()>>,
    extender: Option<JoinHandle<L>>,
    /// The lock itself when no extender could be started (no runtime).
    parked: Option<L>,
}

impl<L: Renewable> Keeper<L> {
    pub(crate) fn start(lock: L, max_hold: Option<Duration>) -> Self {
        let (sender, status) = watch::channel(Status { deadline: lock.deadline(), lost: None });
        let lease = Lease { resource: lock.resource().into(), token: lock.token().into(), status };
        let Ok(runtime) = tokio::runtime::Handle::try_current() else {
            let err = Error::local(
                ErrorKind::Config,
                "auto-extension needs a Tokio runtime: the lock is not extended",
                lock.resource(),
            );
            sender.send_modify(|s| s.lost = Some(err));
            return Self { lease, stop: None, extender: None, parked: Some(lock) };
        };
        let (stop, stopped) = oneshot::channel();
        let max_until = max_hold.and_then(|max| Instant::now().checked_add(max));
        let extender = runtime.spawn(extend_while_held(lock, max_until, sender, stopped));
        Self { lease, stop: Some(stop), extender: Some(extender), parked: None }
    }

    pub(crate) fn lease(&self) -> &Lease {
        &self.lease
    }

    /// Stops the extension (waiting for one in flight, never racing it) and releases the
    /// lock. Fails with the loss if the lock was lost at any point, else with the
    /// release's own error.
    pub(crate) async fn release(mut self) -> Result<()> {
        let lock = self.stop_extending().await;
        let released = match lock {
            Some(lock) => lock.release().await,
            None => {
                Err(Error::local(ErrorKind::NotHeld, "the extender stopped", self.lease.resource()))
            }
        };
        match self.lease.lost_now() {
            Some(lost) => Err(lost),
            None => released,
        }
    }

    async fn stop_extending(&mut self) -> Option<L> {
        if let Some(lock) = self.parked.take() {
            return Some(lock);
        }
        if let Some(stop) = self.stop.take() {
            // An extender that already ended (lock lost) has dropped its receiver.
            let _ = stop.send(());
        }
        self.extender.take()?.await.ok()
    }
}

impl<L: Renewable> Drop for Keeper<L> {
    fn drop(&mut self) {
        // Aborting drops the lock inside the task, which releases it in the background.
        if let Some(extender) = self.extender.take() {
            extender.abort();
        }
    }
}

/// A lock that keeps itself alive: extended in the background about every third of its
/// lease while it is held, with a lost-lock signal.
///
/// Call [`release()`](AutoLock::release) when done. Dropping it stops the extension and
/// releases the lock in the background.
#[must_use = "dropping an AutoLock stops its extension and releases the lock in the background"]
pub struct AutoLock {
    keeper: Keeper<Lock>,
}

impl fmt::Debug for AutoLock {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("AutoLock").field("lease", self.keeper.lease()).finish_non_exhaustive()
    }
}

impl AutoLock {
    pub(crate) fn start(lock: Lock, max_hold: Option<Duration>) -> Self {
        Self { keeper: Keeper::start(lock, max_hold) }
    }

    /// A handle on the lease for the tasks doing the work.
    pub fn lease(&self) -> Lease {
        self.keeper.lease().clone()
    }

    /// What remains of the current lease.
    pub fn validity(&self) -> Duration {
        self.keeper.lease().validity()
    }

    /// Completes when the lock is lost; see [`Lease::lost`].
    pub async fn lost(&self) -> Error {
        self.keeper.lease().lost().await
    }

    /// Stops the extension (waiting for one in flight, never racing it) and releases the
    /// lock. Fails with the loss if the lock was lost at any point, else with the
    /// release's own error.
    pub async fn release(self) -> Result<()> {
        self.keeper.release().await
    }
}

impl Lock {
    /// Keeps this lock alive in the background until it is released or lost.
    pub fn auto_extend(self) -> AutoLock {
        AutoLock::start(self, None)
    }

    /// Like [`auto_extend`](Lock::auto_extend), but stops extending once the lock has been
    /// held for `max_hold` (counted from this call): work that overruns it loses the lock.
    pub fn auto_extend_capped(self, max_hold: Duration) -> AutoLock {
        AutoLock::start(self, Some(max_hold))
    }
}

impl Redlock {
    /// Locks `resource` (waiting per the retry policy), runs `work` while the lock is
    /// extended in the background, and releases it when `work` returns.
    ///
    /// `work` gets a [`Lease`] to watch: when [`Lease::lost`] completes, the lock is gone
    /// and the work should stop (`tokio::select!` on it). Returns `Ok` with the work's
    /// output when the lock was held from start to end, and the loss (an [`Error`] of kind
    /// [`ErrorKind::NotHeld`] or [`ErrorKind::Unavailable`]...) when it was lost before
    /// `work` returned; the output is then dropped, since it was produced without the
    /// lock's protection. A release that reaches too few nodes after a held run is logged,
    /// not returned: the keys expire with their lease.
    ///
    /// ```no_run
    /// # async fn run(rl: redlock::Redlock) -> Result<(), redlock::Error> {
    /// let report = rl
    ///     .with_lock("nightly-report", |lease| async move {
    ///         tokio::select! {
    ///             report = build_report() => Some(report),
    ///             err = lease.lost() => {
    ///                 eprintln!("lock lost, stopping: {err}");
    ///                 None
    ///             }
    ///         }
    ///     })
    ///     .await?;
    /// # Ok(())
    /// # }
    /// # async fn build_report() -> String { String::new() }
    /// ```
    pub async fn with_lock<F, Fut, T>(&self, resource: &str, work: F) -> Result<T>
    where
        F: FnOnce(Lease) -> Fut,
        Fut: Future<Output = T>,
    {
        let auto = self.lock(resource).await?.auto_extend();
        let output = work(auto.lease()).await;
        let lease = auto.lease();
        match auto.release().await {
            Ok(()) => Ok(output),
            Err(lost) if lease.is_lost() => Err(lost),
            Err(err) => {
                tracing::warn!(target: "redlock", %err, "release after a held run failed; the keys expire");
                Ok(output)
            }
        }
    }
}

/// The extender: renews the lock about every third of its lease while it is held,
/// retrying faster as the deadline nears when an extension fails, and reports the loss.
async fn extend_while_held<L: Renewable>(
    mut lock: L,
    max_until: Option<Instant>,
    status: watch::Sender<Status>,
    mut stop: oneshot::Receiver<()>,
) -> L {
    let ttl = lock.ttl();
    let lose = |err: Error| status.send_modify(|s| s.lost = Some(err));
    loop {
        let due = next_extension(Instant::now(), lock.deadline(), ttl);
        tokio::select! {
            biased;
            _ = &mut stop => return lock,
            () = tokio::time::sleep_until(due.into()) => {}
        }
        let now = Instant::now();
        if now >= lock.deadline() {
            let msg = "validity ran out before an extension landed";
            lose(Error::local(ErrorKind::NotHeld, msg, lock.resource()));
            return lock;
        }
        let lease = match max_until {
            Some(until) => until.saturating_duration_since(now).min(ttl),
            None => ttl,
        };
        if lease < ttl / 3 {
            // Too little of the allowed hold left to extend into: let the lease run out.
            tokio::select! {
                biased;
                _ = &mut stop => return lock,
                () = tokio::time::sleep_until(lock.deadline().into()) => {}
            }
            let msg = "the maximum hold time was reached";
            lose(Error::local(ErrorKind::NotHeld, msg, lock.resource()));
            return lock;
        }
        match lock.extend(lease).await {
            Ok(()) => status.send_modify(|s| s.deadline = lock.deadline()),
            Err(err) if err.kind() == ErrorKind::NotHeld => {
                lose(err);
                return lock;
            }
            Err(err) => {
                tracing::warn!(target: "redlock", %err, "extension failed; retrying while valid");
            }
        }
    }
}

/// When to extend next: a third of the lease after a success; after a failure, half of
/// what remains, so retries come faster as the deadline nears (never more often than
/// every [`MIN_RETRY`], never after the deadline).
fn next_extension(now: Instant, deadline: Instant, ttl: Duration) -> Instant {
    let remaining = deadline.saturating_duration_since(now);
    let wait = (ttl / 3).min(remaining / 2).max(MIN_RETRY).min(remaining);
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
        assert_eq!(next_extension(now, now + Duration::from_millis(15), ttl) - now, MIN_RETRY);
        assert_eq!(
            next_extension(now, now + Duration::from_millis(4), ttl) - now,
            Duration::from_millis(4)
        );
        assert_eq!(next_extension(now, now, ttl), now);
    }
}
