//! Work of unknown length under a lock that keeps itself alive, stopped if the lock is lost.
//!
//! ```text
//! cargo run -p redlock-quorum --example with_lock
//! ```

use std::time::Duration;

use redlock::Redlock;
use redlock_testkit::Nodes;

#[tokio::main]
async fn main() -> Result<(), Box<dyn std::error::Error>> {
    let nodes = Nodes::from_env_or_start(3)?;
    // A short lease, so that the work below outlives it several times over.
    let rl = Redlock::builder().nodes(nodes.urls()).ttl(Duration::from_millis(600)).build()?;

    let report = rl
        .with_lock("nightly-report", |lease| async move {
            tokio::select! {
                rows = async {
                    tokio::time::sleep(Duration::from_secs(2)).await; // the job
                    1234
                } => Some(rows),
                _ = lease.lost() => None, // another client may be running it now: stop
            }
        })
        .await?; // Ok only if the lock was held from the grant until the work returned
    println!("report written under the lock: {report:?} rows (the lease was 600 ms)");

    rl.shutdown(Duration::from_secs(2)).await?;
    Ok(())
}
