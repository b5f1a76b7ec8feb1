//! The bounded interleaving fuzzer: randomized schedules over every kind find no violation,
//! and the same checks do find one when the clients' quorums cannot meet (two exclusive
//! holders at once, or more holders than a counting lock's permits).

use redlock_chaos::{FuzzConfig, FuzzKind, fuzz};
use redlock_testkit::Fuzz;

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn randomized_schedules_over_every_kind_find_no_violation() {
    let seed = Fuzz::seed_from_env_or_random();
    // 16 schedules per kind.
    let schedules = 16 * FuzzKind::ALL.len();
    let report = fuzz(&FuzzConfig::new(schedules, seed)).await;
    println!("{}", report.markdown());
    assert_eq!(report.total_schedules(), schedules);
    for kind in FuzzKind::ALL {
        let granted = report.grants.get(kind.name()).copied().unwrap_or(0);
        assert!(granted > 0, "seed {seed}: no {} hold was ever granted", kind.name());
    }
    assert!(
        report.violations.is_empty(),
        "seed {seed} (replay with REDLOCK_FUZZ_SEED={seed}):\n{}",
        report.violations.join("\n")
    );
}

/// The plain lock and `with_lock` for a user the nodes refuse scripts: on Valkey 9 every
/// request is a native command, extensions that set the lease outright included (elsewhere
/// the releases and extensions are refused, and the keys expire).
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn unscripted_schedules_of_the_plain_lock_find_no_violation() {
    let seed = Fuzz::seed_from_env_or_random();
    let config = FuzzConfig {
        kinds: vec![FuzzKind::Plain, FuzzKind::WithLock],
        unscripted: true,
        ..FuzzConfig::new(48, seed)
    };
    let report = fuzz(&config).await;
    println!("{}", report.markdown());
    assert!(report.grants.values().sum::<usize>() > 0, "seed {seed}: nothing was granted");
    assert!(
        report.violations.is_empty(),
        "seed {seed} (replay with REDLOCK_FUZZ_SEED={seed}):\n{}",
        report.violations.join("\n")
    );
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_broken_quorum_is_caught() {
    let seed = Fuzz::seed_from_env_or_random();
    let config = FuzzConfig {
        kinds: vec![FuzzKind::Plain, FuzzKind::Fenced],
        broken_quorum: true,
        ..FuzzConfig::new(24, seed)
    };
    let report = fuzz(&config).await;
    assert!(
        report.violations.iter().any(|v| v.contains("overlap")),
        "seed {seed}: clients with disjoint quorums were never caught holding at once"
    );
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_broken_quorum_letting_more_holders_than_permits_in_is_caught() {
    let seed = Fuzz::seed_from_env_or_random();
    let config = FuzzConfig {
        kinds: vec![FuzzKind::Semaphore],
        broken_quorum: true,
        // Three holders at once need three of the clients to overlap: about one schedule
        // in eight shows it, so 64 schedules miss it with odds below one in a thousand.
        ..FuzzConfig::new(64, seed)
    };
    let report = fuzz(&config).await;
    println!("{}", report.markdown());
    let over = report.violations.iter().filter(|v| v.contains("over the limit")).count();
    println!("seed {seed}: {over} stretches over the limit");
    assert!(
        over > 0,
        "seed {seed}: clients with disjoint quorums were never caught holding more than {} permits",
        redlock_chaos::PERMITS
    );
}
