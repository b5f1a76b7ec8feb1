//! Runs a fixed scenario set against the same nodes for every implementation and prints a
//! Markdown table: medians, p99s and ratios to the floor.
//!
//! ```sh
//! cargo run --release -p redlock-benches --bin compare [-- --quick] [-- --workers N]
//! ```
//!
//! Starts 9 local `redis-server` nodes through the testkit, or uses `REDLOCK_NODES`
//! (comma-separated URLs; the hung- and dead-node scenarios need local nodes and are
//! skipped then). Within a scenario the implementations run in round-robin batches, the
//! order rotating each round, so that machine drift hits them alike.

use std::collections::HashMap;
use std::time::Duration;

use redlock_benches::{
    Batch, Client, Impl, Samples, Settings, fmt_duration, handoff_batch, hot_key_batch,
    latency_batch, machine_line, throughput_batch,
};
use redlock_testkit::Nodes;

/// The node that is paused or killed in the fault scenarios (of the first five).
const FAULTY: usize = 4;
const TASKS: usize = 64;
const HOT_TASKS: usize = 8;
const HANDOFF_TASKS: usize = 4;
/// How long each task holds the lock in the handoff scenario.
const HANDOFF_HOLD: Duration = Duration::from_millis(2);

#[derive(Clone, Copy)]
struct Options {
    quick: bool,
    workers: usize,
}

fn main() {
    let mut options = Options { quick: false, workers: 2 };
    let mut args = std::env::args().skip(1);
    while let Some(arg) = args.next() {
        match arg.as_str() {
            "--quick" => options.quick = true,
            "--workers" => {
                options.workers = args.next().and_then(|n| n.parse().ok()).unwrap_or_else(|| {
                    eprintln!("--workers needs a number");
                    std::process::exit(2)
                })
            }
            other => {
                eprintln!("unknown argument {other}; usage: compare [--quick] [--workers N]");
                std::process::exit(2);
            }
        }
    }
    let runtime = tokio::runtime::Builder::new_multi_thread()
        .worker_threads(options.workers)
        .enable_all()
        .build()
        .expect("a Tokio runtime");
    let mut nodes =
        Nodes::from_env_or_start(9).unwrap_or_else(|e| panic!("cannot start the nodes: {e}"));
    let machine = machine_line(&nodes.urls()[0]);
    let mut table = Table::default();
    let scale = if options.quick { 4 } else { 1 };
    let settings = Settings::default();

    // Uncontended latency, N = 1, 3, 5, 7, 9.
    for n in [1, 3, 5, 7, 9] {
        if n > nodes.urls().len() {
            continue;
        }
        let urls = nodes.first(n);
        let scenario = format!("lock+release, N={n}");
        let clients = runtime.block_on(connect_all(&Impl::ALL, &urls, settings));
        let budget = move |imp: Impl| match imp {
            Impl::RedlockRs => batch(60 / scale, 2),
            _ => batch(600 / scale, 2),
        };
        let results = runtime.block_on(interleave(&clients, 5, |client| {
            let key = format!("bench:lat{n}:{}", client.kind());
            async move { latency_batch(&client, &key, budget(client.kind())).await }
        }));
        table.add(&scenario, results, &[]);
    }

    let five = nodes.first(5);
    let healthy_p99 = table.p99("lock+release, N=5", Impl::Ours);

    // Throughput: 64 tasks, distinct keys.
    {
        let scenario = format!("{TASKS} tasks, distinct keys, N=5");
        let clients = runtime.block_on(connect_all(&Impl::ALL, &five, settings));
        let slot = Duration::from_millis(1000 / scale as u64);
        let results = runtime.block_on(interleave(&clients, 3, |client| {
            let prefix = format!("bench:tp:{}", client.kind());
            async move { throughput_batch(&client, TASKS, slot, &prefix).await }
        }));
        table.add(&scenario, results, &[]);
    }

    // Hot key: several tasks waiting on one resource.
    {
        let scenario = format!("hot key, {HOT_TASKS} waiters, N=5");
        let clients = runtime.block_on(connect_all(&Impl::ALL, &five, settings));
        let slot = Duration::from_millis(1000 / scale as u64);
        let results = runtime.block_on(interleave(&clients, 3, |client| {
            let key = format!("bench:hot:{}", client.kind());
            async move { hot_key_batch(&client, HOT_TASKS, slot, &key).await }
        }));
        table.add(&scenario, results, &[]);
    }

    // Handoff: tasks taking turns on one key; the gap from a release to the next grant.
    {
        let scenario = format!("handoff gap, {HANDOFF_TASKS} tasks taking turns, N=5");
        let impls = [Impl::Ours, Impl::Rslock];
        let clients = runtime.block_on(connect_all(&impls, &five, settings));
        let slot = Duration::from_millis(1000 / scale as u64);
        let results = runtime.block_on(interleave(&clients, 3, |client| {
            let key = format!("bench:handoff:{}", client.kind());
            async move { handoff_batch(&client, HANDOFF_TASKS, HANDOFF_HOLD, slot, &key).await }
        }));
        table.add(
            &scenario,
            results,
            &[
                (Impl::Floor, "no blocking lock"),
                (Impl::RedlockRs, "polls in a blocking loop: not run"),
            ],
        );
    }

    // One node hung (SIGSTOP), node timeout 50 ms.
    let hung = "one node hung, N=5";
    if nodes.cluster_mut().is_some() {
        let impls = [Impl::Floor, Impl::Ours, Impl::Rslock];
        let clients = runtime.block_on(connect_all(&impls, &five, settings));
        pause(&mut nodes, true);
        let budget = move |imp: Impl| match imp {
            Impl::Ours => batch(400 / scale, 2),
            Impl::Floor => batch(10 / scale.min(2), 1),
            _ => batch(3, 3),
        };
        let results = runtime.block_on(interleave(&clients, 5, |client| {
            let key = format!("bench:hung:{}", client.kind());
            async move { latency_batch(&client, &key, budget(client.kind())).await }
        }));
        pause(&mut nodes, false);
        table.add(hung, results, &[(Impl::RedlockRs, "blocks (no timeout): not run")]);
    } else {
        table.skip(hung, "needs local nodes (REDLOCK_NODES is set)");
    }

    // One node dead (killed).
    let dead = "one node dead, N=5";
    if nodes.cluster_mut().is_some() {
        let clients = runtime.block_on(connect_all(&Impl::ALL, &five, settings));
        if let Some(cluster) = nodes.cluster_mut() {
            cluster.node_mut(FAULTY).kill().expect("kill a node");
        }
        let budget = move |imp: Impl| match imp {
            Impl::RedlockRs => batch(20 / scale, 2),
            _ => batch(400 / scale, 2),
        };
        let results = runtime.block_on(interleave(&clients, 5, |client| {
            let key = format!("bench:dead:{}", client.kind());
            async move { latency_batch(&client, &key, budget(client.kind())).await }
        }));
        table.add(dead, results, &[]);
    } else {
        table.skip(dead, "needs local nodes (REDLOCK_NODES is set)");
    }

    println!("{machine}; client runtime: Tokio multi-thread, {} workers\n", options.workers);
    table.print();
    println!();
    table.targets(healthy_p99);
}

fn batch(samples: usize, max_secs: u64) -> Batch {
    Batch { samples: samples.max(1), max_time: Duration::from_secs(max_secs) }
}

fn pause(nodes: &mut Nodes, on: bool) {
    if let Some(cluster) = nodes.cluster_mut() {
        let node = cluster.node_mut(FAULTY);
        let result = if on { node.pause() } else { node.resume() };
        result.expect("pause/resume a node");
    }
}

async fn connect_all(impls: &[Impl], urls: &[String], settings: Settings) -> Vec<Client> {
    let mut clients = Vec::new();
    for &imp in impls {
        match Client::connect(imp, urls, settings).await {
            Ok(client) => clients.push(client),
            Err(err) => eprintln!("{imp}: cannot connect: {err}"),
        }
    }
    clients
}

/// `rounds` rounds; in each, every client runs one batch (as a task on the runtime's
/// workers, like the code of a service), the order rotating each round.
async fn interleave<F, Fut>(clients: &[Client], rounds: usize, run: F) -> Vec<(Impl, Samples)>
where
    F: Fn(Client) -> Fut,
    Fut: Future<Output = Samples> + Send + 'static,
{
    let mut results: Vec<(Impl, Samples)> =
        clients.iter().map(|c| (c.kind(), Samples::default())).collect();
    for round in 0..rounds {
        for k in 0..clients.len() {
            let i = (round + k) % clients.len();
            match tokio::spawn(run(clients[i].clone())).await {
                Ok(samples) => results[i].1.merge(samples),
                Err(err) => eprintln!("{}: batch failed: {err}", clients[i].kind()),
            }
        }
    }
    results
}

struct Row {
    scenario: String,
    imp: Impl,
    samples: Option<Samples>,
    note: String,
}

#[derive(Default)]
struct Table {
    rows: Vec<Row>,
    floors: HashMap<String, Samples>,
}

impl Table {
    fn add(&mut self, scenario: &str, results: Vec<(Impl, Samples)>, not_run: &[(Impl, &str)]) {
        for (imp, samples) in results {
            eprintln!(
                "{scenario:<32} {imp:<10} p50 {:>10} p99 {:>10} ok {:>6} errors {}",
                samples.p50().map(fmt_duration).unwrap_or_default(),
                samples.p99().map(fmt_duration).unwrap_or_default(),
                samples.latencies.len(),
                samples.errors
            );
            if imp == Impl::Floor {
                self.floors.insert(scenario.to_owned(), samples.clone());
            }
            let note = match (&samples.first_error, samples.latencies.is_empty()) {
                (Some(err), true) => format!("every call failed: {}", short(err)),
                (Some(err), false) => format!("{} failed: {}", samples.errors, short(err)),
                (None, _) => String::new(),
            };
            self.rows.push(Row {
                scenario: scenario.to_owned(),
                imp,
                samples: Some(samples),
                note,
            });
        }
        for (imp, why) in not_run {
            self.rows.push(Row {
                scenario: scenario.to_owned(),
                imp: *imp,
                samples: None,
                note: (*why).to_owned(),
            });
        }
    }

    fn skip(&mut self, scenario: &str, why: &str) {
        for imp in Impl::ALL {
            self.rows.push(Row {
                scenario: scenario.to_owned(),
                imp,
                samples: None,
                note: why.to_owned(),
            });
        }
    }

    fn get(&self, scenario: &str, imp: Impl) -> Option<&Samples> {
        self.rows
            .iter()
            .find(|r| r.scenario == scenario && r.imp == imp)
            .and_then(|r| r.samples.as_ref())
    }

    fn p99(&self, scenario: &str, imp: Impl) -> Option<Duration> {
        self.get(scenario, imp).and_then(Samples::p99)
    }

    fn print(&self) {
        println!(
            "| scenario | impl | p50 | p99 | p50 / floor | p99 / floor | ops/s | ops/s / floor | ok (errors) | note |"
        );
        println!("| --- | --- | ---: | ---: | ---: | ---: | ---: | ---: | ---: | --- |");
        for row in &self.rows {
            let Some(s) = &row.samples else {
                println!("| {} | {} | | | | | | | | {} |", row.scenario, row.imp, row.note);
                continue;
            };
            let floor = self.floors.get(&row.scenario);
            let ratio = |f: fn(&Samples) -> Option<Duration>| match (f(s), floor.and_then(f)) {
                (Some(a), Some(b)) if !b.is_zero() => {
                    format!("{:.2}x", a.as_secs_f64() / b.as_secs_f64())
                }
                _ => String::new(),
            };
            let (ops, ops_ratio) = match (s.throughput(), floor.and_then(Samples::throughput)) {
                (Some(a), Some(b)) => (format!("{a:.0}"), format!("{:.2}x", a / b)),
                (Some(a), None) => (format!("{a:.0}"), String::new()),
                _ => (String::new(), String::new()),
            };
            println!(
                "| {} | {} | {} | {} | {} | {} | {} | {} | {} ({}) | {} |",
                row.scenario,
                row.imp,
                s.p50().map(fmt_duration).unwrap_or_else(|| "—".into()),
                s.p99().map(fmt_duration).unwrap_or_else(|| "—".into()),
                ratio(Samples::p50),
                ratio(Samples::p99),
                ops,
                ops_ratio,
                s.latencies.len(),
                s.errors,
                row.note
            );
        }
    }

    /// One line per target of the issue, computed from this run.
    fn targets(&self, healthy_p99: Option<Duration>) {
        let ratio = |scenario: &str, imp: Impl, other: Impl, f: fn(&Samples) -> Option<f64>| {
            let a = self.get(scenario, imp).and_then(f)?;
            let b = self.get(scenario, other).and_then(f)?;
            Some(a / b)
        };
        let p50 = |s: &Samples| s.p50().map(|d| d.as_secs_f64());
        let tput = |s: &Samples| s.throughput();
        let show = |v: Option<f64>| v.map_or("n/a".to_owned(), |v| format!("{v:.2}x"));
        let verdict = |ok: Option<bool>| match ok {
            Some(true) => "met",
            Some(false) => "NOT met",
            None => "n/a",
        };
        let l5 = "lock+release, N=5";
        let r_floor = ratio(l5, Impl::Ours, Impl::Floor, p50);
        let r_rslock = ratio(l5, Impl::Ours, Impl::Rslock, p50);
        println!(
            "- lock+release p50 (N=5): {} the floor (target <= 1.10x), {} rslock (target <= 1.00x): {}",
            show(r_floor),
            show(r_rslock),
            verdict(r_floor.zip(r_rslock).map(|(a, b)| a <= 1.10 && b <= 1.0))
        );
        let hung_p99 = self.p99("one node hung, N=5", Impl::Ours);
        let bound = healthy_p99.map(|h| h * 3 + Duration::from_millis(2));
        println!(
            "- one node hung: p99 {} vs bound 3 x healthy p99 + 2 ms = {}: {}",
            hung_p99.map(fmt_duration).unwrap_or_else(|| "n/a".into()),
            bound.map(fmt_duration).unwrap_or_else(|| "n/a".into()),
            verdict(hung_p99.zip(bound).map(|(h, b)| h <= b))
        );
        let tp = format!("{TASKS} tasks, distinct keys, N=5");
        let t_floor = ratio(&tp, Impl::Ours, Impl::Floor, tput);
        let t_rslock = ratio(&tp, Impl::Ours, Impl::Rslock, tput);
        println!(
            "- {TASKS}-task throughput: {} the floor (target >= 0.9x), {} rslock (target >= 1.2x): {}",
            show(t_floor),
            show(t_rslock),
            verdict(t_floor.zip(t_rslock).map(|(a, b)| a >= 0.9 && b >= 1.2))
        );
        let growth = |imp: Impl| {
            let n9 = self.get("lock+release, N=9", imp).and_then(p50)?;
            let n1 = self.get("lock+release, N=1", imp).and_then(p50)?;
            Some(n9 / n1)
        };
        let (flat, floor_flat) = (growth(Impl::Ours), growth(Impl::Floor));
        println!(
            "- latency in N: ours p50 N=9 / N=1 = {}, floor {} (flat: ours grows no faster than the floor, within 10%): {}",
            show(flat),
            show(floor_flat),
            verdict(flat.zip(floor_flat).map(|(a, b)| a <= b * 1.10))
        );
    }
}

fn short(err: &str) -> String {
    let one_line = err.replace(['\n', '|'], " ");
    if one_line.chars().count() > 80 {
        format!("{}…", one_line.chars().take(80).collect::<String>())
    } else {
        one_line
    }
}
