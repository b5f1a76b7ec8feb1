//! Every attempt is a `tracing` span with its outcome and per-node results. Here because a
//! scoped subscriber still changes tracing's process-wide callsite interest and level hint:
//! beside other tests, a node request's event was once not seen at all.

use crate::common;

use tracing_subscriber::fmt::format::FmtSpan;

#[tokio::test(flavor = "current_thread")]
async fn an_attempt_is_a_span_with_outcome_and_nodes() {
    let _serial = crate::serial();
    let cluster = common::cluster(3);
    cluster.node(2).set("traced", "foreign").unwrap();
    let captured = common::LogBuffer::default();
    let writer = captured.clone();
    let subscriber = tracing_subscriber::fmt()
        .with_writer(move || writer.clone())
        .with_max_level(tracing::Level::DEBUG)
        .with_span_events(FmtSpan::CLOSE)
        .with_ansi(false)
        .finish();
    let _guard = tracing::subscriber::set_default(subscriber);
    let rl = common::client(&cluster);
    let lock = rl.try_lock("traced").await.unwrap();
    lock.release().await.unwrap();
    let mut other = rl.try_lock("elsewhere").await.unwrap();
    other.extend(std::time::Duration::from_secs(1)).await.unwrap();
    cluster.node(0).set("busy", "foreign").unwrap();
    cluster.node(1).set("busy", "foreign").unwrap();
    rl.try_lock("busy").await.unwrap_err();
    drop(_guard);
    let log = String::from_utf8(captured.0.lock().unwrap().clone()).unwrap();
    assert!(log.contains("lock_attempt"), "{log}");
    assert!(log.contains("redlock"), "{log}");
    assert!(log.contains("resource=\"traced\""), "{log}");
    assert!(log.contains("outcome=\"granted\""), "{log}");
    assert!(log.contains("outcome=\"not_acquired\""), "{log}");
    assert!(log.contains("held by another owner"), "per-node results: {log}");
    assert!(log.contains("elapsed="), "{log}");
}

/// A subscriber that filters on events (not on callsites, levels or targets alone) still
/// gets every node request's trace with its duration: whether a request reads the clock
/// is decided from the global level hint, not from a callsite check such a filter refuses.
#[tokio::test(flavor = "current_thread")]
async fn node_requests_are_traced_under_a_filter_on_events() {
    let _serial = crate::serial();
    use tracing_subscriber::filter::filter_fn;
    use tracing_subscriber::prelude::*;

    let cluster = common::cluster(3);
    let captured = common::LogBuffer::default();
    let writer = captured.clone();
    let layer = tracing_subscriber::fmt::layer()
        .with_ansi(false)
        .with_writer(move || writer.clone())
        .with_filter(filter_fn(|meta| meta.is_event() && meta.target() == "redlock"));
    let _guard = tracing::subscriber::set_default(tracing_subscriber::registry().with(layer));
    let rl = common::client(&cluster);
    for _ in 0..3 {
        rl.try_lock("filtered").await.unwrap().release().await.unwrap();
    }
    rl.shutdown(std::time::Duration::from_secs(5)).await.unwrap();
    drop(_guard);
    let log = String::from_utf8(captured.0.lock().unwrap().clone()).unwrap();
    let ended = log.lines().filter(|line| line.contains("node request ended")).count();
    assert!(ended >= 3 * 3, "{ended} node request events: {log}");
    assert!(
        log.lines().filter(|l| l.contains("node request ended")).all(|l| l.contains("elapsed="))
    );
}
