//! A node's child process and whether it is paused, shared with the threads that wake it up.
//!
//! [`RedisNode::pause_for`](crate::RedisNode::pause_for) resumes the node from a plain
//! thread. That thread and the node must agree on the process: the thread must not
//! resume a process that was killed, restarted or resumed by hand meanwhile (another
//! process may even have its pid by then), and the node's `is_paused` must turn false
//! when the thread resumes it. So the child and the paused flag live behind one mutex
//! shared by both, and every change of either bumps an epoch: a wake-up only acts if
//! the epoch is still the one its pause set.

use std::{
    process::Child,
    sync::{Arc, Condvar, Mutex, MutexGuard, PoisonError},
    thread::{self, JoinHandle},
    time::Instant,
};

use nix::{
    errno::Errno,
    sys::signal::{self, Signal},
    unistd::Pid,
};

use crate::error::{Error, Result};

/// The child process of a node, shared with its wake-up threads.
#[derive(Debug, Default)]
pub(crate) struct Process {
    state: Mutex<State>,
    /// Notified on every epoch change, so a pending wake-up gives up at once.
    changed: Condvar,
}

#[derive(Debug, Default)]
struct State {
    child: Option<Child>,
    paused: bool,
    /// Bumped by every start, kill, pause and resume.
    epoch: u64,
}

impl State {
    fn bump(&mut self) -> u64 {
        self.epoch += 1;
        self.epoch
    }

    /// The pid of a child that is still running; reaps one that died by itself,
    /// so that a zombie is not reported as running.
    fn running_pid(&mut self) -> Option<Pid> {
        if let Some(child) = self.child.as_mut()
            && !matches!(child.try_wait(), Ok(None))
        {
            self.child = None;
            self.paused = false;
        }
        self.child.as_ref().map(pid_of)
    }

    fn signal(&mut self, signal: Signal) -> Result<()> {
        let pid = self.running_pid().ok_or(Error::Signal { signal, source: Errno::ESRCH })?;
        signal::kill(pid, signal).map_err(|source| Error::Signal { signal, source })
    }
}

impl Process {
    /// A process that just started.
    pub(crate) fn new(child: Child) -> Arc<Self> {
        let process = Arc::new(Process::default());
        process.started(child);
        process
    }

    /// Records a freshly started child (after a kill).
    pub(crate) fn started(&self, child: Child) {
        let mut state = self.lock();
        state.child = Some(child);
        state.paused = false;
        state.bump();
        self.changed.notify_all();
    }

    /// The pid while running, `None` once killed or exited.
    pub(crate) fn pid(&self) -> Option<u32> {
        self.lock().running_pid().map(|pid| pid.as_raw().unsigned_abs())
    }

    /// Whether the process is running and stopped by a pause.
    pub(crate) fn is_paused(&self) -> bool {
        let mut state = self.lock();
        state.running_pid().is_some() && state.paused
    }

    /// SIGKILLs and reaps the process. Idempotent.
    pub(crate) fn kill(&self) -> Result<()> {
        let mut state = self.lock();
        state.bump();
        self.changed.notify_all();
        state.paused = false;
        let Some(mut child) = state.child.take() else {
            return Ok(());
        };
        // SIGKILL also ends a stopped (paused) process, no SIGCONT needed.
        match signal::kill(pid_of(&child), Signal::SIGKILL) {
            Ok(()) | Err(Errno::ESRCH) => {}
            Err(source) => {
                state.child = Some(child);
                return Err(Error::Signal { signal: Signal::SIGKILL, source });
            }
        }
        child.wait().map_err(|e| Error::spawn("could not reap the killed redis-server", e))?;
        Ok(())
    }

    /// SIGSTOPs the process; returns the epoch of this pause.
    pub(crate) fn pause(&self) -> Result<u64> {
        let mut state = self.lock();
        state.signal(Signal::SIGSTOP)?;
        state.paused = true;
        let epoch = state.bump();
        self.changed.notify_all();
        Ok(epoch)
    }

    /// SIGCONTs the process.
    pub(crate) fn resume(&self) -> Result<()> {
        let mut state = self.lock();
        state.signal(Signal::SIGCONT)?;
        state.paused = false;
        state.bump();
        self.changed.notify_all();
        Ok(())
    }

    /// Pauses now and resumes at `until` from a plain thread, unless the process was
    /// started, killed, paused or resumed meanwhile (then the wake-up does nothing).
    pub(crate) fn pause_until(self: &Arc<Self>, until: Instant) -> Result<JoinHandle<Result<()>>> {
        let epoch = self.pause()?;
        let process = Arc::clone(self);
        thread::Builder::new()
            .name("redis-node-wakeup".to_owned())
            .spawn(move || process.wake_at(until, epoch))
            .map_err(|e| {
                // Without a thread nobody would resume it: do not leave it hung.
                let _ = self.resume();
                Error::spawn("could not spawn the thread that resumes the node", e)
            })
    }

    fn wake_at(&self, until: Instant, epoch: u64) -> Result<()> {
        let mut state = self.lock();
        loop {
            if state.epoch != epoch {
                return Ok(()); // Someone else took over: nothing to do.
            }
            let now = Instant::now();
            if now >= until {
                break;
            }
            state = self
                .changed
                .wait_timeout(state, until - now)
                .unwrap_or_else(PoisonError::into_inner)
                .0;
        }
        match state.signal(Signal::SIGCONT) {
            // It died on its own meanwhile: there is nothing left to wake.
            Ok(()) | Err(Error::Signal { source: Errno::ESRCH, .. }) => {}
            Err(e) => return Err(e),
        }
        state.paused = false;
        state.bump();
        self.changed.notify_all();
        Ok(())
    }

    /// For `Drop`: ends the process whatever its state, ignoring errors.
    pub(crate) fn shut_down(&self) {
        let mut state = self.lock();
        state.bump();
        self.changed.notify_all();
        if let Some(mut child) = state.child.take() {
            // Errors are ignored: drop must never panic, and there is nothing better to do.
            let _ = signal::kill(pid_of(&child), Signal::SIGCONT);
            let _ = child.kill();
            let _ = child.wait();
        }
    }

    fn lock(&self) -> MutexGuard<'_, State> {
        // A poisoned lock only means a panic elsewhere; the state is still valid.
        self.state.lock().unwrap_or_else(PoisonError::into_inner)
    }
}

fn pid_of(child: &Child) -> Pid {
    // Pids fit in an i32 on every Unix; a wrapped one would only fail to signal.
    Pid::from_raw(i32::try_from(child.id()).unwrap_or(i32::MAX))
}
