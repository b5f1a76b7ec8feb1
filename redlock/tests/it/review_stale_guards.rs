//! Review (second round): stale guards (leases long over) used after another owner took the resource:
//! late release, late extension, late drop, for the multi-resource lock with overlapping
//! sets, the read-write lock, and a reentrant hold re-entered right at its expiry.

use crate::common;

use std::time::{Duration, Instant, SystemTime};

use redlock::{ErrorKind, Redlock, Retry};

fn client(cluster: &redlock_testkit::Cluster) -> Redlock {
    Redlock::builder()
        .nodes(cluster.urls())
        .ttl(Duration::from_secs(10))
        .node_timeout(Duration::from_millis(200))
        .retry(Retry::never())
        .build()
        .unwrap()
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_stale_multi_guard_never_touches_an_overlapping_newer_set() {
    let cluster = common::cluster(3);
    let (a, b) = (client(&cluster), client(&cluster));
    let mut stale = a.many(&["x", "y"]).ttl(Duration::from_millis(300)).await.unwrap();
    assert!(common::eventually(Duration::from_secs(2), || cluster.count_key("y") == 0).await);
    let fresh = b.many(&["y", "z"]).await.unwrap();
    let err = stale.extend(Duration::from_secs(10)).await.unwrap_err();
    assert_eq!(err.kind(), ErrorKind::NotHeld);
    assert_eq!(stale.release().await.unwrap_err().kind(), ErrorKind::NotHeld);
    tokio::time::sleep(Duration::from_millis(200)).await;
    assert_eq!(cluster.nodes_holding("y", fresh.token()).len(), 3);
    assert_eq!(cluster.nodes_holding("z", fresh.token()).len(), 3);
    assert_eq!(cluster.count_key("x"), 0, "the stale set's free key was not re-set");
    // Nobody else gets y while the fresh set is valid.
    assert_eq!(a.try_lock("y").await.unwrap_err().kind(), ErrorKind::NotAcquired);
    fresh.release().await.unwrap();
    assert!(
        common::eventually(Duration::from_secs(1), || cluster.keys_everywhere("*").unwrap() == 0)
            .await
    );
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_stale_read_share_released_and_extended_late_leaves_the_writer_alone() {
    let cluster = common::cluster(3);
    let (r, w) = (client(&cluster), client(&cluster));
    let mut share = r.read("doc").ttl(Duration::from_millis(300)).await.unwrap();
    // Every node stamped the share's expiry with this clock before the read returned.
    let share_expiry_bound = unix_ms() + 300;
    let writer = w
        .write("doc")
        .fenced()
        .retry(
            Retry::new()
                .with_unbounded_attempts()
                .with_delay(Duration::from_millis(20))
                .with_max_wait(Duration::from_secs(3)),
        )
        .await
        .unwrap();
    assert!(!share.is_valid());
    assert!(share.extend(Duration::from_secs(10)).await.is_err());
    // The writer needs a majority only: where the share was stamped a little later it may
    // still be there, expired or about to, and is purged by the next script. Never renewed.
    let fields = cluster.hash_fields("doc").unwrap();
    let renewed = |(field, expiry): (&String, &String)| {
        field.starts_with("r:") && expiry.parse::<u128>().unwrap() > share_expiry_bound
    };
    assert!(
        !fields.iter().flatten().flat_map(|f| f.iter()).any(renewed),
        "the stale share was renewed somewhere: {fields:?}"
    );
    let granted = fields.iter().flatten().filter(|f| f.keys().any(|k| k.starts_with("w:")));
    assert!(granted.count() >= 2, "the writer holds a majority: {fields:?}");
    assert!(share.release().await.is_err());
    // A new reader is refused while the writer is valid.
    assert_eq!(r.read("doc").once().await.unwrap_err().kind(), ErrorKind::NotAcquired);
    assert!(writer.is_held().await.unwrap());
    writer.release().await.unwrap();
    assert!(common::eventually(Duration::from_secs(1), || cluster.count_key("doc") == 0).await);
}

/// Owner O re-enters right as its first hold expires, while owner P polls hard: P never
/// gets the lock while one of O's holds is valid.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn reentry_racing_the_expiry_of_the_first_hold_never_lets_another_owner_in() {
    let cluster = common::cluster(3);
    let (o, p) = (client(&cluster), client(&cluster));
    for round in 0..10u64 {
        let key = format!("job{round}");
        let first = o.reentrant(&key, "O").ttl(Duration::from_millis(200)).await.unwrap();
        let deadline = first.deadline();
        let poller = {
            let (p, key) = (p.clone(), key.clone());
            tokio::spawn(async move {
                let stop = Instant::now() + Duration::from_millis(700);
                let mut grants = Vec::new();
                while Instant::now() < stop {
                    if let Ok(hold) =
                        p.reentrant(&key, "P").once().ttl(Duration::from_millis(100)).await
                    {
                        let granted = Instant::now();
                        tokio::time::sleep(Duration::from_millis(3)).await;
                        // Held until the release starts (or its deadline, if earlier).
                        grants.push((granted, Instant::now().min(hold.deadline())));
                        let _ = hold.release().await;
                    }
                }
                grants
            })
        };
        // Re-enter a little before, at, or a little after the first hold's deadline.
        let offset = Duration::from_millis(round * 4);
        tokio::time::sleep_until((deadline - Duration::from_millis(20) + offset).into()).await;
        let second = o.reentrant(&key, "O").ttl(Duration::from_millis(400)).await;
        let second_window = second.as_ref().ok().map(|h| (Instant::now(), h.deadline()));
        let grants = poller.await.unwrap();
        for (start, end) in &grants {
            let overlaps_first = *start < deadline;
            let overlaps_second = second_window.is_some_and(|(s, e)| *start < e && s < *end);
            assert!(
                !overlaps_first && !overlaps_second,
                "round {round}: P held [{start:?}, {end:?}] while O held: first until {deadline:?}, second {second_window:?}"
            );
        }
        drop(first);
        if let Ok(second) = second {
            let _ = second.release().await;
        }
    }
}

/// The wall clock in milliseconds, as the local nodes' `TIME` gives it to the scripts.
fn unix_ms() -> u128 {
    SystemTime::now().duration_since(SystemTime::UNIX_EPOCH).unwrap().as_millis()
}
