//! Pure CPU: the quorum and deadline arithmetic and token generation, without a network.

use std::hint::black_box;
use std::time::Duration;

use criterion::{Criterion, criterion_group};
use redlock::bench_internals as internals;

fn cpu(c: &mut Criterion) {
    let mut group = c.benchmark_group("cpu");
    group.bench_function("quorum", |b| b.iter(|| internals::quorum(black_box(5))));
    let started_at = std::time::Instant::now();
    group.bench_function("deadline", |b| {
        b.iter(|| {
            internals::deadline(
                black_box(Duration::from_secs(10)),
                black_box(0.01),
                black_box(started_at),
            )
        })
    });
    let votes = [true, false, true, true, false];
    group.bench_function("decide-5-nodes", |b| b.iter(|| internals::decide(black_box(&votes))));
    group.bench_function("token", |b| b.iter(internals::token));
    group.finish();
}

criterion_group!(benches, cpu);
