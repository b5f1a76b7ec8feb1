//! Review (third round), found and fixed: undos are registered only once their round is decided. During a clean-up
//! round, a new attempt of the same client is not ordered behind the clean-up of its own
//! abandoned attempt on a slow node, and that abandoned SET refuses it there.
//! Fixed by registering undos as soon as they are made, as before.

use crate::common;

use std::time::Duration;

use redlock_testkit::FaultyCluster;

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn an_abandoned_attempt_never_refuses_a_new_attempt_during_its_clean_up_round() {
    let faulty = FaultyCluster::start(5).unwrap();
    let rl = common::builder_for(faulty.urls(), Duration::from_secs(2)).build().unwrap();
    rl.try_lock("warm").await.unwrap().release().await.unwrap();
    for i in [0, 1, 2] {
        faulty.cluster().node(i).set("k", "foreign").unwrap();
        faulty.proxy(i).set_fault(common::latency(20));
    }
    faulty.proxy(4).set_fault(common::latency(150));
    // The clean-up round waits for node 3 (granted): hold it there for 300 ms.
    faulty.proxy(3).hold_requests_containing(b"EVALSHA", Duration::from_millis(300));
    let a1 = tokio::spawn({
        let rl = rl.clone();
        async move { rl.try_lock("k").await.map(|_| ()) }
    });
    tokio::time::sleep(Duration::from_millis(100)).await;
    // A1 has failed (3 Held) and is in its clean-up round; node 2 frees up.
    faulty.cluster().node(2).command(&["DEL", "k"]).unwrap();
    let a2 = rl.try_lock("k").await;
    let a1 = a1.await.unwrap();
    assert!(a1.is_err(), "A1 should have failed");
    assert!(a2.is_ok(), "A2 refused (by A1's own abandoned SET on node 4?): {:?}", a2.err());
}
