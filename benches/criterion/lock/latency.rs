//! Uncontended lock+release latency for N = 1, 3, 5, 7, 9 nodes, every implementation.

use criterion::{BenchmarkId, Criterion, criterion_group};
use redlock_benches::{Impl, runtime, timed_sequential};
use redlock_testkit::Nodes;

use crate::common;

fn lock_release(c: &mut Criterion) {
    let nodes =
        Nodes::from_env_or_start(9).unwrap_or_else(|e| panic!("cannot start the nodes: {e}"));
    let runtime = runtime(2);
    let mut group = c.benchmark_group("lock+release");
    common::short(&mut group);
    for n in [1, 3, 5, 7, 9].into_iter().filter(|&n| n <= nodes.urls().len()) {
        for imp in Impl::ALL {
            let Some(client) = common::client(&runtime, imp, &nodes.first(n)) else { continue };
            let key = format!("bench:criterion:lat{n}:{imp}");
            group.bench_function(BenchmarkId::new(imp.name(), format!("{n}-nodes")), |b| {
                b.to_async(&runtime).iter_custom(|iters| timed_sequential(&client, &key, iters))
            });
        }
    }
    group.finish();
}

criterion_group!(benches, lock_release);
