//! Operators' calls: what the nodes hold for a resource, and freeing it by hand.

use std::time::Duration;

use redis::Value;

use crate::client::Redlock;
use crate::command::{self, Command, Resend};
use crate::error::{Error, ErrorKind, Result};
use crate::node::{Connected, Reply};

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
    /// How many nodes a quorum has.
    pub quorum: usize,
}

/// One line for the resource (`app:orders: held by <token> on 5 of 5 nodes (quorum 3)`),
/// then one per node: what it holds and for how long, or why it could not be asked.
impl std::fmt::Display for Inspection {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        let n = self.nodes.len();
        let (quorum, key) = (self.quorum, &self.key);
        match &self.holder {
            Some(holder) => {
                let on = self.nodes.iter().filter(|v| v.holder.as_deref() == Some(holder)).count();
                write!(f, "{key}: held by {holder} on {on} of {n} nodes (quorum {quorum})")?;
            }
            None => {
                let free = self.nodes.iter().filter(|v| v.holder.is_none() && v.error.is_none());
                let free = free.count();
                write!(
                    f,
                    "{key}: no holder on a quorum; {free} of {n} nodes hold nothing (quorum {quorum})"
                )?;
            }
        }
        for view in &self.nodes {
            match (&view.error, &view.holder, view.ttl) {
                (Some(error), _, _) => write!(f, "\n  {}: not asked: {error}", view.node)?,
                (None, Some(holder), Some(ttl)) => {
                    write!(f, "\n  {}: {holder}, {} ms left", view.node, ttl.as_millis())?;
                }
                (None, Some(holder), None) => write!(f, "\n  {}: {holder}", view.node)?,
                (None, None, _) => write!(f, "\n  {}: nothing", view.node)?,
            }
        }
        Ok(())
    }
}

impl Redlock {
    /// Asks every node what it holds for `resource`: the holder and the remaining lease per
    /// node, and the holder a quorum agrees on. Read-only and advisory: the answer may be
    /// stale by the time it is read. Every node is asked at once, each within the node
    /// timeout.
    ///
    /// # Errors
    /// [`ErrorKind::Config`] for an invalid resource name. Nodes that cannot be asked are
    /// reported in their [`NodeView::error`], not as an error.
    pub async fn inspect(&self, resource: &str) -> Result<Inspection> {
        let key = self.core.config.key(resource)?;
        Ok(self.inspect_key(&key).await)
    }

    /// Asks every node what it holds for each of the `permits` slots of the counting lock
    /// `resource` ([`Redlock::semaphore`]): one [`Inspection`] per slot, in slot order
    /// (`Inspection::holder` is that permit's holder, if a quorum agrees). Read-only and
    /// advisory, as [`inspect`](Redlock::inspect); every slot is asked at once.
    ///
    /// # Errors
    /// [`ErrorKind::Config`] for an invalid resource name or `permits == 0`.
    pub async fn inspect_permits(&self, resource: &str, permits: u32) -> Result<Vec<Inspection>> {
        let layout = crate::kinds::semaphore::Permits::new(&self.core.config, resource, permits)?;
        let slots = (0..permits).map(|slot| layout.slot_key(slot)).collect::<Vec<_>>();
        Ok(futures::future::join_all(slots.iter().map(|key| self.inspect_key(key))).await)
    }

    /// Every node's view of `key`, and the holder a quorum agrees on.
    async fn inspect_key(&self, key: &str) -> Inspection {
        let views = self.read_views(key).await;
        let nodes: Vec<NodeView> = (self.core.nodes.iter().zip(views))
            .map(|(node, view)| match view {
                Ok(view) => NodeView {
                    node: node.name().to_string(),
                    holder: view.holder,
                    ttl: view.ttl,
                    error: None,
                },
                Err(error) => NodeView {
                    node: node.name().to_string(),
                    holder: None,
                    ttl: None,
                    error: Some(error),
                },
            })
            .collect();
        let quorum = self.quorum();
        let holder = nodes
            .iter()
            .filter_map(|view| view.holder.as_deref())
            .find(|holder| {
                nodes.iter().filter(|v| v.holder.as_deref() == Some(*holder)).count() >= quorum
            })
            .map(str::to_owned);
        Inspection { key: key.to_string(), nodes, holder, quorum }
    }

    /// Every node's view of `key`, asked at once, in the order of the nodes.
    async fn read_views(&self, key: &str) -> Vec<std::result::Result<View, String>> {
        let command = Command::script(&command::INSPECT, &[key], &[] as &[&[u8]], Resend::Safe);
        let timeout = self.core.config.node_timeout;
        let asks = self.core.nodes.iter().map(|node| {
            // The node timeout starts once the node has a connection, as in a lock's round.
            let sent = async {
                match node.connect_first().await {
                    Ok(connected) if node.refuses_scripts() => {
                        tokio::time::timeout(timeout, read_unscripted(node, key, connected)).await
                    }
                    Ok(connected) => {
                        let by = crate::clock::now() + timeout;
                        let send = node.send(&command, (Some(by), None, None, None), connected);
                        tokio::time::timeout(timeout, send).await
                    }
                    Err(failure) => Ok(Reply::unconnected(failure)),
                }
            };
            async move {
                match sent.await {
                    Err(_) => Err("timed out".to_owned()),
                    Ok(reply) => match reply.value {
                        Ok(value) => read_view(&value),
                        Err(failure) => Err(failure.outcome().to_string()),
                    },
                }
            }
        });
        futures::future::join_all(asks).await
    }

    /// Removes from every node the holds of `resource` that were there when the call began,
    /// and wakes its waiters: an administrator's last resort for a lock whose holder is
    /// known to be gone. The holder, if it still runs, fails its next extension (its
    /// [`Lease`](crate::Lease) reports the loss); until then two holders may overlap.
    /// Returns how many nodes answered the removal.
    ///
    /// It first reads every node's holds (as [`inspect`](Redlock::inspect) does), then
    /// removes, on every node at once, only the holds that keep others out: those found on
    /// so many nodes (counting the nodes that could not be read as holding them) that no
    /// quorum of the others remains. Each is removed from every node where it still is, and
    /// nothing else: a holder granted after the reads, or on the nodes the removal freed,
    /// keeps its lock. A hold seen on fewer nodes (a failed attempt's remnant, or a holder
    /// granted while the nodes were being read, seen only where it was read late) is left
    /// alone: it expires with its lease, and removing it where it was seen could leave a
    /// live holder a minority. A hold granted while the nodes were being read and seen on
    /// enough of them is removed like the old one (its holder learns of it at its next
    /// extension).
    ///
    /// The removal is sent at most once per node, on a connection opened for it or on one
    /// that has just answered a `PING` (a closed one is replaced first): each node is given
    /// twice the node timeout for it.
    ///
    /// # Errors
    /// [`ErrorKind::Config`] for an invalid resource name; [`ErrorKind::Unavailable`] when
    /// fewer than a quorum of nodes answered (the others may still hold the key until it
    /// expires).
    pub async fn force_release(&self, resource: &str) -> Result<usize> {
        let key = self.core.config.key(resource)?;
        let views = self.read_views(&key).await;
        let read = views.iter().filter(|view| view.is_ok()).count();
        let seen = blocking_holds(views, self.core.nodes.len());
        // Nothing seen, nothing to remove: the nodes that answered the read answered.
        let answered = if seen.is_empty() { read } else { self.remove_holds(&key, &seen).await };
        if answered >= self.quorum() {
            tracing::warn!(target: "redlock", resource, answered, holds = seen.len(), "lock released by force");
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

    /// Removes `holds` from `key` on every node at once; returns how many nodes answered.
    async fn remove_holds(&self, key: &str, holds: &[String]) -> usize {
        let channel = crate::engine::channel(key);
        let mut args: Vec<&[u8]> = Vec::with_capacity(holds.len() + 1);
        args.push(channel.as_bytes());
        args.extend(holds.iter().map(|hold| hold.as_bytes()));
        // Sent once per node, on a connection known to be alive: the removal is idempotent
        // per hold, but a hung node running it long after the call returned would still
        // surprise an operator who saw it fail.
        let command = Command::script(&command::FORCE_RELEASE, &[key], &args, Resend::Never);
        // Two round trips: the `PING` and the removal.
        let timeout = self.core.config.node_timeout * 2;
        let removals = self.core.nodes.iter().map(|node| {
            let by = crate::clock::now() + timeout;
            let send = node.send(&command, (Some(by), None, None, None), Default::default());
            let sent = tokio::time::timeout(timeout, send);
            async move { matches!(sent.await, Ok(reply) if reply.value.is_ok()) }
        });
        futures::future::join_all(removals).await.into_iter().filter(|&ok| ok).count()
    }
}

/// What the inspection script reads, read where the node refuses this user scripts: `GET`
/// and `PTTL` at once, then `HKEYS` for a hash kind's key (`GET` finds it of another type).
/// Advisory as the script's answer is, and not atomic: the reads may straddle a change of
/// the key.
async fn read_unscripted(node: &crate::node::Node, key: &str, connected: Connected) -> Reply {
    let ask = |name: &str, connected| {
        let mut cmd = redis::cmd(name);
        cmd.arg(key);
        let command = Command::plain(cmd, Resend::Safe);
        async move { node.send(&command, (None, None, None, None), connected).await.value }
    };
    let both = futures::future::join(ask("GET", connected), ask("PTTL", Connected::default()));
    let (value, pttl) = both.await;
    let text = |text: &str| Value::BulkString(text.as_bytes().to_vec());
    let view = match (value, pttl) {
        (Ok(Value::Nil), _) => vec![text("none"), text(""), Value::Int(-2)],
        (Ok(token), Ok(pttl)) => vec![text("string"), token.clone(), pttl, token],
        (Err(failure), Ok(pttl)) if failure.is_wrong_type() => {
            match ask("HKEYS", Connected::default()).await {
                Ok(Value::Array(fields)) => {
                    let joined = (fields.iter())
                        .filter_map(|field| redis::from_redis_value::<String>(field.clone()).ok())
                        .collect::<Vec<_>>()
                        .join(" ");
                    [vec![text("hash"), text(&joined), pttl], fields].concat()
                }
                Err(failure) if failure.is_wrong_type() => {
                    vec![text("value of another type"), text(""), pttl]
                }
                Ok(other) => return Reply::of(Ok(other)),
                Err(failure) => return Reply::of(Err(failure)),
            }
        }
        (Err(failure), _) | (_, Err(failure)) => return Reply::of(Err(failure)),
    };
    Reply::of(Ok(Value::Array(view)))
}

/// The holds of `views` (one per node, `nodes` in all) that keep every other owner out:
/// found on at least `nodes - quorum + 1` nodes, counting those that could not be read.
fn blocking_holds(views: Vec<std::result::Result<View, String>>, nodes: usize) -> Vec<String> {
    let unread = views.iter().filter(|view| view.is_err()).count();
    let mut seen: Vec<(String, usize)> = Vec::new();
    for hold in views.into_iter().flatten().flat_map(|view| view.holds) {
        match seen.iter_mut().find(|(known, _)| *known == hold) {
            Some((_, count)) => *count += 1,
            None => seen.push((hold, 1)),
        }
    }
    let blocking = nodes - crate::quorum::quorum(nodes) + 1;
    seen.into_iter().filter(|(_, count)| count + unread >= blocking).map(|(hold, _)| hold).collect()
}

/// What one node holds for a key.
struct View {
    /// A plain lock's token, or a hash kind's hold fields joined by spaces.
    holder: Option<String>,
    ttl: Option<Duration>,
    /// Each hold on its own: the token, or every field of a hash kind.
    holds: Vec<String>,
}

/// A node's `{type, holder, pttl, hold...}`.
fn read_view(value: &Value) -> std::result::Result<View, String> {
    let text = |v: &Value| redis::from_redis_value::<String>(v.clone()).map_err(|e| e.to_string());
    let Value::Array(items) = value else {
        return Err(format!("unexpected reply {value:?}"));
    };
    let [kind, holder, pttl, holds @ ..] = items.as_slice() else {
        return Err(format!("unexpected reply {value:?}"));
    };
    let kind = text(kind)?;
    if kind == "none" {
        return Ok(View { holder: None, ttl: None, holds: Vec::new() });
    }
    let holder = text(holder)?;
    let pttl = redis::from_redis_value::<i64>(pttl.clone()).map_err(|e| e.to_string())?;
    let ttl = u64::try_from(pttl).ok().map(Duration::from_millis);
    let (holder, holds) = match kind.as_str() {
        "string" | "hash" => {
            (holder, holds.iter().map(text).collect::<std::result::Result<_, _>>()?)
        }
        other => (format!("a {other}, not a lock"), Vec::new()),
    };
    Ok(View { holder: Some(holder), ttl, holds })
}

#[cfg(test)]
mod tests {
    use super::*;

    fn held(holds: &[&str]) -> std::result::Result<View, String> {
        let holds = holds.iter().map(|h| h.to_string()).collect();
        Ok(View { holder: None, ttl: None, holds })
    }

    #[test]
    fn only_holds_that_keep_a_quorum_out_are_removed() {
        // Three nodes: a hold on two of them blocks; one on a single node does not.
        let views = vec![held(&["old"]), held(&["old"]), held(&["new"])];
        assert_eq!(blocking_holds(views, 3), ["old"]);
        // A node that could not be read may hold anything.
        let views = vec![held(&["old"]), Err("timed out".into()), held(&[])];
        assert_eq!(blocking_holds(views, 3), ["old"]);
        // Five nodes: three are needed.
        let views =
            vec![held(&["a", "r:1"]), held(&["a", "r:1"]), held(&["r:1"]), held(&[]), held(&["a"])];
        assert_eq!(blocking_holds(views, 5), ["a", "r:1"]);
        let views = vec![held(&["a"]), held(&["a"]), held(&[]), held(&[]), held(&[])];
        assert!(blocking_holds(views, 5).is_empty());
    }
}
