//! The server's own commands in place of scripts (`SET ... NX PX ... GET`, `DELIFEQ`, and
//! `SET ... IFEQ ... PX` for the extensions of a user the node refuses scripts): used where
//! the server has them, the script where it does not (found by its version, or by trying
//! once per connection: an unknown command, a syntax error or a refused command ran
//! nothing), with the same answers either way. A scripted extension never shortens a
//! lease; an outright one bounds what the hold's later rounds count while it may land.

use crate::common;
use crate::common::acl::{PASSWORD, builder_as, cluster_as};
use redlock::{ErrorKind, Redlock};
use redlock_testkit::{Cluster, RedisNode};
use std::time::Duration;

/// What the nodes under test are, from node 0's `INFO server`.
#[derive(Debug)]
struct Server {
    valkey: Option<(u32, u32)>,
    redis: (u32, u32),
}

impl Server {
    fn of(cluster: &Cluster) -> Self {
        let mut con = cluster.node(0).connection().unwrap();
        let info: String = redis::cmd("INFO").arg("server").query(&mut con).unwrap();
        let version = |name: &str| {
            let text = info.lines().find_map(|line| line.strip_prefix(name))?.trim();
            let mut parts = text.split('.').map(|part| part.parse::<u32>().unwrap());
            Some((parts.next()?, parts.next()?))
        };
        Self { valkey: version("valkey_version:"), redis: version("redis_version:").unwrap() }
    }

    fn has_set_get(&self) -> bool {
        self.valkey.is_some() || self.redis >= (7, 0)
    }

    fn has_delifeq(&self) -> bool {
        self.valkey.is_some_and(|version| version >= (9, 0))
    }

    fn has_set_ifeq(&self) -> bool {
        self.valkey.is_some_and(|version| version >= (8, 1))
    }
}

/// Per node, how many times it ran `commands`.
fn counts(cluster: &Cluster, commands: &[&str]) -> Vec<Vec<u64>> {
    cluster
        .nodes()
        .iter()
        .map(|node| commands.iter().map(|c| common::calls(node, c)).collect())
        .collect()
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_plain_lock_runs_the_servers_own_commands_where_it_has_them() {
    let cluster = common::cluster(3);
    let server = Server::of(&cluster);
    let rl = Redlock::builder()
        .nodes(cluster.urls())
        .ttl(Duration::from_secs(10))
        .connections_per_runtime(false)
        .build()
        .unwrap();
    common::connect_all(&rl).await;
    let commands = ["set", "evalsha", "eval", "delifeq"];
    let before = counts(&cluster, &commands);
    let mut lock = rl.try_lock("native").await.unwrap();
    lock.extend(Duration::from_secs(10)).await.unwrap();
    lock.release().await.unwrap();
    common::gone_everywhere(&cluster, &["native"], "released").await;
    // The slowest node's release is finished in the background.
    tokio::time::sleep(Duration::from_millis(100)).await;
    let after = counts(&cluster, &commands);
    // One acquisition, one extension, one release per node: as SET, scripts or natives.
    let set_get = u64::from(server.has_set_get());
    // Extensions stay scripted where scripts run (an outright one costs later rounds).
    let (set_ifeq, delifeq) = (0, u64::from(server.has_delifeq()));
    let scripts = 3 - set_get - set_ifeq - delifeq;
    for (i, (after, before)) in after.iter().zip(&before).enumerate() {
        let ran: Vec<u64> = after.iter().zip(before).map(|(a, b)| a - b).collect();
        // A scripted acquisition calls SET too.
        let expected = [1 + set_ifeq, scripts, 0, delifeq];
        assert_eq!(ran, expected, "node {i} ({server:?}) ran {commands:?}");
    }
}

/// A user without `DELIFEQ` on a server that has it (the README's locking line): one
/// refusal per connection, then the script, with the same answers.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_user_refused_the_native_release_falls_back_to_the_script_once_per_connection() {
    let (cluster, builder) = cluster_as("scripted", &common::readme_acl("locking"));
    if !Server::of(&cluster).has_delifeq() {
        return;
    }
    let rl = builder.connections_per_runtime(false).build().unwrap();
    let refused = || -> Vec<i64> {
        cluster.nodes().iter().map(|node| acl_log_count(node, "delifeq")).collect()
    };
    for _ in 0..3 {
        rl.try_lock("k").await.unwrap().release().await.unwrap();
    }
    common::none_match_everywhere(&cluster, "app:*", "released").await;
    let after_three = refused();
    assert_eq!(after_three, [1, 1, 1], "one refusal per connection");
    for _ in 0..3 {
        rl.try_lock("k").await.unwrap().release().await.unwrap();
    }
    assert_eq!(refused(), after_three, "the script from then on");
    // Another owner's key on one node is left alone by the script, as by DELIFEQ.
    let lock = rl.try_lock("k").await.unwrap();
    cluster.node(0).set("app:k", "another-owner").unwrap();
    lock.release().await.unwrap();
    assert_eq!(cluster.node(0).get("app:k").unwrap().as_deref(), Some("another-owner"));
}

/// The README's optional line for the native release lets the user run it.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_native_rules_let_a_user_release_with_delifeq() {
    let cluster = common::cluster(3);
    if !Server::of(&cluster).has_delifeq() {
        return;
    }
    let rules = common::readme_acls(&["locking", "native"]);
    let rl = builder_as(&cluster, "native", &rules).build().unwrap();
    let before = counts(&cluster, &["delifeq"]);
    rl.try_lock("k").await.unwrap().release().await.unwrap();
    common::none_match_everywhere(&cluster, "app:*", "released").await;
    tokio::time::sleep(Duration::from_millis(100)).await;
    let after = counts(&cluster, &["delifeq"]);
    assert!(after.iter().zip(&before).all(|(a, b)| a[0] == b[0] + 1), "{before:?} {after:?}");
    assert!(cluster.nodes().iter().all(|node| acl_log_count(node, "delifeq") == 0));
}

/// How many refusals of `command` `node`'s `ACL LOG` has (entries that repeat are counted
/// in one).
fn acl_log_count(node: &RedisNode, command: &str) -> i64 {
    let mut con = node.connection().unwrap();
    let entries: Vec<Vec<redis::Value>> =
        redis::cmd("ACL").arg("LOG").query(&mut con).unwrap_or_default();
    entries
        .iter()
        .filter_map(|entry| {
            let field = |name: &str| {
                let at = entry.iter().position(|v| {
                    matches!(v, redis::Value::BulkString(b) if b == name.as_bytes())
                        || matches!(v, redis::Value::SimpleString(s) if s == name)
                })?;
                entry.get(at + 1)
            };
            let object: String = redis::from_redis_value(field("object")?.clone()).ok()?;
            let count: i64 = redis::from_redis_value(field("count")?.clone()).ok()?;
            (object.eq_ignore_ascii_case(command)).then_some(count)
        })
        .sum()
}

/// A user that may not read `INFO` (restart quarantine off): every native command is tried
/// once per connection, and each the server lacks falls back to its script.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn without_info_each_native_command_is_tried_and_the_script_serves_where_it_fails() {
    let (cluster, builder) = cluster_as("no-info", &common::readme_acl("locking"));
    let rl = builder.ttl(Duration::from_secs(10)).connections_per_runtime(false).build().unwrap();
    for _ in 0..3 {
        let mut lock = rl.try_lock("k").await.unwrap();
        // The grant returns at the quorum: the third create may still be on its way.
        let everywhere = || cluster.nodes_holding("app:k", lock.token()).len() == 3;
        assert!(common::eventually(Duration::from_secs(2), everywhere).await);
        lock.extend(Duration::from_secs(10)).await.unwrap();
        assert!((0..3).all(|i| common::pttl(&cluster, i, "app:k") > 9_000));
        lock.release().await.unwrap();
        common::none_match_everywhere(&cluster, "app:*", "released").await;
    }
    let held = rl.try_lock("k").await.unwrap();
    let err = rl.try_lock("k").await.unwrap_err();
    assert_eq!(err.kind(), ErrorKind::NotAcquired, "{err}");
    held.release().await.unwrap_or_else(|e| panic!("{e:?} {e}"));
}

/// After an extension to a longer lease, an extension back to the lock's own lease must not
/// cut what the longer one set (a native `SET ... IFEQ ... PX` would).
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn an_extension_to_the_locks_own_lease_never_cuts_a_longer_one_sent_before() {
    let (cluster, mut lock) = locked_for(Duration::from_secs(5)).await;
    lock.extend(Duration::from_secs(5)).await.unwrap();
    lock.extend(Duration::from_secs(60)).await.unwrap();
    // The extension answers at its quorum: a straggler not yet written when the round was
    // decided may never reach its node, which keeps the shorter lease (the validity counts
    // only the quorum). What must not happen is a node's longer lease being cut.
    tokio::time::sleep(Duration::from_millis(50)).await;
    let longer: Vec<usize> = (0..3).filter(|&i| common::pttl(&cluster, i, "k") > 55_000).collect();
    assert!(longer.len() >= 2, "the longer lease is on a quorum: {longer:?}");
    for _ in 0..2 {
        lock.extend(Duration::from_secs(5)).await.unwrap();
        for &i in &longer {
            let pttl = common::pttl(&cluster, i, "k");
            assert!(pttl > 54_000, "node {i}: {pttl} ms left: the longer lease was cut");
        }
    }
    lock.release().await.unwrap();
}

/// An extension at the lock's own lease renews the key to that lease from now, never sets
/// a gone key again, and leaves another owner's key alone.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn an_extension_at_the_locks_own_lease_renews_it_from_now() {
    let (cluster, mut lock) = locked_for(Duration::from_secs(3)).await;
    tokio::time::sleep(Duration::from_millis(1500)).await;
    lock.extend(Duration::from_secs(3)).await.unwrap();
    for i in 0..3 {
        let pttl = common::pttl(&cluster, i, "k");
        assert!(pttl > 2_500, "node {i}: {pttl} ms left");
    }
    assert!(lock.validity() > Duration::from_millis(2_500));
    // Gone on a node (a lost key): not renewed there, nor set again.
    cluster.node(0).command(&["DEL", "k"]).unwrap();
    lock.extend(Duration::from_secs(3)).await.unwrap();
    assert!(!cluster.node(0).exists("k").unwrap());
    // Another owner's key on a node: left alone.
    cluster.node(1).set("k", "another-owner").unwrap();
    let err = lock.extend(Duration::from_secs(3)).await.unwrap_err();
    assert_eq!(err.kind(), ErrorKind::NotHeld, "{err}");
    assert_eq!(cluster.node(1).get("k").unwrap().as_deref(), Some("another-owner"));
}

/// Three nodes and a plain lock of `k` taken on them with a lease of `ttl`.
async fn locked_for(ttl: Duration) -> (Cluster, redlock::Lock) {
    let cluster = common::cluster(3);
    let rl = Redlock::builder().nodes(cluster.urls()).ttl(ttl).build().unwrap();
    let lock = rl.try_lock("k").await.unwrap();
    (cluster, lock)
}

/// The rules of a user that may run anything but scripts.
const WITHOUT_SCRIPTING: [&str; 4] = ["+@all", "-@scripting", "~app:*", "&*"];

/// On a server with native compare-and-delete and compare-and-set (Valkey 9), a user
/// without scripting takes, checks, extends, waits for and releases a plain lock, and runs
/// work under `with_lock` that outlasts the lease (auto-extended), with no script at all;
/// the other kinds are refused as `Denied`, naming the rules to add. Elsewhere the release
/// is a script: refused the same way.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_user_without_scripting_runs_the_plain_lock_where_the_server_has_native_commands() {
    let (cluster, builder) = cluster_as("unscripted", &WITHOUT_SCRIPTING);
    let server = Server::of(&cluster);
    let rl = builder.ttl(Duration::from_secs(5)).build().unwrap();
    let is_told_the_rules = |err: &redlock::Error| {
        err.kind() == ErrorKind::Denied && err.to_string().contains("`+evalsha +eval +script|load`")
    };
    if !server.has_delifeq() {
        let err = match rl.try_lock("k").await {
            Ok(lock) => lock.release().await.unwrap_err(),
            Err(err) => err,
        };
        assert!(is_told_the_rules(&err), "{err}");
        // The same steps with the README's locking and waiting lines: the scripted path.
        let rules = common::readme_acls(&["locking", "waiting"]);
        let scripted = builder_as(&cluster, "scripted", &rules).ttl(Duration::from_secs(1));
        let rl = scripted.build().unwrap();
        let mut lock = rl.try_lock("s").await.unwrap();
        lock.extend(Duration::from_secs(2)).await.unwrap();
        assert!(lock.check_held().await.unwrap());
        lock.release().await.unwrap();
        let work = |_| async {
            tokio::time::sleep(Duration::from_millis(1_500)).await;
            7
        };
        assert_eq!(rl.with_lock("w", work).await.unwrap(), 7);
        // (The refused user's `app:k`, where its acquisition was native, expires.)
        common::gone_everywhere(&cluster, &["app:s", "app:w"], "released").await;
        let scripts = counts(&cluster, &["evalsha"]);
        assert!(scripts.iter().all(|node| node[0] > 0), "scripted: {scripts:?}");
        return;
    }
    let mut lock = rl.try_lock("k").await.unwrap();
    assert!(lock.check_held().await.unwrap());
    tokio::time::sleep(Duration::from_millis(500)).await;
    lock.extend(Duration::from_secs(5)).await.unwrap();
    assert!(lock.validity() > Duration::from_millis(4_500), "{:?}", lock.validity());
    assert!(
        common::eventually(Duration::from_secs(1), || {
            (0..3).all(|i| common::pttl(&cluster, i, "app:k") > 4_500)
        })
        .await,
        "renewed on every node"
    );
    // Waiting for a lock another client of the same user releases.
    let waiter = builder_as(&cluster, "unscripted", &WITHOUT_SCRIPTING)
        .retry(redlock::Retry::new().with_max_wait(Duration::from_secs(5)))
        .build()
        .unwrap();
    let waiting = tokio::spawn(async move { waiter.lock("k").await.map(|lock| (waiter, lock)) });
    tokio::time::sleep(Duration::from_millis(100)).await;
    lock.release().await.unwrap();
    let (waiter, next) = waiting.await.unwrap().unwrap();
    next.release().await.unwrap();
    // Work that outlasts a 1 s lease, kept by the auto-extension.
    let short = builder_as(&cluster, "unscripted", &WITHOUT_SCRIPTING)
        .ttl(Duration::from_secs(1))
        .build()
        .unwrap();
    let work = |_| async {
        tokio::time::sleep(Duration::from_millis(2_500)).await;
        7
    };
    assert_eq!(short.with_lock("w", work).await.unwrap(), 7);
    let err = rl.reentrant("r", "me").once().await.unwrap_err();
    assert!(is_told_the_rules(&err), "{err}");
    common::none_match_everywhere(&cluster, "app:*", "released").await;
    assert_eq!(counts(&cluster, &["eval", "evalsha"]), vec![vec![0, 0]; 3], "no script ran");
    drop((waiter, short));
}

/// The README's unscripted line (with the waiting line) is enough for the plain lock on
/// Valkey 9, with no script: lock, extend, check, wait for another client's release, and
/// `with_lock` auto-extended; each of its rules is needed. Other servers refuse the line.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_readmes_unscripted_rules_are_enough_for_the_plain_lock_on_valkey() {
    let cluster = common::cluster(3);
    if !Server::of(&cluster).has_delifeq() {
        return;
    }
    let rules = common::readme_acls(&["unscripted", "waiting"]);
    let rl = builder_as(&cluster, "lean", &rules).ttl(Duration::from_secs(1)).build().unwrap();
    let mut lock = rl.try_lock("k").await.unwrap();
    lock.extend(Duration::from_secs(2)).await.unwrap();
    assert!(lock.check_held().await.unwrap());
    let waiter = builder_as(&cluster, "lean", &rules)
        .retry(redlock::Retry::new().with_max_wait(Duration::from_secs(5)))
        .build()
        .unwrap();
    let waiting = tokio::spawn(async move { waiter.lock("k").await.map(|lock| (waiter, lock)) });
    tokio::time::sleep(Duration::from_millis(100)).await;
    lock.release().await.unwrap();
    let (waiter, next) = waiting.await.unwrap().unwrap();
    next.release().await.unwrap();
    let work = |_| async {
        tokio::time::sleep(Duration::from_millis(1_500)).await;
        "done"
    };
    assert_eq!(rl.with_lock("w", work).await.unwrap(), "done");
    common::none_match_everywhere(&cluster, "app:*", "released").await;
    assert_eq!(counts(&cluster, &["eval", "evalsha"]), vec![vec![0, 0]; 3], "no script ran");
    drop(waiter);
    // Each command rule is needed by one of those (`+publish` tells the waiters: without
    // it they poll, as with the locking line).
    for dropped in ["+get", "+set", "+delifeq"] {
        assert!(rules.contains(&dropped));
        let fewer: Vec<&str> = rules.iter().copied().filter(|rule| *rule != dropped).collect();
        let user = format!("lean-{}", &dropped[1..]);
        let rl = builder_as(&cluster, &user, &fewer).build().unwrap();
        let tried = async {
            let mut lock = rl.try_lock(&user).await?;
            lock.extend(Duration::from_secs(2)).await?;
            lock.check_held().await?;
            lock.release().await
        };
        let err = tried.await.unwrap_err();
        assert_eq!(err.kind(), ErrorKind::Denied, "{dropped}: {err}");
    }
}

/// A quorum whose nodes differ in what the user may run: one node lets it run scripts,
/// two do not. Each node gets its own form (the scripts there, the native commands on the
/// others), and the lock works as on uniform nodes.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_quorum_of_scripted_and_unscripted_nodes_runs_each_nodes_own_form() {
    let (cluster, builder) = cluster_as("mixed", &WITHOUT_SCRIPTING);
    if !Server::of(&cluster).has_delifeq() {
        return;
    }
    cluster.node(0).command(&["ACL", "SETUSER", "mixed", "+@scripting"]).unwrap();
    let rl = builder.ttl(Duration::from_secs(1)).build().unwrap();
    let before = counts(&cluster, &["evalsha", "eval"]);
    let mut lock = rl.try_lock("k").await.unwrap();
    lock.extend(Duration::from_secs(3)).await.unwrap();
    assert!(lock.validity() > Duration::from_millis(2_500));
    lock.release().await.unwrap();
    let work = |_| async {
        tokio::time::sleep(Duration::from_millis(1_500)).await;
        "done"
    };
    assert_eq!(rl.with_lock("w", work).await.unwrap(), "done");
    common::none_match_everywhere(&cluster, "app:*", "released").await;
    let after = counts(&cluster, &["evalsha", "eval"]);
    let scripts = |i: usize| after[i].iter().sum::<u64>() - before[i].iter().sum::<u64>();
    assert!(scripts(0) > 0, "the scripted node ran the extensions as scripts");
    assert_eq!((scripts(1), scripts(2)), (0, 0), "the others ran none");
}

/// Where a node refuses scripts, an extension sets the lease outright (`SET ... IFEQ ...
/// PX`), and one may land after a later extension sent on another connection: here one to
/// 5 s, held back on two nodes of three past its node timeout, fails; one to 60 s from
/// another runtime's connection then runs first there, and the held one lands after it and
/// cuts it to 5 s. Neither counts past what a quorum keeps: the failed one shortens the
/// validity to its own lease, and the longer one counts, from its own start, no longer
/// than the held one's lease, so another client granted once the cut keys expire never
/// overlaps the hold.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn an_outright_extension_that_may_still_land_bounds_the_later_ones() {
    let (faulty, urls) = unscripted_behind_proxies();
    let cluster = faulty.cluster();
    if !Server::of(cluster).has_set_ifeq() {
        return;
    }
    let rl = unscripted_client(urls, Duration::from_secs(10), Duration::from_millis(300));
    let lock = rl.try_lock("k").await.unwrap();
    let held = Duration::from_secs(2);
    for i in 0..2 {
        faulty.proxy(i).hold_requests_containing(b"$4\r\n5000\r\n", held);
    }
    let started = std::time::Instant::now();
    // From a runtime of its own: the client's own connections.
    let (mut lock, failed) = common::on_short_runtime(async move {
        let mut lock = lock;
        let failed = lock.extend(Duration::from_secs(5)).await;
        (lock, failed)
    });
    let err = failed.unwrap_err();
    assert_eq!(err.kind(), ErrorKind::Unavailable, "{err}");
    let five = started + Duration::from_secs(5);
    assert!(lock.deadline() <= five, "the failed one may still land: 5 s at most");
    for i in 0..2 {
        faulty.proxy(i).release_holds();
    }
    lock.extend(Duration::from_secs(60)).await.unwrap();
    // Counted from its own start, no longer than the held one's lease.
    let bound = std::time::Instant::now() + Duration::from_secs(5);
    assert!(lock.deadline() <= bound, "{:?} left: more than a quorum keeps", lock.validity());
    // The held ones land and cut the longer lease.
    tokio::time::sleep(held).await;
    let cut = (0..2).filter(|&i| common::pttl(cluster, i, "app:k") < 5_000).count();
    assert_eq!(cut, 2, "the held extensions landed after the longer one");
    let other = common::builder_for(cluster.urls(), Duration::from_millis(100))
        .key_prefix("app:")
        .build()
        .unwrap();
    let granted = loop {
        if let Ok(next) = other.try_lock("k").await {
            break (std::time::Instant::now(), next);
        }
        assert!(started.elapsed() < Duration::from_secs(15), "never granted");
        tokio::time::sleep(Duration::from_millis(50)).await;
    };
    assert!(granted.0 >= lock.deadline(), "two holders: the first counted on the cut lease");
    granted.1.release().await.unwrap();
    drop(lock);
}

/// A node that refused a user `SCRIPT LOAD` is not asked again on that user's later
/// connections (each try would only add refusals to its `ACL LOG`).
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_node_that_refused_the_script_preload_is_not_asked_again_on_a_new_connection() {
    let (cluster, builder) = cluster_as("unscripted", &WITHOUT_SCRIPTING);
    let rl = builder.connections_per_runtime(false).build().unwrap();
    rl.connect().await.unwrap();
    let refused = || -> Vec<i64> {
        let preloads = |node| acl_log_count(node, "script|load") + acl_log_count(node, "script");
        cluster.nodes().iter().map(preloads).collect()
    };
    let first = refused();
    assert!(first.iter().all(|&n| n > 0), "the first connection's preload is refused: {first:?}");
    for node in cluster.nodes() {
        node.command(&["CLIENT", "KILL", "USER", "unscripted"]).unwrap();
    }
    // The next requests find their connections closed and open new ones: a connection of
    // the user that is not the notifications' subscriber is back on every node.
    let reopened = || {
        cluster.nodes().iter().all(|node| {
            let mut con = node.connection().unwrap();
            let list: String = redis::cmd("CLIENT").arg("LIST").query(&mut con).unwrap();
            list.lines()
                .any(|line| line.contains(" user=unscripted ") && !line.contains("subscribe"))
        })
    };
    let started = std::time::Instant::now();
    while !reopened() {
        assert!(started.elapsed() < Duration::from_secs(5), "no new connections");
        let _ = rl.try_lock("k").await.map(drop);
        tokio::time::sleep(Duration::from_millis(50)).await;
    }
    // Answered on the new connections: whatever went before on them has run.
    let _ = rl.try_lock("k").await.map(drop);
    assert_eq!(refused(), first, "not asked again");
}

/// Three Valkey nodes behind proxies, with the user `unscripted` (no scripting) on each:
/// the proxies' URLs for it.
fn unscripted_behind_proxies() -> (redlock_testkit::FaultyCluster, Vec<String>) {
    let faulty = redlock_testkit::FaultyCluster::start(3).unwrap();
    for node in faulty.cluster().nodes() {
        node.acl_setuser("unscripted", PASSWORD, &WITHOUT_SCRIPTING).unwrap();
    }
    let urls = faulty.urls_as(0, "unscripted", PASSWORD);
    (faulty, urls)
}

/// A client of `urls` (prefix `app:`, one attempt) with a lease of `ttl` and a node
/// timeout of `node_timeout`.
fn unscripted_client(urls: Vec<String>, ttl: Duration, node_timeout: Duration) -> Redlock {
    Redlock::builder()
        .nodes(urls)
        .key_prefix("app:")
        .ttl(ttl)
        .node_timeout(node_timeout)
        .connect_timeout(Duration::from_secs(5))
        .retry(redlock::Retry::never())
        .build()
        .unwrap()
}

/// Whether another client, straight to the nodes, gets `app:k` now.
async fn another_client_gets_it(cluster: &Cluster) -> bool {
    let other = common::builder_for(cluster.urls(), Duration::from_millis(200))
        .key_prefix("app:")
        .build()
        .unwrap();
    other.try_lock("k").await.is_ok()
}

/// An outright extension to a shorter lease whose future is dropped mid-round (a timeout
/// around `extend`) still lands: the hold counts no more than its lease from the moment
/// it was sent, so another client granted once those keys expire never overlaps it.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn an_outright_extension_dropped_mid_round_bounds_the_validity_all_the_same() {
    let (faulty, urls) = unscripted_behind_proxies();
    if !Server::of(faulty.cluster()).has_set_ifeq() {
        return;
    }
    let rl = unscripted_client(urls, Duration::from_secs(30), Duration::from_secs(1));
    let mut lock = rl.try_lock("k").await.unwrap();
    for i in 0..3 {
        faulty.proxy(i).hold_requests_containing(b"IFEQ", Duration::from_millis(300));
    }
    let started = std::time::Instant::now();
    let extend = lock.extend(Duration::from_secs(2));
    assert!(tokio::time::timeout(Duration::from_millis(100), extend).await.is_err());
    assert!(lock.deadline() <= started + Duration::from_secs(2), "{:?}", lock.validity());
    tokio::time::sleep(Duration::from_millis(2_600)).await;
    let granted = another_client_gets_it(faulty.cluster()).await;
    assert!(granted, "the dropped extension landed: the keys expired");
    assert!(!lock.is_valid(), "two holders: {:?} left", lock.validity());
}

/// A request of an earlier extension round still on its way (its connection slow to open)
/// when a newer round was queued on the node is not sent: it could land after the newer
/// round's, which did not count it, and cut it.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn an_earlier_rounds_extension_is_not_sent_after_a_newer_rounds() {
    let (faulty, urls) = unscripted_behind_proxies();
    if !Server::of(faulty.cluster()).has_set_ifeq() {
        return;
    }
    let rl = unscripted_client(urls, Duration::from_secs(10), Duration::from_millis(300));
    // Taken on the client's own connections.
    let (_rl, mut lock) = common::on_short_runtime(async move {
        let lock = rl.try_lock("k").await.unwrap();
        (rl, lock)
    });
    // This runtime's connection to node 2 takes 1.5 s to open (its INFO held).
    faulty.proxy(2).hold_requests_containing(b"$4\r\nINFO", Duration::from_millis(1_500));
    let started = std::time::Instant::now();
    lock.extend(Duration::from_secs(3)).await.unwrap();
    // A newer round from the client's own connections; node 0 holds it past its timeout.
    faulty.proxy(0).hold_requests_containing(b"IFEQ", Duration::from_secs(30));
    let (lock, newer) = common::on_short_runtime(async move {
        let mut lock = lock;
        let newer = lock.extend(Duration::from_secs(60)).await;
        (lock, newer)
    });
    newer.unwrap();
    // The first round's request to node 2 would be queued now, and land after the newer.
    tokio::time::sleep(Duration::from_millis(5_500).saturating_sub(started.elapsed())).await;
    let pttl = common::pttl(faulty.cluster(), 2, "app:k");
    assert!(pttl > 50_000, "node 2: {pttl} ms left: the earlier round's extension cut it");
    let granted = another_client_gets_it(faulty.cluster()).await;
    assert!(!(granted && lock.is_valid()), "two holders at once");
    drop(lock);
}

/// One extension round slowed past its node timeout on two nodes of three bounds none of
/// the later rounds at the same lease: landing after one, it sets the key to that lease
/// from later still. The hold extends to its whole lease each time.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_slow_outright_round_at_the_locks_lease_bounds_none_of_the_later_ones() {
    let (faulty, urls) = unscripted_behind_proxies();
    if !Server::of(faulty.cluster()).has_set_ifeq() {
        return;
    }
    let rl = unscripted_client(urls, Duration::from_secs(3), Duration::from_millis(300));
    let mut lock = rl.try_lock("k").await.unwrap();
    for i in 0..2 {
        faulty.proxy(i).hold_requests_containing(b"IFEQ", Duration::from_millis(800));
    }
    let slow = lock.extend(Duration::from_secs(3)).await.unwrap_err();
    assert_eq!(slow.kind(), ErrorKind::Unavailable, "{slow}");
    for i in 0..2 {
        faulty.proxy(i).release_holds();
    }
    tokio::time::sleep(Duration::from_millis(1_000)).await;
    extends_to_its_whole_lease(&mut lock, Duration::from_secs(3), 4).await;
    lock.release().await.unwrap();
}

/// Extends `lock` `rounds` times to `ttl`, a little apart: each counts all but 500 ms.
async fn extends_to_its_whole_lease(lock: &mut redlock::Lock, ttl: Duration, rounds: usize) {
    for round in 0..rounds {
        tokio::time::sleep(Duration::from_millis(500)).await;
        lock.extend(ttl).await.unwrap();
        let left = lock.validity();
        assert!(left > ttl - Duration::from_millis(500), "round {round}: {left:?} left");
    }
}

/// Extensions at the lock's own lease are bounded by nothing an earlier one at that lease
/// left unanswered (landing after them, it sets the key to that lease from later still): a
/// round held past its timeout on every node, then every connection reset (the held
/// requests never arrive, nor will any answer on their connections), and the hold goes on
/// extending to its whole lease on the new connections.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn extensions_at_the_locks_lease_go_on_after_a_lost_round_and_a_reset() {
    let (faulty, urls) = unscripted_behind_proxies();
    if !Server::of(faulty.cluster()).has_set_ifeq() {
        return;
    }
    let rl = unscripted_client(urls, Duration::from_secs(4), Duration::from_millis(300));
    let mut lock = rl.try_lock("k").await.unwrap();
    for i in 0..3 {
        faulty.proxy(i).hold_requests_containing(b"IFEQ", Duration::from_secs(5));
    }
    let lost = lock.extend(Duration::from_secs(4)).await.unwrap_err();
    assert_eq!(lost.kind(), ErrorKind::Unavailable, "{lost}");
    for i in 0..3 {
        faulty.proxy(i).release_holds();
        faulty.proxy(i).reset_connections();
    }
    extends_to_its_whole_lease(&mut lock, Duration::from_secs(4), 6).await;
    lock.release().await.unwrap();
}

/// Nodes that do not know `SCRIPT` (as behind a proxy that refuses it; here renamed away on
/// Valkey): the preload's unknown command counts as a refusal, and the plain lock runs no
/// script there, extensions and `with_lock` included.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn nodes_without_the_script_command_run_the_plain_lock_with_no_script() {
    let config = redlock_testkit::NodeConfig::new()
        .extra_arg("--rename-command")
        .extra_arg("SCRIPT")
        .extra_arg("\"\"");
    let cluster = Cluster::start_with(3, config).unwrap();
    if !Server::of(&cluster).has_delifeq() {
        return;
    }
    let rl = Redlock::builder().nodes(cluster.urls()).ttl(Duration::from_secs(1)).build().unwrap();
    let mut lock = rl.try_lock("k").await.unwrap();
    lock.extend(Duration::from_secs(3)).await.unwrap();
    assert!(lock.validity() > Duration::from_millis(2_500), "{:?}", lock.validity());
    lock.release().await.unwrap();
    let work = |_| async {
        tokio::time::sleep(Duration::from_millis(1_500)).await;
        "done"
    };
    assert_eq!(rl.with_lock("w", work).await.unwrap(), "done");
    common::gone_everywhere(&cluster, &["k", "w"], "released").await;
    assert_eq!(counts(&cluster, &["eval", "evalsha"]), vec![vec![0, 0]; 3], "no script ran");
}
