//! Counting our failed acquisition attempts, for the failed attempts per handoff, from the
//! library's own `lock_attempt` span (target `redlock`): the library keeps no counter of
//! its own for the benchmarks. The subscriber enables that span alone, so everything else
//! the library traces stays disabled (one cached interest per callsite), as without a
//! subscriber.

use std::sync::OnceLock;
use std::sync::atomic::{AtomicU64, Ordering};

use tracing::field::{Field, Visit};
use tracing::span::{Attributes, Id, Record};
use tracing::subscriber::Interest;
use tracing::{Event, Metadata, Subscriber};

static FAILED: AtomicU64 = AtomicU64::new(0);
static INSTALLED: OnceLock<bool> = OnceLock::new();

/// Our acquisition attempts in this process that were not granted since [`install`]; `None`
/// when another global subscriber was installed first.
pub(crate) fn failed() -> Option<u64> {
    install().then(|| FAILED.load(Ordering::Relaxed))
}

/// Installs the counting subscriber as the global default, once.
pub(crate) fn install() -> bool {
    *INSTALLED.get_or_init(|| tracing::subscriber::set_global_default(FailedAttempts).is_ok())
}

struct FailedAttempts;

fn is_attempt(metadata: &Metadata<'_>) -> bool {
    metadata.is_span() && metadata.target() == "redlock" && metadata.name() == "lock_attempt"
}

impl Subscriber for FailedAttempts {
    fn register_callsite(&self, metadata: &'static Metadata<'static>) -> Interest {
        if is_attempt(metadata) { Interest::always() } else { Interest::never() }
    }

    fn enabled(&self, metadata: &Metadata<'_>) -> bool {
        is_attempt(metadata)
    }

    fn max_level_hint(&self) -> Option<tracing::level_filters::LevelFilter> {
        Some(tracing::level_filters::LevelFilter::DEBUG)
    }

    fn new_span(&self, _: &Attributes<'_>) -> Id {
        // Nothing is kept per span: the outcome is counted as it is recorded.
        Id::from_u64(1)
    }

    fn record(&self, _: &Id, values: &Record<'_>) {
        values.record(&mut Outcome);
    }

    fn record_follows_from(&self, _: &Id, _: &Id) {}

    fn event(&self, _: &Event<'_>) {}

    fn enter(&self, _: &Id) {}

    fn exit(&self, _: &Id) {}
}

/// Counts an `outcome` other than `granted`.
struct Outcome;

impl Visit for Outcome {
    fn record_str(&mut self, field: &Field, value: &str) {
        if field.name() == "outcome" && value != "granted" {
            FAILED.fetch_add(1, Ordering::Relaxed);
        }
    }

    fn record_debug(&mut self, _: &Field, _: &dyn std::fmt::Debug) {}
}
