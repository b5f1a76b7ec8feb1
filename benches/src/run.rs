//! Scenario runners: one batch of one implementation, returning its samples.

use std::sync::Arc;
use std::sync::atomic::{AtomicU64, Ordering};
use std::time::{Duration, Instant};

use crate::client::{Client, Turns};
use crate::stats::{Samples, process_cpu};

/// How much one latency batch may do.
#[derive(Clone, Copy, Debug)]
pub struct Batch {
    /// At most this many operations.
    pub samples: usize,
    /// No new operation starts after this much time.
    pub max_time: Duration,
}

/// Sequential lock+release of `key`, one at a time (uncontended latency).
pub async fn latency_batch(client: &Client, key: &str, batch: Batch) -> Samples {
    let start = Instant::now();
    let cpu = process_cpu();
    let mut samples = Samples::default();
    for _ in 0..batch.samples {
        if start.elapsed() >= batch.max_time {
            break;
        }
        let t = Instant::now();
        let result = client.lock_release(key).await;
        samples.record(t.elapsed(), result);
    }
    samples.cpu = process_cpu().saturating_sub(cpu);
    samples
}

/// `tasks` concurrent tasks, each locking and releasing its own key (`{prefix}:{i}`) in a
/// loop for `duration`; throughput counts successful lock+release pairs.
pub async fn throughput_batch(
    client: &Client,
    tasks: usize,
    duration: Duration,
    prefix: &str,
) -> Samples {
    let keys = (0..tasks).map(|i| format!("{prefix}:{i}")).collect();
    concurrent(client, keys, duration, false).await
}

/// `tasks` concurrent tasks on one `key`, each waiting for it with the implementation's
/// blocking lock and releasing it at once, for `duration`.
pub async fn hot_key_batch(
    client: &Client,
    tasks: usize,
    duration: Duration,
    key: &str,
) -> Samples {
    concurrent(client, vec![key.to_owned(); tasks], duration, true).await
}

/// `tasks` tasks taking turns on one `key` for `duration`, each holding it for `hold`:
/// the samples are the handoff gaps (release started to next grant).
pub async fn handoff_batch(
    client: &Client,
    tasks: usize,
    hold: Duration,
    duration: Duration,
    key: &str,
) -> Samples {
    let turns = Turns::default();
    let deadline = Instant::now() + duration;
    let failed_before = crate::attempts::failed();
    let handles: Vec<_> = (0..tasks)
        .map(|_| {
            let (client, key, turns) = (client.clone(), key.to_owned(), turns.clone());
            tokio::spawn(async move {
                let mut errors = Samples::default();
                while Instant::now() < deadline {
                    match client.take_turn(&key, hold, &turns).await {
                        None => break,
                        Some(Ok(())) => {}
                        Some(Err(e)) => errors.record(Duration::ZERO, Err(e)),
                    }
                }
                errors
            })
        })
        .collect();
    let mut total = Samples::default();
    for handle in handles {
        if let Ok(errors) = handle.await {
            total.merge(errors);
        }
    }
    total.latencies = turns.gaps();
    if client.kind() == crate::Impl::Ours
        && let (Some(before), Some(after)) = (failed_before, crate::attempts::failed())
    {
        total.failed_attempts = after - before;
    }
    total
}

async fn concurrent(client: &Client, keys: Vec<String>, duration: Duration, wait: bool) -> Samples {
    let start = Instant::now();
    let cpu = process_cpu();
    let deadline = start + duration;
    let handles: Vec<_> = keys
        .into_iter()
        .map(|key| {
            let client = client.clone();
            tokio::spawn(async move {
                let mut samples = Samples::default();
                while Instant::now() < deadline {
                    let t = Instant::now();
                    let result = if wait {
                        client.lock_wait_release(&key).await
                    } else {
                        client.lock_release(&key).await
                    };
                    samples.record(t.elapsed(), result);
                }
                samples
            })
        })
        .collect();
    let mut total = Samples::default();
    for handle in handles {
        match handle.await {
            Ok(samples) => total.merge(samples),
            Err(e) => total.record(Duration::ZERO, Err(format!("task failed: {e}"))),
        }
    }
    total.ops = total.latencies.len() as u64;
    total.busy = start.elapsed();
    total.cpu = process_cpu().saturating_sub(cpu);
    total
}

/// For criterion's `iter_custom`: `ops` lock+release pairs of `key`, one after another, in
/// a task on the runtime's workers (as in the comparison binary); returns their time.
///
/// # Panics
/// When a lock+release fails: the benchmark would measure the wrong thing.
pub async fn timed_sequential(client: &Client, key: &str, ops: u64) -> Duration {
    let (client, key) = (client.clone(), key.to_owned());
    let task = tokio::spawn(async move {
        let start = Instant::now();
        for _ in 0..ops {
            client.lock_release(&key).await.expect("lock+release");
        }
        start.elapsed()
    });
    task.await.expect("benchmark task")
}

/// For criterion's `iter_custom`: `ops` operations shared by one task per key (each taking
/// the next operation until all are done); returns the time for all of them. With `wait`,
/// each operation is a blocking lock (keys may repeat: a hot key), else one attempt.
/// Failed operations (e.g. node timeouts on an overloaded machine) count as done and are
/// reported on stderr, so that the benchmark shows them instead of aborting.
pub async fn timed_concurrent(client: &Client, keys: &[String], ops: u64, wait: bool) -> Duration {
    let left = Arc::new(AtomicU64::new(ops));
    let start = Instant::now();
    let tasks: Vec<_> = keys
        .iter()
        .map(|key| {
            let (client, key, left) = (client.clone(), key.clone(), left.clone());
            tokio::spawn(async move {
                while left
                    .fetch_update(Ordering::Relaxed, Ordering::Relaxed, |n| n.checked_sub(1))
                    .is_ok()
                {
                    let result = if wait {
                        client.lock_wait_release(&key).await
                    } else {
                        client.lock_release(&key).await
                    };
                    if let Err(err) = result {
                        eprintln!("lock+release failed: {err}");
                    }
                }
            })
        })
        .collect();
    for task in tasks {
        task.await.expect("benchmark task");
    }
    start.elapsed()
}

/// For criterion's `iter_custom`: `tasks` tasks taking turns on `key` (each holding it for
/// `hold`) until `gaps` handoffs were measured; returns the sum of those gaps (release
/// started to next grant, counted only when someone was waiting).
///
/// # Panics
/// When a turn fails, or for an implementation without a blocking lock.
pub async fn timed_handoffs(
    client: &Client,
    key: &str,
    tasks: usize,
    hold: Duration,
    gaps: u64,
) -> Duration {
    let turns = Turns::default();
    let wanted = usize::try_from(gaps).unwrap_or(usize::MAX);
    let handles: Vec<_> = (0..tasks)
        .map(|_| {
            let (client, key, turns) = (client.clone(), key.to_owned(), turns.clone());
            tokio::spawn(async move {
                while turns.len() < wanted {
                    let turn = client.take_turn(&key, hold, &turns).await;
                    turn.expect("a blocking lock").expect("a turn");
                }
            })
        })
        .collect();
    for handle in handles {
        handle.await.expect("benchmark task");
    }
    turns.gaps().into_iter().take(wanted).sum()
}
