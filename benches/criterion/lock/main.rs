//! Criterion benchmarks of lock+release against local `redis-server` nodes from the
//! testkit (or the nodes in `REDLOCK_NODES`, comma-separated; the fault scenarios need
//! local nodes and are skipped then). `cargo bench -p redlock-benches` runs them all in a
//! few minutes; `src/bin/compare.rs` prints the side-by-side table.

mod common;
mod cpu;
mod faults;
mod handoff;
mod hot_key;
mod kinds;
mod latency;
mod throughput;

criterion::criterion_main!(
    cpu::benches,
    latency::benches,
    faults::benches,
    throughput::benches,
    hot_key::benches,
    handoff::benches,
    kinds::benches
);
