//! What a lock+release costs the Redis servers, and what the tombstones it leaves cost in
//! memory, against the floor (the bare commands).
//!
//! Part 1, server time: `pairs` lock+release pairs one after the other on 5 local nodes
//! (or `REDLOCK_NODES`), for each implementation; the servers' `INFO commandstats`
//! (microseconds spent in commands, scripts included) and `INFO cpu` (the process's own
//! CPU, its event loop included) are reset before and read after, summed over the nodes,
//! and divided by the pairs.
//!
//! Part 2, tombstones: ours at a sustained rate (5,000 lock+release a second on distinct
//! keys by default) for `seconds`; every second, the tombstones (keys with `:undone:` in
//! their name) and `used_memory` of node 0, against the same before the run. A tombstone
//! of a release right after its grant lives as long as the release's requests may read a
//! reply (connect timeout + 4 node timeouts + 260 ms of pauses, with drift: about 1.46 s
//! with the defaults), so the count settles at about rate x that.
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

/// Microseconds spent in commands, over every command of the node.
fn command_usec(info: &str) -> f64 {
    info.lines()
        .filter(|line| line.starts_with("cmdstat_"))
        .filter_map(|line| line.split(',').find_map(|part| part.strip_prefix("usec=")))
        .filter_map(|usec| usec.parse::<f64>().ok())
        .sum()
}

fn cpu_secs(url: &str) -> f64 {
    let cpu = info(url, "cpu");
    field(&cpu, "used_cpu_sys") + field(&cpu, "used_cpu_user")
}

fn tombstones(url: &str) -> usize {
    let client = redis::Client::open(url).expect("a node URL");
    let mut con = client.get_connection().expect("a connection");
    let keys: Vec<String> = redis::cmd("KEYS").arg("*:undone:*").query(&mut con).expect("KEYS");
    keys.len()
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
    println!("{:<6} {:>16} {:>18}", "impl", "commands (µs)", "process CPU (µs)");
    for imp in [Impl::Floor, Impl::Ours] {
        let client = runtime.block_on(Client::connect(imp, &urls, settings)).expect("connect");
        urls.iter().for_each(|url| reset(url));
        let cpu_before: f64 = urls.iter().map(|url| cpu_secs(url)).sum();
        runtime.block_on(async {
            for i in 0..pairs {
                client.lock_release(&format!("cost:{imp}:{i}")).await.expect("lock+release");
            }
        });
        let usec: f64 = urls.iter().map(|url| command_usec(&info(url, "commandstats"))).sum();
        let cpu_after: f64 = urls.iter().map(|url| cpu_secs(url)).sum();
        let per = |total: f64| total / pairs as f64;
        println!(
            "{:<6} {:>16.1} {:>18.1}",
            imp.name(),
            per(usec),
            per((cpu_after - cpu_before) * 1e6)
        );
    }

    println!("tombstones at {rate} lock+release/s for {seconds} s (node 0):");
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
                let key = format!("tomb:{sent}");
                sent += 1;
                tasks.spawn(async move { client.lock_release(&key).await.is_ok() });
            }
            while let Some(done) = tasks.try_join_next() {
                let _ = done;
            }
            if started.elapsed() >= next_report {
                next_report += Duration::from_secs(1);
                let (count, used) = (tombstones(&urls[0]), memory());
                println!(
                    "{:>4} s  sent {sent:>7}  in flight {:>5}  tombstones {count:>7}  used_memory +{:.1} MB ({:.0} B per tombstone)",
                    started.elapsed().as_secs(),
                    tasks.len(),
                    (used - baseline) / 1e6,
                    if count > 0 { (used - baseline) / count as f64 } else { 0.0 },
                );
            }
        }
        while tasks.join_next().await.is_some() {}
        sent
    });
    println!("sent {done} lock+release pairs in {:?}", started.elapsed());
}
