//! The compose fault test: contending redlock clients against the five masters of
//! `docker-compose.yml` while real containers are paused, killed and restarted, and cut
//! off their network; prints a Markdown table, exits non-zero when a scenario fails.
//!
//! ```text
//! eval "export $(scripts/compose-up)"
//! cargo run -p redlock-compose-test -- [--seconds 8] [--only NAME]
//! ```
//!
//! The masters come from `REDLOCK_NODES` (loopback URLs); each is driven through the
//! container that publishes its port. The counter of the exclusion check lives on a
//! separate `redis-server` started on loopback (`redis-server` must be on `PATH`, or
//! `REDLOCK_REDIS_SERVER` set). Every docker call, Redis request and scenario is bounded in
//! time; after a failure every fault is undone before exiting.

mod docker;
mod fault;
mod node;
mod report;
mod run;
mod scenario;

use std::process::ExitCode;
use std::time::Duration;

use redlock_testkit::RedisNode;

use crate::docker::Container;
use crate::report::{Report, markdown};
use crate::scenario::matrix;

/// Beyond its own duration, what one scenario may take (heals, readiness, clean-up).
const SCENARIO_SLACK: Duration = Duration::from_secs(90);

struct Args {
    seconds: u64,
    only: Option<String>,
}

#[tokio::main]
async fn main() -> ExitCode {
    let args = parse_args();
    let urls: Vec<String> = match std::env::var("REDLOCK_NODES") {
        Ok(list) if !list.trim().is_empty() => {
            list.split(',').map(|url| url.trim().to_owned()).collect()
        }
        _ => return fail("REDLOCK_NODES is not set: run `eval \"export $(scripts/compose-up)\"`"),
    };
    let mut masters = Vec::new();
    for url in &urls {
        match Container::behind(url).await {
            Ok(container) => masters.push(container),
            Err(err) => return fail(&err),
        }
    }
    for m in &masters {
        eprintln!("master {} is container {}", m.url, m.name);
    }
    let store = match RedisNode::start() {
        Ok(store) => store,
        Err(err) => return fail(&format!("cannot start the counter's redis-server: {err}")),
    };

    let duration = Duration::from_secs(args.seconds);
    let mut reports: Vec<Report> = Vec::new();
    for scenario in matrix() {
        if args.only.as_deref().is_some_and(|name| !scenario.name.contains(name)) {
            continue;
        }
        eprintln!(
            "running {} ({}) for {} s ...",
            scenario.name,
            scenario.fault_label(),
            args.seconds
        );
        let outcome = tokio::time::timeout(
            duration + SCENARIO_SLACK,
            run::run(&scenario, &masters, &store.url(), duration),
        )
        .await
        .unwrap_or_else(|_| Err(format!("{} did not finish in time", scenario.name)));
        match outcome {
            Ok(report) => reports.push(report),
            Err(err) => {
                // Leave the masters as compose-up made them, whatever state the failure left.
                for m in &masters {
                    m.heal_everything().await;
                }
                println!("{}", markdown(&reports));
                return fail(&format!("{}: {err}", scenario.name));
            }
        }
    }

    println!("{}", markdown(&reports));
    let failed: Vec<_> = reports.iter().filter(|r| r.verdict().is_err()).collect();
    for r in &failed {
        eprintln!("{}: {}", r.scenario.name, r.verdict().err().unwrap_or_default());
    }
    // The closing line CI looks for.
    println!("compose: {} passed, {} failed", reports.len() - failed.len(), failed.len());
    if failed.is_empty() { ExitCode::SUCCESS } else { ExitCode::FAILURE }
}

fn fail(why: &str) -> ExitCode {
    eprintln!("compose-test: {why}");
    ExitCode::FAILURE
}

fn parse_args() -> Args {
    let mut parsed = Args { seconds: 8, only: None };
    let mut args = std::env::args().skip(1);
    while let Some(arg) = args.next() {
        match (arg.as_str(), args.next()) {
            // Below 4 s the quarters around the fault are shorter than the lease.
            ("--seconds", Some(value)) => match value.parse() {
                Ok(seconds) if seconds >= 4 => parsed.seconds = seconds,
                _ => usage(),
            },
            ("--only", Some(value)) => parsed.only = Some(value),
            _ => usage(),
        }
    }
    parsed
}

fn usage() -> ! {
    eprintln!("usage: compose-test [--seconds N (4 or more, default 8)] [--only NAME]");
    std::process::exit(2);
}
