//! The plain lock: take it, see a second client refused, release it.
//!
//! ```text
//! cargo run -p redlock-quorum --example basic            # embedded three-node cluster
//! REDLOCK_NODES=redis://host1:6379,... cargo run -p redlock-quorum --example basic
//! ```

use std::time::Duration;

use redlock::{ErrorKind, Redlock};
use redlock_testkit::Nodes;

#[tokio::main]
async fn main() -> Result<(), Box<dyn std::error::Error>> {
    let nodes = Nodes::from_env_or_start(3)?;
    let rl = Redlock::builder().nodes(nodes.urls()).ttl(Duration::from_secs(10)).build()?;

    let lock = rl.lock("orders:42").await?;
    println!("holding {} for {:?} (token {})", lock.resource(), lock.validity(), lock.token());

    // A single attempt while the lock is held: refused, and the error says why.
    let other = Redlock::builder().nodes(nodes.urls()).build()?;
    match other.try_lock("orders:42").await {
        Err(err) if err.kind() == ErrorKind::NotAcquired => println!("second client: {err}"),
        Err(err) => return Err(err.into()),
        Ok(_) => return Err("two holders at once".into()),
    }

    lock.release().await?;
    other.try_lock("orders:42").await?.release().await?;
    println!("released; the second client got it next");

    other.shutdown(Duration::from_secs(2)).await?;
    rl.shutdown(Duration::from_secs(2)).await?;
    Ok(())
}
