//! The scenarios: which fault on which masters, and what a correct client shows under it.

use crate::fault::Fault;

/// What the run must show, besides exclusion (which every scenario must keep).
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Expect {
    /// Locks keep being granted: a quorum of masters is left.
    Available,
    /// No lock is granted while the fault lasts: a majority of masters is gone.
    Unavailable,
}

/// One row of the table.
#[derive(Clone, Debug)]
pub struct Scenario {
    /// Its name in the table.
    pub name: &'static str,
    /// The fault, or `None` for the baseline.
    pub fault: Option<Fault>,
    /// The masters it hits, by index into `REDLOCK_NODES`.
    pub nodes: &'static [usize],
    /// What the run must show.
    pub expect: Expect,
}

impl Scenario {
    /// `docker pause on [2]`, or `none`.
    pub fn fault_label(&self) -> String {
        match self.fault {
            Some(fault) => format!("{} on {:?}", fault.label(), self.nodes),
            None => "none".to_owned(),
        }
    }
}

/// Every scenario, in the order they run. Five masters: a quorum is three.
pub fn matrix() -> Vec<Scenario> {
    use Expect::*;
    use Fault::*;
    let row = |name, fault, nodes, expect| Scenario { name, fault, nodes, expect };
    vec![
        row("baseline", None, &[], Available),
        row("frozen-1", Some(Pause), &[2], Available),
        row("crash-restart-1", Some(Crash), &[2], Available),
        row("partition-1", Some(Disconnect), &[2], Available),
        row("partition-2", Some(Disconnect), &[0, 3], Available),
        row("crash-3", Some(Crash), &[0, 2, 4], Unavailable),
    ]
}
