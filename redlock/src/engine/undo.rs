//! Undos still in flight: the releases and clean-ups this client sent that have not been
//! answered yet, per node and key.
//!
//! A new acquisition of a key on a node waits for them there, so that this client's own
//! abandoned attempt (its clean-up queued behind a `SET` still in flight) never refuses it;
//! a waiting writer's withdrawal waits for them, so that it never overtakes the attempt
//! whose intent it withdraws.

use std::collections::HashMap;
use std::sync::atomic::{AtomicU64, AtomicUsize, Ordering};
use std::sync::{Arc, Mutex, MutexGuard, PoisonError};

use smallvec::SmallVec;

use super::protocol::Keys;
use super::slot::{Slot, Slots};

/// Per key, the registrations of the undos that remove it: most often one, kept in place.
type Entries = HashMap<Arc<str>, SmallVec<[Registration; 1]>>;

/// One round of undos, under each of its keys: per node, the undo sent there (if any).
/// Settled slots are skipped by readers, so a registration may outlive some of its undos.
#[derive(Debug)]
struct Registration {
    /// Which registration it is, for its removal.
    id: u64,
    sent: Sent,
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
    /// How many registrations there are: lets the common case skip the lock.
    registered: AtomicUsize,
    /// The next registration's id.
    next_id: AtomicU64,
    /// Per node, how many undos left to the background failed there.
    failures: Box<[AtomicUsize]>,
}

impl Undos {
    pub(crate) fn new(nodes: usize) -> Arc<Self> {
        Arc::new(Self {
            entries: Mutex::default(),
            registered: AtomicUsize::new(0),
            next_id: AtomicU64::new(0),
            failures: (0..nodes).map(|_| AtomicUsize::new(0)).collect(),
        })
    }

    /// Registers a round of undos for `keys` (per node, the undo sent there), until the
    /// returned guard drops.
    pub(crate) fn track(self: &Arc<Self>, keys: &Keys, sent: Sent) -> Tracked {
        let id = self.next_id.fetch_add(1, Ordering::Relaxed);
        let mut entries = self.lock();
        if let Some((last, others)) = keys.split_last() {
            for key in others {
                let sent = sent.clone();
                entries.entry(key.clone()).or_default().push(Registration { id, sent });
            }
            entries.entry(last.clone()).or_default().push(Registration { id, sent });
        }
        self.registered.fetch_add(1, Ordering::AcqRel);
        Tracked { undos: self.clone(), id, keys: keys.clone() }
    }

    /// Registers one undo on `node` for `keys`, until the returned guard drops.
    pub(crate) fn track_one(self: &Arc<Self>, node: usize, keys: &Keys, slot: &Slot) -> Tracked {
        self.track(keys, Sent::One(node, slot.clone()))
    }

    /// The undos still in flight for any of `keys`, with their nodes; empty in the common
    /// case, which neither locks nor allocates.
    pub(crate) fn pending(&self, keys: &[Arc<str>]) -> Pending {
        if self.registered.load(Ordering::Acquire) == 0 {
            return Pending::default();
        }
        let entries = self.lock();
        let registrations = || keys.iter().filter_map(|key| entries.get(key)).flatten();
        // Counted first: a backlog (the client's own thread lagging) takes one allocation of
        // the right size, not a list grown per undo.
        let mut count = 0;
        for registration in registrations() {
            registration.sent.for_each(|_, slot| count += usize::from(!slot.is_settled()));
        }
        let mut pending = SmallVec::with_capacity(count);
        for registration in registrations() {
            registration.sent.for_each(|i, slot| {
                if !slot.is_settled() {
                    pending.push((i, slot.clone()));
                }
            });
        }
        Pending(pending)
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

/// Undos in flight that new requests must wait for, each with its node: inline for a
/// few (most often one per node, the previous release still finishing).
#[derive(Debug, Default)]
pub(crate) struct Pending(SmallVec<[(usize, Slot); 7]>);

/// What one request waits for on its node before it goes out.
pub(crate) type After = SmallVec<[Slot; 2]>;

impl Pending {
    /// Those on `node`.
    pub(crate) fn on(&self, node: usize) -> After {
        let on = || self.0.iter().filter(move |(i, _)| *i == node).map(|(_, slot)| slot.clone());
        let mut after = After::with_capacity(on().count());
        after.extend(on());
        after
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
                let this = registrations.iter().position(|r| r.id == self.id);
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

    fn keys(names: &[&str]) -> Keys {
        names.iter().map(|k| Arc::<str>::from(*k)).collect()
    }

    fn nodes(pending: &Pending) -> Vec<usize> {
        let mut nodes: Vec<usize> = pending.0.iter().map(|(i, _)| *i).collect();
        nodes.sort();
        nodes
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
        assert_eq!(nodes(&undos.pending(&keys(&["a"]))), vec![0, 1, 2]);
        assert_eq!(nodes(&undos.pending(&keys(&["b"]))), vec![0, 1, 1, 2, 2]);
        assert_eq!(nodes(&undos.pending(&keys(&["c"]))), vec![1, 1]);
        assert_eq!(undos.pending(&keys(&["b"])).on(2).len(), 2);

        drop(multi);
        assert!(undos.pending(&keys(&["a"])).0.is_empty());
        assert!(!undos.lock().contains_key("a"));
        assert_eq!(nodes(&undos.pending(&keys(&["b"]))), vec![1, 2]);
        drop(repeated);
        assert!(!undos.lock().contains_key("c"));
        assert_eq!(nodes(&undos.pending(&keys(&["b"]))), vec![2]);
        let again = undos.track(&keys(&["b"]), Sent::Everywhere(Slots::new(3)));
        drop(one);
        assert_eq!(nodes(&undos.pending(&keys(&["b"]))), vec![0, 1, 2]);
        drop(again);
        assert!(undos.lock().is_empty());
        assert_eq!(undos.registered.load(Ordering::Acquire), 0);

        // A slot shared under two keys settles under both.
        let slots = Slots::new(3);
        let both = undos.track(&keys(&["x", "y"]), Sent::Everywhere(slots.clone()));
        drop(SettleOnDrop::new(slots.get(1), None));
        assert_eq!(nodes(&undos.pending(&keys(&["y"]))), vec![0, 2]);
        assert_eq!(nodes(&undos.pending(&keys(&["x"]))), vec![0, 2]);
        drop(both);
    }

    #[test]
    fn undos_are_found_by_node_and_key_until_they_are_dropped() {
        let undos = Undos::new(2);
        let keys: Keys = ["a".into(), "b".into()].into_iter().collect();
        let slot = Slot::new();
        let tracked = undos.track_one(0, &keys, &slot);
        let pending = undos.pending(&["b".into()]);
        assert_eq!(pending.on(0).len(), 1);
        assert_eq!(pending.on(1).len(), 0);
        assert!(undos.pending(&["c".into()]).0.is_empty());
        assert_eq!(undos.in_flight(), [true, false]);
        drop(SettleOnDrop::new(slot, None));
        assert!(undos.pending(&keys).0.is_empty(), "settled undos are not waited for");
        assert_eq!(undos.in_flight(), [false, false]);
        drop(tracked);
        assert_eq!(undos.registered.load(Ordering::Acquire), 0);
        assert!(undos.lock().is_empty());
    }
}
