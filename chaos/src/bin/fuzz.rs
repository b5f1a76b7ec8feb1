//! The interleaving fuzzer, for longer than the test suite runs it; prints a Markdown table.
//!
//! ```text
//! cargo run --release -p redlock-chaos --bin fuzz [-- --schedules 2000] [--seed N]
//!     [--only INDEX] [--broken-quorum] [--unscripted] [--kinds plain,semaphore,...]
//! ```

use redlock_chaos::{FuzzConfig, FuzzKind, fuzz};
use redlock_testkit::Fuzz;

#[tokio::main]
async fn main() {
    let mut config = FuzzConfig::new(2000, Fuzz::seed_from_env_or_random());
    let mut args = std::env::args().skip(1);
    while let Some(arg) = args.next() {
        match arg.as_str() {
            "--broken-quorum" => config.broken_quorum = true,
            "--unscripted" => config.unscripted = true,
            "--schedules" => config.schedules = number(args.next()),
            "--seed" => config.seed = number(args.next()) as u64,
            "--only" => config.only = Some(number(args.next())),
            "--parallel" => config.parallel = number(args.next()),
            "--kinds" => config.kinds = kinds(args.next()),
            _ => usage(),
        }
    }
    let report = fuzz(&config).await;
    println!(
        "seed {}: {} schedules in {:.1} s, {} violations\n",
        report.seed,
        report.total_schedules(),
        report.elapsed.as_secs_f64(),
        report.violations.len()
    );
    println!("{}", report.markdown());
    for violation in &report.violations {
        println!("{violation}");
    }
    if !report.violations.is_empty() {
        std::process::exit(1);
    }
}

fn number(value: Option<String>) -> usize {
    value.and_then(|v| v.parse().ok()).unwrap_or_else(|| usage())
}

/// A comma-separated list of kind names, as the report prints them.
fn kinds(value: Option<String>) -> Vec<FuzzKind> {
    let value = value.unwrap_or_else(|| usage());
    value
        .split(',')
        .map(|name| {
            FuzzKind::ALL.into_iter().find(|kind| kind.name() == name).unwrap_or_else(|| usage())
        })
        .collect()
}

fn usage() -> ! {
    let names: Vec<&str> = FuzzKind::ALL.iter().map(|kind| kind.name()).collect();
    eprintln!(
        "usage: fuzz [--schedules N] [--seed N] [--only INDEX] [--parallel N] [--broken-quorum] \
         [--unscripted] [--kinds {}]",
        names.join(",")
    );
    std::process::exit(2)
}
