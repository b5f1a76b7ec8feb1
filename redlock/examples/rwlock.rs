//! The read-write lock: readers share, a writer waits for them and keeps new readers out.
//!
//! ```text
//! cargo run -p redlock-quorum --example rwlock
//! ```

use std::time::Duration;

use redlock::{ErrorKind, Redlock};
use redlock_testkit::Nodes;

#[tokio::main]
async fn main() -> Result<(), Box<dyn std::error::Error>> {
    let nodes = Nodes::from_env_or_start(3)?;
    let rl = Redlock::builder().nodes(nodes.urls()).ttl(Duration::from_secs(5)).build()?;

    let first = rl.read("catalog").await?;
    let second = rl.read("catalog").await?;
    println!("two readers share the lock");

    // A writer waits (per the retry policy) until the shares are gone.
    let writer = tokio::spawn({
        let rl = rl.clone();
        async move { rl.write("catalog").await }
    });
    tokio::time::sleep(Duration::from_millis(100)).await;
    // While it waits, its intent keeps new readers out.
    let refused = rl.read("catalog").once().await.expect_err("a waiting writer goes first");
    assert_eq!(refused.kind(), ErrorKind::NotAcquired);
    println!("a new reader waits behind the writer: {refused}");

    first.release().await?;
    second.release().await?;
    let write = writer.await??;
    println!("the writer got the lock once both readers released");
    write.release().await?;

    rl.shutdown(Duration::from_secs(2)).await?;
    Ok(())
}
