//! Several clients contend for one lock over five Redis masters; then a node dies and the
//! lock is still granted by the quorum.
//!
//! ```text
//! cargo run -p redlock-quorum --example demo                      # embedded five-node cluster
//! REDLOCK_NODES=redis://127.0.0.1:7001,... cargo run -p redlock-quorum --example demo
//! ```

use std::time::{Duration, Instant};

use redlock::{Redlock, Retry};
use redlock_testkit::Nodes;

const CLIENTS: usize = 4;
const TURNS: usize = 3;
const RESOURCE: &str = "demo:nightly-report";

#[tokio::main]
async fn main() -> Result<(), Box<dyn std::error::Error>> {
    let mut nodes = Nodes::from_env_or_start(5)?;
    if nodes.is_local() {
        println!("REDLOCK_NODES is not set: started an embedded five-node cluster");
    }
    let urls = nodes.urls();
    for url in &urls {
        println!("  node {url}");
    }
    // Nodes given by REDLOCK_NODES (containers, a network) get more than the local 50 ms:
    // a release that misses its quorum there would only say that the nodes are slow. A
    // second: the compose masters fsync every write, and right after a large build their
    // disk took over 200 ms (a release timed out on all five).
    let node_timeout = Duration::from_millis(if nodes.is_local() { 50 } else { 1000 });

    let client = |ttl: Duration| {
        Redlock::builder()
            .nodes(urls.iter().cloned())
            .ttl(ttl)
            .node_timeout(node_timeout)
            .retry(
                Retry::new()
                    .with_unbounded_attempts()
                    .with_delay(Duration::from_millis(5))
                    .with_jitter(Duration::from_millis(20))
                    .with_max_wait(Duration::from_secs(30)),
            )
            .build()
    };

    println!("\n{CLIENTS} clients, {TURNS} turns each, one resource `{RESOURCE}`:");
    let started = Instant::now();
    let mut tasks = Vec::new();
    for id in 1..=CLIENTS {
        let rl = client(Duration::from_secs(10))?;
        tasks.push(tokio::spawn(async move {
            for _ in 0..TURNS {
                let lock = rl.lock(RESOURCE).await?;
                println!(
                    "  [{:>7}] client {id} holds the lock (token {}…, valid for {})",
                    humantime::format_duration(round_ms(started.elapsed())).to_string(),
                    &lock.token()[..8],
                    humantime::format_duration(round_ms(lock.validity())),
                );
                tokio::time::sleep(Duration::from_millis(30)).await;
                lock.release().await?;
                // Step back for a moment, so that the others get their turn.
                tokio::time::sleep(Duration::from_millis(40)).await;
            }
            Ok::<_, redlock::Error>(())
        }));
    }
    for task in tasks {
        task.await??;
    }

    let rl = client(Duration::from_secs(10))?;
    let lock = rl.try_lock(RESOURCE).await?;
    let other = client(Duration::from_secs(10))?;
    match other.try_lock(RESOURCE).await {
        Ok(_) => println!("\nBUG: a second client got the lock"),
        Err(err) => println!("\nWhile client A holds it, client B is refused:\n  {err}"),
    }
    lock.release().await?;

    match nodes.cluster_mut() {
        Some(cluster) => {
            cluster.node_mut(2).kill()?;
            println!(
                "\nKilled node {}; {} of 5 remain (quorum {}).",
                cluster.node(2).url(),
                4,
                rl.quorum()
            );
            let lock = rl.try_lock(RESOURCE).await?;
            println!(
                "Lock still granted by quorum: held on nodes {:?}, valid for {}",
                cluster.nodes_holding(RESOURCE, lock.token()),
                humantime::format_duration(round_ms(lock.validity())),
            );
            lock.release().await?;
            cluster.node_mut(3).kill()?;
            cluster.node_mut(4).kill()?;
            println!("\nKilled two more nodes: 2 of 5 remain, below the quorum.");
            match rl.try_lock(RESOURCE).await {
                Ok(_) => println!("BUG: granted without a quorum"),
                Err(err) => println!("Refused, as it must be:\n  {err}"),
            }
        }
        None => println!(
            "\n(External nodes: stop one of them and run again to see the quorum at work.)"
        ),
    }
    Ok(())
}

fn round_ms(d: Duration) -> Duration {
    Duration::from_millis(d.as_millis() as u64)
}
