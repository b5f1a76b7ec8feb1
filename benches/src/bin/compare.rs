//! Runs a fixed scenario set against the same nodes for every implementation and prints a
//! Markdown table: medians, p99s, throughput, and ratios to a base (the floor, or our plain
//! lock for the kinds) with their spread over rounds.
//!
//! ```sh
//! cargo run --release -p redlock-benches --bin compare -- [--quick] [--workers N]
//!     [--only SCENARIO]... [--impls floor,ours,...]
//! ```
//!
//! Starts 9 local `redis-server` nodes through the testkit, or uses `REDLOCK_NODES`
//! (comma-separated URLs; the hung- and dead-node scenarios need local nodes and are
//! skipped then). Each scenario runs in several rounds; in each round every implementation
//! runs one batch, the order rotating from round to round, so that machine drift hits them
//! alike. A ratio is computed within each round (the implementation's batch against the
//! base's batch of the same round) and reported as the median over the rounds with the
//! lowest and highest in brackets: a difference smaller than that spread is noise.

use std::time::Duration;

use redlock_benches::{
    Batch, Client, Impl, Samples, Settings, fmt_duration, handoff_batch, hot_key_batch,
    latency_batch, machine_line, throughput_batch,
};
use redlock_testkit::{NetFault, Nodes, Proxy};

/// The node that is paused or killed in the fault scenarios (of the first five).
const FAULTY: usize = 4;
const TASKS: usize = 64;
const HOT_TASKS: usize = 8;
const HANDOFF_TASKS: usize = 4;
/// How long each task holds the lock in the handoff scenario.
const HANDOFF_HOLD: Duration = Duration::from_millis(2);
/// The delay each way of the scenario over a network.
const HOP: Duration = Duration::from_micros(250);

const LATENCY_5: &str = "lock+release, N=5";
const THROUGHPUT: &str = "64 tasks, distinct keys, N=5";
const HANDOFF: &str = "handoff gap, 4 tasks taking turns, N=5";
const HUNG: &str = "one node hung, N=5";

#[derive(Clone)]
struct Options {
    quick: bool,
    workers: usize,
    /// Only the scenarios whose name contains one of these (all when empty).
    only: Vec<String>,
    /// Only these implementations (all when empty), e.g. to profile one of them.
    impls: Vec<Impl>,
}

impl Options {
    fn parse() -> Self {
        let mut options = Options { quick: false, workers: 2, only: Vec::new(), impls: Vec::new() };
        let mut args = std::env::args().skip(1);
        while let Some(arg) = args.next() {
            match arg.as_str() {
                "--quick" => options.quick = true,
                "--workers" => {
                    options.workers = args
                        .next()
                        .and_then(|n| n.parse().ok())
                        .unwrap_or_else(|| usage("--workers needs a number"));
                }
                "--only" => {
                    options.only.push(args.next().unwrap_or_else(|| usage("--only needs a name")));
                }
                "--impls" => {
                    let list = args.next().unwrap_or_else(|| usage("--impls needs a list"));
                    for name in list.split(',') {
                        let imp = Impl::from_name(name)
                            .unwrap_or_else(|| usage(&format!("unknown implementation {name}")));
                        options.impls.push(imp);
                    }
                }
                other => usage(&format!("unknown argument {other}")),
            }
        }
        options
    }

    fn runs(&self, scenario: &str) -> bool {
        self.only.is_empty() || self.only.iter().any(|o| scenario.contains(o.as_str()))
    }

    fn impls(&self, of: &[Impl]) -> Vec<Impl> {
        of.iter().copied().filter(|i| self.impls.is_empty() || self.impls.contains(i)).collect()
    }

    /// Divides sample counts and batch times in a quick run.
    fn scale(&self) -> u32 {
        if self.quick { 4 } else { 1 }
    }

    fn rounds(&self, full: usize) -> usize {
        if self.quick { full.div_ceil(2) } else { full }
    }
}

fn usage(problem: &str) -> ! {
    eprintln!(
        "{problem}\nusage: compare [--quick] [--workers N] [--only SCENARIO]... [--impls a,b,...]"
    );
    std::process::exit(2)
}

fn main() {
    let options = Options::parse();
    let runtime = redlock_benches::runtime(options.workers);
    let mut nodes =
        Nodes::from_env_or_start(9).unwrap_or_else(|e| panic!("cannot start the nodes: {e}"));
    let machine = machine_line(&nodes.urls()[0]);
    let mut bench =
        Bench { runtime, options, table: Table::default(), settings: Settings::default() };
    let scale = bench.options.scale();

    // Uncontended latency, N = 1, 3, 5, 7, 9.
    for n in [1, 3, 5, 7, 9] {
        if n > nodes.urls().len() {
            continue;
        }
        let scenario = format!("lock+release, N={n}");
        let clients = bench.connect(&scenario, &Impl::ALL, &nodes.first(n));
        bench.run(&scenario, Impl::Floor, &clients, 5, &[], move |client| {
            let key = format!("bench:lat{n}:{}", client.kind());
            let batch = match client.kind() {
                Impl::RedlockRs => batch(60 / scale, 2),
                _ => batch(600 / scale, 2),
            };
            async move { latency_batch(&client, &key, batch).await }
        });
    }

    let five = nodes.first(5);
    let slot = Duration::from_millis(500 / u64::from(scale));

    // Uncontended latency over a network: a delay of `HOP` each way in front of every node
    // (a proxy of the testkit, in this process), so that a round trip costs what the
    // servers' and the client's CPU cost on loopback does not dominate.
    let scenario = over_network();
    match delayed(&five) {
        Some((proxies, urls)) => {
            let clients = bench.connect(&scenario, &Impl::ALL, &urls);
            bench.run(&scenario, Impl::Floor, &clients, 4, &[], move |client| {
                let key = format!("bench:hop:{}", client.kind());
                let batch = match client.kind() {
                    Impl::RedlockRs => batch(40 / scale, 2),
                    _ => batch(200 / scale, 2),
                };
                async move { latency_batch(&client, &key, batch).await }
            });
            drop(proxies);
        }
        None => bench.table.skip(&scenario, "needs nodes on 127.0.0.1 (redis://)"),
    }

    // Throughput: 64 tasks, distinct keys.
    let clients = bench.connect(THROUGHPUT, &Impl::ALL, &five);
    bench.run(THROUGHPUT, Impl::Floor, &clients, 6, &[], move |client| {
        let prefix = format!("bench:tp:{}", client.kind());
        async move { throughput_batch(&client, TASKS, slot, &prefix).await }
    });

    // Hot key: several tasks waiting on one resource.
    let scenario = format!("hot key, {HOT_TASKS} waiters, N=5");
    let clients = bench.connect(&scenario, &Impl::ALL, &five);
    bench.run(&scenario, Impl::Floor, &clients, 4, &[], move |client| {
        let key = format!("bench:hot:{}", client.kind());
        async move { hot_key_batch(&client, HOT_TASKS, slot, &key).await }
    });

    // Handoff: tasks taking turns on one key; the gap from a release to the next grant.
    let clients = bench.connect(HANDOFF, &[Impl::Ours, Impl::Rslock], &five);
    let not_run =
        [(Impl::Floor, "no blocking lock"), (Impl::RedlockRs, "polls in a blocking loop: not run")];
    bench.run(HANDOFF, Impl::Rslock, &clients, 4, &not_run, move |client| {
        let key = format!("bench:handoff:{}", client.kind());
        async move { handoff_batch(&client, HANDOFF_TASKS, HANDOFF_HOLD, slot, &key).await }
    });

    // Every kind of ours against our plain lock.
    let scenario = "kinds: lock+release, N=5";
    let clients = bench.connect(scenario, &Impl::KINDS, &five);
    bench.run(scenario, Impl::Ours, &clients, 5, &[], move |client| {
        let key = format!("bench:kind:{}", client.kind());
        async move { latency_batch(&client, &key, batch(400 / scale, 2)).await }
    });
    let scenario = "kinds: 64 tasks, distinct keys, N=5";
    let clients = bench.connect(scenario, &Impl::KINDS, &five);
    bench.run(scenario, Impl::Ours, &clients, 4, &[], move |client| {
        let prefix = format!("bench:kindtp:{}", client.kind());
        async move { throughput_batch(&client, TASKS, slot, &prefix).await }
    });

    // One node hung (SIGSTOP), node timeout 50 ms.
    if nodes.cluster_mut().is_some() {
        let impls = [Impl::Floor, Impl::Ours, Impl::Rslock];
        let clients = bench.connect(HUNG, &impls, &five);
        if !clients.is_empty() {
            pause(&mut nodes, true);
            let not_run = [(Impl::RedlockRs, "blocks (no timeout): not run")];
            bench.run(HUNG, Impl::Floor, &clients, 5, &not_run, move |client| {
                let key = format!("bench:hung:{}", client.kind());
                let batch = match client.kind() {
                    Impl::Ours => batch(400 / scale, 2),
                    Impl::Floor => batch(10 / scale.min(2), 1),
                    _ => batch(3, 3),
                };
                async move { latency_batch(&client, &key, batch).await }
            });
            pause(&mut nodes, false);
        }
    } else {
        bench.table.skip(HUNG, "needs local nodes (REDLOCK_NODES is set)");
    }

    // One node dead (killed).
    let dead = "one node dead, N=5";
    if nodes.cluster_mut().is_some() {
        let clients = bench.connect(dead, &Impl::ALL, &five);
        if !clients.is_empty() {
            if let Some(cluster) = nodes.cluster_mut() {
                cluster.node_mut(FAULTY).kill().expect("kill a node");
            }
            bench.run(dead, Impl::Floor, &clients, 5, &[], move |client| {
                let key = format!("bench:dead:{}", client.kind());
                let batch = match client.kind() {
                    Impl::RedlockRs => batch(20 / scale, 2),
                    _ => batch(400 / scale, 2),
                };
                async move { latency_batch(&client, &key, batch).await }
            });
        }
    } else {
        bench.table.skip(dead, "needs local nodes (REDLOCK_NODES is set)");
    }

    println!("{machine}; client runtime: Tokio multi-thread, {} workers\n", bench.options.workers);
    bench.table.print();
    println!();
    bench.table.targets();
}

/// The scenario over a network: [`HOP`] each way.
fn over_network() -> String {
    format!("lock+release, N=5, {} µs each way", HOP.as_micros())
}

/// A proxy in front of each of `urls` (plain `redis://127.0.0.1:PORT` nodes), delaying
/// everything by [`HOP`] each way; `None` for other URLs.
fn delayed(urls: &[String]) -> Option<(Vec<Proxy>, Vec<String>)> {
    let mut proxies = Vec::new();
    for url in urls {
        let port = url.strip_prefix("redis://127.0.0.1:")?.trim_end_matches('/').parse().ok()?;
        let proxy = Proxy::start(port).ok()?;
        proxy.set_fault(NetFault::Latency { fixed: HOP, jitter: Duration::ZERO });
        proxies.push(proxy);
    }
    let urls = proxies.iter().map(Proxy::url).collect();
    Some((proxies, urls))
}

fn batch(samples: u32, max_secs: u64) -> Batch {
    Batch { samples: samples.max(1) as usize, max_time: Duration::from_secs(max_secs) }
}

fn pause(nodes: &mut Nodes, on: bool) {
    if let Some(cluster) = nodes.cluster_mut() {
        let node = cluster.node_mut(FAULTY);
        let result = if on { node.pause() } else { node.resume() };
        result.expect("pause/resume a node");
    }
}

struct Bench {
    runtime: tokio::runtime::Runtime,
    options: Options,
    table: Table,
    settings: Settings,
}

impl Bench {
    /// Clients of the selected `impls` for `urls`, none if `scenario` is not selected.
    fn connect(&self, scenario: &str, impls: &[Impl], urls: &[String]) -> Vec<Client> {
        if !self.options.runs(scenario) {
            return Vec::new();
        }
        let impls = self.options.impls(impls);
        self.runtime.block_on(async {
            let mut clients = Vec::new();
            for imp in impls {
                match Client::connect(imp, urls, self.settings).await {
                    Ok(client) => clients.push(client),
                    Err(err) => eprintln!("{imp}: cannot connect: {err}"),
                }
            }
            clients
        })
    }

    /// `rounds` rounds of `scenario` (fewer in a quick run); in each, every client runs one
    /// batch (as a task on the runtime's workers, like the code of a service), the order
    /// rotating each round.
    fn run<F, Fut>(
        &mut self,
        scenario: &str,
        base: Impl,
        clients: &[Client],
        rounds: usize,
        not_run: &[(Impl, &str)],
        batch: F,
    ) where
        F: Fn(Client) -> Fut,
        Fut: Future<Output = Samples> + Send + 'static,
    {
        if clients.is_empty() {
            return;
        }
        let rounds = self.options.rounds(rounds);
        let mut results: Vec<(Impl, Vec<Samples>)> =
            clients.iter().map(|c| (c.kind(), Vec::new())).collect();
        self.runtime.block_on(async {
            for round in 0..rounds {
                for k in 0..clients.len() {
                    let i = (round + k) % clients.len();
                    let samples = match tokio::spawn(batch(clients[i].clone())).await {
                        Ok(samples) => samples,
                        Err(err) => {
                            let mut failed = Samples::default();
                            failed.record(Duration::ZERO, Err(format!("batch failed: {err}")));
                            failed
                        }
                    };
                    results[i].1.push(samples);
                }
            }
        });
        self.table.add(scenario, base, results, not_run);
    }
}

struct Row {
    scenario: String,
    imp: Impl,
    /// What the ratios of this row compare with.
    base: Impl,
    /// One entry per round, in round order; empty when not run.
    rounds: Vec<Samples>,
    merged: Samples,
    note: String,
}

/// The median, lowest and highest of per-round values.
#[derive(Clone, Copy, Debug)]
struct Spread {
    median: f64,
    low: f64,
    high: f64,
}

impl Spread {
    fn of(mut values: Vec<f64>) -> Option<Spread> {
        values.retain(|v| v.is_finite());
        if values.is_empty() {
            return None;
        }
        values.sort_by(f64::total_cmp);
        let mid = values.len() / 2;
        let median =
            if values.len() % 2 == 1 { values[mid] } else { (values[mid - 1] + values[mid]) / 2.0 };
        Some(Spread { median, low: values[0], high: values[values.len() - 1] })
    }

    fn ratio(self) -> String {
        // Below 0.01 two decimals say nothing: keep three significant digits.
        let fmt = |v: f64| {
            if v != 0.0 && v.abs() < 0.01 { format!("{v:.2e}") } else { format!("{v:.2}") }
        };
        format!("{}x ({}–{})", fmt(self.median), fmt(self.low), fmt(self.high))
    }
}

#[derive(Default)]
struct Table {
    rows: Vec<Row>,
}

impl Table {
    fn add(
        &mut self,
        scenario: &str,
        base: Impl,
        results: Vec<(Impl, Vec<Samples>)>,
        not_run: &[(Impl, &str)],
    ) {
        for (imp, rounds) in results {
            let mut merged = Samples::default();
            for samples in &rounds {
                merged.merge(samples.clone());
            }
            eprintln!(
                "{scenario:<40} {imp:<15} p50 {:>10} p99 {:>10} ok {:>6} errors {}",
                merged.p50().map(fmt_duration).unwrap_or_default(),
                merged.p99().map(fmt_duration).unwrap_or_default(),
                merged.latencies.len(),
                merged.errors
            );
            let mut note = match (&merged.first_error, merged.latencies.is_empty()) {
                (Some(err), true) => format!("every call failed: {}", short(err)),
                (Some(err), false) => format!("{} failed: {}", merged.errors, short(err)),
                (None, _) => String::new(),
            };
            if scenario == HANDOFF && imp == Impl::Ours && !merged.latencies.is_empty() {
                let per = merged.failed_attempts as f64 / merged.latencies.len() as f64;
                note = format!("{per:.2} failed attempts per handoff {note}");
            }
            self.rows.push(Row { scenario: scenario.to_owned(), imp, base, rounds, merged, note });
        }
        for (imp, why) in not_run {
            self.not_run(scenario, *imp, why);
        }
    }

    fn not_run(&mut self, scenario: &str, imp: Impl, why: &str) {
        self.rows.push(Row {
            scenario: scenario.to_owned(),
            imp,
            base: imp,
            rounds: Vec::new(),
            merged: Samples::default(),
            note: why.to_owned(),
        });
    }

    fn skip(&mut self, scenario: &str, why: &str) {
        for imp in Impl::ALL {
            self.not_run(scenario, imp, why);
        }
    }

    fn get(&self, scenario: &str, imp: Impl) -> Option<&Row> {
        self.rows.iter().find(|r| r.scenario == scenario && r.imp == imp && !r.rounds.is_empty())
    }

    /// `f` of `imp`'s batch over `f` of `other`'s batch, round by round.
    fn ratio(
        &self,
        scenario: &str,
        imp: Impl,
        other: Impl,
        f: fn(&Samples) -> Option<f64>,
    ) -> Option<Spread> {
        let (a, b) = (self.get(scenario, imp)?, self.get(scenario, other)?);
        let ratios = a.rounds.iter().zip(&b.rounds).filter_map(|(x, y)| Some(f(x)? / f(y)?));
        Spread::of(ratios.collect())
    }

    fn print(&self) {
        println!(
            "| scenario | impl | p50 | p99 | p50 / base | ops/s | ops/s / base | client CPU / op | CPU / base | ok (errors) | note |"
        );
        println!("| --- | --- | ---: | ---: | ---: | ---: | ---: | ---: | ---: | ---: | --- |");
        for row in &self.rows {
            if row.rounds.is_empty() {
                println!("| {} | {} | | | | | | | | | {} |", row.scenario, row.imp, row.note);
                continue;
            }
            let s = &row.merged;
            let vs_base = |f: fn(&Samples) -> Option<f64>| {
                if row.imp == row.base {
                    return "base".to_owned();
                }
                self.ratio(&row.scenario, row.imp, row.base, f)
                    .map(Spread::ratio)
                    .unwrap_or_default()
            };
            let throughput = s.throughput().is_some();
            println!(
                "| {} | {} | {} | {} | {} | {} | {} | {} | {} | {} ({}) | {} |",
                row.scenario,
                row.imp,
                s.p50().map(fmt_duration).unwrap_or_else(|| "—".into()),
                s.p99().map(fmt_duration).unwrap_or_else(|| "—".into()),
                vs_base(p50),
                s.throughput().map(|t| format!("{t:.0}")).unwrap_or_default(),
                if throughput { vs_base(ops) } else { String::new() },
                s.cpu_per_op().map(fmt_duration).unwrap_or_default(),
                vs_base(cpu),
                s.latencies.len(),
                s.errors,
                row.note
            );
        }
    }

    /// One line per target of the performance issue, computed from this run.
    fn targets(&self) {
        let show = |v: Option<Spread>| v.map_or("n/a".to_owned(), Spread::ratio);
        let verdict = |ok: Option<bool>| match ok {
            Some(true) => "met",
            Some(false) => "NOT met",
            None => "n/a",
        };
        let r_floor = self.ratio(LATENCY_5, Impl::Ours, Impl::Floor, p50);
        let r_rslock = self.ratio(LATENCY_5, Impl::Ours, Impl::Rslock, p50);
        println!(
            "- lock+release p50 (N=5): {} the floor (target <= 1.05x), {} rslock (target <= 1.00x): {}",
            show(r_floor),
            show(r_rslock),
            verdict(r_floor.zip(r_rslock).map(|(a, b)| a.median <= 1.05 && b.median <= 1.0))
        );
        let c_floor = self.ratio(LATENCY_5, Impl::Ours, Impl::Floor, cpu);
        println!(
            "- client CPU per lock+release (N=5): {} the floor (target <= 1.30x): {}",
            show(c_floor),
            verdict(c_floor.map(|c| c.median <= 1.30))
        );
        let over = over_network();
        let (n_floor, n_rslock) = (
            self.ratio(&over, Impl::Ours, Impl::Floor, p50),
            self.ratio(&over, Impl::Ours, Impl::Rslock, p50),
        );
        println!(
            "- the same over a network ({} µs each way): {} the floor, {} rslock (no target: for comparison)",
            HOP.as_micros(),
            show(n_floor),
            show(n_rslock),
        );
        let healthy_p99 = self.get(LATENCY_5, Impl::Ours).and_then(|r| r.merged.p99());
        let hung_p99 = self.get(HUNG, Impl::Ours).and_then(|r| r.merged.p99());
        let bound = healthy_p99.map(|h| h * 3 + Duration::from_millis(2));
        println!(
            "- one node hung: p99 {} vs bound 3 x healthy p99 + 2 ms = {}: {}",
            hung_p99.map(fmt_duration).unwrap_or_else(|| "n/a".into()),
            bound.map(fmt_duration).unwrap_or_else(|| "n/a".into()),
            verdict(hung_p99.zip(bound).map(|(h, b)| h <= b))
        );
        let t_floor = self.ratio(THROUGHPUT, Impl::Ours, Impl::Floor, ops);
        let t_rslock = self.ratio(THROUGHPUT, Impl::Ours, Impl::Rslock, ops);
        println!(
            "- {TASKS}-task throughput: {} the floor (target >= 1.0x), {} rslock (target >= 1.25x): {}",
            show(t_floor),
            show(t_rslock),
            verdict(t_floor.zip(t_rslock).map(|(a, b)| a.median >= 1.0 && b.median >= 1.25))
        );
        let gap = self.get(HANDOFF, Impl::Ours).and_then(|r| r.merged.p50());
        let uncontended = self.get(LATENCY_5, Impl::Ours).and_then(|r| r.merged.p50());
        let failed = self
            .get(HANDOFF, Impl::Ours)
            .map(|r| r.merged.failed_attempts as f64 / r.merged.latencies.len().max(1) as f64);
        println!(
            "- handoff gap median {} vs 2 x uncontended lock+release p50 = {} ({:.2} failed attempts per handoff): {}",
            gap.map(fmt_duration).unwrap_or_else(|| "n/a".into()),
            uncontended.map(|u| fmt_duration(u * 2)).unwrap_or_else(|| "n/a".into()),
            failed.unwrap_or(f64::NAN),
            verdict(gap.zip(uncontended).map(|(g, u)| g <= u * 2))
        );
        let growth = |imp: Impl| {
            let n9 = self.get("lock+release, N=9", imp).and_then(|r| r.merged.p50())?;
            let n1 = self.get("lock+release, N=1", imp).and_then(|r| r.merged.p50())?;
            Some(n9.as_secs_f64() / n1.as_secs_f64())
        };
        let (flat, floor_flat) = (growth(Impl::Ours), growth(Impl::Floor));
        let one = |v: Option<f64>| v.map_or("n/a".to_owned(), |v| format!("{v:.2}x"));
        println!(
            "- latency in N: ours p50 N=9 / N=1 = {}, floor {} (ours grows no faster than the floor, within 10%): {}",
            one(flat),
            one(floor_flat),
            verdict(flat.zip(floor_flat).map(|(a, b)| a <= b * 1.10))
        );
    }
}

fn p50(s: &Samples) -> Option<f64> {
    s.p50().map(|d| d.as_secs_f64())
}

fn cpu(s: &Samples) -> Option<f64> {
    s.cpu_per_op().map(|d| d.as_secs_f64())
}

fn ops(s: &Samples) -> Option<f64> {
    s.throughput()
}

fn short(err: &str) -> String {
    let one_line = err.replace(['\n', '|'], " ");
    if one_line.chars().count() > 80 {
        format!("{}…", one_line.chars().take(80).collect::<String>())
    } else {
        one_line
    }
}
