//! The arithmetic of the algorithm: quorum size, clock drift, lease validity, and when a
//! round over the nodes is decided and what its failure means.
//!
//! Pure functions without I/O, so that they can be tested exhaustively.

use crate::timing;
use std::time::Duration;

use crate::error::{ErrorKind, NodeOutcome};

/// The largest lease we accept: far beyond any sane lease, far below what makes Redis
/// reject `PX` (its expiry time in milliseconds must fit an `i64` after adding "now").
pub(crate) const MAX_TTL: Duration = Duration::from_secs(100 * 365 * 24 * 3600);

/// How many of `nodes` masters must agree: a strict majority, `N/2 + 1`.
///
/// For an even `N` this is one more than half, so two disjoint groups can never both hold
/// a quorum.
pub(crate) const fn quorum(nodes: usize) -> usize {
    nodes / 2 + 1
}

/// The clock drift allowance for a lease of `ttl`: `ttl x factor + 2 ms`.
///
/// `factor` is validated to lie in `[0, 1)` by the builder, so the product cannot overflow.
pub(crate) fn drift(ttl: Duration, factor: f64) -> Duration {
    ttl.mul_f64(factor) + timing::EXPIRY_PRECISION
}

/// The one conversion from a `Duration` to the milliseconds Redis expects.
///
/// Rounds down, so the lease stored in Redis is never longer than the one the client counts
/// on; returns `None` for a lease that rounds to zero or exceeds [`MAX_TTL`].
pub(crate) fn ttl_millis(ttl: Duration) -> Option<u64> {
    if ttl > MAX_TTL {
        return None;
    }
    u64::try_from(ttl.as_millis()).ok().filter(|&ms| ms > 0)
}

/// The answers of one round so far, by what they mean for the quorum.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub(crate) struct Tally {
    /// Configured nodes.
    pub(crate) nodes: usize,
    /// Yes votes that count toward the quorum.
    pub(crate) ok: usize,
    /// Nodes holding the key for another owner.
    pub(crate) held: usize,
    /// Nodes whose key has another data type.
    pub(crate) wrong_type: usize,
    /// Nodes without our key (release, extend and checks only).
    pub(crate) absent: usize,
    /// Nodes that timed out, were unreachable, failed, or are in restart quarantine.
    pub(crate) faulty: usize,
    /// Nodes that have not answered yet.
    pub(crate) pending: usize,
}

impl Tally {
    /// A round over `nodes` nodes, none answered yet.
    pub(crate) fn new(nodes: usize) -> Self {
        Self { nodes, pending: nodes, ..Self::default() }
    }

    /// Counts one node's answer.
    pub(crate) fn add(&mut self, outcome: &NodeOutcome) {
        self.pending = self.pending.saturating_sub(1);
        match outcome {
            NodeOutcome::Ok => self.ok += 1,
            // A reader held back by a waiting writer is refused as by a holder.
            NodeOutcome::Held | NodeOutcome::WriterWaiting => self.held += 1,
            NodeOutcome::WrongType => self.wrong_type += 1,
            NodeOutcome::Absent => self.absent += 1,
            NodeOutcome::Pending => self.pending += 1,
            NodeOutcome::Quarantined
            | NodeOutcome::TimedOut
            | NodeOutcome::Unreachable(_)
            | NodeOutcome::Denied(_)
            | NodeOutcome::Failed(_) => self.faulty += 1,
        }
    }

    /// The tally of a finished list of outcomes.
    pub(crate) fn of(outcomes: &[NodeOutcome]) -> Self {
        let mut tally = Self::new(outcomes.len());
        for outcome in outcomes {
            tally.add(outcome);
        }
        tally
    }

    fn quorum(&self) -> usize {
        quorum(self.nodes)
    }

    /// How many nodes may say no (or fail) while a quorum stays possible.
    fn spare(&self) -> usize {
        self.nodes - self.quorum()
    }
}

/// How a round ended, once that can no longer change.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub(crate) enum Settled {
    /// A quorum said yes.
    Reached,
    /// A quorum is out of reach, for the reason given.
    Failed(ErrorKind),
}

/// Whether an acquisition round is settled: granted when a quorum said yes; refused, once the
/// reason is certain whatever the nodes still pending say:
///
/// - [`ErrorKind::WrongType`] when more nodes than may fail hold a key of another type;
/// - [`ErrorKind::NotAcquired`] when a quorum of nodes answered (they are alive: it is
///   contention, not an outage);
/// - [`ErrorKind::Unavailable`] when so many nodes failed that no quorum of them can answer.
///
/// A round whose failure is already certain may go on waiting for nodes that can still
/// change its reason; each of them is bounded by its node timeout, and a hung minority is
/// never waited for when the others already make the reason certain.
pub(crate) fn settle_acquire(t: &Tally) -> Option<Settled> {
    let (q, spare) = (t.quorum(), t.spare());
    if t.ok >= q {
        return Some(Settled::Reached);
    }
    if t.ok + t.pending >= q {
        return None;
    }
    if t.wrong_type > spare {
        return Some(Settled::Failed(ErrorKind::WrongType));
    }
    if t.wrong_type + t.pending > spare {
        return None;
    }
    // Nodes that answered about the key are alive: with a quorum of them it is contention.
    if t.ok + t.held + t.wrong_type + t.absent >= q {
        Some(Settled::Failed(ErrorKind::NotAcquired))
    } else if t.faulty > t.spare() {
        Some(Settled::Failed(ErrorKind::Unavailable))
    } else {
        None
    }
}

/// [`settle_acquire`], except that `hung` of the pending nodes (nodes whose last request
/// timed out a moment ago) are not waited for to refuse the lock for contention: once the
/// nodes that answered show it (a quorum of them is alive) and only hung nodes could still
/// make up a quorum of yes votes, it is refused. A split vote among the live nodes then
/// costs a retry, not a node timeout per attempt; with no contention shown, hung nodes are
/// waited for as always (they may be the quorum's last hope).
pub(crate) fn settle_acquire_sparing(t: &Tally, hung: usize) -> Option<Settled> {
    let settled = settle_acquire(t);
    if settled.is_some() || hung == 0 {
        return settled;
    }
    let hung = hung.min(t.pending);
    let spared = Tally { pending: t.pending - hung, faulty: t.faulty + hung, ..*t };
    settle_acquire(&spared).filter(|s| *s == Settled::Failed(ErrorKind::NotAcquired))
}

/// Whether a round about a lock we hold (release, extend, check) is settled: reached when a
/// quorum said yes; [`ErrorKind::NotHeld`] once the lock is certainly gone from more nodes
/// than may fail; [`ErrorKind::Unavailable`] once too few nodes can still say either.
pub(crate) fn settle_hold(t: &Tally) -> Option<Settled> {
    let spare = t.spare();
    let gone = t.absent + t.held + t.wrong_type;
    if t.ok >= t.quorum() {
        Some(Settled::Reached)
    } else if t.ok + t.pending >= t.quorum() {
        None
    } else if gone > spare {
        Some(Settled::Failed(ErrorKind::NotHeld))
    } else if gone + t.pending > spare {
        None
    } else {
        Some(Settled::Failed(ErrorKind::Unavailable))
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use proptest::prelude::*;

    #[test]
    fn quorum_is_a_strict_majority() {
        assert_eq!(quorum(1), 1);
        assert_eq!(quorum(2), 2);
        assert_eq!(quorum(3), 2);
        assert_eq!(quorum(4), 3);
        assert_eq!(quorum(5), 3);
        assert_eq!(quorum(7), 4);
    }

    #[test]
    fn drift_follows_the_reference_constant() {
        assert_eq!(drift(Duration::from_secs(10), 0.01), Duration::from_millis(102));
        assert_eq!(drift(Duration::from_secs(10), 0.0), Duration::from_millis(2));
    }

    #[test]
    fn ttl_millis_rejects_zero_and_huge() {
        assert_eq!(ttl_millis(Duration::from_micros(999)), None);
        assert_eq!(ttl_millis(Duration::from_micros(1500)), Some(1));
        assert_eq!(ttl_millis(MAX_TTL + Duration::from_millis(1)), None);
        assert_eq!(ttl_millis(Duration::MAX), None);
    }

    fn tally(outcomes: &[NodeOutcome]) -> Tally {
        Tally::of(outcomes)
    }

    /// Issue 9, item 10: two dead nodes answer at once; the live ones are waited for, and
    /// the lock held on them is contention, not an outage.
    #[test]
    fn a_dead_minority_does_not_turn_contention_into_an_outage() {
        use NodeOutcome::{Held, Pending};
        let dead = || NodeOutcome::Unreachable("refused".into());
        let early = tally(&[dead(), dead(), Held, Pending, Pending]);
        assert_eq!(settle_acquire(&early), None, "the live nodes still decide the reason");
        let done = tally(&[dead(), dead(), Held, Held, Held]);
        assert_eq!(settle_acquire(&done), Some(Settled::Failed(ErrorKind::NotAcquired)));
        let outage = tally(&[dead(), dead(), dead(), Held, Pending]);
        assert_eq!(settle_acquire(&outage), Some(Settled::Failed(ErrorKind::Unavailable)));
    }

    #[test]
    fn a_hung_minority_is_not_waited_for_when_the_others_decide() {
        use NodeOutcome::{Held, Pending};
        let held_on_three = tally(&[Held, Held, Held, Pending, Pending]);
        assert_eq!(settle_acquire(&held_on_three), Some(Settled::Failed(ErrorKind::NotAcquired)));
        let granted = tally(&[NodeOutcome::Ok, NodeOutcome::Ok, NodeOutcome::Ok, Pending, Pending]);
        assert_eq!(settle_acquire(&granted), Some(Settled::Reached));
    }

    #[test]
    fn a_split_vote_does_not_wait_for_a_hung_node() {
        use NodeOutcome::{Held, Ok, Pending};
        let split = tally(&[Ok, Ok, Held, Held, Pending]);
        assert_eq!(settle_acquire(&split), None, "the fifth node could still make a quorum");
        let refused = Some(Settled::Failed(ErrorKind::NotAcquired));
        assert_eq!(settle_acquire_sparing(&split, 1), refused, "but it is hung");
        assert_eq!(settle_acquire_sparing(&split, 0), None);
        // Two hung nodes, one live node holding the key for another: contention shown.
        let two_hung = tally(&[Ok, Ok, Held, Pending, Pending]);
        assert_eq!(settle_acquire_sparing(&two_hung, 2), refused);
        assert_eq!(settle_acquire_sparing(&two_hung, 1), None, "a live node may still say yes");
    }

    #[test]
    fn a_hung_node_is_waited_for_when_no_contention_is_shown() {
        use NodeOutcome::{Ok, Pending};
        let dead = || NodeOutcome::Unreachable("refused".into());
        // Two dead, two yes: the hung node is the last hope of a quorum.
        let last_hope = tally(&[Ok, Ok, dead(), dead(), Pending]);
        assert_eq!(settle_acquire_sparing(&last_hope, 1), None);
        let granted = tally(&[Ok, Ok, Ok, Pending, Pending]);
        assert_eq!(settle_acquire_sparing(&granted, 2), Some(Settled::Reached));
    }

    fn outcome(code: u8) -> NodeOutcome {
        match code % 7 {
            0 => NodeOutcome::Ok,
            1 => NodeOutcome::Held,
            2 => NodeOutcome::WrongType,
            3 => NodeOutcome::Absent,
            4 => NodeOutcome::TimedOut,
            5 => NodeOutcome::Quarantined,
            _ => NodeOutcome::Unreachable("x".into()),
        }
    }

    proptest! {
        #[test]
        fn two_quorums_always_overlap(n in 1usize..64) {
            prop_assert!(2 * quorum(n) > n);
            prop_assert!(quorum(n) <= n);
        }

        /// Once settled, a round never changes its mind, whatever the pending nodes say,
        /// and with every node answered it is always settled.
        #[test]
        fn a_settled_round_never_changes_its_mind(
            codes in proptest::collection::vec(any::<u8>(), 1..10),
        ) {
            let n = codes.len();
            for settle in [settle_acquire, settle_hold] {
                let mut t = Tally::new(n);
                let mut first = None;
                for code in &codes {
                    t.add(&outcome(*code));
                    if let Some(s) = settle(&t) {
                        prop_assert_eq!(*first.get_or_insert(s), s);
                    }
                }
                prop_assert!(settle(&t).is_some(), "{:?}", t);
            }
        }

        /// Not waiting for hung nodes only ever refuses, and only for contention shown by
        /// a quorum of nodes that answered, when the nodes not hung cannot make a quorum;
        /// otherwise it decides as `settle_acquire`.
        #[test]
        fn sparing_hung_nodes_only_refuses_for_shown_contention(
            codes in proptest::collection::vec(any::<u8>(), 0..9),
            pending in 0usize..5,
            hung in 0usize..6,
        ) {
            let mut outcomes: Vec<NodeOutcome> = codes.iter().map(|c| outcome(*c)).collect();
            outcomes.extend((0..pending).map(|_| NodeOutcome::Pending));
            prop_assume!(!outcomes.is_empty());
            let t = tally(&outcomes);
            let (plain, spared) = (settle_acquire(&t), settle_acquire_sparing(&t, hung));
            if plain.is_some() || hung == 0 {
                prop_assert_eq!(spared, plain);
            } else if let Some(s) = spared {
                let q = quorum(t.nodes);
                prop_assert_eq!(s, Settled::Failed(ErrorKind::NotAcquired));
                prop_assert!(t.ok + t.held + t.wrong_type + t.absent >= q);
                prop_assert!(t.ok + t.pending.saturating_sub(hung) < q);
            }
        }

        /// The acquisition's reasons as the issue states them: a quorum of live nodes is
        /// contention, too few live nodes is an outage.
        #[test]
        fn acquisition_reasons_follow_the_live_nodes(
            codes in proptest::collection::vec(0u8..3, 1..10),
            faults in 0usize..10,
        ) {
            let mut outcomes: Vec<NodeOutcome> = codes.iter().map(|c| outcome(*c)).collect();
            outcomes.extend((0..faults).map(|_| NodeOutcome::TimedOut));
            let t = tally(&outcomes);
            let q = quorum(t.nodes);
            let expected = if t.ok >= q {
                Settled::Reached
            } else if t.wrong_type > t.nodes - q {
                Settled::Failed(ErrorKind::WrongType)
            } else if t.ok + t.held + t.wrong_type >= q {
                Settled::Failed(ErrorKind::NotAcquired)
            } else {
                Settled::Failed(ErrorKind::Unavailable)
            };
            prop_assert_eq!(settle_acquire(&t), Some(expected));
        }
    }
}
