//! A request dropped before it went out must not let the next request of its claim on that
//! node overtake what it was itself waiting for: an undo never overtakes what it undoes,
//! even when the call in between (a release, an extension) was cancelled.

use crate::common;

use std::time::Duration;

/// Node 4's `SET` of a2 waits, unsent, behind a1's release there (itself behind a1's `SET`,
/// held by the proxy). a2's release is cancelled after its first poll (its request on
/// node 4 still waiting for a2's `SET`), and the lock is dropped: the release sent from
/// `Drop` must still go out after a2's `SET`, or that `SET` lands last and leaves a2's key
/// on node 4 for the whole lease.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_release_after_a_cancelled_one_waits_for_the_unsent_acquisition() {
    let (faulty, rl) = common::five_slowed_nodes(Duration::from_secs(2)).await;
    let cluster = faulty.cluster();
    for round in 0..3 {
        let key = format!("k{round}");
        let hold = Duration::from_millis(400);
        let a2 = common::lock_behind_an_unsent_acquisition(&faulty, &rl, &key, hold).await;
        let token = a2.token().to_string();
        let cancelled = tokio::time::timeout(Duration::ZERO, a2.release()).await;
        assert!(
            cancelled.is_err(),
            "round {round}: the release ended in its first poll: {cancelled:?}"
        );
        common::assert_gone_after_the_hold(cluster, &key, &token, round).await;
    }
}

/// The same with a cancelled extension in between: the release that follows waits for the
/// acquisition the extension was waiting for.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_release_after_a_cancelled_extension_waits_for_the_unsent_acquisition() {
    let (faulty, rl) = common::five_slowed_nodes(Duration::from_secs(2)).await;
    let cluster = faulty.cluster();
    for round in 0..3 {
        let key = format!("e{round}");
        let hold = Duration::from_millis(400);
        let mut a2 = common::lock_behind_an_unsent_acquisition(&faulty, &rl, &key, hold).await;
        let token = a2.token().to_string();
        let extend = a2.extend(Duration::from_secs(10));
        let cancelled = tokio::time::timeout(Duration::ZERO, extend).await;
        assert!(
            cancelled.is_err(),
            "round {round}: the extension ended in its first poll: {cancelled:?}"
        );
        a2.release().await.unwrap();
        common::assert_gone_after_the_hold(cluster, &key, &token, round).await;
    }
}
