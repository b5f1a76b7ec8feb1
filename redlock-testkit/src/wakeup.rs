//! The pending wake-ups of nodes paused for a while.

use std::{fmt, thread::JoinHandle};

use crate::error::Result;

/// Nodes paused by [`RedisNode::pause_for`](crate::RedisNode::pause_for) or
/// [`Cluster::pause_for`](crate::Cluster::pause_for), resumed by plain threads when
/// their time is up: a request in flight meanwhile sees slow nodes rather than dead ones.
///
/// Each node's bookkeeping ([`is_paused`](crate::RedisNode::is_paused)) is brought up
/// to date by the thread that resumes it. A node started, killed, paused or resumed by
/// hand before its time is left as it was made: the wake-up then does nothing.
///
/// Dropping a `Wakeup` does not cancel it: the nodes are still resumed on time (or
/// killed with their [`RedisNode`](crate::RedisNode)); [`join`](Self::join) waits for it.
pub struct Wakeup {
    threads: Vec<JoinHandle<Result<()>>>,
}

impl Wakeup {
    pub(crate) fn new(threads: Vec<JoinHandle<Result<()>>>) -> Self {
        Wakeup { threads }
    }

    /// One handle for the wake-ups of both.
    pub(crate) fn merge(mut self, other: Wakeup) -> Wakeup {
        self.threads.extend(other.threads);
        self
    }

    /// Waits until every node has been resumed (or taken over by hand).
    ///
    /// # Errors
    /// The first error of sending `SIGCONT`; every wake-up is waited for anyway.
    pub fn join(self) -> Result<()> {
        let mut first_error = None;
        for thread in self.threads {
            // The threads never panic themselves; if one did, the panic is the test's.
            let woken = thread.join().unwrap_or_else(|panic| std::panic::resume_unwind(panic));
            if let Err(e) = woken {
                first_error.get_or_insert(e);
            }
        }
        first_error.map_or(Ok(()), Err)
    }

    /// Whether every wake-up has happened (or was taken over), without waiting.
    pub fn is_finished(&self) -> bool {
        self.threads.iter().all(JoinHandle::is_finished)
    }
}

impl fmt::Debug for Wakeup {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("Wakeup")
            .field("nodes", &self.threads.len())
            .field("finished", &self.is_finished())
            .finish()
    }
}
