//! ACL users: each feature's rules in the README are enough for it (read from the README
//! itself), and every rule of the library's lines is needed; a refused command is
//! `Denied` with `NOPERM` naming it, inside a script too; every refused login (a wrong
//! password, an unknown user, no password where one is needed, a password where the node
//! has none) is `Denied` at once, not retried, naming its cause and never the password; a
//! user without the release channels still releases (`Ok`, key gone, one warning per
//! node) and its waiters poll; a user without `INFO` gets a message naming it when restart
//! quarantine needs it; a key pattern that excludes the prefix is `Denied` with every
//! node's `NOPERM`.

use crate::common;
use crate::common::acl::{PASSWORD, cluster_as, rules};
use redlock::{ErrorKind, NodeOutcome, Redlock, Retry};
use redlock_testkit::Cluster;
use std::time::Duration;

/// The README's library lines (locking, waiting, fencing, quarantine) for the prefix `app:`.
const MINIMAL: &[&str] = common::MINIMAL_ACL;

#[test]
fn the_minimal_acl_is_the_readmes_library_lines() {
    let mut readme = common::readme_acls(&["locking", "waiting", "fencing", "quarantine"]);
    let mut minimal = MINIMAL.to_vec();
    readme.sort_unstable();
    minimal.sort_unstable();
    assert_eq!(readme, minimal);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_locking_rules_are_enough_for_every_kind() {
    let (cluster, builder) = cluster_as("locking", &common::readme_acl("locking"));
    let rl = builder.build().unwrap();

    let mut lock = rl.lock("plain").await.unwrap();
    lock.extend(Duration::from_secs(10)).await.unwrap();
    assert!(lock.check_held().await.unwrap());
    lock.release().await.unwrap();
    let mut outer = rl.reentrant("reentrant", "job").await.unwrap();
    let inner = rl.reentrant("reentrant", "job").await.unwrap();
    inner.release().await.unwrap();
    outer.extend(Duration::from_secs(10)).await.unwrap();
    outer.release().await.unwrap();
    let mut many = rl.many(&["a", "b"]).await.unwrap();
    many.extend(Duration::from_secs(20)).await.unwrap();
    many.release().await.unwrap();
    let mut read = rl.read("rw").await.unwrap();
    read.extend(Duration::from_secs(10)).await.unwrap();
    // A waiting writer records its intent, then withdraws it.
    let writer = rl.write("rw").retry(Retry::new().with_max_attempts(2)).await.unwrap_err();
    assert_eq!(writer.kind(), ErrorKind::NotAcquired);
    read.release().await.unwrap();
    rl.write("rw").await.unwrap().release().await.unwrap();
    common::none_match_everywhere(&cluster, "app:*", "everything released").await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_waiting_rules_let_a_waiter_be_woken_by_a_release_notification() {
    let (cluster, builder) = cluster_as("waiting", &common::readme_acls(&["locking", "waiting"]));
    let (rl, other) = (builder.clone().build().unwrap(), builder.build().unwrap());
    let held = rl.lock("handoff").await.unwrap();
    // Polling alone would take 20 s: only the notification can wake the waiter sooner.
    let slow_polling = Retry::new().with_delay(Duration::from_secs(20)).with_jitter(Duration::ZERO);
    let waiter = tokio::spawn(async move { other.lock("handoff").retry(slow_polling).await });
    assert!(
        common::eventually(Duration::from_secs(5), || {
            common::subscribers(&cluster, "app:handoff").iter().all(|n| *n == 1)
        })
        .await,
        "the waiter subscribed on every node"
    );
    held.release().await.unwrap();
    let next = tokio::time::timeout(Duration::from_secs(5), waiter).await.unwrap().unwrap();
    next.unwrap().release().await.unwrap();
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_fencing_rules_are_enough_for_fenced_locks() {
    let (cluster, builder) = cluster_as("fencing", &common::readme_acls(&["locking", "fencing"]));
    let rl = builder.build().unwrap();
    let first = rl.lock("fenced").fenced().await.unwrap();
    let one = first.fencing_token().unwrap();
    first.release().await.unwrap();
    let second = rl.lock("fenced").fenced().await.unwrap();
    assert!(second.fencing_token().unwrap() > one);
    second.release().await.unwrap();
    assert_eq!(cluster.keys_everywhere("redlock:fence:app:*").unwrap(), 3);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_quarantine_rules_are_enough_for_restart_quarantine() {
    let (cluster, builder) =
        cluster_as("quarantine", &common::readme_acls(&["locking", "quarantine"]));
    // Uptime past the quarantine below, so that every node may vote once INFO is read.
    tokio::time::sleep(Duration::from_millis(2100)).await;
    let rl = builder.restart_quarantine(Duration::from_millis(1)).build().unwrap();
    rl.try_lock("plain").await.unwrap().release().await.unwrap();
    // The server check reads INFO too: one server behind two URLs is refused.
    let url = cluster.node(0).url_as("quarantine", PASSWORD);
    let twice = Redlock::builder()
        .nodes([
            url.clone(),
            url.replace("127.0.0.1", "localhost"),
            cluster.node(1).url_as("quarantine", PASSWORD),
        ])
        .key_prefix("app:")
        .retry(Retry::never())
        .build()
        .unwrap();
    let err = twice.inspect("plain").await.unwrap();
    let said: Vec<_> = err.nodes.iter().filter_map(|view| view.error.clone()).collect();
    assert!(
        said.iter().any(|error| error.contains("run_id") || error.contains("same server")),
        "{said:?}"
    );
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_inspect_rules_are_enough_to_inspect_every_kind() {
    let (_cluster, builder) = cluster_as("inspect", &common::readme_acls(&["locking", "inspect"]));
    let rl = builder.build().unwrap();
    let lock = rl.lock("plain").await.unwrap();
    let hold = rl.reentrant("reentrant", "job").await.unwrap();
    common::connect_all(&rl).await;
    let plain = rl.inspect("plain").await.unwrap();
    for view in &plain.nodes {
        assert_eq!(view.error, None, "{view:?}");
        assert_eq!(view.holder.as_deref(), Some(lock.token()), "{view:?}");
        assert!(view.ttl.is_some(), "{view:?}");
    }
    assert_eq!(plain.holder.as_deref(), Some(lock.token()));
    // A hash kind's holder is read by HKEYS.
    let hash = rl.inspect("reentrant").await.unwrap();
    assert!(hash.holder.is_some(), "{hash:?}");
    lock.release().await.unwrap();
    hold.release().await.unwrap();
}

/// A forced release reads the holds (TYPE, PTTL, GET, HKEYS), then removes them (TYPE, GET,
/// DEL, HDEL, PUBLISH): the README's locking and inspect lines are enough.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_force_release_rules_are_enough_to_force_a_release() {
    let rules = common::readme_acls(&["locking", "inspect"]);
    let (cluster, builder) = cluster_as("force", &rules);
    let rl = builder.build().unwrap();
    let lock = rl.lock("plain").await.unwrap();
    let hold = rl.reentrant("reentrant", "job").await.unwrap();
    let read = rl.read("rw").await.unwrap();
    for resource in ["plain", "reentrant", "rw"] {
        assert_eq!(rl.force_release(resource).await.unwrap(), 3, "{resource}");
    }
    assert_eq!(cluster.keys_everywhere("app:*").unwrap(), 0, "everything released by force");
    drop((lock, hold, read));
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn inspect_refused_by_the_acl_names_noperm_and_the_command() {
    let (_cluster, builder) = cluster_as("noinspect", &common::readme_acl("locking"));
    let rl = builder.build().unwrap();
    let lock = rl.lock("plain").await.unwrap();
    let seen = rl.inspect("plain").await.unwrap();
    assert_eq!(seen.holder, None);
    for view in &seen.nodes {
        let error = view.error.as_deref().unwrap_or_else(|| panic!("{view:?}"));
        assert!(error.contains("NOPERM") && error.contains("'type'"), "{error}");
        assert!(!error.contains("unreachable"), "{error}");
    }
    lock.release().await.unwrap();
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_command_refused_in_a_script_is_noperm_naming_the_command() {
    let (cluster, builder) = cluster_as("nohset", &rules(&["+hset"], &[]));
    let rl = builder.build().unwrap();
    let err = rl.reentrant("reentrant", "job").await.unwrap_err();
    assert_eq!(err.kind(), ErrorKind::Denied, "{err}");
    assert!(!err.is_retryable());
    assert!(err.faulty() >= 2, "{err}");
    for node in err.nodes().iter().filter(|node| node.outcome().is_fault()) {
        let NodeOutcome::Denied(message) = node.outcome() else {
            panic!("{node:?} is not a permission failure")
        };
        assert!(message.starts_with("NOPERM") && message.contains("'hset'"), "{message}");
    }
    assert!(err.to_string().contains("`+hset`"), "{err}");
    assert_eq!(cluster.keys_everywhere("*").unwrap(), 0);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_refused_login_is_denied_as_wrongpass_never_unreachable() {
    let (cluster, _) = cluster_as("login", MINIMAL);
    let rl = Redlock::builder()
        .nodes(cluster.nodes().iter().map(|node| node.url_as("login", "not-the-password")))
        .key_prefix("app:")
        .retry(Retry::never())
        .build()
        .unwrap();
    let err = rl.try_lock("plain").await.unwrap_err();
    assert_eq!(err.kind(), ErrorKind::Denied, "{err}");
    for node in err.nodes().iter().filter(|node| node.outcome().is_fault()) {
        assert!(
            matches!(node.outcome(), NodeOutcome::Denied(message) if message.starts_with("WRONGPASS")),
            "{node:?}"
        );
    }
    let text = err.to_string();
    assert!(!text.contains("unreachable") && !text.contains("not-the-password"), "{text}");
    let seen = rl.inspect("plain").await.unwrap();
    for view in &seen.nodes {
        assert!(view.error.as_deref().is_some_and(|e| e.contains("WRONGPASS")), "{view:?}");
    }
}

/// Every way a login can be refused: `lock()`, which would wait a whole TTL (10 s) for a
/// lock that is merely busy, gives up after its first attempt, with `Denied` (not
/// retryable), one short reason per node that says what to change, and no password.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn every_refused_login_is_denied_at_once_naming_its_cause_and_never_the_password() {
    let (cluster, _) = cluster_as("login", MINIMAL);
    let locked = common::cluster(3);
    for node in locked.nodes() {
        let mut con = node.connection().unwrap();
        let _: () = redis::cmd("CONFIG")
            .arg("SET")
            .arg("requirepass")
            .arg("needed")
            .query(&mut con)
            .unwrap();
    }
    let open = common::cluster(3);
    let with_password =
        |cluster: &redlock_testkit::Cluster, user: &str, password: &str| -> Vec<String> {
            let url = |port: u16| format!("redis://{user}:{password}@127.0.0.1:{port}");
            cluster.nodes().iter().map(|node| url(node.port())).collect()
        };
    let cases: [(&str, Vec<String>, &str); 4] = [
        ("a wrong password", with_password(&cluster, "login", "secret-1"), "WRONGPASS"),
        ("an unknown user", with_password(&cluster, "nobody", "secret-2"), "WRONGPASS"),
        ("no password", locked.urls(), "NOAUTH"),
        (
            "a password the node does not have",
            with_password(&open, "", "secret-3"),
            "has none configured",
        ),
    ];
    for (case, urls, cause) in cases {
        let rl = Redlock::builder().nodes(urls).ttl(Duration::from_secs(10)).build().unwrap();
        let started = std::time::Instant::now();
        let err = rl.lock("plain").await.unwrap_err();
        let took = started.elapsed();
        eprintln!("{case}: gave up after {took:?}: {err}");
        assert_eq!(err.kind(), ErrorKind::Denied, "{case}: {err}");
        assert!(!err.is_retryable(), "{case}");
        assert!(took < Duration::from_secs(2), "{case}: {took:?}, not the 10 s wait");
        let text = err.to_string();
        assert!(text.contains(cause), "{case}: {text}");
        assert!(!text.contains("secret-"), "{case}: {text}");
        assert!(text.len() < 1_500, "{case}: {} bytes: {text}", text.len());
        assert!(!text.contains("Pipeline") && !text.contains("Index "), "{case}: {text}");
        for node in err.nodes() {
            let NodeOutcome::Denied(why) = node.outcome() else { continue };
            assert!(why.contains(cause), "{case}: {why}");
            let fix = ["redis://user:password@", "remove the password"];
            assert!(fix.iter().any(|fix| why.contains(fix)), "{case}: {why}");
        }
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn without_info_restart_quarantine_names_the_missing_permission() {
    let (cluster, builder) = cluster_as("noinfo", &rules(&["+info"], &[]));
    // Without quarantine, INFO is not needed: the server check is skipped.
    let rl = builder.clone().build().unwrap();
    rl.lock("plain").await.unwrap().release().await.unwrap();

    let rl = builder.restart_quarantine(Duration::from_secs(10)).build().unwrap();
    let err = rl.try_lock("plain").await.unwrap_err();
    assert_eq!(err.kind(), ErrorKind::Denied, "{err}");
    assert!(err.faulty() >= 2, "{err}");
    for node in err.nodes().iter().filter(|node| node.outcome().is_fault()) {
        let NodeOutcome::Denied(message) = node.outcome() else {
            panic!("{node:?} is not a permission failure")
        };
        assert!(message.contains("NOPERM"), "{message}");
        assert!(message.contains("`info`") && message.contains("restart_quarantine"), "{message}");
    }
    let text = err.to_string();
    assert!(text.contains("`info`") && text.contains("restart_quarantine"), "{text}");
    assert!(!text.contains("unreachable") && !text.contains("Incompatible"), "{text}");
    // A release returns at its quorum: the last node may answer a moment later.
    assert!(
        common::eventually(Duration::from_secs(2), || cluster.count_key("app:plain") == 0).await
    );
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_key_pattern_without_the_prefix_is_denied_with_noperm_from_every_node() {
    let (cluster, builder) = cluster_as("otherkeys", &rules(&["~app:*"], &["~other:*"]));
    let rl = builder.build().unwrap();
    let err = rl.try_lock("plain").await.unwrap_err();
    assert_eq!(err.kind(), ErrorKind::Denied, "{err}");
    assert!(err.faulty() >= 2, "{err}");
    for node in err.nodes().iter().filter(|node| node.outcome().is_fault()) {
        assert!(
            matches!(node.outcome(), NodeOutcome::Denied(message) if message.starts_with("NOPERM")),
            "{node:?}"
        );
    }
    assert!(err.to_string().contains("NOPERM"), "{err}");
    // The other kinds are refused the same way.
    let many = rl.many(&["a", "b"]).await.unwrap_err();
    assert_eq!(many.kind(), ErrorKind::Denied, "{many}");
    let read = rl.read("rw").await.unwrap_err();
    assert_eq!(read.kind(), ErrorKind::Denied, "{read}");
    assert_eq!(cluster.keys_everywhere("*").unwrap(), 0);
}

/// Everything a client does, as one user; `Err` with what failed first.
/// Every kind's operations through `rl`, and a handoff to a waiter of another client,
/// `other` (a waiter of the same client is woken without the nodes' notification).
async fn workload(rl: &Redlock, other: &Redlock, cluster: &Cluster) -> Result<(), String> {
    let e = |what: &str| {
        let what = what.to_owned();
        move |err: redlock::Error| format!("{what}: {err}")
    };
    rl.connect().await.map_err(e("connect"))?;
    // The client's own thread opens its connections once the runtime's are open: the flush
    // below must come after their preloads too (bounded: with too few, it goes ahead).
    let _ = common::eventually(Duration::from_secs(5), || {
        cluster.nodes().iter().all(|node| {
            let list: String =
                redis::cmd("CLIENT").arg("LIST").query(&mut node.connection().unwrap()).unwrap();
            let probes: Vec<&str> = list.lines().filter(|l| l.contains(" user=probe ")).collect();
            probes.len() >= 2 && probes.iter().all(|l| l.contains(" cmd=info "))
        })
    })
    .await;
    // Every new connection preloads the scripts, before any request runs one.
    for node in cluster.nodes() {
        let info: String =
            redis::cmd("INFO").arg("memory").query(&mut node.connection().unwrap()).unwrap();
        if info.contains("number_of_cached_scripts:0\r\n") {
            return Err("scripts not preloaded".into());
        }
        // A flushed script cache (or a restart behind a proxy) makes the library send the
        // script itself, by EVAL.
        node.command(&["SCRIPT", "FLUSH"]).unwrap();
    }
    let mut lock = rl.try_lock("plain").await.map_err(e("lock"))?;
    // Longer than the 10 s lease: an extension to what is left already (the same
    // millisecond) changes nothing on a node, and would not show that `+pexpire` is needed.
    lock.extend(Duration::from_secs(20)).await.map_err(e("extend"))?;
    lock.release().await.map_err(e("release"))?;
    let mut hold = rl.reentrant("reentrant", "job").once().await.map_err(e("reentrant"))?;
    hold.extend(Duration::from_secs(20)).await.map_err(e("reentrant extend"))?;
    hold.release().await.map_err(e("reentrant release"))?;
    let mut many = rl.many(&["a", "b"]).once().await.map_err(e("many"))?;
    many.extend(Duration::from_secs(20)).await.map_err(e("many extend"))?;
    many.release().await.map_err(e("many release"))?;
    let read = rl.read("rw").once().await.map_err(e("read"))?;
    let intent = rl.write("rw").retry(Retry::new().with_max_attempts(2)).await;
    if !matches!(&intent, Err(err) if err.kind() == ErrorKind::NotAcquired) {
        return Err(format!("write intent: {intent:?}"));
    }
    read.release().await.map_err(e("read release"))?;
    rl.write("rw").once().await.map_err(e("write"))?.release().await.map_err(e("write release"))?;
    let fenced = rl.lock("fenced").once().fenced().await.map_err(e("fenced"))?;
    fenced.release().await.map_err(e("fenced release"))?;
    let held = rl.try_lock("handoff").await.map_err(e("handoff"))?;
    let attempts_before = attempts_run(cluster);
    let mut waiter = tokio::spawn({
        let rl = other.clone();
        async move { rl.lock("handoff").retry(Retry::new().with_delay(Duration::from_secs(20))).await }
    });
    let subscribed = common::eventually(Duration::from_secs(2), || {
        common::subscribers(cluster, "app:handoff").iter().all(|n| *n == 1)
    })
    .await;
    // Once subscribed, the waiter attempts again (a release may have come before its
    // subscription): only a wake-up after that one shows that the release was published.
    if subscribed {
        let _ = common::eventually(Duration::from_secs(2), || {
            let now = attempts_run(cluster);
            now.iter().zip(&attempts_before).all(|(now, before)| *now >= before + 2)
        })
        .await;
    }
    let before = pubsub_clients(cluster);
    held.release().await.map_err(e("handoff release"))?;
    let next = tokio::time::timeout(Duration::from_secs(2), &mut waiter).await;
    waiter.abort();
    if !subscribed {
        return Err("no subscription".into());
    }
    match next {
        Ok(Ok(Ok(lock))) => lock.release().await.map_err(e("woken release"))?,
        other => return Err(format!("waiter not woken: {other:?}")),
    }
    // The last waiter gone, the channel is unsubscribed on the same connection.
    let unsubscribed = common::eventually(Duration::from_secs(2), || {
        common::subscribers(cluster, "app:handoff").iter().all(|n| *n == 0)
    })
    .await;
    // (A connection with no subscription left is no longer of type pubsub: look for its id.)
    let kept = cluster.nodes().iter().zip(&before).all(|(node, id)| {
        let list: String =
            redis::cmd("CLIENT").arg("LIST").query(&mut node.connection().unwrap()).unwrap();
        !id.is_empty() && list.lines().any(|line| line.starts_with(&format!("{id} ")))
    });
    if !unsubscribed || !kept {
        return Err(format!("unsubscribing closed the connection: {before:?}"));
    }
    Ok(())
}

/// How many plain-lock acquisition attempts each node ran so far (each calls `SET` once,
/// native or scripted).
fn attempts_run(cluster: &Cluster) -> Vec<u64> {
    cluster.nodes().iter().map(|node| common::calls(node, "set")).collect()
}

/// The ids of the pub/sub connections on each node.
fn pubsub_clients(cluster: &Cluster) -> Vec<String> {
    cluster
        .nodes()
        .iter()
        .map(|node| {
            let list: String = redis::cmd("CLIENT")
                .arg("LIST")
                .arg("TYPE")
                .arg("pubsub")
                .query(&mut node.connection().unwrap())
                .unwrap();
            list.lines().filter_map(|line| line.split(' ').next()).collect::<Vec<_>>().join(",")
        })
        .collect()
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn every_rule_of_the_library_lines_is_needed() {
    let cluster = common::cluster(3);
    let urls: Vec<String> =
        cluster.nodes().iter().map(|node| node.url_as("probe", PASSWORD)).collect();
    // Uptime past the quarantine below, so that a permitted INFO lets every node vote.
    tokio::time::sleep(Duration::from_millis(2100)).await;
    for (i, dropped) in std::iter::once(None).chain(MINIMAL.iter().map(Some)).enumerate() {
        let rules: Vec<&str> =
            MINIMAL.iter().copied().filter(|rule| Some(rule) != dropped).collect();
        for node in cluster.nodes() {
            node.acl_setuser("probe", PASSWORD, &rules).unwrap();
            node.flushall().unwrap();
            node.command(&["SCRIPT", "FLUSH"]).unwrap();
        }
        let client = || {
            Redlock::builder()
                .nodes(urls.clone())
                .key_prefix("app:")
                .node_timeout(Duration::from_millis(500))
                .restart_quarantine(Duration::from_millis(1))
                .retry(Retry::never())
                .build()
                .unwrap()
        };
        let (rl, other) = (client(), client());
        let outcome = workload(&rl, &other, &cluster).await;
        // Nothing of this round may run into the next one's rules (a background release
        // sending a script by EVAL would fill the script cache).
        let _ = rl.shutdown(Duration::from_secs(2)).await;
        let _ = other.shutdown(Duration::from_secs(2)).await;
        eprintln!("{i} without {dropped:?}: {outcome:?}");
        match dropped {
            None => outcome.unwrap(),
            Some(rule) => assert!(outcome.is_err(), "{rule} is not needed"),
        }
    }
}

/// The README's lines, run as written one after another, are accepted by a server whose
/// new users get every channel (`acl-pubsub-default allchannels`: Redis 6.2's default, an
/// option on 7): there a channel pattern must follow `resetchannels`, or the server refuses
/// the whole line.
#[test]
fn the_readmes_acl_lines_are_accepted_where_new_users_get_every_channel() {
    let config = redlock_testkit::NodeConfig::new()
        .extra_arg("--acl-pubsub-default")
        .extra_arg("allchannels");
    let node = redlock_testkit::RedisNode::start_with(config).unwrap();
    let readme = include_str!("../../../README.md");
    let section = &readme[readme.find("## ACL users").expect("the README's ACL section")..];
    let lines: Vec<&str> =
        section.lines().filter(|line| line.starts_with("ACL SETUSER locker ")).collect();
    assert!(lines.len() >= 8, "{lines:?}");
    // The native and unscripted lines name a command only Valkey 9 has: other servers
    // refuse them, as the README says.
    let knows_delifeq = node.command(&["COMMAND", "INFO", "delifeq"]).is_ok_and(|info| {
        matches!(info, redis::Value::Array(found) if !matches!(found[..], [redis::Value::Nil]))
    });
    for line in lines {
        let args: Vec<&str> = line.split_whitespace().collect();
        if args.contains(&"+delifeq") && !knows_delifeq {
            let err = node.command(&args).unwrap_err();
            assert!(err.to_string().contains("nknown command"), "`{line}`: {err}");
            continue;
        }
        node.command(&args).unwrap_or_else(|err| panic!("`{line}`: {err}"));
    }
    let rules: String = redis::cmd("ACL")
        .arg("GETUSER")
        .arg("locker")
        .query::<redis::Value>(&mut node.connection().unwrap())
        .map(|value| format!("{value:?}"))
        .unwrap();
    assert!(rules.contains("redlock:released:app:*"), "{rules}");
}

/// A password rotated on two of three nodes while `with_lock` runs: the work ended while
/// the lock was held, so its output is returned, although the release, reconnecting, is
/// refused its login on a quorum (`Denied`).
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn with_lock_keeps_its_output_when_the_release_meets_a_rotated_password() {
    let (cluster, builder) = cluster_as("rotated", MINIMAL);
    let rl = builder.ttl(Duration::from_secs(10)).build().unwrap();
    let output = rl
        .with_lock("job", |_| {
            let cluster = &cluster;
            async move {
                for i in [1, 2] {
                    common::run(
                        cluster,
                        i,
                        &["ACL", "SETUSER", "rotated", "resetpass", ">rotated-pass"],
                    );
                    common::run(cluster, i, &["CLIENT", "KILL", "USER", "rotated"]);
                }
                42
            }
        })
        .await;
    assert_eq!(output.unwrap(), 42);
}

/// A release whose node refuses the login on its new connection (the password rotated
/// there) is sent again from the background, and lands once the node takes the old
/// password again: a rotation under way is not given up on like a refused command.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_release_refused_a_rotated_login_is_sent_again_until_the_login_works() {
    let (cluster, builder) = cluster_as("rotating", MINIMAL);
    let rl = builder.ttl(Duration::from_secs(20)).build().unwrap();
    let lock = rl.try_lock("rotated").await.unwrap();
    common::held_on(&cluster, "app:rotated", lock.token(), &[0, 1, 2]).await;
    common::run(&cluster, 2, &["ACL", "SETUSER", "rotating", "resetpass", ">other-pass"]);
    common::run(&cluster, 2, &["CLIENT", "KILL", "USER", "rotating"]);
    lock.release().await.unwrap();
    tokio::time::sleep(Duration::from_millis(300)).await;
    assert_eq!(cluster.count_key("app:rotated"), 1, "node 2 kept the key while refusing");
    common::run(&cluster, 2, &["ACL", "SETUSER", "rotating", &format!(">{PASSWORD}")]);
    let gone = || cluster.count_key("app:rotated") == 0;
    assert!(common::eventually(Duration::from_secs(5), gone).await, "the re-send landed");
}
