//! The full chaos matrix, for longer than the test suite runs it; prints a Markdown table.
//!
//! ```text
//! cargo run --release -p redlock-chaos --bin chaos [-- --seconds 6] [--only NAME]
//! ```

use std::time::Duration;

use redlock_chaos::{markdown, matrix, run};

#[tokio::main]
async fn main() {
    let mut seconds = 6u64;
    let mut only: Option<String> = None;
    let mut args = std::env::args().skip(1);
    while let Some(arg) = args.next() {
        match (arg.as_str(), args.next()) {
            ("--seconds", Some(value)) => match value.parse() {
                Ok(value) => seconds = value,
                Err(_) => usage(),
            },
            ("--only", Some(value)) => only = Some(value),
            _ => usage(),
        }
    }
    let mut reports = Vec::new();
    for scenario in matrix() {
        if only.as_deref().is_some_and(|name| !scenario.name.contains(name)) {
            continue;
        }
        eprintln!("running {} for {seconds} s ...", scenario.name);
        reports.push(run(&scenario, Duration::from_secs(seconds)).await);
    }
    println!("{}", markdown(&reports));
    let failed = reports.iter().filter(|r| r.verdict().is_err()).count();
    if failed > 0 {
        eprintln!("{failed} scenario(s) did not show what they should");
        std::process::exit(1);
    }
}

fn usage() -> ! {
    eprintln!("usage: chaos [--seconds N] [--only NAME]");
    std::process::exit(2);
}
