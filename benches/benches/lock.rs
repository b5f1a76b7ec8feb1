//! Lock + release latency, uncontended, against five local nodes (or the nodes in
//! `REDLOCK_NODES`, comma-separated).

use std::time::Duration;

use criterion::{Criterion, criterion_group, criterion_main};
use redlock::Redlock;
use redlock_benches::Nodes;

fn lock_release(c: &mut Criterion) {
    let nodes = Nodes::from_env_or_start(5);
    let runtime = tokio::runtime::Builder::new_multi_thread()
        .worker_threads(1)
        .enable_all()
        .build()
        .unwrap();
    let rl = Redlock::builder()
        .nodes(nodes.urls())
        .ttl(Duration::from_secs(10))
        .node_timeout(Duration::from_millis(50))
        .build()
        .unwrap();
    // Open the connections before measuring.
    runtime.block_on(async {
        rl.try_lock("bench:warm")
            .await
            .unwrap()
            .release()
            .await
            .unwrap()
    });

    let mut group = c.benchmark_group("uncontended");
    group.bench_function(format!("lock+release/{}-nodes", nodes.urls().len()), |b| {
        b.to_async(&runtime).iter(|| async {
            let lock = rl.try_lock("bench:uncontended").await.unwrap();
            lock.release().await.unwrap();
        })
    });
    group.finish();
}

criterion_group!(benches, lock_release);
criterion_main!(benches);
