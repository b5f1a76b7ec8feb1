//! The exclusion checks: the history of grants (exclusion, holders counted against a limit,
//! fencing order) and the lossy counter.

use std::{
    sync::{Barrier, Mutex},
    thread,
    time::{Duration, Instant},
};

use redlock_testkit::{Counter, Grant, History, Mode, RedisNode};

fn ms(n: u64) -> Duration {
    Duration::from_millis(n)
}

/// A grant held over `[t0 + from, t0 + until)` in milliseconds.
fn grant(t0: Instant, client: usize, token: &str, from: u64, until: u64) -> Grant {
    Grant::new(client, token, t0 + ms(from), t0 + ms(until))
}

/// The violations as sorted `(first token, second token, overlap)`.
fn overlapping(history: &History) -> Vec<(String, String, Duration)> {
    let mut pairs: Vec<_> = history
        .violations()
        .into_iter()
        .map(|v| (v.first.token, v.second.token, v.overlap))
        .collect();
    pairs.sort();
    pairs
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
    assert_eq!(
        overlapping(&history),
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

/// A shared grant held over `[t0 + from, t0 + until)` in milliseconds.
fn share(t0: Instant, client: usize, token: &str, from: u64, until: u64) -> Grant {
    Grant::shared(client, token, t0 + ms(from), t0 + ms(until))
}

#[test]
fn grants_are_exclusive_unless_made_shared() {
    let t0 = Instant::now();
    assert_eq!(grant(t0, 0, "a", 0, 1).mode, Mode::Exclusive);
    assert_eq!(share(t0, 0, "a", 0, 1).mode, Mode::Shared);
    assert_eq!(grant(t0, 0, "a", 0, 1).fence, None);
    assert_eq!(grant(t0, 0, "a", 0, 1).with_fence(7).fence, Some(7));
}

#[test]
fn overlapping_shared_grants_are_fine_and_counted() {
    let t0 = Instant::now();
    let history = History::new();
    history.record(share(t0, 0, "a", 0, 100));
    history.record(share(t0, 1, "b", 50, 150));
    history.record(share(t0, 2, "c", 60, 70));
    assert!(history.violations().is_empty());
    assert_eq!(history.shared_overlaps(), 3);
}

#[test]
fn an_exclusive_grant_overlapping_a_shared_or_an_exclusive_one_is_reported() {
    let t0 = Instant::now();
    let history = History::new();
    history.record(share(t0, 0, "r1", 0, 100));
    history.record(share(t0, 1, "r2", 20, 60));
    history.record(grant(t0, 2, "w1", 90, 200)); // overlaps r1 by 10
    history.record(grant(t0, 3, "w2", 150, 300)); // overlaps w1 by 50
    history.record(share(t0, 4, "r3", 300, 400)); // touches w2 only
    assert_eq!(
        overlapping(&history),
        [("r1".into(), "w1".into(), ms(10)), ("w1".into(), "w2".into(), ms(50))]
    );
    assert_eq!(history.shared_overlaps(), 1);
}

#[test]
fn a_release_ends_a_write_window_and_one_token_never_conflicts_with_itself() {
    let t0 = Instant::now();
    let history = History::new();
    let w = history.record(grant(t0, 0, "w", 0, 1000));
    history.record(grant(t0, 0, "w", 500, 1500)); // the same lock, extended
    history.released(w, t0 + ms(100));
    history.record(share(t0, 1, "r1", 100, 200)); // after the release
    history.record(share(t0, 2, "r2", 600, 700)); // inside the extension
    let violations = history.violations();
    assert_eq!(violations.len(), 1, "{violations:?}");
    let v = &violations[0];
    assert_eq!((v.first.token.as_str(), v.second.token.as_str()), ("w", "r2"));
    assert!(v.to_string().contains("client 2 (shared token r2)"), "{v}");
}

/// A permit held over `[t0 + from, t0 + until)` in milliseconds.
fn permit(t0: Instant, client: usize, token: &str, from: u64, until: u64) -> Grant {
    Grant::permit(client, token, t0 + ms(from), t0 + ms(until))
}

#[test]
fn one_holder_more_than_the_limit_is_reported_and_the_limit_itself_is_accepted() {
    let t0 = Instant::now();
    let history = History::new();
    // Three permits overlap over [40, 50), two at most elsewhere.
    history.record(permit(t0, 0, "a", 0, 50));
    history.record(permit(t0, 1, "b", 20, 100));
    history.record(permit(t0, 2, "c", 40, 120));
    history.record(permit(t0, 3, "d", 100, 200)); // touches b's end: b and d never hold at once
    assert!(history.over_limit(3).is_empty(), "{:?}", history.over_limit(3));
    // Permits may overlap each other: no exclusion violation.
    assert!(history.violations().is_empty());

    let found = history.over_limit(2);
    assert_eq!(found.len(), 1, "{found:?}");
    let v = &found[0];
    assert_eq!((v.from - t0, v.until - t0, v.most, v.limit), (ms(40), ms(50), 3, 2));
    let tokens: Vec<&str> = v.holders.iter().map(|g| g.token.as_str()).collect();
    assert_eq!(tokens, ["a", "b", "c"]);
    assert_eq!(v.duration(), ms(10));
    let message = v.to_string();
    assert!(message.starts_with("3 holders at once (at most 2 allowed) for 10ms:"), "{message}");
    assert!(message.contains("client 2 (permit token c)"), "{message}");

    // Over a limit of one, the stretch runs from the first overlap to the last one's end:
    // at 100 b ends as d starts, and c still holds.
    let found = history.over_limit(1);
    let stretches: Vec<_> = found.iter().map(|v| (v.from - t0, v.until - t0, v.most)).collect();
    assert_eq!(stretches, [(ms(20), ms(120), 3)]);
}

#[test]
fn l_plus_one_holders_at_once_are_reported_for_every_limit() {
    // L + 1 permits overlapping at one instant, for each L: reported against L, not L + 1.
    let t0 = Instant::now();
    for limit in 1..=6 {
        let history = History::new();
        for client in 0..=limit {
            let from = client as u64 * 10;
            history.record(permit(t0, client, &format!("p{client}"), from, from + 100));
        }
        let found = history.over_limit(limit);
        assert_eq!(found.len(), 1, "limit {limit}: {found:?}");
        assert_eq!(found[0].most, limit + 1);
        assert_eq!(found[0].holders.len(), limit + 1);
        assert!(history.over_limit(limit + 1).is_empty(), "limit {limit}");
    }
}

#[test]
fn one_token_is_one_holder_and_a_release_makes_room() {
    let t0 = Instant::now();
    let history = History::new();
    history.record(permit(t0, 0, "a", 0, 100));
    history.record(permit(t0, 0, "a", 50, 150)); // a's extension: still one holder
    let b = history.record(permit(t0, 1, "b", 0, 100));
    assert!(history.over_limit(2).is_empty(), "{:?}", history.over_limit(2));

    history.record(permit(t0, 2, "c", 60, 160));
    let found = history.over_limit(2);
    assert_eq!(found.len(), 1, "{found:?}");
    assert_eq!((found[0].from - t0, found[0].until - t0), (ms(60), ms(100)));
    // b released before c came in: never three at once.
    history.released(b, t0 + ms(60));
    assert!(history.over_limit(2).is_empty(), "{:?}", history.over_limit(2));
}

#[test]
fn a_permit_overlapping_an_exclusive_grant_is_an_exclusion_violation() {
    let t0 = Instant::now();
    let history = History::new();
    history.record(permit(t0, 0, "p1", 0, 100));
    history.record(permit(t0, 1, "p2", 10, 100));
    history.record(grant(t0, 2, "w", 90, 200));
    assert_eq!(
        overlapping(&history),
        [("p1".into(), "w".into(), ms(10)), ("p2".into(), "w".into(), ms(10))]
    );
    // The permits shared, as read shares do.
    assert_eq!(history.shared_overlaps(), 1);
    assert_eq!(permit(t0, 0, "p", 0, 1).mode, Mode::Counted);
}

/// Fenced grants, each `(token, fence, from, until)`, recorded in the order given.
fn fenced(grants: &[(&str, u64, u64, u64)]) -> History {
    let t0 = Instant::now();
    let history = History::new();
    for (client, &(token, fence, from, until)) in grants.iter().enumerate() {
        history.record(grant(t0, client, token, from, until).with_fence(fence));
    }
    history
}

#[test]
fn increasing_fences_in_grant_order_are_fine() {
    let history = fenced(&[("a", 1, 0, 100), ("b", 2, 100, 200), ("c", 5, 250, 300)]);
    assert!(history.fencing_violations().is_empty());
}

#[test]
fn a_later_grant_with_a_smaller_or_equal_fence_is_reported_against_the_largest_earlier_one() {
    // Recorded out of order; "c" starts after both "a" and "b" ended, with a token below b's.
    let history = fenced(&[("c", 3, 300, 400), ("a", 1, 0, 100), ("b", 9, 100, 200)]);
    let found = history.fencing_violations();
    assert_eq!(found.len(), 1, "{found:?}");
    assert_eq!((found[0].earlier.token.as_str(), found[0].later.token.as_str()), ("b", "c"));
    let message = found[0].to_string();
    assert!(message.contains("client 0 (token c, fence 3) started after client 2"), "{message}");

    // An equal token is not larger either.
    assert_eq!(fenced(&[("a", 4, 0, 100), ("b", 4, 150, 200)]).fencing_violations().len(), 1);
}

#[test]
fn fences_of_overlapping_grants_are_not_ordered_but_a_release_orders_them() {
    // Overlapping windows have no grant order (exclusion is what is broken there).
    assert!(fenced(&[("a", 5, 0, 100), ("b", 2, 50, 150)]).fencing_violations().is_empty());
    // Released early, "a" ended before "b" started: now they are ordered.
    let t0 = Instant::now();
    let history = History::new();
    let a = history.record(grant(t0, 0, "a", 0, 100).with_fence(5));
    history.record(grant(t0, 1, "b", 50, 150).with_fence(2));
    history.released(a, t0 + ms(40));
    assert_eq!(history.fencing_violations().len(), 1);
}

#[test]
fn another_record_of_the_same_lock_and_unfenced_or_shared_grants_are_not_compared() {
    let t0 = Instant::now();
    let history = History::new();
    history.record(grant(t0, 0, "a", 0, 100).with_fence(5));
    history.record(grant(t0, 0, "a", 100, 200).with_fence(5)); // a's extension
    history.record(grant(t0, 1, "b", 300, 400)); // no fence
    history.record(share(t0, 2, "r", 400, 500).with_fence(1)); // shared
    assert!(history.fencing_violations().is_empty(), "{:?}", history.fencing_violations());
    // But a's own record does not hide an earlier grant of another token.
    history.record(grant(t0, 3, "x", 0, 50).with_fence(7)); // ended before a's extension
    let found = history.fencing_violations();
    let pairs: Vec<_> =
        found.iter().map(|v| (v.earlier.token.as_str(), v.later.token.as_str())).collect();
    assert_eq!(pairs, [("x", "a")], "{found:?}");
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
