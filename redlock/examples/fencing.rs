//! Fencing tokens: each grant's token is larger than every earlier grant's, and the protected
//! resource rejects a write that carries an older one.
//!
//! ```text
//! cargo run -p redlock-quorum --example fencing
//! ```

use std::time::Duration;

use redlock::Redlock;
use redlock::fence::{FencedWrite, fenced_set};
use redlock_testkit::{Nodes, RedisNode};

#[tokio::main]
async fn main() -> Result<(), Box<dyn std::error::Error>> {
    let nodes = Nodes::from_env_or_start(3)?;
    let rl = Redlock::builder().nodes(nodes.urls()).ttl(Duration::from_secs(5)).build()?;
    // The protected resource: a Redis that is not one of the lock's masters (here a local
    // one), reached through the redis-rs version the library re-exports, so that the
    // connection is the one `fenced_set` takes.
    let storage = RedisNode::start()?;
    let mut store =
        redlock::redis::Client::open(storage.url())?.get_multiplexed_async_connection().await?;

    let first = rl.lock("invoice:7").fenced().await?;
    // `Some` for a lock taken `.fenced()`: a forgotten `.fenced()` fails here, loudly.
    let stale = first.fencing_token().expect("taken .fenced()");
    first.release().await?;

    let second = rl.lock("invoice:7").fenced().await?;
    let current = second.fencing_token().expect("taken .fenced()");
    println!("tokens: first grant {stale}, second grant {current}");

    let written = fenced_set(&mut store, "invoice:7", b"paid", current).await?;
    // The first holder, paused past its lease, wakes up and writes with its old token.
    let late = fenced_set(&mut store, "invoice:7", b"draft", stale).await?;
    println!("current holder's write: {written:?}; stale holder's write: {late:?}");
    assert_eq!((written, late), (FencedWrite::Written, FencedWrite::Rejected));
    second.release().await?;

    rl.shutdown(Duration::from_secs(2)).await?;
    Ok(())
}
