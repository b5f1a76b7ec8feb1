//! A request's completion, for the requests that must come after it on the same node.
//!
//! A request is over once it was answered, timed out, or dropped. One dropped before it
//! went out hands on what it was still waiting for: whoever waits for it waits for that
//! too, so that a cancelled call between two others (a release, an extension) never lets
//! the later one overtake the earlier.

use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::{Arc, OnceLock};

use tokio::sync::Notify;

use crate::error::NodeOutcome;

/// Settled once its request is over: answered, timed out, or dropped unsent. Waiting on it
/// needs no timer and no particular runtime.
#[derive(Debug, Default)]
struct State {
    settled: AtomicBool,
    notify: Notify,
    /// Set (before `settled`) when the request was dropped before it went out, while what
    /// it followed was not over yet.
    behind: OnceLock<Slot>,
    /// The answer of the round's request to this node, and whether the round took it.
    answer: OnceLock<NodeOutcome>,
    taken: AtomicBool,
}

/// The slots of one round, one per node, in one allocation: each request's completion,
/// and its answer until the round takes it.
#[derive(Clone, Debug)]
pub(crate) struct Slots(Arc<[State]>);

impl Slots {
    pub(crate) fn new(nodes: usize) -> Self {
        Self((0..nodes).map(|_| State::default()).collect())
    }

    /// How many nodes.
    pub(crate) fn len(&self) -> usize {
        self.0.len()
    }

    /// Node `i`'s.
    pub(crate) fn get(&self, i: usize) -> Slot {
        Slot { round: self.0.clone(), i }
    }

    /// Leaves node `i`'s answer for the round: one per node (a round counts its answers, so
    /// its requests answer for distinct nodes).
    pub(crate) fn answer(&self, i: usize, outcome: NodeOutcome) {
        let first = self.0.get(i).is_some_and(|state| state.answer.set(outcome).is_ok());
        debug_assert!(first, "a second answer for node {i}, or a node outside the round");
    }

    /// An answer the round has not taken yet, with its node.
    pub(crate) fn take_answer(&self) -> Option<(usize, NodeOutcome)> {
        self.0.iter().enumerate().find_map(|(i, state)| {
            if state.taken.load(Ordering::Relaxed) {
                return None;
            }
            let outcome = state.answer.get()?.clone();
            state.taken.store(true, Ordering::Relaxed);
            Some((i, outcome))
        })
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

    /// Whether the request is over, and so is whatever it handed on.
    pub(crate) fn is_settled(&self) -> bool {
        self.first_unsettled().is_none()
    }

    /// Completes once the request is over, and so is whatever it handed on.
    pub(crate) async fn settled(&self) {
        let mut slot = self;
        loop {
            let Some(state) = slot.state() else { return };
            slot.own_settled(state).await;
            match state.behind.get() {
                Some(behind) => slot = behind,
                None => return,
            }
        }
    }

    async fn own_settled(&self, state: &State) {
        // Most are over by the time anything waits for them: no waiter to register then.
        let settled = || state.settled.load(Ordering::Acquire);
        while !settled() {
            let notified = state.notify.notified();
            tokio::pin!(notified);
            notified.as_mut().enable();
            if settled() {
                return;
            }
            notified.await;
        }
    }

    /// The first request along this one's hand-on chain that is not over yet, if any.
    fn first_unsettled(&self) -> Option<&Slot> {
        let mut slot = self;
        loop {
            // Only `Slots::get` makes slots, with an index inside the round.
            let state = slot.state()?;
            if !state.settled.load(Ordering::Acquire) {
                return Some(slot);
            }
            slot = state.behind.get()?;
        }
    }

    fn settle(&self, behind: Option<Slot>) {
        if let Some(state) = self.state() {
            // Handed on to the first request not over yet, never to one that is: chains of
            // cancelled calls stay a link or two long, however many there are.
            if let Some(behind) = behind.as_ref().and_then(Slot::first_unsettled) {
                // Set once: only this slot's own request settles it.
                let _ = state.behind.set(behind.clone());
            }
            state.settled.store(true, Ordering::Release);
            state.notify.notify_waiters();
        }
    }
}

/// A request's slot, settled when the request is dropped: whether it completed, timed out
/// or was cancelled, whatever waits for it is released, in every case.
#[derive(Debug)]
pub(crate) struct SettleOnDrop {
    slot: Slot,
    /// The request it follows on its node, until it went out.
    previous: Option<Slot>,
}

impl SettleOnDrop {
    /// For a request that goes out after `previous` on its node.
    pub(crate) fn new(slot: Slot, previous: Option<Slot>) -> Self {
        Self { slot, previous }
    }

    /// Waits for the request this one follows and for `after` (this client's undos in
    /// flight on the node): once this returns, the request may go out.
    pub(crate) async fn wait_turn(&mut self, after: &[Slot]) {
        if let Some(previous) = &self.previous {
            previous.settled().await;
        }
        for slot in after {
            slot.settled().await;
        }
        self.previous = None;
    }
}

impl Drop for SettleOnDrop {
    fn drop(&mut self) {
        self.slot.settle(self.previous.take());
    }
}

#[cfg(test)]
mod tests {
    use std::time::Duration;

    use super::*;

    #[tokio::test]
    async fn a_dropped_request_releases_its_waiters() {
        let slot = Slot::new();
        let guard = SettleOnDrop::new(slot.clone(), None);
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

    #[tokio::test]
    async fn a_request_dropped_unsent_hands_on_what_it_waited_for() {
        let (first, second, third) = (Slot::new(), Slot::new(), Slot::new());
        let first_request = SettleOnDrop::new(first.clone(), None);
        // The second waits for the first and is dropped before it went out; the third,
        // which follows the second, must still wait for the first.
        drop(SettleOnDrop::new(second.clone(), Some(first.clone())));
        let mut third_request = SettleOnDrop::new(third, Some(second.clone()));
        assert!(!second.is_settled());
        let waiting = tokio::time::timeout(Duration::from_millis(50), third_request.wait_turn(&[]));
        assert!(waiting.await.is_err(), "went out before the first request was over");
        drop(first_request);
        assert!(second.is_settled());
        third_request.wait_turn(&[]).await;
    }

    #[tokio::test]
    async fn a_request_that_went_out_hands_on_nothing() {
        let (first, second) = (Slot::new(), Slot::new());
        let first_request = SettleOnDrop::new(first.clone(), None);
        let mut second_request = SettleOnDrop::new(second.clone(), Some(first));
        drop(first_request);
        second_request.wait_turn(&[]).await;
        drop(second_request);
        assert!(second.is_settled());
    }

    #[test]
    fn cancelled_requests_behind_one_in_flight_link_to_it_directly() {
        let head = Slot::new();
        let head_request = SettleOnDrop::new(head.clone(), None);
        let mut previous = head.clone();
        // Far more than a recursive drop of a chain could take on a small stack.
        for _ in 0..100_000 {
            let slot = Slot::new();
            drop(SettleOnDrop::new(slot.clone(), Some(previous)));
            assert!(!slot.is_settled());
            let linked = slot.state().and_then(|state| state.behind.get()).cloned();
            assert!(linked.is_some_and(|linked| Arc::ptr_eq(&linked.round, &head.round)));
            previous = slot;
        }
        drop(head_request);
        assert!(previous.is_settled());
    }
}
