//! TLS nodes (`rediss://`, with the `tls-rustls` feature): every kind locks, waits for a
//! release notification and releases over TLS with mutual TLS; a wrong CA or a missing
//! client certificate is `Unavailable`, with a message about the certificate.
#![cfg(feature = "tls-rustls")]

use crate::common;

use std::time::{Duration, Instant};

use redlock::{ErrorKind, Redlock, RedlockBuilder, Retry};
use redlock_testkit::tls::{Certificates, ClientCerts};
use redlock_testkit::{Cluster, FaultyCluster, NodeConfig};

fn tls_cluster(client_certs: ClientCerts) -> Cluster {
    Cluster::start_with(3, NodeConfig::new().tls(client_certs)).unwrap()
}

fn builder(cluster: &Cluster) -> RedlockBuilder {
    for url in cluster.urls() {
        assert!(url.starts_with("rediss://"), "{url}");
    }
    Redlock::builder()
        .nodes(cluster.urls())
        .node_timeout(Duration::from_secs(1))
        .retry(Retry::never())
}

fn mutual_tls(cluster: &Cluster) -> Redlock {
    let certs = Certificates::get().unwrap();
    builder(cluster)
        .tls_root_ca(certs.ca().pem())
        .tls_client_cert(certs.client_cert().pem(), certs.client_key().pem())
        .build()
        .unwrap()
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn every_kind_locks_and_releases_over_mutual_tls() {
    let cluster = tls_cluster(ClientCerts::Required);
    let rl = mutual_tls(&cluster);

    let lock = rl.lock("plain").await.unwrap();
    assert_eq!(cluster.nodes_holding("plain", lock.token()), [0, 1, 2]);
    lock.release().await.unwrap();

    let outer = rl.reentrant("reentrant", "job-1").await.unwrap();
    let inner = rl.reentrant("reentrant", "job-1").await.unwrap();
    assert_eq!(cluster.nodes_with_key("reentrant").unwrap(), [0, 1, 2]);
    inner.release().await.unwrap();
    outer.release().await.unwrap();

    let many = rl.many(&["many:a", "many:b"]).await.unwrap();
    assert_eq!(cluster.nodes_with_key("many:b").unwrap(), [0, 1, 2]);
    many.release().await.unwrap();

    let (r1, r2) = (rl.read("rw").await.unwrap(), rl.read("rw").await.unwrap());
    assert_eq!(rl.write("rw").once().await.unwrap_err().kind(), ErrorKind::NotAcquired);
    r1.release().await.unwrap();
    r2.release().await.unwrap();
    let write = rl.write("rw").await.unwrap();
    write.release().await.unwrap();

    let fenced = rl.lock("fenced").fenced().await.unwrap();
    assert!(fenced.fencing_token().is_some());
    fenced.release().await.unwrap();

    for key in ["plain", "reentrant", "many:a", "many:b", "rw", "fenced"] {
        common::gone_everywhere(&cluster, &[key], &format!("{key} left behind")).await;
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_waiter_is_woken_by_a_release_notification_over_tls() {
    let cluster = tls_cluster(ClientCerts::Required);
    let rl = mutual_tls(&cluster);
    let held = rl.lock("handoff").await.unwrap();
    // Polling alone would take 20 s: only the notification can wake the waiter sooner.
    let slow_polling = Retry::new().with_delay(Duration::from_secs(20)).with_jitter(Duration::ZERO);
    let waiter = tokio::spawn({
        let rl = rl.clone();
        async move { rl.lock("handoff").retry(slow_polling).await.map(|lock| (lock, Instant::now())) }
    });
    // The waiter has subscribed (over TLS) on every node.
    assert!(
        common::eventually(Duration::from_secs(5), || {
            common::subscribers(&cluster, "handoff").iter().all(|n| *n == 1)
        })
        .await
    );
    let released_at = Instant::now();
    held.release().await.unwrap();
    let (lock, granted_at) = tokio::time::timeout(Duration::from_secs(5), waiter)
        .await
        .expect("the waiter was not woken")
        .unwrap()
        .unwrap();
    assert!(granted_at - released_at < Duration::from_secs(2), "{:?}", granted_at - released_at);
    lock.release().await.unwrap();
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_wrong_ca_is_denied_with_a_message_about_the_certificate() {
    let cluster = tls_cluster(ClientCerts::Optional);
    let certs = Certificates::get().unwrap();
    let rl = builder(&cluster).tls_root_ca(certs.unrelated_ca().pem()).build().unwrap();
    let err = rl.try_lock("k").await.unwrap_err();
    assert_eq!(err.kind(), ErrorKind::Denied, "{err}");
    // Decided as soon as two nodes failed: the third may not have answered yet.
    assert!(err.faulty() >= 2, "{err}");
    for node in err.nodes().iter().filter(|node| node.outcome().is_fault()) {
        let said = node.outcome().to_string().to_lowercase();
        assert!(said.contains("certificate"), "{said}");
    }
    assert!(err.to_string().to_lowercase().contains("certificate"), "{err}");
    assert_eq!(cluster.count_key("k"), 0);

    // The same nodes, trusted: the CA was the only problem.
    let rl = builder(&cluster).tls_root_ca(certs.ca().pem()).build().unwrap();
    rl.try_lock("k").await.unwrap().release().await.unwrap();
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_missing_client_certificate_is_denied_with_a_message_about_the_certificate() {
    let cluster = tls_cluster(ClientCerts::Required);
    let certs = Certificates::get().unwrap();
    let rl = builder(&cluster).tls_root_ca(certs.ca().pem()).build().unwrap();
    let err = rl.try_lock("k").await.unwrap_err();
    assert_eq!(err.kind(), ErrorKind::Denied, "{err}");
    assert!(err.to_string().to_lowercase().contains("certificate"), "{err}");
    assert_eq!(cluster.count_key("k"), 0);
}

/// `from_env` reads the CA and the client certificate from the files its TLS variables
/// name, as the `redlock` command does: one environment, and the library connects over
/// mutual TLS. The variables are set only in a child process (this test binary again, run
/// for the test below), never in this one, where other tests run at the same time.
#[test]
fn from_env_reads_the_tls_files_and_connects_over_mutual_tls() {
    let cluster = tls_cluster(ClientCerts::Required);
    let certs = Certificates::get().unwrap();
    let child = |tls: bool| {
        let mut command = std::process::Command::new(std::env::current_exe().unwrap());
        command
            .args(["--exact", "tls::locks_with_the_tls_environment", "--ignored", "--nocapture"])
            .env("TLSENV_NODES", cluster.urls().join(","))
            .env("TLSENV_NODE_TIMEOUT", "2s");
        if tls {
            command
                .env("TLSENV_TLS_CA", certs.ca().path())
                .env("TLSENV_TLS_CERT", certs.client_cert().path())
                .env("TLSENV_TLS_KEY", certs.client_key().path());
        }
        let output = command.output().unwrap();
        let shown = String::from_utf8_lossy(&output.stdout).into_owned()
            + &String::from_utf8_lossy(&output.stderr);
        (output.status.success() && shown.contains("1 passed"), shown)
    };
    let (passed, shown) = child(true);
    assert!(passed, "{shown}");
    // Without the variables the same child fails: it is the variables that connected it.
    let (passed, shown) = child(false);
    assert!(!passed, "{shown}");
    assert!(shown.to_lowercase().contains("certificate"), "{shown}");
    assert_eq!(cluster.count_key("from-env"), 0);
}

/// Run only by the test above, in a child process with the `TLSENV_` variables set.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
#[ignore = "run in a child process by from_env_reads_the_tls_files_and_connects_over_mutual_tls"]
async fn locks_with_the_tls_environment() {
    let rl = RedlockBuilder::from_env("TLSENV_").unwrap().retry(Retry::never()).build().unwrap();
    let lock = rl.try_lock("from-env").await.unwrap();
    lock.release().await.unwrap();
}

/// A lock that waits through several attempts reports the most telling of their errors: the
/// certificate the first attempt's handshakes refused, not a later attempt's timeouts.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_waiting_lock_with_a_wrong_ca_names_the_certificate_not_a_timeout() {
    let cluster = tls_cluster(ClientCerts::Optional);
    let rl = waiting_with_an_unrelated_ca(&cluster);
    let err = rl.lock("k").await.unwrap_err();
    assert_eq!(err.kind(), ErrorKind::Denied, "{err}");
    assert!(err.to_string().to_lowercase().contains("certificate"), "{err}");
    assert_eq!(cluster.count_key("k"), 0);
}

/// With a certificate the nodes never accepted, no connection opened and nothing was ever
/// written: the failed attempts' clean-ups have nothing to undo, so they warn of nothing and
/// the shutdown has nothing unconfirmed to report.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn clean_ups_of_attempts_that_never_connected_raise_no_alarm() {
    let logs = common::logs();
    let cluster = tls_cluster(ClientCerts::Optional);
    let rl = waiting_with_an_unrelated_ca(&cluster);
    rl.lock("k").await.unwrap_err();
    rl.shutdown(Duration::from_secs(5)).await.unwrap();
    let log = String::from_utf8_lossy(&logs.lock().unwrap()).into_owned();
    assert!(!log.contains("failed: the key stays"), "{log}");
}

/// A client that trusts a CA the nodes' certificates are not from, making five attempts.
fn waiting_with_an_unrelated_ca(cluster: &Cluster) -> Redlock {
    let certs = Certificates::get().unwrap();
    builder(cluster)
        .tls_root_ca(certs.unrelated_ca().pem())
        // Room for a first handshake in a debug build; the attempts after it time out.
        .node_timeout(Duration::from_millis(400))
        .retry(Retry::new().with_max_attempts(5).with_delay(Duration::from_millis(20)))
        .build()
        .unwrap()
}

/// With a certificate the nodes refuse, nothing of an attempt ever reaches a node: its
/// clean-up sends nothing there and is not sent again, so each attempt costs a node one
/// handshake, and the next attempt on the key is not held up behind clean-ups (three
/// re-sends and their handshakes, ~0.5 s in a debug build, which timed the next attempts
/// out).
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn attempts_with_a_wrong_ca_cost_each_node_one_handshake_and_no_clean_up() {
    let faulty =
        FaultyCluster::start_with(3, NodeConfig::new().tls(ClientCerts::Optional)).unwrap();
    let certs = Certificates::get().unwrap();
    let rl = Redlock::builder()
        .nodes(faulty.urls())
        .node_timeout(Duration::from_secs(5))
        .retry(Retry::never())
        .tls_root_ca(certs.unrelated_ca().pem())
        .build()
        .unwrap();
    let attempts = 3;
    for _ in 0..attempts {
        let err = rl.try_lock("k").await.unwrap_err();
        assert_eq!(err.kind(), ErrorKind::Denied, "{err}");
        assert!(err.to_string().to_lowercase().contains("certificate"), "{err}");
    }
    rl.shutdown(Duration::from_secs(5)).await.unwrap();
    for i in 0..faulty.len() {
        let connects = faulty.proxy(i).accepted();
        assert!(connects <= attempts, "node {i}: {connects} connects for {attempts} attempts");
    }
    assert_eq!(faulty.cluster().count_key("k"), 0);
}
