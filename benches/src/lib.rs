//! Shared pieces of the benchmarks: the implementations under comparison, the
//! scenario runners and the statistics. Used by the criterion benches (`criterion/lock/`)
//! and by the comparison binary (`src/bin/compare.rs`).
//!
//! The implementations ([`Impl`]) all run against the same node URLs:
//! - `ours`: this workspace's `redlock` crate;
//! - `floor`: the same Redis commands with no library around them (`SET key token NX PX`
//!   on every node in parallel, then the compare-and-delete script by `EVALSHA` on every
//!   node in parallel, over raw redis-rs multiplexed connections, each bounded by the node
//!   timeout);
//! - `rslock`: the `rslock` crate (async);
//! - `redlock-rs`: the `redlock` 2.x crate from crates.io (sync, run in `spawn_blocking`).
//!
//! Our other kinds ([`Impl::KINDS`]: fenced, reentrant, multi, read, write, a counting
//! lock's permit) run against our plain lock in the same rounds.

mod attempts;
mod client;
mod machine;
mod run;
mod stats;

pub use client::{Client, Impl, SEMAPHORE_PERMITS, Settings, Turns};
pub use machine::machine_line;
pub use run::{
    Batch, handoff_batch, hot_key_batch, latency_batch, throughput_batch, timed_concurrent,
    timed_handoffs, timed_sequential,
};
pub use stats::{Samples, fmt_duration};

/// The client runtime of every benchmark: Tokio multi-thread with one worker per core
/// (`workers`), as a service would run.
///
/// # Panics
/// When the runtime cannot be built.
pub fn runtime(workers: usize) -> tokio::runtime::Runtime {
    tokio::runtime::Builder::new_multi_thread()
        .worker_threads(workers)
        .enable_all()
        .build()
        .expect("a Tokio runtime")
}

/// The runtime of the per-operation counts (`instructions`, `allocations`): current-thread
/// by default; `BENCH_RUNTIME=multi` gives a multi-thread one with a single worker, where
/// ours sends on connections of the caller's runtime instead of the client's own thread.
///
/// # Panics
/// When the runtime cannot be built, or `BENCH_RUNTIME` is neither `current` nor `multi`.
pub fn counting_runtime() -> tokio::runtime::Runtime {
    match std::env::var("BENCH_RUNTIME").as_deref() {
        Ok("multi") => runtime(1),
        Ok("current") | Err(_) => tokio::runtime::Builder::new_current_thread()
            .enable_all()
            .build()
            .expect("a Tokio runtime"),
        Ok(other) => panic!("BENCH_RUNTIME={other}: expected current or multi"),
    }
}
