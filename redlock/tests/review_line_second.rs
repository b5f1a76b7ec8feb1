//! Second review of the waiting line (61148fb): a skipped tick paced past `max_wait` pushed
//! the last real attempt beyond it (fixed: the paced tick is checked against the policy).

mod common;

use std::time::{Duration, Instant};

use redlock::{ErrorKind, Retry};
use redlock_testkit::FaultyCluster;

fn every(delay: Duration, max_wait: Duration) -> Retry {
    Retry::new()
        .with_unbounded_attempts()
        .with_delay(delay)
        .with_jitter(Duration::ZERO)
        .with_max_wait(max_wait)
}

fn ms(n: u64) -> Duration {
    Duration::from_millis(n)
}

async fn subscribed(faulty: &FaultyCluster, key: &str) {
    let ok = common::eventually(Duration::from_secs(5), || {
        common::subscribers(faulty.cluster(), key).iter().all(|n| *n >= 1)
    })
    .await;
    assert!(ok, "the first waiter never got in line");
}

/// (b) A skipped tick is paced `pause + the first waiter's last attempt`, but only
/// `waited + pause <= max_wait` is checked before it: the next tick, the "last real
/// attempt", can start after max_wait. Attempts take ~500 ms (250 ms each way); the
/// second waiter polls every 600 ms with max_wait 1.3 s. Baseline (198491b): it gives up
/// by ~1.6 s (no attempt starts after 1.3 s). Now: tick at 0.6 s skipped (0.6 + 0.6 <=
/// 1.3), next due 0.6 + 0.6 + 0.5 = 1.7 s, a real attempt starting 0.4 s past max_wait,
/// error at ~2.2 s.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_skipped_tick_does_not_push_the_last_attempt_past_max_wait() {
    let faulty = FaultyCluster::start(5).unwrap();
    let rl = common::builder_for(faulty.urls(), Duration::from_secs(1)).build().unwrap();
    common::warm(&rl).await;
    let holder = common::client(faulty.cluster());
    let held = holder.try_lock("mw2").await.unwrap();
    for i in 0..5 {
        faulty.proxy(i).set_fault(common::latency(250));
    }
    // First in line: attempts back to back (10 ms pause, ~500 ms attempts).
    let first = tokio::spawn({
        let rl = rl.clone();
        async move { rl.lock("mw2").retry(every(ms(10), Duration::from_secs(8))).await.map(drop) }
    });
    subscribed(&faulty, "mw2").await;
    // Let it finish a couple of attempts (held = true).
    tokio::time::sleep(ms(1200)).await;
    let asked = Instant::now();
    let err = rl.lock("mw2").retry(every(ms(600), ms(1300))).await.unwrap_err();
    let waited = asked.elapsed();
    first.abort();
    held.release().await.unwrap();
    assert_eq!(err.kind(), ErrorKind::NotAcquired, "{err}");
    assert!(
        waited < ms(1950),
        "gave up after {waited:?}: max_wait 1.3 s plus one ~500 ms attempt is ~1.8 s; a \
         skipped tick pushed the last real attempt past max_wait"
    );
}
