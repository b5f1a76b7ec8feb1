//! What a lock+release costs the Redis servers, and what it leaves on them, against the
//! floor (the bare commands).
//!
//! Part 1, server time: `pairs` lock+release pairs one after the other on 5 local nodes
//! (or `REDLOCK_NODES`), for each implementation; the servers' `INFO commandstats`
//! (microseconds spent in scripts, which includes the commands they call, and in every other
//! command, those called by scripts included; and each command's calls) and `INFO cpu` (the
//! process's own CPU, its event loop included) are reset before and read after, summed over
//! the nodes, and divided by the pairs.
//!
//! Part 2, keys left: ours at a sustained rate (5,000 lock+release a second on distinct
//! keys by default) for `seconds`; every second, node 0's key count (`DBSIZE`: the holds in
//! flight, nothing else) and `used_memory`, against the same before the run, and the count
//! once every pair has ended (0: a release leaves nothing behind).
//!
//! ```sh
//! cargo run --release -p redlock-benches --bin server_cost -- [pairs] [rate] [seconds]
//! # default: 5000 5000 20
//! ```

use std::time::{Duration, Instant};

use redlock_benches::{Client, Impl, Settings};
use redlock_testkit::Nodes;

fn info(url: &str, section: &str) -> String {
    let client = redis::Client::open(url).expect("a node URL");
    let mut con = client.get_connection().expect("a connection");
    redis::cmd("INFO").arg(section).query(&mut con).expect("INFO")
}

fn reset(url: &str) {
    let client = redis::Client::open(url).expect("a node URL");
    let mut con = client.get_connection().expect("a connection");
    let _: () = redis::cmd("CONFIG").arg("RESETSTAT").query(&mut con).expect("RESETSTAT");
}

/// The number after `field:` (or `field=` inside a commandstats line) in an INFO reply.
fn field(info: &str, name: &str) -> f64 {
    info.lines()
        .find_map(|line| line.strip_prefix(&format!("{name}:")))
        .and_then(|value| value.trim().parse().ok())
        .unwrap_or(0.0)
}

/// Each command's calls and microseconds, from an `INFO commandstats` reply, added to
/// `totals`. A script's time includes the commands it calls, which count as their own too.
fn add_command_stats(info: &str, totals: &mut Vec<(String, f64, f64)>) {
    for line in info.lines().filter_map(|line| line.strip_prefix("cmdstat_")) {
        let Some((name, stats)) = line.split_once(':') else { continue };
        let number = |field: &str| {
            stats.split(',').find_map(|part| part.strip_prefix(field)?.parse::<f64>().ok())
        };
        let (Some(calls), Some(usec)) = (number("calls="), number("usec=")) else { continue };
        match totals.iter_mut().find(|(known, _, _)| known == name) {
            Some(total) => {
                total.1 += calls;
                total.2 += usec;
            }
            None => totals.push((name.to_owned(), calls, usec)),
        }
    }
}

/// The node process's CPU time, in the kernel and in user space.
fn cpu_secs(url: &str) -> (f64, f64) {
    let cpu = info(url, "cpu");
    (field(&cpu, "used_cpu_sys"), field(&cpu, "used_cpu_user"))
}

fn cpu_total(urls: &[String]) -> (f64, f64) {
    urls.iter().map(|url| cpu_secs(url)).fold((0.0, 0.0), |(s, u), (ds, du)| (s + ds, u + du))
}

fn keys(url: &str) -> usize {
    let client = redis::Client::open(url).expect("a node URL");
    let mut con = client.get_connection().expect("a connection");
    redis::cmd("DBSIZE").query(&mut con).expect("DBSIZE")
}

fn main() {
    let args: Vec<u64> = std::env::args().skip(1).filter_map(|arg| arg.parse().ok()).collect();
    let pairs = args.first().copied().unwrap_or(5_000) as usize;
    let rate = args.get(1).copied().unwrap_or(5_000);
    let seconds = args.get(2).copied().unwrap_or(20);
    let nodes =
        Nodes::from_env_or_start(5).unwrap_or_else(|e| panic!("cannot start the nodes: {e}"));
    let urls = nodes.urls();
    let runtime = redlock_benches::runtime(2);
    let settings = Settings::default();
    println!("{}", redlock_benches::machine_line(&urls[0]));
    println!("server time per lock+release, {pairs} pairs, {} nodes:", urls.len());
    // Scripts' time includes the commands they call; "other commands" counts those too.
    println!(
        "{:<6} {:>16} {:>16} {:>18} {:>10} {:>10}",
        "impl", "scripts (µs)", "other cmds (µs)", "process CPU (µs)", "sys", "user"
    );
    for imp in [Impl::Floor, Impl::Ours] {
        let client = runtime.block_on(Client::connect(imp, &urls, settings)).expect("connect");
        urls.iter().for_each(|url| reset(url));
        let cpu_before = cpu_total(&urls);
        runtime.block_on(async {
            for i in 0..pairs {
                client.lock_release(&format!("cost:{imp}:{i}")).await.expect("lock+release");
            }
        });
        let cpu_after = cpu_total(&urls);
        let mut commands = Vec::new();
        for url in &urls {
            add_command_stats(&info(url, "commandstats"), &mut commands);
        }
        let per = |total: f64| total / pairs as f64;
        let scripts: f64 =
            commands.iter().filter(|(name, ..)| name.starts_with("eval")).map(|c| c.2).sum();
        let others: f64 =
            commands.iter().filter(|(name, ..)| !name.starts_with("eval")).map(|c| c.2).sum();
        let (sys, user) = ((cpu_after.0 - cpu_before.0) * 1e6, (cpu_after.1 - cpu_before.1) * 1e6);
        println!(
            "{:<6} {:>16.1} {:>16.1} {:>18.1} {:>10.1} {:>10.1}",
            imp.name(),
            per(scripts),
            per(others),
            per(sys + user),
            per(sys),
            per(user)
        );
        for (name, calls, usec) in &commands {
            println!("         {name:<14} {:>5.2} calls {:>7.1} µs", per(*calls), per(*usec));
        }
    }

    println!("keys at {rate} lock+release/s for {seconds} s (node 0):");
    let before = keys(&urls[0]);
    let client = runtime.block_on(Client::connect(Impl::Ours, &urls, settings)).expect("connect");
    let memory = || field(&info(&urls[0], "memory"), "used_memory");
    let baseline = memory();
    let started = Instant::now();
    let done = runtime.block_on(async {
        let mut tick = tokio::time::interval(Duration::from_millis(10));
        let per_tick = (rate / 100).max(1);
        let mut sent = 0u64;
        let mut next_report = Duration::from_secs(1);
        let mut tasks = tokio::task::JoinSet::new();
        while started.elapsed() < Duration::from_secs(seconds) {
            tick.tick().await;
            for _ in 0..per_tick {
                let client = client.clone();
                let key = format!("left:{sent}");
                sent += 1;
                tasks.spawn(async move { client.lock_release(&key).await.is_ok() });
            }
            while let Some(done) = tasks.try_join_next() {
                let _ = done;
            }
            if started.elapsed() >= next_report {
                next_report += Duration::from_secs(1);
                let (count, used) = (keys(&urls[0]).saturating_sub(before), memory());
                println!(
                    "{:>4} s  sent {sent:>7}  in flight {:>5}  keys {count:>7}  used_memory +{:.1} MB",
                    started.elapsed().as_secs(),
                    tasks.len(),
                    (used - baseline) / 1e6,
                );
            }
        }
        while tasks.join_next().await.is_some() {}
        sent
    });
    println!("sent {done} lock+release pairs in {:?}", started.elapsed());
    // The slowest nodes' releases end in the background.
    std::thread::sleep(Duration::from_millis(200));
    println!(
        "keys left on node 0 once every pair ended: {}",
        keys(&urls[0]).saturating_sub(before)
    );
}
