//! A hot key: eight tasks waiting on one resource with the blocking `lock()` (random pause
//! of up to 10 ms between attempts in every implementation), each releasing at once.

use criterion::{BenchmarkId, Criterion, Throughput, criterion_group};
use redlock_benches::{Impl, runtime, timed_concurrent};
use redlock_testkit::Nodes;

use crate::common;

const WAITERS: usize = 8;

fn hot_key(c: &mut Criterion) {
    let nodes =
        Nodes::from_env_or_start(5).unwrap_or_else(|e| panic!("cannot start the nodes: {e}"));
    let runtime = runtime(2);
    let urls = nodes.first(5);
    let mut group = c.benchmark_group("hot-key-8-waiters");
    common::short(&mut group);
    group.throughput(Throughput::Elements(1));
    for imp in Impl::ALL {
        let Some(client) = common::client(&runtime, imp, &urls) else { continue };
        let keys = vec![format!("bench:criterion:hot:{imp}"); WAITERS];
        group.bench_function(BenchmarkId::new(imp.name(), "5-nodes"), |b| {
            b.to_async(&runtime).iter_custom(|iters| timed_concurrent(&client, &keys, iters, true))
        });
    }
    group.finish();
}

criterion_group!(benches, hot_key);
