//! A request's completion, for the requests that must come after it on the same node.

use std::sync::Arc;
use std::sync::atomic::{AtomicBool, Ordering};

use tokio::sync::Notify;

use super::undo::Pending;

/// Settled once its request is over: answered, timed out, or dropped unsent. Waiting on it
/// needs no timer and no particular runtime.
#[derive(Debug, Default)]
struct State {
    settled: AtomicBool,
    notify: Notify,
}

/// The slots of one round, one per node, in one allocation.
#[derive(Debug)]
pub(crate) struct Slots(Arc<[State]>);

impl Slots {
    pub(crate) fn new(nodes: usize) -> Self {
        Self((0..nodes).map(|_| State::default()).collect())
    }

    /// Node `i`'s.
    pub(crate) fn get(&self, i: usize) -> Slot {
        Slot { round: self.0.clone(), i }
    }
}

/// One request's completion, shared with the requests ordered after it.
#[derive(Clone, Debug)]
pub(crate) struct Slot {
    round: Arc<[State]>,
    i: usize,
}

impl Slot {
    /// A slot of its own, outside any round.
    pub(crate) fn new() -> Self {
        Slots::new(1).get(0)
    }

    fn state(&self) -> Option<&State> {
        self.round.get(self.i)
    }

    pub(crate) fn is_settled(&self) -> bool {
        // Only `Slots::get` makes slots, with an index inside the round.
        self.state().is_none_or(|state| state.settled.load(Ordering::Acquire))
    }

    /// Completes once the request is over.
    pub(crate) async fn settled(&self) {
        // Most are over by the time anything waits for them: no waiter to register then.
        let Some(state) = self.state() else { return };
        if self.is_settled() {
            return;
        }
        loop {
            let notified = state.notify.notified();
            tokio::pin!(notified);
            notified.as_mut().enable();
            if self.is_settled() {
                return;
            }
            notified.await;
        }
    }

    fn settle(&self) {
        if let Some(state) = self.state() {
            state.settled.store(true, Ordering::Release);
            state.notify.notify_waiters();
        }
    }
}

/// Settles its slot when dropped: a request that completes, times out or is cancelled
/// releases whatever waits for it, in every case.
#[derive(Debug)]
pub(crate) struct SettleOnDrop(pub(crate) Slot);

impl Drop for SettleOnDrop {
    fn drop(&mut self) {
        self.0.settle();
    }
}

/// Waits for `first` and for the undos of `pending` on `node`.
pub(crate) async fn all_settled(first: Option<&Slot>, pending: Option<&Pending>, node: usize) {
    for slot in first.into_iter().chain(pending.into_iter().flat_map(|pending| pending.on(node))) {
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
