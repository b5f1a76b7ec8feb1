//! Undos still in flight: the releases and clean-ups this client sent that have not been
//! answered yet, per node and key, with the tokens they undo.
//!
//! A new acquisition of a key passes those tokens to the nodes as abandoned (a hold of one
//! of them counts as free there), so that this client's own abandoned attempt never refuses
//! it while its clean-up is on its way, and nothing waits for anything. A shutdown names
//! the nodes whose undos are still in flight.

use crate::timing;
use std::collections::HashMap;
use std::sync::atomic::{AtomicU64, AtomicUsize, Ordering};
use std::sync::{Arc, Mutex, MutexGuard, PoisonError};

use smallvec::SmallVec;

use crate::error::NodeOutcome;

use super::protocol::{Abandoned, Keys};
use super::slot::{Slot, Slots};

/// Per key, the registrations of the undos that remove it, in the order of their ids (the
/// newest last; most often one, kept in place): an acquisition reads the newest few,
/// however many are in flight (thousands, while a node that is down keeps every release of
/// a busy key waiting for its next send).
type Entries = HashMap<Arc<str>, SmallVec<[Registration; 1]>>;

/// One round of undos, under each of its keys: per node, the undo sent there (if any).
/// Settled slots are skipped by readers, so a registration may outlive some of its undos.
#[derive(Debug)]
struct Registration {
    /// Which registration it is: its place, and its removal.
    id: u64,
    /// The hold they undo, if they undo one (a writer's withdrawal does not).
    hold: Option<Abandoned>,
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
    /// How many registrations there are: lets the common case skip the lock.
    registered: AtomicUsize,
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
            registered: AtomicUsize::new(0),
            next_id: AtomicU64::new(0),
            failures: (0..nodes).map(|_| AtomicUsize::new(0)).collect(),
            faults: Mutex::new(vec![None; nodes]),
        })
    }

    /// Registers a round of undos for `keys` (per node, the undo sent there) of the hold
    /// `token` names (if any), until the returned guard drops.
    pub(crate) fn track(
        self: &Arc<Self>,
        keys: &Keys,
        hold: Option<&Abandoned>,
        sent: Sent,
    ) -> Tracked {
        let id = self.next_id.fetch_add(1, Ordering::Relaxed);
        let hold = hold.cloned();
        let mut entries = self.lock();
        if let Some((last, others)) = keys.split_last() {
            for key in others {
                let registration = Registration { id, hold: hold.clone(), sent: sent.clone() };
                insert(entries.entry(key.clone()).or_default(), registration);
            }
            insert(entries.entry(last.clone()).or_default(), Registration { id, hold, sent });
        }
        self.registered.fetch_add(1, Ordering::AcqRel);
        Tracked { undos: self.clone(), id, keys: keys.clone() }
    }

    /// Registers one undo on `node` for `keys`, until the returned guard drops.
    pub(crate) fn track_one(
        self: &Arc<Self>,
        node: usize,
        keys: &Keys,
        hold: Option<&Abandoned>,
        slot: &Slot,
    ) -> Tracked {
        self.track(keys, hold, Sent::One(node, slot.clone()))
    }

    /// The tokens this client's undos still in flight on any of `keys` undo: holds it gave
    /// up whose undos may not have reached every node yet (at most [`timing::MAX_ABANDONED`], the
    /// newest; an older one left out can only refuse an acquisition on a node where its
    /// undo is still late). Empty in the common case, which neither locks nor allocates.
    pub(crate) fn abandoned(&self, keys: &[Arc<str>]) -> Vec<Abandoned> {
        if self.registered.load(Ordering::Acquire) == 0 {
            return Vec::new();
        }
        let entries = self.lock();
        let mut holds: Vec<(u64, Abandoned)> = Vec::new();
        for registrations in keys.iter().filter_map(|key| entries.get(key)) {
            // Newest first: the first registration of a token met is its newest here, and
            // past the bound's count of tokens new to this key, none is newer than those.
            let mut found = 0;
            for registration in registrations.iter().rev() {
                let id = registration.id;
                if found == timing::MAX_ABANDONED {
                    break;
                }
                let Some(hold) = &registration.hold else { continue };
                let mut in_flight = false;
                registration.sent.for_each(|_, slot| in_flight |= !slot.is_settled());
                if !in_flight {
                    continue;
                }
                match holds.iter_mut().find(|(_, known)| known.token == hold.token) {
                    Some((newest, _)) => *newest = (*newest).max(id),
                    None => {
                        holds.push((id, hold.clone()));
                        found += 1;
                    }
                }
            }
        }
        holds.sort_unstable_by_key(|(id, _)| std::cmp::Reverse(*id));
        holds.truncate(timing::MAX_ABANDONED);
        holds.into_iter().map(|(_, hold)| hold).collect()
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

    fn token(name: &str) -> Abandoned {
        Abandoned { token: name.into(), tombstone: format!("{name}:undone").into() }
    }

    /// Registrations of one key by a multi lock (two keys), a lone undo and a registration
    /// naming the key twice: each is removed by its own id, under every key it named, and
    /// a key with none left is gone; the abandoned tokens are those still in flight, the
    /// newest first, each once.
    #[test]
    fn registrations_are_removed_by_their_own_id_only() {
        let undos = Undos::new(3);
        let multi =
            undos.track(&keys(&["a", "b"]), Some(&token("m")), Sent::Everywhere(Slots::new(3)));
        let lone = Slot::new();
        let one = undos.track_one(2, &keys(&["b"]), Some(&token("one")), &lone);
        let tails: Box<[Option<Slot>]> = vec![None, Some(Slot::new()), None].into();
        let repeated = undos.track(&keys(&["c", "b", "c"]), Some(&token("r")), Sent::Some(tails));
        let withdrawal = undos.track(&keys(&["b"]), None, Sent::Everywhere(Slots::new(3)));
        assert_eq!(undos.abandoned(&keys(&["a"])), [token("m")]);
        assert_eq!(undos.abandoned(&keys(&["b"])), [token("r"), token("one"), token("m")]);
        assert_eq!(undos.abandoned(&keys(&["c"])), [token("r")]);
        assert_eq!(undos.in_flight(), [true, true, true]);

        drop(multi);
        assert!(undos.abandoned(&keys(&["a"])).is_empty());
        assert!(!undos.lock().contains_key("a"));
        drop(repeated);
        assert!(!undos.lock().contains_key("c"));
        assert_eq!(undos.abandoned(&keys(&["b"])), [token("one")]);
        drop(one);
        drop(withdrawal);
        assert!(undos.lock().is_empty());
        assert_eq!(undos.registered.load(Ordering::Acquire), 0);
    }

    #[test]
    fn a_settled_undo_abandons_nothing_and_is_not_in_flight() {
        let undos = Undos::new(2);
        let keys: Keys = ["a".into(), "b".into()].into_iter().collect();
        let slot = Slot::new();
        let tracked = undos.track_one(0, &keys, Some(&token("t")), &slot);
        assert_eq!(undos.abandoned(&["b".into()]), [token("t")]);
        assert!(undos.abandoned(&["c".into()]).is_empty());
        assert_eq!(undos.in_flight(), [true, false]);
        drop(SettleOnDrop::new(slot));
        assert!(undos.abandoned(&keys).is_empty(), "an answered undo abandons nothing");
        assert_eq!(undos.in_flight(), [false, false]);
        drop(tracked);
        assert_eq!(undos.registered.load(Ordering::Acquire), 0);
        assert!(undos.lock().is_empty());
    }

    #[test]
    fn an_acquisition_names_only_the_newest_abandoned_holds_up_to_the_bound() {
        let undos = Undos::new(1);
        let key = keys(&["doc"]);
        let slots: Vec<Slot> = (0..timing::MAX_ABANDONED + 4).map(|_| Slot::new()).collect();
        let tracked: Vec<Tracked> = (slots.iter().enumerate())
            .map(|(i, slot)| undos.track_one(0, &key, Some(&token(&format!("t{i}"))), slot))
            .collect();
        let newest: Vec<Abandoned> =
            (4..timing::MAX_ABANDONED + 4).rev().map(|i| token(&format!("t{i}"))).collect();
        assert_eq!(undos.abandoned(&key), newest, "the newest 16, newest first");
        // Once the newest are answered, older ones still in flight take their places.
        for slot in &slots[10..] {
            drop(SettleOnDrop::new(slot.clone()));
        }
        let left: Vec<Abandoned> = (0..10).rev().map(|i| token(&format!("t{i}"))).collect();
        assert_eq!(undos.abandoned(&key), left);
        drop(tracked);
    }

    /// Thousands in flight on one key (a node that is down keeps every release of a busy
    /// key waiting for its next send): a token registered again later (its undo sent again)
    /// counts as new as its newest registration, and each token is named once.
    #[test]
    fn a_token_registered_again_counts_as_its_newest_registration() {
        let undos = Undos::new(1);
        let key = keys(&["doc"]);
        let slot = Slot::new();
        let old = undos.track_one(0, &key, Some(&token("again")), &slot);
        let others: Vec<Tracked> = (0..5000)
            .map(|i| undos.track_one(0, &key, Some(&token(&format!("t{i}"))), &slot))
            .collect();
        let again = undos.track_one(0, &key, Some(&token("again")), &slot);
        let mut newest = vec![token("again")];
        newest.extend((4985..5000).rev().map(|i| token(&format!("t{i}"))));
        assert_eq!(undos.abandoned(&key), newest);
        drop(again);
        // Its older registration is still in flight: as old as that one now.
        let abandoned = undos.abandoned(&key);
        assert!(!abandoned.contains(&token("again")), "{abandoned:?}");
        assert_eq!(abandoned.len(), timing::MAX_ABANDONED);
        drop((old, others));
        assert!(undos.lock().is_empty());
    }
}
