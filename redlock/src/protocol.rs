//! What is said to one node for each operation, and what its reply means.

use std::sync::Arc;
use std::sync::atomic::{AtomicU64, Ordering};

use redis::{Cmd, Value};

use crate::error::NodeOutcome;
use crate::node::{Failure, Node};
use crate::script::{ACQUIRE_FENCED, Call, EXTEND, RAISE_FENCE, RELEASE};

/// `SET key token NX GET PX ttl`, built once per round.
///
/// `GET` (Redis 7.0+) makes the reply say who holds the key: nil when we set it, the holder's
/// token otherwise, and a `WRONGTYPE` error for a key that is not a string, which plain
/// `SET NX` would silently report as "held".
pub(crate) fn acquire_cmd(key: &str, token: &str, ttl_ms: u64) -> Arc<Cmd> {
    let mut cmd = redis::cmd("SET");
    cmd.arg(key).arg(token).arg("NX").arg("GET").arg("PX").arg(ttl_ms);
    Arc::new(cmd)
}

/// Sends an [`acquire_cmd`] to one node.
pub(crate) async fn acquire(node: Arc<Node>, cmd: Arc<Cmd>, token: Arc<str>) -> NodeOutcome {
    match node.request(&cmd).await {
        Ok(Value::Nil) => vote(&node),
        // Our own token: an earlier send of this very attempt landed (a retried request).
        Ok(Value::BulkString(holder)) if holder == token.as_bytes() => vote(&node),
        Ok(Value::BulkString(_)) => NodeOutcome::Held,
        Ok(other) => unexpected(&other),
        Err(failure) => failure.into_outcome(),
    }
}

/// The fenced acquire script, prepared once per round.
pub(crate) fn acquire_fenced_call(key: &str, counter: &str, token: &str, ttl_ms: u64) -> Arc<Call> {
    ACQUIRE_FENCED.call(&[key, counter], &[token.as_bytes(), ttl_ms.to_string().as_bytes()])
}

/// Like [`acquire`], and a granting node bumps the resource's fencing counter; the
/// highest counter seen is kept in `highest`.
pub(crate) async fn acquire_fenced(
    node: Arc<Node>,
    call: Arc<Call>,
    highest: Arc<AtomicU64>,
) -> NodeOutcome {
    match node.call(&call).await {
        Ok(Value::Array(items)) => match items.as_slice() {
            [Value::Int(1), Value::Int(count)] => match u64::try_from(*count) {
                Ok(count) => {
                    highest.fetch_max(count, Ordering::AcqRel);
                    vote(&node)
                }
                Err(_) => NodeOutcome::Failed("negative fencing counter".into()),
            },
            [Value::Int(0), _] => NodeOutcome::Held,
            _ => unexpected(&Value::Array(items)),
        },
        Ok(other) => unexpected(&other),
        Err(failure) => failure.into_outcome(),
    }
}

/// The script that raises the fencing counter to at least `token`.
pub(crate) fn raise_fence_call(counter: &str, token: u64) -> Arc<Call> {
    RAISE_FENCE.call(&[counter], &[token.to_string().as_bytes()])
}

/// Sends a [`raise_fence_call`] to one node.
pub(crate) async fn raise_fence(node: Arc<Node>, call: Arc<Call>) -> NodeOutcome {
    match node.call(&call).await {
        Ok(Value::Int(1)) => NodeOutcome::Ok,
        Ok(other) => unexpected(&other),
        Err(failure) => failure.into_outcome(),
    }
}

/// The compare-and-delete script: our key goes, anyone else's stays; waiters subscribed to
/// `channel` are told.
pub(crate) fn release_call(key: &str, token: &str, channel: &str) -> Arc<Call> {
    RELEASE.call(&[key], &[token.as_bytes(), channel.as_bytes()])
}

/// Sends a [`release_call`] to one node.
pub(crate) async fn release(node: Arc<Node>, call: Arc<Call>) -> NodeOutcome {
    script_outcome(node.call(&call).await)
}

/// The compare-and-expire script; a key that vanished is set again but does not count.
pub(crate) fn extend_call(key: &str, token: &str, ttl_ms: u64) -> Arc<Call> {
    EXTEND.call(&[key], &[token.as_bytes(), ttl_ms.to_string().as_bytes()])
}

/// Sends an [`extend_call`] to one node.
pub(crate) async fn extend(node: Arc<Node>, call: Arc<Call>) -> NodeOutcome {
    match script_outcome(node.call(&call).await) {
        NodeOutcome::Ok => vote(&node),
        other => other,
    }
}

/// `GET key`: whether the node still holds our token.
pub(crate) async fn holds(node: Arc<Node>, key: Arc<str>, token: Arc<str>) -> NodeOutcome {
    let mut cmd = redis::cmd("GET");
    cmd.arg(&*key);
    match node.request(&cmd).await {
        Ok(Value::BulkString(value)) if value == token.as_bytes() => NodeOutcome::Ok,
        Ok(Value::BulkString(_)) => NodeOutcome::Held,
        Ok(Value::Nil) => NodeOutcome::Absent,
        Ok(other) => unexpected(&other),
        Err(failure) => failure.into_outcome(),
    }
}

/// A yes from a node in restart quarantine is written but not counted.
pub(crate) fn vote(node: &Node) -> NodeOutcome {
    if node.in_quarantine() { NodeOutcome::Quarantined } else { NodeOutcome::Ok }
}

/// Both scripts answer 1 (done), 0 (our key was absent) or -1 (another owner's key).
pub(crate) fn script_outcome(reply: Result<Value, Failure>) -> NodeOutcome {
    match reply {
        Ok(Value::Int(1)) => NodeOutcome::Ok,
        Ok(Value::Int(0)) => NodeOutcome::Absent,
        Ok(Value::Int(-1)) => NodeOutcome::Held,
        Ok(other) => unexpected(&other),
        Err(failure) => failure.into_outcome(),
    }
}

pub(crate) fn unexpected(reply: &Value) -> NodeOutcome {
    NodeOutcome::Failed(format!("unexpected reply {reply:?}").into())
}
