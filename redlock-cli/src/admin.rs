//! `redlock inspect` and `redlock release --force`: what an operator needs by hand.

use std::collections::BTreeMap;
use std::time::Duration;

use redis::AsyncCommands;
use redis::aio::MultiplexedConnection;

use crate::EXIT_FAILURE;
use crate::config::Options;

#[derive(Debug, clap::Args)]
pub(crate) struct InspectArgs {
    /// The resource to look at.
    resource: String,
    /// One JSON object instead of lines of text.
    #[arg(long)]
    json: bool,
}

#[derive(Debug, clap::Args)]
pub(crate) struct ReleaseArgs {
    /// Delete the lock on every node whoever holds it, and wake its waiters. The holder's
    /// next extension fails, so a `redlock run` holding it stops its command.
    #[arg(long, required = true)]
    force: bool,
    /// Confirms the forced release (it can let two holders overlap).
    #[arg(long)]
    yes: bool,
    /// The resource to free.
    resource: String,
}

/// What one node says about a key.
#[derive(Debug)]
struct Seen {
    node: String,
    /// The holder: the token of a plain lock, the hold fields of a hash kind.
    holder: Option<String>,
    pttl: Option<i64>,
    error: Option<String>,
}

pub(crate) async fn inspect(options: &Options, args: InspectArgs) -> u8 {
    if options.nodes.is_empty() {
        eprintln!("redlock: no nodes: give --nodes or REDLOCK_NODES");
        return EXIT_FAILURE;
    }
    let key = options.key(&args.resource);
    let mut seen = Vec::new();
    for url in &options.nodes {
        let node = redact(url);
        let looked = match connect(url, options.node_timeout).await {
            Ok(mut con) => look(&mut con, &key, options.node_timeout).await,
            Err(err) => Err(err),
        };
        seen.push(match looked {
            Ok((holder, pttl)) => Seen { node, holder, pttl, error: None },
            Err(error) => Seen { node, holder: None, pttl: None, error: Some(error) },
        });
    }
    let quorum = options.nodes.len() / 2 + 1;
    let mut votes: BTreeMap<&str, usize> = BTreeMap::new();
    for holder in seen.iter().filter_map(|s| s.holder.as_deref()) {
        *votes.entry(holder).or_default() += 1;
    }
    let agreed = votes.iter().find(|(_, n)| **n >= quorum).map(|(holder, _)| *holder);
    if args.json {
        let nodes: Vec<String> = seen
            .iter()
            .map(|s| {
                format!(
                    "{{\"node\":{},\"holder\":{},\"pttl_ms\":{},\"error\":{}}}",
                    json(&s.node),
                    s.holder.as_deref().map_or("null".to_owned(), json),
                    s.pttl.map_or("null".to_owned(), |ms| ms.to_string()),
                    s.error.as_deref().map_or("null".to_owned(), json),
                )
            })
            .collect();
        println!(
            "{{\"resource\":{},\"key\":{},\"quorum\":{quorum},\"holder\":{},\"nodes\":[{}]}}",
            json(&args.resource),
            json(&key),
            agreed.map_or("null".to_owned(), json),
            nodes.join(",")
        );
    } else {
        for s in &seen {
            match (&s.error, &s.holder) {
                (Some(err), _) => println!("{}: unreachable: {err}", s.node),
                (None, None) => println!("{}: free", s.node),
                (None, Some(holder)) => {
                    println!("{}: {holder} (pttl {} ms)", s.node, s.pttl.unwrap_or(-1));
                }
            }
        }
        match agreed {
            Some(holder) => println!("held by {holder} on a quorum ({quorum} of {})", seen.len()),
            None => println!("no holder on a quorum ({quorum} of {})", seen.len()),
        }
    }
    0
}

pub(crate) async fn release(options: &Options, args: ReleaseArgs) -> u8 {
    if !args.yes {
        eprintln!(
            "redlock: a forced release frees the lock whoever holds it, and its holder may still \
             be running; add --yes to confirm"
        );
        return EXIT_FAILURE;
    }
    if options.nodes.is_empty() {
        eprintln!("redlock: no nodes: give --nodes or REDLOCK_NODES");
        return EXIT_FAILURE;
    }
    let key = options.key(&args.resource);
    let channel = format!("redlock:released:{key}");
    let mut done = 0;
    for url in &options.nodes {
        let node = redact(url);
        let outcome = match connect(url, options.node_timeout).await {
            Ok(mut con) => {
                let deleted = bounded(options.node_timeout, con.del::<_, i64>(&key)).await;
                // Waiters are woken; a refused notification only makes them poll.
                let _ =
                    bounded(options.node_timeout, con.publish::<_, _, i64>(&channel, "1")).await;
                deleted
            }
            Err(err) => Err(err),
        };
        match outcome {
            Ok(n) => {
                done += 1;
                println!("{node}: {}", if n > 0 { "deleted" } else { "was free" });
            }
            Err(err) => println!("{node}: failed: {err}"),
        }
    }
    let quorum = options.nodes.len() / 2 + 1;
    if done >= quorum {
        0
    } else {
        eprintln!("redlock: only {done} of {} nodes answered", options.nodes.len());
        EXIT_FAILURE
    }
}

pub(crate) async fn connect(url: &str, timeout: Duration) -> Result<MultiplexedConnection, String> {
    let client = redis::Client::open(url).map_err(|err| err.to_string())?;
    let connecting = client.get_multiplexed_async_connection();
    match tokio::time::timeout(timeout.max(Duration::from_secs(1)), connecting).await {
        Ok(Ok(con)) => Ok(con),
        Ok(Err(err)) => Err(err.to_string()),
        Err(_) => Err("timed out connecting".to_owned()),
    }
}

pub(crate) async fn bounded<T>(
    timeout: Duration,
    request: impl Future<Output = redis::RedisResult<T>>,
) -> Result<T, String> {
    match tokio::time::timeout(timeout, request).await {
        Ok(Ok(value)) => Ok(value),
        Ok(Err(err)) => Err(err.to_string()),
        Err(_) => Err(format!("no answer within {timeout:?}")),
    }
}

/// The holder and the remaining lease of `key` on one node.
async fn look(
    con: &mut MultiplexedConnection,
    key: &str,
    timeout: Duration,
) -> Result<(Option<String>, Option<i64>), String> {
    let kind: String = bounded(timeout, redis::cmd("TYPE").arg(key).query_async(con)).await?;
    let holder = match kind.as_str() {
        "none" => return Ok((None, None)),
        "string" => bounded(timeout, con.get::<_, Option<String>>(key)).await?,
        "hash" => {
            let fields: Vec<String> = bounded(timeout, con.hkeys(key)).await?;
            Some(fields.join(" "))
        }
        other => Some(format!("a {other}, not a lock")),
    };
    let pttl: i64 = bounded(timeout, con.pttl(key)).await?;
    Ok((holder, Some(pttl)))
}

/// A node's URL without its password.
pub(crate) fn redact(url: &str) -> String {
    let Some((scheme, rest)) = url.split_once("://") else { return url.to_owned() };
    match rest.rsplit_once('@') {
        Some((userinfo, host)) => {
            let user = userinfo.split_once(':').map_or("", |(user, _)| user);
            format!("{scheme}://{user}:***@{host}")
        }
        None => url.to_owned(),
    }
}

/// A JSON string.
fn json(text: &str) -> String {
    let mut out = String::with_capacity(text.len() + 2);
    out.push('"');
    for c in text.chars() {
        match c {
            '"' => out.push_str("\\\""),
            '\\' => out.push_str("\\\\"),
            c if (c as u32) < 0x20 => out.push_str(&format!("\\u{:04x}", c as u32)),
            c => out.push(c),
        }
    }
    out.push('"');
    out
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn passwords_are_never_shown() {
        assert_eq!(redact("redis://u:secret@h:1/0"), "redis://u:***@h:1/0");
        assert_eq!(redact("redis://:secret@h:1"), "redis://:***@h:1");
        assert_eq!(redact("redis://h:1"), "redis://h:1");
    }

    #[test]
    fn json_strings_are_escaped() {
        assert_eq!(json("a\"b\\c\n"), "\"a\\\"b\\\\c\\u000a\"");
    }
}
