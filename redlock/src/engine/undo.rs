//! Undos still in flight: the releases and clean-ups this client sent that have not been
//! answered yet, per node and key. A shutdown names the nodes whose undos are still in
//! flight, and the last fault each met.

use std::collections::HashMap;
use std::sync::atomic::{AtomicU64, AtomicUsize, Ordering};
use std::sync::{Arc, Mutex, MutexGuard, PoisonError};

use smallvec::SmallVec;

use crate::error::NodeOutcome;

use super::protocol::Keys;
use super::slot::{Slot, Slots};

/// Per key, the registrations of the undos that remove it, in the order of their ids (the
/// newest last; most often one, kept in place).
type Entries = HashMap<Arc<str>, SmallVec<[Registration; 1]>>;

/// One round of undos, under each of its keys: per node, the undo sent there (if any).
/// Settled slots are skipped by readers, so a registration may outlive some of its undos.
#[derive(Debug)]
struct Registration {
    /// Which registration it is: its place, and its removal.
    id: u64,
    sent: Sent,
}

/// Adds `registration` to `registrations` at its place by id (almost always the end: ids
/// are taken just before the lock), once under each key however often a round names it.
fn insert(registrations: &mut SmallVec<[Registration; 1]>, registration: Registration) {
    match registrations.binary_search_by_key(&registration.id, |r| r.id) {
        Ok(_) => {}
        Err(at) => registrations.insert(at, registration),
    }
}

/// Per node, the undo of a round sent there, if any.
#[derive(Clone, Debug)]
pub(crate) enum Sent {
    /// One on every node: the round's own slots.
    Everywhere(Slots),
    /// Per node, the undo if one was sent there.
    Some(Box<[Option<Slot>]>),
    /// One undo, on one node.
    One(usize, Slot),
}

impl Sent {
    /// Calls `visit` with each undo sent and its node.
    fn for_each(&self, mut visit: impl FnMut(usize, &Slot)) {
        match self {
            Self::Everywhere(slots) => (0..slots.len()).for_each(|i| visit(i, &slots.get(i))),
            Self::Some(slots) => (slots.iter().enumerate())
                .for_each(|(i, slot)| slot.iter().for_each(|slot| visit(i, slot))),
            Self::One(node, slot) => visit(*node, slot),
        }
    }
}

/// The undos in flight.
#[derive(Debug)]
pub(crate) struct Undos {
    entries: Mutex<Entries>,
    /// The next registration's id.
    next_id: AtomicU64,
    /// Per node, how many undos left to the background failed there.
    failures: Box<[AtomicUsize]>,
    /// Per node, the last fault an undo met there: what a shutdown reports for a node
    /// whose undos are still in flight or failed (a refused connection reads
    /// "unreachable", not "timed out").
    faults: Mutex<Vec<Option<NodeOutcome>>>,
}

impl Undos {
    pub(crate) fn new(nodes: usize) -> Arc<Self> {
        Arc::new(Self {
            entries: Mutex::default(),
            next_id: AtomicU64::new(0),
            failures: (0..nodes).map(|_| AtomicUsize::new(0)).collect(),
            faults: Mutex::new(vec![None; nodes]),
        })
    }

    /// Registers a round of undos for `keys` (per node, the undo sent there), until the
    /// returned guard drops.
    pub(crate) fn track(self: &Arc<Self>, keys: &Keys, sent: Sent) -> Tracked {
        let id = self.next_id.fetch_add(1, Ordering::Relaxed);
        let mut entries = self.lock();
        if let Some((last, others)) = keys.split_last() {
            for key in others {
                let registration = Registration { id, sent: sent.clone() };
                insert(entries.entry(key.clone()).or_default(), registration);
            }
            insert(entries.entry(last.clone()).or_default(), Registration { id, sent });
        }
        Tracked { undos: self.clone(), id, keys: keys.clone() }
    }

    /// Registers one undo on `node` for `keys`, until the returned guard drops.
    pub(crate) fn track_one(self: &Arc<Self>, node: usize, keys: &Keys, slot: &Slot) -> Tracked {
        self.track(keys, Sent::One(node, slot.clone()))
    }

    /// Counts an undo left to the background that failed on `node`.
    pub(crate) fn note_failure(&self, node: usize) {
        if let Some(failures) = self.failures.get(node) {
            failures.fetch_add(1, Ordering::AcqRel);
        }
    }

    /// Notes what an undo met on `node`, if it was a fault.
    pub(crate) fn note_outcome(&self, node: usize, outcome: &NodeOutcome) {
        if outcome.is_fault() {
            let mut faults = self.faults.lock().unwrap_or_else(PoisonError::into_inner);
            if let Some(fault) = faults.get_mut(node) {
                *fault = Some(outcome.clone());
            }
        }
    }

    /// Per node, the last fault an undo met there.
    pub(crate) fn faults(&self) -> Vec<Option<NodeOutcome>> {
        self.faults.lock().unwrap_or_else(PoisonError::into_inner).clone()
    }

    /// Per node, how many background undos failed so far.
    pub(crate) fn failures(&self) -> Vec<usize> {
        self.failures.iter().map(|failures| failures.load(Ordering::Acquire)).collect()
    }

    /// Per node, whether an undo is still in flight there.
    pub(crate) fn in_flight(&self) -> Vec<bool> {
        let mut in_flight = vec![false; self.nodes()];
        for registration in self.lock().values().flatten() {
            registration.sent.for_each(|i, slot| in_flight[i] |= !slot.is_settled());
        }
        in_flight
    }

    /// How many nodes there are (one failure counter each).
    fn nodes(&self) -> usize {
        self.failures.len()
    }

    fn lock(&self) -> MutexGuard<'_, Entries> {
        self.entries.lock().unwrap_or_else(PoisonError::into_inner)
    }
}

/// A registration, removed when dropped (with the undos' driving task).
#[derive(Debug)]
pub(crate) struct Tracked {
    undos: Arc<Undos>,
    id: u64,
    keys: Keys,
}

impl Drop for Tracked {
    fn drop(&mut self) {
        let mut entries = self.undos.lock();
        for key in &self.keys {
            if let Some(registrations) = entries.get_mut(key) {
                if let Ok(at) = registrations.binary_search_by_key(&self.id, |r| r.id) {
                    registrations.remove(at);
                }
                if registrations.is_empty() {
                    entries.remove(key);
                }
            }
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::engine::slot::SettleOnDrop;

    fn keys(names: &[&str]) -> Keys {
        names.iter().map(|k| Arc::<str>::from(*k)).collect()
    }

    /// Registrations of one key by a multi lock (two keys), a lone undo and a registration
    /// naming the key twice: each is removed by its own id, under every key it named, and
    /// a key with none left is gone.
    #[test]
    fn registrations_are_removed_by_their_own_id_only() {
        let undos = Undos::new(3);
        let multi = undos.track(&keys(&["a", "b"]), Sent::Everywhere(Slots::new(3)));
        let lone = Slot::new();
        let one = undos.track_one(2, &keys(&["b"]), &lone);
        let tails: Box<[Option<Slot>]> = vec![None, Some(Slot::new()), None].into();
        let repeated = undos.track(&keys(&["c", "b", "c"]), Sent::Some(tails));
        assert_eq!(undos.lock()["b"].len(), 3);
        assert_eq!(undos.in_flight(), [true, true, true]);

        drop(multi);
        assert!(!undos.lock().contains_key("a"));
        drop(repeated);
        assert!(!undos.lock().contains_key("c"));
        assert_eq!(undos.lock()["b"].len(), 1);
        drop(one);
        assert!(undos.lock().is_empty());
    }

    #[test]
    fn a_settled_undo_is_not_in_flight() {
        let undos = Undos::new(2);
        let keys: Keys = ["a".into(), "b".into()].into_iter().collect();
        let slot = Slot::new();
        let tracked = undos.track_one(0, &keys, &slot);
        assert_eq!(undos.in_flight(), [true, false]);
        drop(SettleOnDrop::new(slot));
        assert_eq!(undos.in_flight(), [false, false]);
        drop(tracked);
        assert!(undos.lock().is_empty());
    }
}
