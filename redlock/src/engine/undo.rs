//! Undos still in flight: the releases and clean-ups this client sent that have not been
//! answered yet, per node and key.
//!
//! A new acquisition of a key on a node waits for them there, so that this client's own
//! abandoned attempt (its clean-up queued behind a `SET` still in flight) never refuses it;
//! a waiting writer's withdrawal waits for them, so that it never overtakes the attempt
//! whose intent it withdraws.

use std::collections::HashMap;
use std::sync::atomic::{AtomicUsize, Ordering};
use std::sync::{Arc, Mutex, MutexGuard, PoisonError};

use super::slot::Slot;

type Entries = HashMap<Arc<str>, Vec<Arc<Slot>>>;

/// The undos in flight, per node.
#[derive(Debug)]
pub(crate) struct Undos {
    nodes: Box<[Mutex<Entries>]>,
    /// How many are registered in all: lets the common case skip every lock.
    registered: AtomicUsize,
    /// Per node, how many undos left to the background failed there.
    failures: Box<[AtomicUsize]>,
}

impl Undos {
    pub(crate) fn new(nodes: usize) -> Arc<Self> {
        Arc::new(Self {
            nodes: (0..nodes).map(|_| Mutex::default()).collect(),
            registered: AtomicUsize::new(0),
            failures: (0..nodes).map(|_| AtomicUsize::new(0)).collect(),
        })
    }

    /// Registers an undo in flight on `node` for `keys`, until the returned guard drops.
    pub(crate) fn track(
        self: &Arc<Self>,
        node: usize,
        keys: &[Arc<str>],
        slot: &Arc<Slot>,
    ) -> Tracked {
        let mut entries = self.lock(node);
        for key in keys {
            entries.entry(key.clone()).or_default().push(slot.clone());
            self.registered.fetch_add(1, Ordering::AcqRel);
        }
        Tracked { undos: self.clone(), node, keys: keys.to_vec(), slot: slot.clone() }
    }

    /// The undos still in flight on `node` for any of `keys`.
    pub(crate) fn pending(&self, node: usize, keys: &[Arc<str>]) -> Vec<Arc<Slot>> {
        if self.registered.load(Ordering::Acquire) == 0 {
            return Vec::new();
        }
        let entries = self.lock(node);
        keys.iter()
            .filter_map(|key| entries.get(key))
            .flatten()
            .filter(|slot| !slot.is_settled())
            .cloned()
            .collect()
    }

    /// Counts an undo left to the background that failed on `node`.
    pub(crate) fn note_failure(&self, node: usize) {
        if let Some(failures) = self.failures.get(node) {
            failures.fetch_add(1, Ordering::AcqRel);
        }
    }

    /// Per node, how many background undos failed so far.
    pub(crate) fn failures(&self) -> Vec<usize> {
        self.failures.iter().map(|failures| failures.load(Ordering::Acquire)).collect()
    }

    /// Per node, whether an undo is still in flight there.
    pub(crate) fn in_flight(&self) -> Vec<bool> {
        (0..self.nodes.len())
            .map(|i| self.lock(i).values().flatten().any(|slot| !slot.is_settled()))
            .collect()
    }

    fn lock(&self, node: usize) -> MutexGuard<'_, Entries> {
        // Nodes are indexed by the same configuration that sized this registry.
        self.nodes[node].lock().unwrap_or_else(PoisonError::into_inner)
    }
}

/// An undo's registration, removed when dropped (with the undo's driving task).
#[derive(Debug)]
pub(crate) struct Tracked {
    undos: Arc<Undos>,
    node: usize,
    keys: Vec<Arc<str>>,
    slot: Arc<Slot>,
}

impl Drop for Tracked {
    fn drop(&mut self) {
        let mut entries = self.undos.lock(self.node);
        for key in &self.keys {
            if let Some(slots) = entries.get_mut(key) {
                if let Some(at) = slots.iter().position(|slot| Arc::ptr_eq(slot, &self.slot)) {
                    slots.swap_remove(at);
                    self.undos.registered.fetch_sub(1, Ordering::AcqRel);
                }
                if slots.is_empty() {
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

    #[test]
    fn undos_are_found_by_node_and_key_until_they_are_dropped() {
        let undos = Undos::new(2);
        let keys: Vec<Arc<str>> = vec!["a".into(), "b".into()];
        let slot = Slot::new();
        let tracked = undos.track(0, &keys, &slot);
        assert_eq!(undos.pending(0, &["b".into()]).len(), 1);
        assert!(undos.pending(1, &["b".into()]).is_empty());
        assert!(undos.pending(0, &["c".into()]).is_empty());
        drop(SettleOnDrop(slot));
        assert!(undos.pending(0, &keys).is_empty(), "settled undos are not waited for");
        drop(tracked);
        assert_eq!(undos.registered.load(Ordering::Acquire), 0);
        assert!(undos.lock(0).is_empty());
    }
}
