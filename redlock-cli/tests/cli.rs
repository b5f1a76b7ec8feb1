//! The `redlock` binary against real redis-server nodes, with child scripts that trap
//! signals and write marker files.

use std::path::{Path, PathBuf};
use std::process::{Child, Command, Output, Stdio};
use std::time::{Duration, Instant};

use redlock_testkit::Cluster;

const BIN: &str = env!("CARGO_BIN_EXE_redlock");

fn cluster(n: usize) -> Cluster {
    Cluster::start(n).unwrap_or_else(|err| panic!("cannot start {n} redis nodes: {err}"))
}

/// `redlock` configured only through the environment.
fn redlock(cluster: &Cluster) -> Command {
    let mut command = Command::new(BIN);
    command
        .env("REDLOCK_NODES", cluster.urls().join(","))
        .env("REDLOCK_TTL", "2s")
        .env("REDLOCK_NODE_TIMEOUT", "100ms")
        .stdout(Stdio::piped())
        .stderr(Stdio::piped());
    command
}

fn sh(script: &str) -> Vec<String> {
    vec!["--".into(), "sh".into(), "-c".into(), script.into()]
}

fn scratch() -> PathBuf {
    let dir =
        std::env::temp_dir().join(format!("redlock-cli-{}-{}", std::process::id(), rand_suffix()));
    std::fs::create_dir_all(&dir).unwrap();
    dir
}

fn rand_suffix() -> u128 {
    std::time::SystemTime::now().duration_since(std::time::UNIX_EPOCH).map_or(0, |d| d.as_nanos())
}

fn wait_for(path: &Path, within: Duration) -> bool {
    let deadline = Instant::now() + within;
    while Instant::now() < deadline {
        if path.exists() {
            return true;
        }
        std::thread::sleep(Duration::from_millis(10));
    }
    false
}

fn finish(child: Child, within: Duration) -> Output {
    let deadline = Instant::now() + within;
    let mut child = child;
    while Instant::now() < deadline {
        if child.try_wait().unwrap().is_some() {
            return child.wait_with_output().unwrap();
        }
        std::thread::sleep(Duration::from_millis(10));
    }
    let _ = child.kill();
    panic!("redlock did not exit within {within:?}: {:?}", child.wait_with_output());
}

fn signal(child: &Child, sig: nix::sys::signal::Signal) {
    let pid = nix::unistd::Pid::from_raw(i32::try_from(child.id()).unwrap());
    nix::sys::signal::kill(pid, sig).unwrap();
}

/// A command that sets `traps`, marks `started`, then loops until a signal ends it.
fn looping(traps: &str, started: &Path) -> String {
    format!("{traps}; touch {}; while true; do sleep 0.05; done", started.display())
}

/// Starts `redlock run <args>` over a [`looping`] command with `traps` set (with
/// `REDLOCK_TTL` set to `ttl`, if any), once the command runs.
fn run_looping(
    cluster: &Cluster,
    ttl: Option<&str>,
    args: &[&str],
    traps: &str,
    started: &Path,
) -> Child {
    let mut command = redlock(cluster);
    if let Some(ttl) = ttl {
        command.env("REDLOCK_TTL", ttl);
    }
    let child = command.arg("run").args(args).args(sh(&looping(traps, started))).spawn().unwrap();
    assert!(wait_for(started, Duration::from_secs(5)), "the command never started");
    child
}

fn text(bytes: &[u8]) -> String {
    String::from_utf8_lossy(bytes).into_owned()
}

#[test]
fn the_command_gets_the_lock_in_its_environment_and_its_status_is_passed_on() {
    let cluster = cluster(3);
    let dir = scratch();
    let out = dir.join("env");
    let script = format!("echo \"$REDLOCK_RESOURCE $REDLOCK_TOKEN\" > {}; exit 3", out.display());
    let output = redlock(&cluster).args(["run", "nightly"]).args(sh(&script)).output().unwrap();
    assert_eq!(output.status.code(), Some(3), "{}", text(&output.stderr));
    let seen = std::fs::read_to_string(&out).unwrap();
    let (resource, token) = seen.trim().split_once(' ').unwrap();
    assert_eq!(resource, "nightly");
    // 40 hex characters, then the owner label: this machine and redlock's pid.
    let (random, label) = token.split_once('.').unwrap();
    assert_eq!(random.len(), 40);
    assert!(label.contains('/'), "{label}");
    // Released on every node before redlock exited.
    assert_eq!(cluster.count_key("nightly"), 0);
}

#[test]
fn of_two_concurrent_runs_one_runs_and_the_other_exits_75_or_the_override() {
    let cluster = cluster(3);
    let dir = scratch();
    let started = dir.join("started");
    let script = format!("touch {}; sleep 1", started.display());
    let first =
        redlock(&cluster).args(["run", "--wait", "0", "job"]).args(sh(&script)).spawn().unwrap();
    assert!(wait_for(&started, Duration::from_secs(5)));
    let second =
        redlock(&cluster).args(["run", "--wait", "0", "job"]).args(sh("exit 0")).output().unwrap();
    assert_eq!(second.status.code(), Some(75), "{}", text(&second.stderr));
    assert!(text(&second.stderr).contains("held elsewhere"));
    let third = redlock(&cluster)
        .args(["run", "--conflict-exit-code", "0", "job"])
        .args(sh("exit 9"))
        .output()
        .unwrap();
    assert_eq!(third.status.code(), Some(0), "{}", text(&third.stderr));
    let first = finish(first, Duration::from_secs(10));
    assert_eq!(first.status.code(), Some(0), "{}", text(&first.stderr));
}

#[test]
fn of_three_runs_with_two_permits_two_run_at_once_and_the_third_exits_75() {
    let cluster = cluster(3);
    let dir = scratch();
    let (one, two) = (dir.join("one"), dir.join("two"));
    // Each holder marks its slot and stays until the test is done with it.
    let hold = |marker: &Path| {
        let script = format!(
            "echo $REDLOCK_PERMIT_SLOT > {}.tmp; mv {0}.tmp {0}; sleep 3",
            marker.display()
        );
        redlock(&cluster)
            .env("REDLOCK_TTL", "10s")
            .args(["run", "--permits", "2", "--wait", "0", "exports"])
            .args(sh(&script))
            .spawn()
            .unwrap()
    };
    let (first, second) = (hold(&one), hold(&two));
    assert!(wait_for(&one, Duration::from_secs(10)) && wait_for(&two, Duration::from_secs(10)));
    let slots = [&one, &two].map(|marker| std::fs::read_to_string(marker).unwrap());
    let mut slots = slots.map(|slot| slot.trim().to_owned());
    slots.sort();
    assert_eq!(slots, ["0", "1"], "each run holds its own slot");
    let third = redlock(&cluster)
        .args(["run", "--permits", "2", "--wait", "0", "exports"])
        .args(sh("exit 0"))
        .output()
        .unwrap();
    assert_eq!(third.status.code(), Some(75), "{}", text(&third.stderr));
    assert!(text(&third.stderr).contains("every permit held elsewhere"), "{}", text(&third.stderr));
    let shown = redlock(&cluster).args(["inspect", "--permits", "2", "exports"]).output().unwrap();
    let shown_text = text(&shown.stdout);
    assert_eq!(shown.status.code(), Some(0), "{shown_text}");
    assert!(shown_text.contains("permit 0 ({exports}:permit:0): held by "), "{shown_text}");
    assert!(shown_text.contains("2 of 2 permits held on a quorum"), "{shown_text}");
    for run in [first, second] {
        let run = finish(run, Duration::from_secs(15));
        assert_eq!(run.status.code(), Some(0), "{}", text(&run.stderr));
    }
    assert_eq!(
        cluster.count_key("{exports}:permit:0") + cluster.count_key("{exports}:permit:1"),
        0
    );
    let json = redlock(&cluster)
        .args(["inspect", "--json", "--permits", "2", "exports"])
        .output()
        .unwrap();
    assert!(text(&json.stdout).contains("\"held\":0"), "{}", text(&json.stdout));
    let zero = redlock(&cluster).args(["run", "--permits", "0", "x"]).args(sh("exit 0")).output();
    assert_eq!(zero.unwrap().status.code(), Some(2), "clap refuses zero permits");
}

#[test]
fn sigterm_is_forwarded_and_every_key_is_gone_before_redlock_exits() {
    let cluster = cluster(3);
    let dir = scratch();
    let (started, got) = (dir.join("started"), dir.join("got-term"));
    let traps = format!("trap 'touch {}; exit 143' TERM", got.display());
    let child = run_looping(&cluster, None, &["job"], &traps, &started);
    assert_eq!(cluster.count_key("job"), 3);
    signal(&child, nix::sys::signal::Signal::SIGTERM);
    let output = finish(child, Duration::from_secs(10));
    assert_eq!(output.status.code(), Some(143), "{}", text(&output.stderr));
    assert!(got.exists(), "the command got SIGTERM");
    assert_eq!(cluster.count_key("job"), 0, "released everywhere before exiting");
}

#[test]
fn a_forced_release_loses_the_lock_the_group_gets_term_then_kill_and_redlock_exits_124() {
    let cluster = cluster(3);
    let dir = scratch();
    let (started, got) = (dir.join("started"), dir.join("got-term"));
    // Ignores TERM (records it), so only the KILL after the grace period ends it.
    let traps = format!("trap 'touch {}' TERM", got.display());
    let child =
        run_looping(&cluster, Some("600ms"), &["--kill-after", "500ms", "job"], &traps, &started);
    let forced = redlock(&cluster).args(["release", "--force", "--yes", "job"]).output().unwrap();
    assert_eq!(forced.status.code(), Some(0), "{}", text(&forced.stderr));
    let output = finish(child, Duration::from_secs(10));
    assert_eq!(output.status.code(), Some(124), "{}", text(&output.stderr));
    assert!(got.exists(), "the command's group got the lost signal first");
    assert!(text(&output.stderr).contains("lost"), "{}", text(&output.stderr));
}

#[test]
fn a_forced_release_needs_confirmation() {
    let cluster = cluster(3);
    let output = redlock(&cluster).args(["release", "--force", "job"]).output().unwrap();
    assert_eq!(output.status.code(), Some(125));
    assert!(text(&output.stderr).contains("--yes"));
}

#[test]
fn sigint_while_waiting_leaves_no_key_and_exits_130() {
    let cluster = cluster(3);
    let runtime = tokio::runtime::Runtime::new().unwrap();
    let rl = redlock::Redlock::builder().nodes(cluster.urls()).build().unwrap();
    let holder = runtime.block_on(async { rl.try_lock("job").await }).unwrap();
    let waiting =
        redlock(&cluster).args(["run", "--wait", "30s", "job"]).args(sh("exit 0")).spawn().unwrap();
    std::thread::sleep(Duration::from_millis(500));
    signal(&waiting, nix::sys::signal::Signal::SIGINT);
    let output = finish(waiting, Duration::from_secs(10));
    assert_eq!(output.status.code(), Some(130), "{}", text(&output.stderr));
    // Only the holder's key is left.
    assert_eq!(cluster.nodes_holding("job", holder.token()).len(), cluster.count_key("job"));
    runtime.block_on(holder.release()).unwrap();
}

#[test]
fn fenced_runs_get_increasing_tokens() {
    let cluster = cluster(3);
    let dir = scratch();
    let out = dir.join("tokens");
    let script = format!("echo $REDLOCK_FENCING_TOKEN >> {}", out.display());
    for _ in 0..3 {
        let output =
            redlock(&cluster).args(["run", "--fenced", "job"]).args(sh(&script)).output().unwrap();
        assert_eq!(output.status.code(), Some(0), "{}", text(&output.stderr));
    }
    let tokens: Vec<u64> =
        std::fs::read_to_string(&out).unwrap().lines().map(|l| l.trim().parse().unwrap()).collect();
    assert_eq!(tokens.len(), 3);
    assert!(tokens.windows(2).all(|w| w[0] < w[1]), "{tokens:?}");
}

#[test]
fn commands_that_cannot_run_exit_126_and_127_and_leave_no_key() {
    let cluster = cluster(3);
    let missing =
        redlock(&cluster).args(["run", "job", "--", "/nonexistent/command"]).output().unwrap();
    assert_eq!(missing.status.code(), Some(127), "{}", text(&missing.stderr));
    let dir = scratch();
    let file = dir.join("not-executable");
    std::fs::write(&file, "#!/bin/sh\n").unwrap();
    let denied = redlock(&cluster).args(["run", "job", "--"]).arg(&file).output().unwrap();
    assert_eq!(denied.status.code(), Some(126), "{}", text(&denied.stderr));
    assert_eq!(cluster.count_key("job"), 0);
}

#[test]
fn redlocks_own_failures_exit_125() {
    let output = Command::new(BIN)
        .args(["run", "job", "--", "true"])
        .env_remove("REDLOCK_NODES")
        .output()
        .unwrap();
    assert_eq!(output.status.code(), Some(125));
    assert!(text(&output.stderr).contains("REDLOCK_NODES"));
    // Every node down: unavailable, not a conflict.
    let down = Command::new(BIN)
        .env("REDLOCK_NODES", "redis://127.0.0.1:1,redis://127.0.0.1:2,redis://127.0.0.1:3")
        .args(["run", "job", "--", "true"])
        .output()
        .unwrap();
    assert_eq!(down.status.code(), Some(125), "{}", text(&down.stderr));
}

#[test]
fn inspect_shows_the_holder_and_its_lease_per_node() {
    let cluster = cluster(3);
    let runtime = tokio::runtime::Runtime::new().unwrap();
    let rl = redlock::Redlock::builder().nodes(cluster.urls()).build().unwrap();
    let lock = runtime.block_on(async { rl.try_lock("job").await }).unwrap();
    runtime.block_on(async {
        while cluster.count_key("job") < 3 {
            tokio::time::sleep(Duration::from_millis(5)).await;
        }
    });
    let started = scratch().join("started");
    let labelled = redlock(&cluster)
        .args(["run", "--owner-label", "cron-7", "--wait", "0", "other"])
        .args(sh(&format!("touch {}; sleep 0.5", started.display())))
        .spawn()
        .unwrap();
    assert!(wait_for(&started, Duration::from_secs(5)));
    let shown = text(&redlock(&cluster).args(["inspect", "other"]).output().unwrap().stdout);
    assert!(shown.contains(".cron-7 (pttl"), "the label is shown: {shown}");
    finish(labelled, Duration::from_secs(5));
    let output = redlock(&cluster).args(["inspect", "job"]).output().unwrap();
    let shown = text(&output.stdout);
    assert_eq!(output.status.code(), Some(0));
    assert_eq!(shown.matches(lock.token()).count(), 4, "{shown}"); // three nodes and the quorum line
    assert!(shown.contains("pttl"), "{shown}");
    let json = text(&redlock(&cluster).args(["inspect", "--json", "job"]).output().unwrap().stdout);
    assert!(json.contains(&format!("\"holder\":\"{}\"", lock.token())), "{json}");
    let held = format!("held by {} on 3 of 3 nodes (quorum 2)", lock.token());
    assert!(shown.lines().any(|line| line == held), "{shown}");
    runtime.block_on(lock.release()).unwrap();
    let free = text(&redlock(&cluster).args(["inspect", "job"]).output().unwrap().stdout);
    let line = "no holder on a quorum: free on 3 of 3 nodes (quorum 2)";
    assert!(free.lines().any(|l| l == line), "{free}");
}

/// The verdict line counts the nodes that said so, not only the quorum: a lock held on
/// every node of five is held "on 5 of 5 nodes", never "on a quorum (3 of 5)", which reads
/// as three.
#[test]
fn inspect_counts_the_nodes_that_hold_the_lock_and_those_that_are_free() {
    let cluster = cluster(5);
    let verdict = || {
        let output = redlock(&cluster).args(["inspect", "job"]).output().unwrap();
        assert_eq!(output.status.code(), Some(0), "{}", text(&output.stderr));
        text(&output.stdout).lines().last().unwrap_or_default().to_owned()
    };
    for i in 0..5 {
        cluster.node(i).command(&["SET", "job", "owner-a", "PX", "20000"]).unwrap();
    }
    assert_eq!(verdict(), "held by owner-a on 5 of 5 nodes (quorum 3)");
    cluster.node(0).command(&["DEL", "job"]).unwrap();
    cluster.node(1).command(&["DEL", "job"]).unwrap();
    assert_eq!(verdict(), "held by owner-a on 3 of 5 nodes (quorum 3)");
    cluster.node(2).command(&["DEL", "job"]).unwrap();
    assert_eq!(verdict(), "no holder on a quorum: free on 3 of 5 nodes (quorum 3)");
    cluster.node(3).command(&["SET", "job", "owner-b", "PX", "20000"]).unwrap();
    assert_eq!(verdict(), "no holder on a quorum: free on 3 of 5 nodes (quorum 3)");
    cluster.node(3).command(&["DEL", "job"]).unwrap();
    cluster.node(4).command(&["DEL", "job"]).unwrap();
    assert_eq!(verdict(), "no holder on a quorum: free on 5 of 5 nodes (quorum 3)");
}

fn check(urls: &[String]) -> (Option<i32>, String) {
    let output =
        Command::new(BIN).env("REDLOCK_NODES", urls.join(",")).arg("check").output().unwrap();
    (output.status.code(), text(&output.stdout) + &text(&output.stderr))
}

#[test]
fn check_passes_persistent_independent_masters() {
    let config = redlock_testkit::NodeConfig::new()
        .persistence(redlock_testkit::Persistence::AppendFsyncAlways);
    let cluster = Cluster::start_with(3, config).unwrap();
    let (code, shown) = check(&cluster.urls());
    assert_eq!(code, Some(0), "{shown}");
    assert!(shown.contains("fit the Redlock model"), "{shown}");
    assert!(!shown.contains("warning"), "{shown}");
    // Each node's version and role were read (with one INFO section per request: Redis 6.2
    // refuses several).
    for url in cluster.urls() {
        let line = shown.lines().find(|line| line.starts_with(&url)).unwrap_or_default();
        assert!(line.contains(", master, up "), "{shown}");
        assert!(!line.contains(" ?,"), "{shown}");
    }
}

#[test]
fn check_says_per_node_whether_the_plain_lock_needs_scripts() {
    let cluster = Cluster::start(2).unwrap();
    let (code, shown) = check(&cluster.urls());
    assert_eq!(code, Some(0), "{shown}");
    let mut con = cluster.node(0).connection().unwrap();
    let info: String = redis::cmd("INFO").arg("server").query(&mut con).unwrap();
    let valkey_9 =
        info.lines().find_map(|line| line.strip_prefix("valkey_version:")).is_some_and(|version| {
            version.split('.').next().unwrap().trim().parse::<u32>().unwrap() >= 9
        });
    let expected = match valkey_9 {
        true => "plain lock: no scripts needed",
        false => "plain lock: needs scripts",
    };
    for url in cluster.urls() {
        let line = shown.lines().find(|line| line.starts_with(&url)).unwrap_or_default();
        assert!(line.ends_with(expected), "{shown}");
    }
}

#[test]
fn check_flags_everysec_lru_a_duplicate_url_and_a_replica() {
    use redlock_testkit::{NodeConfig, RedisNode};
    let everysec = RedisNode::start_with(
        NodeConfig::new()
            .extra_arg("--appendonly")
            .extra_arg("yes")
            .extra_arg("--appendfsync")
            .extra_arg("everysec"),
    )
    .unwrap();
    let lru = RedisNode::start_with(
        NodeConfig::new().extra_arg("--maxmemory-policy").extra_arg("allkeys-lru"),
    )
    .unwrap();
    let (code, shown) = check(&[everysec.url(), lru.url()]);
    assert_eq!(code, Some(0), "warnings alone do not fail: {shown}");
    assert!(shown.contains("appendfsync everysec"), "{shown}");
    assert!(shown.contains("maxmemory-policy allkeys-lru can evict"), "{shown}");

    // One server under two URLs: two votes.
    let twice = vec![everysec.url(), everysec.url().replace("127.0.0.1", "localhost"), lru.url()];
    let (code, shown) = check(&twice);
    assert_eq!(code, Some(1), "{shown}");
    assert!(shown.contains("same run_id"), "{shown}");

    // A replica of one of them: the replica is not a master, the master has a replica.
    let replica = RedisNode::start_with(
        NodeConfig::new()
            .extra_arg("--replicaof")
            .extra_arg("127.0.0.1")
            .extra_arg(lru.port().to_string()),
    )
    .unwrap();
    let deadline = Instant::now() + Duration::from_secs(5);
    let (mut code, mut shown) = check(&[lru.url(), replica.url(), everysec.url()]);
    while !shown.contains("replica(s) attached") && Instant::now() < deadline {
        std::thread::sleep(Duration::from_millis(100));
        (code, shown) = check(&[lru.url(), replica.url(), everysec.url()]);
    }
    assert_eq!(code, Some(1), "{shown}");
    assert!(shown.contains("not a master"), "{shown}");
    assert!(shown.contains("replica(s) attached"), "{shown}");
}

#[test]
fn check_fails_on_an_unreachable_node() {
    let cluster = cluster(2);
    let mut urls = cluster.urls();
    urls.push("redis://127.0.0.1:1".to_owned());
    let (code, shown) = check(&urls);
    assert_eq!(code, Some(1), "{shown}");
    assert!(shown.contains("unreachable"), "{shown}");
}

#[test]
fn check_names_a_user_who_may_not_lock_and_one_who_may_not_notify() {
    let cluster = cluster(3);
    for node in cluster.nodes() {
        node.acl_setuser("quiet", "pw", &["~*", "&*", "+@all", "-publish"]).unwrap();
        node.acl_setuser("elsewhere", "pw", &["~other:*", "&*", "+@all"]).unwrap();
    }
    let urls_as = |user: &str| -> Vec<String> {
        cluster.nodes().iter().map(|n| n.url_as(user, "pw")).collect()
    };
    let (code, shown) = check(&urls_as("quiet"));
    assert!(shown.contains("release notifications refused"), "{shown}");
    assert!(!shown.contains("may not use the lock"), "{shown}");
    assert!(!shown.contains("pw@"), "no password shown: {shown}");
    assert_eq!(code, Some(0), "a user who may not notify is a warning, not an error: {shown}");
    let (code, shown) = check(&urls_as("elsewhere"));
    assert_eq!(code, Some(1), "{shown}");
    assert!(shown.contains("may not use the lock") && shown.contains("NOPERM"), "{shown}");
    let (code, shown) = check(
        &urls_as("elsewhere").iter().map(|u| u.replace(":pw@", ":wrong@")).collect::<Vec<_>>(),
    );
    assert_eq!(code, Some(1), "a refused login is an error: {shown}");
    assert!(!shown.contains("wrong@"), "no password shown: {shown}");
}

#[test]
fn tls_files_from_the_environment_reach_mutual_tls_nodes() {
    use redlock_testkit::NodeConfig;
    use redlock_testkit::tls::{Certificates, ClientCerts};
    let cluster = Cluster::start_with(3, NodeConfig::new().tls(ClientCerts::Required)).unwrap();
    let certs = Certificates::get().unwrap();
    let with_tls = |command: &mut Command| {
        command
            // A fresh process connects first: a mutual TLS handshake with each node, which
            // a loaded machine can stretch past the 100 ms the other tests allow.
            .env("REDLOCK_NODE_TIMEOUT", "1s")
            .env("REDLOCK_TLS_CA", certs.ca().path())
            .env("REDLOCK_TLS_CERT", certs.client_cert().path())
            .env("REDLOCK_TLS_KEY", certs.client_key().path());
    };
    let mut run = redlock(&cluster);
    with_tls(&mut run);
    let output = run.args(["run", "job"]).args(sh("exit 0")).output().unwrap();
    assert_eq!(output.status.code(), Some(0), "{}", text(&output.stderr));
    let mut check = redlock(&cluster);
    with_tls(&mut check);
    let output = check.arg("check").output().unwrap();
    assert_eq!(output.status.code(), Some(0), "{}{}", text(&output.stdout), text(&output.stderr));
    // Without the client certificate the nodes refuse us: redlock's own failure.
    let output = redlock(&cluster)
        .env("REDLOCK_TLS_CA", certs.ca().path())
        .args(["run", "job"])
        .args(sh("exit 0"))
        .output()
        .unwrap();
    assert_eq!(output.status.code(), Some(125), "{}", text(&output.stderr));
}

/// Each forwarded signal reaches the command's group; a command that dies of signal N
/// makes redlock exit 128+N (also for a signal redlock never sent), with every key gone.
#[test]
fn every_forwarded_signal_reaches_the_command_and_a_death_by_signal_n_exits_128_plus_n() {
    use nix::sys::signal::Signal;
    let cluster = cluster(3);
    let dir = scratch();
    for sig in [Signal::SIGINT, Signal::SIGHUP, Signal::SIGQUIT, Signal::SIGUSR1, Signal::SIGUSR2] {
        let started = dir.join(format!("started-{sig}"));
        // `exec`: the signal's default action ends the command itself.
        let script = format!("touch {}; exec sleep 30", started.display());
        let child = redlock(&cluster).args(["run", "job"]).args(sh(&script)).spawn().unwrap();
        assert!(wait_for(&started, Duration::from_secs(5)), "{sig}: never started");
        // The marker is written just before the `exec`: give it a moment to happen.
        std::thread::sleep(Duration::from_millis(100));
        signal(&child, sig);
        let output = finish(child, Duration::from_secs(10));
        assert_eq!(output.status.code(), Some(128 + sig as i32), "{sig}: {}", text(&output.stderr));
        assert_eq!(cluster.count_key("job"), 0, "{sig}: released everywhere before exiting");
    }
    let output = redlock(&cluster).args(["run", "job"]).args(sh("kill -KILL $$")).output().unwrap();
    assert_eq!(output.status.code(), Some(128 + 9), "{}", text(&output.stderr));
    assert_eq!(cluster.count_key("job"), 0);
}

/// `--max-hold` ends the hold like a lost lock: the group gets `--lost-signal` (here USR1,
/// not the default TERM) a third of the lease before the cap (so that the KILL would land
/// by it), and redlock exits 124.
#[test]
fn max_hold_ends_the_run_with_the_lost_signal_asked_for_and_124() {
    let cluster = cluster(3);
    let dir = scratch();
    let (started, got) = (dir.join("started"), dir.join("got-usr1"));
    // `echo`, a builtin: the mark needs no new process before the KILL.
    let traps = format!("trap 'echo > {}; exit 0' USR1; trap '' TERM", got.display());
    let began = Instant::now();
    let args = ["--max-hold", "2s", "--lost-signal", "USR1", "--kill-after", "2s", "job"];
    let child = run_looping(&cluster, Some("1500ms"), &args, &traps, &started);
    let output = finish(child, Duration::from_secs(10));
    assert_eq!(output.status.code(), Some(124), "{}", text(&output.stderr));
    let shown = text(&output.stderr);
    assert!(shown.contains("job: the lock could not be kept: --max-hold 2s reached"), "{shown}");
    assert!(got.exists(), "the command's group got USR1");
    // The cap less a third of the 1.5 s lease, and a little for the clock.
    assert!(began.elapsed() >= Duration::from_millis(1400), "ended long before --max-hold");
    assert_eq!(cluster.count_key("job"), 0);
}

/// Without `--kill-after`, a command that ignores the lost signal gets KILL 5 s after it.
#[test]
fn the_default_grace_before_kill_is_five_seconds() {
    let cluster = cluster(3);
    let dir = scratch();
    let (started, got) = (dir.join("started"), dir.join("got-term"));
    let traps = format!("trap 'touch {}' TERM", got.display());
    let child = run_looping(&cluster, Some("600ms"), &["job"], &traps, &started);
    let forced = redlock(&cluster).args(["release", "--force", "--yes", "job"]).output().unwrap();
    assert_eq!(forced.status.code(), Some(0), "{}", text(&forced.stderr));
    assert!(wait_for(&got, Duration::from_secs(5)), "the group never got TERM");
    let term = Instant::now();
    let output = finish(child, Duration::from_secs(15));
    let grace = term.elapsed();
    assert_eq!(output.status.code(), Some(124), "{}", text(&output.stderr));
    assert!(grace >= Duration::from_millis(4500), "KILL {grace:?} after TERM");
}

/// `REDLOCK_WAIT` and `REDLOCK_OWNER_LABEL` configure a run like their flags.
#[test]
fn wait_and_owner_label_come_from_the_environment() {
    let cluster = cluster(3);
    let dir = scratch();
    let (started, out) = (dir.join("started"), dir.join("token"));
    let script = format!("touch {}; sleep 1", started.display());
    let first = redlock(&cluster).args(["run", "job"]).args(sh(&script)).spawn().unwrap();
    assert!(wait_for(&started, Duration::from_secs(5)));
    let impatient =
        redlock(&cluster).env("REDLOCK_WAIT", "0").args(["run", "job"]).args(sh("exit 0")).output();
    let impatient = impatient.unwrap();
    assert_eq!(impatient.status.code(), Some(75), "{}", text(&impatient.stderr));
    let patient = redlock(&cluster)
        .env("REDLOCK_WAIT", "10s")
        .env("REDLOCK_OWNER_LABEL", "nightly-box")
        .args(["run", "job"])
        .args(sh(&format!("echo $REDLOCK_TOKEN > {}", out.display())))
        .output()
        .unwrap();
    assert_eq!(patient.status.code(), Some(0), "{}", text(&patient.stderr));
    let token = std::fs::read_to_string(&out).unwrap();
    assert!(token.trim().ends_with(".nightly-box"), "{token}");
    let first = finish(first, Duration::from_secs(10));
    assert_eq!(first.status.code(), Some(0), "{}", text(&first.stderr));
}

/// An ACL user who may not lock, or a login the nodes refuse, is redlock's own failure
/// (125, naming the cause), not a conflict; no password is shown.
#[test]
fn acl_failures_exit_125_and_name_the_cause() {
    let cluster = cluster(3);
    for node in cluster.nodes() {
        node.acl_setuser("elsewhere", "pw", &["~other:*", "&*", "+@all"]).unwrap();
    }
    let as_user = |user: &str, password: &str| -> String {
        let urls: Vec<String> = cluster.nodes().iter().map(|n| n.url_as(user, password)).collect();
        urls.join(",")
    };
    let denied = Command::new(BIN)
        .env("REDLOCK_NODES", as_user("elsewhere", "pw"))
        .args(["run", "job", "--", "true"])
        .output()
        .unwrap();
    let shown = text(&denied.stderr);
    assert_eq!(denied.status.code(), Some(125), "{shown}");
    assert!(shown.contains("NOPERM"), "{shown}");
    assert!(!shown.contains("pw@"), "no password shown: {shown}");
    let refused = Command::new(BIN)
        .env("REDLOCK_NODES", as_user("elsewhere", "wrong-pw"))
        .args(["run", "job", "--", "true"])
        .output()
        .unwrap();
    let shown = text(&refused.stderr);
    assert_eq!(refused.status.code(), Some(125), "{shown}");
    assert!(!shown.contains("wrong-pw"), "no password shown: {shown}");
    assert_eq!(cluster.count_key("job"), 0);
}

/// The rules of one feature's line in the README's "ACL users" section, for the key prefix
/// `app:`: the command is tested with what the README tells users, not a copy of it.
fn readme_acl(features: &[&str]) -> Vec<String> {
    let readme = std::fs::read_to_string(concat!(env!("CARGO_MANIFEST_DIR"), "/../README.md"));
    let readme = readme.unwrap();
    let section = &readme[readme.find("## ACL users").expect("the README's ACL section")..];
    let mut rules: Vec<String> = Vec::new();
    for feature in features {
        let mut lines = section.lines().skip_while(|line| {
            line.strip_prefix("# ").and_then(|rest| rest.split_once(':')).map(|(name, _)| name)
                != Some(feature)
        });
        let line = lines.nth(1).and_then(|line| line.strip_prefix("ACL SETUSER locker "));
        let line = line.unwrap_or_else(|| panic!("the README has no ACL rules for `{feature}`"));
        // Flags that set the user up, not rules that permit something.
        let flag = |r: &str| matches!(r, "on" | "resetchannels") || r.starts_with('>');
        for rule in line.split_whitespace().filter(|r| !flag(r)) {
            if !rules.iter().any(|known| known == rule) {
                rules.push(rule.to_owned());
            }
        }
    }
    rules
}

/// `redlock` as the ACL user `user`, with the README's rules of `features`, prefix `app:`.
fn redlock_as(cluster: &Cluster, user: &str, features: &[&str]) -> Command {
    let rules = readme_acl(features);
    let rules: Vec<&str> = rules.iter().map(String::as_str).collect();
    for node in cluster.nodes() {
        node.acl_setuser(user, "pw", &rules).unwrap();
    }
    let urls: Vec<String> = cluster.nodes().iter().map(|n| n.url_as(user, "pw")).collect();
    let mut command = redlock(cluster);
    command
        .env("REDLOCK_NODES", urls.join(","))
        .env("REDLOCK_KEY_PREFIX", "app:")
        .env("REDLOCK_NODE_TIMEOUT", "1s");
    command
}

/// A lock on `resource` (prefix `app:`) held by the default user, and its token.
fn held_by_the_default_user(
    cluster: &Cluster,
    runtime: &tokio::runtime::Runtime,
    resource: &str,
) -> redlock::Lock {
    let rl = redlock::Redlock::builder().nodes(cluster.urls()).key_prefix("app:").build().unwrap();
    let lock = runtime.block_on(async { rl.try_lock(resource).await }).unwrap();
    let key = format!("app:{resource}");
    let deadline = Instant::now() + Duration::from_secs(5);
    while cluster.count_key(&key) < cluster.len() && Instant::now() < deadline {
        std::thread::sleep(Duration::from_millis(5));
    }
    lock
}

/// Each line of the README's ACL section, added to the locking line, is enough for what
/// the command does with it: run, wait, run fenced, run under restart quarantine (from
/// `REDLOCK_RESTART_QUARANTINE`), inspect, release by force, check.
#[test]
fn every_acl_rule_set_of_the_readme_is_enough_for_the_command() {
    let config = redlock_testkit::NodeConfig::new()
        .persistence(redlock_testkit::Persistence::AppendFsyncAlways);
    let cluster = Cluster::start_with(3, config).unwrap();
    let runtime = tokio::runtime::Runtime::new().unwrap();
    let ok = |output: Output, what: &str| {
        let shown = text(&output.stdout) + &text(&output.stderr);
        assert_eq!(output.status.code(), Some(0), "{what}: {shown}");
        assert!(!shown.contains("NOPERM"), "{what}: {shown}");
        shown
    };

    let run = redlock_as(&cluster, "locking", &["locking"])
        .args(["run", "job"])
        .args(sh("exit 0"))
        .output();
    ok(run.unwrap(), "locking");

    let dir = scratch();
    let started = dir.join("started");
    let first = redlock_as(&cluster, "waiting", &["locking", "waiting"])
        .args(["run", "job"])
        .args(sh(&format!("touch {}; sleep 0.5", started.display())))
        .spawn()
        .unwrap();
    assert!(wait_for(&started, Duration::from_secs(5)), "the first run never started");
    let second = redlock_as(&cluster, "waiting", &["locking", "waiting"])
        .args(["run", "--wait", "20s", "job"])
        .args(sh("exit 0"))
        .output()
        .unwrap();
    ok(finish(first, Duration::from_secs(10)), "waiting, first");
    ok(second, "waiting, second");

    let fenced = redlock_as(&cluster, "fencing", &["locking", "fencing"])
        .args(["run", "--fenced", "job"])
        .args(sh("echo token=$REDLOCK_FENCING_TOKEN"))
        .output()
        .unwrap();
    let shown = ok(fenced, "fencing");
    assert!(shown.contains("token=") && !shown.contains("token=\n"), "{shown}");

    // Uptime past the quarantine, so that every node may vote once INFO is read.
    std::thread::sleep(Duration::from_millis(2100));
    let quarantined = redlock_as(&cluster, "quarantine", &["locking", "quarantine"])
        .env("REDLOCK_RESTART_QUARANTINE", "1ms")
        .args(["run", "job"])
        .args(sh("exit 0"))
        .output()
        .unwrap();
    ok(quarantined, "quarantine");

    let lock = held_by_the_default_user(&cluster, &runtime, "job");
    let inspected = redlock_as(&cluster, "inspect", &["locking", "inspect"])
        .args(["inspect", "job"])
        .output()
        .unwrap();
    let shown = ok(inspected, "inspect");
    assert_eq!(shown.matches(lock.token()).count(), 4, "{shown}");

    let forced = redlock_as(&cluster, "force", &["locking", "inspect"])
        .args(["release", "--force", "--yes", "job"])
        .output()
        .unwrap();
    ok(forced, "force release");
    assert_eq!(cluster.count_key("app:job"), 0);
    drop(lock);

    let checked = redlock_as(&cluster, "check", &["locking", "check"]).arg("check").output();
    let shown = ok(checked.unwrap(), "check");
    assert!(!shown.contains("may not") && !shown.contains("warning"), "{shown}");
}

/// On Valkey 9 (native compare-and-delete and compare-and-set), the README's unscripted
/// line, in place of the locking line, is enough for `redlock run` with no script: a
/// command that outlasts the lease (auto-extended), and `--once-per` (the window's lock
/// kept to its end, so a second run of the window does not run the command); with the
/// inspect line, `redlock inspect` too. Other servers refuse the line (no `DELIFEQ`).
#[test]
fn the_unscripted_rules_are_enough_for_run_on_valkey() {
    let cluster = cluster(3);
    let info = cluster.node(0).command(&["INFO", "server"]).unwrap();
    let info: String = redis::from_redis_value(info).unwrap();
    let valkey = info.lines().find_map(|line| line.strip_prefix("valkey_version:"));
    let major = valkey.and_then(|version| version.split('.').next()?.trim().parse::<u32>().ok());
    if major.is_none_or(|major| major < 9) {
        return;
    }
    let ok = |output: Output, what: &str| {
        let shown = text(&output.stdout) + &text(&output.stderr);
        assert_eq!(output.status.code(), Some(0), "{what}: {shown}");
        shown
    };
    let run = redlock_as(&cluster, "unscripted", &["unscripted"])
        .env("REDLOCK_TTL", "1s")
        .args(["run", "job"])
        .args(sh("sleep 2.5; echo ran"))
        .output()
        .unwrap();
    assert!(ok(run, "run").contains("ran"));
    let once = || {
        redlock_as(&cluster, "unscripted", &["unscripted"])
            .args(["run", "--once-per", "1h", "draw"])
            .args(sh("echo drawn"))
            .output()
            .unwrap()
    };
    an_hour_window_with_room();
    assert!(ok(once(), "once-per").contains("drawn"));
    let again = once();
    assert_eq!(again.status.code(), Some(75), "{}", text(&again.stderr));
    assert!(!text(&again.stdout).contains("drawn"), "run twice in one window");
    // With the inspect line: `redlock inspect` reads the holds without the script.
    let runtime = tokio::runtime::Runtime::new().unwrap();
    let lock = held_by_the_default_user(&cluster, &runtime, "job");
    let inspected = redlock_as(&cluster, "unscripted", &["unscripted", "inspect"])
        .args(["inspect", "job"])
        .output()
        .unwrap();
    let shown = ok(inspected, "inspect");
    assert_eq!(shown.matches(lock.token()).count(), 4, "{shown}");
    drop(lock);
    for node in cluster.nodes() {
        let stats = node.command(&["INFO", "commandstats"]).unwrap();
        let stats: String = redis::from_redis_value(stats).unwrap();
        let ran = |name: &str| {
            stats.lines().any(|line| {
                line.starts_with(&format!("cmdstat_{name}:calls="))
                    && !line.starts_with(&format!("cmdstat_{name}:calls=0,"))
            })
        };
        assert!(!ran("eval") && !ran("evalsha"), "a script ran: {stats}");
    }
}

/// Without the quarantine line, `REDLOCK_RESTART_QUARANTINE` makes the command fail
/// naming the `info` command: the variable means to the command what it means to the
/// library.
#[test]
fn restart_quarantine_from_the_environment_needs_info_and_says_so() {
    let cluster = cluster(3);
    let output = redlock_as(&cluster, "locking", &["locking"])
        .env("REDLOCK_RESTART_QUARANTINE", "1ms")
        .args(["run", "job"])
        .args(sh("exit 0"))
        .output()
        .unwrap();
    let shown = text(&output.stderr);
    assert_eq!(output.status.code(), Some(125), "{shown}");
    assert!(shown.contains("NOPERM") && shown.contains("`info`"), "{shown}");
}

/// A user who may lock but not inspect: `redlock inspect` says `NOPERM` and the command
/// for every node and exits 125, never "unreachable", "free" or "no holder on a quorum".
#[test]
fn inspect_refused_by_the_acl_exits_125_naming_noperm() {
    let cluster = cluster(3);
    let runtime = tokio::runtime::Runtime::new().unwrap();
    let lock = held_by_the_default_user(&cluster, &runtime, "job");
    let output = redlock_as(&cluster, "locking", &["locking"]).args(["inspect", "job"]).output();
    let output = output.unwrap();
    let shown = text(&output.stdout) + &text(&output.stderr);
    assert_eq!(output.status.code(), Some(125), "{shown}");
    assert_eq!(shown.matches("NOPERM").count(), 3, "{shown}");
    assert!(shown.contains("'type'"), "{shown}");
    for misleading in ["unreachable", "free", "no holder"] {
        assert!(!shown.contains(misleading), "{misleading}: {shown}");
    }
    let output =
        redlock_as(&cluster, "locking", &["locking"]).args(["inspect", "--json", "job"]).output();
    let output = output.unwrap();
    assert_eq!(output.status.code(), Some(125), "{}", text(&output.stdout));
    assert!(text(&output.stdout).contains("NOPERM"), "{}", text(&output.stdout));
    runtime.block_on(lock.release()).unwrap();
}

/// A user without the check line: `redlock check` names each command it may not run and
/// the rule to allow, never "unreachable".
#[test]
fn check_names_the_acl_rule_it_misses() {
    let cluster = cluster(3);
    let output = redlock_as(&cluster, "locking", &["locking"]).arg("check").output().unwrap();
    let shown = text(&output.stdout) + &text(&output.stderr);
    assert_eq!(output.status.code(), Some(1), "{shown}");
    assert!(shown.contains("NOPERM") && shown.contains("+ping"), "{shown}");
    assert!(!shown.contains("unreachable"), "{shown}");
    // With PING allowed, the settings it cannot read are named with their rules.
    let mut ping = readme_acl(&["locking"]);
    ping.push("+ping".to_owned());
    let rules: Vec<&str> = ping.iter().map(String::as_str).collect();
    for node in cluster.nodes() {
        node.acl_setuser("ping", "pw", &rules).unwrap();
    }
    let urls: Vec<String> = cluster.nodes().iter().map(|n| n.url_as("ping", "pw")).collect();
    let output = Command::new(BIN)
        .env("REDLOCK_NODES", urls.join(","))
        .env("REDLOCK_KEY_PREFIX", "app:")
        .arg("check")
        .output()
        .unwrap();
    let shown = text(&output.stdout) + &text(&output.stderr);
    assert!(shown.contains("`config|get`") && shown.contains("+config|get"), "{shown}");
    assert!(shown.contains("`info`") && shown.contains("+info"), "{shown}");
    assert!(!shown.contains("unreachable"), "{shown}");
}

/// `redlock run` with nothing but the nodes set (the command's default node timeout, one
/// attempt) over `faulty`'s proxies, each slowed by 20 ms each way: a fresh process whose
/// connects (TCP, TLS, `SCRIPT LOAD`, `INFO`: several round trips) do not fit in one node
/// timeout. It connects to every node first, under the connect timeout.
fn cold_run_over_slow_links(faulty: &redlock_testkit::FaultyCluster, tls: &[(&str, PathBuf)]) {
    for i in 0..faulty.len() {
        faulty.proxy(i).set_fault(redlock_testkit::NetFault::Latency {
            fixed: Duration::from_millis(20),
            jitter: Duration::ZERO,
        });
    }
    let dir = scratch();
    let ran = dir.join("ran");
    let mut run = Command::new(BIN);
    run.env("REDLOCK_NODES", faulty.urls().join(","));
    for (name, path) in tls {
        run.env(name, path);
    }
    let output =
        run.args(["run", "cold"]).args(sh(&format!("touch {}", ran.display()))).output().unwrap();
    assert_eq!(output.status.code(), Some(0), "{}", text(&output.stderr));
    assert!(ran.exists(), "{}", text(&output.stderr));
    assert_eq!(faulty.cluster().count_key("cold"), 0);
}

#[test]
fn a_cold_run_over_slow_links_gets_the_lock_on_its_first_attempt_with_the_defaults() {
    cold_run_over_slow_links(&redlock_testkit::FaultyCluster::start(3).unwrap(), &[]);
}

#[test]
fn a_cold_run_over_slow_tls_links_gets_the_lock_on_its_first_attempt_with_the_defaults() {
    use redlock_testkit::tls::{Certificates, ClientCerts};
    let config = redlock_testkit::NodeConfig::new().tls(ClientCerts::Required);
    let faulty = redlock_testkit::FaultyCluster::start_with(3, config).unwrap();
    let certs = Certificates::get().unwrap();
    let files = [
        ("REDLOCK_TLS_CA", certs.ca().path().to_path_buf()),
        ("REDLOCK_TLS_CERT", certs.client_cert().path().to_path_buf()),
        ("REDLOCK_TLS_KEY", certs.client_key().path().to_path_buf()),
    ];
    cold_run_over_slow_links(&faulty, &files);
}

/// How many rounds the once-per-window checks run (`REDLOCK_ONCE_ROUNDS`; 3 in CI).
fn once_rounds() -> usize {
    std::env::var("REDLOCK_ONCE_ROUNDS").ok().and_then(|n| n.parse().ok()).unwrap_or(3)
}

/// The window length of the once-per-window checks, and how early each begins (a tenth).
const WINDOW: Duration = Duration::from_secs(6);

/// Sleeps until shortly after the next `--once-per 6s` window begins (its boundary less its
/// lead), so that a round fits in one window.
fn sleep_to_next_window() {
    let now = std::time::SystemTime::now().duration_since(std::time::UNIX_EPOCH).unwrap();
    let (period, lead) = (WINDOW.as_millis(), WINDOW.as_millis() / 10);
    let begins = ((now.as_millis() + lead) / period + 1) * period - lead;
    let wake = u64::try_from(begins - now.as_millis()).unwrap() + 100;
    std::thread::sleep(Duration::from_millis(wake));
}

/// Three `redlock run --once-per` started together, one waiting with `--wait 30s`, and one
/// started a second after the job finished: in every window the job ran exactly once; the
/// others exit 75 (the waiter when the window ends, not later). With the job failing, the
/// lock is released and another run (here the waiter) runs it.
#[test]
fn once_per_runs_the_job_once_per_window_and_a_failed_job_is_run_by_another_machine() {
    let cluster = cluster(3);
    let dir = scratch();
    let once = |wait: &str, script: &str| {
        redlock(&cluster)
            // Five cold starts at once on a loaded machine: connecting takes a while.
            .env("REDLOCK_NODE_TIMEOUT", "1s")
            .args(["run", "--once-per", "6s", "--wait", wait, "draw"])
            .args(sh(script))
            .spawn()
            .unwrap()
    };
    for round in 0..once_rounds() {
        for fails_first in [false, true] {
            let (ran, failed) =
                (dir.join(format!("ran-{round}-{fails_first}")), dir.join("failed"));
            // With `fails_first`, the first run to get the lock fails (and marks it).
            let script = if fails_first {
                format!(
                    "sleep 0.2; if [ ! -e {f} ]; then touch {f}; exit 3; fi; echo x >> {r}",
                    f = failed.display(),
                    r = ran.display()
                )
            } else {
                format!("sleep 0.2; echo x >> {}", ran.display())
            };
            let _ = std::fs::remove_file(&failed);
            sleep_to_next_window();
            let window_began = Instant::now();
            let waiter = once("30s", &script);
            let starters: Vec<Child> = (0..3).map(|_| once("0", &script)).collect();
            let mut codes = Vec::new();
            for run in starters {
                let output = finish(run, Duration::from_secs(20));
                codes.push((output.status.code(), text(&output.stderr)));
            }
            // The job has finished (or it is the waiter's, which the late run finds held).
            std::thread::sleep(Duration::from_secs(1));
            let late = finish(once("0", &script), Duration::from_secs(20));
            codes.push((late.status.code(), text(&late.stderr)));
            let waiter = finish(waiter, Duration::from_secs(20));
            codes.push((waiter.status.code(), text(&waiter.stderr)));
            assert!(
                window_began.elapsed() < WINDOW + Duration::from_secs(2),
                "round {round}: the waiter waited past its window: {codes:?}"
            );
            let lines = std::fs::read_to_string(&ran).unwrap_or_default().lines().count();
            assert_eq!(lines, 1, "round {round} ({fails_first}): {codes:?}");
            let ok = codes.iter().filter(|(code, _)| *code == Some(0)).count();
            let failed = codes.iter().filter(|(code, _)| *code == Some(3)).count();
            let conflicts = codes.iter().filter(|(code, _)| *code == Some(75)).count();
            assert_eq!((ok, failed), (1, usize::from(fails_first)), "round {round}: {codes:?}");
            assert_eq!(conflicts, 4 - failed, "round {round}: {codes:?}");
        }
    }
}

/// Waits for the next `--once-per 1h` window if less than 30 s of the current one is left:
/// a test's runs must all fall in one window.
fn an_hour_window_with_room() {
    let now = std::time::SystemTime::now().duration_since(std::time::UNIX_EPOCH).unwrap();
    let (period, lead, now) = (3_600_000u128, 2_000u128, now.as_millis());
    let end = ((now + lead) / period + 1) * period - lead;
    if end - now < 30_000 {
        std::thread::sleep(Duration::from_millis(u64::try_from(end - now).unwrap() + 100));
    }
}

/// In a `--once-per 1h` window whose job succeeded, a run waiting with `wait` (started while
/// the job ran, and one started after it) exits with `code` within a few seconds of the
/// job's end, without running its command: the job marked the window done.
fn a_done_window_ends_the_wait(make: &dyn Fn() -> Command, wait: &str, extra: &[&str], code: i32) {
    an_hour_window_with_room();
    let dir = scratch();
    let (started, ran) = (dir.join("started"), dir.join("ran"));
    let job = |name: &str| {
        format!("touch {}; sleep 1; echo {name} >> {}", started.display(), ran.display())
    };
    let run = |wait: &str, name: &str| {
        make()
            .args(["run", "--once-per", "1h", "--wait", wait])
            .args(extra)
            .arg("draw")
            .args(sh(&job(name)))
            .spawn()
            .unwrap()
    };
    let first = run("0", "first");
    assert!(wait_for(&started, Duration::from_secs(5)), "the job never started");
    let during = run(wait, "during");
    let first = finish(first, Duration::from_secs(10));
    let done = Instant::now();
    assert_eq!(first.status.code(), Some(0), "{}", text(&first.stderr));
    let during = finish(during, Duration::from_secs(15));
    let stopped = done.elapsed();
    assert_eq!(during.status.code(), Some(code), "{}", text(&during.stderr));
    assert!(text(&during.stderr).contains("this window's job is done"), "{}", text(&during.stderr));
    assert!(stopped < Duration::from_secs(3), "waited {stopped:?} after the job's end");
    let began = Instant::now();
    let after = finish(run(wait, "after"), Duration::from_secs(15));
    assert_eq!(after.status.code(), Some(code), "{}", text(&after.stderr));
    assert!(began.elapsed() < Duration::from_secs(3), "waited {:?}", began.elapsed());
    assert_eq!(std::fs::read_to_string(&ran).unwrap(), "first\n");
}

#[test]
fn a_run_waiting_10s_in_a_window_whose_job_is_done_exits_75_at_once_without_running() {
    let cluster = cluster(3);
    a_done_window_ends_the_wait(&|| redlock(&cluster), "10s", &[], 75);
}

#[test]
fn a_run_waiting_forever_in_a_window_whose_job_is_done_exits_75_at_once_without_running() {
    let cluster = cluster(3);
    a_done_window_ends_the_wait(&|| redlock(&cluster), "forever", &[], 75);
}

/// With the conflict code asked for, as an ACL user with only the README's locking rules
/// and a key prefix: the marks are keys under the prefix, written and read with `SET` and
/// `GET`.
#[test]
fn a_run_waiting_in_a_done_window_exits_with_the_conflict_code_asked_for() {
    let cluster = cluster(3);
    let make = || redlock_as(&cluster, "locking", &["locking"]);
    a_done_window_ends_the_wait(&make, "10s", &["--conflict-exit-code", "9"], 9);
    let marked = cluster.keys_everywhere("app:draw:redlock-done:*").unwrap();
    assert_eq!(marked, 3, "the mark is on every node, under the prefix");
}

/// A window whose job succeeded but whose kept lock was lost (freed by hand here, as by
/// nodes restarted empty) is still done: a run granted the lock in it reads the mark and
/// gives the lock back without running, even with `--wait 0`.
#[test]
fn a_run_granted_in_a_window_marked_done_gives_the_lock_back_without_running() {
    let cluster = cluster(3);
    an_hour_window_with_room();
    let ran = scratch().join("ran");
    let run = |name: &str| {
        redlock(&cluster)
            .args(["run", "--once-per", "1h", "--wait", "0", "draw"])
            .args(sh(&format!("echo {name} >> {}", ran.display())))
            .output()
            .unwrap()
    };
    let first = run("first");
    assert_eq!(first.status.code(), Some(0), "{}", text(&first.stderr));
    let freed = redlock(&cluster).args(["release", "--force", "--yes", "draw"]).output().unwrap();
    assert_eq!(freed.status.code(), Some(0), "{}", text(&freed.stderr));
    assert_eq!(cluster.count_key("draw"), 0, "the kept lock is gone");
    let second = run("second");
    assert_eq!(second.status.code(), Some(75), "{}", text(&second.stderr));
    assert!(text(&second.stderr).contains("this window's job is done"), "{}", text(&second.stderr));
    assert_eq!(std::fs::read_to_string(&ran).unwrap(), "first\n");
    assert_eq!(cluster.count_key("draw"), 0, "the lock was given back");
}

/// A run waiting for a job still in progress gets the lock when that job fails (its lock
/// released at once) and runs; its own success then marks the window done for the next.
#[test]
fn a_run_waiting_for_a_job_in_progress_that_fails_gets_the_lock_and_runs() {
    let cluster = cluster(3);
    an_hour_window_with_room();
    let dir = scratch();
    let (started, ran) = (dir.join("started"), dir.join("ran"));
    let run = |wait: &str, script: &str| {
        redlock(&cluster)
            .args(["run", "--once-per", "1h", "--wait", wait, "draw"])
            .args(sh(script))
            .spawn()
            .unwrap()
    };
    let first = run("0", &format!("touch {}; sleep 1; exit 3", started.display()));
    assert!(wait_for(&started, Duration::from_secs(5)), "the job never started");
    let waiter = run("10s", &format!("echo waiter >> {}", ran.display()));
    let first = finish(first, Duration::from_secs(10));
    assert_eq!(first.status.code(), Some(3), "{}", text(&first.stderr));
    let waiter = finish(waiter, Duration::from_secs(15));
    assert_eq!(waiter.status.code(), Some(0), "{}", text(&waiter.stderr));
    let began = Instant::now();
    let after =
        finish(run("10s", &format!("echo after >> {}", ran.display())), Duration::from_secs(15));
    assert_eq!(after.status.code(), Some(75), "{}", text(&after.stderr));
    assert!(began.elapsed() < Duration::from_secs(3), "waited {:?}", began.elapsed());
    assert_eq!(std::fs::read_to_string(&ran).unwrap(), "waiter\n");
}

/// How many `SET`s node `i` ran, the test's own and each plain acquisition attempt's
/// (native or inside its script).
fn sets_run_on(cluster: &Cluster, i: usize) -> u64 {
    let info = cluster.node(i).command(&["INFO", "commandstats"]).unwrap();
    let info: String = redis::from_redis_value(info).unwrap();
    ["cmdstat_set:calls="]
        .iter()
        .filter_map(|prefix| info.lines().find_map(|line| line.strip_prefix(prefix)))
        .filter_map(|rest| rest.split(',').next())
        .map(|calls| calls.parse::<u64>().unwrap())
        .sum()
}

/// A first attempt that is a split vote (two other owners each on one node of three, the
/// third free: nobody can hold a quorum) is retried with `--wait 0`, and gets the lock once
/// the other owners are gone.
#[test]
fn a_split_vote_is_retried_even_without_waiting() {
    let faulty = redlock_testkit::FaultyCluster::start(3).unwrap();
    let cluster = faulty.cluster();
    let dir = scratch();
    let ran = dir.join("ran");
    cluster.node(0).command(&["SET", "job", "owner-a", "PX", "20000"]).unwrap();
    cluster.node(1).command(&["SET", "job", "owner-b", "PX", "20000"]).unwrap();
    // The free node answers first: the attempt is decided on every node's answer, a split
    // vote, rather than on the two refusals alone.
    let slow = redlock_testkit::NetFault::Latency {
        fixed: Duration::from_millis(20),
        jitter: Duration::ZERO,
    };
    faulty.proxy(0).set_fault(slow);
    faulty.proxy(1).set_fault(slow);
    let run = redlock(cluster)
        .env("REDLOCK_NODES", faulty.urls().join(","))
        .env("REDLOCK_NODE_TIMEOUT", "1s")
        .args(["run", "--wait", "0", "job"])
        .args(sh(&format!("touch {}", ran.display())))
        .spawn()
        .unwrap();
    // Frees the lock once the first attempt was refused on both (its acquisition is the
    // second SET either node runs, after the other owner's).
    let deadline = Instant::now() + Duration::from_secs(10);
    while (sets_run_on(cluster, 0) < 2 || sets_run_on(cluster, 1) < 2) && Instant::now() < deadline
    {
        std::thread::sleep(Duration::from_millis(2));
    }
    assert!(Instant::now() < deadline, "the command never made its first attempt");
    cluster.node(0).command(&["DEL", "job"]).unwrap();
    cluster.node(1).command(&["DEL", "job"]).unwrap();
    let output = finish(run, Duration::from_secs(10));
    assert_eq!(output.status.code(), Some(0), "{}", text(&output.stderr));
    assert!(ran.exists());
}

/// With a majority of nodes killed under a running command that ignores the lost signal,
/// redlock sends it while a third of the lease is left and KILLs the command by the end of
/// its validity: the command is dead before another `redlock run` gets the lock (the
/// killed nodes restarted empty after a lease, as Redlock's delayed restart asks).
#[test]
fn with_a_majority_killed_the_command_is_dead_before_another_run_gets_the_lock() {
    let mut cluster = cluster(3);
    let dir = scratch();
    let (started, got, pid) = (dir.join("started"), dir.join("got-term"), dir.join("pid"));
    let traps = format!("echo $$ > {}; trap 'touch {}' TERM", pid.display(), got.display());
    let first = run_looping(&cluster, Some("3s"), &["job"], &traps, &started);
    let pid: u32 = std::fs::read_to_string(&pid).unwrap().trim().parse().unwrap();
    cluster.node_mut(1).kill().unwrap();
    cluster.node_mut(2).kill().unwrap();
    let killed = Instant::now();
    // What the next holder sees of the first command: alive, or gone (or a zombie).
    let seen = dir.join("seen");
    let check = format!(
        "if [ -e /proc/{pid} ] && ! grep -q ') Z' /proc/{pid}/stat; then echo alive; else echo dead; fi > {}",
        seen.display()
    );
    let second = redlock(&cluster)
        .env("REDLOCK_TTL", "3s")
        .args(["run", "--wait", "30s", "job"])
        .args(sh(&check))
        .spawn()
        .unwrap();
    std::thread::sleep(Duration::from_millis(3500).saturating_sub(killed.elapsed()));
    cluster.node_mut(1).restart_empty().unwrap();
    cluster.node_mut(2).restart_empty().unwrap();
    let second = finish(second, Duration::from_secs(30));
    assert_eq!(second.status.code(), Some(0), "{}", text(&second.stderr));
    let first = finish(first, Duration::from_secs(30));
    assert_eq!(first.status.code(), Some(124), "{}", text(&first.stderr));
    assert!(got.exists(), "the command got TERM first");
    let seen = std::fs::read_to_string(&seen).unwrap();
    assert_eq!(seen.trim(), "dead", "first: {}", text(&first.stderr));
}

/// With a majority of nodes failing under a running command, the line that says the lock
/// could not be kept names each failing node and its cause, from the failed extension's
/// error: killed nodes are unreachable (their connections refused), paused ones time out.
/// (A 3 s lease and a 200 ms connect timeout: an extension to a paused node, reconnecting,
/// fails well before the lost signal is due, a third of the lease before its end.)
#[test]
fn a_lock_that_could_not_be_kept_names_each_failing_node_and_its_cause() {
    for (fault, cause) in [("killed", "unreachable"), ("paused", "timed out")] {
        let mut cluster = cluster(3);
        let started = scratch().join("started");
        let mut command = redlock(&cluster);
        command.env("REDLOCK_TTL", "3s").env("REDLOCK_CONNECT_TIMEOUT", "200ms");
        let run = command.args(["run", "job"]).args(sh(&looping("true", &started))).spawn();
        let run = run.unwrap();
        assert!(wait_for(&started, Duration::from_secs(5)), "the command never started");
        for i in [1, 2] {
            match fault {
                "killed" => cluster.node_mut(i).kill().unwrap(),
                _ => cluster.node_mut(i).pause().unwrap(),
            }
        }
        let output = finish(run, Duration::from_secs(20));
        let shown = text(&output.stderr);
        assert_eq!(output.status.code(), Some(124), "{fault}: {shown}");
        let line = (shown.lines())
            .find(|line| line.starts_with("redlock: job: the lock could not be kept: "))
            .unwrap_or_else(|| panic!("{fault}: no line saying why: {shown}"));
        assert!(line.contains(cause), "{fault}: {line}");
        for i in [1, 2] {
            let node = format!(":{}/", cluster.node(i).port());
            assert!(line.contains(&node), "{fault}: node {i} is not named: {line}");
        }
    }
}

/// Machine A, whose clock is 1.9 s ahead (clocks within the documented 2 s lead), ran the
/// job in a `--once-per 20s` window and kept the lock until the window's end by its own
/// clock (its keys, simulated here, expire 1.9 s before the true end). Machine B, on true
/// time, starts late in the same window, 1.8 s before its end: the job already ran in this
/// window, so B must exit with the conflict code and not run it again.
#[test]
fn a_late_start_within_the_lead_of_a_machine_whose_clock_is_ahead_does_not_run_the_job_again() {
    let cluster = cluster(3);
    let dir = scratch();
    let ran = dir.join("ran");
    let (period, lead) = (20_000u128, 2_000u128);
    let now = || std::time::SystemTime::now().duration_since(std::time::UNIX_EPOCH).unwrap();
    // The window's end (its boundary less the lead), at least 3 s away.
    let mut end = ((now().as_millis() + lead) / period + 1) * period - lead;
    if end - now().as_millis() < 3_000 {
        end += period;
    }
    let sleep_until = |at: u128| {
        let left = at.saturating_sub(now().as_millis());
        std::thread::sleep(Duration::from_millis(u64::try_from(left).unwrap()));
    };
    // A's kept keys: until its clock reads the window's end, 1.9 s before the true end.
    sleep_until(end - 2_000);
    for i in 0..3 {
        cluster.node(i).command(&["SET", "draw", "machine-a", "PX", "100"]).unwrap();
    }
    sleep_until(end - 1_800);
    let b = redlock(&cluster)
        .args(["run", "--once-per", "20s", "--wait", "0", "draw"])
        .args(sh(&format!("echo b >> {}", ran.display())))
        .spawn()
        .unwrap();
    let b = finish(b, Duration::from_secs(10));
    let ran_again = std::fs::read_to_string(&ran).unwrap_or_default();
    assert_eq!(
        (b.status.code(), ran_again.as_str()),
        (Some(75), ""),
        "B ran the job a second time in the window: {}",
        text(&b.stderr)
    );
}

#[test]
fn a_run_that_waits_forever_runs_once_a_holder_longer_than_the_ttl_is_done() {
    let cluster = cluster(3);
    let dir = scratch();
    let started = dir.join("started");
    // Held for 3 s, past the 2 s TTL (kept alive by the first run).
    let script = format!("touch {}; sleep 3", started.display());
    let first = redlock(&cluster).args(["run", "job"]).args(sh(&script)).spawn().unwrap();
    assert!(wait_for(&started, Duration::from_secs(5)));
    let began = Instant::now();
    let second = redlock(&cluster)
        .args(["run", "--wait", "forever", "job"])
        .args(sh("exit 0"))
        .spawn()
        .unwrap();
    let second = finish(second, Duration::from_secs(30));
    assert_eq!(second.status.code(), Some(0), "{}", text(&second.stderr));
    assert!(began.elapsed() >= Duration::from_secs(2), "ran after {:?}", began.elapsed());
    let first = finish(first, Duration::from_secs(10));
    assert_eq!(first.status.code(), Some(0), "{}", text(&first.stderr));
}
