//! Pure CPU: the quorum and validity arithmetic and token generation, without a network.

use std::hint::black_box;
use std::time::Duration;

use criterion::{Criterion, criterion_group};
use redlock::bench_internals as internals;

fn cpu(c: &mut Criterion) {
    let mut group = c.benchmark_group("cpu");
    group.bench_function("quorum", |b| b.iter(|| internals::quorum(black_box(5))));
    group.bench_function("validity", |b| {
        b.iter(|| {
            internals::validity(
                black_box(Duration::from_secs(10)),
                black_box(Duration::from_micros(350)),
                black_box(0.01),
            )
        })
    });
    let votes = [true, false, true, true, false];
    group.bench_function("decide-5-nodes", |b| b.iter(|| internals::decide(black_box(&votes))));
    group.bench_function("token", |b| b.iter(internals::token));
    group.finish();
}

criterion_group!(benches, cpu);
