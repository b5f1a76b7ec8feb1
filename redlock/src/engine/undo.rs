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

use super::slot::{Slot, Slots};

/// Per key, the registrations of the undos that remove it.
type Entries = HashMap<Arc<str>, Vec<Arc<Registration>>>;

/// One round of undos for some keys: per node, the undo sent there (if any). Settled
/// slots are skipped by readers, so a registration may outlive some of its undos.
#[derive(Debug)]
struct Registration {
    keys: Arc<[Arc<str>]>,
    sent: Sent,
}

/// Per node, the undo of a round sent there, if any.
#[derive(Debug)]
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
    /// How many registrations there are: lets the common case skip the lock.
    registered: AtomicUsize,
    /// Per node, how many undos left to the background failed there.
    failures: Box<[AtomicUsize]>,
}

impl Undos {
    pub(crate) fn new(nodes: usize) -> Arc<Self> {
        Arc::new(Self {
            entries: Mutex::default(),
            registered: AtomicUsize::new(0),
            failures: (0..nodes).map(|_| AtomicUsize::new(0)).collect(),
        })
    }

    /// Registers a round of undos for `keys` (per node, the undo sent there), until the
    /// returned guard drops.
    pub(crate) fn track(self: &Arc<Self>, keys: &Arc<[Arc<str>]>, sent: Sent) -> Tracked {
        let registration = Arc::new(Registration { keys: keys.clone(), sent });
        let mut entries = self.lock();
        for key in keys.iter() {
            entries.entry(key.clone()).or_default().push(registration.clone());
        }
        self.registered.fetch_add(1, Ordering::AcqRel);
        Tracked { undos: self.clone(), registration }
    }

    /// Registers one undo on `node` for `keys`, until the returned guard drops.
    pub(crate) fn track_one(
        self: &Arc<Self>,
        node: usize,
        keys: &Arc<[Arc<str>]>,
        slot: &Slot,
    ) -> Tracked {
        self.track(keys, Sent::One(node, slot.clone()))
    }

    /// The undos still in flight for any of `keys`, with their nodes; `None` when there
    /// are none (the common case, which allocates nothing).
    pub(crate) fn pending(&self, keys: &[Arc<str>]) -> Option<Arc<Pending>> {
        if self.registered.load(Ordering::Acquire) == 0 {
            return None;
        }
        let entries = self.lock();
        let registrations = keys.iter().filter_map(|key| entries.get(key)).flatten();
        let mut pending = Vec::new();
        for registration in registrations {
            registration.sent.for_each(|i, slot| {
                if !slot.is_settled() {
                    pending.push((i, slot.clone()));
                }
            });
        }
        (!pending.is_empty()).then(|| Arc::new(Pending(pending)))
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

/// Undos in flight that new requests must wait for, each with its node; shared by a
/// round's requests.
#[derive(Debug)]
pub(crate) struct Pending(Vec<(usize, Slot)>);

impl Pending {
    /// Those on `node`.
    pub(crate) fn on(&self, node: usize) -> impl Iterator<Item = &Slot> {
        self.0.iter().filter(move |(i, _)| *i == node).map(|(_, slot)| slot)
    }
}

/// A registration, removed when dropped (with the undos' driving task).
#[derive(Debug)]
pub(crate) struct Tracked {
    undos: Arc<Undos>,
    registration: Arc<Registration>,
}

impl Drop for Tracked {
    fn drop(&mut self) {
        let mut entries = self.undos.lock();
        for key in self.registration.keys.iter() {
            if let Some(registrations) = entries.get_mut(key) {
                let this = registrations.iter().position(|r| Arc::ptr_eq(r, &self.registration));
                if let Some(at) = this {
                    registrations.swap_remove(at);
                }
                if registrations.is_empty() {
                    entries.remove(key);
                }
            }
        }
        self.undos.registered.fetch_sub(1, Ordering::AcqRel);
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::engine::slot::SettleOnDrop;

    #[test]
    fn undos_are_found_by_node_and_key_until_they_are_dropped() {
        let undos = Undos::new(2);
        let keys: Arc<[Arc<str>]> = Arc::from(["a".into(), "b".into()]);
        let slot = Slot::new();
        let tracked = undos.track_one(0, &keys, &slot);
        let pending = undos.pending(&["b".into()]).unwrap();
        assert_eq!(pending.on(0).count(), 1);
        assert_eq!(pending.on(1).count(), 0);
        assert!(undos.pending(&["c".into()]).is_none());
        assert_eq!(undos.in_flight(), [true, false]);
        drop(SettleOnDrop::new(slot, None));
        assert!(undos.pending(&keys).is_none(), "settled undos are not waited for");
        assert_eq!(undos.in_flight(), [false, false]);
        drop(tracked);
        assert_eq!(undos.registered.load(Ordering::Acquire), 0);
        assert!(undos.lock().is_empty());
    }
}
