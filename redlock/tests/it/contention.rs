//! Many clients, one resource: the critical sections never overlap.

use crate::common;

use std::time::Duration;

use redis::Commands;
use redlock::{Redlock, Retry};
use redlock_testkit::RedisNode;

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn contending_clients_lose_no_update() {
    let cluster = common::cluster(5);
    let counter = RedisNode::start().unwrap();
    const CLIENTS: usize = 8;
    const SECTIONS: usize = 25;
    let tasks: Vec<_> = (0..CLIENTS)
        .map(|_| {
            // Separate clients (separate connections), as separate processes would have.
            let rl = Redlock::builder()
                .nodes(cluster.urls())
                .ttl(Duration::from_secs(5))
                .node_timeout(Duration::from_millis(200))
                .retry(
                    Retry::new()
                        .with_unbounded_attempts()
                        .with_delay(Duration::from_millis(1))
                        .with_jitter(Duration::from_millis(10))
                        .with_max_wait(Duration::from_secs(60)),
                )
                .build()
                .unwrap();
            let mut counter = counter.connection().unwrap();
            tokio::spawn(async move {
                for _ in 0..SECTIONS {
                    let lock = rl.lock("counter").await.unwrap();
                    // A non-atomic read-modify-write: only mutual exclusion keeps it right.
                    let value: i64 = counter.get("count").unwrap_or(0);
                    tokio::time::sleep(Duration::from_millis(1)).await;
                    let () = counter.set("count", value + 1).unwrap();
                    assert!(lock.is_valid());
                    lock.release().await.unwrap();
                }
            })
        })
        .collect();
    for task in tasks {
        task.await.unwrap();
    }
    let count: i64 = counter.connection().unwrap().get("count").unwrap();
    assert_eq!(count, (CLIENTS * SECTIONS) as i64);
    assert_eq!(cluster.count_key("counter"), 0);
}
