//! `redlock run --once-per`: the mark a window's successful run leaves on the nodes, read
//! back by the runs of that window that wait for the lock.
//!
//! The lock kept until the window's end says "held", not "done": a waiting run cannot tell
//! it from a run still in progress, and would wait out its `--wait`. So the run whose
//! command succeeded also sets, on every node, a mark for its window (a key under the
//! lock's key, so under the key prefix, named for the window and expiring at its end), and
//! a waiting run that reads it on a quorum of nodes stops waiting. A mark is only ever set
//! after the command of its own window succeeded, and a window's mark is never read for
//! another window (the previous window's may outlive it by the clock skew, under another
//! name), so a mark never makes a run skip a window whose job did not succeed.

use std::time::Duration;

use redis::aio::MultiplexedConnection;

use crate::config::Options;
use crate::once::Window;

/// How often a waiting run reads the marks: a finished job is seen within about this long.
pub(crate) const POLL: Duration = Duration::from_millis(500);

/// What every mark's value begins with: a key of that name that holds anything else (a
/// user's lock of a resource that happens to have the name) is not a mark.
const VALUE: &str = "done by ";

/// The marks of one resource's window, on every node.
pub(crate) struct Marks {
    key: String,
    nodes: Vec<Node>,
    /// How long one node may take to connect, and to answer once connected.
    connect_timeout: Duration,
    node_timeout: Duration,
}

struct Node {
    /// `None` when the URL gives no client: that node never counts.
    client: Option<redis::Client>,
    /// Opened at first use, and again after a failure.
    connection: Option<MultiplexedConnection>,
}

/// How many nodes said a window's job is done, of how many.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub(crate) struct Seen {
    pub(crate) done: usize,
    pub(crate) of: usize,
}

impl Marks {
    /// The marks of `resource`'s `window` on the nodes of `options`; nothing is sent yet.
    pub(crate) fn new(options: &Options, resource: &str, window: Window) -> Self {
        let nodes = (options.nodes.iter())
            .map(|url| Node { client: options.redis_client(url.trim()).ok(), connection: None })
            .collect();
        Self {
            key: key(&options.key_prefix, resource, window),
            nodes,
            connect_timeout: options.node_timeout.max(Duration::from_secs(1)),
            node_timeout: options.node_timeout,
        }
    }

    /// Marks the window's job done by `token` on every node, until `left` from now (the
    /// window's end). Returns on how many nodes the mark was set.
    pub(crate) async fn mark(&mut self, token: &str, left: Duration) -> Seen {
        let millis = u64::try_from(left.as_millis()).unwrap_or(u64::MAX);
        if millis == 0 {
            return Seen { done: 0, of: self.nodes.len() };
        }
        let mut command = redis::cmd("SET");
        // NX: never over another key of that name; this window's mark is set once anyway.
        command.arg(&self.key).arg(format!("{VALUE}{token}")).arg("NX").arg("PX").arg(millis);
        let set = self.on_every_node(&command, |reply| matches!(reply, redis::Value::Okay)).await;
        Seen { done: set, of: self.nodes.len() }
    }

    /// How many nodes hold the window's mark.
    pub(crate) async fn read(&mut self) -> Seen {
        let mut command = redis::cmd("GET");
        command.arg(&self.key);
        let done = self.on_every_node(&command, is_mark).await;
        Seen { done, of: self.nodes.len() }
    }

    /// Sends `command` to every node at once, each within the timeouts; counts the nodes
    /// whose reply passes `counts`. A node that fails counts as not, and is connected to
    /// again next time.
    async fn on_every_node(
        &mut self,
        command: &redis::Cmd,
        counts: fn(&redis::Value) -> bool,
    ) -> usize {
        let (connect_timeout, node_timeout) = (self.connect_timeout, self.node_timeout);
        let asks = self.nodes.iter_mut().map(|node| async move {
            let Some(client) = &node.client else { return false };
            let mut connection = match node.connection.take() {
                Some(connection) => connection,
                None => {
                    let connecting = client.get_multiplexed_async_connection();
                    match tokio::time::timeout(connect_timeout, connecting).await {
                        Ok(Ok(connection)) => connection,
                        _ => return false,
                    }
                }
            };
            let sent = command.query_async::<redis::Value>(&mut connection);
            match tokio::time::timeout(node_timeout, sent).await {
                Ok(Ok(reply)) => {
                    node.connection = Some(connection);
                    counts(&reply)
                }
                // After a timeout or an error the connection may be broken: a new one next.
                _ => false,
            }
        });
        futures::future::join_all(asks).await.into_iter().filter(|&counted| counted).count()
    }
}

/// The mark's key: under the lock's own key (so under the prefix, which the ACL rules
/// name), and named for the window's end, the same on every machine whose clock puts the
/// run in that window.
fn key(prefix: &str, resource: &str, window: Window) -> String {
    format!("{prefix}{resource}:redlock-done:{}", window.end_millis())
}

/// Whether a node's reply to `GET` is a mark.
fn is_mark(reply: &redis::Value) -> bool {
    match reply {
        redis::Value::BulkString(bytes) => bytes.starts_with(VALUE.as_bytes()),
        _ => false,
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::time::SystemTime;

    #[test]
    fn a_windows_mark_is_under_the_prefix_and_named_for_the_windows_end() {
        let at = SystemTime::UNIX_EPOCH + Duration::from_secs(86_400 + 7200);
        let window = Window::of(Duration::from_secs(86_400), at);
        assert_eq!(key("app:", "draw", window), "app:draw:redlock-done:172798000");
        let next = Window::of(Duration::from_secs(86_400), at + Duration::from_secs(86_400));
        assert_ne!(key("app:", "draw", window), key("app:", "draw", next));
    }

    #[test]
    fn only_a_value_written_as_a_mark_is_one() {
        assert!(is_mark(&redis::Value::BulkString(b"done by 1234.host/1".to_vec())));
        assert!(!is_mark(&redis::Value::BulkString(b"1234.host/1".to_vec())));
        assert!(!is_mark(&redis::Value::Nil));
        assert!(!is_mark(&redis::Value::Okay));
    }
}
