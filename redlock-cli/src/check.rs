//! `redlock check`: whether each node fits the algorithm's model, one line per finding.

use std::collections::BTreeMap;
use std::time::{Duration, Instant};

use redis::aio::MultiplexedConnection;

use crate::config::Options;
use crate::{EXIT_FAILURE, admin};

/// What one node told us.
#[derive(Debug, Default)]
struct Node {
    url: String,
    version: Option<String>,
    valkey: bool,
    run_id: Option<String>,
    role: Option<String>,
    replicas: usize,
    uptime: Option<u64>,
    config: BTreeMap<String, String>,
    /// The node's clock minus ours, at the middle of the request.
    clock_offset_ms: Option<i64>,
    /// Commands the node refused to this user (`NOPERM`), with what it said.
    denied: Vec<(&'static str, String)>,
}

/// A finding: `true` when it breaks the model (non-zero exit), `false` for a warning.
type Finding = (bool, String);

pub(crate) async fn check(options: &Options) -> u8 {
    if options.nodes.is_empty() {
        eprintln!("redlock: no nodes: give --nodes or REDLOCK_NODES");
        return EXIT_FAILURE;
    }
    // Building a client also installs the TLS library's crypto provider, which the probes'
    // own connections need for rediss:// nodes.
    if let Err(err) = options.client() {
        println!("error: configuration: {err}");
        return 1;
    }
    let mut findings: Vec<Finding> = Vec::new();
    let mut nodes = Vec::new();
    for url in &options.nodes {
        let shown = admin::redact(url);
        match probe(options, url).await {
            Ok(mut node) => {
                node.url = shown;
                nodes.push(node);
            }
            // A refusal proves the node answered: name the missing rule, not the network.
            Err(err) if admin::denied(&err) && err.to_ascii_uppercase().contains("NOPERM") => {
                findings.push((
                    true,
                    format!(
                        "{shown}: NOPERM: the user may not run `ping` (allow +ping; see the \
                         README's ACL rules): {err}"
                    ),
                ))
            }
            Err(err) => findings.push((true, format!("{shown}: unreachable or refused: {err}"))),
        }
    }
    for node in &nodes {
        println!(
            "{}: {} {}, {}, up {}, appendonly {}, appendfsync {}, maxmemory-policy {}, {}",
            node.url,
            if node.valkey { "valkey" } else { "redis" },
            node.version.as_deref().unwrap_or("?"),
            node.role.as_deref().unwrap_or("?"),
            node.uptime
                .map_or("?".to_owned(), |s| humantime::format_duration(Duration::from_secs(s))
                    .to_string()),
            setting(node, "appendonly"),
            setting(node, "appendfsync"),
            setting(node, "maxmemory-policy"),
            scripting(node),
        );
        findings.extend(judge(node));
    }
    findings.extend(duplicates(&nodes));
    findings.extend(clocks(&nodes));
    findings.extend(permissions(options).await);
    for (breaks, finding) in &findings {
        println!("{}: {finding}", if *breaks { "error" } else { "warning" });
    }
    let broken = findings.iter().filter(|(breaks, _)| *breaks).count();
    if broken > 0 {
        println!("{broken} problem(s) break the Redlock model");
        1
    } else {
        println!("{} node(s) fit the Redlock model", nodes.len());
        0
    }
}

/// Whether the plain lock needs Lua on `node`: not with `DELIFEQ` and `SET ... IFEQ`
/// (Valkey 9), for a user the node refuses scripts; elsewhere for its releases and
/// extensions (and on Redis 6.2 its acquisitions).
fn scripting(node: &Node) -> &'static str {
    match node.version.as_deref().and_then(major_minor) {
        Some(version) if node.valkey && version >= (9, 0) => "plain lock: no scripts needed",
        Some(_) => "plain lock: needs scripts",
        None => "plain lock: ?",
    }
}

fn setting<'a>(node: &'a Node, name: &str) -> &'a str {
    node.config.get(name).map_or("(not readable)", String::as_str)
}

/// What each node's own settings mean for the model.
fn judge(node: &Node) -> Vec<Finding> {
    let mut out = Vec::new();
    let url = &node.url;
    match node.version.as_deref().map(major_minor) {
        Some(Some(version)) if version < (6, 2) && !node.valkey => {
            out.push((
                true,
                format!(
                    "{url}: Redis {} is too old: the library needs 6.2 or later",
                    node.version.as_deref().unwrap_or("?")
                ),
            ));
        }
        Some(Some(_)) => {}
        _ => out.push((false, format!("{url}: the server version could not be read"))),
    }
    for (command, said) in &node.denied {
        out.push((
            false,
            format!(
                "{url}: NOPERM: the user may not run `{command}`, so check could not read \
                 what it returns (allow +{command}; see the README's ACL rules): {said}"
            ),
        ));
    }
    match node.role.as_deref() {
        Some("master") => {}
        Some(role) => out.push((
            true,
            format!("{url}: a {role}, not a master: every node must be an independent master"),
        )),
        None => out.push((false, format!("{url}: the role could not be read"))),
    }
    if node.replicas > 0 {
        out.push((true, format!("{url}: {} replica(s) attached: a failover to a replica can lose a held lock (outside the model)", node.replicas)));
    }
    match node.config.get("appendfsync").map(String::as_str) {
        Some("always") if node.config.get("appendonly").map(String::as_str) == Some("yes") => {}
        Some(fsync) => out.push((false, format!(
            "{url}: appendonly {} / appendfsync {fsync}: a crash can forget granted locks; use appendonly yes, appendfsync always, or restart_quarantine",
            setting(node, "appendonly")
        ))),
        None => out.push((false, format!("{url}: persistence settings not readable"))),
    }
    match node.config.get("maxmemory-policy").map(String::as_str) {
        Some("noeviction") | None => {}
        Some(policy) => out.push((
            false,
            format!("{url}: maxmemory-policy {policy} can evict a held lock's key; use noeviction"),
        )),
    }
    out
}

/// Two URLs that reach one server give it two votes.
fn duplicates(nodes: &[Node]) -> Vec<Finding> {
    let mut by_id: BTreeMap<&str, Vec<&str>> = BTreeMap::new();
    for node in nodes {
        if let Some(id) = &node.run_id {
            by_id.entry(id).or_default().push(&node.url);
        }
    }
    by_id
        .values()
        .filter(|urls| urls.len() > 1)
        .map(|urls| {
            (
                true,
                format!(
                    "{} are one server (same run_id): it would vote {} times",
                    urls.join(" and "),
                    urls.len()
                ),
            )
        })
        .collect()
}

/// Clocks far apart are a sign of trouble; the model needs rates, not offsets, to agree.
fn clocks(nodes: &[Node]) -> Vec<Finding> {
    let offsets: Vec<(&str, i64)> =
        nodes.iter().filter_map(|n| n.clock_offset_ms.map(|o| (n.url.as_str(), o))).collect();
    let (Some(min), Some(max)) =
        (offsets.iter().map(|(_, o)| *o).min(), offsets.iter().map(|(_, o)| *o).max())
    else {
        return Vec::new();
    };
    if max - min > 1000 {
        vec![(
            false,
            format!(
                "the nodes' clocks differ by {} ms: check NTP (a clock that jumps shortens leases)",
                max - min
            ),
        )]
    } else {
        Vec::new()
    }
}

/// Whether the user may do what the library does: a lock taken, extended, checked and
/// released on a resource of its own, and a release notification published.
async fn permissions(options: &Options) -> Vec<Finding> {
    let rl = match options.client() {
        Ok(rl) => rl,
        Err(err) => return vec![(true, format!("configuration: {err}"))],
    };
    // Every node at once first (see `run`); what failed, the lock below reports.
    let _ = rl.connect().await;
    let resource = format!("redlock-check:{}", std::process::id());
    let mut out = Vec::new();
    let mut denied = |err: &redlock::Error| {
        for report in err.nodes() {
            let said = report.outcome().to_string();
            if said.contains("NOPERM") || said.contains("permission") {
                out.push((
                    true,
                    format!("{}: the user may not use the lock: {said}", report.node()),
                ));
            }
        }
    };
    match rl.try_lock(&resource).await {
        Ok(mut lock) => {
            if let Err(err) = lock.extend(options.ttl).await {
                denied(&err);
            }
            if let Err(err) = lock.check_held().await {
                denied(&err);
            }
            if let Err(err) = lock.release().await {
                denied(&err);
            }
        }
        Err(err) => denied(&err),
    }
    let _ = rl.shutdown(Duration::from_secs(2)).await;
    for url in &options.nodes {
        let Ok(mut con) = admin::connect(options, url).await else { continue };
        let channel = format!("redlock:released:{}{resource}", options.key_prefix);
        let published = admin::bounded(
            options.node_timeout.max(Duration::from_millis(500)),
            redis::cmd("PUBLISH").arg(&channel).arg("0").query_async::<i64>(&mut con),
        )
        .await;
        if let Err(err) = published {
            out.push((false, format!(
                "{}: release notifications refused ({err}): waiters fall back to polling; allow &redlock:released:*",
                admin::redact(url)
            )));
        }
    }
    out
}

fn major_minor(version: &str) -> Option<(u32, u32)> {
    let mut parts = version.split('.');
    Some((parts.next()?.parse().ok()?, parts.next()?.parse().ok()?))
}

async fn probe(options: &Options, url: &str) -> Result<Node, String> {
    let timeout = options.node_timeout;
    let mut con = admin::connect(options, url).await?;
    let timeout = timeout.max(Duration::from_millis(500));
    let mut node = Node::default();
    admin::bounded(timeout, redis::cmd("PING").query_async::<String>(&mut con)).await?;
    // One section per INFO: Redis 6.2 answers a syntax error to several (7.0 added them).
    let mut info = Ok(String::new());
    for section in ["server", "replication"] {
        let Ok(all) = &mut info else { break };
        let mut command = redis::cmd("INFO");
        command.arg(section);
        match admin::bounded(timeout, command.query_async::<String>(&mut con)).await {
            Ok(text) => all.push_str(&text),
            Err(err) => info = Err(err),
        }
    }
    if let Err(err) = &info
        && admin::denied(err)
    {
        node.denied.push(("info", err.clone()));
    }
    if let Ok(info) = info {
        let fields: BTreeMap<&str, &str> =
            info.lines().filter_map(|line| line.trim().split_once(':')).collect();
        node.valkey =
            fields.contains_key("valkey_version") || fields.get("server_name") == Some(&"valkey");
        node.version =
            fields.get("valkey_version").or(fields.get("redis_version")).map(|v| v.to_string());
        node.run_id = fields.get("run_id").map(|v| v.to_string());
        node.role = fields.get("role").map(|v| v.to_string());
        node.replicas = fields.get("connected_slaves").and_then(|v| v.parse().ok()).unwrap_or(0);
        node.uptime = fields.get("uptime_in_seconds").and_then(|v| v.parse().ok());
    }
    for name in ["appendonly", "appendfsync", "maxmemory-policy"] {
        match admin::bounded(timeout, config_get(&mut con, name)).await {
            Ok(pair) => {
                if let [_, value] = pair.as_slice() {
                    node.config.insert(name.to_owned(), value.clone());
                }
            }
            Err(err) if admin::denied(&err) => {
                node.denied.push(("config|get", err));
                break;
            }
            Err(_) => {}
        }
    }
    let before = Instant::now();
    let wall = std::time::SystemTime::now();
    if let Ok((secs, micros)) =
        admin::bounded(timeout, redis::cmd("TIME").query_async::<(i64, i64)>(&mut con)).await
    {
        let half = before.elapsed() / 2;
        let ours =
            wall.duration_since(std::time::UNIX_EPOCH).map_or(0, |d| (d + half).as_millis() as i64);
        node.clock_offset_ms = Some(secs * 1000 + micros / 1000 - ours);
    }
    Ok(node)
}

async fn config_get(
    con: &mut MultiplexedConnection,
    name: &str,
) -> redis::RedisResult<Vec<String>> {
    redis::cmd("CONFIG").arg("GET").arg(name).query_async(con).await
}
