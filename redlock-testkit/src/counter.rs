//! A second, independent check of exclusion: a counter that loses updates
//! when critical sections overlap.

use std::{thread, time::Duration};

use crate::{commands, error::Result, node::RedisNode};

/// A shared counter on a Redis node (use one outside the lock's cluster),
/// incremented with a deliberately *non-atomic* `GET` then `SET`, with an
/// optional pause between. Increments made under a working lock all count;
/// overlapping critical sections lose updates, so a final value below the
/// number of increments proves a broken exclusion, whatever the clocks.
///
/// Sync API: call it from `spawn_blocking`, or accept a short blocking call.
/// Each call opens its own connection, so a `Counter` can be shared by threads.
#[derive(Clone, Debug)]
pub struct Counter {
    client: redis::Client,
    key: String,
}

impl Counter {
    /// A counter at `key` on `node`. The key is left as it is: a missing key
    /// counts as 0, and counters on the same key share the count.
    pub fn new(node: &RedisNode, key: &str) -> Result<Self> {
        Ok(Counter { client: node.client()?, key: key.to_owned() })
    }

    /// `GET`, sleep `pause`, `SET` to one more: not atomic, on purpose.
    pub fn increment(&self, pause: Duration) -> Result<()> {
        let mut con = self.connection()?;
        let value: Option<i64> = redis::cmd("GET").arg(&self.key).query(&mut con)?;
        if !pause.is_zero() {
            // Widens the window in which an overlapping increment is lost.
            thread::sleep(pause);
        }
        redis::cmd("SET").arg(&self.key).arg(value.unwrap_or(0) + 1).query::<()>(&mut con)?;
        Ok(())
    }

    /// The current count (0 if the key is missing).
    pub fn value(&self) -> Result<i64> {
        let value: Option<i64> = redis::cmd("GET").arg(&self.key).query(&mut self.connection()?)?;
        Ok(value.unwrap_or(0))
    }

    fn connection(&self) -> Result<redis::Connection> {
        commands::connect(&self.client)
    }
}
