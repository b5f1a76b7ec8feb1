//! Runtimes that end or lack I/O, where the test reads the process's log or installs a panic
//! hook: an undo that went out before its runtime ended is sent again; a runtime without I/O
//! locks without any task panicking.

use crate::common;
use crate::common::runtimes::NODE_TIMEOUT;

use std::sync::atomic::{AtomicUsize, Ordering};
use std::time::{Duration, Instant};

/// The undo had already gone out when its runtime ended (node 4 answers 150 ms
/// late each way, so the release is written, and its runtime gone, long before the
/// answer). The re-sent one must still go (it is safe to repeat): it ends on node 4 (one
/// logged end: the original, dropped, logs none), nothing is counted as failed, and
/// shutdown has nothing left to wait for.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn an_undo_that_went_out_before_its_runtime_ended_is_sent_again() {
    let _serial = crate::serial();
    common::logs();
    let (faulty, rl) = common::five_slowed_nodes(Duration::from_secs(2)).await;
    let cluster = faulty.cluster();
    let url = faulty.urls()[4].clone();
    let key = "sent";
    let lock = rl.try_lock(key).await.unwrap();
    let token = lock.token().to_string();
    assert!(
        common::eventually(Duration::from_secs(1), || cluster.node(4).exists(key).unwrap()).await
    );
    // The warm-up's release on node 4 may end in the background after the warm-up: counted
    // only once it surely did.
    tokio::time::sleep(Duration::from_millis(100)).await;
    let before = common::requests_ended(&url, "release");
    faulty.proxy(4).set_fault(common::latency(150));
    let started = Instant::now();
    common::on_short_runtime(async move { lock.release().await }).unwrap();
    assert!(started.elapsed() < Duration::from_millis(150), "the release waited for node 4");
    let ended = common::eventually(Duration::from_secs(2), || {
        common::requests_ended(&url, "release") > before
    })
    .await;
    assert!(ended, "the re-sent release never ended on node 4");
    let holding = cluster.nodes_holding(key, &token);
    assert!(holding.is_empty(), "{holding:?} pttl {}", cluster.node(4).pttl(key).unwrap());
    let started = Instant::now();
    rl.shutdown(Duration::from_secs(2)).await.unwrap();
    assert!(
        started.elapsed() < Duration::from_millis(300),
        "shutdown waited {:?}",
        started.elapsed()
    );
    faulty.proxy(4).heal();
}

// A panic hook counts the panics of the whole process.

static IO_DISABLED_PANICS: AtomicUsize = AtomicUsize::new(0);

// Tokio offers no way to ask whether a runtime has I/O without panicking, so with
// connections per runtime on (the default) the first connect of such a runtime is a panic
// caught in a Tokio task ("IO is disabled"), after which the client falls back to its own
// thread's connections
// (`connection::a_runtime_without_io_still_locks_through_the_clients_own_thread`); the
// builder's docs say to turn them off for such a runtime, and with them off (here) nothing
// panics.
#[test]
fn a_runtime_without_io_locks_without_any_task_panicking() {
    let _serial = crate::serial();
    let previous = std::panic::take_hook();
    std::panic::set_hook(Box::new(move |info| {
        if info.to_string().contains("IO is disabled") {
            IO_DISABLED_PANICS.fetch_add(1, Ordering::SeqCst);
        }
        previous(info);
    }));
    let cluster = common::cluster(3);
    let rl =
        common::builder(&cluster, NODE_TIMEOUT).connections_per_runtime(false).build().unwrap();
    let runtime = tokio::runtime::Builder::new_multi_thread()
        .worker_threads(2)
        .enable_time()
        .build()
        .unwrap();
    runtime.block_on(async {
        for key in ["first", "second"] {
            rl.try_lock(key).await.unwrap().release().await.unwrap();
        }
    });
    assert_eq!(
        IO_DISABLED_PANICS.load(Ordering::SeqCst),
        0,
        "tasks panicked (tokio: IO is disabled) while locking on a runtime without I/O"
    );
}
