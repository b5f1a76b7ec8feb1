//! Starts a local cluster of redis-server nodes in the foreground, for demos
//! and manual testing; Ctrl-C stops them all.
//!
//! `redlock-cluster [--nodes N] [--base-port P] [--persistent] [--tls] [--acl RULES]...`

use std::process::ExitCode;

use redlock_testkit::tls::{Certificates, ClientCerts};
use redlock_testkit::{NodeConfig, Persistence, RedisNode};

const USAGE: &str = "usage: redlock-cluster [--nodes N (default 5)] [--base-port P] [--persistent]
                       [--tls] [--acl 'NAME on >PASSWORD RULES...']...

Starts N redis-server nodes on 127.0.0.1 (ports P..P+N-1 with --base-port,
free ports otherwise; --persistent: AOF with appendfsync always), prints
their URLs, and stops them on Ctrl-C.
--tls: TLS-only nodes (rediss://) with a generated CA, printed as REDLOCK_TLS_CA.
--acl: the arguments of one `ACL SETUSER` run on every node (repeat for more lines,
all for the same user); the URLs printed then log in as that user.";

/// Parsed command line.
#[derive(Debug)]
struct Args {
    nodes: usize,
    base_port: Option<u16>,
    persistent: bool,
    tls: bool,
    /// `ACL SETUSER` argument lines, all for one user.
    acl: Vec<Vec<String>>,
}

impl Args {
    /// The ACL user the URLs log in as: the name of the `--acl` lines and the last
    /// `>password` among them.
    fn user(&self) -> Option<(&str, &str)> {
        let name = self.acl.first()?.first()?;
        let password = self.acl.iter().flatten().filter_map(|w| w.strip_prefix('>')).next_back()?;
        Some((name, password))
    }
}

fn parse_args(mut args: impl Iterator<Item = String>) -> Result<Args, String> {
    let mut parsed =
        Args { nodes: 5, base_port: None, persistent: false, tls: false, acl: Vec::new() };
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
            "--tls" => parsed.tls = true,
            "--acl" => {
                let line: String = value(&mut args, &arg)?;
                let words: Vec<String> = line.split_whitespace().map(str::to_owned).collect();
                match (words.first(), parsed.acl.first().and_then(|l| l.first())) {
                    (None, _) => return Err("--acl needs a user name and rules".into()),
                    (Some(name), Some(first)) if name != first => {
                        return Err(format!("--acl lines name two users: {first}, {name}"));
                    }
                    _ => parsed.acl.push(words),
                }
            }
            other => return Err(format!("unknown argument {other:?}")),
        }
    }
    if let Some(base) = parsed.base_port {
        // The last port must fit in a u16 too.
        if usize::from(base) + parsed.nodes - 1 > usize::from(u16::MAX) || base == 0 {
            return Err(format!("--base-port {base} with {} nodes is out of range", parsed.nodes));
        }
    }
    if !parsed.acl.is_empty() && parsed.user().is_none() {
        return Err("--acl: no line gives the user a password (>PASSWORD)".into());
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
            if args.tls {
                config = config.tls(ClientCerts::NotAsked);
            }
            if let Some(base) = args.base_port {
                // Range checked in parse_args.
                config = config.port(base + i as u16);
            }
            let node = RedisNode::start_with(config)?;
            for line in &args.acl {
                let mut command = vec!["ACL", "SETUSER"];
                command.extend(line.iter().map(String::as_str));
                node.command(&command)?;
            }
            Ok(node)
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
    let urls: Vec<String> = match args.user() {
        Some((name, password)) => nodes.iter().map(|node| node.url_as(name, password)).collect(),
        None => nodes.iter().map(RedisNode::url).collect(),
    };
    for url in &urls {
        println!("{url}");
    }
    println!("REDLOCK_NODES={}", urls.join(","));
    if args.tls {
        match Certificates::get() {
            Ok(certificates) => println!("REDLOCK_TLS_CA={}", certificates.ca().path().display()),
            Err(e) => {
                eprintln!("redlock-cluster: {e}");
                return ExitCode::FAILURE;
            }
        }
    }
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
        assert_eq!((a.nodes, a.base_port, a.persistent, a.tls), (5, None, false, false));
        assert_eq!(a.user(), None);
        let a = parse(&["--nodes", "3", "--base-port", "7000", "--persistent", "--tls"]).unwrap();
        assert_eq!((a.nodes, a.base_port, a.persistent, a.tls), (3, Some(7000), true, true));
    }

    #[test]
    fn acl_lines_name_the_user_the_urls_log_in_as() {
        let a =
            parse(&["--acl", "locker on >s3cret ~app:* +get", "--acl", "locker +info"]).unwrap();
        assert_eq!(a.user(), Some(("locker", "s3cret")));
        assert_eq!(a.acl.len(), 2);
    }

    #[test]
    fn bad_args_are_rejected() {
        for bad in [
            &["--nodes"][..],
            &["--nodes", "x"],
            &["--nodes", "0"],
            &["--base-port", "65535", "--nodes", "2"],
            &["--what"],
            &["--acl", "locker on ~app:*"],
            &["--acl", "a on >x", "--acl", "b on >y"],
            &["--acl", " "],
        ] {
            assert!(parse(bad).is_err(), "{bad:?}");
        }
    }
}
