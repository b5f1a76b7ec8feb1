//! Runtimes that come and go around a shared client, for the tests of what crosses them.

use std::future::Future;
use std::sync::{Arc, Barrier};
use std::time::Duration;

use redlock::Redlock;
use redlock_testkit::{Cluster, FaultyCluster};
use tokio::runtime::Runtime;
use tokio::task::JoinHandle;

/// The node timeout of the tests across runtimes: short, so that a request a proxy holds
/// times out well inside the hold.
pub const NODE_TIMEOUT: Duration = Duration::from_millis(200);

/// A multi-thread runtime with `workers` workers.
pub fn multi_thread(workers: usize) -> Runtime {
    tokio::runtime::Builder::new_multi_thread()
        .worker_threads(workers)
        .enable_all()
        .build()
        .unwrap()
}

/// Runs `f` on a plain thread of its own (where runtimes may be built, entered and
/// dropped), without blocking a worker of the caller's runtime.
pub async fn on_thread<T: Send + 'static>(f: impl FnOnce() -> T + Send + 'static) -> T {
    tokio::task::spawn_blocking(move || std::thread::spawn(f).join().unwrap()).await.unwrap()
}

/// Runs `work` with a clone of `rl` on runtime `a`, then ends `a` (dropped).
pub async fn then_end<T, Fut>(
    a: Runtime,
    rl: &Redlock,
    work: impl FnOnce(Redlock) -> Fut + Send + 'static,
) -> T
where
    T: Send + 'static,
    Fut: Future<Output = T>,
{
    let rl = rl.clone();
    on_thread(move || {
        let output = a.block_on(work(rl));
        drop(a);
        output
    })
    .await
}

/// A new multi-thread runtime on which `rl` is warm (its connections open).
pub async fn warm_runtime(rl: &Redlock) -> Runtime {
    let warm = rl.clone();
    on_thread(move || {
        let runtime = multi_thread(2);
        runtime.block_on(async { super::warm(&warm).await });
        runtime
    })
    .await
}

/// Three nodes behind proxies, a client with `node_timeout` warm on the caller's runtime,
/// and a second multi-thread runtime on which it is warm too.
pub async fn warm_on_two_runtimes(node_timeout: Duration) -> (FaultyCluster, Redlock, Runtime) {
    let faulty = FaultyCluster::start(3).unwrap();
    let rl = super::builder_for(faulty.urls(), node_timeout).build().unwrap();
    super::warm(&rl).await;
    let b = warm_runtime(&rl).await;
    (faulty, rl, b)
}

/// `lock` extended by `ttl` on runtime `b` (the extension must reach a quorum), returned
/// with `b`.
pub async fn extended_on<G: redlock::Guard + Send + 'static>(
    b: Runtime,
    mut lock: G,
    ttl: Duration,
) -> (Runtime, G) {
    on_thread(move || {
        b.block_on(async { lock.extend(ttl).await.unwrap() });
        (b, lock)
    })
    .await
}

/// Ends runtime `a` (dropped on a thread of its own).
pub async fn end(a: Runtime) {
    on_thread(move || drop(a)).await;
}

/// `n` new multi-thread runtimes on which `rl` locked and released a key of its own: each
/// has its connections (and the nodes may give older runtimes' up for them).
pub async fn more_runtimes(rl: &Redlock, n: usize) -> Vec<Runtime> {
    let others = rl.clone();
    on_thread(move || {
        (0..n)
            .map(|i| {
                let runtime = multi_thread(2);
                runtime.block_on(async {
                    others.try_lock(&format!("other{i}")).await.unwrap().release().await.unwrap()
                });
                runtime
            })
            .collect::<Vec<_>>()
    })
    .await
}

/// Blocks both workers of `runtime` for `time` (synchronous work in two tasks), returning
/// once both are blocked.
pub async fn block_workers(runtime: &Runtime, time: Duration) -> Vec<JoinHandle<()>> {
    let both = Arc::new(Barrier::new(3));
    let tasks = (0..2)
        .map(|_| {
            let both = both.clone();
            runtime.spawn(async move {
                both.wait();
                std::thread::sleep(time);
            })
        })
        .collect();
    tokio::task::spawn_blocking(move || both.wait()).await.unwrap();
    tasks
}

/// Waits for the `blocked` tasks of runtime `a`, then ends `a`.
pub async fn wait_and_end(a: Runtime, blocked: Vec<JoinHandle<()>>) {
    on_thread(move || {
        for task in blocked {
            a.block_on(task).unwrap();
        }
        drop(a);
    })
    .await;
}

/// What node `i` has of `key`, for failure messages.
pub fn describe(cluster: &Cluster, i: usize, key: &str) -> String {
    format!(
        "value {:?}, fields {:?}, pttl {:?}",
        cluster.node(i).get(key).ok().flatten(),
        cluster.node(i).hgetall(key).ok(),
        cluster.node(i).pttl(key).ok()
    )
}

/// Waits until a proxy's hold of `hold` is over, then asserts that `key` is gone from
/// node `i` (or goes within two seconds).
/// The ordering's limit (`guide::order`): node `i` read a create of a released hold only
/// after its connection broke (a runtime that ended with it written), so it may run after
/// the release. What it leaves must expire with its own lease (the client's 10 s TTL, sent
/// when its round started, before now), never be renewed, and be gone once that passed;
/// it holds only the released hold's token, which no other client counts as its own.
pub async fn assert_left_at_most_for_its_lease(
    cluster: &Cluster,
    (i, key): (usize, &str),
    hold: Duration,
    what: &str,
) {
    tokio::time::sleep(hold + Duration::from_millis(500)).await;
    let pttl = cluster.node(i).pttl(key).unwrap();
    assert!(pttl < 10_000, "{what}: `{key}` on node {i} outlives its lease: {pttl} ms");
}

pub async fn assert_gone_after_hold(
    cluster: &Cluster,
    (i, key): (usize, &str),
    hold: Duration,
    what: &str,
) {
    tokio::time::sleep(hold + Duration::from_millis(500)).await;
    let gone = super::eventually(Duration::from_secs(2), || !cluster.node(i).exists(key).unwrap());
    assert!(
        gone.await,
        "{what}: `{key}` is still on node {i} ({}): it stays for its lease",
        describe(cluster, i, key)
    );
}
