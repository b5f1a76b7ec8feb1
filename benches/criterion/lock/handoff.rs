//! The handoff gap on a hot key: four tasks take turns with the blocking lock (each holds
//! for 1 ms), and each iteration is the time from a release to the next grant, counted only
//! when someone was waiting. Ours and rslock (the floor has no blocking lock; redlock-rs
//! polls in a blocking loop).

use std::time::Duration;

use criterion::{BenchmarkId, Criterion, criterion_group};
use redlock_benches::{Impl, runtime, timed_handoffs};
use redlock_testkit::Nodes;

use crate::common;

const TASKS: usize = 4;
const HOLD: Duration = Duration::from_millis(1);

fn handoff(c: &mut Criterion) {
    let nodes =
        Nodes::from_env_or_start(5).unwrap_or_else(|e| panic!("cannot start the nodes: {e}"));
    let runtime = runtime(2);
    let urls = nodes.first(5);
    let mut group = c.benchmark_group("handoff-gap-4-tasks");
    common::short(&mut group);
    for imp in [Impl::Ours, Impl::Rslock] {
        let Some(client) = common::client(&runtime, imp, &urls) else { continue };
        let key = format!("bench:criterion:handoff:{imp}");
        group.bench_function(BenchmarkId::new(imp.name(), "5-nodes"), |b| {
            b.to_async(&runtime)
                .iter_custom(|iters| timed_handoffs(&client, &key, TASKS, HOLD, iters))
        });
    }
    group.finish();
}

criterion_group!(benches, handoff);
