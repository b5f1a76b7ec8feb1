//! Metrics through the [`metrics`](https://docs.rs/metrics) facade, with the `metrics`
//! feature: the application installs the recorder (Prometheus, StatsD, ...). Without the
//! feature only the matching `tracing` events remain (debug: lock calls and holds ended;
//! trace: node requests; warn: a lost auto-extended lock).
//!
//! Names and labels (no resource label: one series per resource would be unbounded):
//!
//! | name | type | labels |
//! | --- | --- | --- |
//! | `redlock_acquire_duration_seconds` | histogram | `kind`, `outcome` |
//! | `redlock_attempts_total` | counter | `kind`, `outcome` |
//! | `redlock_contention_total` | counter | `kind` |
//! | `redlock_hold_duration_seconds` | histogram | `kind` |
//! | `redlock_extensions_total` | counter | `kind`, `outcome` |
//! | `redlock_releases_total` | counter | `kind`, `outcome` |
//! | `redlock_losses_total` | counter | `reason` |
//! | `redlock_node_requests_total` | counter | `node`, `op`, `outcome` |
//! | `redlock_node_request_duration_seconds` | histogram | `node`, `op`, `outcome` |
//!
//! `outcome` is `granted` / `ok` or an [`ErrorKind::as_str`](crate::ErrorKind::as_str) for
//! the lock calls, and `ok`, `held`, `absent`, `wrong_type`, `timed_out`, `unreachable`,
//! `failed`, `quarantined` for a node's answer. `node` is `host:port/db`, never a password.

use std::time::{Duration, Instant};

use tracing::level_filters::LevelFilter;

use crate::error::{ErrorKind, NodeOutcome};

/// A lock call's outcome label.
pub(crate) fn outcome(result: Result<(), ErrorKind>) -> &'static str {
    match result {
        Ok(()) => "ok",
        Err(kind) => kind.as_str(),
    }
}

/// A node answer's outcome label.
pub(crate) fn node_outcome(outcome: &NodeOutcome) -> &'static str {
    match outcome {
        NodeOutcome::Ok => "ok",
        NodeOutcome::Held => "held",
        NodeOutcome::WriterWaiting => "writer_waiting",
        NodeOutcome::Absent => "absent",
        NodeOutcome::WrongType => "wrong_type",
        NodeOutcome::TimedOut => "timed_out",
        NodeOutcome::Unreachable(_) => "unreachable",
        NodeOutcome::Denied(_) => "denied",
        NodeOutcome::Failed(_) => "failed",
        NodeOutcome::Quarantined => "quarantined",
        NodeOutcome::Pending => "pending",
    }
}

/// A lock call (with its waits) ended.
pub(crate) fn acquired(kind: &'static str, outcome: &'static str, elapsed: Duration) {
    tracing::debug!(target: "redlock", kind, outcome, ?elapsed, "lock call ended");
    #[cfg(feature = "metrics")]
    metrics::histogram!("redlock_acquire_duration_seconds", "kind" => kind, "outcome" => outcome)
        .record(elapsed.as_secs_f64());
    #[cfg(not(feature = "metrics"))]
    let _ = (kind, outcome, elapsed);
}

/// One acquisition attempt ended; a refusal by another holder is contention.
pub(crate) fn attempted(kind: &'static str, outcome: &'static str) {
    #[cfg(feature = "metrics")]
    {
        metrics::counter!("redlock_attempts_total", "kind" => kind, "outcome" => outcome)
            .increment(1);
        if outcome == ErrorKind::NotAcquired.as_str() {
            metrics::counter!("redlock_contention_total", "kind" => kind).increment(1);
        }
    }
    #[cfg(not(feature = "metrics"))]
    let _ = (kind, outcome);
}

/// A hold ended (released, dropped) after `held`.
pub(crate) fn held(kind: &'static str, held: Duration) {
    tracing::debug!(target: "redlock", kind, ?held, "hold ended");
    #[cfg(feature = "metrics")]
    metrics::histogram!("redlock_hold_duration_seconds", "kind" => kind).record(held.as_secs_f64());
    #[cfg(not(feature = "metrics"))]
    let _ = (kind, held);
}

/// An extension ended.
pub(crate) fn extended(kind: &'static str, outcome: &'static str) {
    #[cfg(feature = "metrics")]
    metrics::counter!("redlock_extensions_total", "kind" => kind, "outcome" => outcome)
        .increment(1);
    #[cfg(not(feature = "metrics"))]
    let _ = (kind, outcome);
}

/// A release ended.
pub(crate) fn released(kind: &'static str, outcome: &'static str) {
    #[cfg(feature = "metrics")]
    metrics::counter!("redlock_releases_total", "kind" => kind, "outcome" => outcome).increment(1);
    #[cfg(not(feature = "metrics"))]
    let _ = (kind, outcome);
}

/// An auto-extended lock was lost, for `reason` (an [`ErrorKind::as_str`]).
pub(crate) fn lost(reason: &'static str) {
    tracing::warn!(target: "redlock", reason, "an auto-extended lock was lost");
    #[cfg(feature = "metrics")]
    metrics::counter!("redlock_losses_total", "reason" => reason).increment(1);
    #[cfg(not(feature = "metrics"))]
    let _ = reason;
}

/// When a request to a node starts, if anything may record how long it takes (the
/// `metrics` feature, or any subscriber that takes traces): two clock reads per request are
/// not free.
///
/// A superset on purpose: the global level hint, not `tracing::enabled!`, whose answer is
/// a callsite's (not the event's: a filter on events, names or fields says no to it) and
/// the current thread's (a request may end on another).
pub(crate) fn request_started() -> Option<Instant> {
    let traced = LevelFilter::current() >= LevelFilter::TRACE
        && tracing::level_filters::STATIC_MAX_LEVEL >= LevelFilter::TRACE;
    (cfg!(feature = "metrics") || traced).then(Instant::now)
}

/// One request to one node, started as [`request_started`] said, ended.
pub(crate) fn node_request(
    node: &str,
    op: &'static str,
    outcome: &'static str,
    started: Option<Instant>,
) {
    let Some(started) = started else { return };
    let elapsed = started.elapsed();
    tracing::trace!(target: "redlock", node, op, outcome, ?elapsed, "node request ended");
    #[cfg(feature = "metrics")]
    {
        let node = node.to_owned();
        metrics::counter!("redlock_node_requests_total", "node" => node.clone(), "op" => op, "outcome" => outcome)
            .increment(1);
        metrics::histogram!("redlock_node_request_duration_seconds", "node" => node, "op" => op, "outcome" => outcome)
            .record(elapsed.as_secs_f64());
    }
    #[cfg(not(feature = "metrics"))]
    let _ = (node, op, outcome, elapsed);
}
