//! Where the client's background work runs, and how much of it is still under way.
//!
//! Two places, for two kinds of work:
//!
//! - **The caller's runtime**, for work that finishes what a call started (requests still
//!   in flight when a round was decided, the part of a clean-up nobody waits for): it is
//!   made of futures the call created, whose timers belong to that runtime.
//! - **The client's own thread** (a current-thread Tokio runtime, started on first use),
//!   for work that must not depend on whichever runtime happened to start it: the release
//!   notification subscribers, which outlive any one waiter, and the releases of locks
//!   dropped outside any runtime (or while theirs shuts down).
//!
//! Every task is counted until it ends, so that a shutdown can wait for them; so is every
//! acquisition under way in a caller's task (a wait, an attempt, its fencing round and its
//! clean-up), which a shutdown waits for too.

use crate::timing;
use std::future::Future;
use std::sync::atomic::{AtomicUsize, Ordering};
use std::sync::{Arc, Mutex, PoisonError};
use std::time::{Duration, Instant};

use tokio::runtime::Handle;
use tokio::sync::{Notify, oneshot, watch};
use tokio::task::JoinHandle;

/// The background work of one client.
#[derive(Debug)]
pub(crate) struct Tasks {
    running: Arc<Running>,
    own: Mutex<Option<OwnThread>>,
    /// Set once the client shuts down: long-running tasks (extenders) wind up.
    closing: watch::Sender<bool>,
}

impl Default for Tasks {
    fn default() -> Self {
        Self { running: Arc::default(), own: Mutex::default(), closing: watch::channel(false).0 }
    }
}

#[derive(Debug, Default)]
struct Running {
    /// Tasks and acquisitions under way.
    count: AtomicUsize,
    /// Of `count`, the acquisitions.
    acquisitions: AtomicUsize,
    /// Of `count`, the tasks that only send undos again after failures (see
    /// [`Tasks::park`]): a shutdown does not wait for them.
    parked: AtomicUsize,
    idle: Notify,
}

impl Running {
    /// Tasks and acquisitions a shutdown waits for.
    fn busy(&self) -> usize {
        let count = self.count.load(Ordering::Acquire);
        count.saturating_sub(self.parked.load(Ordering::Acquire))
    }
}

/// Counts one task from its spawn to its end, however it ends (completed, aborted, or
/// dropped with a runtime that shut down).
struct Counted(Arc<Running>);

impl Counted {
    fn new(running: &Arc<Running>) -> Self {
        running.count.fetch_add(1, Ordering::AcqRel);
        Self(running.clone())
    }
}

impl Drop for Counted {
    fn drop(&mut self) {
        self.0.count.fetch_sub(1, Ordering::AcqRel);
        if self.0.busy() == 0 {
            self.0.idle.notify_waiters();
        }
    }
}

/// Marks a task as one that only sends undos again, after they failed, until it is
/// dropped (see [`Tasks::park`]).
#[must_use = "marks the task only while it lives"]
pub(crate) struct Parked(Arc<Running>);

impl Drop for Parked {
    fn drop(&mut self) {
        self.0.parked.fetch_sub(1, Ordering::AcqRel);
    }
}

impl std::fmt::Debug for Parked {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str("Parked")
    }
}

/// Counts an acquisition under way in a caller's task until it is dropped: when the
/// acquisition ends, however it ends (answered, or its future dropped).
#[must_use = "counts the acquisition only while it lives"]
pub(crate) struct Acquisition {
    /// Dropped after the acquisition's own count: the task count reaches zero last.
    counted: Counted,
}

impl Drop for Acquisition {
    fn drop(&mut self) {
        self.counted.0.acquisitions.fetch_sub(1, Ordering::AcqRel);
    }
}

impl std::fmt::Debug for Acquisition {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str("Acquisition")
    }
}

#[derive(Debug)]
struct OwnThread {
    handle: Handle,
    /// Dropped with the client: the thread then lets its tasks finish and exits.
    _stop: oneshot::Sender<()>,
}

impl Tasks {
    /// Runs `task` on the caller's runtime, or on the client's own thread outside any.
    pub(crate) fn spawn<F>(&self, task: F)
    where
        F: Future<Output = ()> + Send + 'static,
    {
        let _ = self.spawn_with_handle(task);
    }

    /// [`spawn`](Self::spawn), with the task's handle.
    pub(crate) fn spawn_with_handle<F>(&self, task: F) -> Option<JoinHandle<F::Output>>
    where
        F: Future + Send + 'static,
        F::Output: Send + 'static,
    {
        match Handle::try_current() {
            Ok(handle) => Some(handle.spawn(self.counted(task))),
            Err(_) => self.spawn_own(task),
        }
    }

    /// Runs `task` on the client's own thread, whatever runtime the caller is on.
    pub(crate) fn spawn_own<F>(&self, task: F) -> Option<JoinHandle<F::Output>>
    where
        F: Future + Send + 'static,
        F::Output: Send + 'static,
    {
        let Some(handle) = self.own_handle() else {
            tracing::error!(
                target: "redlock",
                "the background thread could not be started: background work is dropped"
            );
            return None;
        };
        Some(handle.spawn(self.counted(task)))
    }

    /// Counts an acquisition from now on, until the returned value is dropped: a shutdown
    /// waits for it. Check [`is_closing`](Self::is_closing) after this, never before: a
    /// shutdown that began meanwhile then either is seen, or sees the acquisition counted.
    pub(crate) fn acquisition(&self) -> Acquisition {
        self.running.acquisitions.fetch_add(1, Ordering::AcqRel);
        Acquisition { counted: Counted::new(&self.running) }
    }

    /// How many acquisitions are under way.
    pub(crate) fn acquisitions(&self) -> usize {
        self.running.acquisitions.load(Ordering::Acquire)
    }

    /// Tells long-running tasks that the client shuts down.
    pub(crate) fn close(&self) {
        self.closing.send_replace(true);
    }

    pub(crate) fn is_closing(&self) -> bool {
        *self.closing.borrow()
    }

    /// Completes once the client shuts down.
    pub(crate) fn closed(&self) -> impl Future<Output = ()> + Send + 'static + use<> {
        let mut closing = self.closing.subscribe();
        async move {
            // The sender lives as long as the client; if it is gone, so is the client.
            let _ = closing.wait_for(|closing| *closing).await;
        }
    }

    /// How many tasks (and acquisitions) are under way.
    #[cfg(test)]
    pub(crate) fn running(&self) -> usize {
        self.running.count.load(Ordering::Acquire)
    }

    /// Marks the calling task, until the returned value is dropped, as one that only sends
    /// undos again after they failed (a node that resets, or is down and may come back
    /// with its data): it goes on until they are answered or nothing they remove can exist
    /// any more, but a shutdown does not wait for it (it names those nodes instead).
    pub(crate) fn park(&self) -> Parked {
        self.running.parked.fetch_add(1, Ordering::AcqRel);
        if self.running.busy() == 0 {
            self.running.idle.notify_waiters();
        }
        Parked(self.running.clone())
    }

    /// Waits until no task nor acquisition is under way, [parked](Self::park) tasks aside,
    /// or `deadline` passes; `true` when idle.
    pub(crate) async fn idle_by(&self, deadline: Instant) -> bool {
        loop {
            let idle = self.running.idle.notified();
            tokio::pin!(idle);
            idle.as_mut().enable();
            if self.running.busy() == 0 {
                return true;
            }
            if tokio::time::timeout_at(deadline.into(), idle).await.is_err() {
                return self.running.busy() == 0;
            }
        }
    }

    fn counted<F: Future>(&self, task: F) -> impl Future<Output = F::Output> + use<F> {
        let counted = Counted::new(&self.running);
        async move {
            let output = task.await;
            drop(counted);
            output
        }
    }

    fn own_handle(&self) -> Option<Handle> {
        let mut own = self.own.lock().unwrap_or_else(PoisonError::into_inner);
        if own.is_none() {
            *own = start_own_thread(self.running.clone());
        }
        own.as_ref().map(|own| own.handle.clone())
    }
}

/// Starts the client's own thread with a current-thread runtime; `None` if the system
/// refuses a thread or a runtime.
fn start_own_thread(running: Arc<Running>) -> Option<OwnThread> {
    let runtime = tokio::runtime::Builder::new_current_thread().enable_all().build().ok()?;
    let handle = runtime.handle().clone();
    let (stop, stopped) = oneshot::channel::<()>();
    let spawned = std::thread::Builder::new().name("redlock-background".into()).spawn(move || {
        runtime.block_on(async move {
            // Ends when the client (and with it the sender) is gone.
            let _ = stopped.await;
            let deadline = Instant::now() + timing::GRACE;
            while running.count.load(Ordering::Acquire) > 0 && Instant::now() < deadline {
                let idle = running.idle.notified();
                let _ = tokio::time::timeout(Duration::from_millis(50), idle).await;
            }
        });
    });
    match spawned {
        Ok(_) => Some(OwnThread { handle, _stop: stop }),
        Err(err) => {
            tracing::error!(target: "redlock", %err, "cannot start the background thread");
            None
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn outside_a_runtime_tasks_run_on_the_own_thread_and_are_counted() {
        let tasks = Tasks::default();
        let (done, finished) = std::sync::mpsc::channel();
        tasks.spawn(async move {
            tokio::time::sleep(Duration::from_millis(20)).await;
            let _ = done.send(std::thread::current().name().map(str::to_owned));
        });
        assert_eq!(tasks.running(), 1);
        let name = finished.recv_timeout(Duration::from_secs(5)).unwrap();
        assert_eq!(name.as_deref(), Some("redlock-background"));
        let deadline = Instant::now() + Duration::from_secs(5);
        while tasks.running() > 0 && Instant::now() < deadline {
            std::thread::sleep(Duration::from_millis(1));
        }
        assert_eq!(tasks.running(), 0);
    }

    #[tokio::test]
    async fn a_task_dropped_with_its_runtime_is_no_longer_counted() {
        let tasks = Arc::new(Tasks::default());
        let spawner = tasks.clone();
        std::thread::spawn(move || {
            let runtime =
                tokio::runtime::Builder::new_current_thread().enable_all().build().unwrap();
            runtime.block_on(async { spawner.spawn(std::future::pending()) });
            assert_eq!(spawner.running(), 1);
        })
        .join()
        .unwrap();
        assert!(tasks.idle_by(Instant::now() + Duration::from_secs(1)).await);
    }
}
