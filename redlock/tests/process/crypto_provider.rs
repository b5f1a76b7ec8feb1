//! With `tls-rustls`, `build()` installs a rustls crypto provider when the application has
//! none: redis-rs would otherwise panic on the first TLS connection. Its own process, so
//! that nothing else installed one first.
#![cfg(feature = "tls-rustls")]

use std::time::Duration;

use redlock::{ErrorKind, Redlock};

#[tokio::test]
async fn build_installs_a_crypto_provider_when_the_application_has_none() {
    let _serial = crate::serial();
    assert!(rustls::crypto::CryptoProvider::get_default().is_none());
    let rl = Redlock::builder()
        .nodes(["rediss://127.0.0.1:1", "rediss://127.0.0.1:2", "rediss://127.0.0.1:3"])
        .node_timeout(Duration::from_millis(200))
        .build()
        .unwrap();
    assert!(rustls::crypto::CryptoProvider::get_default().is_some());
    // Nothing listens there: an error, not a panic.
    let err = rl.try_lock("k").await.unwrap_err();
    assert_eq!(err.kind(), ErrorKind::Unavailable);
}
