//! ACL users, read through the process's log: a user without the release channels still
//! releases (`Ok`, key gone, one warning per node) and its waiters poll.

use crate::common;
use crate::common::acl::{cluster_as, rules};

use std::time::{Duration, Instant};

use redlock::Retry;

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn without_the_release_channels_releases_succeed_and_waiters_poll() {
    let _serial = crate::serial();
    let logs = common::logs();
    let (cluster, builder) =
        cluster_as("nochannels", &rules(&["&redlock:released:app:*"], &["resetchannels"]));
    let rl = builder.build().unwrap();

    // Every kind's release is Ok and removes the key, however often it is refused.
    for _ in 0..3 {
        rl.lock("plain").await.unwrap().release().await.unwrap();
        rl.reentrant("reentrant", "job").await.unwrap().release().await.unwrap();
        rl.many(&["a", "b"]).await.unwrap().release().await.unwrap();
        rl.read("rw").await.unwrap().release().await.unwrap();
        rl.write("rw").await.unwrap().release().await.unwrap();
    }
    common::none_match_everywhere(&cluster, "*", "every kind's release removes its keys").await;

    // A waiter cannot subscribe, so it finds the release by polling, within one pause.
    let held = rl.lock("handoff").await.unwrap();
    let polling = Retry::new().with_delay(Duration::from_millis(200)).with_jitter(Duration::ZERO);
    let waiter = tokio::spawn({
        let rl = rl.clone();
        async move { rl.lock("handoff").retry(polling).await.map(|lock| (lock, Instant::now())) }
    });
    tokio::time::sleep(Duration::from_millis(300)).await;
    let released_at = Instant::now();
    held.release().await.unwrap();
    let (lock, granted_at) =
        tokio::time::timeout(Duration::from_secs(5), waiter).await.unwrap().unwrap().unwrap();
    assert!(
        granted_at - released_at < Duration::from_millis(700),
        "{:?}",
        granted_at - released_at
    );
    lock.release().await.unwrap();
    // A release returns at its quorum: the last node may answer a moment later.
    assert!(
        common::eventually(Duration::from_secs(2), || cluster.count_key("app:handoff") == 0).await
    );

    // One warning per node, however many releases were refused.
    let text = String::from_utf8(logs.lock().unwrap().clone()).unwrap();
    for node in cluster.nodes() {
        let name = format!("127.0.0.1:{}/0", node.port());
        let warnings = text
            .lines()
            .filter(|line| line.contains("WARN") && line.contains(&name))
            .filter(|line| line.contains("refused a release notification"))
            .count();
        assert_eq!(warnings, 1, "{name}:\n{text}");
    }
}
