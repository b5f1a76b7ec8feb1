//! `redlock inspect` and `redlock release --force`: what an operator needs by hand.

use std::time::Duration;

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
    /// RESOURCE is a counting lock of N permits (`redlock run --permits N`): show each
    /// permit's slot and holder.
    #[arg(long, value_parser = clap::value_parser!(u32).range(1..))]
    permits: Option<u32>,
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

pub(crate) async fn inspect(options: &Options, args: InspectArgs) -> u8 {
    let rl = match options.client() {
        Ok(rl) => rl,
        Err(err) => {
            eprintln!("redlock: {err}");
            return EXIT_FAILURE;
        }
    };
    // Every node at once first (see `run`); what failed, the inspection reports.
    let _ = rl.connect().await;
    if let Some(permits) = args.permits {
        return inspect_permits(&rl, &args, permits).await;
    }
    let seen = match rl.inspect(&args.resource).await {
        Ok(seen) => seen,
        Err(err) => {
            eprintln!("redlock: {err}");
            return EXIT_FAILURE;
        }
    };
    let quorum = rl.quorum();
    let verdict = Verdict::of(&seen, quorum);
    let ms = |ttl: Option<std::time::Duration>| ttl.map(|ttl| ttl.as_millis());
    if args.json {
        let nodes: Vec<String> = seen
            .nodes
            .iter()
            .map(|view| {
                format!(
                    "{{\"node\":{},\"holder\":{},\"pttl_ms\":{},\"error\":{}}}",
                    json(&view.node),
                    view.holder.as_deref().map_or("null".to_owned(), json),
                    ms(view.ttl).map_or("null".to_owned(), |ms| ms.to_string()),
                    view.error.as_deref().map_or("null".to_owned(), json),
                )
            })
            .collect();
        println!(
            "{{\"resource\":{},\"key\":{},\"quorum\":{quorum},\"holder\":{},\"settled\":{},\"nodes\":[{}]}}",
            json(&args.resource),
            json(&seen.key),
            seen.holder.as_deref().map_or("null".to_owned(), json),
            verdict == Verdict::Settled,
            nodes.join(",")
        );
    } else {
        for view in &seen.nodes {
            match (&view.error, &view.holder) {
                (Some(err), _) if denied(err) => {
                    println!("{}: permission denied: {err}", view.node)
                }
                (Some(err), _) => println!("{}: not answered: {err}", view.node),
                (None, None) => println!("{}: free", view.node),
                (None, Some(holder)) => {
                    let pttl = ms(view.ttl).map_or("none".to_owned(), |ms| ms.to_string());
                    println!("{}: {holder} (pttl {pttl} ms)", view.node);
                }
            }
        }
        let n = seen.nodes.len();
        // How many nodes said so, not the quorum alone: "a quorum" read as all of them.
        let on = |holder: Option<&str>| {
            seen.nodes.iter().filter(|v| v.error.is_none() && v.holder.as_deref() == holder).count()
        };
        match (&seen.holder, verdict) {
            (Some(holder), _) => {
                let holding = on(Some(holder));
                println!("held by {holder} on {holding} of {n} nodes (quorum {quorum})")
            }
            (None, Verdict::Settled) => {
                let free = on(None);
                println!("no holder on a quorum: free on {free} of {n} nodes (quorum {quorum})")
            }
            (None, Verdict::Unknown) => println!(
                "unknown: too few nodes answered to tell whether a quorum ({quorum} of {n}) holds it"
            ),
            (None, Verdict::Denied) => {
                println!("unknown: a node refused the user: see the README's ACL rules")
            }
        }
    }
    shut_down(&rl).await;
    match verdict {
        Verdict::Settled => 0,
        Verdict::Unknown | Verdict::Denied => EXIT_FAILURE,
    }
}

/// `redlock inspect --permits N`: each slot's holder on a quorum, and its nodes' views.
async fn inspect_permits(rl: &redlock::Redlock, args: &InspectArgs, permits: u32) -> u8 {
    let slots = match rl.inspect_permits(&args.resource, permits).await {
        Ok(slots) => slots,
        Err(err) => {
            eprintln!("redlock: {err}");
            shut_down(rl).await;
            return EXIT_FAILURE;
        }
    };
    let quorum = rl.quorum();
    let verdicts: Vec<Verdict> = slots.iter().map(|seen| Verdict::of(seen, quorum)).collect();
    let ms = |ttl: Option<std::time::Duration>| ttl.map(|ttl| ttl.as_millis());
    let held = slots.iter().filter(|seen| seen.holder.is_some()).count();
    if args.json {
        let slots: Vec<String> = (slots.iter().zip(&verdicts).enumerate())
            .map(|(slot, (seen, verdict))| {
                let nodes: Vec<String> = (seen.nodes.iter())
                    .map(|view| {
                        format!(
                            "{{\"node\":{},\"holder\":{},\"pttl_ms\":{},\"error\":{}}}",
                            json(&view.node),
                            view.holder.as_deref().map_or("null".to_owned(), json),
                            ms(view.ttl).map_or("null".to_owned(), |ms| ms.to_string()),
                            view.error.as_deref().map_or("null".to_owned(), json),
                        )
                    })
                    .collect();
                format!(
                    "{{\"slot\":{slot},\"key\":{},\"holder\":{},\"settled\":{},\"nodes\":[{}]}}",
                    json(&seen.key),
                    seen.holder.as_deref().map_or("null".to_owned(), json),
                    *verdict == Verdict::Settled,
                    nodes.join(",")
                )
            })
            .collect();
        println!(
            "{{\"resource\":{},\"permits\":{permits},\"held\":{held},\"quorum\":{quorum},\"slots\":[{}]}}",
            json(&args.resource),
            slots.join(",")
        );
    } else {
        for (slot, (seen, verdict)) in slots.iter().zip(&verdicts).enumerate() {
            let state = match (&seen.holder, verdict) {
                (Some(holder), _) => format!("held by {holder}"),
                (None, Verdict::Settled) => "free".to_owned(),
                (None, Verdict::Unknown) => "unknown (too few nodes answered)".to_owned(),
                (None, Verdict::Denied) => "unknown (a node refused the user)".to_owned(),
            };
            println!("permit {slot} ({}): {state}", seen.key);
            for view in &seen.nodes {
                match (&view.error, &view.holder) {
                    (Some(err), _) => println!("  {}: not answered: {err}", view.node),
                    (None, None) => println!("  {}: free", view.node),
                    (None, Some(holder)) => {
                        let pttl = ms(view.ttl).map_or("none".to_owned(), |ms| ms.to_string());
                        println!("  {}: {holder} (pttl {pttl} ms)", view.node);
                    }
                }
            }
        }
        println!("{held} of {permits} permits held on a quorum ({quorum} of {})", rl.node_count());
    }
    shut_down(rl).await;
    if verdicts.iter().all(|verdict| *verdict == Verdict::Settled) { 0 } else { EXIT_FAILURE }
}

/// Whether an inspection answers the question "who holds it on a quorum".
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
enum Verdict {
    /// A holder on a quorum, or none possible: the nodes that did not answer could not
    /// make up a quorum for anyone with those that did.
    Settled,
    /// Too few nodes answered to tell.
    Unknown,
    /// A node refused the user (`NOPERM`, `WRONGPASS`): the ACL rules or the login need
    /// fixing, whatever the others said, and an operator must not read that as a free lock.
    Denied,
}

impl Verdict {
    fn of(seen: &redlock::Inspection, quorum: usize) -> Self {
        if seen.nodes.iter().any(|view| view.error.as_deref().is_some_and(denied)) {
            return Self::Denied;
        }
        if seen.holder.is_some() {
            return Self::Settled;
        }
        let silent = seen.nodes.iter().filter(|view| view.error.is_some()).count();
        // The holder seen on most nodes, plus every node that did not answer.
        let most = seen
            .nodes
            .iter()
            .filter_map(|view| view.holder.as_deref())
            .map(|holder| seen.nodes.iter().filter(|v| v.holder.as_deref() == Some(holder)).count())
            .max()
            .unwrap_or(0);
        if silent > 0 && most + silent >= quorum { Self::Unknown } else { Self::Settled }
    }
}

/// A node's refusal of the user (a missing ACL rule, a refused login), as opposed to a node
/// that could not be asked.
pub(crate) fn denied(error: &str) -> bool {
    // redis-rs spells the codes of its own connections' errors `NoPerm`, `WrongPass`; the
    // library's refusals of the client read `denied: ...` (a login, a certificate).
    let error = error.to_ascii_uppercase();
    ["NOPERM", "WRONGPASS", "NOAUTH"].iter().any(|code| error.contains(code))
        || error.starts_with("DENIED: ")
}

pub(crate) async fn release(options: &Options, args: ReleaseArgs) -> u8 {
    if !args.yes {
        eprintln!(
            "redlock: a forced release frees the lock whoever holds it, and its holder may still \
             be running; add --yes to confirm"
        );
        return EXIT_FAILURE;
    }
    let rl = match options.client() {
        Ok(rl) => rl,
        Err(err) => {
            eprintln!("redlock: {err}");
            return EXIT_FAILURE;
        }
    };
    // Every node at once first (see `run`); what failed, the release reports.
    let _ = rl.connect().await;
    let code = match rl.force_release(&args.resource).await {
        Ok(answered) => {
            println!("{}: released on {answered} of {} nodes", args.resource, rl.node_count());
            0
        }
        Err(err) => {
            eprintln!("redlock: {err}");
            EXIT_FAILURE
        }
    };
    shut_down(&rl).await;
    code
}

async fn shut_down(rl: &redlock::Redlock) {
    match rl.shutdown(std::time::Duration::from_secs(2)).await {
        Ok(report) if !report.is_clean() => eprintln!("redlock: shutdown: {report}"),
        Ok(_) => {}
        Err(err) => eprintln!("redlock: shutdown: {err}"),
    }
}

pub(crate) async fn connect(options: &Options, url: &str) -> Result<MultiplexedConnection, String> {
    let timeout = options.node_timeout;
    let client = options.redis_client(url)?;
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
