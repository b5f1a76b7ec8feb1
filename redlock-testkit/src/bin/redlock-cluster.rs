//! Starts a local cluster of redis-server nodes in the foreground, for demos
//! and manual testing; Ctrl-C stops them all.
//!
//! `redlock-cluster [--nodes N] [--base-port P] [--persistent]`

use std::process::ExitCode;

use redlock_testkit::{NodeConfig, Persistence, RedisNode};

const USAGE: &str = "usage: redlock-cluster [--nodes N (default 5)] [--base-port P] [--persistent]

Starts N redis-server nodes on 127.0.0.1 (ports P..P+N-1 with --base-port,
free ports otherwise; --persistent: AOF with appendfsync always), prints
their URLs, and stops them on Ctrl-C.";

/// Parsed command line.
#[derive(Debug)]
struct Args {
    nodes: usize,
    base_port: Option<u16>,
    persistent: bool,
}

fn parse_args(mut args: impl Iterator<Item = String>) -> Result<Args, String> {
    let mut parsed = Args { nodes: 5, base_port: None, persistent: false };
    while let Some(arg) = args.next() {
        match arg.as_str() {
            "--nodes" => {
                parsed.nodes = value(&mut args, &arg)?;
                if parsed.nodes == 0 {
                    return Err("--nodes must be at least 1".into());
                }
            }
            "--base-port" => parsed.base_port = Some(value(&mut args, &arg)?),
            "--persistent" => parsed.persistent = true,
            other => return Err(format!("unknown argument {other:?}")),
        }
    }
    if let Some(base) = parsed.base_port {
        // The last port must fit in a u16 too.
        if usize::from(base) + parsed.nodes - 1 > usize::from(u16::MAX) || base == 0 {
            return Err(format!("--base-port {base} with {} nodes is out of range", parsed.nodes));
        }
    }
    Ok(parsed)
}

fn value<T: std::str::FromStr>(
    args: &mut impl Iterator<Item = String>,
    flag: &str,
) -> Result<T, String> {
    let raw = args.next().ok_or_else(|| format!("{flag} needs a value"))?;
    raw.parse().map_err(|_| format!("{flag}: invalid value {raw:?}"))
}

fn start_nodes(args: &Args) -> redlock_testkit::Result<Vec<RedisNode>> {
    let persistence =
        if args.persistent { Persistence::AppendFsyncAlways } else { Persistence::None };
    (0..args.nodes)
        .map(|i| {
            let mut config = NodeConfig::new().persistence(persistence);
            if let Some(base) = args.base_port {
                // Range checked in parse_args.
                config = config.port(base + i as u16);
            }
            RedisNode::start_with(config)
        })
        .collect()
}

/// Waits for Ctrl-C or SIGTERM, so `kill` from another shell also cleans up.
async fn shutdown_signal() -> std::io::Result<()> {
    let mut term = tokio::signal::unix::signal(tokio::signal::unix::SignalKind::terminate())?;
    tokio::select! {
        r = tokio::signal::ctrl_c() => r,
        _ = term.recv() => Ok(()),
    }
}

fn main() -> ExitCode {
    let args = match parse_args(std::env::args().skip(1)) {
        Ok(args) => args,
        Err(msg) => {
            eprintln!("redlock-cluster: {msg}\n\n{USAGE}");
            return ExitCode::from(2);
        }
    };
    let nodes = match start_nodes(&args) {
        Ok(nodes) => nodes,
        Err(e) => {
            eprintln!("redlock-cluster: {e}");
            return ExitCode::FAILURE;
        }
    };
    let urls: Vec<String> = nodes.iter().map(RedisNode::url).collect();
    for url in &urls {
        println!("{url}");
    }
    println!("REDLOCK_NODES={}", urls.join(","));
    println!("press Ctrl-C to stop");

    let runtime = match tokio::runtime::Builder::new_current_thread().enable_all().build() {
        Ok(rt) => rt,
        Err(e) => {
            eprintln!("redlock-cluster: could not start the runtime: {e}");
            return ExitCode::FAILURE;
        }
    };
    let waited = runtime.block_on(shutdown_signal());
    let count = nodes.len();
    drop(nodes); // Kills every node and removes its data dir.
    println!("stopped {count} nodes");
    match waited {
        Ok(()) => ExitCode::SUCCESS,
        Err(e) => {
            eprintln!("redlock-cluster: waiting for Ctrl-C failed: {e}");
            ExitCode::FAILURE
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn parse(args: &[&str]) -> Result<Args, String> {
        parse_args(args.iter().map(|s| s.to_string()))
    }

    #[test]
    fn defaults_and_flags() {
        let a = parse(&[]).unwrap();
        assert_eq!((a.nodes, a.base_port, a.persistent), (5, None, false));
        let a = parse(&["--nodes", "3", "--base-port", "7000", "--persistent"]).unwrap();
        assert_eq!((a.nodes, a.base_port, a.persistent), (3, Some(7000), true));
    }

    #[test]
    fn bad_args_are_rejected() {
        for bad in [
            &["--nodes"][..],
            &["--nodes", "x"],
            &["--nodes", "0"],
            &["--base-port", "65535", "--nodes", "2"],
            &["--what"],
        ] {
            assert!(parse(bad).is_err(), "{bad:?}");
        }
    }
}
