//! A request's completion: whether it is still in flight (a shutdown names the nodes of
//! undos that are), and its answer until the round that sent it takes it.
//!
//! A request is over once it was answered, timed out, or dropped.

use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::{Arc, OnceLock};

use crate::error::NodeOutcome;

/// Settled once its request is over: answered, timed out, or dropped.
#[derive(Debug, Default)]
struct State {
    settled: AtomicBool,
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

/// One request's completion.
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

    /// Whether the request is over.
    pub(crate) fn is_settled(&self) -> bool {
        self.round.get(self.i).is_none_or(|state| state.settled.load(Ordering::Acquire))
    }

    fn settle(&self) {
        if let Some(state) = self.round.get(self.i) {
            state.settled.store(true, Ordering::Release);
        }
    }
}

/// A request's slot, settled when the request is dropped: whether it completed, timed out
/// or was cancelled, it no longer counts as in flight.
#[derive(Debug)]
pub(crate) struct SettleOnDrop(Slot);

impl SettleOnDrop {
    pub(crate) fn new(slot: Slot) -> Self {
        Self(slot)
    }
}

impl Drop for SettleOnDrop {
    fn drop(&mut self) {
        self.0.settle();
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_dropped_request_is_settled() {
        let slot = Slot::new();
        let guard = SettleOnDrop::new(slot.clone());
        assert!(!slot.is_settled());
        drop(guard);
        assert!(slot.is_settled());
    }

    #[test]
    fn a_round_takes_each_answer_once() {
        let slots = Slots::new(3);
        slots.answer(2, NodeOutcome::Ok);
        assert_eq!(slots.take_answer(), Some((2, NodeOutcome::Ok)));
        assert_eq!(slots.take_answer(), None);
    }
}
