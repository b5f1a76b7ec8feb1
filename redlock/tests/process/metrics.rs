//! Metrics (feature `metrics`) through a debugging recorder, in real scenarios: contention,
//! killed nodes counted as unreachable, a loss counted with its reason.
#![cfg(feature = "metrics")]

use crate::common;

use std::time::Duration;

use metrics_util::debugging::{DebugValue, DebuggingRecorder, Snapshotter};

/// A series: its name and labels.
type Series = (String, Vec<(String, String)>);

/// What the recorder saw so far. A snapshot drains what it reports, so every value seen is
/// added up here.
struct Seen {
    snapshotter: Snapshotter,
    /// (name, labels) -> counter total or histogram sample count.
    totals: Vec<(Series, u64)>,
}

impl Seen {
    fn refresh(&mut self) {
        for (key, _, _, value) in self.snapshotter.snapshot().into_vec() {
            let name = key.key().name().to_owned();
            let labels: Vec<(String, String)> =
                key.key().labels().map(|l| (l.key().to_owned(), l.value().to_owned())).collect();
            let n = match value {
                DebugValue::Counter(n) => n,
                DebugValue::Histogram(values) => values.len() as u64,
                DebugValue::Gauge(_) => 0,
            };
            match self.totals.iter_mut().find(|((k, l), _)| *k == name && *l == labels) {
                Some((_, total)) => *total += n,
                None => self.totals.push(((name, labels), n)),
            }
        }
    }

    /// Every value the label `label` of `name` was seen with.
    fn label_values(&mut self, name: &str, label: &str) -> Vec<String> {
        self.refresh();
        let mut values: Vec<String> = self
            .totals
            .iter()
            .filter(|((k, _), _)| k == name)
            .flat_map(|((_, l), _)| l.iter().filter(|(k, _)| k == label).map(|(_, v)| v.clone()))
            .collect();
        values.sort();
        values.dedup();
        values
    }

    /// The total of `name` (a counter's count, a histogram's samples) over the series whose
    /// labels include all of `labels`.
    fn total(&mut self, name: &str, labels: &[(&str, &str)]) -> u64 {
        self.refresh();
        self.totals
            .iter()
            .filter(|((k, l), _)| {
                k == name && labels.iter().all(|(lk, lv)| l.iter().any(|(k, v)| k == lk && v == lv))
            })
            .map(|(_, n)| n)
            .sum()
    }
}

#[test]
fn the_lock_reports_contention_unreachable_nodes_and_losses() {
    let _serial = crate::serial();
    let recorder = DebuggingRecorder::new();
    let mut seen = Seen { snapshotter: recorder.snapshotter(), totals: Vec::new() };
    metrics::set_global_recorder(recorder).unwrap();
    let runtime =
        tokio::runtime::Builder::new_multi_thread().worker_threads(2).enable_all().build().unwrap();
    runtime.block_on(async {
        let mut cluster = common::cluster(3);
        let holder = common::client(&cluster);
        let other = common::client(&cluster);

        // Contention: a refused attempt, counted as such.
        let lock = holder.try_lock("job").await.unwrap();
        other.try_lock("job").await.unwrap_err();
        assert_eq!(seen.total("redlock_contention_total", &[("kind", "lock")]), 1);
        assert_eq!(
            seen.total("redlock_attempts_total", &[("kind", "lock"), ("outcome", "not_acquired")]),
            1
        );
        let mut lock = lock;
        lock.extend(Duration::from_secs(10)).await.unwrap();
        let extended = [("kind", "lock"), ("outcome", "ok")];
        assert_eq!(seen.total("redlock_extensions_total", &extended), 1);
        lock.release().await.unwrap();
        assert_eq!(seen.total("redlock_releases_total", &[("outcome", "ok")]), 1);
        let timed = [("op", "acquire"), ("outcome", "ok")];
        assert!(seen.total("redlock_node_request_duration_seconds", &timed) >= 2);

        // A guard dropped without a release: released in the background, counted as such.
        drop(holder.try_lock("unreleased").await.unwrap());
        let dropped =
            || common::eventually(Duration::from_secs(2), || cluster.count_key("unreleased") == 0);
        assert!(dropped().await);
        assert_eq!(seen.total("redlock_releases_total", &[("outcome", "dropped")]), 1);

        // Each kind under its own label.
        holder.read("doc").once().await.unwrap().release().await.unwrap();
        let kinds = seen.label_values("redlock_attempts_total", "kind");
        assert!(kinds.len() >= 2 && kinds.contains(&"lock".to_owned()), "{kinds:?}");
        assert!(seen.total("redlock_acquire_duration_seconds", &[("outcome", "granted")]) >= 1);
        assert!(seen.total("redlock_hold_duration_seconds", &[("kind", "lock")]) >= 1);

        // A hold an extension finds gone ends there, counted once, even when its guard is
        // dropped without a release.
        let held = seen.total("redlock_hold_duration_seconds", &[("kind", "lock")]);
        let mut lost = holder.try_lock("gone").await.unwrap();
        for i in [0, 1] {
            cluster.node(i).set("gone", "foreign").unwrap();
        }
        lost.extend(Duration::from_secs(10)).await.unwrap_err();
        drop(lost);
        assert_eq!(seen.total("redlock_releases_total", &[("outcome", "not_held")]), 1);
        assert_eq!(seen.total("redlock_hold_duration_seconds", &[("kind", "lock")]), held + 1);

        // A killed node: its requests are counted as unreachable, under its own label.
        let dead = format!("127.0.0.1:{}/0", cluster.node(2).port());
        cluster.node_mut(2).kill().unwrap();
        holder.try_lock("k2").await.unwrap().release().await.unwrap();
        let unreachable = seen.total(
            "redlock_node_requests_total",
            &[("node", dead.as_str()), ("op", "acquire"), ("outcome", "unreachable")],
        );
        assert_eq!(unreachable, 1, "{dead}");

        // A loss: the auto-extended lock loses its majority.
        let short = common::builder(&cluster, Duration::from_millis(100))
            .ttl(Duration::from_millis(600))
            .build()
            .unwrap();
        let auto = short.try_lock("k3").await.unwrap().auto_extend();
        cluster.node_mut(1).kill().unwrap();
        let err = tokio::time::timeout(Duration::from_secs(3), auto.lost()).await.unwrap();
        // `lost()` fires by the clock at the deadline; the extender records the loss, with the
        // reason its failed extension gave, when that extension ends (within a node timeout).
        let deadline = std::time::Instant::now() + Duration::from_secs(2);
        while seen.total("redlock_losses_total", &[]) == 0 && std::time::Instant::now() < deadline {
            tokio::time::sleep(Duration::from_millis(20)).await;
        }
        assert_eq!(seen.total("redlock_losses_total", &[]), 1, "{err}");
        let reasons = ["not_held", "unavailable"];
        let by_reason: u64 =
            reasons.iter().map(|r| seen.total("redlock_losses_total", &[("reason", r)])).sum();
        assert_eq!(by_reason, 1, "a loss is counted with the failed extension's reason");
        assert!(seen.total("redlock_extensions_total", &[]) >= 1);

        // No resource in any label; nodes named by host:port/db only.
        seen.refresh();
        for ((name, labels), _) in &seen.totals {
            for (key, value) in labels {
                assert_ne!(key, "resource", "{name}");
                assert!(
                    !["job", "gone", "k2", "k3", "unreleased", "doc"].contains(&value.as_str()),
                    "{name}: {key}={value}"
                );
                assert!(!value.contains('@') && !value.contains("redis://"), "{name}: {value}");
            }
        }
        let nodes = seen.label_values("redlock_node_requests_total", "node");
        assert!(
            nodes.iter().all(|n| n.starts_with("127.0.0.1:") && n.ends_with("/0")),
            "{nodes:?}"
        );
    });
}
