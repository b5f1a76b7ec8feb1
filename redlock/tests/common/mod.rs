//! Shared set-up for the integration tests: real nodes from redlock-testkit.
#![allow(dead_code)]

use std::time::{Duration, Instant};

use redlock::{Lock, Redlock, RedlockBuilder, Retry};
use redlock_testkit::{Cluster, FaultyCluster, NetFault};

pub mod acl;
pub mod runtimes;

/// `n` fresh nodes; panics with the testkit's message (how to install redis-server).
pub fn cluster(n: usize) -> Cluster {
    Cluster::start(n).unwrap_or_else(|err| panic!("cannot start {n} redis nodes: {err}"))
}

/// A builder over the cluster with test-friendly settings: one attempt, 10 s lease.
pub fn builder(cluster: &Cluster, node_timeout: Duration) -> RedlockBuilder {
    builder_for(cluster.urls(), node_timeout)
}

/// [`builder`] over any URLs (a faulty cluster's proxies).
pub fn builder_for(urls: Vec<String>, node_timeout: Duration) -> RedlockBuilder {
    Redlock::builder()
        .nodes(urls)
        .ttl(Duration::from_secs(10))
        .node_timeout(node_timeout)
        .retry(Retry::never())
}

/// [`builder_for`] with `retry` instead of a single attempt, built.
pub fn retrying(urls: Vec<String>, node_timeout: Duration, retry: Retry) -> Redlock {
    builder_for(urls, node_timeout).retry(retry).build().unwrap()
}

pub fn client(cluster: &Cluster) -> Redlock {
    builder(cluster, Duration::from_millis(200)).build().unwrap()
}

/// One attempt, 10 s lease, 100 ms node timeout, over any URLs.
pub fn single_attempt(urls: Vec<String>) -> Redlock {
    builder_for(urls, Duration::from_millis(100)).build().unwrap()
}

/// A fixed delay each way, no jitter.
pub fn latency(ms: u64) -> NetFault {
    NetFault::Latency { fixed: Duration::from_millis(ms), jitter: Duration::ZERO }
}

/// Runs one raw command (`args[0]` and its arguments) on node `i`, ignoring the reply.
pub fn run(cluster: &Cluster, i: usize, args: &[&str]) {
    let mut con = cluster.node(i).connection().unwrap();
    let mut cmd = redis::cmd(args[0]);
    for arg in &args[1..] {
        cmd.arg(*arg);
    }
    let _: redis::Value = cmd.query(&mut con).unwrap();
}

/// Closes every normal connection to every node but the killer's own (`CLIENT KILL`): what a
/// node's idle `timeout` or a restart does to the client's cached connections.
pub fn kill_clients(cluster: &Cluster) {
    for i in 0..cluster.len() {
        run(cluster, i, &["CLIENT", "KILL", "SKIPME", "yes", "TYPE", "normal"]);
    }
}

/// Runs `staging` up to three times, until one answers `want`; panics with `what` and every
/// answer otherwise. For a staging after `CLIENT KILL` that a loaded host can spoil: a
/// release queued before its connection's driver saw the close is written to the dead
/// socket, and its re-send counts as done (`Ok`, the documented limit of a re-send).
pub async fn in_three_tries<T, F>(what: &str, want: T, mut staging: impl FnMut() -> F)
where
    T: PartialEq + std::fmt::Debug,
    F: std::future::Future<Output = T>,
{
    let mut answers = Vec::new();
    for _ in 0..3 {
        let answer = staging().await;
        if answer == want {
            return;
        }
        answers.push(answer);
    }
    panic!("{what}: never {want:?} in three tries: {answers:?}");
}

/// Polls `check` until it holds or `within` passes.
pub async fn eventually(within: Duration, mut check: impl FnMut() -> bool) -> bool {
    let deadline = Instant::now() + within;
    loop {
        if check() {
            return true;
        }
        if Instant::now() >= deadline {
            return false;
        }
        tokio::time::sleep(Duration::from_millis(10)).await;
    }
}

/// What the staging helpers below share: calls `attempt` until it is `Ok`, 10 ms apart, for
/// up to two seconds, and panics with `what` and its last error then. A round is decided
/// by its quorum, so when a call returns the other nodes may still be running their part:
/// a test reads what every node did once they had time to, not right after the call.
async fn settled<T, E, F>(what: &str, mut attempt: impl FnMut() -> F) -> T
where
    E: std::fmt::Display,
    F: std::future::Future<Output = Result<T, E>>,
{
    let deadline = Instant::now() + Duration::from_secs(2);
    loop {
        match attempt().await {
            Ok(done) => return done,
            Err(err) if Instant::now() > deadline => panic!("{what}: {err}"),
            Err(_) => tokio::time::sleep(Duration::from_millis(10)).await,
        }
    }
}

/// `Ok` when `left` is zero, else how many are left of `what`: for [`settled`].
fn none_left(left: usize, what: impl FnOnce() -> String) -> std::future::Ready<Result<(), String>> {
    std::future::ready(if left == 0 { Ok(()) } else { Err(format!("{left} {}", what())) })
}

/// Waits until no live node has any of `keys` (a release, extension, forced release, dropped
/// guard or shutdown says Ok once its quorum answered), and panics with `what` and what is
/// left otherwise.
pub async fn gone_everywhere(cluster: &Cluster, keys: &[&str], what: &str) {
    let left = || keys.iter().map(|key| cluster.count_key(key)).sum::<usize>();
    settled(what, || none_left(left(), || format!("left of {keys:?}"))).await
}

/// [`gone_everywhere`] for every key matching `pattern`.
pub async fn none_match_everywhere(cluster: &Cluster, pattern: &str, what: &str) {
    let left = || cluster.keys_everywhere(pattern).unwrap();
    settled(what, || none_left(left(), || format!("keys left matching {pattern}"))).await
}

/// Staging: waits (up to 2 s) until each of `nodes` holds `key` with `token`, and panics if
/// one does not. A round is decided by its quorum, so right after an acquisition the other
/// nodes' requests may still be on their way (on a loaded machine, behind a first connect,
/// or failed with it): a test that then faults a node, or counts what it holds, needs that
/// node to have answered.
pub async fn held_on(cluster: &Cluster, key: &str, token: &str, nodes: &[usize]) {
    let held = || {
        let holding = cluster.nodes_holding(key, token);
        std::future::ready(if nodes.iter().all(|i| holding.contains(i)) {
            Ok(())
        } else {
            Err(format!("{key} ({token}) is held on {holding:?}, not on every node of {nodes:?}"))
        })
    };
    settled("staging", held).await
}

/// How many pub/sub subscribers each node has for the release channel of `key`.
pub fn subscribers(cluster: &Cluster, key: &str) -> Vec<i64> {
    let channel = format!("redlock:released:{key}");
    cluster
        .nodes()
        .iter()
        .map(|node| {
            let mut con = node.connection().unwrap();
            let (_, count): (String, i64) =
                redis::cmd("PUBSUB").arg("NUMSUB").arg(&channel).query(&mut con).unwrap();
            count
        })
        .collect()
}

/// Log output captured in memory, for tests that read what the library logged: a
/// `tracing_subscriber` writer (`.with_writer(move || LogBuffer(shared.clone()))`).
#[derive(Clone, Default)]
pub struct LogBuffer(pub std::sync::Arc<std::sync::Mutex<Vec<u8>>>);

impl std::io::Write for LogBuffer {
    fn write(&mut self, bytes: &[u8]) -> std::io::Result<usize> {
        self.0.lock().unwrap().extend_from_slice(bytes);
        Ok(bytes.len())
    }
    fn flush(&mut self) -> std::io::Result<()> {
        Ok(())
    }
}

/// Every log line of the test binary, from trace level on: one subscriber per process,
/// installed by the first call. The subscriber also carries [`stall`]'s layer (inert until
/// armed), since a process has only one.
pub fn logs() -> &'static std::sync::Arc<std::sync::Mutex<Vec<u8>>> {
    use std::sync::{Arc, Mutex, OnceLock};
    use tracing_subscriber::layer::SubscriberExt;
    use tracing_subscriber::util::SubscriberInitExt;
    static LOGS: OnceLock<Arc<Mutex<Vec<u8>>>> = OnceLock::new();
    LOGS.get_or_init(|| {
        let buffer = Arc::new(Mutex::new(Vec::new()));
        let writer = buffer.clone();
        let log = tracing_subscriber::fmt::layer()
            .with_ansi(false)
            .with_writer(move || LogBuffer(writer.clone()));
        tracing_subscriber::registry().with(log).with(stall::Stall).init();
        buffer
    })
}

/// Stalls the next event logged on a client's own thread ("redlock-background"): it stands
/// for a background thread that is busy or descheduled. Needs [`logs`]'s subscriber, and a
/// binary whose tests run one at a time (every client's own thread has that name).
pub mod stall {
    use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
    use std::time::Duration;

    static STALL_MS: AtomicU64 = AtomicU64::new(0);
    static STALLING: AtomicBool = AtomicBool::new(false);

    pub(super) struct Stall;

    impl<S: tracing::Subscriber> tracing_subscriber::Layer<S> for Stall {
        fn on_event(&self, _: &tracing::Event<'_>, _: tracing_subscriber::layer::Context<'_, S>) {
            if std::thread::current().name() != Some("redlock-background") {
                return;
            }
            let ms = STALL_MS.swap(0, Ordering::SeqCst);
            if ms > 0 {
                STALLING.store(true, Ordering::SeqCst);
                std::thread::sleep(Duration::from_millis(ms));
                STALLING.store(false, Ordering::SeqCst);
            }
        }
    }

    /// The next event on a client's own thread stalls it for `ms`.
    pub fn arm(ms: u64) {
        super::logs();
        STALL_MS.store(ms, Ordering::SeqCst);
    }

    /// Whether a client's own thread is stalled right now.
    pub fn stalling() -> bool {
        STALLING.load(Ordering::SeqCst)
    }
}

/// How many requests of `op` to the node behind `url` ended so far, from [`logs`].
pub fn requests_ended(url: &str, op: &str) -> usize {
    let op = format!("op=\"{op}\"");
    log_lines_of(url)
        .lines()
        .filter(|l| l.contains("node request ended") && l.contains(&op))
        .count()
}

/// The lines of [`logs`] that name the node behind `url` (also context for a failed
/// assertion).
pub fn log_lines_of(url: &str) -> String {
    let node = url.trim_start_matches("redis://");
    let log = String::from_utf8_lossy(&logs().lock().unwrap()).into_owned();
    log.lines().filter(|line| line.contains(node)).collect::<Vec<_>>().join("\n")
}

/// Runs `fut` on a short-lived current-thread runtime of its own thread, which ends (and
/// drops whatever it still runs) as soon as `fut` is over.
pub fn on_short_runtime<T: Send + 'static>(
    fut: impl std::future::Future<Output = T> + Send + 'static,
) -> T {
    std::thread::spawn(move || {
        let runtime = tokio::runtime::Builder::new_current_thread().enable_all().build().unwrap();
        runtime.block_on(fut)
    })
    .join()
    .unwrap()
}

/// A lock on `key` granted by nodes 0-3 while its acquisition on node 4 is still unsent:
/// it waits there behind the release of an earlier lock of the same client, itself queued
/// behind that lock's acquisition, held by node 4's proxy for `hold`. Every later request of
/// the lock on node 4 must stay behind that unsent acquisition.
pub async fn lock_behind_an_unsent_acquisition(
    faulty: &FaultyCluster,
    rl: &Redlock,
    key: &str,
    hold: Duration,
) -> Lock {
    faulty.proxy(4).hold_requests_containing(key.as_bytes(), hold);
    let first = rl.try_lock(key).await.unwrap();
    faulty.proxy(4).release_holds();
    first.release().await.unwrap();
    rl.try_lock(key).await.unwrap()
}

/// Asserts that `key` is gone from every node once the hold of
/// [`lock_behind_an_unsent_acquisition`] (up to 500 ms) is over: whatever the order on node
/// 4, the unsent acquisition has landed by then.
pub async fn assert_gone_after_the_hold(cluster: &Cluster, key: &str, token: &str, round: usize) {
    tokio::time::sleep(Duration::from_millis(800)).await;
    let gone = eventually(Duration::from_secs(3), || cluster.count_key(key) == 0).await;
    assert!(
        gone,
        "round {round}: {token} is left on nodes {:?}",
        cluster.nodes_holding(key, token)
    );
}

/// Five nodes behind proxies and a client with `node_timeout`, its connections open, with
/// 5 ms each way on nodes 0-3: no round ends within one poll.
pub async fn five_slowed_nodes(node_timeout: Duration) -> (FaultyCluster, Redlock) {
    let faulty = FaultyCluster::start(5).unwrap();
    let rl = builder_for(faulty.urls(), node_timeout).build().unwrap();
    warm_and_slow(&faulty, &rl).await;
    (faulty, rl)
}

/// Another client force-releases `key` (answered by all `n` nodes), then takes it and
/// releases it: whoever held `key` lost it meanwhile.
pub async fn take_over(cluster: &Cluster, key: &str) {
    let other = client(cluster);
    assert_eq!(other.force_release(key).await.unwrap(), cluster.len());
    other.try_lock(key).await.unwrap().release().await.unwrap();
}

/// Opens `rl`'s connections where the caller runs, and waits until every node answered on
/// its own: a first lock and release, tried again (opening the connections may take longer
/// than a short node timeout on a loaded host), then [`connect_all`] and [`connect_own`].
/// A round is decided at its quorum, so after one the slowest nodes' connections may still
/// be opening: a request sent there next would wait for that connect (it gets the connect
/// timeout, not the node timeout), and a node the test pauses or faults then would answer
/// late where the test expects a timeout.
pub async fn warm(rl: &Redlock) {
    let lock = settled("warming up", || async { rl.try_lock("warm").await }).await;
    lock.release().await.unwrap();
    connect_all(rl).await;
    connect_own(rl).await;
}

/// Opens `rl`'s connection to every node and waits (asking again) until each answered a
/// read: a lock round decides at its quorum, so after one the last node's connection may
/// still be opening (and a request on it would count as a fresh connection's, not a warm
/// one's).
pub async fn connect_all(rl: &Redlock) {
    let answered = || async {
        let inspection = rl.inspect("warm").await.unwrap();
        match inspection.nodes.iter().find(|view| view.error.is_some()) {
            None => Ok(()),
            Some(view) => Err(format!("{}: {:?}", view.node, view.error)),
        }
    };
    settled("connecting to", answered).await
}

/// [`connect_all`] on the client's own thread: the connections its background work uses (an
/// auto-extension, the release of a hold an extension found lost, undos of a runtime that
/// ended, locks dropped outside any runtime). The library opens them in the background
/// once a runtime's are open; on a loaded machine that may still be under way when a test
/// slows or breaks a link, and a connect over a link slowed by a few hundred milliseconds
/// outlasts the connect timeout: the background work then never reaches that node.
pub async fn connect_own(rl: &Redlock) {
    let rl = rl.clone();
    runtimes::on_thread(move || {
        // A current-thread runtime's requests go out on the client's own thread.
        let runtime = tokio::runtime::Builder::new_current_thread().enable_all().build().unwrap();
        runtime.block_on(connect_all(&rl));
    })
    .await;
}

/// Opens `rl`'s connections, then slows nodes 0-3 by 5 ms each way.
pub async fn warm_and_slow(faulty: &FaultyCluster, rl: &Redlock) {
    warm(rl).await;
    for i in 0..4 {
        faulty.proxy(i).set_fault(latency(5));
    }
}

/// How many creates `node` ran so far: its `SET`s (a plain or multi lock's acquisition
/// attempt, native or scripted, a permit's, a native extension's, and the test's own) and
/// its `TIME` reads (every script of the hash-based kinds reads the clock once).
pub fn create_calls(node: &redlock_testkit::RedisNode) -> u64 {
    calls(node, "set") + calls(node, "time")
}

/// How many times `node` ran `command` so far (`INFO commandstats`; the commands a script
/// calls count too).
pub fn calls(node: &redlock_testkit::RedisNode, command: &str) -> u64 {
    let mut con = node.connection().unwrap();
    let info: String = redis::cmd("INFO").arg("commandstats").query(&mut con).unwrap();
    let prefix = format!("cmdstat_{command}:calls=");
    info.lines()
        .find_map(|line| line.strip_prefix(prefix.as_str()))
        .and_then(|rest| rest.split(',').next())
        .map_or(0, |calls| calls.parse().unwrap())
}

/// The rules of one feature's line in the README's "ACL users" section (`locking`,
/// `waiting`, `fencing`, `quarantine`, `inspect`, `force release`, `check`), for the key
/// prefix `app:`: the tests use what the README tells users, not a copy of it.
pub fn readme_acl(feature: &str) -> Vec<&'static str> {
    static README: &str = include_str!("../../../README.md");
    let section = &README[README.find("## ACL users").expect("the README's ACL section")..];
    let mut lines = section.lines();
    while let Some(line) = lines.next() {
        if line.strip_prefix("# ").and_then(|rest| rest.split_once(':')).map(|(name, _)| name)
            == Some(feature)
        {
            let rules = lines.next().and_then(|next| next.strip_prefix("ACL SETUSER locker "));
            let rules = rules.unwrap_or_else(|| panic!("no ACL SETUSER line after `# {feature}:`"));
            return rules
                .split_whitespace()
                // Flags that set the user up, not rules that permit something.
                .filter(|r| !matches!(*r, "on" | "resetchannels") && !r.starts_with('>'))
                .collect();
        }
    }
    panic!("the README has no ACL rules for `{feature}`")
}

/// The README's lines for `features`, together (a user set up with each line in turn).
pub fn readme_acls(features: &[&str]) -> Vec<&'static str> {
    let mut rules: Vec<&str> = Vec::new();
    for rule in features.iter().flat_map(|feature| readme_acl(feature)) {
        if !rules.contains(&rule) {
            rules.push(rule);
        }
    }
    rules
}

/// What a library client uses: the README's locking, waiting, fencing and quarantine
/// lines (checked against the README by `acl::the_minimal_acl_is_the_readmes_library_lines`).
pub const MINIMAL_ACL: &[&str] = &[
    "~app:*",
    "&redlock:released:app:*",
    "+get",
    "+set",
    "+del",
    "+pttl",
    "+hset",
    "+hdel",
    "+hgetall",
    "+pexpire",
    "+pexpireat",
    "+time",
    "+publish",
    "+eval",
    "+evalsha",
    "+script|load",
    "+subscribe",
    "+unsubscribe",
    "~redlock:fence:app:*",
    "+info",
];

/// Node `i`'s remaining time to live of `key`, in ms (-2: absent, -1: no expiry).
pub fn pttl(cluster: &Cluster, i: usize, key: &str) -> i64 {
    cluster.node(i).pttl(key).unwrap()
}

/// Five nodes behind proxies, a client with `node_timeout` (its connections open), and its
/// lock on "k", set on all five, with the lock's token.
pub async fn held_on_five(node_timeout: Duration) -> (FaultyCluster, Redlock, Lock, String) {
    let faulty = FaultyCluster::start(5).unwrap();
    let rl = builder_for(faulty.urls(), node_timeout).build().unwrap();
    warm(&rl).await;
    let lock = rl.try_lock("k").await.unwrap();
    let token = lock.token().to_owned();
    held_on(faulty.cluster(), "k", &token, &[0, 1, 2, 3, 4]).await;
    (faulty, rl, lock, token)
}

/// What a proxy picks the plain lock's acquisitions out by: the SHA1 its script is sent by
/// (`EVALSHA`), and the native `SET ... NX PX ... GET` of servers that have it.
pub fn plain_acquisitions() -> [Vec<u8>; 2] {
    let source = concat!(include_str!("../../src/lua/plain_acquire.lua"));
    let sha = redis::Script::new(source).get_hash().as_bytes().to_vec();
    [sha, b"$2\r\nNX\r\n$2\r\nPX\r\n".to_vec()]
}

/// What a proxy picks the plain lock's releases (and clean-ups) out by: the script's SHA1,
/// and the native `DELIFEQ`.
pub fn plain_releases() -> [Vec<u8>; 2] {
    [release_sha().into_bytes(), b"DELIFEQ".to_vec()]
}

/// What a proxy picks the plain lock's extensions out by: the script's SHA1, and the native
/// `SET ... IFEQ`.
pub fn plain_extensions() -> [Vec<u8>; 2] {
    [extend_sha().into_bytes(), b"$4\r\nIFEQ\r\n".to_vec()]
}

/// The SHA1 of the plain lock's release script (also its clean-up's).
pub fn release_sha() -> String {
    let source = concat!(
        include_str!("../../src/lua/notify.lua"),
        include_str!("../../src/lua/release.lua")
    );
    redis::Script::new(source).get_hash().to_owned()
}

/// The SHA1 of the read-write lock's release script (also its clean-up's and a writer's
/// withdrawal's).
pub fn rw_release_sha() -> String {
    let source = concat!(
        include_str!("../../src/lua/rw_fields.lua"),
        include_str!("../../src/lua/hash_common.lua"),
        include_str!("../../src/lua/notify.lua"),
        include_str!("../../src/lua/hash_release.lua")
    );
    redis::Script::new(source).get_hash().to_owned()
}

/// The SHA1 of the plain lock's extension script.
pub fn extend_sha() -> String {
    let source = concat!(
        include_str!("../../src/lua/lengthen.lua"),
        include_str!("../../src/lua/extend.lua")
    );
    redis::Script::new(source).get_hash().to_owned()
}

/// How many times `node` answered a request with the error `code` (`INFO errorstats`).
pub fn refusals(node: &redlock_testkit::RedisNode, code: &str) -> u64 {
    let mut con = node.connection().unwrap();
    let info: String = redis::cmd("INFO").arg("errorstats").query(&mut con).unwrap();
    let prefix = format!("errorstat_{code}:count=");
    info.lines()
        .find_map(|line| line.strip_prefix(prefix.as_str()))
        .map_or(0, |count| count.trim().parse().unwrap())
}
