//! Lock+release over five nodes with one node hung (SIGSTOP; node timeout 50 ms) and with
//! one node dead (killed). redlock-rs is left out: a hung node blocks it forever (it has no
//! timeout) and a dead node makes every call fail.

use criterion::{BenchmarkId, Criterion, SamplingMode, criterion_group};
use redlock_benches::{Impl, runtime, timed_sequential};
use redlock_testkit::Nodes;

use crate::common;

const FAULTY: usize = 4;

fn faults(c: &mut Criterion) {
    let mut nodes =
        Nodes::from_env_or_start(5).unwrap_or_else(|e| panic!("cannot start the nodes: {e}"));
    if nodes.cluster_mut().is_none() {
        eprintln!("faults: skipped, they need local nodes (REDLOCK_NODES is set)");
        return;
    }
    let runtime = runtime(2);
    let urls = nodes.first(5);
    let mut group = c.benchmark_group("one-node-hung");
    common::short(&mut group);
    // The floor waits out the node timeout on every call (~100 ms), rslock its client's
    // response timeout (~1 s): too slow for criterion's sampling, so ours and the floor only.
    group.sampling_mode(SamplingMode::Flat).sample_size(10);
    let clients: Vec<_> = [Impl::Floor, Impl::Ours]
        .into_iter()
        .filter_map(|imp| common::client(&runtime, imp, &urls))
        .collect();
    set_paused(&mut nodes, true);
    for client in &clients {
        let key = format!("bench:criterion:hung:{}", client.kind());
        group.bench_function(BenchmarkId::new(client.kind().name(), "5-nodes"), |b| {
            b.to_async(&runtime).iter_custom(|iters| timed_sequential(client, &key, iters))
        });
    }
    set_paused(&mut nodes, false);
    group.finish();

    let mut group = c.benchmark_group("one-node-dead");
    common::short(&mut group);
    let clients: Vec<_> = [Impl::Floor, Impl::Ours, Impl::Rslock]
        .into_iter()
        .filter_map(|imp| common::client(&runtime, imp, &urls))
        .collect();
    if let Some(cluster) = nodes.cluster_mut() {
        cluster.node_mut(FAULTY).kill().expect("kill a node");
    }
    for client in &clients {
        let key = format!("bench:criterion:dead:{}", client.kind());
        group.bench_function(BenchmarkId::new(client.kind().name(), "5-nodes"), |b| {
            b.to_async(&runtime).iter_custom(|iters| timed_sequential(client, &key, iters))
        });
    }
    group.finish();
}

fn set_paused(nodes: &mut Nodes, paused: bool) {
    if let Some(cluster) = nodes.cluster_mut() {
        let node = cluster.node_mut(FAULTY);
        if paused { node.pause() } else { node.resume() }.expect("pause/resume a node");
    }
}

criterion_group!(benches, faults);
