//! A waiter behind the first one in line does not spin on its skipped ticks. It measures
//! the CPU of the whole process, so it runs while no other test does (`crate::serial`).

use crate::common;

use std::time::Duration;

use redlock::Retry;

fn every(delay: Duration) -> Retry {
    Retry::new()
        .with_unbounded_attempts()
        .with_delay(delay)
        .with_jitter(Duration::ZERO)
        .with_max_wait(Duration::from_secs(5))
}

/// Process CPU time (user + system) so far, from /proc/self/stat, in clock ticks.
fn cpu_ticks() -> u64 {
    let stat = std::fs::read_to_string("/proc/self/stat").unwrap();
    let fields: Vec<&str> = stat.rsplit(')').next().unwrap().split_whitespace().collect();
    fields[11].parse::<u64>().unwrap() + fields[12].parse::<u64>().unwrap()
}

/// A waiter with no pause behind a live first waiter lets that one attempt for it: it must
/// not have it make round after round (half a core until `max_wait`), but ask for one at
/// most every 50 ms. Measured in a debug build: about 3-5 ticks in the second with or
/// without two busy loops beside it (a round costs the process ~1.5 ms of CPU), 40-70
/// back to back.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_waiter_with_no_pause_behind_a_live_first_one_does_not_spin() {
    let _serial = crate::serial();
    let cluster = common::cluster(5);
    let holder = common::client(&cluster);
    let rl = common::builder(&cluster, Duration::from_millis(200))
        .retry(every(Duration::from_millis(100)))
        .build()
        .unwrap();
    let held = holder.try_lock("spin").await.unwrap();
    let first = tokio::spawn({
        let rl = rl.clone();
        async move { rl.lock("spin").await.map(drop) }
    });
    // The first waiter failed once and is in line.
    let in_line = || common::subscribers(&cluster, "spin").iter().all(|&n| n >= 1);
    assert!(common::eventually(Duration::from_secs(3), in_line).await);
    let second = tokio::spawn({
        let rl = rl.clone();
        async move { rl.lock("spin").retry(every(Duration::ZERO)).await.map(drop) }
    });
    tokio::time::sleep(Duration::from_millis(200)).await;
    let before = cpu_ticks();
    tokio::time::sleep(Duration::from_secs(1)).await;
    let used = cpu_ticks() - before;
    held.release().await.unwrap();
    first.await.unwrap().unwrap();
    second.await.unwrap().unwrap();
    eprintln!("cpu ticks in 1 s: {used}");
    assert!(used < 10, "{used} clock ticks of CPU in 1 s of waiting");
}
