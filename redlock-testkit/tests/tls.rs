//! TLS nodes: the generated certificates, mutual TLS, and what is refused.

use redlock_testkit::{
    FaultyCluster, NodeConfig, RedisNode,
    tls::{Certificates, ClientCerts, install_crypto_provider},
};

/// PING through a client built with `certs`; the error's text if it fails.
fn ping(url: &str, certs: redis::TlsCertificates) -> Result<(), String> {
    install_crypto_provider();
    let client = redis::Client::build_with_tls(url, certs).map_err(|e| e.to_string())?;
    let mut con = client
        .get_connection_with_timeout(std::time::Duration::from_secs(2))
        .map_err(|e| e.to_string())?;
    redis::cmd("PING").query::<String>(&mut con).map(drop).map_err(|e| e.to_string())
}

fn only_ca(ca: &[u8]) -> redis::TlsCertificates {
    redis::TlsCertificates { client_tls: None, root_cert: Some(ca.to_vec()) }
}

#[test]
fn certificates_are_generated_once_and_written_as_pem() {
    let certs = Certificates::get().unwrap();
    assert!(std::ptr::eq(certs, Certificates::get().unwrap()));
    for file in [certs.ca(), certs.server_cert(), certs.client_cert(), certs.unrelated_ca()] {
        assert!(file.pem().starts_with(b"-----BEGIN CERTIFICATE-----"), "{file:?}");
        assert_eq!(std::fs::read(file.path()).unwrap(), file.pem());
        assert!(file.path().starts_with(certs.dir()));
    }
    assert!(String::from_utf8_lossy(certs.client_key().pem()).contains("PRIVATE KEY"));
    assert_ne!(certs.ca().pem(), certs.unrelated_ca().pem());
}

#[test]
fn a_tls_node_answers_over_tls_with_the_ca_and_refuses_plain_tcp() {
    let node = RedisNode::start_with(NodeConfig::new().tls(ClientCerts::Optional)).unwrap();
    assert_eq!(node.url(), format!("rediss://127.0.0.1:{}", node.port()));
    let certs = Certificates::get().unwrap();
    ping(&node.url(), only_ca(certs.ca().pem())).unwrap();
    ping(&node.url(), certs.redis_tls()).unwrap();
    // The certificate names localhost too.
    ping(&format!("rediss://localhost:{}", node.port()), only_ca(certs.ca().pem())).unwrap();

    // Plain TCP on the TLS port: no answer that a client accepts.
    let plain = redis::Client::open(format!("redis://127.0.0.1:{}", node.port())).unwrap();
    let refused = plain
        .get_connection_with_timeout(std::time::Duration::from_secs(2))
        .and_then(|mut con| redis::cmd("PING").query::<String>(&mut con));
    assert!(refused.is_err(), "{refused:?}");

    // The wrong CA fails the handshake.
    let err = ping(&node.url(), only_ca(certs.unrelated_ca().pem())).unwrap_err();
    assert!(err.to_lowercase().contains("certificate"), "{err}");

    // The testkit's own connections work.
    node.set("k", "v").unwrap();
    assert_eq!(node.get("k").unwrap().as_deref(), Some("v"));
}

#[test]
fn a_node_that_requires_client_certificates_refuses_clients_without_one() {
    let node = RedisNode::start_with(NodeConfig::new().tls(ClientCerts::Required)).unwrap();
    let certs = Certificates::get().unwrap();
    ping(&node.url(), certs.redis_tls()).unwrap();
    assert!(ping(&node.url(), only_ca(certs.ca().pem())).is_err(), "no client certificate");
    let foreign = redis::TlsCertificates {
        client_tls: Some(redis::ClientTlsConfig {
            client_cert: certs.unrelated_client_cert().pem().to_vec(),
            client_key: certs.unrelated_client_key().pem().to_vec(),
        }),
        root_cert: Some(certs.ca().pem().to_vec()),
    };
    assert!(ping(&node.url(), foreign).is_err(), "a certificate from another CA");
}

#[test]
fn tls_passes_through_proxies_and_survives_restarts_with_a_password() {
    let config = NodeConfig::new().tls(ClientCerts::Required).requirepass("secret");
    let mut cluster = FaultyCluster::start_with(2, config).unwrap();
    let url = &cluster.urls()[0];
    assert!(url.starts_with("rediss://:secret@127.0.0.1:"), "{url}");
    ping(url, Certificates::get().unwrap().redis_tls()).unwrap();
    cluster.cluster_mut().node_mut(0).restart().unwrap();
    cluster.cluster().node(0).set("k", "v").unwrap();
    assert_eq!(cluster.cluster().nodes_with_key("k").unwrap(), [0]);
}
