//! The exclusion checks: the history of grants and the lossy counter.

use std::{
    sync::{Barrier, Mutex},
    thread,
    time::{Duration, Instant},
};

use redlock_testkit::{Counter, Grant, History, RedisNode};

fn ms(n: u64) -> Duration {
    Duration::from_millis(n)
}

/// A grant held over `[t0 + from, t0 + until)` in milliseconds.
fn grant(t0: Instant, client: usize, token: &str, from: u64, until: u64) -> Grant {
    Grant::new(client, token, t0 + ms(from), t0 + ms(until))
}

#[test]
fn overlapping_windows_are_reported() {
    let t0 = Instant::now();
    let history = History::new();
    assert!(history.is_empty());
    history.record(grant(t0, 1, "b", 50, 150));
    history.record(grant(t0, 0, "a", 0, 100));
    assert_eq!(history.len(), 2);

    let violations = history.violations();
    assert_eq!(violations.len(), 1);
    let v = &violations[0];
    // Ordered by start, whatever the recording order.
    assert_eq!((v.first.token.as_str(), v.second.token.as_str()), ("a", "b"));
    assert_eq!(v.overlap, ms(50));
    assert!(v.to_string().contains("client 0 (token a) and client 1 (token b)"), "{v}");
}

#[test]
fn touching_and_disjoint_windows_are_not() {
    let t0 = Instant::now();
    let history = History::new();
    history.record(grant(t0, 0, "a", 0, 100));
    history.record(grant(t0, 1, "b", 100, 200)); // touches a
    history.record(grant(t0, 2, "c", 300, 400)); // disjoint
    assert!(history.violations().is_empty(), "{:?}", history.violations());
}

#[test]
fn a_window_contained_in_another_and_many_overlaps() {
    let t0 = Instant::now();
    let history = History::new();
    history.record(grant(t0, 0, "long", 0, 1000));
    history.record(grant(t0, 1, "x", 100, 200));
    history.record(grant(t0, 2, "y", 150, 300));
    history.record(grant(t0, 3, "z", 2000, 3000));
    let mut pairs: Vec<_> = history
        .violations()
        .into_iter()
        .map(|v| (v.first.token, v.second.token, v.overlap))
        .collect();
    pairs.sort();
    assert_eq!(
        pairs,
        [
            ("long".into(), "x".into(), ms(100)),
            ("long".into(), "y".into(), ms(150)),
            ("x".into(), "y".into(), ms(50)),
        ]
    );
}

#[test]
fn release_shortens_a_window() {
    let t0 = Instant::now();
    let history = History::new();
    let a = history.record(grant(t0, 0, "a", 0, 100));
    history.record(grant(t0, 1, "b", 60, 160));
    assert_eq!(history.violations().len(), 1);
    history.released(a, t0 + ms(60));
    assert!(history.violations().is_empty());
    assert_eq!(history.grants()[0].released_at, Some(t0 + ms(60)));
    // A release after the validity does not lengthen the window.
    history.released(a, t0 + ms(500));
    assert_eq!(history.violations()[0].overlap, ms(40));
}

#[test]
fn same_token_grants_are_not_compared() {
    let t0 = Instant::now();
    let history = History::new();
    // The same lock, e.g. extended.
    history.record(grant(t0, 0, "a", 0, 100));
    history.record(grant(t0, 0, "a", 50, 150));
    assert!(history.violations().is_empty());
    // The same client with another token is compared.
    history.record(grant(t0, 0, "a2", 120, 200));
    assert_eq!(history.violations().len(), 1);
}

#[test]
fn clones_share_the_record() {
    let history = History::new();
    let t0 = Instant::now();
    thread::scope(|s| {
        for client in 0..4 {
            let history = history.clone();
            s.spawn(move || history.record(grant(t0, client, &client.to_string(), 0, 10)));
        }
    });
    assert_eq!(history.len(), 4);
    assert_eq!(history.violations().len(), 6);
}

/// Two threads, `each` increments with `pause` inside, optionally serialized by a mutex.
fn run_counter(serialize: bool, each: i64) -> i64 {
    let node = RedisNode::start().unwrap();
    let counter = Counter::new(&node, "counter").unwrap();
    assert_eq!(counter.value().unwrap(), 0);
    let lock = Mutex::new(());
    let barrier = Barrier::new(2);
    thread::scope(|s| {
        for _ in 0..2 {
            s.spawn(|| {
                barrier.wait();
                for _ in 0..each {
                    let _guard = serialize.then(|| lock.lock().unwrap());
                    counter.increment(ms(10)).unwrap();
                }
            });
        }
    });
    counter.value().unwrap()
}

#[test]
fn counter_loses_updates_when_increments_overlap() {
    let value = run_counter(false, 5);
    assert!(value < 10, "{value}: the check could never fail");
}

#[test]
fn counter_counts_every_serialized_increment() {
    assert_eq!(run_counter(true, 5), 10);
}
