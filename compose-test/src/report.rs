//! What a scenario showed, whether that is right, and the table of all of them.

use std::fmt::Write;
use std::time::Duration;

use redlock_testkit::Violation;

use crate::scenario::{Expect, Scenario};

/// The outcome of one scenario run.
#[derive(Debug)]
pub struct Report {
    /// The scenario.
    pub scenario: Scenario,
    /// Locks granted.
    pub grants: usize,
    /// Grants whose whole attempt ran while the fault was in force.
    pub granted_while_faulted: u64,
    /// Attempts refused for any reason.
    pub refused: u64,
    /// Of those, refused because too few masters answered (`ErrorKind::Unavailable`).
    pub unavailable: u64,
    /// Pairs of grants whose validity windows overlapped.
    pub violations: Vec<Violation>,
    /// Critical sections whose counter update was lost.
    pub lost_updates: u64,
    /// Lock keys still on the masters after the run.
    pub keys_left: usize,
    /// For crashes: whether every crashed master still had the key written before it was
    /// killed (`appendfsync always` on a kept volume).
    pub data_kept: Option<bool>,
    /// How long the hit masters took to serve again after the heal command was issued.
    pub recovery: Option<Duration>,
}

impl Report {
    /// Whether the run showed what the scenario expects; `Err` says what differed.
    pub fn verdict(&self) -> Result<(), String> {
        if !self.violations.is_empty() || self.lost_updates > 0 {
            let first = self.violations.first().map(|v| format!(": {v}")).unwrap_or_default();
            return Err(format!(
                "exclusion broke: {} violations, {} lost updates{first}",
                self.violations.len(),
                self.lost_updates
            ));
        }
        if self.data_kept == Some(false) {
            return Err("a crashed master came back without its data".to_owned());
        }
        if self.keys_left > 0 {
            return Err(format!("{} lock keys left behind", self.keys_left));
        }
        match self.scenario.expect {
            Expect::Available if self.grants == 0 => Err("no lock was granted".to_owned()),
            Expect::Unavailable if self.granted_while_faulted > 0 => {
                Err(format!("{} grants while the majority was down", self.granted_while_faulted))
            }
            _ => Ok(()),
        }
    }
}

/// A Markdown table of reports, one row each, in the chaos suite's shape.
pub fn markdown(reports: &[Report]) -> String {
    let mut table = String::from(
        "| scenario | fault | grants | during fault | refused | unavailable | violations | lost updates | keys left | data kept | back in | verdict |\n\
         |---|---|---:|---:|---:|---:|---:|---:|---:|---|---:|---|\n",
    );
    for r in reports {
        let verdict = match (r.verdict(), r.scenario.expect) {
            (Ok(()), Expect::Available) => "ok".to_owned(),
            (Ok(()), Expect::Unavailable) => "unavailable, safe".to_owned(),
            (Err(why), _) => format!("FAIL: {why}"),
        };
        let data_kept = match r.data_kept {
            Some(true) => "yes",
            Some(false) => "NO",
            None => "",
        };
        let recovery = r.recovery.map(|d| format!("{:.1} s", d.as_secs_f64())).unwrap_or_default();
        let _ = writeln!(
            table,
            "| {} | {} | {} | {} | {} | {} | {} | {} | {} | {} | {} | {} |",
            r.scenario.name,
            r.scenario.fault_label(),
            r.grants,
            r.granted_while_faulted,
            r.refused,
            r.unavailable,
            r.violations.len(),
            r.lost_updates,
            r.keys_left,
            data_kept,
            recovery,
            verdict
        );
    }
    table
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::scenario::matrix;

    fn report(name: &str) -> Report {
        let scenario = matrix().into_iter().find(|s| s.name == name).expect("a scenario");
        Report {
            scenario,
            grants: 10,
            granted_while_faulted: 0,
            refused: 5,
            unavailable: 0,
            violations: Vec::new(),
            lost_updates: 0,
            keys_left: 0,
            data_kept: None,
            recovery: None,
        }
    }

    #[test]
    fn a_clean_run_passes() {
        assert_eq!(report("baseline").verdict(), Ok(()));
        assert_eq!(report("crash-3").verdict(), Ok(()));
    }

    #[test]
    fn a_lost_update_fails_any_scenario() {
        let mut r = report("crash-3");
        r.lost_updates = 1;
        assert!(r.verdict().unwrap_err().contains("exclusion broke"));
    }

    #[test]
    fn a_grant_while_the_majority_is_down_fails() {
        let mut r = report("crash-3");
        r.granted_while_faulted = 1;
        assert!(r.verdict().is_err());
        let mut r = report("partition-2");
        r.granted_while_faulted = 1;
        assert_eq!(r.verdict(), Ok(()));
    }

    #[test]
    fn a_restart_without_its_data_fails() {
        let mut r = report("crash-restart-1");
        r.data_kept = Some(false);
        assert!(r.verdict().unwrap_err().contains("without its data"));
    }

    #[test]
    fn no_grant_at_all_fails_where_locks_should_be_granted() {
        let mut r = report("frozen-1");
        r.grants = 0;
        assert!(r.verdict().is_err());
    }

    #[test]
    fn the_table_has_one_row_per_report_and_says_fail() {
        let mut bad = report("baseline");
        bad.keys_left = 2;
        let table = markdown(&[report("crash-3"), bad]);
        assert_eq!(table.lines().count(), 4);
        assert!(table.contains("| unavailable, safe |"));
        assert!(table.contains("FAIL: 2 lock keys left behind"));
    }
}
