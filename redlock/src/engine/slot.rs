//! A request's completion, for the requests that must come after it on the same node.

use std::sync::Arc;
use std::sync::atomic::{AtomicBool, Ordering};

use tokio::sync::Notify;

/// Settled once its request is over: answered, timed out, or dropped unsent. Waiting on it
/// needs no timer and no particular runtime.
#[derive(Debug, Default)]
pub(crate) struct Slot {
    settled: AtomicBool,
    notify: Notify,
}

impl Slot {
    pub(crate) fn new() -> Arc<Self> {
        Arc::default()
    }

    pub(crate) fn is_settled(&self) -> bool {
        self.settled.load(Ordering::Acquire)
    }

    /// Completes once the request is over.
    pub(crate) async fn settled(&self) {
        // Most are over by the time anything waits for them: no waiter to register then.
        if self.is_settled() {
            return;
        }
        loop {
            let notified = self.notify.notified();
            tokio::pin!(notified);
            notified.as_mut().enable();
            if self.is_settled() {
                return;
            }
            notified.await;
        }
    }

    fn settle(&self) {
        self.settled.store(true, Ordering::Release);
        self.notify.notify_waiters();
    }
}

/// Settles its slot when dropped: a request that completes, times out or is cancelled
/// releases whatever waits for it, in every case.
#[derive(Debug)]
pub(crate) struct SettleOnDrop(pub(crate) Arc<Slot>);

impl Drop for SettleOnDrop {
    fn drop(&mut self) {
        self.0.settle();
    }
}

/// Waits for `first` and every slot in `slots`.
pub(crate) async fn all_settled(first: Option<&Arc<Slot>>, slots: &[Arc<Slot>]) {
    for slot in first.into_iter().chain(slots) {
        slot.settled().await;
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[tokio::test]
    async fn a_dropped_request_releases_its_waiters() {
        let slot = Slot::new();
        let guard = SettleOnDrop(slot.clone());
        let waiter = tokio::spawn({
            let slot = slot.clone();
            async move { slot.settled().await }
        });
        tokio::task::yield_now().await;
        assert!(!waiter.is_finished());
        drop(guard);
        waiter.await.unwrap();
        assert!(slot.is_settled());
    }
}
