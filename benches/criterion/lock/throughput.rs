//! 64 concurrent tasks locking and releasing distinct keys on five nodes.

use criterion::{BenchmarkId, Criterion, Throughput, criterion_group};
use redlock_benches::{Impl, runtime, timed_concurrent};
use redlock_testkit::Nodes;

use crate::common;

const TASKS: usize = 64;

fn throughput(c: &mut Criterion) {
    let nodes =
        Nodes::from_env_or_start(5).unwrap_or_else(|e| panic!("cannot start the nodes: {e}"));
    let runtime = runtime(2);
    let urls = nodes.first(5);
    let mut group = c.benchmark_group("64-tasks");
    common::short(&mut group);
    group.throughput(Throughput::Elements(1));
    for imp in Impl::ALL {
        let Some(client) = common::client(&runtime, imp, &urls) else { continue };
        let keys: Vec<String> =
            (0..TASKS).map(|i| format!("bench:criterion:tp:{imp}:{i}")).collect();
        group.bench_function(BenchmarkId::new(imp.name(), "5-nodes"), |b| {
            b.to_async(&runtime).iter_custom(|iters| timed_concurrent(&client, &keys, iters, false))
        });
    }
    group.finish();
}

criterion_group!(benches, throughput);
