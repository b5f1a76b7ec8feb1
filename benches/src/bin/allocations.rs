//! Heap allocations per lock+release, for each implementation, counted by a global
//! allocator that wraps the system one: every thread of the process counts (the caller's
//! runtime, a client's own background thread, `spawn_blocking` threads).
//!
//! Like `benches/instructions.sh`, the figure is the difference of two run lengths: after
//! `warm` untimed pairs, `short` pairs then `long` pairs are counted, and
//! `(long count - short count) / (long - short)` is the cost of one pair (what a run's
//! start and end leave in flight cancels out). Current-thread runtime
//! (`BENCH_RUNTIME=multi`: multi-thread, one worker), 5 local nodes (or `REDLOCK_NODES`),
//! the same settings as `instructions`.
//!
//! ```sh
//! cargo run --release -p redlock-benches --bin allocations -- [impl...]
//! # default: floor ours rslock; also redlock-rs
//! ```
//!
//! Prints per implementation: allocations (`alloc` calls), reallocations (`realloc`
//! calls), and bytes (allocated plus grown by reallocation), per lock+release.

use std::alloc::System;
use std::time::Duration;

use redlock_benches::{Client, Impl, Settings};
use redlock_testkit::Nodes;
use stats_alloc::{INSTRUMENTED_SYSTEM, Region, Stats, StatsAlloc};

#[global_allocator]
static GLOBAL: &StatsAlloc<System> = &INSTRUMENTED_SYSTEM;

const WARM: usize = 200;
const SHORT: usize = 1_000;
const LONG: usize = 11_000;

/// One counted run: what `pairs` lock+release pairs allocated.
fn count(runtime: &tokio::runtime::Runtime, client: &Client, key: &str, pairs: usize) -> Stats {
    let region = Region::new(GLOBAL);
    runtime.block_on(async {
        for _ in 0..pairs {
            client.lock_release(key).await.expect("lock+release");
        }
    });
    region.change()
}

/// Per pair, from two runs of different lengths.
fn per_pair(short: &Stats, long: &Stats) -> (f64, f64, f64) {
    let n = (LONG - SHORT) as f64;
    let diff = |a: usize, b: usize| (b as f64 - a as f64) / n;
    let bytes = |s: &Stats| s.bytes_allocated as f64 + s.bytes_reallocated.max(0) as f64;
    (
        diff(short.allocations, long.allocations),
        diff(short.reallocations, long.reallocations),
        (bytes(long) - bytes(short)) / n,
    )
}

fn main() {
    let args: Vec<String> = std::env::args().skip(1).collect();
    let names: Vec<&str> = if args.is_empty() {
        vec!["floor", "ours", "rslock"]
    } else {
        args.iter().map(String::as_str).collect()
    };
    let imps: Vec<Impl> = names
        .iter()
        .map(|name| {
            Impl::from_name(name).unwrap_or_else(|| {
                eprintln!("usage: allocations [ours|floor|rslock|redlock-rs ...]");
                std::process::exit(2);
            })
        })
        .collect();
    let nodes =
        Nodes::from_env_or_start(5).unwrap_or_else(|e| panic!("cannot start the nodes: {e}"));
    let runtime = redlock_benches::counting_runtime();
    let settings = Settings { node_timeout: Duration::from_secs(2), ..Settings::default() };
    println!("{:<11} {:>14} {:>14} {:>14}", "impl", "allocs/pair", "reallocs/pair", "bytes/pair");
    for imp in imps {
        let client =
            runtime.block_on(Client::connect(imp, &nodes.urls(), settings)).expect("connect");
        let key = format!("bench:allocations:{imp}");
        count(&runtime, &client, &key, WARM);
        let short = count(&runtime, &client, &key, SHORT);
        let long = count(&runtime, &client, &key, LONG);
        let (allocs, reallocs, bytes) = per_pair(&short, &long);
        println!("{:<11} {allocs:>14.1} {reallocs:>14.1} {bytes:>14.0}", imp.name());
    }
}
