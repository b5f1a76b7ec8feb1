//! Instructions per lock+release, for callgrind: `warm` untimed lock+release pairs, then
//! `measured` ones, on a current-thread runtime (`BENCH_RUNTIME=multi`: multi-thread, one
//! worker) against 5 local nodes (or `REDLOCK_NODES`). The nodes are separate processes, not traced.
//!
//! Instructions per lock+release = the difference of the totals of two runs that differ
//! only in `measured`, divided by that difference:
//!
//! ```sh
//! cargo build --release -p redlock-benches --bin instructions
//! for m in 100 1100; do
//!   valgrind --tool=callgrind --callgrind-out-file=/tmp/cg.ours.$m \
//!     target/release/instructions ours 200 $m
//! done
//! # (total Ir of the 1100 run - total Ir of the 100 run) / 1000; `callgrind_annotate
//! # /tmp/cg.ours.1100` shows where they go. Implementations: ours, floor, rslock, redlock-rs.
//! ```
//!
//! `benches/instructions.sh` runs exactly this for every implementation.

use std::time::Duration;

use redlock_benches::{Client, Impl, Settings};
use redlock_testkit::Nodes;

fn main() {
    let args: Vec<String> = std::env::args().skip(1).collect();
    let usage = "usage: instructions <ours|floor|rslock|redlock-rs> <warm> <measured>";
    let (Some(imp), Some(warm), Some(measured)) = (
        args.first().and_then(|name| Impl::from_name(name)),
        args.get(1).and_then(|n| n.parse::<usize>().ok()),
        args.get(2).and_then(|n| n.parse::<usize>().ok()),
    ) else {
        eprintln!("{usage}");
        std::process::exit(2);
    };
    let nodes =
        Nodes::from_env_or_start(5).unwrap_or_else(|e| panic!("cannot start the nodes: {e}"));
    let runtime = redlock_benches::counting_runtime();
    // Under valgrind everything is ~50x slower: a generous node timeout keeps every node in.
    let settings = Settings { node_timeout: Duration::from_secs(2), ..Settings::default() };
    runtime.block_on(async {
        let client = Client::connect(imp, &nodes.urls(), settings).await.expect("connect");
        let key = format!("bench:instructions:{imp}");
        for _ in 0..warm {
            client.lock_release(&key).await.expect("lock+release");
        }
        for _ in 0..measured {
            client.lock_release(&key).await.expect("lock+release");
        }
    });
}
