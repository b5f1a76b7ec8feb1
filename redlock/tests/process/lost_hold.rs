//! A hold an extension finds gone, read through the process's log: a connection reset after
//! the extension ran still gets its renewed key removed.

use crate::common;
use crate::common::{held_on_five, pttl};

use std::time::Duration;

use redlock::ErrorKind;
use redlock_testkit::NetFault;

/// The extension ran on node 4 (renewing our key for 30 s), then node 4's connection is
/// reset before its reply, for 600 ms, longer than the release's quick re-sends: the
/// background sends it again until it is answered, and the renewed key goes. (The release
/// goes out as soon as the extension is decided, right behind it on the delayed link, so
/// it often reaches node 4 before the reset: then the renewed key goes at once, and the
/// test checks that common case instead.)
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_reset_after_the_extension_ran_still_removes_its_renewed_key() {
    let _serial = crate::serial();
    common::logs();
    let (faulty, _rl, mut lock, token) = held_on_five(Duration::from_millis(500)).await;
    let cluster = faulty.cluster();
    for i in 0..3 {
        cluster.node(i).set("k", "foreign").unwrap();
    }
    faulty.proxy(4).set_fault(common::latency(150));
    let err = lock.extend(Duration::from_secs(30)).await.unwrap_err();
    assert_eq!(err.kind(), ErrorKind::NotHeld, "{err}");
    // Node 4 runs the extension; its reply is still in the proxy.
    let renewed =
        common::eventually(Duration::from_millis(1500), || pttl(cluster, 4, "k") > 20_000).await;
    faulty.proxy(4).set_fault(NetFault::Reset);
    eprintln!("node 4 seen renewed before the reset: {renewed}");
    tokio::time::sleep(Duration::from_millis(600)).await;
    faulty.proxy(4).heal();
    let gone = common::eventually(Duration::from_secs(2), || {
        cluster.nodes_holding("k", &token).is_empty()
    })
    .await;
    let log = String::from_utf8_lossy(&common::logs().lock().unwrap()).into_owned();
    let gave_up = log.lines().find(|l| l.contains("background release failed")).unwrap_or("none");
    assert!(
        gone,
        "the lost lock's key stays on {:?} for {} ms more (log: {gave_up})",
        cluster.nodes_holding("k", &token),
        pttl(cluster, 4, "k")
    );
}
