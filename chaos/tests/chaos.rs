//! The bounded chaos suite: every scenario of the matrix, briefly.

use std::time::Duration;

use redlock_chaos::{markdown, matrix, run};

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn every_scenario_shows_what_it_should() {
    let mut reports = Vec::new();
    for scenario in matrix() {
        let duration = if scenario.quarantine.is_zero() { 1200 } else { 2500 };
        reports.push(run(&scenario, Duration::from_millis(duration)).await);
    }
    let table = markdown(&reports);
    println!("{table}");
    let failures: Vec<String> = reports
        .iter()
        .filter_map(|r| r.verdict().err().map(|why| format!("{}: {why}", r.scenario.name)))
        .collect();
    assert!(failures.is_empty(), "{}\n{table}", failures.join("\n"));
}
