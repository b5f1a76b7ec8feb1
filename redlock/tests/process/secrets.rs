//! Node passwords never appear in any output: `Debug` and `Display` of the builder, the
//! client, locks and errors, and every log line down to trace level (the library's and
//! redis-rs's), on success, refusal, a wrong password and an unreachable node.

use crate::common;

use std::time::Duration;

use redlock::{ErrorKind, Redlock, Retry};
use redlock_testkit::{Cluster, NodeConfig};

const PASSWORD: &str = "Sup3rSecretPassw0rd";

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_password_never_appears_in_any_output() {
    let _serial = crate::serial();
    // Global, with `log` records (redis-rs) forwarded; the other tests of this binary use
    // no password.
    let logs = common::logs();

    let cluster = Cluster::start_with(3, NodeConfig::new().requirepass(PASSWORD)).unwrap();
    let urls = cluster.urls();
    assert!(urls.iter().all(|url| url.contains(PASSWORD)), "{urls:?}");
    let mut printed: Vec<String> = Vec::new();
    // Past the quarantine below (INFO is read with the password too).
    tokio::time::sleep(Duration::from_millis(2100)).await;

    let builder = Redlock::builder()
        .nodes(urls.clone())
        .node_timeout(Duration::from_millis(500))
        .restart_quarantine(Duration::from_millis(1))
        .retry(Retry::new().with_max_attempts(3).with_delay(Duration::from_millis(20)));
    printed.push(format!("{builder:?}"));
    assert!(printed[0].contains(":***@127.0.0.1:"), "{}", printed[0]);
    let rl = builder.build().unwrap();
    printed.push(format!("{rl:?}"));

    // Granted, refused, waited for, released.
    let lock = rl.lock("k").await.unwrap();
    printed.push(format!("{lock:?}"));
    let busy = rl.try_lock("k").await.unwrap_err();
    assert_eq!(busy.kind(), ErrorKind::NotAcquired);
    printed.push(format!("{busy} {busy:?}"));
    let waiter = tokio::spawn({
        let rl = rl.clone();
        async move { rl.lock("k").await }
    });
    tokio::time::sleep(Duration::from_millis(50)).await;
    lock.release().await.unwrap();
    let next = waiter.await.unwrap();
    printed.push(format!("{next:?}"));
    next.unwrap().release().await.unwrap();

    // A wrong password, and a node that is down.
    let wrong: Vec<String> =
        urls.iter().map(|url| url.replace(PASSWORD, &format!("{PASSWORD}x"))).collect();
    let rl_wrong = Redlock::builder().nodes(wrong).retry(Retry::never()).build().unwrap();
    let refused = rl_wrong.try_lock("k").await.unwrap_err();
    assert_eq!(refused.kind(), ErrorKind::Denied, "{refused}");
    printed.push(format!("{refused} {refused:?} {rl_wrong:?}"));
    let down = format!("redis://:{PASSWORD}@127.0.0.1:1");
    let rl_down = Redlock::builder().nodes([down.as_str()]).retry(Retry::never()).build().unwrap();
    let unreachable = rl_down.try_lock("k").await.unwrap_err();
    printed.push(format!("{unreachable} {unreachable:?}"));
    // A configuration error about one of those URLs.
    let twice = Redlock::builder().nodes([down.as_str(), down.as_str()]).build().unwrap_err();
    printed.push(format!("{twice} {twice:?}"));
    let unparsable = Redlock::builder().nodes([format!("redis://:{PASSWORD}@[::1")]).build();
    printed.push(format!("{unparsable:?}"));
    rl.shutdown(Duration::from_secs(2)).await.unwrap();

    let logs = String::from_utf8(logs.lock().unwrap().clone()).unwrap();
    assert!(logs.contains("lock_attempt"), "trace-level logs were captured:\n{logs}");
    printed.push(logs);
    for output in &printed {
        assert!(!output.contains(PASSWORD), "the password was printed:\n{output}");
    }
}
