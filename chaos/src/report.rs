//! What a scenario showed, and the table of all of them.

use std::fmt::Write;

use redlock_testkit::{LimitViolation, Violation};

use crate::scenario::{Expect, Kind, Scenario};

/// The outcome of one scenario run.
#[derive(Debug)]
pub struct Report {
    /// The scenario.
    pub scenario: Scenario,
    /// Locks granted.
    pub grants: usize,
    /// How many clients contended.
    pub clients: usize,
    /// How many of them were granted a lock at least once.
    pub clients_granted: usize,
    /// Pairs of read shares, or of a counting lock's permits, that overlapped: evidence
    /// that readers, or permit holders, did share.
    pub shared_overlaps: usize,
    /// Locks granted while the fault was in force.
    pub granted_while_faulted: u64,
    /// Attempts refused (held by another client, nodes unavailable, lease used up).
    pub refused: u64,
    /// Grants whose fencing token was not larger than that of a grant that ended before
    /// they started.
    pub fencing_violations: usize,
    /// Pairs of grants whose validity windows overlapped (for a counting lock: two holders
    /// of one slot).
    pub violations: Vec<Violation>,
    /// Stretches of time with more permits held at once than the counting lock has.
    pub over_limit: Vec<LimitViolation>,
    /// Critical sections whose counter update was lost.
    pub lost_updates: u64,
    /// Writes made after the writer's lease had expired.
    pub stale_writes: u64,
    /// Writes the fenced resource rejected as stale.
    pub rejected_writes: u64,
    /// Lock keys still on the nodes after the run.
    pub keys_left: usize,
}

impl Report {
    /// Whether the run showed what the scenario expects; `Err` says what differed.
    pub fn verdict(&self) -> Result<(), String> {
        let broken = !self.violations.is_empty()
            || !self.over_limit.is_empty()
            || self.lost_updates > 0
            || self.fencing_violations > 0;
        let counted = self.scenario.kind == Kind::Semaphore;
        match self.scenario.expect {
            Expect::Available if broken => Err(format!("exclusion broke: {}", self.summary())),
            Expect::Available if self.grants == 0 => Err("no lock was granted".to_owned()),
            Expect::Available if counted && self.clients_granted < self.clients => Err(format!(
                "only {} of {} waiting clients got a permit",
                self.clients_granted, self.clients
            )),
            Expect::Available if counted && self.shared_overlaps == 0 => {
                Err("no two permits were ever held at once".to_owned())
            }
            Expect::Unavailable if broken => Err(format!("exclusion broke: {}", self.summary())),
            Expect::Unavailable if self.granted_while_faulted > 0 => {
                Err(format!("{} grants while the fault lasted", self.granted_while_faulted))
            }
            Expect::Violation if !broken => {
                Err("the weakness did not show: no violation was detected".to_owned())
            }
            Expect::StaleWrite if !self.violations.is_empty() => {
                Err(format!("unexpected overlap: {}", self.summary()))
            }
            Expect::StaleWrite if self.stale_writes == 0 => {
                Err("the stalled client did not write late".to_owned())
            }
            Expect::StaleWrite
                if self.scenario.fenced()
                    && (self.rejected_writes == 0 || self.lost_updates > 0) =>
            {
                Err(format!("fencing did not stop the late write: {}", self.summary()))
            }
            _ if self.keys_left > 0 && self.scenario.expect != Expect::Violation => {
                Err(format!("{} lock keys left behind", self.keys_left))
            }
            _ => Ok(()),
        }
    }

    fn summary(&self) -> String {
        format!(
            "{} violations, {} stretches over the limit, {} fencing-order violations, {} lost updates, {} stale writes, {} rejected",
            self.violations.len(),
            self.over_limit.len(),
            self.fencing_violations,
            self.lost_updates,
            self.stale_writes,
            self.rejected_writes
        )
    }
}

/// A Markdown table of reports, one row each.
pub fn markdown(reports: &[Report]) -> String {
    let mut table = String::from(
        "| scenario | kind | fault | grants | during fault | refused | shared overlaps | violations | token order | lost updates | stale writes | fenced rejects | keys left | verdict |\n\
         |---|---|---|---:|---:|---:|---:|---:|---:|---:|---:|---:|---:|---|\n",
    );
    for r in reports {
        let verdict = match (r.verdict(), r.scenario.expect) {
            (Ok(()), Expect::Violation) => "weakness shown".to_owned(),
            (Ok(()), Expect::StaleWrite) if r.scenario.fenced() => "late write rejected".to_owned(),
            (Ok(()), Expect::StaleWrite) => "expired lease (needs fencing)".to_owned(),
            (Ok(()), Expect::Unavailable) => "unavailable, safe".to_owned(),
            (Ok(()), Expect::Available) => "ok".to_owned(),
            (Err(why), _) => format!("FAIL: {why}"),
        };
        let _ = writeln!(
            table,
            "| {} | {} | {} | {} | {} | {} | {} | {} | {} | {} | {} | {} | {} | {} |",
            r.scenario.name,
            r.scenario.kind.name(),
            r.scenario.fault_label(),
            r.grants,
            r.granted_while_faulted,
            r.refused,
            r.shared_overlaps,
            r.violations.len() + r.over_limit.len(),
            r.fencing_violations,
            r.lost_updates,
            r.stale_writes,
            r.rejected_writes,
            r.keys_left,
            verdict
        );
    }
    table
}
