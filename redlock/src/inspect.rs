//! Operators' calls: what the nodes hold for a resource, and freeing it by hand.

use std::time::Duration;

use redis::Value;

use crate::client::Redlock;
use crate::command::{self, Command, Resend};
use crate::error::{Error, ErrorKind, Result};

/// What one node holds for a resource.
#[derive(Clone, Debug, PartialEq, Eq)]
#[non_exhaustive]
pub struct NodeView {
    /// The node, as `host:port/db` (never a password).
    pub node: String,
    /// The holder: a plain or multi-resource lock's token, or a hash kind's hold fields
    /// (`h:<token>:<owner>`, `r:<token>`, `w:<token>`, `i:<id>`) joined by spaces; `None`
    /// when the node holds nothing.
    pub holder: Option<String>,
    /// What remains of the key's lease on the node; `None` when it holds nothing.
    pub ttl: Option<Duration>,
    /// Why the node could not be asked.
    pub error: Option<String>,
}

/// A resource as the nodes see it: advisory (it is only what they said at that moment).
#[derive(Clone, Debug, PartialEq, Eq)]
#[non_exhaustive]
pub struct Inspection {
    /// The key of the resource.
    pub key: String,
    /// Each node's view, in the order of the builder's nodes.
    pub nodes: Vec<NodeView>,
    /// The holder a quorum of nodes agrees on, if any.
    pub holder: Option<String>,
}

impl Redlock {
    /// Asks every node what it holds for `resource`: the holder and the remaining lease per
    /// node, and the holder a quorum agrees on. Read-only and advisory: the answer may be
    /// stale by the time it is read.
    ///
    /// # Errors
    /// [`ErrorKind::Config`] for an invalid resource name. Nodes that cannot be asked are
    /// reported in their [`NodeView::error`], not as an error.
    pub async fn inspect(&self, resource: &str) -> Result<Inspection> {
        let key = self.core.config.key(resource)?;
        let command = Command::script(&command::INSPECT, &[&*key], &[] as &[&[u8]], Resend::Safe);
        let mut nodes = Vec::with_capacity(self.core.nodes.len());
        for node in self.core.nodes.iter() {
            let sent = tokio::time::timeout(self.core.config.node_timeout, node.send(&command));
            let view = match sent.await {
                Err(_) => Err("timed out".to_owned()),
                Ok(reply) => match reply.value {
                    Ok(value) => read_view(&value),
                    Err(failure) => Err(failure.outcome().to_string()),
                },
            };
            nodes.push(match view {
                Ok((holder, ttl)) => {
                    NodeView { node: node.name().to_string(), holder, ttl, error: None }
                }
                Err(error) => NodeView {
                    node: node.name().to_string(),
                    holder: None,
                    ttl: None,
                    error: Some(error),
                },
            });
        }
        let quorum = self.quorum();
        let holder = nodes
            .iter()
            .filter_map(|view| view.holder.as_deref())
            .find(|holder| {
                nodes.iter().filter(|v| v.holder.as_deref() == Some(*holder)).count() >= quorum
            })
            .map(str::to_owned);
        Ok(Inspection { key: key.to_string(), nodes, holder })
    }

    /// Deletes `resource`'s lock on every node whoever holds it, and wakes its waiters: an
    /// administrator's last resort for a lock whose holder is known to be gone. The holder,
    /// if it still runs, fails its next extension (its [`Lease`](crate::Lease) reports the
    /// loss); until then two holders may overlap. Returns how many nodes answered.
    ///
    /// The delete is sent at most once per node, never again whatever happens to its
    /// connection: on a connection opened for it, or on one that has just answered a `PING`
    /// (a closed one is replaced first). So each node is given twice the node timeout, and a
    /// hung node never runs the delete late, when someone else may hold the lock.
    ///
    /// # Errors
    /// [`ErrorKind::Config`] for an invalid resource name; [`ErrorKind::Unavailable`] when
    /// fewer than a quorum of nodes answered (the others may still hold the key until it
    /// expires).
    pub async fn force_release(&self, resource: &str) -> Result<usize> {
        let key = self.core.config.key(resource)?;
        let channel = crate::engine::channel(&key);
        // Never re-sent: an unconditional delete that ran before its connection dropped
        // would, sent again, delete the hold of whoever took the lock in between.
        let command = Command::script(
            &command::FORCE_RELEASE,
            &[&*key],
            &[channel.as_bytes()],
            Resend::Never,
        );
        let mut answered = 0;
        for node in self.core.nodes.iter() {
            // Two round trips: the `PING` and the delete.
            let sent = tokio::time::timeout(self.core.config.node_timeout * 2, node.send(&command));
            if let Ok(reply) = sent.await
                && reply.value.is_ok()
            {
                answered += 1;
            }
        }
        if answered >= self.quorum() {
            tracing::warn!(target: "redlock", resource, answered, "lock released by force");
            Ok(answered)
        } else {
            Err(Error::local(
                ErrorKind::Unavailable,
                format!(
                    "only {answered} of {} nodes answered the forced release",
                    self.core.nodes.len()
                ),
                resource,
            ))
        }
    }
}

/// A node's `{type, holder, pttl}`.
fn read_view(value: &Value) -> std::result::Result<(Option<String>, Option<Duration>), String> {
    let text = |v: &Value| redis::from_redis_value::<String>(v.clone()).map_err(|e| e.to_string());
    match value {
        Value::Array(items) if items.len() == 3 => {
            let kind = text(&items[0])?;
            if kind == "none" {
                return Ok((None, None));
            }
            let holder = text(&items[1])?;
            let pttl =
                redis::from_redis_value::<i64>(items[2].clone()).map_err(|e| e.to_string())?;
            let ttl = u64::try_from(pttl).ok().map(Duration::from_millis);
            let holder = match kind.as_str() {
                "string" | "hash" => holder,
                other => format!("a {other}, not a lock"),
            };
            Ok((Some(holder), ttl))
        }
        other => Err(format!("unexpected reply {other:?}")),
    }
}
