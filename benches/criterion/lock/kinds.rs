//! Every kind of ours (a counting lock's permit included) against the plain lock, on five
//! nodes: one lock+release after another, and 64 tasks on distinct keys.

use criterion::{BenchmarkId, Criterion, Throughput, criterion_group};
use redlock_benches::{Impl, runtime, timed_concurrent, timed_sequential};
use redlock_testkit::Nodes;

use crate::common;

const TASKS: usize = 64;

fn kinds(c: &mut Criterion) {
    let nodes =
        Nodes::from_env_or_start(5).unwrap_or_else(|e| panic!("cannot start the nodes: {e}"));
    let runtime = runtime(2);
    let urls = nodes.first(5);
    let clients: Vec<_> =
        Impl::KINDS.into_iter().filter_map(|imp| common::client(&runtime, imp, &urls)).collect();
    let mut group = c.benchmark_group("kinds-lock+release");
    common::short(&mut group);
    for client in &clients {
        let key = format!("bench:criterion:kind:{}", client.kind());
        group.bench_function(BenchmarkId::new(client.kind().name(), "5-nodes"), |b| {
            b.to_async(&runtime).iter_custom(|iters| timed_sequential(client, &key, iters))
        });
    }
    group.finish();
    let mut group = c.benchmark_group("kinds-64-tasks");
    common::short(&mut group);
    group.throughput(Throughput::Elements(1));
    for client in &clients {
        let keys: Vec<String> =
            (0..TASKS).map(|i| format!("bench:criterion:kind-tp:{}:{i}", client.kind())).collect();
        group.bench_function(BenchmarkId::new(client.kind().name(), "5-nodes"), |b| {
            b.to_async(&runtime).iter_custom(|iters| timed_concurrent(client, &keys, iters, false))
        });
    }
    group.finish();
}

criterion_group!(benches, kinds);
